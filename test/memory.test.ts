/** The idle compactor: one full GC after each quiet period that follows new work. */
import t from 'tap';
import { setTimeout as sleep } from 'node:timers/promises';
import { createIdleCompactor, fullGc } from '../src/memory.js';
import { pollUntil } from './helpers/wait.js';

t.test('this Node lets us run a full GC without --expose-gc on the command line', async (t) => {
  const gc = fullGc();
  t.type(gc, 'function');
  gc?.();
});

t.test('collects once after a quiet period, not while pokes keep coming, never after stop', async (t) => {
  let collections = 0;
  const c = createIdleCompactor({ quietMs: 40, collect: () => collections++ });
  for (let i = 0; i < 5; i++) {
    c.poke();
    await sleep(10); // pokes closer together than the quiet time
  }
  t.equal(collections, 0, 'no collection while states keep coming');
  await pollUntil(() => collections === 1, 'the collection after the quiet period', 2000);
  await sleep(100);
  t.equal(collections, 1, 'once per quiet period');
  c.poke();
  c.stop();
  await sleep(100);
  t.equal(collections, 1, 'none after stop');
});
