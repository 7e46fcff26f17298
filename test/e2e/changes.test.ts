/**
 * --changes and --persistent through the built bins: replay of successive
 * states as change sets (bytes exact), kpng-json --changes, a persistent
 * callout across states, --once --persistent exit codes, SIGTERM -> EOF ->
 * clean exit with nothing left behind.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { runBin } from '../helpers/bin-process.js';
import { recordingCallout, replaceFile, shScript, tempDir } from '../helpers/files.js';
import { pidAlive, waitGone } from '../helpers/procs.js';

const line = (ns: string, name: string, port: number): string =>
  `{"Service":{"Namespace":"${ns}","Name":"${name}","Type":"ClusterIP","IPs":{"ClusterIPs":{"V4":["10.96.0.1"]}},"Ports":[{"Protocol":1,"Port":${port},"TargetPort":${port}}],"SessionAffinity":null},"Endpoints":null}`;
const prev = (l: string): string => `{"Previous":${l}}`;

/** Three states as jsonl fixtures: a/x a/y b/z; then a/y modified, b/z removed, a/w added; then unchanged (no run with --changes). */
function fixtures(t: Test): { dir: string; files: string[]; s1: string[]; s2: string[] } {
  const dir = tempDir(t, 'kpng-e2e-changes-');
  const s1 = [line('a', 'x', 80), line('a', 'y', 80), line('b', 'z', 80)];
  const s2 = [line('a', 'w', 80), line('a', 'x', 80), line('a', 'y', 81)];
  const files = [s1, s2, s2].map((s, i) => {
    const f = join(dir, `s${i + 1}.jsonl`);
    writeFileSync(f, s.join('\n') + '\n');
    return f;
  });
  return { dir, files, s1, s2 };
}

t.test('kpng-callout replay --changes: the first run full, then change sets from the last applied state, bytes exact; an unchanged state makes no run', async (t) => {
  const { dir, files, s1, s2 } = fixtures(t);
  const rec = recordingCallout(dir, 'rec');
  const env = shScript(dir, 'env-rec', `echo "$KPNG_CALLOUT_INPUT" >> '${dir}/inputs'; exec '${rec.path}'\n`);
  const c = runBin(t, 'kpng-callout', ['replay', '--changes', '--callout', env, ...files]);
  t.equal(await c.exited(), 0);
  t.same(rec.runs(), [s1.join('\n') + '\n', [s2[0], prev(s1[1]!), s2[2], prev(s1[2]!)].join('\n') + '\n']);
  t.equal(readFileSync(join(dir, 'inputs'), 'utf8'), 'full\nchanges\n');
});

t.test('without --changes nothing differs: full states, no KPNG_CALLOUT_INPUT', async (t) => {
  const { dir, files, s1, s2 } = fixtures(t);
  const rec = recordingCallout(dir, 'rec');
  const env = shScript(dir, 'env-rec', `echo "[\${KPNG_CALLOUT_INPUT-unset}]" >> '${dir}/inputs'; exec '${rec.path}'\n`);
  const c = runBin(t, 'kpng-callout', ['replay', '--callout', env, ...files]);
  t.equal(await c.exited(), 0);
  t.same(rec.runs(), [s1, s2, s2].map((s) => s.join('\n') + '\n'));
  t.equal(readFileSync(join(dir, 'inputs'), 'utf8'), '[unset]\n[unset]\n[unset]\n');
});

t.test('a failed run: the next input is full', async (t) => {
  const { dir, files, s2 } = fixtures(t);
  const rec = recordingCallout(dir, 'rec');
  // Run 2 fails (after reading its input).
  const flaky = shScript(dir, 'flaky', `'${rec.path}' >/dev/null; [ "$KPNG_CALLOUT_RUN" = 2 ] && exit 4; exit 0\n`);
  const c = runBin(t, 'kpng-callout', ['replay', '--changes', '--callout', flaky, ...files]);
  t.equal(await c.exited(), 4, 'the first failure\'s status');
  t.equal(rec.run(3), s2.join('\n') + '\n', 'full after the failure');
});

t.test('kpng-json replay --changes prints the first state, then what changed (nothing when nothing did)', async (t) => {
  const { files, s1, s2 } = fixtures(t);
  const c = runBin(t, 'kpng-json', ['replay', '--changes', ...files]);
  t.equal(await c.exited(), 0);
  t.equal(c.bytes('stdout').toString(), [...s1, s2[0], prev(s1[1]!), s2[2], prev(s1[2]!)].join('\n') + '\n');
});

