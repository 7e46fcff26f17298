/**
 * The scheduler on a fake clock with a fake callout: no processes, no real
 * time. When a state runs: coalescing, runNow's queue, debounce and
 * max-wait, skip-identical, resync, runNow's options, a change set that is
 * empty, and what idle() waits for. Retries, stop and kill:
 * scheduler-retry.test.ts; logs, events and change sets' previous state:
 * scheduler-log.test.ts.
 */
import t from 'tap';
import { DEFAULTS } from '../../src/defaults.js';
import { Scheduler } from '../../src/runner/scheduler.js';
import { failed, FakeCallout, FakeClock, makeScheduler, ok, st } from './harness.js';

t.test('coalescing: a burst during a run gives exactly one more run, with the newest state', async (t) => {
  const { s, ev, callout } = makeScheduler();
  s.submit(st('s0'));
  t.equal(callout.requests.length, 1, 'debounce 0 starts at once');
  for (let i = 1; i <= 200; i++) s.submit(st(`s${i}`));
  t.equal(callout.requests.length, 1, 'nothing starts while a run is in flight');
  callout.finish(1);
  await callout.started(2);
  callout.finish(2);
  await s.idle();
  t.same(callout.inputs(), ['s0\n', 's200\n']);
  t.same(ev.of('run-finished').map((e) => e.result), ['ok', 'ok']);
  t.same(
    callout.requests.map((r) => [r.run, r.reason]),
    [
      [1, 'change'],
      [2, 'change'],
    ],
  );
  await s.stop();
});

t.test('runNow waits for the in-flight run and goes before debounced states', async (t) => {
  const { s, ev, callout } = makeScheduler({ auto: () => ok });
  s.submit(st('a'));
  s.submit(st('b')); // pending behind run 1 (auto-finishes next microtask)
  const now = s.runNow(st('now'));
  const res = await now;
  t.equal(res.run, 2);
  t.equal(res.result, 'ok');
  await s.idle();
  t.same(callout.inputs(), ['a\n', 'now\n', 'b\n']);
  t.same(ev.of('run-started').map((e) => e.reason), ['change', 'now', 'change']);
  // runNow never skips identical input.
  const again = await s.runNow(st('b'));
  t.equal(again.result, 'ok');
  t.equal(again.run, 4);
  await s.stop();
});

t.test('debounce and max-wait', async (t) => {
  t.test('runs after debounceMs of quiet, with the newest state', async (t) => {
    const { s, clock, ev, callout } = makeScheduler({ debounceMs: 50, maxWaitMs: 1000, auto: () => ok });
    s.submit(st('A'));
    clock.advance(30);
    s.submit(st('B'));
    clock.advance(49);
    t.equal(ev.of('run-started').length, 0, 'not before 50ms of quiet');
    clock.advance(1);
    const started = await ev.until('run-started');
    t.equal(started.at, 80);
    t.equal(started.pendingSince, 0, 'pending since the first change of the burst');
    await ev.until('run-finished');
    t.same(callout.inputs(), ['B\n']);
    await s.stop();
  });
  t.test('max-wait bounds a continuous stream of changes', async (t) => {
    const { s, clock, ev, callout } = makeScheduler({ debounceMs: 50, maxWaitMs: 150, auto: () => ok });
    for (let i = 0; i < 4; i++) {
      s.submit(st(`S${i}`));
      clock.advance(40);
    }
    // Submitted at 0, 40, 80, 120; now 160: max-wait fired at 150.
    const started = await ev.until('run-started');
    t.equal(started.at, 150);
    t.same(callout.inputs(), ['S3\n']);
    await s.stop();
  });
  t.test('debounce 0 runs at once, and again right after a run with coalesced states', async (t) => {
    const { s, clock, ev, callout } = makeScheduler({ debounceMs: 0, maxWaitMs: 1000 });
    s.submit(st('x'));
    t.equal(ev.of('run-started').length, 1, 'started synchronously in submit');
    s.submit(st('y'));
    s.submit(st('z'));
    callout.finish(1);
    await callout.started(2);
    t.equal(clock.t, 0, 'no timer needed');
    t.same(callout.inputs(), ['x\n', 'z\n']);
    callout.finish(2);
    await s.stop();
  });
  t.test('defaults: DEFAULTS.debounceMs of quiet, DEFAULTS.maxWaitMs at most', async (t) => {
    const clock = new FakeClock();
    const callout = new FakeCallout(() => ok);
    const s = new Scheduler({ callout, now: clock.now, timers: clock.timers });
    s.submit(st('a'));
    clock.advance(DEFAULTS.debounceMs - 1);
    t.equal(callout.requests.length, 0);
    clock.advance(1);
    t.equal(callout.requests.length, 1, `ran after ${DEFAULTS.debounceMs}ms`);
    await s.idle();
    for (let i = 0; i * 50 < DEFAULTS.maxWaitMs; i++) {
      s.submit(st(`b${i}`));
      clock.advance(50);
    }
    t.equal(callout.requests.length, 2, `ran after ${DEFAULTS.maxWaitMs}ms of changes`);
    await s.stop();
  });
});

