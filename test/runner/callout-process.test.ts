/**
 * A process per run, with real child processes (small sh scripts in tmp
 * dirs): stdin and stdout byte for byte, stderr lines and tail, environment,
 * spawn errors, timeout and our terminate/kill reaching the whole process
 * group, leftover background processes, broken output streams. Waits on
 * output and results, never on fixed sleeps.
 */
import t from 'tap';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { RunResult } from '../../src/runner/callout.js';
import { CalloutProcess, type CalloutProcessOptions } from '../../src/runner/callout-process.js';
import type { State } from '../../src/state.js';
import { shScript, tempDir } from '../helpers/files.js';
import { pidAlive, procStat } from '../helpers/procs.js';
import { captureLog } from '../helpers/sink.js';
import { BrokenPipe, Scripts, Sink, st } from './harness.js';

const scripts = new Scripts(t);
const dir = tempDir(t, 'callout-process-test-');

function makeCallout(extra: Partial<CalloutProcessOptions> & { file: string }) {
  const out = new Sink();
  const err = new Sink();
  const log = captureLog();
  const callout = new CalloutProcess({ timeoutMs: 10_000, nodeName: 'node-a', stdout: out, stderr: err, logger: log.logger, ...extra });
  let runs = 0;
  const start = (state: State) => callout.start({ run: ++runs, state, reason: 'now' });
  const run = (state: State): Promise<RunResult> => start(state).done;
  return { callout, start, run, out, err, log };
}

t.test('timeout kills the whole process group, grandchild included', async (t) => {
  // The timeout runs from the spawn: it must leave the script time to start its grandchild and say
  // `ready` (sh start-up alone takes 200 ms and more on a loaded machine), else the group is ended
  // before the marker the test waits for, and the test hangs.
  t.test('SIGTERM is enough: done well before the SIGKILL grace', async (t) => {
    const s = scripts.groupScript(false);
    const { run, out, log } = makeCallout({ file: s.file, timeoutMs: 2000, killGraceMs: 60_000 });
    const p = run(st('x'));
    await out.waitFor('ready');
    const { pid, gpid } = scripts.groupPids(s);
    const res = await p;
    t.equal(res.result, 'timeout');
    t.equal(res.signal, 'SIGTERM');
    t.equal(res.message, 'callout run 1 timed out after 2000ms; its process group was killed');
    t.notOk(res.stopped, 'a timeout is a failure, not our stop');
    t.ok(res.durationMs < 30_000, `did not wait for the SIGKILL grace (${res.durationMs}ms)`);
    t.ok(!pidAlive(pid), 'callout gone');
    t.ok(!pidAlive(gpid), 'grandchild gone');
    t.match(log.matching(/timed out/), [/debug: callout run 1 timed out: SIGTERM its group run=1 timeoutMs=2000$/]);
  });
  t.test('SIGTERM ignored: SIGKILL after the grace; a grandchild holding stdout does not block', async (t) => {
    const s = scripts.groupScript(true);
    const { run, out, log } = makeCallout({ file: s.file, timeoutMs: 2000, killGraceMs: 200 });
    const p = run(st('x'));
    await out.waitFor('ready');
    const { pid, gpid } = scripts.groupPids(s);
    const res = await p;
    t.equal(res.result, 'timeout');
    t.equal(res.signal, 'SIGKILL');
    t.ok(res.durationMs >= 2150, `waited for the grace (${res.durationMs}ms)`);
    t.ok(!pidAlive(pid), 'callout gone');
    t.ok(!pidAlive(gpid), 'grandchild gone');
    t.ok(log.matching(/still running after SIGTERM: SIGKILL it run=1$/).length === 1);
  });
});

t.test('a background grandchild holding stdout does not hold a normal run (and is killed with it)', async (t) => {
  const s = scripts.script(`sleep 1000 &
echo $! > "$DIR/gpid"
echo done`);
  const { run, out } = makeCallout({ file: s.file, pipeDrainMs: 50 });
  const res = await run(st('x'));
  const gpid = scripts.pid(join(s.dir, 'gpid'));
  t.equal(res.result, 'ok');
  t.ok(res.durationMs < 3000, `finished in ${res.durationMs}ms`);
  t.equal(out.text(), 'done\n');
  t.ok(!pidAlive(gpid), 'the grandchild did not outlive the run');
});

