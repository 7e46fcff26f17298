/**
 * Runner tests with real child processes (small sh scripts in a tmp dir).
 * Timing-sensitive logic (debounce, max-wait, backoff) runs on a fake clock
 * injected through `now`/`timers`; everything else waits on events, never on
 * fixed sleeps.
 */
import t from 'tap';
import { spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import type { LogFields, Logger } from '../src/log.js';
import { Runner, type RunnerEvent, type RunnerOptions, type RunnerTimers, type RunResult } from '../src/runner.js';
import type { State } from '../src/state.js';
import { procStat } from './helpers/procs.js';
import { captureLog as realLog } from './helpers/sink.js';

// --- helpers -----------------------------------------------------------------

const dir = mkdtempSync(join(tmpdir(), 'runner-test-'));
const spawnedPids = new Set<number>();
t.teardown(() => {
  for (const pid of spawnedPids) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
  rmSync(dir, { recursive: true, force: true });
});

/** Writes an executable sh script; `$DIR` in it is a fresh directory of its own. */
function script(body: string): { file: string; dir: string } {
  const sd = mkdtempSync(join(dir, 's-'));
  const file = join(sd, 'callout.sh');
  writeFileSync(file, `#!/bin/sh\nDIR='${sd}'\n${body}\n`);
  chmodSync(file, 0o755);
  return { file, dir: sd };
}

/**
 * A callout that starts a long-running grandchild in its process group, saves
 * both pids (see groupPids), prints `ready` and waits; with `ignoreTerm` it
 * ignores SIGTERM (the second `wait` resumes the one the signal interrupts).
 */
function groupScript(ignoreTerm: boolean): { file: string; dir: string } {
  return script(`${ignoreTerm ? "trap '' TERM\n" : ''}sleep 1000 &
echo $! > "$DIR/gpid"
echo $$ > "$DIR/pid"
echo ready
wait${ignoreTerm ? '\nwait' : ''}`);
}

/** The pids a groupScript callout saved: its own and its grandchild's. */
function groupPids(s: { dir: string }): { pid: number; gpid: number } {
  return { pid: readPid(join(s.dir, 'pid')), gpid: readPid(join(s.dir, 'gpid')) };
}

function st(...texts: string[]): State {
  const lines = texts.map((s) => Buffer.from(s + '\n'));
  return { lines, services: lines.length, endpoints: 0, bytes: lines.reduce((n, l) => n + l.length, 0) };
}

/** A Writable that records everything and lets a test wait for some text. */
class Sink extends Writable {
  private chunks: Buffer[] = [];
  private waiters: Array<{ text: string; resolve: () => void }> = [];
  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    this.chunks.push(Buffer.from(chunk));
    const s = this.text();
    this.waiters = this.waiters.filter((w) => (s.includes(w.text) ? (w.resolve(), false) : true));
    cb();
  }
  buffer(): Buffer {
    return Buffer.concat(this.chunks);
  }
  text(): string {
    return this.buffer().toString('utf8');
  }
  waitFor(text: string): Promise<void> {
    if (this.text().includes(text)) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push({ text, resolve }));
  }
}

/** Records runner events; `until` resolves with the first (past or future) event matching. */
class Events {
  readonly list: RunnerEvent[] = [];
  private waiters: Array<{ pred: (e: RunnerEvent) => boolean; resolve: (e: RunnerEvent) => void }> = [];
  readonly on = (e: RunnerEvent): void => {
    this.list.push(e);
    this.waiters = this.waiters.filter((w) => (w.pred(e) ? (w.resolve(e), false) : true));
  };
  until<T extends RunnerEvent['type']>(type: T, pred: (e: Extract<RunnerEvent, { type: T }>) => boolean = () => true): Promise<Extract<RunnerEvent, { type: T }>> {
    const p = (e: RunnerEvent): boolean => e.type === type && pred(e as Extract<RunnerEvent, { type: T }>);
    const found = this.list.find(p);
    if (found) return Promise.resolve(found as Extract<RunnerEvent, { type: T }>);
    return new Promise((resolve) => this.waiters.push({ pred: p, resolve: resolve as (e: RunnerEvent) => void }));
  }
  of<T extends RunnerEvent['type']>(type: T): Array<Extract<RunnerEvent, { type: T }>> {
    return this.list.filter((e) => e.type === type) as Array<Extract<RunnerEvent, { type: T }>>;
  }
}

interface LogLine {
  level: string;
  msg: string;
  fields: LogFields | undefined;
}
function captureLog(): { lines: LogLine[]; logger: Logger } {
  const lines: LogLine[] = [];
  const at = (level: string) => (msg: string, fields?: LogFields) => void lines.push({ level, msg, fields });
  return { lines, logger: { error: at('error'), warn: at('warn'), info: at('info'), debug: at('debug') } };
}

/** A manual clock: timers fire only from advance(). */
class FakeClock {
  t = 0;
  private seq = 0;
  private readonly q = new Map<number, { due: number; fn: () => void }>();
  readonly now = (): number => this.t;
  readonly timers: RunnerTimers = {
    setTimeout: (fn, ms) => {
      const id = ++this.seq;
      this.q.set(id, { due: this.t + ms, fn });
      return id;
    },
    clearTimeout: (h) => void this.q.delete(h as number),
  };
  advance(ms: number): void {
    const end = this.t + ms;
    for (;;) {
      let next: [number, { due: number; fn: () => void }] | undefined;
      for (const e of this.q) if (e[1].due <= end && (!next || e[1].due < next[1].due)) next = e;
      if (!next) break;
      this.q.delete(next[0]);
      this.t = next[1].due;
      next[1].fn();
    }
    this.t = end;
  }
}

