/**
 * ProcessGroup with real process groups (sh started with setsid, as a
 * callout is): listing the live members, SIGTERM with a SIGKILL grace,
 * SIGKILL, clearing what a leader left behind, reaching a background job that
 * moved to a group of its own, and the exit hook's lifetime.
 */
import t from 'tap';
import { spawn } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { ProcessGroup } from '../../src/runner/process-group.js';
import { pidAlive } from '../helpers/procs.js';
import { captureLog } from '../helpers/sink.js';
import { within } from '../helpers/wait.js';
import { Scripts } from './harness.js';

const scripts = new Scripts(t);

/**
 * Starts `sh -c body` as the leader of a new group and session; `body` prints
 * one line of pids, which resolves `pids` (the leader's first).
 */
async function leader(body: string, shell = '/bin/sh') {
  const child = spawn(shell, ['-c', body], { detached: true, stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const rl = createInterface({ input: child.stdout! });
  const line = await within(new Promise<string>((resolve) => rl.once('line', resolve)), 'the pids line');
  const pids = line.trim().split(/\s+/).map((p) => scripts.track(Number(p)));
  const log = captureLog();
  const group = new ProcessGroup(child.pid!, { killGraceMs: 200, logger: log.logger, name: 'callout run 9', fields: { run: 9 } });
  t.teardown(() => group.release());
  return { child, pids, group, log, exited };
}

t.test('members: the live processes of the group, ascending', async (t) => {
  const { pids, group, exited } = await leader('sleep 1000 & echo $$ $!; wait');
  t.same(group.members(), [...pids].sort((a, b) => a - b));
  group.kill();
  await exited;
  await group.waitGone();
  t.same(group.members(), []);
});

t.test('terminate: SIGTERM is enough, the SIGKILL timer is cancelled once the group is gone', async (t) => {
  const { pids, group, log, exited } = await leader('sleep 1000 & echo $$ $!; wait');
  group.terminate();
  await exited;
  await group.waitGone();
  t.ok(pids.every((pid) => !pidAlive(pid)), 'leader and child gone');
  await sleep(300); // past the grace: nothing may fire
  t.same(log.lines, [], 'no SIGKILL');
});

t.test('terminate: a group ignoring SIGTERM is SIGKILLed after the grace', async (t) => {
  const { pids, group, log } = await leader(`trap '' TERM; sleep 1000 & echo $$ $!; wait; wait`);
  const t0 = Date.now();
  group.terminate();
  group.terminate(); // once under way, again does nothing
  await group.waitGone();
  t.ok(Date.now() - t0 >= 150, 'waited for the grace');
  t.ok(pids.every((pid) => !pidAlive(pid)));
  t.same(log.lines, ['kpng-callout debug: callout group still running after SIGTERM: SIGKILL it run=9']);
});

t.test('kill: SIGKILL at once, even with SIGTERM ignored', async (t) => {
  const { pids, group } = await leader(`trap '' TERM; sleep 1000 & echo $$ $!; wait; wait`);
  const t0 = Date.now();
  group.kill();
  await group.waitGone();
  t.ok(Date.now() - t0 < 2000);
  t.ok(pids.every((pid) => !pidAlive(pid)));
});

t.test('clear: what the leader left behind is terminated', async (t) => {
  const { pids, group, exited } = await leader(`sleep 1000 >/dev/null 2>&1 & echo $$ $!`);
  await exited;
  const [, bg] = pids;
  t.same(group.members(), [bg], 'the background process is left');
  await group.clear();
  t.ok(!pidAlive(bg!));
});

t.test('a background job in a group of its own is reached through the session', { skip: existsSync('/bin/bash') ? false : 'no bash' }, async (t) => {
  const { pids, group } = await leader(`set -m; sleep 1000 >/dev/null 2>&1 & echo $$ $!; sleep 1000`, '/bin/bash');
  const [, bg] = pids;
  t.ok(group.members().includes(bg!), 'listed');
  group.terminate();
  await group.waitGone();
  t.ok(pids.every((pid) => !pidAlive(pid)));
});

t.test('the exit hook lives from construction to release', async (t) => {
  const before = process.listenerCount('exit');
  const log = captureLog();
  const group = new ProcessGroup(999_999_999, { killGraceMs: 0, logger: log.logger, name: 'x', fields: {} });
  t.equal(process.listenerCount('exit'), before + 1);
  group.release();
  t.equal(process.listenerCount('exit'), before);
  t.same(group.members(), [], 'a group that never existed has no members');
  group.kill();
  t.same(log.lines, [], 'signalling a gone group is quiet');
});

t.test('members: the same whether only pids from the leader on are read (a young group) or all of them (an old one)', async (t) => {
  const child = spawn('/bin/sh', ['-c', 'sleep 1000 & echo $$ $!; wait'], { detached: true, stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const line = await within(new Promise<string>((resolve) => createInterface({ input: child.stdout! }).once('line', resolve)), 'the pids line');
  const pids = line.trim().split(/\s+/).map((p) => scripts.track(Number(p))).sort((a, b) => a - b);
  let clock = 0;
  const log = captureLog();
  const group = new ProcessGroup(child.pid!, { killGraceMs: 200, logger: log.logger, name: 'callout run 9', fields: { run: 9 }, now: () => clock });
  t.teardown(() => group.release());
  t.same(group.members(), pids, 'young: read from the leader pid on');
  clock = 60_000; // pids might have wrapped since: every process is read
  t.same(group.members(), pids, 'old: every pid read');
  group.kill();
  await exited;
  await group.waitGone();
  t.same(group.members(), []);
});


t.test('members: processes, not their threads (a thread id reads like a pid in /proc)', async (t) => {
  const { pids, group, exited } = await leader(`${JSON.stringify(process.execPath)} -e 'setInterval(() => {}, 1e6)' & echo $$ $!; wait`);
  const node = pids[1]!;
  // Node starts its threads (V8 platform, libuv) at once; wait until they are there.
  await within(
    (async () => {
      while (readdirSync(`/proc/${node}/task`).length < 3) await sleep(20);
    })(),
    'the threads of the background node',
  );
  t.same(group.members(), [...pids].sort((a, b) => a - b), 'the leader and node, none of its threads');
  group.kill();
  await exited;
  await group.waitGone();
});

t.test('no orphans left by any test', async (t) => {
  for (const pid of scripts.all()) t.ok(!pidAlive(pid), `pid ${pid} gone`);
});
