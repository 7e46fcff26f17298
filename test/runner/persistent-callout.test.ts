/**
 * The persistent callout with real processes (sh scripts): frames on stdin,
 * acks on fd 3, one process across states, restarts with a full frame after a
 * failure, a crash, a timeout; nothing left behind.
 */
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import type { RunRequest } from '../../src/runner/callout.js';
import { PersistentCallout, type PersistentCalloutOptions } from '../../src/runner/persistent-callout.js';
import { Runner } from '../../src/runner/runner.js';
import { silentLogger } from '../../src/log.js';
import { pidAlive, waitGone } from '../helpers/procs.js';
import { pollUntil } from '../helpers/wait.js';
import { Scripts, Sink, st } from './harness.js';

/**
 * A frame reader: saves each frame (header, lines) to $DIR/frames, its pid
 * to $DIR/pid, then acks with the first word of $DIR/ack-N when present
 * (`crash` exits 3, `hang` never acks, `twice` acks ok twice, `late` acks ok
 * then `error late` 0.2 s later, `okerror` acks ok and `error stray` at once, `closefd3` acks ok and closes fd 3,
 * `closeexit` closes fd 3 and exits 3 a moment later, `okexit` acks ok and exits 0 (its
 * grandchild keeps its stderr), `eofexit` reads to EOF, then acks ok and exits, `closein` closes its stdin,
 * then acks ok and lives on (in that order: a frame written before the close sits in the pipe unread, and only
 * --timeout can tell); anything else is
 * written as it is), else `ok`.
 */
const reader = `echo $$ > "$DIR/pid"
sleep 1000 3>&- &
echo $! > "$DIR/gpid"
n=0
while IFS= read -r header; do
  n=$((n+1))
  printf '%s\\n' "$header" >> "$DIR/frames"
  while IFS= read -r line && [ -n "$line" ]; do printf '%s\\n' "$line" >> "$DIR/frames"; done
  echo "--" >> "$DIR/frames"
  echo "got frame $n" >&2
  a=ok
  [ -f "$DIR/ack-$n" ] && a=$(cat "$DIR/ack-$n")
  case "$a" in
    crash) exit 3 ;;
    hang) sleep 1000 ;;
    twice) echo ok >&3; echo ok >&3 ;;
    late) echo ok >&3; sleep 0.2; echo 'error late' >&3 ;;
    okerror) printf 'ok\nerror stray\n' >&3 ;;
    closefd3) echo ok >&3; exec 3>&- ;;
    closeexit) exec 3>&-; sleep 0.05; exit 3 ;;
    okexit) echo ok >&3; exit 0 ;;
    eofexit) cat > /dev/null; echo "eof seen" >&2; echo ok >&3; exit 0 ;;
    # The grandchild forked above holds our stdin until it has run far enough to swap it for /dev/null (a
    # loaded machine may not have run it yet): a frame written before then goes into the socket unread.
    closein) exec 0<&-; g=$(cat "$DIR/gpid"); until [ "$(readlink "/proc/$g/fd/0")" = /dev/null ]; do sleep 0.01; done; echo ok >&3; sleep 1000 ;;
    *) echo "$a" >&3 ;;
  esac
done
echo "eof after $n" >&2`;

function setup(t: Test, o: Partial<PersistentCalloutOptions> = {}) {
  const scripts = new Scripts(t);
  const s = scripts.script(reader);
  const stderr = new Sink();
  const callout = new PersistentCallout({ file: s.file, nodeName: 'node-a', stderr, stdout: new Sink(), killGraceMs: 500, timeoutMs: 5000, changes: true, ...o });
  let run = 0;
  const req = (state: ReturnType<typeof st>, previous?: ReturnType<typeof st>): RunRequest => ({ run: ++run, state, reason: 'change', previous });
  const frames = (): string => {
    try {
      return readFileSync(join(s.dir, 'frames'), 'utf8');
    } catch {
      return '';
    }
  };
  const pid = (): number => Number(readFileSync(join(s.dir, 'pid'), 'utf8'));
  const gpid = (): number => Number(readFileSync(join(s.dir, 'gpid'), 'utf8'));
  /** The callout's answer to its own n-th frame (it counts from 1 per process). */
  const setAck = (n: number, what: string): void => writeFileSync(join(s.dir, `ack-${n}`), what);
  t.teardown(() => callout.close('kill'));
  return { callout, req, frames, pid, gpid, setAck, stderr, dir: s.dir };
}