/** True when a pid no longer runs (zombies count as gone: PID 1 here may not reap). */
function gone(pid: number): boolean {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'latin1');
    const state = s.slice(s.lastIndexOf(')') + 2, s.lastIndexOf(')') + 3);
    return state === 'Z' || state === 'X';
  } catch {
    return true;
  }
}

function readPid(file: string): number {
  const pid = Number(readFileSync(file, 'utf8').trim());
  spawnedPids.add(pid);
  return pid;
}

function makeRunner(extra: Partial<RunnerOptions> & { file: string }): { r: Runner; ev: Events; out: Sink; err: Sink; log: LogLine[] } {
  const ev = new Events();
  const out = new Sink();
  const err = new Sink();
  const { lines, logger } = captureLog();
  const r = new Runner({
    debounceMs: 0,
    maxWaitMs: 0,
    timeoutMs: 10_000,
    nodeName: 'node-a',
    stdout: out,
    stderr: err,
    logger,
    onEvent: ev.on,
    random: () => 0.5,
    ...extra,
  });
  return { r, ev, out, err, log: lines };
}

// --- tests -------------------------------------------------------------------

t.test('coalescing: a burst during a slow run gives one more run with the newest state', async (t) => {
  const s = script(`cat > "$DIR/in.$KPNG_CALLOUT_RUN"
if [ "$KPNG_CALLOUT_RUN" = 1 ]; then while [ ! -e "$DIR/go" ]; do sleep 0.01; done; fi`);
  const { r, ev } = makeRunner({ file: s.file });
  r.submit(st('s0'));
  await ev.until('run-started', (e) => e.run === 1);
  for (let i = 1; i <= 200; i++) r.submit(st(`s${i}`));
  t.equal(ev.of('run-started').length, 1, 'nothing starts while a run is in flight');
  writeFileSync(join(s.dir, 'go'), '');
  await r.idle();
  const starts = ev.of('run-started');
  t.ok(starts.length >= 2 && starts.length <= 3, `at most 2 more runs (got ${starts.length - 1})`);
  const lastRun = starts[starts.length - 1]!.run;
  t.equal(readFileSync(join(s.dir, `in.${lastRun}`), 'utf8'), 's200\n', 'the last run got the final state');
  t.equal(readFileSync(join(s.dir, 'in.1'), 'utf8'), 's0\n');
  t.ok(ev.of('run-finished').every((e) => e.result === 'ok'));
  await r.stop();
});

t.test('runNow waits for the in-flight run and goes before debounced states', async (t) => {
  const s = script(`cat > "$DIR/in.$KPNG_CALLOUT_RUN"
if [ "$KPNG_CALLOUT_RUN" = 1 ]; then while [ ! -e "$DIR/go" ]; do sleep 0.01; done; fi`);
  const { r, ev } = makeRunner({ file: s.file });
  r.submit(st('a'));
  await ev.until('run-started', (e) => e.run === 1);
  r.submit(st('b'));
  const now = r.runNow(st('now'));
  writeFileSync(join(s.dir, 'go'), '');
  const res = await now;
  t.equal(res.run, 2);
  t.equal(res.result, 'ok');
  t.equal(readFileSync(join(s.dir, 'in.2'), 'utf8'), 'now\n');
  await r.idle();
  t.equal(readFileSync(join(s.dir, 'in.3'), 'utf8'), 'b\n');
  t.same(ev.of('run-started').map((e) => e.reason), ['change', 'now', 'change']);
  // runNow never skips identical input.
  const again = await r.runNow(st('b'));
  t.equal(again.result, 'ok');
  t.equal(again.run, 4);
  await r.stop();
});

t.test('debounce and max-wait (fake clock)', async (t) => {
  t.test('runs after debounceMs of quiet, with the newest state', async (t) => {
    const clock = new FakeClock();
    const { r, ev, out } = makeRunner({ file: '/bin/cat', debounceMs: 50, maxWaitMs: 1000, timeoutMs: 0, now: clock.now, timers: clock.timers });
    r.submit(st('A'));
    clock.advance(30);
    r.submit(st('B'));
    clock.advance(49);
    t.equal(ev.of('run-started').length, 0, 'not before 50ms of quiet');
    clock.advance(1);
    const started = await ev.until('run-started');
    t.equal(started.at, 80);
    t.equal(started.pendingSince, 0, 'pending since the first change of the burst');
    await ev.until('run-finished');
    t.equal(out.text(), 'B\n');
    await r.stop();
  });
  t.test('max-wait bounds a continuous stream of changes', async (t) => {
    const clock = new FakeClock();
    const { r, ev, out } = makeRunner({ file: '/bin/cat', debounceMs: 50, maxWaitMs: 150, timeoutMs: 0, now: clock.now, timers: clock.timers });
    for (let i = 0; i < 4; i++) {
      r.submit(st(`S${i}`));
      clock.advance(40);
    }
    // Submitted at 0, 40, 80, 120; now 160: max-wait fired at 150.
    const started = await ev.until('run-started');
    t.equal(started.at, 150);
    await ev.until('run-finished');
    t.equal(out.text(), 'S3\n');
    await r.stop();
  });
  t.test('debounce 0 runs at once, and again right after a run with coalesced states', async (t) => {
    const clock = new FakeClock();
    const s = script(`cat > "$DIR/in.$KPNG_CALLOUT_RUN"
if [ "$KPNG_CALLOUT_RUN" = 1 ]; then while [ ! -e "$DIR/go" ]; do sleep 0.01; done; fi`);
    const { r, ev } = makeRunner({ file: s.file, debounceMs: 0, maxWaitMs: 1000, timeoutMs: 0, now: clock.now, timers: clock.timers });
    r.submit(st('x'));
    t.equal(ev.of('run-started').length, 1, 'started synchronously in submit');
    r.submit(st('y'));
    r.submit(st('z'));
    writeFileSync(join(s.dir, 'go'), '');
    await ev.until('run-finished', (e) => e.run === 2);
    t.equal(clock.t, 0, 'no timer needed');
    t.equal(readFileSync(join(s.dir, 'in.2'), 'utf8'), 'z\n');
    await r.stop();
  });
});

