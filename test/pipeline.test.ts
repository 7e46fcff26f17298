/**
 * The pipeline in-process: a hand-written source (a plain object the test
 * drives) into the printer (kpng-json, to a collecting stdout) or the runner
 * (kpng-callout, with real tiny callouts); the exit status it resolves with,
 * --once-timeout, a stdout whose reader went away, signals emitted on the
 * process stand-in, -vv, the metrics server around it. The bins as processes
 * are test/e2e/'s.
 */
import t from 'tap';
import { CalloutError } from '../src/errors.js';
import type { Service } from '../src/model.js';
import { parseHostPort } from '../src/options.js';
import { exitStatus, runPipeline, type CommonOptions, type PipelineMode, type RunnerFlags, type Tool } from '../src/pipeline.js';
import type { RunResult } from '../src/runner/callout.js';
import type { Source, StateSink } from '../src/source.js';
import { stateFromItems, stateText, type State } from '../src/state.js';
import { collector, commonOptions, fakeIO, type Collector, type FakeIO } from './helpers/cli-io.js';
import { shScript, tempDir } from './helpers/files.js';
import { heldPort } from './helpers/ports.js';
import { waitGone } from './helpers/procs.js';
import { captureLog, type CapturedLog } from './helpers/sink.js';
import { within } from './helpers/wait.js';

const dir = tempDir(t, 'pipeline-');

/** A state of one Service `default/<name>` without endpoints. */
const state = (name: string): State => {
  const s: Service = { Namespace: 'default', Name: name, Type: 'ClusterIP' };
  return stateFromItems([{ Service: s, Endpoints: [] }]);
};

/** A source the test drives: it pushes through `sink` once `started` resolves; `run` ends on abort or `end()`. */
interface ManualSource extends Source {
  readonly started: Promise<{ sink: StateSink; signal: AbortSignal }>;
  /** Ends `run`: resolves it, or rejects it with `err`. */
  end(err?: unknown): void;
}

function manualSource(): ManualSource {
  let begin: (v: { sink: StateSink; signal: AbortSignal }) => void = () => {};
  let finish: (err?: unknown) => void = () => {};
  const started = new Promise<{ sink: StateSink; signal: AbortSignal }>((r) => (begin = r));
  return {
    started,
    end: (err) => finish(err),
    run: (sink, signal) =>
      new Promise<void>((resolve, reject) => {
        finish = (err) => (err === undefined ? resolve() : reject(err));
        signal.addEventListener('abort', () => resolve(), { once: true });
        begin({ sink, signal });
      }),
  };
}

/** A source that pushes `states` in order, awaiting each push as replay does, then ends. */
function listSource(states: State[]): Source {
  return {
    async run(sink) {
      for (const s of states) await sink.push(s);
    },
  };
}

/** Runner options for `callout`: no debounce, short retries. */
const runnerFlags = (callout: string, extra: Partial<RunnerFlags> = {}): RunnerFlags => ({
  callout,
  debounceMs: 0,
  maxWaitMs: 0,
  timeoutMs: 30_000,
  resyncPeriodMs: 0,
  retryMinMs: 1000,
  retryMaxMs: 1000,
  persistent: false,
  ...extra,
});

interface Started {
  status: Promise<number>;
  io: FakeIO;
  log: CapturedLog;
}

/** Starts `runPipeline` for `tool` over `source` (sourceName `test`, version `9.9.9`) with a captured debug log. */
function start(
  tool: Tool,
  source: Source,
  o: { common?: Partial<CommonOptions>; runner?: RunnerFlags; mode?: PipelineMode; stdout?: Collector } = {},
): Started {
  const io = fakeIO({ tool, stdout: o.stdout });
  const log = captureLog();
  const common = commonOptions({ logger: log.logger, ...o.common });
  const status = runPipeline({ tool, sourceName: 'test', source, common, runner: o.runner, mode: o.mode ?? 'live', version: '9.9.9' }, io.io);
  // Surfaced where the test awaits it, not as an unhandled rejection.
  status.catch(() => {});
  return { status, io, log };
}

t.test('exitStatus: a run result as a shell would report it', async (t) => {
  const r = (x: Partial<RunResult>): RunResult => ({ run: 1, result: 'ok', durationMs: 1, ...x });
  t.equal(exitStatus(r({ result: 'ok' })), 0);
  t.equal(exitStatus(r({ result: 'skipped', run: 0 })), 0);
  t.equal(exitStatus(r({ result: 'failed', exitCode: 3 })), 3);
  t.equal(exitStatus(r({ result: 'failed' })), 1, 'a failure without a status: 1');
  t.equal(exitStatus(r({ result: 'timeout', signal: 'SIGTERM' })), 124);
  t.equal(exitStatus(r({ result: 'timeout', exitCode: 143 })), 124, 'a callout that exits on our SIGTERM: still a timeout (as timeout(1))');
  t.equal(exitStatus(r({ result: 'signal', signal: 'SIGKILL' })), 137);
  t.equal(exitStatus(r({ result: 'signal', signal: 'SIGSEGV' })), 139);
  t.equal(exitStatus(r({ result: 'spawn-error', errorCode: 'ENOENT' })), 127);
  t.equal(exitStatus(r({ result: 'spawn-error', errorCode: 'EACCES' })), 126);
});