const A = st('{"Service":{"Namespace":"n","Name":"a"},"Endpoints":null}');
const AB = st('{"Service":{"Namespace":"n","Name":"a"},"Endpoints":null}', '{"Service":{"Namespace":"n","Name":"b"},"Endpoints":null}');
const B2 = st('{"Service":{"Namespace":"n","Name":"b"},"Endpoints":[]}');

t.test('one process for every state: a full frame first, then change sets; stdin EOF ends it', async (t) => {
  const c = setup(t);
  t.match(await c.callout.start(c.req(A)).done, { result: 'ok' });
  const pid = c.pid();
  t.match(await c.callout.start(c.req(AB, A)).done, { result: 'ok' });
  t.match(await c.callout.start(c.req(B2, AB)).done, { result: 'ok' });
  t.equal(c.pid(), pid, 'started once');
  t.equal(
    c.frames(),
    [
      '{"Frame":{"Seq":1,"Input":"full"}}',
      '{"Service":{"Namespace":"n","Name":"a"},"Endpoints":null}',
      '--',
      '{"Frame":{"Seq":2,"Input":"changes"}}',
      '{"Service":{"Namespace":"n","Name":"b"},"Endpoints":null}',
      '--',
      '{"Frame":{"Seq":3,"Input":"changes"}}',
      '{"Previous":{"Service":{"Namespace":"n","Name":"a"},"Endpoints":null}}',
      '{"Previous":{"Service":{"Namespace":"n","Name":"b"},"Endpoints":null}}',
      '{"Service":{"Namespace":"n","Name":"b"},"Endpoints":[]}',
      '--',
      '',
    ].join('\n'),
  );
  t.match(c.stderr.text(), /^\[frame 1\] got frame 1\n\[frame 2\] got frame 2\n/, 'stderr lines attributed to frames');
  await c.callout.close('graceful');
  t.match(c.stderr.text(), /eof after 3/);
  await waitGone(pid);
  await waitGone(c.gpid());
});

t.test('ack "error": a failed run, the process kept, the next frame full', async (t) => {
  const c = setup(t);
  await c.callout.start(c.req(A)).done;
  c.setAck(2, 'error the rules did not apply');
  t.match(await c.callout.start(c.req(AB, A)).done, { result: 'failed', message: /frame 2 \(run 2\) failed: the rules did not apply/ });
  // The scheduler gives no `previous` after a failure: full.
  t.match(await c.callout.start(c.req(B2)).done, { result: 'ok' });
  t.match(c.frames(), /\{"Frame":\{"Seq":3,"Input":"full"\}\}\n\{"Service":\{"Namespace":"n","Name":"b"\},"Endpoints":\[\]\}\n--/);
  c.setAck(4, 'bogus');
  t.match(await c.callout.start(c.req(A, B2)).done, { result: 'failed', message: /not an ack: "bogus"/ });
});

t.test('a crash fails the frame, ends the group (grandchild too); the next frame goes to a new process, full', async (t) => {
  const c = setup(t);
  await c.callout.start(c.req(A)).done;
  const [pid, gpid] = [c.pid(), c.gpid()];
  c.setAck(2, 'crash');
  t.match(await c.callout.start(c.req(AB, A)).done, { result: 'failed', exitCode: 3, message: /exited \(exit status 3\) before acknowledging frame 2/ });
  t.notOk(pidAlive(pid));
  t.notOk(pidAlive(gpid), 'its background process was killed');
  t.match(await c.callout.start(c.req(B2, A)).done, { result: 'ok' }, 'a previous state is ignored: a new process gets a full frame');
  t.not(c.pid(), pid);
  t.match(c.frames(), /\{"Frame":\{"Seq":3,"Input":"full"\}\}/);
});

