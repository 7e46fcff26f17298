/** The idle compactor: a memory-reducing GC, then full ones, after each quiet period that follows a burst of new work. */
import t from 'tap';
import { setTimeout as sleep } from 'node:timers/promises';
import { createIdleCompactor, fullGc, reducingGc } from '../src/memory.js';
import { pollUntil } from './helpers/wait.js';

t.test('this Node lets us run a full GC without --expose-gc on the command line', async (t) => {
  const gc = fullGc();
  t.type(gc, 'function');
  gc?.();
});

const MIN_GROWTH = 1000;

t.test('collects after a quiet period and once more for the young generation, not while pokes keep coming, never after stop', async (t) => {
  let collections = 0;
  let held = 0;
  const c = createIdleCompactor({ quietMs: 40, youngQuietMs: 60, minGrowth: MIN_GROWTH, collect: () => collections++, collectFirst: () => collections++, footprint: () => ({ committed: held, used: held }) });
  for (let i = 0; i < 5; i++) {
    held += MIN_GROWTH; // a burst
    c.poke();
    await sleep(10); // pokes closer together than the quiet time
  }
  t.equal(collections, 0, 'no collection while states keep coming');
  // At least one: the second collection follows 60 ms later, and a poll (every 20 ms) held up that long
  // on a loaded machine sees 2 first; an exact 1 would then never be seen.
  await pollUntil(() => collections >= 1, 'the collection after the quiet period', 2000);
  await pollUntil(() => collections === 3, 'the young-generation collections', 2000);
  await sleep(150);
  t.equal(collections, 3, 'three times per quiet period');
  held += 10 * MIN_GROWTH;
  c.poke();
  await sleep(50);
  t.equal(collections, 4, 'a new quiet period: collected again');
  c.poke(); // restarts the timers
  c.stop();
  await sleep(200);
  t.equal(collections, 4, 'none after stop');
});

t.test('a quiet period collects only after the heap grew by half since the last collection, at least minGrowth', async (t) => {
  const done: string[] = [];
  let held = 100;
  const c = createIdleCompactor({
    quietMs: 20,
    youngQuietMs: 10_000,
    minGrowth: 30,
    footprint: () => ({ committed: held, used: held }),
    // Collected: the footprint drops, as V8's does.
    collectFirst: (collected) => {
      done.push(`first at ${held}`);
      held = 120;
      collected?.();
    },
    collect: () => done.push('plain'),
  });
  t.teardown(() => c.stop());
  const quiet = (): Promise<unknown> => sleep(80);
  held = 140; // +40 from 100: under half of it
  c.poke();
  await quiet();
  t.same(done, [], 'a trickle (+40 < 50): nothing');
  held = 151; // +51 from 100
  c.poke();
  await quiet();
  t.same(done, ['first at 151'], 'a burst (+51 >= 50): collected');
  held = 155; // +35 from 120 (after the collection): over minGrowth, under half
  c.poke();
  await quiet();
  t.same(done, ['first at 151'], 'measured from the footprint after the collection');
  held = 200;
  c.poke();
  await quiet();
  t.same(done, ['first at 151', 'first at 200'], 'another burst');
});

t.test('waiting: a plain collection at once after a burst, once; the memory-reducing one still once quiet', async (t) => {
  let plain = 0;
  let first = 0;
  let held = 100;
  const c = createIdleCompactor({ quietMs: 60_000, minGrowth: 30, footprint: () => ({ committed: held, used: held }), collect: () => plain++, collectFirst: () => first++ });
  t.teardown(() => c.stop());
  held = 140;
  c.waiting();
  t.equal(plain, 0, 'a trickle (+40 < 50): nothing');
  held = 160;
  c.waiting();
  t.equal(plain, 1, 'a burst: collected at once');
  c.waiting();
  t.equal(plain, 1, 'measured from the footprint after it');
  held = 250;
  c.waiting();
  t.equal(plain, 2, 'another burst');
  t.equal(first, 0, 'the memory-reducing collection waits for a quiet period');
  c.stop();
  held = 1000;
  c.waiting();
  t.equal(plain, 2, 'none after stop');
  const d = createIdleCompactor({ quietMs: 20, youngQuietMs: 10_000, minGrowth: 30, footprint: () => ({ committed: held, used: held }), collect: () => plain++, collectFirst: () => first++ });
  held = 1600; // +600 from 1000
  d.waiting();
  held = 1000; // what the plain collection gave back: no burst left
  d.poke();
  await sleep(80);
  d.stop();
  t.equal(first, 1, 'once quiet, the memory-reducing collection still follows');
});

