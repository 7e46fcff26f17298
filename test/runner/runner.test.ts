/**
 * The Runner as the pipeline uses it: the scheduler and a process per run
 * together, with real callout scripts and real time (the rules themselves are
 * tested apart: scheduler.test.ts on a fake clock, callout-process.test.ts
 * with real scripts). Waits on events and output, never on fixed sleeps.
 */
import t from 'tap';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Runner, type RunnerOptions } from '../../src/runner/runner.js';
import { pidAlive, waitGone } from '../helpers/procs.js';
import { captureLog } from '../helpers/sink.js';
import { Events, Scripts, Sink, st } from './harness.js';

const scripts = new Scripts(t);

function makeRunner(extra: Partial<RunnerOptions> & { file: string }) {
  const ev = new Events();
  const out = new Sink();
  const err = new Sink();
  const log = captureLog();
  const r = new Runner({
    debounceMs: 0,
    maxWaitMs: 0,
    timeoutMs: 10_000,
    nodeName: 'node-a',
    stdout: out,
    stderr: err,
    logger: log.logger,
    onEvent: ev.on,
    random: () => 0.5,
    ...extra,
  });
  return { r, ev, out, err, log };
}

t.test('coalescing: a burst during a slow run gives one more run with the newest state', async (t) => {
  const s = scripts.script(`cat > "$DIR/in.$KPNG_CALLOUT_RUN"
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

t.test('input-written: between run-started and run-finished, once the callout has its input', async (t) => {
  const s = scripts.script(`cat > /dev/null
while [ ! -e "$DIR/go" ]; do sleep 0.01; done`);
  const { r, ev } = makeRunner({ file: s.file });
  r.submit(st('s0'));
  await ev.until('input-written', (e) => e.run === 1);
  t.equal(ev.of('run-finished').length, 0, 'the callout still runs');
  writeFileSync(join(s.dir, 'go'), '');
  await r.idle();
  t.same(
    ev.list.filter((e) => e.type !== 'pending-changed').map((e) => e.type),
    ['run-started', 'input-written', 'run-finished'],
  );
  await r.stop();
});

t.test('runNow waits for the in-flight run and goes before debounced states', async (t) => {
  const s = scripts.script(`cat > "$DIR/in.$KPNG_CALLOUT_RUN"
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
  await r.stop();
});

t.test('retry with backoff until success, the failures logged with their stderr', async (t) => {
  const s = scripts.script(`n=$(cat "$DIR/n" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$DIR/n"
cat > "$DIR/in.$KPNG_CALLOUT_RUN"
if [ $n -lt 3 ]; then echo "boom $n" >&2; exit 7; fi`);
  const { r, ev, err, log } = makeRunner({ file: s.file, retryMinMs: 30, retryMaxMs: 50 });
  r.submit(st('S'));
  const ok = await ev.until('run-finished', (e) => e.result === 'ok');
  t.equal(ok.run, 3);
  t.same(ev.of('retry-scheduled').map((e) => [e.run, e.attempt, e.delayMs]), [
    [1, 1, 30],
    [2, 2, 50],
  ]);
  const fin = ev.of('run-finished');
  const starts = ev.of('run-started');
  t.ok(starts[1]!.at - fin[0]!.at >= 29, 'first retry waited its backoff');
  t.ok(starts[2]!.at - fin[1]!.at >= 49, 'second retry waited its backoff');
  t.equal(readFileSync(join(s.dir, 'in.3'), 'utf8'), 'S\n', 'retries run the same state');
  t.match(log.matching(/ warn: /), [/^kpng-callout warn: callout run 1 failed: exit status 7 run=1 status=failed durationMs=\d+ exitCode=7 stderr="boom 1"$/, /callout run 2 failed/]);
  t.equal(err.text(), '[run 1] boom 1\n[run 2] boom 2\n', 'stderr shown live, prefixed');
  await r.stop();
});

t.test('a timeout is logged as a failure, a stop is not', async (t) => {
  const s = scripts.groupScript(false);
  // A timeout the script outlives until it says `ready` on a loaded machine (it runs from the spawn).
  const { r, out, log } = makeRunner({ file: s.file, timeoutMs: 2000, retryMinMs: 60_000 });
  r.submit(st('x'));
  await out.waitFor('ready');
  scripts.groupPids(s);
  await log.waitFor(/warn: callout run 1 timed out after 2000ms; its process group was killed run=1 status=timeout .*signal=SIGTERM/);
  const s2 = scripts.groupScript(false);
  const second = makeRunner({ file: s2.file });
  second.r.submit(st('x'));
  await second.out.waitFor('ready');
  scripts.groupPids(s2);
  await second.r.stop(0);
  t.match(second.log.matching(/stopped/), [/^kpng-callout info: callout run 1 stopped \(SIGTERM\) run=1 status=signal /]);
  t.equal(second.log.matching(/ warn: /).length, 0);
  await r.stop();
});

t.test('stop() lets the in-flight run finish within the grace', async (t) => {
  const s = scripts.script(`while [ ! -e "$DIR/go" ]; do sleep 0.01; done; echo finished`);
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

t.test('kill() SIGKILLs a run that ignores SIGTERM at once', async (t) => {
  const s = scripts.groupScript(true);
  const { r, out } = makeRunner({ file: s.file, killGraceMs: 60_000 });
  const p = r.runNow(st('x'));
  await out.waitFor('ready');
  const { pid, gpid } = scripts.groupPids(s);
  const stopped = r.stop(0); // SIGTERM now (ignored), SIGKILL only after 60s...
  r.kill(); // ...unless killed
  const res = await p;
  await stopped;
  t.equal(res.result, 'signal');
  t.equal(res.signal, 'SIGKILL');
  t.ok(!pidAlive(pid) && !pidAlive(gpid), 'no process left');
});

t.test('the next run starts only once the leftovers of the last one are gone', async (t) => {
  const s = scripts.script(`cat >/dev/null; sleep 1000 >/dev/null 2>&1 &
echo $! > "$DIR/gpid.$KPNG_CALLOUT_RUN"`);
  const { r, ev } = makeRunner({ file: s.file, killGraceMs: 200 });
  let leftAlive: boolean | undefined;
  void ev.until('run-started', (e) => e.run === 2).then(() => (leftAlive = pidAlive(scripts.pid(join(s.dir, 'gpid.1')))));
  r.submit(st('a'));
  await ev.until('run-finished', (e) => e.run === 1);
  r.submit(st('b'));
  await ev.until('run-finished', (e) => e.run === 2);
  t.equal(leftAlive, false, "run 1's background process was gone when run 2 started");
  scripts.pid(join(s.dir, 'gpid.2'));
  await r.stop();
});

t.test('resync with real timers', async (t) => {
  const { r, ev, out } = makeRunner({ file: '/bin/cat', resyncPeriodMs: 40 });
  r.submit(st('R'));
  await ev.until('run-finished', (e) => e.run === 3);
  t.same(ev.of('run-started').slice(0, 3).map((e) => e.reason), ['change', 'resync', 'resync']);
  t.equal(out.text().slice(0, 6), 'R\nR\nR\n');
  await r.stop();
});

t.test('with only a program and a node name (defaults for the rest)', async (t) => {
  const out = new Sink();
  const r = new Runner({ file: '/bin/cat', nodeName: 'n', stdout: out });
  t.equal((await r.runNow(st('x'))).result, 'ok');
  t.equal(out.text(), 'x\n');
  await r.stop();
});

t.test("the process 'exit' hook kills the in-flight run, background processes included", { skip: existsSync('/bin/bash') ? false : 'no bash' }, async (t) => {
  const runnerUrl = new URL('../../src/runner/runner.ts', import.meta.url).href;
  const s = scripts.script(`exec bash -c 'set -m; sleep 1000 >/dev/null 2>&1 & echo "pids $$ $!"; sleep 1000' "$DIR"`);
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
  const [pid, gpid] = [scripts.track(Number(m[1])), scripts.track(Number(m[2]))];
  t.ok(pidAlive(pid) && pidAlive(gpid), 'both running');
  child.stdin.write('exit\n');
  t.equal(await exited, 3);
  // SIGKILLed by the exit hook before the child exited; the kernel takes a moment to end them.
  await waitGone(pid, 2000);
  await waitGone(gpid, 2000);
  t.pass('callout and its background process gone at our exit');
});

t.test('no orphans left by any test', async (t) => {
  for (const pid of scripts.all()) t.ok(!pidAlive(pid), `pid ${pid} gone`);
});