t.test('skip identical input to the last successful run', async (t) => {
  const { r, ev, out, log } = makeRunner({ file: '/bin/cat' });
  r.submit(st('a', 'b'));
  await r.idle();
  r.submit(st('a', 'b')); // equal bytes, different Buffers
  await r.idle();
  t.equal(ev.of('run-started').length, 1);
  t.equal(ev.of('run-skipped').length, 1);
  t.ok(log.some((l) => l.level === 'debug' && /skipped/.test(l.msg)));
  r.submit(st('a', 'c'));
  await r.idle();
  r.submit(st('a', 'c'));
  await r.idle();
  t.equal(ev.of('run-started').length, 2);
  t.equal(ev.of('run-skipped').length, 2);
  t.equal(out.text(), 'a\nb\na\nc\n');
  await r.stop();
});

t.test('a failed run is not a skip baseline: identical input runs again', async (t) => {
  const s = script(`n=$(cat "$DIR/n" 2>/dev/null || echo 0); echo $((n+1)) > "$DIR/n"; cat >/dev/null; [ "$n" -ge 1 ]`);
  const { r, ev } = makeRunner({ file: s.file, retryMinMs: 60_000 });
  r.submit(st('same'));
  await ev.until('run-finished', (e) => e.run === 1);
  t.equal(ev.of('run-finished')[0]!.result, 'failed');
  r.submit(st('same'));
  const fin = await ev.until('run-finished', (e) => e.run === 2);
  t.equal(fin.result, 'ok');
  t.equal(ev.of('run-skipped').length, 0);
  await r.stop();
});

t.test('resync re-runs the newest state periodically even if identical', async (t) => {
  t.test('real timers', async (t) => {
    const { r, ev, out } = makeRunner({ file: '/bin/cat', resyncPeriodMs: 40 });
    r.submit(st('R'));
    await ev.until('run-finished', (e) => e.run === 3);
    t.same(ev.of('run-started').slice(0, 3).map((e) => e.reason), ['change', 'resync', 'resync']);
    t.equal(out.text().slice(0, 6), 'R\nR\nR\n');
    await r.stop();
  });
  t.test('fake clock: period counts from the last run; an identical pending state is not skipped when due', async (t) => {
    const clock = new FakeClock();
    const { r, ev, out } = makeRunner({ file: '/bin/cat', debounceMs: 10, maxWaitMs: 100, timeoutMs: 0, resyncPeriodMs: 1000, now: clock.now, timers: clock.timers });
    r.submit(st('R'));
    clock.advance(10);
    await ev.until('run-finished', (e) => e.run === 1);
    clock.advance(999);
    t.equal(ev.of('run-started').length, 1);
    clock.advance(1);
    await ev.until('run-finished', (e) => e.run === 2);
    t.equal(ev.of('run-started')[1]!.reason, 'resync');
    t.equal(ev.of('run-started')[1]!.at, 1010);
    // An identical state is skipped...
    r.submit(st('R'));
    clock.advance(10);
    await ev.until('run-skipped');
    // ...unless a resync fell due while it was pending.
    clock.advance(985); // t=2005
    r.submit(st('R')); // due at 2015
    clock.advance(5); // t=2010: the resync falls due while the state is pending
    t.equal(ev.of('run-started').length, 2, 'the resync waits for the pending state');
    clock.advance(5);
    await ev.until('run-finished', (e) => e.run === 3);
    t.equal(ev.of('run-skipped').length, 1);
    t.equal(out.text(), 'R\nR\nR\n');
    await r.stop();
    clock.advance(10_000);
    t.equal(ev.of('run-started').length, 3, 'no resync after stop');
  });
});

t.test('timeout kills the whole process group, grandchild included', async (t) => {
  t.test('SIGTERM is enough: done well before the SIGKILL grace', async (t) => {
    const s = groupScript(false);
    const { r, out, log } = makeRunner({ file: s.file, timeoutMs: 300, killGraceMs: 5000 });
    const p = r.runNow(st('x'));
    await out.waitFor('ready');
    const { pid, gpid } = groupPids(s);
    const res = await p;
    t.equal(res.result, 'timeout');
    t.equal(res.signal, 'SIGTERM');
    t.ok(res.durationMs < 4000, `did not wait for the SIGKILL grace (${res.durationMs}ms)`);
    t.ok(gone(pid), 'callout gone');
    t.ok(gone(gpid), 'grandchild gone');
    t.ok(log.some((l) => l.level === 'warn' && /timed out/.test(l.msg)));
  });
  t.test('SIGTERM ignored: SIGKILL after the grace; a grandchild holding stdout does not block', async (t) => {
    const s = groupScript(true);
    const { r, out } = makeRunner({ file: s.file, timeoutMs: 200, killGraceMs: 200 });
    const p = r.runNow(st('x'));
    await out.waitFor('ready');
    const { pid, gpid } = groupPids(s);
    const res = await p;
    t.equal(res.result, 'timeout');
    t.equal(res.signal, 'SIGKILL');
    t.ok(res.durationMs >= 350, `waited for the grace (${res.durationMs}ms)`);
    t.ok(gone(pid), 'callout gone');
    t.ok(gone(gpid), 'grandchild gone');
  });
});

