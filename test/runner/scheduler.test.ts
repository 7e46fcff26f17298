/**
 * The scheduler on a fake clock with a fake callout: no processes, no real
 * time. Every rule of when a state runs: coalescing, runNow's queue,
 * debounce and max-wait, skip-identical, resync, retry with backoff, stop and
 * kill, and what it logs about each run.
 */
import t from 'tap';
import { DEFAULTS } from '../../src/defaults.js';
import type { RunRequest } from '../../src/runner/callout.js';
import { Scheduler, type SchedulerOptions } from '../../src/runner/scheduler.js';
import { captureLog } from '../helpers/sink.js';
import { Events, failed, FakeCallout, FakeClock, ok, st, type Outcome } from './harness.js';

function makeScheduler(extra: Partial<SchedulerOptions> & { auto?: (req: RunRequest) => Outcome | undefined } = {}) {
  const clock = new FakeClock();
  const ev = new Events();
  const log = captureLog();
  const { auto, ...rest } = extra;
  const callout = new FakeCallout(auto);
  const s = new Scheduler({
    callout,
    debounceMs: 0,
    maxWaitMs: 0,
    now: clock.now,
    timers: clock.timers,
    logger: log.logger,
    onEvent: ev.on,
    random: () => 0.5,
    ...rest,
  });
  return { s, clock, ev, log, callout };
}

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

t.test('retry with capped exponential backoff until success', async (t) => {
  const { s, clock, ev, log, callout } = makeScheduler({ retryMinMs: 30, retryMaxMs: 50, auto: (req) => (req.run < 3 ? failed(7, `boom ${req.run}`) : ok) });
  s.submit(st('S'));
  await ev.until('retry-scheduled', (e) => e.attempt === 1);
  clock.advance(29);
  t.equal(callout.requests.length, 1, 'the first retry waits its backoff');
  clock.advance(1);
  await ev.until('retry-scheduled', (e) => e.attempt === 2);
  clock.advance(49);
  t.equal(callout.requests.length, 2, 'the second retry waits its backoff');
  clock.advance(1);
  const done = await ev.until('run-finished', (e) => e.result === 'ok');
  t.equal(done.run, 3);
  t.same(ev.of('retry-scheduled').map((e) => [e.run, e.attempt, e.delayMs, e.at]), [
    [1, 1, 30, 0],
    [2, 2, 50, 30], // 60 capped at 50
  ]);
  t.same(ev.of('run-started').map((e) => [e.reason, e.at]), [
    ['change', 0],
    ['retry', 30],
    ['retry', 80],
  ]);
  t.same(callout.inputs(), ['S\n', 'S\n', 'S\n'], 'retries run the same state');
  const warns = log.matching(/ warn: /);
  t.equal(warns.length, 2);
  t.match(warns[0], /^kpng-callout warn: callout failed run=1 status=failed durationMs=0 exitCode=7 stderr="boom 1"$/);
  t.match(log.matching(/retrying/), [/^kpng-callout info: retrying the callout in 30ms run=1 attempt=1 delayMs=30$/, /in 50ms/]);
  t.equal(ev.of('run-finished')[0]!.exitCode, 7);
  t.equal(ev.of('run-finished')[0]!.stderrTail, 'boom 1');
  clock.advance(100_000);
  t.equal(callout.requests.length, 3, 'no retry after the success');
  await s.stop();
});

t.test('the backoff is jittered by the random source', async (t) => {
  const delays: number[] = [];
  for (const random of [() => 0, () => 0.999]) {
    const { s, ev } = makeScheduler({ retryMinMs: 1000, retryMaxMs: 30_000, random, auto: () => failed(1) });
    s.submit(st('x'));
    delays.push((await ev.until('retry-scheduled')).delayMs);
    await s.stop();
  }
  t.same(delays, [800, 1200], '±20%');
});