t.test('skip identical input to the last successful run', async (t) => {
  const { s, ev, log, callout } = makeScheduler({ auto: () => ok });
  s.submit(st('a', 'b'));
  await s.idle();
  s.submit(st('a', 'b')); // equal bytes, different Buffers
  await s.idle();
  t.equal(ev.of('run-started').length, 1);
  t.equal(ev.of('run-skipped').length, 1);
  t.match(log.matching(/skipped/), [/^kpng-callout debug: callout run skipped: state unchanged since the last successful run services=2 bytes=4$/]);
  s.submit(st('a', 'c'));
  await s.idle();
  s.submit(st('a', 'c'));
  await s.idle();
  t.equal(ev.of('run-started').length, 2);
  t.equal(ev.of('run-skipped').length, 2);
  t.same(callout.inputs(), ['a\nb\n', 'a\nc\n']);
  await s.stop();
});

t.test('a failed run is not a skip baseline: identical input runs again', async (t) => {
  const { s, ev } = makeScheduler({ retryMinMs: 60_000, auto: (req) => (req.run === 1 ? failed(1) : ok) });
  s.submit(st('same'));
  await ev.until('run-finished', (e) => e.run === 1);
  t.equal(ev.of('run-finished')[0]!.result, 'failed');
  s.submit(st('same'));
  const fin = await ev.until('run-finished', (e) => e.run === 2);
  t.equal(fin.result, 'ok');
  t.equal(ev.of('run-skipped').length, 0);
  await s.stop();
});

t.test('resync re-runs the newest state periodically even if identical', async (t) => {
  t.test('every period after the last run', async (t) => {
    const { s, clock, ev, callout } = makeScheduler({ resyncPeriodMs: 40, auto: () => ok });
    s.submit(st('R'));
    await ev.until('run-finished', (e) => e.run === 1);
    clock.advance(40);
    await ev.until('run-finished', (e) => e.run === 2);
    clock.advance(40);
    await ev.until('run-finished', (e) => e.run === 3);
    t.same(ev.of('run-started').map((e) => [e.reason, e.at]), [
      ['change', 0],
      ['resync', 40],
      ['resync', 80],
    ]);
    t.same(callout.inputs(), ['R\n', 'R\n', 'R\n']);
    t.same(
      callout.requests.map((r) => r.reason),
      ['change', 'resync', 'resync'],
      'the callout is told a run is a resync',
    );
    await s.stop();
  });
  t.test('period counts from the last run; an identical pending state is not skipped when due', async (t) => {
    const { s, clock, ev, callout } = makeScheduler({ debounceMs: 10, maxWaitMs: 100, resyncPeriodMs: 1000, auto: () => ok });
    s.submit(st('R'));
    clock.advance(10);
    await ev.until('run-finished', (e) => e.run === 1);
    clock.advance(999);
    t.equal(ev.of('run-started').length, 1);
    clock.advance(1);
    await ev.until('run-finished', (e) => e.run === 2);
    t.equal(ev.of('run-started')[1]!.reason, 'resync');
    t.equal(ev.of('run-started')[1]!.at, 1010);
    // An identical state is skipped...
    s.submit(st('R'));
    clock.advance(10);
    await ev.until('run-skipped');
    // ...unless a resync fell due while it was pending.
    clock.advance(985); // t=2005
    s.submit(st('R')); // due at 2015
    clock.advance(5); // t=2010: the resync falls due while the state is pending
    t.equal(ev.of('run-started').length, 2, 'the resync waits for the pending state');
    clock.advance(5);
    await ev.until('run-finished', (e) => e.run === 3);
    t.equal(ev.of('run-skipped').length, 1);
    t.same(callout.inputs(), ['R\n', 'R\n', 'R\n']);
    await s.stop();
    clock.advance(10_000);
    t.equal(ev.of('run-started').length, 3, 'no resync after stop');
  });
});