t.test('a background grandchild holding stdout does not hold a normal run (and is killed with it)', async (t) => {
  const s = script(`sleep 1000 &
echo $! > "$DIR/gpid"
echo done`);
  const { r, out } = makeRunner({ file: s.file, pipeDrainMs: 50 });
  const res = await r.runNow(st('x'));
  const gpid = readPid(join(s.dir, 'gpid'));
  t.equal(res.result, 'ok');
  t.ok(res.durationMs < 3000, `finished in ${res.durationMs}ms`);
  t.equal(out.text(), 'done\n');
  t.ok(gone(gpid), 'the grandchild did not outlive the run');
});

t.test('retry with capped exponential backoff until success', async (t) => {
  const s = script(`n=$(cat "$DIR/n" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$DIR/n"
cat > "$DIR/in.$KPNG_CALLOUT_RUN"
if [ $n -lt 3 ]; then echo "boom $n" >&2; exit 7; fi`);
  const { r, ev, log } = makeRunner({ file: s.file, retryMinMs: 30, retryMaxMs: 50 });
  r.submit(st('S'));
  const ok = await ev.until('run-finished', (e) => e.result === 'ok');
  t.equal(ok.run, 3);
  const retries = ev.of('retry-scheduled');
  t.same(retries.map((e) => [e.run, e.attempt, e.delayMs]), [
    [1, 1, 30],
    [2, 2, 50], // 60 capped at 50
  ]);
  const starts = ev.of('run-started');
  t.same(starts.map((e) => e.reason), ['change', 'retry', 'retry']);
  const fin = ev.of('run-finished');
  t.ok(starts[1]!.at - fin[0]!.at >= 29, 'first retry waited its backoff');
  t.ok(starts[2]!.at - fin[1]!.at >= 49, 'second retry waited its backoff');
  t.equal(readFileSync(join(s.dir, 'in.3'), 'utf8'), 'S\n', 'retries run the same state');
  const fails = log.filter((l) => l.level === 'warn');
  t.equal(fails.length, 2);
  t.match(fails[0]!.msg, /failed: exit status 7/);
  t.equal(fails[0]!.fields?.stderr, 'boom 1');
  t.ok(log.some((l) => l.level === 'info' && /retrying/.test(l.msg)));
  t.equal(fin[0]!.exitCode, 7);
  t.equal(fin[0]!.stderrTail, 'boom 1');
  await r.stop();
});

t.test('a newer state supersedes a pending retry; the backoff resets only after a success (fake clock)', async (t) => {
  const clock = new FakeClock();
  const s = script(`if grep -q bad; then exit 1; fi`);
  const { r, ev } = makeRunner({ file: s.file, timeoutMs: 0, retryMinMs: 1000, retryMaxMs: 3000, now: clock.now, timers: clock.timers });
  r.submit(st('bad1'));
  await ev.until('retry-scheduled', (e) => e.attempt === 1);
  t.equal(ev.of('retry-scheduled')[0]!.delayMs, 1000);
  await r.idle(); // a scheduled retry does not count as pending
  r.submit(st('bad2')); // supersedes the retry, runs on the debounce path
  await ev.until('retry-scheduled', (e) => e.attempt === 2);
  t.equal(ev.of('retry-scheduled')[1]!.delayMs, 2000, 'attempt counter kept across the superseding state');
  t.equal(ev.of('run-started')[1]!.reason, 'change');
  clock.advance(1999);
  t.equal(ev.of('run-started').length, 2, 'the first retry was cancelled');
  clock.advance(1);
  await ev.until('retry-scheduled', (e) => e.attempt === 3);
  t.equal(ev.of('run-started')[2]!.reason, 'retry');
  t.equal(ev.of('retry-scheduled')[2]!.delayMs, 3000, 'capped');
  r.submit(st('good'));
  await ev.until('run-finished', (e) => e.result === 'ok');
  clock.advance(10_000);
  t.equal(ev.of('run-started').length, 4, 'no retry after the superseding state succeeded');
  r.submit(st('bad3'));
  await ev.until('retry-scheduled', (e) => e.run === 5);
  t.same(ev.of('retry-scheduled').slice(-1).map((e) => [e.attempt, e.delayMs]), [[1, 1000]], 'reset after the success');
  await r.stop();
  clock.advance(10_000);
  t.equal(ev.of('run-started').length, 5, 'stop cancels the pending retry');
});

t.test('spawn errors: ENOENT and EACCES', async (t) => {
  t.test('ENOENT', async (t) => {
    const { r, log } = makeRunner({ file: join(dir, 'nope') });
    const res = await r.runNow(st('x'));
    t.equal(res.result, 'spawn-error');
    t.equal(res.errorCode, 'ENOENT');
    t.equal(res.message, `callout ${join(dir, 'nope')}: not found (ENOENT); set --callout or $CALLOUT to an executable file`);
    t.ok(log.some((l) => l.level === 'error' && l.msg === res.message));
  });
  t.test('ENOENT by name in $PATH', async (t) => {
    const { r } = makeRunner({ file: 'kpng-callout-test-no-such-program' });
    const res = await r.runNow(st('x'));
    t.equal(res.errorCode, 'ENOENT');
  });
  t.test('EACCES', async (t) => {
    const f = join(dir, 'not-executable.sh');
    writeFileSync(f, '#!/bin/sh\nexit 0\n');
    chmodSync(f, 0o644);
    const { r } = makeRunner({ file: f });
    const res = await r.runNow(st('x'));
    t.equal(res.result, 'spawn-error');
    t.equal(res.errorCode, 'EACCES');
    t.equal(res.message, `callout ${f}: is not executable (EACCES); make it executable: chmod +x ${f}`);
  });
  t.test('the daemon path retries a spawn error', async (t) => {
    const { r, ev } = makeRunner({ file: join(dir, 'nope'), retryMinMs: 60_000 });
    r.submit(st('x'));
    const e = await ev.until('retry-scheduled');
    t.equal(e.run, 1);
    await r.stop();
  });
});