t.test('a newer state supersedes a pending retry; the backoff resets only after a success', async (t) => {
  const bad = (req: RunRequest): boolean => req.state.lines.some((l) => l.toString().startsWith('bad'));
  const { s, clock, ev } = makeScheduler({ retryMinMs: 1000, retryMaxMs: 3000, auto: (req) => (bad(req) ? failed(1) : ok) });
  s.submit(st('bad1'));
  await ev.until('retry-scheduled', (e) => e.attempt === 1);
  t.equal(ev.of('retry-scheduled')[0]!.delayMs, 1000);
  await s.idle(); // a scheduled retry does not count as pending
  s.submit(st('bad2')); // supersedes the retry, runs on the debounce path
  await ev.until('retry-scheduled', (e) => e.attempt === 2);
  t.equal(ev.of('retry-scheduled')[1]!.delayMs, 2000, 'attempt counter kept across the superseding state');
  t.equal(ev.of('run-started')[1]!.reason, 'change');
  clock.advance(1999);
  t.equal(ev.of('run-started').length, 2, 'the first retry was cancelled');
  clock.advance(1);
  await ev.until('retry-scheduled', (e) => e.attempt === 3);
  t.equal(ev.of('run-started')[2]!.reason, 'retry');
  t.equal(ev.of('retry-scheduled')[2]!.delayMs, 3000, 'capped');
  s.submit(st('good'));
  await ev.until('run-finished', (e) => e.result === 'ok');
  clock.advance(10_000);
  t.equal(ev.of('run-started').length, 4, 'no retry after the superseding state succeeded');
  s.submit(st('bad3'));
  await ev.until('retry-scheduled', (e) => e.run === 5);
  t.same(ev.of('retry-scheduled').slice(-1).map((e) => [e.attempt, e.delayMs]), [[1, 1000]], 'reset after the success');
  await s.stop();
  clock.advance(10_000);
  t.equal(ev.of('run-started').length, 5, 'stop cancels the pending retry');
});

