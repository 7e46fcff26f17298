/**
 * The scheduler on a fake clock with a fake callout: retry with capped,
 * jittered exponential backoff (superseded by a newer state, cancelled by a
 * successful runNow), the daemon path retrying a spawn error, a callout lost
 * after a one-shot run, stop() and kill(). When a state runs:
 * scheduler.test.ts.
 */
import t from 'tap';
import type { RunRequest } from '../../src/runner/callout.js';
import { failed, makeScheduler, ok, st } from './harness.js';

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