t.test('stdout is streamed while the callout runs, byte-exact', async (t) => {
  t.test('a line before the callout exits', async (t) => {
    const s = script(`echo first
while [ ! -e "$DIR/go" ]; do sleep 0.01; done
printf second`);
    const { r, out } = makeRunner({ file: s.file });
    let settled = false;
    const p = r.runNow(st('x')).then((res) => ((settled = true), res));
    await out.waitFor('first\n');
    t.notOk(settled, 'seen before the run ended');
    t.ok(r.busy);
    writeFileSync(join(s.dir, 'go'), '');
    const res = await p;
    t.equal(res.result, 'ok');
    t.equal(out.text(), 'first\nsecond', 'final partial line flushed, stdout unprefixed');
  });
  t.test('cat prints the state exactly (large, multi-byte)', async (t) => {
    const texts = Array.from({ length: 3000 }, (_, i) => `{"Service":{"Name":"svc-${i}","Namespace":"ns-ü-${i}"},"pad":"${'x'.repeat(i % 700)}"}`);
    const state = st(...texts);
    const { r, out } = makeRunner({ file: '/bin/cat' });
    const res = await r.runNow(state);
    t.equal(res.result, 'ok');
    t.ok(out.buffer().equals(Buffer.concat(state.lines as Buffer[])), `${state.bytes} bytes identical`);
  });
  t.test('a callout that does not read its stdin (EPIPE) is fine', async (t) => {
    const big = st(...Array.from({ length: 2000 }, () => 'y'.repeat(1000)));
    const { r } = makeRunner({ file: '/bin/true' });
    const res = await r.runNow(big);
    t.equal(res.result, 'ok');
    const res2 = await r.runNow(big);
    t.equal(res2.result, 'ok');
  });
  t.test('empty state: empty stdin', async (t) => {
    const { r, out } = makeRunner({ file: '/bin/cat' });
    const res = await r.runNow({ lines: [], services: 0, endpoints: 0, bytes: 0 });
    t.equal(res.result, 'ok');
    t.equal(out.text(), '');
  });
});

t.test('stderr is prefixed per run, and its tail goes with the failure', async (t) => {
  const s = script(`echo out
i=1; while [ $i -le 15 ]; do echo "line $i" >&2; i=$((i+1)); done
printf 'last without newline' >&2
exit 3`);
  const { r, out, err, log } = makeRunner({ file: s.file });
  const res = await r.runNow(st('x'));
  t.equal(res.result, 'failed');
  t.equal(res.exitCode, 3);
  t.equal(out.text(), 'out\n');
  const lines = err.text().split('\n');
  t.equal(lines.length, 17);
  t.equal(lines[0], '[run 1] line 1');
  t.equal(lines[15], '[run 1] last without newline');
  t.equal(lines[16], '');
  const want = [...Array.from({ length: 9 }, (_, i) => `line ${i + 7}`), 'last without newline'].join('\n');
  t.equal(res.stderrTail, want, 'last 10 lines');
  const warn = log.find((l) => l.level === 'warn');
  t.ok(warn, 'one failure line');
  t.equal(warn?.fields?.stderr, want);
  t.equal(warn?.fields?.status, 'failed');
  t.equal(warn?.fields?.exitCode, 3);
  const res2 = await r.runNow(st('x'));
  t.match(err.text(), /\[run 2\] line 1\n/);
  t.equal(res2.run, 2);
});

t.test('a stderr tail is bounded in bytes too', async (t) => {
  const s = script(`i=1; while [ $i -le 5 ]; do head -c 1500 /dev/zero | tr '\\0' a >&2; echo >&2; i=$((i+1)); done; exit 1`);
  const { r } = makeRunner({ file: s.file });
  const res = await r.runNow(st('x'));
  t.ok(res.stderrTail !== undefined && res.stderrTail.length <= 2048, `tail ${res.stderrTail?.length} chars`);
});

t.test('environment: ours plus KPNG_CALLOUT_RUN and KPNG_NODE_NAME', async (t) => {
  const s = script(`echo "$KPNG_CALLOUT_RUN|$KPNG_NODE_NAME|$FOO|\${HOME-unset}"`);
  const { r, out } = makeRunner({ file: s.file, env: { PATH: process.env.PATH, FOO: 'bar' } });
  await r.runNow(st('x'));
  await r.runNow(st('y'));
  t.equal(out.text(), '1|node-a|bar|unset\n2|node-a|bar|unset\n');
});

t.test('signal death is a failure with the signal', async (t) => {
  const { r } = makeRunner({ file: '/bin/sh', args: ['-c', 'kill -USR1 $$'] });
  const res = await r.runNow(st('x'));
  t.equal(res.result, 'signal');
  t.equal(res.signal, 'SIGUSR1');
});

