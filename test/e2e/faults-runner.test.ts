/**
 * Fault suite, runner and replay side, with the built bins and real callout
 * scripts: a hung callout with a grandchild at --timeout, SIGTERM in the
 * middle of a run that would not end, and a fixture deleted and recreated
 * under `replay --watch` (watched through --metrics-addr as runs happen and
 * fail). Waits on log lines and metrics, never on fixed sleeps.
 */
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { runBin } from '../helpers/bin-process.js';
import { replaceFile, shScript, tempDir } from '../helpers/files.js';
import { stateLine } from '../helpers/fixtures.js';
import { serve, type Revision } from '../helpers/kpng-server.js';
import { check, metricsBase, scrapeUntil } from '../helpers/metrics-http.js';
import { groupMembers, procStat, waitGone, zombieChildren } from '../helpers/procs.js';
import { pollUntil } from '../helpers/wait.js';

const dir = tempDir(t, 'kpng-e2e-faults-runner-');

const script = (name: string, body: string): string => shScript(dir, name, body);

const oneService: Revision = [{ op: 'set', set: 'services', path: 'default/a', value: { Namespace: 'default', Name: 'a', Type: 'ClusterIP' } }];

t.test('a hung callout with a grandchild: both killed at --timeout, no zombie left, then retried', async (t) => {
  const server = await serve(t, [oneService]);
  const hung = script('hung', `cat >/dev/null; sleep 300 & echo "pid $$ child $!" >&2; wait\n`);
  // --timeout runs from the spawn: long enough for the script to start its grandchild and say so, and for
  // the test to look at the group before it is killed, on a loaded machine.
  const p = runBin(t, 'kpng-callout', ['--api', server.address, '--node-name', 'n', '--callout', hung, '--debounce', '0', '--timeout', '3s', '--retry-min', '10s', '--metrics-addr', '127.0.0.1:0']);
  const base = await metricsBase(p);
  const m = /pid (\d+) child (\d+)/.exec(await p.line('stderr', /pid \d+ child \d+/))!;
  const [pid, child] = [Number(m[1]), Number(m[2])];
  t.equal(procStat(child)?.pgrp, pid, 'the grandchild is in the callout group');
  await p.line('stderr', /callout run 1 timed out after 3000ms; its process group was killed/);
  await pollUntil(() => groupMembers(pid).length === 0, 'the group to be gone');
  t.equal(procStat(pid), undefined, 'the callout was reaped (no zombie)');
  t.not(procStat(child)?.state, 'S', 'the grandchild is not running');
  t.same(zombieChildren(p.proc.pid!), [], 'kpng-callout leaves no zombie child');
  const after = await scrapeUntil(base, (x) => x.get('kpng_callout_runs_total{result="timeout"}') === 1, 'the timeout');
  t.ok(after.get('kpng_callout_run_duration_seconds_sum')! >= 3);
  t.equal(after.get('kpng_callout_retries_total'), 1);
  t.match(await check(base, '/healthz'), { status: 200, body: /retrying after run 1 timeout/ });
  p.proc.kill('SIGTERM');
  t.equal(await p.exited(), 0);
});

t.test('SIGTERM in the middle of a run that will not end: grace, then the group is terminated; exit 0, nothing left', async (t) => {
  const server = await serve(t, [oneService]);
  const hung = script('hung-term', `cat >/dev/null; sleep 300 & echo "pid $$ child $!" >&2; wait\n`);
  const p = runBin(t, 'kpng-callout', ['--api', server.address, '--node-name', 'n', '--callout', hung, '--debounce', '0', '-v']);
  const m = /pid (\d+) child (\d+)/.exec(await p.line('stderr', /pid \d+ child \d+/))!;
  const [pid, child] = [Number(m[1]), Number(m[2])];
  const sent = Date.now();
  p.proc.kill('SIGTERM');
  await p.line('stderr', /SIGTERM: stopping/);
  await p.line('stderr', /stopping: terminating the running callout/);
  t.equal(await p.exited('exit after SIGTERM'), 0);
  t.ok(Date.now() - sent >= 4500, 'the run had its grace period');
  t.equal(procStat(pid), undefined, 'the callout was reaped');
  await waitGone(child);
  t.same(groupMembers(pid), [], 'nothing of the group runs');
  t.match(p.stderr.join('\n'), /callout run 1 stopped/);
});

