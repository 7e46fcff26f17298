/**
 * The scheduler on a fake clock with a fake callout: what it logs about each
 * run (stderr of failures, spawn errors, the state's origin), its events
 * (pending and run times; an observer that throws), submit after stop, the
 * previous state it hands change sets, and how change-set runs and resyncs
 * share the callout. When a state runs: scheduler.test.ts.
 */
import t from 'tap';
import { Scheduler } from '../../src/runner/scheduler.js';
import { Events, failed, FakeCallout, FakeClock, makeScheduler, ok, st } from './harness.js';

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