t.test('no ack within the timeout: killed with its group, restarted with a full frame', async (t) => {
  // The timeout runs from the frame's first byte, written as the script starts: it must outlast the
  // script's start-up on a loaded machine, or the group is killed before the script saved $DIR/gpid.
  const c = setup(t, { timeoutMs: 2000 });
  c.setAck(1, 'hang');
  t.match(await c.callout.start(c.req(A)).done, { result: 'timeout', message: /not acknowledged within 2000ms/ });
  await waitGone(c.gpid());
  rmSync(join(c.dir, 'ack-1'));
  t.match(await c.callout.start(c.req(AB, A)).done, { result: 'ok' });
  t.match(c.frames(), /\{"Frame":\{"Seq":2,"Input":"full"\}\}/);
});

t.test('an extra ack is logged and ignored', async (t) => {
  const logs: string[] = [];
  const logger = { debug() {}, info() {}, warn: (m: string) => void logs.push(m), error: (m: string) => void logs.push(m) };
  const c = setup(t, { logger: logger as never });
  c.setAck(1, 'twice');
  t.match(await c.callout.start(c.req(A)).done, { result: 'ok' });
  await pollUntil(() => logs.some((l) => /no frame waiting/.test(l)), 'the extra ack logged');
  t.match(await c.callout.start(c.req(AB, A)).done, { result: 'ok' }, 'and the next frame has its own ack');
  t.match(c.frames(), /\{"Frame":\{"Seq":2,"Input":"full"\}\}/, 'in full: acks and frames may no longer pair up');
});

t.test('an "error" ack with no frame waiting: the newest state is wanted again (lost), in full', async (t) => {
  const c = setup(t);
  const lost: string[] = [];
  c.callout.lost((why) => lost.push(why));
  c.setAck(1, 'late');
  t.match(await c.callout.start(c.req(A)).done, { result: 'ok' });
  await pollUntil(() => lost.length > 0, 'lost told');
  t.match(lost[0], /acknowledged "error late" with no frame waiting/);
  t.match(await c.callout.start(c.req(AB, A)).done, { result: 'ok' });
  t.match(c.frames(), /\{"Frame":\{"Seq":2,"Input":"full"\}\}/);
});

t.test('fd 3 closed between frames: the callout is ended and lost is told; the next frame goes to a new process', async (t) => {
  const c = setup(t);
  const lost: string[] = [];
  c.callout.lost((why) => lost.push(why));
  c.setAck(1, 'closefd3');
  t.match(await c.callout.start(c.req(A)).done, { result: 'ok' });
  const pid = c.pid();
  await pollUntil(() => lost.length > 0, 'lost told');
  t.match(lost[0], /closed fd 3/);
  t.notOk(pidAlive(pid), 'ended');
  t.match(await c.callout.start(c.req(AB, A)).done, { result: 'ok' });
  t.not(c.pid(), pid);
  t.match(c.frames(), /\{"Frame":\{"Seq":2,"Input":"full"\}\}/);
});

t.test('stdin closed by a callout that lives on: the next frame fails at once (not at the timeout), then a new process', async (t) => {
  const c = setup(t, { timeoutMs: 20_000 });
  c.setAck(1, 'closein');
  t.match(await c.callout.start(c.req(A)).done, { result: 'ok' });
  const pid = c.pid();
  const t0 = Date.now();
  t.match(await c.callout.start(c.req(AB, A)).done, { result: 'failed', message: /persistent callout closed its stdin before acknowledging frame 2/ });
  t.ok(Date.now() - t0 < 5000, `at once (${Date.now() - t0} ms), not at the 20 s timeout`);
  await waitGone(pid);
  t.match(await c.callout.start(c.req(AB)).done, { result: 'ok' });
  t.not(c.pid(), pid, 'a new process');
  t.match(c.frames(), /\{"Frame":\{"Seq":3,"Input":"full"\}\}/);
});

t.test('fd 3 closed as the callout exits: its own exit status is the report', async (t) => {
  const c = setup(t);
  c.setAck(1, 'closeexit');
  t.match(await c.callout.start(c.req(A)).done, { result: 'failed', exitCode: 3, message: /exited \(exit status 3\) before acknowledging frame 1/ });
});