t.test('spawn errors: ENOENT and EACCES', async (t) => {
  t.test('ENOENT', async (t) => {
    const { run } = makeCallout({ file: join(dir, 'nope') });
    const res = await run(st('x'));
    t.equal(res.result, 'spawn-error');
    t.equal(res.errorCode, 'ENOENT');
    t.equal(res.message, `callout ${join(dir, 'nope')}: not found (ENOENT); set --callout or $CALLOUT to an executable file`);
  });
  t.test('ENOENT by name in $PATH', async (t) => {
    const { run } = makeCallout({ file: 'kpng-callout-test-no-such-program' });
    const res = await run(st('x'));
    t.equal(res.errorCode, 'ENOENT');
  });
  t.test('EACCES', async (t) => {
    const f = shScript(dir, 'not-executable.sh', 'exit 0\n', 0o644);
    const { run } = makeCallout({ file: f });
    const res = await run(st('x'));
    t.equal(res.result, 'spawn-error');
    t.equal(res.errorCode, 'EACCES');
    t.equal(res.message, `callout ${f}: is not executable (EACCES); make it executable: chmod +x ${f}`);
  });
});

t.test('stdout is streamed while the callout runs, byte-exact', async (t) => {
  t.test('a line before the callout exits', async (t) => {
    const s = scripts.script(`echo first
while [ ! -e "$DIR/go" ]; do sleep 0.01; done
printf second`);
    const { run, out } = makeCallout({ file: s.file });
    let settled = false;
    const p = run(st('x')).then((res) => ((settled = true), res));
    await out.waitFor('first\n');
    t.notOk(settled, 'seen before the run ended');
    writeFileSync(join(s.dir, 'go'), '');
    const res = await p;
    t.equal(res.result, 'ok');
    t.equal(out.text(), 'first\nsecond', 'final partial line flushed, stdout unprefixed');
  });
  t.test('cat prints the state exactly (large, multi-byte)', async (t) => {
    const texts = Array.from({ length: 3000 }, (_, i) => `{"Service":{"Name":"svc-${i}","Namespace":"ns-ü-${i}"},"pad":"${'x'.repeat(i % 700)}"}`);
    const state = st(...texts);
    const { run, out } = makeCallout({ file: '/bin/cat' });
    const res = await run(state);
    t.equal(res.result, 'ok');
    t.ok(out.buffer().equals(Buffer.concat(state.lines as Buffer[])), `${state.bytes} bytes identical`);
  });
  t.test('a callout that does not read its stdin (EPIPE) is fine', async (t) => {
    const big = st(...Array.from({ length: 2000 }, () => 'y'.repeat(1000)));
    const { run } = makeCallout({ file: '/bin/true' });
    const res = await run(big);
    t.equal(res.result, 'ok');
    const res2 = await run(big);
    t.equal(res2.result, 'ok');
  });
  t.test('written: resolves once stdin is handed over, while the callout still runs', async (t) => {
    const s = scripts.script(`cat > "$DIR/in"
while [ ! -e "$DIR/go" ]; do sleep 0.01; done`);
    const { start } = makeCallout({ file: s.file });
    const state = st(...Array.from({ length: 500 }, (_, i) => `${i}`.padEnd(1000, 'z')));
    const f = start(state);
    let over = false;
    void f.done.then(() => (over = true));
    await f.written;
    t.notOk(over, 'before the run is over');
    writeFileSync(join(s.dir, 'go'), '');
    t.equal((await f.done).result, 'ok');
    t.equal(readFileSync(join(s.dir, 'in')).length, state.bytes, 'all of it was read');
    const g = makeCallout({ file: '/bin/true' }).start(state);
    await g.written;
    t.equal((await g.done).result, 'ok', 'a callout that reads nothing: resolved too');
  });
  t.test('empty state: empty stdin', async (t) => {
    const { run, out } = makeCallout({ file: '/bin/cat' });
    const res = await run({ lines: [], services: 0, endpoints: 0, bytes: 0 });
    t.equal(res.result, 'ok');
    t.equal(out.text(), '');
  });
});

t.test('stderr is prefixed per run, and its tail goes with the failure', async (t) => {
  const s = scripts.script(`echo out
i=1; while [ $i -le 15 ]; do echo "line $i" >&2; i=$((i+1)); done
printf 'last without newline' >&2
exit 3`);
  const { run, out, err } = makeCallout({ file: s.file });
  const res = await run(st('x'));
  t.equal(res.result, 'failed');
  t.equal(res.exitCode, 3);
  t.equal(res.message, 'callout run 1 failed: exit status 3');
  t.equal(out.text(), 'out\n');
  const lines = err.text().split('\n');
  t.equal(lines.length, 17);
  t.equal(lines[0], '[run 1] line 1');
  t.equal(lines[15], '[run 1] last without newline');
  t.equal(lines[16], '');
  const want = [...Array.from({ length: 9 }, (_, i) => `line ${i + 7}`), 'last without newline'].join('\n');
  t.equal(res.stderrTail, want, 'last 10 lines');
  const res2 = await run(st('x'));
  t.match(err.text(), /\[run 2\] line 1\n/);
  t.equal(res2.run, 2);
});