t.test('kpng-json prints every state in order on our stdout; the startup line names the source', async (t) => {
  const p = start('kpng-json', listSource([state('a'), state('b')]));
  t.equal(await within(p.status, 'the pipeline to end'), 0);
  t.equal(p.io.stdout.text(), stateText(state('a')) + stateText(state('b')));
  t.match(p.log.lines[0], /^kpng-callout info: kpng-json 9\.9\.9 starting source=test node=node-a nodejs=v\d/);
  t.notMatch(p.log.lines[0], /callout=/, 'kpng-json has no callout');
  t.equal(p.io.proc.listenerCount('SIGTERM'), 0, 'its signal handlers are gone');
});

t.test('-vv logs every state received, -v does not', async (t) => {
  const vv = start('kpng-json', listSource([state('a')]), { common: { verbosity: 2 } });
  t.equal(await within(vv.status, 'the pipeline to end'), 0);
  const s = state('a');
  t.same(vv.log.matching(/state received/), [`kpng-callout debug: state received services=1 endpoints=0 bytes=${s.bytes}`]);
  const v = start('kpng-json', listSource([state('a')]), { common: { verbosity: 1 } });
  t.equal(await within(v.status, 'the pipeline to end'), 0);
  t.same(v.log.matching(/state received/), []);
});

t.test('kpng-callout, sequential (replay): each state runs once, in order; the first failing run gives the status', async (t) => {
  const ok = start('kpng-callout', listSource([state('a'), state('b')]), { runner: runnerFlags('/bin/cat'), mode: 'sequential' });
  t.equal(await within(ok.status, 'the pipeline to end'), 0);
  t.equal(ok.io.stdout.text(), stateText(state('a')) + stateText(state('b')), "the callout's stdout is ours");
  t.match(ok.log.lines[0], /kpng-callout 9\.9\.9 starting source=test node=node-a callout=\/bin\/cat/);

  const fails = shScript(dir, 'fails.sh', 'cat >/dev/null; echo "ran $KPNG_CALLOUT_RUN"; exit $((KPNG_CALLOUT_RUN + 2))\n');
  const bad = start('kpng-callout', listSource([state('a'), state('b')]), { runner: runnerFlags(fails), mode: 'sequential' });
  t.equal(await within(bad.status, 'the pipeline to end'), 3, "run 1's status (3), not run 2's (4)");
  t.equal(bad.io.stdout.text(), 'ran 1\nran 2\n', 'every state still ran');
});

t.test('kpng-callout --once on a live source: the first state runs now, its status is ours', async (t) => {
  const fails = shScript(dir, 'exit5.sh', 'cat >/dev/null; exit 5\n');
  const src = manualSource();
  const p = start('kpng-callout', src, { runner: runnerFlags(fails, { debounceMs: 60_000, maxWaitMs: 60_000 }), common: { once: true } });
  const { sink } = await src.started;
  // A live source does not await the run: the pipeline must.
  void sink.push(state('a'));
  src.end();
  t.equal(await within(p.status, 'the pipeline to end'), 5, 'run at once despite a 1m debounce, its status 5');
});

t.test('kpng-callout on a live source: debounced runs, and the pending one finishes before the pipeline ends', async (t) => {
  const src = manualSource();
  const p = start('kpng-callout', src, { runner: runnerFlags('/bin/cat', { debounceMs: 50, maxWaitMs: 1000 }) });
  const { sink } = await src.started;
  void sink.push(state('a'));
  void sink.push(state('b'));
  src.end();
  t.equal(await within(p.status, 'the pipeline to end'), 0);
  t.equal(p.io.stdout.text(), stateText(state('b')), 'one run, with the newest state');
});

