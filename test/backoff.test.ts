/**
 * The one jittered backoff (runner retries, kpng reconnects, kube list/watch
 * restarts): doubling from min to max, spread so that identical nodes do not
 * retry in lockstep. (The debounce rule is test/debounce.test.ts's.)
 */
import t from 'tap';
import { backoffDelay } from '../src/backoff.js';

t.test('backoff doubles from min to max, with ±20% jitter that never passes max', async (t) => {
  const b = { minMs: 1000, maxMs: 30_000 };
  const mid = () => 0.5;
  t.same([0, 1, 2, 3, 4, 5, 6].map((a) => backoffDelay(a, b, mid)), [1000, 2000, 4000, 8000, 16000, 30000, 30000]);
  t.equal(backoffDelay(0, b, () => 0), 800, '-20%');
  t.equal(backoffDelay(0, b, () => 0.999999), 1200, '+20%');
  t.equal(backoffDelay(10, b, () => 0.999999), 30000, 'capped after jitter');
  t.equal(backoffDelay(1000, b, mid), 30000, 'a huge attempt does not overflow');
  t.equal(backoffDelay(0, { minMs: 1, maxMs: 1 }, () => 0), 1, 'at least 1 ms');
});

t.test('jitter spreads identical nodes apart', async (t) => {
  const delays = new Set(Array.from({ length: 50 }, () => backoffDelay(3, { minMs: 500, maxMs: 30_000 })));
  t.ok(delays.size > 10, `distinct delays: ${delays.size}`);
});