t.test('replay --watch: a fixture deleted and recreated; runs and failures in /metrics, /healthz, /readyz', async (t) => {
  const fixture = join(dir, 'state.jsonl');
  const first = stateLine('a') + stateLine('b');
  const poisoned = stateLine('a') + stateLine('poison');
  const fixed = stateLine('a') + stateLine('c');
  writeFileSync(fixture, first);
  const inputs = join(dir, 'replay.inputs');
  const callout = script('replay-callout', `cat > '${inputs}'.$KPNG_CALLOUT_RUN; if grep -q poison '${inputs}'.$KPNG_CALLOUT_RUN; then echo "refusing" >&2; exit 2; fi; echo "ran $KPNG_CALLOUT_RUN"\n`);
  // The retry after a failure is due only after the test (a newer state supersedes it).
  const p = runBin(t, 'kpng-callout', ['replay', '--watch', fixture, '--callout', callout, '--debounce', '20ms', '--retry-min', '1m', '--retry-max', '1m', '--metrics-addr', '127.0.0.1:0', '-v']);
  const base = await metricsBase(p);
  await p.line('stdout', /^ran 1$/);
  await p.line('stderr', /watching /);
  let m = await scrapeUntil(base, (x) => x.get('kpng_callout_runs_total{result="ok"}') === 1, 'run 1');
  t.equal(m.get('kpng_callout_services'), 2);
  t.equal(m.get('kpng_callout_source_synced'), 1);
  t.match(await check(base, '/healthz'), { status: 200, body: /ok: run 1 succeeded/ });
  t.equal((await check(base, '/readyz')).status, 200);

  // A state the callout refuses: failed, a retry scheduled (healthy while it is), still ready.
  writeFileSync(fixture, poisoned);
  await p.line('stderr', /callout run 2 failed: exit status 2/);
  m = await scrapeUntil(base, (x) => x.get('kpng_callout_runs_total{result="failed"}') === 1, 'run 2 failed');
  t.equal(m.get('kpng_callout_last_run_success'), 0);
  t.match(await check(base, '/healthz'), { status: 200, body: /retrying after run 2 failed \(callout run 2 failed: exit status 2\)/ });
  t.equal((await check(base, '/readyz')).status, 200, 'ready stays once a run succeeded');

  // Deleted: logged, no run; recreated identical: no run; changed: a run.
  rmSync(fixture);
  await p.line('stderr', /state\.jsonl: gone; keeping its last good state until it comes back/);
  replaceFile(fixture, poisoned);
  await p.line('stderr', /state\.jsonl: same state/);
  writeFileSync(fixture, fixed);
  await p.line('stdout', /^ran 3$/);
  m = await scrapeUntil(base, (x) => x.get('kpng_callout_runs_total{result="ok"}') === 2, 'run 3');
  t.equal(m.get('kpng_callout_runs_total{result="failed"}'), 1);
  t.equal(m.get('kpng_callout_consecutive_failures'), 0);
  t.match(await check(base, '/healthz'), { status: 200, body: /ok: run 3 succeeded/ });
  p.proc.kill('SIGTERM');
  t.equal(await p.exited(), 0);
  t.equal(readFileSync(`${inputs}.3`, 'utf8'), fixed, 'the recreated fixture was run');
  t.equal(p.stdout.filter((l) => l.startsWith('ran ')).length, 2, 'no run for the deletion or the identical recreation');
});

t.test('replay --watch: a failed run is retried with the backoff, in full, until it succeeds', async (t) => {
  const fixture = join(dir, 'retry.jsonl');
  writeFileSync(fixture, stateLine('a') + stateLine('b'));
  const flag = join(dir, 'retry.fail');
  writeFileSync(flag, '');
  const inputs = join(dir, 'retry.inputs');
  // Fails while the flag file exists; the third run removes it first.
  const callout = script('retry-callout', `cat > '${inputs}'.$KPNG_CALLOUT_RUN; [ "$KPNG_CALLOUT_RUN" -ge 3 ] && rm -f '${flag}'; if [ -f '${flag}' ]; then exit 5; fi; echo "ran $KPNG_CALLOUT_RUN $KPNG_CALLOUT_INPUT"\n`);
  const p = runBin(t, 'kpng-callout', ['replay', '--watch', '--changes', fixture, '--callout', callout, '--debounce', '20ms', '--retry-min', '50ms', '--retry-max', '100ms']);
  await p.line('stdout', /^ran 3 full$/);
  t.match(p.stderr.join('\n'), /callout run 1 failed: exit status 5[\s\S]*retrying the callout in[\s\S]*callout run 2 failed: exit status 5/);
  t.equal(readFileSync(`${inputs}.3`, 'utf8'), stateLine('a') + stateLine('b'), 'the whole state');
  p.proc.kill('SIGTERM');
  t.equal(await p.exited(), 0);
});