t.test('burst: the memory-reducing collection once quiet, however little the footprint grew', async (t) => {
  let first = 0;
  const c = createIdleCompactor({ quietMs: 20, youngQuietMs: 10_000, minGrowth: 30, footprint: () => ({ committed: 100, used: 100 }), collect: () => {}, collectFirst: () => first++ });
  t.teardown(() => c.stop());
  c.poke();
  await sleep(80);
  t.equal(first, 0, 'a state, nothing grown: nothing');
  c.burst();
  await sleep(80);
  t.equal(first, 1, 'a burst: collected');
  c.poke();
  await sleep(80);
  t.equal(first, 1, 'owed once');
});

t.test('steadyHeap: once, at the first waiting, before its collection', async (t) => {
  const calls: string[] = [];
  let held = 100;
  const c = createIdleCompactor({ quietMs: 60_000, minGrowth: 30, footprint: () => ({ committed: held, used: held }), collect: () => calls.push('collect'), steadyHeap: () => calls.push('steady') });
  t.teardown(() => c.stop());
  held = 200;
  c.waiting();
  held = 400;
  c.waiting();
  t.same(calls, ['steady', 'collect', 'collect']);
});

t.test('heapGrowing sets a flag this V8 knows', async (t) => {
  const { spawnSync } = await import('node:child_process');
  const script = `
    import { heapGrowing } from ${JSON.stringify(new URL('../dist/memory.js', import.meta.url).href)};
    heapGrowing(100);
    const keep = [];
    for (let i = 0; i < 200000; i++) keep.push({ i });
    console.log(keep.length);
  `;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
  t.equal(r.stderr, '', 'V8 says nothing (an unknown flag is "Error: unrecognized flag" on stderr)');
  t.equal(r.stdout.trim(), '200000');
});

t.test('the memory-reducing collection calls back once collected', async (t) => {
  let fell = 0;
  await new Promise<void>((resolve) => reducingGc(() => fell++, true)?.(resolve));
  t.equal(fell, 0, 'through the inspector, not the fallback');
  await new Promise<void>((resolve) => reducingGc(() => fell++, false)?.(resolve));
  t.equal(fell, 1, 'the fallback, then the callback');
});

t.test('the memory-reducing collection returns the young generation at once', async (t) => {
  // In a process of its own: this one (tap, its timers) allocates all along.
  const script = `
    import { getHeapSpaceStatistics } from 'node:v8';
    import { reducingGc } from ${JSON.stringify(new URL('../dist/memory.js', import.meta.url).href)};
    const newSpace = () => getHeapSpaceStatistics().find((s) => s.space_name === 'new_space').physical_space_size;
    const keep = [];
    for (let i = 0; i < 400000; i++) keep.push({ i, s: 'x' + i });
    const grown = newSpace();
    reducingGc(() => console.log('fallback'))();
    // It runs asynchronously; the process must still be able to end by itself afterwards.
    setTimeout(() => console.log(JSON.stringify({ grown, after: newSpace(), kept: keep.length })), 500);
  `;
  const { execFileSync } = await import('node:child_process');
  const out = JSON.parse(execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 })) as { grown: number; after: number; kept: number };
  if (out.grown <= 4 * 2 ** 20) {
    t.comment(`skipped: the young generation did not grow here (${out.grown} bytes)`);
    return;
  }
  t.ok(out.after < out.grown / 4, `young generation ${out.grown} -> ${out.after} bytes within 0.5 s`);
  t.equal(out.kept, 400000);
});

t.test('without an inspector, the memory-reducing collection is the fallback', async (t) => {
  let fell = 0;
  reducingGc(() => fell++, false)?.();
  t.equal(fell, 1, 'the fallback ran, at once');
});