t.test('a stderr tail is bounded in bytes too', async (t) => {
  const s = scripts.script(`i=1; while [ $i -le 5 ]; do head -c 1500 /dev/zero | tr '\\0' a >&2; echo >&2; i=$((i+1)); done; exit 1`);
  const { run } = makeCallout({ file: s.file });
  const res = await run(st('x'));
  t.ok(res.stderrTail !== undefined && res.stderrTail.length <= 2048, `tail ${res.stderrTail?.length} chars`);
});

t.test('environment: ours plus KPNG_CALLOUT_RUN and KPNG_NODE_NAME', async (t) => {
  const s = scripts.script(`echo "$KPNG_CALLOUT_RUN|$KPNG_NODE_NAME|$FOO|\${HOME-unset}"`);
  const { run, out } = makeCallout({ file: s.file, env: { PATH: process.env.PATH, FOO: 'bar' } });
  await run(st('x'));
  await run(st('y'));
  t.equal(out.text(), '1|node-a|bar|unset\n2|node-a|bar|unset\n');
});

t.test('environment: our own KPNG_CALLOUT_* variables are never passed through', async (t) => {
  const s = scripts.script(`echo "\${KPNG_CALLOUT_INPUT-unset}|\${KPNG_CALLOUT_MODE-unset}|$KPNG_CALLOUT_RUN|$KPNG_NODE_NAME"`);
  const env = { PATH: process.env.PATH, KPNG_CALLOUT_INPUT: 'changes', KPNG_CALLOUT_MODE: 'persistent', KPNG_CALLOUT_RUN: '99', KPNG_NODE_NAME: 'other' };
  const { run, out } = makeCallout({ file: s.file, env });
  await run(st('x'));
  t.equal(out.text(), 'unset|unset|1|node-a\n');
});

t.test('signal death is a failure with the signal', async (t) => {
  const { run } = makeCallout({ file: '/bin/sh', args: ['-c', 'kill -USR1 $$'] });
  const res = await run(st('x'));
  t.equal(res.result, 'signal');
  t.equal(res.signal, 'SIGUSR1');
  t.equal(res.message, 'callout run 1 killed by SIGUSR1');
});

t.test('terminate() and kill(): our stop reaches the whole group', async (t) => {
  t.test('terminate() SIGTERMs a hung run and its group; the result is stopped', async (t) => {
    const s = scripts.groupScript(false);
    const { start, out } = makeCallout({ file: s.file, timeoutMs: 60_000 });
    const inflight = start(st('x'));
    await out.waitFor('ready');
    const { pid, gpid } = scripts.groupPids(s);
    const t0 = Date.now();
    inflight.terminate();
    const res = await inflight.done;
    t.ok(Date.now() - t0 < 4000, 'no SIGKILL grace needed');
    t.ok(!pidAlive(pid) && !pidAlive(gpid), 'no process left');
    t.match(res, { result: 'signal', signal: 'SIGTERM', stopped: true, message: 'callout run 1 stopped (SIGTERM)' });
  });
  t.test('kill() SIGKILLs a run that ignores SIGTERM at once', async (t) => {
    const s = scripts.groupScript(true);
    const { start, out } = makeCallout({ file: s.file, killGraceMs: 60_000 });
    const inflight = start(st('x'));
    await out.waitFor('ready');
    const { pid, gpid } = scripts.groupPids(s);
    inflight.terminate(); // SIGTERM now (ignored), SIGKILL only after 60s...
    inflight.kill(); // ...unless killed
    const res = await inflight.done;
    t.match(res, { result: 'signal', signal: 'SIGKILL', stopped: true });
    t.ok(!pidAlive(pid) && !pidAlive(gpid), 'no process left');
  });
  t.test('terminate() during a run whose grandchild left its process group', { skip: existsSync('/bin/bash') ? false : 'no bash' }, async (t) => {
    const s = scripts.script(`exec bash -c 'set -m; sleep 1000 >/dev/null 2>&1 & echo $! > "$0/gpid"; echo $$ > "$0/pid"; echo ready; sleep 1000' "$DIR"`);
    const { start, out } = makeCallout({ file: s.file });
    const inflight = start(st('x'));
    await out.waitFor('ready');
    const pid = scripts.pid(join(s.dir, 'pid'));
    const gpid = scripts.pid(join(s.dir, 'gpid'));
    t.not(procStat(gpid)?.pgrp, pid, 'the grandchild has a group of its own');
    inflight.terminate();
    await inflight.done;
    t.ok(!pidAlive(pid), 'callout gone');
    t.ok(!pidAlive(gpid), 'grandchild gone');
  });
  t.test('after the run, both do nothing', async (t) => {
    const { start } = makeCallout({ file: '/bin/true' });
    const inflight = start(st('x'));
    t.equal((await inflight.done).result, 'ok');
    inflight.terminate();
    inflight.kill();
  });
});

