/**
 * The pipeline one command runs: source -> (printer | runner), with signals,
 * a broken stdout, `--once-timeout` and the metrics server around it.
 * Resolves with the exit status; never exits the process itself.
 */
import { DEFAULTS } from './defaults.js';
import { CalloutError, readerGone } from './errors.js';
import type { Logger } from './log.js';
import type { Metrics } from './metrics/metrics.js';
import type { MetricsServer } from './metrics/server.js';
import type { Address } from './options.js';
import type { RunResult } from './runner/callout.js';
import type { Runner } from './runner/runner.js';
import type { RunNowOptions } from './runner/scheduler.js';
import type { PushOptions, Source, StateSink } from './source.js';
import type { State } from './state.js';
import { inputFor, type Input } from './changes.js';
import { constants as osConstants } from 'node:os';
import { createIdleCompactor, heapGrowing } from './memory.js';
import { STOP_SIGNALS } from './signals.js';

/** Which program is running: the callout runner or the JSON printer. */
export type Tool = 'kpng-callout' | 'kpng-json';

/** Process-level dependencies, injectable for tests. */
export interface CliIO {
  argv: string[];
  env: NodeJS.ProcessEnv;
  stdout: NodeJS.WriteStream;
  stderr: NodeJS.WriteStream;
  /** The process, for signal handlers and its stdin. */
  proc: NodeJS.Process;
}

/** Options every command shares, validated. */
export interface CommonOptions {
  nodeName: string;
  once: boolean;
  /** `--once-timeout`: give up when no complete state came within this many ms (0 = wait for ever). */
  onceTimeoutMs: number;
  /** 0 normal, 1 debug (-v), 2 debug and every delivered state (-vv); -1 quiet. */
  verbosity: number;
  logFormat: 'text' | 'json';
  logger: Logger;
  /** `--metrics-addr`: serve /metrics, /healthz, /readyz there (src/metrics.ts). */
  metricsAddr?: Address | undefined;
  /** `--health-addr`: serve only /healthz and /readyz there. */
  healthAddr?: Address | undefined;
  /** `--changes`: change sets (changes.ts) instead of whole states after the first. */
  changes: boolean;
}

/** Runner options, validated (kpng-callout only). */
export interface RunnerFlags {
  callout: string;
  debounceMs: number;
  maxWaitMs: number;
  timeoutMs: number;
  resyncPeriodMs: number;
  retryMinMs: number;
  retryMaxMs: number;
  /** `--persistent`: one long-lived callout, a frame per state. */
  persistent: boolean;
}

/** How the pipeline treats pushed states. */
export type PipelineMode =
  /** Live source: debounced, coalesced runs; `--once` runs the first state. */
  | 'live'
  /** Replay without --watch: every state runs once, in order, awaited. */
  | 'sequential'
  /** Replay --watch: the same, and a failed run is retried with the backoff (the newest state, in full) until a newer state comes. */
  | 'watch';

/** Everything a command hands to the pipeline. */
export interface PipelineSpec {
  tool: Tool;
  /** What the source is, for the startup line (`kpng`, `kube`, `replay`). */
  sourceName: string;
  source: Source;
  common: CommonOptions;
  runner?: RunnerFlags | undefined;
  mode: PipelineMode;
  version: string;
}

/** Exit status for a run's result, as a shell would report it. */
export function exitStatus(r: RunResult): number {
  if (r.result === 'ok' || r.result === 'skipped') return 0;
  // A timeout first: the callout's own exit then is its answer to our SIGTERM, not its verdict.
  if (r.result === 'timeout') return 124;
  if (r.exitCode !== undefined && r.exitCode !== null && r.exitCode > 0) return r.exitCode;
  if (r.signal) return 128 + ((osConstants.signals as Record<string, number>)[r.signal] ?? 0);
  if (r.result === 'spawn-error') return r.errorCode === 'EACCES' ? 126 : 127;
  return 1;
}

/** Writes one state (or change set) to a stream without building one big buffer. */
function writeInput(out: NodeJS.WritableStream, input: Input): void {
  const s = out as NodeJS.WriteStream;
  s.cork?.();
  for (const chunk of input.chunks) out.write(chunk);
  s.uncork?.();
}