t.test('stop()', async (t) => {
  t.test('lets the in-flight run finish within the grace', async (t) => {
    const s = script(`while [ ! -e "$DIR/go" ]; do sleep 0.01; done; echo finished`);
    const { r, ev, out } = makeRunner({ file: s.file });
    r.submit(st('x'));
    await ev.until('run-started');
    const stopped = r.stop(10_000);
    r.submit(st('ignored'));
    const late = await r.runNow(st('late'));
    t.equal(late.result, 'skipped', 'runNow after stop does not run');
    writeFileSync(join(s.dir, 'go'), '');
    await stopped;
    const fin = ev.of('run-finished');
    t.equal(fin.length, 1);
    t.equal(fin[0]!.result, 'ok');
    t.equal(out.text(), 'finished\n');
    t.equal(ev.of('run-started').length, 1);
    await r.idle();
  });
  t.test('a hung run is terminated after the grace, its group with it', async (t) => {
    const s = groupScript(false);
    const { r, out, ev } = makeRunner({ file: s.file, timeoutMs: 60_000 });
    r.submit(st('x'));
    await out.waitFor('ready');
    const { pid, gpid } = groupPids(s);
    const t0 = Date.now();
    await r.stop(50);
    t.ok(Date.now() - t0 < 4000, 'no SIGKILL grace needed');
    t.ok(gone(pid) && gone(gpid), 'no process left');
    const fin = await ev.until('run-finished');
    t.equal(fin.result, 'signal');
    t.equal(fin.signal, 'SIGTERM');
    t.equal(fin.message, 'callout run 1 stopped (SIGTERM)');
    t.equal(ev.of('retry-scheduled').length, 0, 'no retry after stop');
  });
  t.test('kill() SIGKILLs a run that ignores SIGTERM at once', async (t) => {
    const s = groupScript(true);
    const { r, out } = makeRunner({ file: s.file, killGraceMs: 60_000 });
    const p = r.runNow(st('x'));
    await out.waitFor('ready');
    const { pid, gpid } = groupPids(s);
    const stopped = r.stop(0); // SIGTERM now (ignored), SIGKILL only after 60s...
    r.kill(); // ...unless killed
    const res: RunResult = await p;
    await stopped;
    t.equal(res.result, 'signal');
    t.equal(res.signal, 'SIGKILL');
    t.ok(gone(pid) && gone(gpid), 'no process left');
  });
});

t.test('logs: a success does not repeat stderr; failures do; the state origin is named', async (t) => {
  const s = script(`cat >/dev/null; echo "note from run $KPNG_CALLOUT_RUN" >&2; [ "$KPNG_CALLOUT_RUN" = 1 ]`);
  const log = realLog();
  const { r } = makeRunner({ file: s.file, logger: log.logger });
  const ok = await r.runNow({ ...st('x'), origin: 'fixtures/a.jsonl' });
  t.equal(ok.result, 'ok');
  t.equal(ok.stderrTail, 'note from run 1', 'the result keeps the tail');
  t.match(log.matching(/callout run started/), [/ run=1 .*input=fixtures\/a\.jsonl/]);
  const fin = log.matching(/callout run finished/);
  t.match(fin, [/ run=1 status=ok .*input=fixtures\/a\.jsonl/]);
  t.notMatch(fin[0], /stderr=|note from run/, 'no stderr tail on success');
  const failed = await r.runNow({ ...st('y'), origin: 'fixtures/b.jsonl' });
  t.equal(failed.result, 'failed');
  t.match(log.matching(/callout run 2 failed/), [/input=fixtures\/b\.jsonl.* stderr="note from run 2"/]);
  const none = await r.runNow(st('z'));
  t.equal(none.result, 'failed');
  t.notMatch(log.matching(/callout run 3 failed/)[0], /input=/, 'no origin, no field');
  await r.stop();
});

t.test('the origin is named on a spawn error too', async (t) => {
  const log = realLog();
  const { r } = makeRunner({ file: join(dir, 'nope'), logger: log.logger });
  await r.runNow({ ...st('x'), origin: 'in.jsonl' });
  t.match(log.matching(/error: callout .*nope: not found/), [/input=in\.jsonl/]);
});

t.test("stderrFormat json: every line of the callout's stderr becomes one JSON object", async (t) => {
  const long = 'a' + 'ü'.repeat(10_000); // 20001 bytes: the 16 KiB cut falls inside a character
  const s = script(`cat
printf 'plain line\\n' >&2
printf 'quotes " and \\\\ backslash\\tand tab\\001\\n' >&2
printf 'bad \\377\\376 bytes\\n' >&2
printf 'crlf line\\r\\n' >&2
printf '%s\\n' '${long}' >&2
printf 'no newline at the end' >&2`);
  const clock = { t: Date.parse('2024-05-06T07:08:09.010Z') };
  const { r, out, err } = makeRunner({ file: s.file, stderrFormat: 'json', now: () => clock.t });
  const state = st('{"Service":{"Name":"ü"}}', 'second');
  const res = await r.runNow(state);
  t.equal(res.result, 'ok');
  t.ok(out.buffer().equals(Buffer.concat(state.lines as Buffer[])), 'stdout unchanged, byte for byte');
  const lines = err.text().split('\n');
  t.equal(lines.pop(), '', 'ends with a newline');
  const recs = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  for (const rec of recs) {
    t.same(Object.keys(rec), ['time', 'level', 'run', 'stream', 'msg']);
    t.match(rec, { time: '2024-05-06T07:08:09.010Z', level: 'info', run: 1, stream: 'stderr' });
  }
  const msgs = recs.map((x) => x.msg as string);
  t.equal(msgs[0], 'plain line');
  t.equal(msgs[1], 'quotes " and \\ backslash\tand tab\u0001');
  t.equal(msgs[2], 'bad \ufffd\ufffd bytes', 'invalid UTF-8 is replaced, the JSON stays valid');
  t.equal(msgs[3], 'crlf line');
  t.equal(msgs.length, 7, 'the long line is cut once');
  t.ok(msgs[4]!.length > 8000 && !msgs[4]!.includes('\ufffd') && !msgs[5]!.includes('\ufffd'), 'cut between characters');
  t.equal(msgs[4]! + msgs[5]!, long);
  t.equal(msgs[6], 'no newline at the end');
});