t.test("stderrFormat json: every line of the callout's stderr becomes one JSON object", async (t) => {
  const long = 'a' + 'ü'.repeat(10_000); // 20001 bytes: the 16 KiB cut falls inside a character
  const s = scripts.script(`cat
printf 'plain line\\n' >&2
printf 'quotes " and \\\\ backslash\\tand tab\\001\\n' >&2
printf 'bad \\377\\376 bytes\\n' >&2
printf 'crlf line\\r\\n' >&2
printf '%s\\n' '${long}' >&2
printf 'no newline at the end' >&2`);
  const clock = { t: Date.parse('2024-05-06T07:08:09.010Z') };
  const { run, out, err } = makeCallout({ file: s.file, stderrFormat: 'json', now: () => clock.t });
  const state = st('{"Service":{"Name":"ü"}}', 'second');
  const res = await run(state);
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
  const s = scripts.script(`printf '%s\\n' '${long}' >&2`);
  const { run, err } = makeCallout({ file: s.file });
  await run(st('x'));
  t.equal(Buffer.from(err.text(), 'utf8').compare(err.buffer()), 0, 'valid UTF-8');
  const lines = err.text().split('\n');
  t.equal(lines.length, 3);
  t.equal(lines[0]!.slice('[run 1] '.length) + lines[1]!.slice('[run 1] '.length), long);
});