t.test('a source error is the pipeline\'s; after a failed run, that run\'s status wins and the error is logged', async (t) => {
  const src = manualSource();
  const p = start('kpng-json', src);
  void (await src.started).sink.push(state('a'));
  src.end(new CalloutError('input', 'fixture.jsonl:1:1: bad'));
  await t.rejects(within(p.status, 'the pipeline to end'), { name: 'CalloutError', code: 'input', message: 'fixture.jsonl:1:1: bad' });

  const fails = shScript(dir, 'exit3.sh', 'cat >/dev/null; exit 3\n');
  const src2 = manualSource();
  const p2 = start('kpng-callout', src2, { runner: runnerFlags(fails), mode: 'sequential' });
  await (await src2.started).sink.push(state('a'));
  src2.end(new CalloutError('input', 'second.jsonl:1:1: bad'));
  t.equal(await within(p2.status, 'the pipeline to end'), 3);
  t.same(p2.log.matching(/ error: /), ['kpng-callout error: second.jsonl:1:1: bad']);

  const src3 = manualSource();
  const p3 = start('kpng-json', src3);
  await src3.started;
  src3.end(new TypeError('a bug'));
  await t.rejects(within(p3.status, 'the pipeline to end'), TypeError, 'any other error is passed on as is');
});

t.test('--once-timeout: a source that never delivers ends the wait with a source error', async (t) => {
  const src = manualSource();
  const p = start('kpng-json', src, { common: { once: true, onceTimeoutMs: 50 } });
  await t.rejects(within(p.status, 'the --once-timeout'), { name: 'CalloutError', code: 'source', message: '--once-timeout: no complete state from the test source within 50ms' });
  t.ok((await src.started).signal.aborted, 'the source was stopped');
});

t.test('a stdout whose reader went away (EPIPE) stops the pipeline quietly, status 0', async (t) => {
  const src = manualSource();
  const p = start('kpng-json', src, { stdout: collector('EPIPE') });
  const { sink, signal } = await src.started;
  void sink.push(state('a'));
  t.equal(await within(p.status, 'the pipeline to stop'), 0);
  t.ok(signal.aborted, 'the source was stopped');
  t.same(p.log.matching(/ (warn|error): /), [], 'nothing to warn about');
  t.same(p.log.matching(/stdout closed by its reader: stopping/).length, 1);

  // Another write error (output lost) is an error: said, stopped the same way, exit 1.
  const src2 = manualSource();
  const p2 = start('kpng-json', src2, { stdout: collector('EIO') });
  void (await src2.started).sink.push(state('a'));
  t.equal(await within(p2.status, 'the pipeline to stop'), 1);
  t.same(p2.log.matching(/ error: /), ['kpng-callout error: stdout: write EIO; stopping']);

  // kpng-callout: the callout writing to it is stopped too.
  const src3 = manualSource();
  const p3 = start('kpng-callout', src3, { stdout: collector('EPIPE'), runner: runnerFlags('/bin/cat') });
  void (await src3.started).sink.push(state('a'));
  t.equal(await within(p3.status, 'the pipeline to stop'), 0);
  t.same(p3.log.matching(/ info: stdout closed by its reader: stopping/).length, 1, 'a daemon says why it stops');

  // A socket as stdout (inetd, socat, systemd's StandardOutput=socket): a reader that closed resets it.
  const src4 = manualSource();
  const p4 = start('kpng-json', src4, { stdout: collector('ECONNRESET') });
  void (await src4.started).sink.push(state('a'));
  t.equal(await within(p4.status, 'the pipeline to stop'), 0);
  t.same(p4.log.matching(/ (warn|error): /), [], 'ECONNRESET is a reader that went away too');
});

t.test('kpng-json, a reader slower than a live source or replay --watch: the states meanwhile coalesce into the newest, nothing queues', async (t) => {
  // One state is more than the stream's buffer (16 KiB): the write needs a drain.
  const big = (name: string): State => stateFromItems(Array.from({ length: 300 }, (_, i) => ({ Service: { Namespace: name, Name: `s${i}`, Type: 'ClusterIP' }, Endpoints: [] })));
  const states = ['a', 'b', 'c', 'd'].map(big);
  // A live source pushes without waiting; replay --watch awaits each push before the next.
  for (const [what, mode, awaited] of [['live', undefined, false], ['watch', 'watch', true]] as const) {
    // A pipe whose reader is stalled: every write waits until released.
    const held: Array<() => void> = [];
    const stdout = collector();
    const write = stdout._write.bind(stdout);
    stdout._write = (chunk, enc, cb) => void held.push(() => write(chunk, enc, cb));
    const src = manualSource();
    const p = start('kpng-json', src, { stdout, ...(mode ? { mode } : {}) });
    const { sink } = await src.started;
    for (const s of states) {
      if (awaited) await sink.push(s);
      else void sink.push(s);
    }
    t.ok(stdout.writableLength <= states[0]!.bytes, `${what}: only the first state is buffered (${stdout.writableLength} bytes)`);
    while (held.length > 0) {
      held.shift()!();
      await new Promise((r) => setImmediate(r));
    }
    t.equal(stdout.text(), stateText(states[0]!) + stateText(states[3]!), `${what}: the first state, then the newest`);
    p.io.proc.emit('SIGTERM', 'SIGTERM');
    t.equal(await within(p.status, 'the pipeline to stop'), 0);
  }
});

