/**
 * A process per run, with real child processes (small sh scripts in tmp
 * dirs): stdin and stdout byte for byte, stderr lines and tail (text and
 * JSON), environment, spawn errors, signal death, broken output streams.
 * Timeouts, terminate/kill and leftover processes: callout-process-group.test.ts.
 * Waits on output and results, never on fixed sleeps.
 */
import t from 'tap';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { shScript, tempDir } from '../helpers/files.js';
import { pidAlive } from '../helpers/procs.js';
import { BrokenPipe, makeCallout, Scripts, Sink, st } from './harness.js';

const scripts = new Scripts(t);
const dir = tempDir(t, 'callout-process-test-');

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

t.test('no orphans left by any test', async (t) => {
  for (const pid of scripts.all()) t.ok(!pidAlive(pid), `pid ${pid} gone`);
  t.notOk(existsSync(join(dir, 'nope')));
});