/** A persistent callout (sh): saves frames to $dir/frames, pid to $dir/pid, acks `ok` unless $dir/ack says otherwise. */
function persistentCallout(dir: string): string {
  return shScript(
    dir,
    'persist',
    `echo $$ > '${dir}/pid'
echo "mode=$KPNG_CALLOUT_MODE" >> '${dir}/frames'
while IFS= read -r h; do
  printf '%s\\n' "$h" >> '${dir}/frames'
  while IFS= read -r l && [ -n "$l" ]; do printf '%s\\n' "$l" >> '${dir}/frames'; done
  if [ -f '${dir}/ack' ]; then cat '${dir}/ack' >&3; else echo ok >&3; fi
  echo "acked $h" >&2
done
echo eof >> '${dir}/frames'
`,
  );
}

t.test('replay --persistent --changes: one process receives every state as a frame, in order (an unchanged one makes none), then EOF', async (t) => {
  const { dir, files, s1, s2 } = fixtures(t);
  const c = runBin(t, 'kpng-callout', ['replay', '--persistent', '--changes', '--callout', persistentCallout(dir), ...files]);
  t.equal(await c.exited(), 0);
  t.equal(
    readFileSync(join(dir, 'frames'), 'utf8'),
    [
      'mode=persistent',
      '{"Frame":{"Seq":1,"Input":"full"}}',
      ...s1,
      '{"Frame":{"Seq":2,"Input":"changes"}}',
      s2[0],
      prev(s1[1]!),
      s2[2],
      prev(s1[2]!),
      'eof',
      '',
    ].join('\n'),
  );
});

t.test('--once --persistent: exit 0 on ok, 1 on error', async (t) => {
  const { dir, files } = fixtures(t);
  const callout = persistentCallout(dir);
  t.equal(await runBin(t, 'kpng-callout', ['replay', '--once', '--persistent', '--callout', callout, files[0]!]).exited(), 0);
  writeFileSync(join(dir, 'ack'), 'error no luck\n');
  const c = runBin(t, 'kpng-callout', ['replay', '--once', '--persistent', '--callout', callout, files[0]!]);
  t.equal(await c.exited(), 1);
  t.match(c.stderr.join('\n'), /frame 1 \(run 1\) failed: no luck/);
  t.match(readFileSync(join(dir, 'frames'), 'utf8'), /eof\n$/, 'stdin closed, the callout exited');
});

t.test('replay --watch --persistent: SIGTERM closes the callout\'s stdin, it exits, we exit 0, nothing left', async (t) => {
  const { dir, files } = fixtures(t);
  const c = runBin(t, 'kpng-callout', ['replay', '--watch', '--persistent', '--changes', '--callout', persistentCallout(dir), files[0]!]);
  await c.line('stderr', /\[frame 1\] acked/);
  const pid = Number(readFileSync(join(dir, 'pid'), 'utf8'));
  replaceFile(files[0]!, readFileSync(files[1]!));
  await c.line('stderr', /\[frame 2\] acked \{"Frame":\{"Seq":2,"Input":"changes"\}\}/);
  c.proc.kill('SIGTERM');
  t.equal(await c.exited(), 0);
  await waitGone(pid);
  t.notOk(pidAlive(pid));
  t.match(readFileSync(join(dir, 'frames'), 'utf8'), /eof\n$/);
});

t.test('replay --watch --persistent: a new version of the callout replaces the old process, fed a full frame', async (t) => {
  const { dir, files } = fixtures(t);
  const callout = persistentCallout(dir);
  const c = runBin(t, 'kpng-callout', ['replay', '--watch', '--persistent', '--changes', '--callout', callout, files[0]!]);
  await c.line('stderr', /\[frame 1\] acked/);
  const pid = Number(readFileSync(join(dir, 'pid'), 'utf8'));
  // The same program with one more line: an editor's save (temp file, rename).
  replaceFile(callout, readFileSync(callout, 'utf8').replace('echo $$', 'echo v2 >&2\necho $$'), 0o755);
  await c.line('stderr', /\[frame 2\] acked \{"Frame":\{"Seq":2,"Input":"full"\}\}/);
  await waitGone(pid);
  t.not(Number(readFileSync(join(dir, 'pid'), 'utf8')), pid, 'a new process');
  t.match(c.stderr.join('\n'), /restarting the persistent callout/);
  c.proc.kill('SIGTERM');
  t.equal(await c.exited(), 0);
});