t.test('stderr text format: a long line is cut between characters, the output stays UTF-8', async (t) => {
  const long = 'a' + 'ü'.repeat(10_000);
  const s = script(`printf '%s\\n' '${long}' >&2`);
  const { r, err } = makeRunner({ file: s.file });
  await r.runNow(st('x'));
  t.equal(Buffer.from(err.text(), 'utf8').compare(err.buffer()), 0, 'valid UTF-8');
  const lines = err.text().split('\n');
  t.equal(lines.length, 3);
  t.equal(lines[0]!.slice('[run 1] '.length) + lines[1]!.slice('[run 1] '.length), long);
});

/** A destination that fails like a pipe whose reader went away, after `limit` bytes. */
class BrokenPipe extends Writable {
  got = 0;
  constructor(private readonly limit: number) {
    super({ highWaterMark: 1024 });
  }
  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    this.got += chunk.length;
    if (this.got > this.limit) cb(Object.assign(new Error('write EPIPE'), { code: 'EPIPE', errno: -32, syscall: 'write' }));
    else setImmediate(cb); // slow enough to exert backpressure
  }
}

t.test('our stdout or stderr breaking (EPIPE): no crash, no hang, kill() ends the run at once', async (t) => {
  const big = st(...Array.from({ length: 4000 }, (_, i) => `line ${i} ${'x'.repeat(500)}`));
  t.test('stdout breaks under cat: the run finishes, the rest is dropped', async (t) => {
    const stdout = new BrokenPipe(64 * 1024);
    const { r, log } = makeRunner({ file: '/bin/cat', stdout });
    const res = await r.runNow(big);
    t.equal(res.result, 'ok');
    t.ok(stdout.destroyed, 'the destination failed');
    t.ok(log.some((l) => l.level === 'debug' && /our stdout is closed \(EPIPE\)/.test(l.msg)));
    const again = await r.runNow(big);
    t.equal(again.result, 'ok', 'a later run does not wait on the broken stream either');
  });
  t.test('stderr breaks: the run finishes', async (t) => {
    const s = script(`i=0; while [ $i -lt 3000 ]; do echo "err line $i with some padding to fill the pipe quickly" >&2; i=$((i+1)); done`);
    const stderr = new BrokenPipe(8 * 1024);
    const { r } = makeRunner({ file: s.file, stderr });
    const res = await r.runNow(st('x'));
    t.equal(res.result, 'ok');
    t.ok(stderr.destroyed);
  });
  t.test('a destination already destroyed before the run', async (t) => {
    const stdout = new Sink();
    stdout.destroy();
    const { r } = makeRunner({ file: '/bin/cat', stdout });
    t.equal((await r.runNow(big)).result, 'ok');
  });
  t.test('a callout writing forever to a broken stdout: kill() ends the run promptly', async (t) => {
    const s = script(`echo $$ > "$DIR/pid"; exec yes`);
    const stdout = new BrokenPipe(32 * 1024);
    const closed = new Promise((resolve) => stdout.once('close', resolve));
    const { r } = makeRunner({ file: s.file, stdout, killGraceMs: 60_000 });
    const p = r.runNow(st('x'));
    await closed;
    const pid = readPid(join(s.dir, 'pid'));
    const t0 = Date.now();
    r.kill();
    const res = await p;
    t.ok(Date.now() - t0 < 3000, `ended in ${Date.now() - t0}ms`);
    t.equal(res.signal, 'SIGKILL');
    t.ok(gone(pid), 'callout gone');
  });
});

