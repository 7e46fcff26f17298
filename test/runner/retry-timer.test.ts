/**
 * retry-timer.ts on a fake clock: one retry armed at most, its delay growing
 * with the failures in a row until a success.
 */
import t from 'tap';
import { RetryTimer } from '../../src/runner/retry-timer.js';
import { FakeClock } from './harness.js';

t.test('one retry armed; delays double with the failures in a row, capped; a success starts again', async (t) => {
  const clock = new FakeClock();
  let fired = 0;
  // A fixed random: the same jitter for every delay (see backoff.ts).
  const r = new RetryTimer({ minMs: 100, maxMs: 350 }, () => 1, clock.timers);
  const arms = [1, 2, 3, 4].map(() => r.arm(() => fired++));
  t.same(arms.map((a) => a.attempt), [1, 2, 3, 4]);
  t.ok(arms.every((a, i) => i === 0 || a.delayMs >= arms[i - 1]!.delayMs), `growing: ${arms.map((a) => a.delayMs).join(', ')}`);
  t.ok(arms.every((a) => a.delayMs <= 350), 'capped');
  t.equal(r.armed, true);
  clock.advance(1000);
  t.equal(fired, 1, 'each arm replaced the one before: one fires');
  t.equal(r.armed, false);
  r.succeeded();
  t.same(r.arm(() => fired++), { delayMs: arms[0]!.delayMs, attempt: 1 }, 'after a success: the first delay again');
  r.clear();
  clock.advance(1000);
  t.equal(fired, 1, 'cleared');
});