t.test('replay --watch --persistent: a frame never acknowledged is retried after the backoff, in full, by a new process (no edit needed)', async (t) => {
  const { dir, files, s1 } = fixtures(t);
  // The first process reads its frame and never acks; the next one acks.
  const callout = shScript(
    dir,
    'hang-once',
    `echo $$ >> '${dir}/pids'
while IFS= read -r h; do
  printf '%s\\n' "$h" >> '${dir}/frames'
  while IFS= read -r l && [ -n "$l" ]; do :; done
  if [ ! -f '${dir}/hung' ]; then : > '${dir}/hung'; sleep 1000; fi
  echo ok >&3
done
`,
  );
  // --timeout runs from the frame's first byte, written as the script starts: long enough for the first
  // process to read its frame and mark itself hung on a loaded machine (else the second one hangs too).
  const c = runBin(t, 'kpng-callout', ['replay', '--watch', '--persistent', '--changes', '--timeout', '3s', '--retry-min', '100ms', '--retry-max', '100ms', '--callout', callout, files[0]!]);
  await c.line('stderr', /not acknowledged within 3000ms/);
  await c.line('stderr', /retrying the callout in/);
  await c.line('stderr', /callout run finished/);
  t.equal(readFileSync(join(dir, 'frames'), 'utf8'), '{"Frame":{"Seq":1,"Input":"full"}}\n{"Frame":{"Seq":2,"Input":"full"}}\n');
  const pids = readFileSync(join(dir, 'pids'), 'utf8').trim().split('\n').map(Number);
  t.equal(pids.length, 2, 'a new process');
  t.notOk(pidAlive(pids[0]!), 'the hung one (and its sleep) ended');
  t.ok(s1.length > 0);
  c.proc.kill('SIGTERM');
  t.equal(await c.exited(), 0);
});

t.test('replay --watch --changes: a new version of a per-run callout is run with the whole state, not an empty change set', async (t) => {
  const { dir, files, s1 } = fixtures(t);
  const callout = shScript(dir, 'v', `cat > '${dir}/in'.$KPNG_CALLOUT_RUN; echo "ran $KPNG_CALLOUT_RUN $KPNG_CALLOUT_INPUT"\n`);
  const c = runBin(t, 'kpng-callout', ['replay', '--watch', '--changes', '--debounce', '20ms', '--callout', callout, files[0]!]);
  await c.line('stdout', /^ran 1 full$/);
  await c.line('stderr', /watching /);
  replaceFile(callout, readFileSync(callout, 'utf8').replace('echo "ran', 'echo "v2 ran'), 0o755);
  await c.line('stdout', /^v2 ran 2 full$/);
  t.equal(readFileSync(join(dir, 'in.2'), 'utf8'), s1.join('\n') + '\n');
  c.proc.kill('SIGTERM');
  t.equal(await c.exited(), 0);
});

t.test('replay --watch --changes: the callout and a fixture changed in one batch: the new callout gets the whole new state', async (t) => {
  const { dir, files, s2 } = fixtures(t);
  const callout = shScript(dir, 'v', `cat > '${dir}/in'.$KPNG_CALLOUT_RUN; echo "ran $KPNG_CALLOUT_RUN $KPNG_CALLOUT_INPUT"\n`);
  const c = runBin(t, 'kpng-callout', ['replay', '--watch', '--changes', '--debounce', '400ms', '--max-wait', '2s', '--callout', callout, files[0]!]);
  await c.line('stdout', /^ran 1 full$/);
  await c.line('stderr', /watching /);
  replaceFile(callout, readFileSync(callout, 'utf8').replace('echo "ran', 'echo "v2 ran'), 0o755);
  replaceFile(files[0]!, readFileSync(files[1]!));
  await c.line('stdout', /^v2 ran 2 full$/);
  t.equal(readFileSync(join(dir, 'in.2'), 'utf8'), s2.join('\n') + '\n');
  c.proc.kill('SIGTERM');
  t.equal(await c.exited(), 0);
});
