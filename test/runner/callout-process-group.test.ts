/**
 * A process per run, with real child processes (small sh scripts in tmp
 * dirs): the timeout and our terminate/kill reaching the whole process
 * group, a background grandchild holding stdout, leftover background
 * processes (killed, with a warning naming them), close(). Streams and
 * environment: callout-process.test.ts. Waits on output and results, never
 * on fixed sleeps.
 */
import t from 'tap';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { tempDir } from '../helpers/files.js';
import { pidAlive, procStat } from '../helpers/procs.js';
import { makeCallout, Scripts, st } from './harness.js';

const scripts = new Scripts(t);
const dir = tempDir(t, 'callout-process-group-test-');

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