t.test('SIGINT, SIGTERM and SIGHUP on the process stop the pipeline with status 0', async (t) => {
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    const src = manualSource();
    const p = start('kpng-json', src);
    const { signal } = await src.started;
    p.io.proc.emit(sig, sig);
    t.equal(await within(p.status, `${sig} to stop the pipeline`), 0, sig);
    t.ok(signal.aborted, `${sig}: the source was stopped`);
    t.same(p.log.matching(/stopping/), [`kpng-callout info: ${sig}: stopping`]);
    t.equal(p.io.proc.listenerCount(sig), 0, `${sig}: our handler is gone`);
  }
});

t.test('a second SIGINT kills the running callout at once: status 130', async (t) => {
  const slow = shScript(dir, 'slow.sh', 'echo "started $$"\nexec sleep 30\n');
  const src = manualSource();
  const p = start('kpng-callout', src, { runner: runnerFlags(slow) });
  void (await src.started).sink.push(state('a'));
  const out = await p.io.stdout.waitFor(/started \d+\n/);
  const pid = Number(/started (\d+)/.exec(out)![1]);
  p.io.proc.emit('SIGINT', 'SIGINT');
  // The first one waits for the run (up to the kill grace); the second does not.
  await p.log.waitFor(/SIGINT: stopping/);
  p.io.proc.emit('SIGINT', 'SIGINT');
  t.equal(await within(p.status, 'the second SIGINT to end the pipeline'), 130);
  t.equal(p.io.proc.exitCode, 130, 'set on the process too');
  t.same(p.log.matching(/second SIGINT/), ['kpng-callout warn: second SIGINT: killing the callout now']);
  await waitGone(pid);
  t.pass('the callout is gone');
});

t.test('--metrics-addr and --health-addr: served while the pipeline runs, fed by the source, closed after', async (t) => {
  const any = (flag: string) => parseHostPort(flag, '127.0.0.1:0', { allowPortZero: true });
  const src = manualSource();
  const p = start('kpng-json', src, { common: { metricsAddr: any('--metrics-addr'), healthAddr: any('--health-addr') } });
  const { sink } = await src.started;
  const urlOf = async (re: RegExp): Promise<string> => /(http:\/\/127\.0\.0\.1:\d+)/.exec(await p.log.waitFor(re))![1]!;
  const metricsUrl = await urlOf(/serving \/metrics, \/healthz and \/readyz on/);
  const healthUrl = await urlOf(/serving \/healthz and \/readyz on/);
  sink.status?.({ connected: true, synced: false, reconnects: 0 });
  t.equal((await fetch(`${healthUrl}/healthz`)).status, 503, 'not synced yet');
  sink.status?.({ connected: true, synced: true, reconnects: 0 });
  void sink.push(state('a'));
  t.equal((await fetch(`${healthUrl}/healthz`)).status, 200, 'the source status reaches the checks');
  t.match(await (await fetch(`${metricsUrl}/metrics`)).text(), /\n\S*services 1\n/, 'the state reaches the metrics');
  p.io.proc.emit('SIGTERM', 'SIGTERM');
  t.equal(await within(p.status, 'the pipeline to stop'), 0);
  await t.rejects(fetch(`${metricsUrl}/metrics`), 'the metrics server is closed');
  await t.rejects(fetch(`${healthUrl}/healthz`), 'the health server is closed');
});

t.test('a --health-addr in use: an io error before the source starts, the metrics server closed again', async (t) => {
  const port = await heldPort(t);
  const src = manualSource();
  const p = start('kpng-json', src, {
    common: { metricsAddr: parseHostPort('--metrics-addr', '127.0.0.1:0', { allowPortZero: true }), healthAddr: parseHostPort('--health-addr', `127.0.0.1:${port}`) },
  });
  await t.rejects(within(p.status, 'the pipeline to fail'), { name: 'CalloutError', code: 'io', message: new RegExp(`^--health-addr 127\\.0\\.0\\.1:${port}: cannot listen`) });
  const url = /(http:\/\/127\.0\.0\.1:\d+)/.exec(p.log.matching(/serving \/metrics/)[0] ?? '')?.[1];
  t.ok(url, 'the metrics server had started');
  await t.rejects(fetch(`${url}/metrics`), 'and is closed');
  t.equal(p.io.proc.listenerCount('SIGTERM'), 0, 'no signal handler left');
});