t.test('a successful runNow cancels a pending retry; a failed one schedules none', async (t) => {
  const { s, clock, ev } = makeScheduler({ retryMinMs: 1000, auto: (req) => (req.run === 1 || req.run === 3 ? failed(1) : ok) });
  s.submit(st('x'));
  await ev.until('retry-scheduled');
  t.equal((await s.runNow(st('y'))).result, 'ok');
  clock.advance(10_000);
  t.equal(ev.of('run-started').length, 2, 'the retry was cancelled');
  t.equal((await s.runNow(st('z'))).result, 'failed');
  clock.advance(10_000);
  t.equal(ev.of('run-started').length, 3);
  t.equal(ev.of('retry-scheduled').length, 1);
  await s.stop();
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

t.test('runNow with retry: a newer state queued meanwhile supersedes the retry', async (t) => {
  const { s, clock, ev, callout } = makeScheduler({ retryMinMs: 1000, retryMaxMs: 1000, random: () => 0.5 });
  const first = s.runNow(st('a'), { retry: true });
  const second = s.runNow(st('b'), { retry: true });
  callout.finish(1, failed(1));
  t.equal((await first).result, 'failed');
  t.equal(ev.of('retry-scheduled').length, 0, 'no retry: a newer state is queued');
  await callout.started(2);
  callout.finish(2, ok);
  t.equal((await second).result, 'ok');
  clock.advance(10_000);
  t.equal(callout.requests.length, 2);
  await s.stop();
});

t.test('the daemon path retries a spawn error', async (t) => {
  const { s, ev } = makeScheduler({ retryMinMs: 60_000, auto: () => ({ result: 'spawn-error', errorCode: 'ENOENT', message: 'callout nope: not found' }) });
  s.submit(st('x'));
  const e = await ev.until('retry-scheduled');
  t.equal(e.run, 1);
  await s.stop();
});

t.test('stop()', async (t) => {
  t.test('lets the in-flight run finish within the grace, then closes the callout', async (t) => {
    const { s, clock, ev, callout } = makeScheduler();
    s.submit(st('x'));
    const stopped = s.stop(10_000);
    s.submit(st('ignored'));
    const late = await s.runNow(st('late'));
    t.match(late, { run: 0, result: 'skipped', message: 'runner stopped' }, 'runNow after stop does not run');
    clock.advance(9_999);
    callout.finish(1);
    await stopped;
    t.same(callout.calls, ['close graceful'], 'not terminated, then closed');
    t.same(ev.of('run-finished').map((e) => e.result), ['ok']);
    t.equal(ev.of('run-started').length, 1);
    await s.idle();
    t.equal(s.stop(), s.stop(), 'stop is idempotent');
  });
  t.test('a hung run is terminated after the grace; no retry, logged as stopped', async (t) => {
    const { s, clock, ev, log, callout } = makeScheduler({ killGraceMs: 5000 });
    s.submit(st('x'));
    const stopped = s.stop(50);
    clock.advance(49);
    t.same(callout.calls, []);
    clock.advance(1);
    t.same(callout.calls, ['terminate 1']);
    await stopped;
    const fin = await ev.until('run-finished');
    t.equal(fin.result, 'signal');
    t.equal(fin.message, 'callout run 1 stopped (SIGTERM)');
    t.equal(ev.of('retry-scheduled').length, 0, 'no retry after stop');
    t.match(log.matching(/stopped \(SIGTERM\)/), [/^kpng-callout info: /]);
    t.equal(log.matching(/ warn: /).length, 0, 'not a failure');
  });
  t.test('the grace defaults to killGraceMs', async (t) => {
    const { s, clock, callout } = makeScheduler({ killGraceMs: 300 });
    s.submit(st('x'));
    const stopped = s.stop();
    clock.advance(299);
    t.same(callout.calls, []);
    clock.advance(1);
    await stopped;
    t.same(callout.calls, ['terminate 1', 'close graceful']);
  });
  t.test('queued runNow requests and a pending state are dropped', async (t) => {
    const { s, ev, callout } = makeScheduler({ debounceMs: 100, maxWaitMs: 100 });
    const first = s.runNow(st('a'));
    const queued = s.runNow(st('b'));
    s.submit(st('c'));
    const stopped = s.stop();
    t.match(await queued, { run: 0, result: 'skipped' });
    callout.finish(1);
    t.equal((await first).result, 'ok');
    await stopped;
    t.same(callout.inputs(), ['a\n']);
    t.same(ev.of('pending-changed').slice(-1).map((e) => e.pending), [false]);
  });
});

t.test('kill() kills the run in flight and closes the callout at once', async (t) => {
  const { s, log, callout } = makeScheduler();
  const p = s.runNow(st('x'));
  s.kill();
  const res = await p;
  t.equal(res.signal, 'SIGKILL');
  t.same(callout.calls, ['kill 1', 'close kill']);
  t.match(log.matching(/killing/), [/^kpng-callout info: killing the running callout run=1$/]);
  await s.stop();
  await s.idle();
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

t.test('logs: a success does not repeat stderr; failures do; the state origin is named', async (t) => {
  const { s, log } = makeScheduler({ auto: (req) => (req.run === 1 ? { stderrTail: 'note from run 1' } : failed(1, `note from run ${req.run}`)) });
  const good = await s.runNow({ ...st('x'), origin: 'fixtures/a.jsonl' });
  t.equal(good.stderrTail, 'note from run 1', 'the result keeps the tail');
  t.match(log.matching(/callout run started/), [/^kpng-callout debug: callout run started run=1 reason=now services=1 bytes=2 input=fixtures\/a\.jsonl$/]);
  const fin = log.matching(/callout run finished/);
  t.match(fin, [/^kpng-callout info: callout run finished run=1 status=ok durationMs=0 input=fixtures\/a\.jsonl$/]);
  t.notMatch(fin[0], /stderr=|note from run/, 'no stderr tail on success');
  await s.runNow({ ...st('y'), origin: 'fixtures/b.jsonl' });
  t.match(log.matching(/callout failed/), [/run=2 .*input=fixtures\/b\.jsonl stderr="note from run 2"$/]);
  await s.runNow(st('z'));
  t.notMatch(log.matching(/callout failed/)[1], /input=/, 'no origin, no field');
  await s.stop();
});

t.test('a spawn error is logged as an error, with the origin', async (t) => {
  const { s, log } = makeScheduler({ auto: () => ({ result: 'spawn-error', errorCode: 'ENOENT', message: 'callout /x/nope: not found (ENOENT)' }) });
  await s.runNow({ ...st('x'), origin: 'in.jsonl' });
  t.match(log.matching(/nope/), [/^kpng-callout error: callout \/x\/nope: not found \(ENOENT\) run=1 durationMs=0 input=in\.jsonl$/]);
});

t.test('events: pending and run times, and an observer that throws does no harm', async (t) => {
  const { s, clock, ev, log, callout } = makeScheduler({ debounceMs: 20, maxWaitMs: 100 });
  s.submit(st('a'));
  clock.advance(5);
  s.submit(st('b'));
  clock.advance(20);
  clock.advance(7);
  callout.finish(1);
  await ev.until('run-finished');
  t.same(
    ev.list.map((e) => [e.type, e.at, 'pendingSince' in e ? e.pendingSince : '-']),
    [
      ['pending-changed', 0, 0],
      ['pending-changed', 5, 0],
      ['pending-changed', 25, '-'],
      ['run-started', 25, 0],
      ['run-finished', 32, 0],
    ],
  );
  const thrower = new Scheduler({
    callout: new FakeCallout(() => ok),
    debounceMs: 0,
    logger: log.logger,
    onEvent: () => {
      throw new Error('observer bug');
    },
  });
  t.equal((await thrower.runNow(st('x'))).result, 'ok');
  t.ok(log.matching(/runner event observer threw .*observer bug/).length > 0);
  await thrower.stop();
  await s.stop();
});

t.test('submit after stop is ignored (and said at debug)', async (t) => {
  const { s, log, callout } = makeScheduler();
  await s.stop();
  s.submit(st('x'));
  t.equal(callout.requests.length, 0);
  t.match(log.matching(/ignored/), [/^kpng-callout debug: runner stopped: state ignored$/]);
});

t.test('previous (for change sets): the last applied state; none first, after a failure, on a resync, after the callout was lost', async (t) => {
  let fail = false;
  let lost: ((why: string) => void) | undefined;
  // A callout that can be lost between runs (as a persistent one): the scheduler registers at construction.
  const withLost = Object.assign(new FakeCallout(() => (fail ? failed(1) : ok)), { lost: (f: (why: string) => void) => void (lost = f) });
  const clock = new FakeClock();
  const ev = new Events();
  const s2 = new Scheduler({ callout: withLost, debounceMs: 0, maxWaitMs: 0, now: clock.now, timers: clock.timers, onEvent: ev.on, random: () => 0.5, retryMinMs: 10, retryMaxMs: 10, resyncPeriodMs: 1000 });
  const prev = (): Array<string | undefined> => withLost.requests.map((r) => (r.previous ? r.previous.lines.map((l) => l.toString().trim()).join(',') : undefined));
  s2.submit(st('A'));
  await ev.until('run-finished', (e) => e.run === 1);
  s2.submit(st('B'));
  await ev.until('run-finished', (e) => e.run === 2);
  t.same(prev(), [undefined, 'A'], 'first full, then from the last applied');
  fail = true;
  s2.submit(st('C'));
  await ev.until('run-finished', (e) => e.run === 3);
  fail = false;
  clock.advance(10); // the retry
  await ev.until('run-finished', (e) => e.run === 4);
  t.same(prev().slice(2), ['B', undefined], 'after a failure: full');
  clock.advance(1000); // resync
  await ev.until('run-finished', (e) => e.run === 5);
  t.equal(withLost.requests[4]!.reason, 'resync');
  t.equal(prev()[4], undefined, 'a resync is full');
  lost!('exited (exit status 1)');
  clock.advance(10);
  await ev.until('run-finished', (e) => e.run === 6);
  t.equal(withLost.requests[5]!.reason, 'retry', 'the newest state is handed over again');
  t.equal(prev()[5], undefined, 'in full');
  await s2.stop();
});

/** A one-Service state whose line is JSON (change sets read the Service key). */
const sv = (port: number): ReturnType<typeof st> => st(`{"Service":{"Namespace":"d","Name":"a","Ports":[{"Port":${port}}]}}`);

t.test('--changes: change-set runs do not postpone the resync (a full state every period, however busy the source)', async (t) => {
  const { s, clock, ev, callout } = makeScheduler({ changes: true, resyncPeriodMs: 1000, auto: () => ok });
  s.submit(sv(0));
  await ev.until('run-finished', (e) => e.run === 1);
  // A change every 400 ms: each runs at once as a change set.
  for (let i = 1; i <= 6; i++) {
    clock.advance(400);
    s.submit(sv(i));
    await ev.until('run-finished', (e) => e.run === callout.requests.length);
  }
  const full = callout.requests.filter((r) => r.previous === undefined);
  t.ok(full.length >= 3, `a full input at least every period (full runs at ${callout.requests.filter((r) => r.previous === undefined).map((r) => r.reason).join(',')})`);
  t.ok(callout.requests.some((r) => r.reason === 'resync'), 'a resync ran');
  await s.stop();
});

t.test('--changes: a resync that falls due during a change-set run follows it', async (t) => {
  const { s, clock, ev, callout } = makeScheduler({ changes: true, resyncPeriodMs: 1000 });
  s.submit(sv(0));
  await callout.started(1);
  callout.finish(1);
  await ev.until('run-finished', (e) => e.run === 1);
  clock.advance(900);
  s.submit(sv(1)); // a change set, still running when the resync falls due
  await callout.started(2);
  clock.advance(200);
  callout.finish(2);
  await callout.started(3);
  t.equal(callout.requests[2]!.reason, 'resync');
  t.equal(callout.requests[2]!.previous, undefined, 'in full');
  callout.finish(3);
  await ev.until('run-finished', (e) => e.run === 3);
  await s.stop();
});

t.test('a callout lost after a one-shot run (a stray ack under --once): no retry scheduled or logged; a daemon retries', async (t) => {
  const { s, ev, callout, log } = makeScheduler({ auto: () => ok });
  t.equal((await s.runNow(st('a'))).result, 'ok');
  callout.tellLost('acknowledged "error x" with no frame waiting');
  t.same(ev.of('retry-scheduled'), [], 'no retry: nothing would run it');
  t.same(log.matching(/retrying/), []);
  s.submit(st('b'));
  await ev.until('run-finished', (e) => e.run === 2);
  callout.tellLost('exited');
  t.equal((await ev.until('retry-scheduled')).run, 0, 'the daemon hands the newest state over again');
  await s.stop();
});