t.test('runNow options: skipIdentical, retry (until a newer state), full', async (t) => {
  const { s, clock, ev, callout } = makeScheduler({ retryMinMs: 1000, retryMaxMs: 1000, random: () => 0.5, auto: (req) => (req.run <= 2 ? failed(1) : ok) });
  // retry: a failed run is retried with the backoff, with the newest state, as a full input (no previous)
  t.equal((await s.runNow(st('a'), { retry: true })).result, 'failed');
  t.equal(ev.of('retry-scheduled').length, 1);
  clock.advance(1000);
  await ev.until('run-finished', (e) => e.run === 2);
  t.equal(ev.of('retry-scheduled').length, 2, 'the retry failed too: another');
  clock.advance(1000);
  await ev.until('run-finished', (e) => e.run === 3);
  t.equal(callout.requests[2]?.reason, 'retry');
  t.equal(callout.requests[2]?.previous, undefined, 'in full');
  t.equal(ev.of('retry-scheduled').length, 2, 'a success ends the retries');
  // skipIdentical: the same state again makes no run; another does, as a change from the last applied one
  t.match(await s.runNow(st('a'), { skipIdentical: true }), { result: 'skipped', run: 0 });
  t.equal(callout.requests.length, 3);
  t.equal((await s.runNow(st('b'), { skipIdentical: true })).result, 'ok');
  t.same(callout.requests[3]?.previous?.lines.map(String), ['a\n']);
  // full: even when identical, and with no previous
  t.equal((await s.runNow(st('b'), { skipIdentical: true, full: true })).result, 'ok');
  t.equal(callout.requests[4]?.previous, undefined);
  await s.stop();
});

t.test('with change sets, a state whose lines are only reordered is unchanged: no run (its change set is empty)', async (t) => {
  const a = '{"Service":{"Namespace":"n","Name":"a"},"Endpoints":null}';
  const b = '{"Service":{"Namespace":"n","Name":"b"},"Endpoints":null}';
  const { s, callout } = makeScheduler({ changes: true, auto: () => ok });
  t.equal((await s.runNow(st(a, b), { skipIdentical: true })).result, 'ok');
  t.match(await s.runNow(st(b, a), { skipIdentical: true }), { result: 'skipped', run: 0 }, 'runNow');
  s.submit(st(b, a));
  await s.idle();
  t.equal(callout.requests.length, 1, 'submit: no run either');
  const plain = makeScheduler({ auto: () => ok });
  await plain.s.runNow(st(a, b), { skipIdentical: true });
  t.equal((await plain.s.runNow(st(b, a), { skipIdentical: true })).result, 'ok', 'without change sets the input differs: a run');
  await s.stop();
  await plain.s.stop();
});

t.test('idle() waits for runs, pending states and queued runNow, not for a retry', async (t) => {
  const { s, clock, callout } = makeScheduler({ debounceMs: 10, maxWaitMs: 10 });
  let idle = false;
  s.submit(st('a'));
  const p = s.idle().then(() => (idle = true));
  clock.advance(10);
  await callout.started(1);
  await Promise.resolve();
  t.notOk(idle, 'a run in flight');
  callout.finish(1, failed(1));
  await p;
  t.ok(idle, 'idle with a retry scheduled');
  await s.stop();
});