t.test('the runner: a callout that dies between frames is restarted with the newest state, in full', async (t) => {
  const scripts = new Scripts(t);
  const s = scripts.script(reader);
  const stderr = new Sink();
  const r = new Runner({ file: s.file, nodeName: 'n', persistent: true, changes: true, debounceMs: 0, retryMinMs: 50, retryMaxMs: 50, stderr, stdout: new Sink(), killGraceMs: 500 });
  t.teardown(() => r.kill());
  r.submit(A);
  await stderr.waitFor('got frame 1');
  r.submit(AB);
  await stderr.waitFor('got frame 2');
  await pollUntil(() => /Seq":2/.test(readFileSync(join(s.dir, 'frames'), 'utf8')), 'frame 2 saved');
  const pid = Number(readFileSync(join(s.dir, 'pid'), 'utf8'));
  process.kill(pid, 'SIGKILL');
  // The reader saves a frame line by line: wait for its end (--), then look at the whole of it.
  await pollUntil(() => /"Seq":3,"Input":"full"\}\}\n(?:.*\n)*?--\n/.test(readFileSync(join(s.dir, 'frames'), 'utf8')), 'frame 3, full, to a new process');
  t.match(readFileSync(join(s.dir, 'frames'), 'utf8'), /"Seq":3,"Input":"full"\}\}\n\{"Service":\{"Namespace":"n","Name":"a"\},"Endpoints":null\}\n\{"Service":\{"Namespace":"n","Name":"b"/);
  await r.stop();
});

t.test('the runner: "ok" and a stray "error" in one write: the state is sent again, in full', async (t) => {
  const scripts = new Scripts(t);
  const s = scripts.script(reader);
  writeFileSync(join(s.dir, 'ack-1'), 'okerror');
  const stderr = new Sink();
  const r = new Runner({ file: s.file, nodeName: 'n', persistent: true, changes: true, debounceMs: 0, retryMinMs: 50, retryMaxMs: 50, stderr, stdout: new Sink(), killGraceMs: 500 });
  t.teardown(() => r.kill());
  r.submit(A);
  await stderr.waitFor('got frame 2');
  await pollUntil(() => /"Seq":2,"Input":"full"/.test(readFileSync(join(s.dir, 'frames'), 'utf8')), 'frame 2, full');
  await r.stop();
});

t.test('a frame right after the callout exited (not yet cleared away) goes to a new process, not into the dead pipe', async (t) => {
  const warnings: string[] = [];
  const logger = { ...silentLogger, warn: (m: string) => void warnings.push(m) };
  // Its grandchild keeps its stderr open: clearing it away takes the pipe drain wait and the group's end.
  const c = setup(t, { timeoutMs: 20_000, logger });
  c.setAck(1, 'okexit');
  t.match(await c.callout.start(c.req(A)).done, { result: 'ok' });
  const pid = c.pid();
  await pollUntil(() => warnings.some((w) => /exited between frames/.test(w)), 'the exit noticed');
  t.notOk(pidAlive(pid));
  const started = Date.now();
  t.match(await c.callout.start(c.req(AB, A)).done, { result: 'ok' });
  t.ok(Date.now() - started < 10_000, `acknowledged by a new process in ${Date.now() - started} ms, not after the timeout`);
  t.not(c.pid(), pid);
  t.match(c.frames(), /\{"Frame":\{"Seq":2,"Input":"full"\}\}/);
});

t.test('the runner stops with a frame unacknowledged: stdin is closed at once, the callout answers and exits', async (t) => {
  const scripts = new Scripts(t);
  const s = scripts.script(reader);
  writeFileSync(join(s.dir, 'ack-1'), 'eofexit');
  const stderr = new Sink();
  const r = new Runner({ file: s.file, nodeName: 'n', persistent: true, debounceMs: 0, stderr, stdout: new Sink(), killGraceMs: 4000 });
  t.teardown(() => r.kill());
  r.submit(A);
  await stderr.waitFor('got frame 1');
  const started = Date.now();
  await r.stop();
  t.ok(Date.now() - started < 3000, `stopped in ${Date.now() - started} ms (grace 4000 ms)`);
  t.match(stderr.text(), /eof seen/);
});