t.test('background processes left by a finished run are killed, with a warning naming them', async (t) => {
  t.test('holding stdout and stderr', async (t) => {
    const s = script(`sleep 1000 &
echo $! > "$DIR/gpid"
echo done`);
    const { r, out, log } = makeRunner({ file: s.file, pipeDrainMs: 50 });
    const res = await r.runNow(st('x'));
    const gpid = readPid(join(s.dir, 'gpid'));
    t.equal(res.result, 'ok', 'the run keeps its own status');
    t.equal(res.exitCode, 0);
    t.same(res.leftoverPids, [gpid]);
    t.ok(gone(gpid), `pid ${gpid} gone when the run finishes`);
    t.equal(out.text(), 'done\n');
    const warn = log.filter((l) => l.level === 'warn');
    t.equal(warn.length, 1);
    t.match(warn[0]!.msg, new RegExp(`callout run 1 exited but left processes running \\(pids ${gpid}\\)`));
    t.equal(warn[0]!.fields?.pids, String(gpid));
  });
  t.test('with its fds redirected: found at once, no pipe wait', async (t) => {
    const s = script(`sleep 1000 </dev/null >/dev/null 2>&1 &
echo $! > "$DIR/gpid"`);
    const { r, log } = makeRunner({ file: s.file, pipeDrainMs: 60_000 });
    const res = await r.runNow(st('x'));
    const gpid = readPid(join(s.dir, 'gpid'));
    t.equal(res.result, 'ok');
    t.ok(res.durationMs < 10_000, `did not wait for pipeDrainMs (${res.durationMs}ms)`);
    t.ok(gone(gpid));
    t.ok(log.some((l) => l.level === 'warn' && l.msg.includes(`pids ${gpid}`)));
  });
  t.test('a failed run: its status stays, the leftovers go too', async (t) => {
    const s = script(`sleep 1000 >/dev/null 2>&1 &
echo $! > "$DIR/gpid"; exit 4`);
    const { r } = makeRunner({ file: s.file });
    const res = await r.runNow(st('x'));
    t.equal(res.result, 'failed');
    t.equal(res.exitCode, 4);
    t.ok(gone(readPid(join(s.dir, 'gpid'))));
  });
  t.test('one that ignores SIGTERM: SIGKILLed after the grace', async (t) => {
    const s = script(`(trap '' TERM; touch "$DIR/trapped"; exec sleep 1000) >/dev/null 2>&1 &
echo $! > "$DIR/gpid"
while [ ! -e "$DIR/trapped" ]; do sleep 0.01; done`);
    const { r } = makeRunner({ file: s.file, killGraceMs: 300 });
    const res = await r.runNow(st('x'));
    const gpid = readPid(join(s.dir, 'gpid'));
    t.equal(res.result, 'ok');
    t.ok(res.durationMs >= 250, `waited for the grace (${res.durationMs}ms)`);
    t.ok(gone(gpid));
  });
  t.test('one that moved to a process group of its own (job control)', { skip: existsSync('/bin/bash') ? false : 'no bash' }, async (t) => {
    const s = script(`exec bash -c 'set -m; sleep 1000 >/dev/null 2>&1 & echo $! > "$0/gpid"; read -r _ _ _ _ pg _ < /proc/$!/stat; echo "$$ $pg" > "$0/groups"' "$DIR"`);
    const { r } = makeRunner({ file: s.file });
    const res = await r.runNow(st('x'));
    const gpid = readPid(join(s.dir, 'gpid'));
    const [leader, pgrp] = readFileSync(join(s.dir, 'groups'), 'utf8').trim().split(' ').map(Number);
    t.not(pgrp, leader, "the background process was not in the callout's group");
    t.equal(res.result, 'ok');
    t.same(res.leftoverPids, [gpid]);
    t.ok(gone(gpid));
  });
  t.test('one that keeps writing to the pipes: reading stops, it is killed', async (t) => {
    const s = script(`(while :; do echo bg; echo bg >&2; sleep 0.02; done) &
echo $! > "$DIR/gpid"`);
    const { r } = makeRunner({ file: s.file, pipeDrainMs: 50 });
    const res = await r.runNow(st('x'));
    const gpid = readPid(join(s.dir, 'gpid'));
    t.equal(res.result, 'ok');
    t.ok(gone(gpid));
  });
  t.test('the next run starts only once the leftovers are gone', async (t) => {
    const s = script(`cat >/dev/null; sleep 1000 >/dev/null 2>&1 &
echo $! > "$DIR/gpid.$KPNG_CALLOUT_RUN"`);
    const { r, ev } = makeRunner({ file: s.file, killGraceMs: 200 });
    let leftAlive: boolean | undefined;
    ev.until('run-started', (e) => e.run === 2).then(() => (leftAlive = !gone(readPid(join(s.dir, 'gpid.1')))));
    r.submit(st('a'));
    await ev.until('run-finished', (e) => e.run === 1);
    r.submit(st('b'));
    await ev.until('run-finished', (e) => e.run === 2);
    t.equal(leftAlive, false, "run 1's background process was gone when run 2 started");
    await r.stop();
  });
});

t.test('stop() and the exit hook: nothing of a run survives us', async (t) => {
  t.test('stop() during a run whose grandchild left its process group', { skip: existsSync('/bin/bash') ? false : 'no bash' }, async (t) => {
    const s = script(`exec bash -c 'set -m; sleep 1000 >/dev/null 2>&1 & echo $! > "$0/gpid"; echo $$ > "$0/pid"; echo ready; sleep 1000' "$DIR"`);
    const { r, out } = makeRunner({ file: s.file });
    r.submit(st('x'));
    await out.waitFor('ready');
    const pid = readPid(join(s.dir, 'pid'));
    const gpid = readPid(join(s.dir, 'gpid'));
    t.not(procStat(gpid)?.pgrp, pid, 'the grandchild has a group of its own');
    await r.stop(0);
    t.ok(gone(pid), 'callout gone');
    t.ok(gone(gpid), 'grandchild gone');
  });
  t.test("the process 'exit' hook kills the in-flight run, background processes included", { skip: existsSync('/bin/bash') ? false : 'no bash' }, async (t) => {
    const runnerUrl = new URL('../src/runner.ts', import.meta.url).href;
    const s = script(`exec bash -c 'set -m; sleep 1000 >/dev/null 2>&1 & echo "pids $$ $!"; sleep 1000' "$DIR"`);
    const code = `const { Runner } = await import(${JSON.stringify(runnerUrl)});
const r = new Runner({ file: ${JSON.stringify(s.file)}, debounceMs: 0, maxWaitMs: 0, timeoutMs: 0, nodeName: 'n' });
void r.runNow({ lines: [], services: 0, endpoints: 0, bytes: 0 });
process.stdin.once('data', () => process.exit(3));`;
    const loader = process.execArgv.filter((a) => a.includes('@tapjs/typescript'));
    const child = spawn(process.execPath, [...loader, '--input-type=module', '-e', code], { stdio: ['pipe', 'pipe', 'inherit'] });
    t.teardown(() => void child.kill('SIGKILL'));
    const exited = new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
    let text = '';
    const m = await new Promise<RegExpExecArray>((resolve, reject) => {
      child.stdout.on('data', (b: Buffer) => {
        text += b.toString();
        const hit = /pids (\d+) (\d+)/.exec(text);
        if (hit) resolve(hit);
      });
      void exited.then(() => reject(new Error(`child exited early: ${text}`)));
    });
    const [pid, gpid] = [Number(m[1]), Number(m[2])];
    spawnedPids.add(pid).add(gpid);
    t.ok(!gone(pid) && !gone(gpid), 'both running');
    child.stdin.write('exit\n');
    t.equal(await exited, 3);
    t.ok(gone(pid), 'callout gone at our exit');
    t.ok(gone(gpid), 'its background process gone at our exit');
  });
});

t.test('no orphans left by any test', async (t) => {
  for (const pid of spawnedPids) t.ok(gone(pid), `pid ${pid} gone`);
  t.notOk(existsSync(join(dir, 'nope')));
});