t.test('our stdout or stderr breaking (EPIPE): no crash, no hang, kill() ends the run at once', async (t) => {
  const big = st(...Array.from({ length: 4000 }, (_, i) => `line ${i} ${'x'.repeat(500)}`));
  t.test('stdout breaks under cat: the run finishes, the rest is dropped', async (t) => {
    const stdout = new BrokenPipe(64 * 1024);
    const { run, log } = makeCallout({ file: '/bin/cat', stdout });
    const res = await run(big);
    t.equal(res.result, 'ok');
    t.ok(stdout.destroyed, 'the destination failed');
    t.equal(log.matching(/debug: our stdout is closed \(EPIPE\): the callout's stdout is dropped$/).length, 1);
    const again = await run(big);
    t.equal(again.result, 'ok', 'a later run does not wait on the broken stream either');
  });
  t.test('stderr breaks: the run finishes', async (t) => {
    const s = scripts.script(`i=0; while [ $i -lt 3000 ]; do echo "err line $i with some padding to fill the pipe quickly" >&2; i=$((i+1)); done`);
    const stderr = new BrokenPipe(8 * 1024);
    const { run } = makeCallout({ file: s.file, stderr });
    const res = await run(st('x'));
    t.equal(res.result, 'ok');
    t.ok(stderr.destroyed);
  });
  t.test('a destination already destroyed before the run', async (t) => {
    const stdout = new Sink();
    stdout.destroy();
    const { run } = makeCallout({ file: '/bin/cat', stdout });
    t.equal((await run(big)).result, 'ok');
  });
  t.test('a callout writing forever to a broken stdout: kill() ends the run promptly', async (t) => {
    const s = scripts.script(`echo $$ > "$DIR/pid"; exec yes`);
    const stdout = new BrokenPipe(32 * 1024);
    const closed = new Promise((resolve) => stdout.once('close', resolve));
    const { start } = makeCallout({ file: s.file, stdout, killGraceMs: 60_000 });
    const inflight = start(st('x'));
    await closed;
    const pid = scripts.pid(join(s.dir, 'pid'));
    const t0 = Date.now();
    inflight.kill();
    const res = await inflight.done;
    t.ok(Date.now() - t0 < 3000, `ended in ${Date.now() - t0}ms`);
    t.equal(res.signal, 'SIGKILL');
    t.ok(!pidAlive(pid), 'callout gone');
  });
});

t.test('background processes left by a finished run are killed, with a warning naming them', async (t) => {
  t.test('holding stdout and stderr', async (t) => {
    const s = scripts.script(`sleep 1000 &
echo $! > "$DIR/gpid"
echo done`);
    const { run, out, log } = makeCallout({ file: s.file, pipeDrainMs: 50 });
    const res = await run({ ...st('x'), origin: 'in.jsonl' });
    const gpid = scripts.pid(join(s.dir, 'gpid'));
    t.equal(res.result, 'ok', 'the run keeps its own status');
    t.equal(res.exitCode, 0);
    t.same(res.leftoverPids, [gpid]);
    t.ok(!pidAlive(gpid), `pid ${gpid} gone when the run finishes`);
    t.equal(out.text(), 'done\n');
    const warn = log.matching(/ warn: /);
    t.equal(warn.length, 1);
    t.equal(
      warn[0],
      `kpng-callout warn: callout run 1 exited but left processes running (pids ${gpid}): terminating them; a callout must not leave background processes behind run=1 pids=${gpid} input=in.jsonl`,
    );
  });
  t.test('with its fds redirected: found at once, no pipe wait', async (t) => {
    const s = scripts.script(`sleep 1000 </dev/null >/dev/null 2>&1 &
echo $! > "$DIR/gpid"`);
    const { run, log } = makeCallout({ file: s.file, pipeDrainMs: 60_000 });
    const res = await run(st('x'));
    const gpid = scripts.pid(join(s.dir, 'gpid'));
    t.equal(res.result, 'ok');
    t.ok(res.durationMs < 10_000, `did not wait for pipeDrainMs (${res.durationMs}ms)`);
    t.ok(!pidAlive(gpid));
    t.equal(log.matching(new RegExp(`warn: .*pids ${gpid}`)).length, 1);
  });
  t.test('a failed run: its status stays, the leftovers go too', async (t) => {
    const s = scripts.script(`sleep 1000 >/dev/null 2>&1 &
echo $! > "$DIR/gpid"; exit 4`);
    const { run } = makeCallout({ file: s.file });
    const res = await run(st('x'));
    t.equal(res.result, 'failed');
    t.equal(res.exitCode, 4);
    t.ok(!pidAlive(scripts.pid(join(s.dir, 'gpid'))));
  });
  t.test('one that ignores SIGTERM: SIGKILLed after the grace', async (t) => {
    const s = scripts.script(`(trap '' TERM; touch "$DIR/trapped"; exec sleep 1000) >/dev/null 2>&1 &
echo $! > "$DIR/gpid"
while [ ! -e "$DIR/trapped" ]; do sleep 0.01; done`);
    const { run } = makeCallout({ file: s.file, killGraceMs: 300 });
    const res = await run(st('x'));
    const gpid = scripts.pid(join(s.dir, 'gpid'));
    t.equal(res.result, 'ok');
    t.ok(res.durationMs >= 250, `waited for the grace (${res.durationMs}ms)`);
    t.ok(!pidAlive(gpid));
  });
  t.test('one that moved to a process group of its own (job control)', { skip: existsSync('/bin/bash') ? false : 'no bash' }, async (t) => {
    const s = scripts.script(`exec bash -c 'set -m; sleep 1000 >/dev/null 2>&1 & echo $! > "$0/gpid"; read -r _ _ _ _ pg _ < /proc/$!/stat; echo "$$ $pg" > "$0/groups"' "$DIR"`);
    const { run } = makeCallout({ file: s.file });
    const res = await run(st('x'));
    const gpid = scripts.pid(join(s.dir, 'gpid'));
    const [leader, pgrp] = readFileSync(join(s.dir, 'groups'), 'utf8').trim().split(' ').map(Number);
    t.not(pgrp, leader, "the background process was not in the callout's group");
    t.equal(res.result, 'ok');
    t.same(res.leftoverPids, [gpid]);
    t.ok(!pidAlive(gpid));
  });
  t.test('one that keeps writing to the pipes: reading stops, it is killed', async (t) => {
    const s = scripts.script(`(while :; do echo bg; echo bg >&2; sleep 0.02; done) &
echo $! > "$DIR/gpid"`);
    const { run } = makeCallout({ file: s.file, pipeDrainMs: 50 });
    const res = await run(st('x'));
    const gpid = scripts.pid(join(s.dir, 'gpid'));
    t.equal(res.result, 'ok');
    t.ok(!pidAlive(gpid));
  });
});

t.test('close() has nothing to end', async (t) => {
  const { callout } = makeCallout({ file: '/bin/true' });
  await callout.close();
  t.pass('resolved');
});

t.test('no orphans left by any test', async (t) => {
  for (const pid of scripts.all()) t.ok(!pidAlive(pid), `pid ${pid} gone`);
  t.notOk(existsSync(join(dir, 'nope')));
});