/** Runs source -> (printer | runner) until done; resolves with the exit status. */
export async function runPipeline(spec: PipelineSpec, io: CliIO): Promise<number> {
  const { tool, source, common, mode } = spec;
  const log = common.logger;
  const ac = new AbortController();
  let status = 0;
  let runner: Runner | undefined;
  let stopping = false;
  let stdoutClosed = false;
  let stdoutFailed = false;
  let delivered = false;
  let onceTimedOut = false;
  /** A second SIGINT: exit 130, whatever the killed run's status. */
  let interrupted = false;
  // Runs are serialized, so the newest one settles last: awaiting it awaits them all.
  let lastRun: Promise<void> = Promise.resolve();

  log.info(`${tool} ${spec.version} starting`, {
    source: spec.sourceName,
    node: common.nodeName,
    callout: spec.runner?.callout,
    nodejs: process.version,
  });

  // --metrics-addr / --health-addr (src/metrics.ts), loaded only when asked: prom-client costs startup time.
  let metrics: Metrics | undefined;
  const servers: MetricsServer[] = [];
  if (common.metricsAddr !== undefined || common.healthAddr !== undefined) {
    const [{ Metrics }, { serveMetrics }] = await Promise.all([import('./metrics/metrics.js'), import('./metrics/server.js')]);
    metrics = new Metrics({ runner: tool === 'kpng-callout' });
    try {
      if (common.metricsAddr !== undefined) servers.push(await serveMetrics(metrics, common.metricsAddr, log, { endpoints: 'all', flag: '--metrics-addr' }));
      if (common.healthAddr !== undefined) servers.push(await serveMetrics(metrics, common.healthAddr, log, { endpoints: 'health', flag: '--health-addr' }));
    } catch (err) {
      for (const s of servers) await s.close();
      // Our own --metrics-addr on the same port (`localhost:P` and `127.0.0.1:P`, `:P` and any address): say so,
      // not "another process".
      const { metricsAddr: m, healthAddr: h } = common;
      const code = ((err as Error).cause as NodeJS.ErrnoException | undefined)?.code;
      if (servers.length > 0 && code === 'EADDRINUSE' && m && h && 'port' in m && 'port' in h && m.port === h.port) {
        throw new CalloutError('io', `--health-addr ${h.text}: cannot listen: --metrics-addr ${m.text} holds that port already (it serves /healthz and /readyz too): drop one or pick another port`, { cause: err });
      }
      throw err;
    }
  }

  const onSignal = (sig: NodeJS.Signals): void => {
    if (stopping) {
      if (sig === 'SIGINT') {
        log.warn('second SIGINT: killing the callout now');
        interrupted = true;
        runner?.kill();
        io.proc.exitCode = 130;
        status = 130;
        ac.abort();
      }
      return;
    }
    stopping = true;
    log.info(`${sig}: stopping`);
    ac.abort();
    // The source may be waiting on the in-flight run (replay): stop the runner now, not after the source.
    void runner?.stop();
  };
  for (const s of STOP_SIGNALS) io.proc.on(s, onSignal);

  // Whoever reads our stdout went away (`| head`): stop quietly, as a filter does.
  const onStdoutError = (err: NodeJS.ErrnoException): void => {
    if (stdoutClosed) return;
    stdoutClosed = true;
    if (!readerGone(err)) {
      // Output was lost (a full disk, EIO): a failure, unlike a reader that left.
      log.error(`stdout: ${err.message}; stopping`);
      stdoutFailed = true;
    } else if (tool === 'kpng-callout') {
      // A daemon that stops is news (its callout is killed next): say why. A filter (kpng-json) stops quietly.
      log.info('stdout closed by its reader: stopping');
    } else log.debug('stdout closed by its reader: stopping');
    runner?.kill();
    ac.abort();
  };
  io.stdout.on('error', onStdoutError);

  // --once-timeout: a script must not wait for ever on an unreachable source.
  let onceTimer: NodeJS.Timeout | undefined;
  if (common.once && common.onceTimeoutMs > 0) {
    onceTimer = setTimeout(() => {
      if (delivered) return;
      onceTimedOut = true;
      ac.abort();
    }, common.onceTimeoutMs);
  }

  // Where each state goes: the printer, or the runner (now or debounced).
  // Collect the garbage of a burst of ingest while a callout runs, give the heap back once things are quiet (src/memory.ts).
  const compactor = createIdleCompactor({
    quietMs: DEFAULTS.idleGcQuietMs,
    minGrowth: DEFAULTS.idleGcMinGrowth,
    steadyHeap: () => heapGrowing(DEFAULTS.steadyHeapGrowingPercent),
  });
  let deliver: (state: State, options?: PushOptions) => void | Promise<void>;
  if (tool === 'kpng-json') {
    // --changes: each print is the change set from the last one (nothing when nothing changed).
    let printed: State | undefined;
    const print = (state: State): void => {
      if (stopping || stdoutClosed) return;
      writeInput(io.stdout, inputFor(state, common.changes ? printed : undefined));
      printed = state;
    };
    const needsDrain = (): boolean => (io.stdout as NodeJS.WriteStream).writableNeedDrain === true;
    // A live source is faster than a slow reader (a full pipe): the states that came meanwhile coalesce
    // into the newest, printed at 'drain' (the Go tool blocked on the write and asked for no diff, so the
    // server coalesced them); otherwise every state would queue in memory, without bound.
    let newest: State | undefined;
    let draining = false;
    const printLive = (state: State): void => {
      if (draining) {
        newest = state;
        return;
      }
      print(state);
      if (!needsDrain()) return;
      draining = true;
      io.stdout.once('drain', () => {
        draining = false;
        const next = newest;
        newest = undefined;
        if (next) printLive(next);
      });
    };
    // Replay: a stop signal that came while a fixture was read and parsed (synchronous work) is seen first.
    // replay --watch is a daemon's source too: a stalled reader gets the newest state, not a queue of them.
    deliver = mode === 'live' ? printLive : (state) => afterPendingSignals().then(() => (mode === 'watch' ? printLive : print)(state));
  } else {
    const r = spec.runner!;
    // Loaded only for kpng-callout: kpng-json has no runner, and start-up time counts (a first sync).
    const { Runner } = await import('./runner/runner.js');
    runner = new Runner({
      file: r.callout,
      debounceMs: r.debounceMs,
      maxWaitMs: r.maxWaitMs,
      timeoutMs: r.timeoutMs,
      resyncPeriodMs: r.resyncPeriodMs,
      retryMinMs: r.retryMinMs,
      retryMaxMs: r.retryMaxMs,
      changes: common.changes,
      persistent: r.persistent,
      nodeName: common.nodeName,
      env: io.env,
      stdout: io.stdout,
      stderr: io.stderr,
      stderrFormat: common.logFormat,
      logger: log,
      onEvent: (e) => {
        if (e.type === 'input-written') compactor.waiting();
        metrics?.onRunnerEvent(e);
      },
    });
    const rn = runner;
    if (mode !== 'live' || common.once) {
      let failed = false;
      // With --changes a state equal to the last applied one has an empty change set: no run. Under
      // --watch (a daemon) such a state is skipped too, as the kpng and kube sources skip it.
      const how: RunNowOptions = { skipIdentical: common.changes || mode === 'watch', retry: mode === 'watch' };
      deliver = (state, options) => {
        if (stopping || stdoutClosed) return;
        // Kept so the exit status is known even when the source does not await. A stop signal that came
        // during synchronous work (a big fixture parsed) is seen before the run starts.
        const p = afterPendingSignals().then(async () => {
          if (stopping || stdoutClosed) return;
          const res = await rn.runNow(state, options?.again ? { ...how, full: true } : how);
          if (!failed && exitStatus(res) !== 0) {
            failed = true;
            status = exitStatus(res);
          }
        });
        lastRun = p;
        return p;
      };
    } else {
      deliver = (state) => rn.submit(state);
    }
  }
  const mt = metrics;
  const sink: StateSink = {
    push: (state, options) => {
      delivered = true;
      compactor.poke();
      if (common.verbosity >= 2) log.debug('state received', { services: state.services, endpoints: state.endpoints, bytes: state.bytes, input: state.origin });
      mt?.onState(state);
      return deliver(state, options);
    },
    status: mt ? (st) => mt.onSourceStatus(st) : undefined,
    worked: () => compactor.burst(),
  };

  let failure: unknown;
  try {
    await source.run(sink, ac.signal);
  } catch (err) {
    failure = err;
  } finally {
    clearTimeout(onceTimer);
    compactor.stop();
    if (runner) {
      if (stopping || stdoutClosed) await runner.stop();
      else {
        await lastRun;
        await runner.idle();
        await runner.stop();
      }
    }
    for (const s of servers) await s.close();
    // Last, with nothing awaited after it: the CLI's own handler takes over with no gap (src/cli.ts).
    for (const s of STOP_SIGNALS) io.proc.off(s, onSignal);
  }
  if (failure !== undefined) {
    if (failure instanceof CalloutError && status !== 0) {
      // A run already failed: its status wins, the source error is still said.
      log.error(failure.message);
      return status;
    }
    throw failure;
  }
  if (onceTimedOut) {
    throw new CalloutError('source', `--once-timeout: no complete state from the ${spec.sourceName} source within ${formatMs(common.onceTimeoutMs)}`);
  }
  if (interrupted) return 130;
  if (stdoutFailed) return 1;
  if (stopping || stdoutClosed) return 0;
  return status;
}

/**
 * Resolves once the event loop has polled again: a signal already pending is
 * handled by then. Two turns: called from an I/O callback (a fixture read),
 * the first immediate runs before the loop polls again.
 */
function afterPendingSignals(): Promise<void> {
  return new Promise((resolve) => setImmediate(() => setImmediate(resolve)));
}

function formatMs(ms: number): string {
  return ms % 1000 === 0 ? `${ms / 1000}s` : `${ms}ms`;
}
