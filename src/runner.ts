/**
 * The runner: turns a stream of complete `State`s into callout runs.
 *
 * - One run at a time; states arriving during a run coalesce into one following
 *   run with the newest state.
 * - Debounce (`debounceMs` of quiet, bounded by `maxWaitMs` from the first
 *   pending change, as consul-template's wait{min,max}).
 * - Skips a run whose input equals the last run's input when that run succeeded;
 *   `resyncPeriodMs` forces a periodic re-run anyway.
 * - Each run is its own process group: a timeout (or stop) SIGTERMs the whole
 *   group, then SIGKILLs it after a grace period.
 * - Nothing of a run outlives it: once the callout has exited and its output
 *   is drained, whatever is left in its group (background processes) is
 *   killed the same way, with a warning naming the pids, before the run
 *   counts as finished; at our exit the in-flight group is SIGKILLed.
 * - Our own output streams may break (EPIPE when stdout is a closed pipe): the
 *   callout's output meant for a broken stream is dropped, never waited for.
 * - Failures are retried with capped exponential backoff and jitter; a newer
 *   state supersedes a pending retry.
 *
 * It knows nothing of gRPC, files or Kubernetes.
 *
 * We use node:child_process rather than execa here: execa resolves only once
 * the child's pipes are closed (a grandchild holding stdout open would hold the
 * run forever), and it kills the child rather than its process group. We need
 * both the group kill and a bounded wait for pipes, plus writev-style stdin
 * from cached Buffers and line-prefixed live stderr, which are all simpler on
 * the plain ChildProcess.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import { silentLogger, type Logger } from './log.js';
import { spawnErrorMessage } from './callout-check.js';
import { groupAlive, groupMembers, jsonLineFormat, signalGroup, StderrLines, Tail, textLineFormat } from './child-output.js';
import { sameState, type State } from './state.js';

/** Timer functions, injectable for tests (method syntax so the Node globals fit). */
export interface RunnerTimers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

/** Options of a `Runner`. Durations are in milliseconds. */
export interface RunnerOptions {
  /** Program to run, without a shell: a path or a name looked up in $PATH (e.g. `/bin/cat`, `jq`). */
  file: string;
  /** Extra arguments. */
  args?: string[];
  /** Quiet time after the last change before a run (default 100); 0 runs at once. */
  debounceMs: number;
  /** Upper bound from the first pending change to the run (default 1000). */
  maxWaitMs: number;
  /** Per-run timeout (default 60000); 0 disables it. */
  timeoutMs: number;
  /** SIGTERM -> SIGKILL grace for a run's process group (default 5000). */
  killGraceMs?: number;
  /** Re-run the newest state this long after the last run even if identical (default 0 = off). */
  resyncPeriodMs?: number;
  /** First retry delay after a failure (default 1000), doubling with jitter... */
  retryMinMs?: number;
  /** ...up to this cap (default 30000). */
  retryMaxMs?: number;
  /** Exported to the callout as KPNG_NODE_NAME. */
  nodeName: string;
  /** Base environment of the callout (default process.env); KPNG_CALLOUT_RUN and KPNG_NODE_NAME are added. */
  env?: NodeJS.ProcessEnv;
  /** Where the callout's stdout goes, unchanged (default process.stdout). */
  stdout?: NodeJS.WritableStream;
  /** Where the callout's stderr goes, line by line in `stderrFormat` (default process.stderr). */
  stderr?: NodeJS.WritableStream;
  /**
   * How each line of the callout's stderr is written: `text` (default) as
   * `[run N] line`, `json` as one object per line,
   * `{"time":"…","level":"info","run":N,"stream":"stderr","msg":"line"}` (for
   * `--log-format json`: every line on our stderr is then JSON).
   */
  stderrFormat?: 'text' | 'json';
  /** Our own log lines (default: silent). */
  logger?: Logger;
  /** Millisecond clock for durations and event times (default Date.now). */
  now?: () => number;
  /** Timer functions (default the Node globals). */
  timers?: RunnerTimers;
  /** Observer of runner events (metrics). Must not throw. */
  onEvent?: (e: RunnerEvent) => void;
  /**
   * After the callout exited, how long its pipes may stay quiet before we stop
   * reading them (a background grandchild may hold them open). Default 200.
   */
  pipeDrainMs?: number;
  /** Random source in [0,1) for the retry jitter (default Math.random). */
  random?: () => number;
}

/** How a run ended. */
export type RunStatus = 'ok' | 'failed' | 'timeout' | 'signal' | 'spawn-error' | 'skipped';

/** Outcome of one run. */
export interface RunResult {
  /** Run number (1-based, also KPNG_CALLOUT_RUN); 0 for a run that never started. */
  run: number;
  result: RunStatus;
  /** Exit status, when the callout exited by itself. */
  exitCode?: number;
  /** Signal that ended the callout (ours on timeout/stop, or another). */
  signal?: string;
  durationMs: number;
  /** Last lines of the callout's stderr (about 10 lines / 2 KB). */
  stderrTail?: string;
  /** One-line description of a failure (also logged). */
  message?: string;
  /** errno code of a spawn error (ENOENT, EACCES, ...). */
  errorCode?: string;
  /**
   * Processes still running in the callout's process group after it exited
   * (background processes it started), which the runner then killed.
   */
  leftoverPids?: number[];
  /** We ended it (stop, kill): not the callout's failure, so not logged as one. */
  stopped?: boolean;
}

/** Why a run started. */
export type RunReason = 'change' | 'retry' | 'resync' | 'now';

/**
 * Runner events, for metrics. `at` is `now()` when the event happened;
 * `pendingSince` is when the state that runs first became pending (a burst of
 * coalesced changes counts from its first change).
 */
export type RunnerEvent =
  | { type: 'pending-changed'; pending: boolean; pendingSince?: number; at: number }
  | { type: 'run-started'; run: number; reason: RunReason; pendingSince?: number; at: number; services: number; bytes: number }
  | ({ type: 'run-finished'; reason: RunReason; pendingSince?: number; at: number } & RunResult)
  | { type: 'run-skipped'; reason: RunReason; pendingSince?: number; at: number }
  | { type: 'retry-scheduled'; run: number; attempt: number; delayMs: number; at: number }
  /** The whole state was handed to the callout's stdin (the pipe took its last byte). */
  | { type: 'input-written'; run: number; bytes: number; at: number };

/** A run in flight. */
interface InFlight {
  readonly run: number;
  readonly done: Promise<RunResult>;
  /** SIGTERM the process group now, SIGKILL it after killGraceMs. */
  terminate(why: 'timeout' | 'stop'): void;
  /** SIGKILL the process group now. */
  kill(): void;
}

interface NowRequest {
  state: State;
  since: number;
  resolve: (r: RunResult) => void;
}

const GROUP_POLL_MS = 50;
/** After SIGKILL, how long we keep checking that the group is gone. */
const AFTER_KILL_WAIT_MS = 2000;
/**
 * After the callout exited, output can only be what was left in its pipes
 * (at most the pipe capacity, 1 MiB at most on Linux) unless a background
 * process writes: past this many bytes, or this long of output flowing with
 * nothing blocking it, we stop reading (and kill the writer with the group).
 */
const AFTER_EXIT_MAX_BYTES = 4 * 1024 * 1024;
const AFTER_EXIT_BUSY_MS = 2000;

/**
 * One of our output streams as the runner writes to it. Once it errors or is
 * closed (EPIPE: the reader of our stdout went away) it stays broken: what is
 * meant for it is dropped, and nothing waits for its 'drain'. Handling its
 * 'error' here also keeps a broken stream from crashing the process with an
 * unhandled 'error' event while a run forwards to it.
 */
class Outlet {
  private isBroken: boolean;
  private readonly waiters = new Set<() => void>();

  constructor(
    readonly dest: NodeJS.WritableStream,
    private readonly onBroken: (why: string) => void,
  ) {
    const d = dest as Partial<Writable>;
    this.isBroken = d.destroyed === true || d.writableEnded === true;
    dest.on('error', (err: NodeJS.ErrnoException) => this.fail(err.code ?? err.message));
    dest.on('close', () => this.fail('closed'));
    dest.on('drain', () => this.release());
  }

  get broken(): boolean {
    return this.isBroken;
  }

  /** Writes `b`; false when the caller should wait for `whenWritable` (backpressure). */
  write(b: Buffer): boolean {
    if (this.isBroken) return true;
    try {
      return this.dest.write(b) || this.isBroken;
    } catch (err) {
      this.fail((err as NodeJS.ErrnoException).code ?? String(err));
      return true;
    }
  }

  /** Calls `fn` once the stream drains or breaks; returns a canceller. */
  whenWritable(fn: () => void): () => void {
    if (this.isBroken) {
      queueMicrotask(fn); // never synchronously: the caller is still registering
      return () => {};
    }
    this.waiters.add(fn);
    return () => void this.waiters.delete(fn);
  }

  private fail(why: string): void {
    if (this.isBroken) return;
    this.isBroken = true;
    this.onBroken(why);
    this.release();
  }

  private release(): void {
    const fns = [...this.waiters];
    this.waiters.clear();
    for (const fn of fns) fn();
  }
}

function describe(r: RunResult, timeoutMs: number): string {
  switch (r.result) {
    case 'failed':
      return `callout run ${r.run} failed: exit status ${r.exitCode}`;
    case 'signal':
      return `callout run ${r.run} killed by ${r.signal}`;
    case 'timeout':
      return `callout run ${r.run} timed out after ${timeoutMs}ms; its process group was killed`;
    default:
      return r.message ?? `callout run ${r.run} ${r.result}`;
  }
}

/**
 * Runs the callout for states. `submit` is the daemon path (debounced,
 * coalesced, skip-identical, retried); `runNow` is the one-shot path.
 */
export class Runner {
  private readonly file: string;
  private readonly args: string[];
  private readonly debounceMs: number;
  private readonly maxWaitMs: number;
  private readonly timeoutMs: number;
  private readonly killGraceMs: number;
  private readonly resyncPeriodMs: number;
  private readonly retryMinMs: number;
  private readonly retryMaxMs: number;
  private readonly pipeDrainMs: number;
  private readonly nodeName: string;
  private readonly baseEnv: NodeJS.ProcessEnv;
  private readonly outStream: NodeJS.WritableStream;
  private readonly errStream: NodeJS.WritableStream;
  private readonly stderrFormat: 'text' | 'json';
  /** Our stdout and stderr as outlets, made at the first run (their listeners stay for the runner's life). */
  private outlets: { out: Outlet; err: Outlet } | undefined;
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly timers: RunnerTimers;
  private readonly onEvent: ((e: RunnerEvent) => void) | undefined;
  private readonly random: () => number;

  /** Newest state waiting to run (daemon path). */
  private pending: State | undefined;
  private pendingSince: number | undefined;
  private pendingReason: RunReason = 'change';
  private pendingDueAt = 0;
  /** The next pending run must not be skipped (a resync fell due meanwhile). */
  private force = false;
  private wakeTimer: unknown;
  private retryTimer: unknown;
  private resyncTimer: unknown;
  /** Consecutive failures: the backoff exponent; reset by a success only. */
  private attempt = 0;
  /** Input of the last run, if that run succeeded (the skip-identical baseline). */
  private lastOk: State | undefined;
  /** Newest state seen (resync and retry run it). */
  private latest: State | undefined;
  private current: InFlight | undefined;
  private readonly nowQueue: NowRequest[] = [];
  private idleWaiters: Array<() => void> = [];
  private runCounter = 0;
  private stopped = false;
  private stopping: Promise<void> | undefined;
  private last: RunResult | undefined;
  /** Kills the in-flight group if our process exits (the group is detached, nothing else would). */
  private readonly onProcessExit = (): void => this.current?.kill();

  constructor(options: RunnerOptions) {
    this.file = options.file;
    this.args = options.args ?? [];
    this.debounceMs = Math.max(0, options.debounceMs);
    this.maxWaitMs = Math.max(0, options.maxWaitMs);
    this.timeoutMs = Math.max(0, options.timeoutMs);
    this.killGraceMs = Math.max(0, options.killGraceMs ?? 5000);
    this.resyncPeriodMs = Math.max(0, options.resyncPeriodMs ?? 0);
    this.retryMinMs = Math.max(1, options.retryMinMs ?? 1000);
    this.retryMaxMs = Math.max(this.retryMinMs, options.retryMaxMs ?? 30000);
    this.pipeDrainMs = Math.max(1, options.pipeDrainMs ?? 200);
    this.nodeName = options.nodeName;
    this.baseEnv = options.env ?? process.env;
    this.outStream = options.stdout ?? process.stdout;
    this.errStream = options.stderr ?? process.stderr;
    this.stderrFormat = options.stderrFormat ?? 'text';
    this.log = options.logger ?? silentLogger;
    this.now = options.now ?? Date.now;
    this.timers = options.timers ?? { setTimeout: (fn, ms) => setTimeout(fn, ms), clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout) };
    this.onEvent = options.onEvent;
    this.random = options.random ?? Math.random;
  }

  /** The result of the last finished run (any path), if any. */
  get lastResult(): RunResult | undefined {
    return this.last;
  }

  /** True while a callout process is running. */
  get busy(): boolean {
    return this.current !== undefined;
  }

  /**
   * Daemon path: the state runs after the debounce, coalesced with any later
   * state, after the in-flight run, unless identical to the last successful
   * run's input. Ignored after stop().
   */
  submit(state: State): void {
    if (this.stopped) {
      this.log.debug('runner stopped: state ignored');
      return;
    }
    const t = this.now();
    this.latest = state;
    this.clearRetry(); // a newer state supersedes a pending retry
    if (this.pending === undefined) this.pendingSince = t;
    this.pending = state;
    this.pendingReason = 'change';
    this.pendingDueAt = Math.min(t + this.debounceMs, (this.pendingSince ?? t) + this.maxWaitMs);
    this.emit({ type: 'pending-changed', pending: true, pendingSince: this.pendingSince, at: t });
    this.schedule();
  }

  /**
   * Runs `state` once, after any in-flight run (before debounced ones): no
   * debounce, no skip-identical, no retry. After stop() it resolves at once
   * with result `skipped` (run 0), as do requests still queued at stop().
   */
  runNow(state: State): Promise<RunResult> {
    if (this.stopped) return Promise.resolve(this.notRun());
    this.latest = state;
    return new Promise((resolve) => {
      this.nowQueue.push({ state, since: this.now(), resolve });
      this.schedule();
    });
  }

  /**
   * Resolves when nothing is running, nothing waits for its debounce and no
   * runNow is queued. A scheduled retry (and the resync timer) does not count:
   * a callout that keeps failing must not keep a finite replay from ending;
   * check `lastResult` to see whether the last run failed.
   */
  idle(): Promise<void> {
    if (this.isIdle()) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /**
   * Stops accepting states, cancels the pending debounce, retry and resync, lets
   * an in-flight run finish within `graceMs` (default killGraceMs), then
   * SIGTERMs its process group and SIGKILLs it killGraceMs later. Resolves when
   * the run is over and its group is gone (background processes included).
   */
  stop(graceMs?: number): Promise<void> {
    if (this.stopping) return this.stopping;
    this.shutdown();
    const cur = this.current;
    this.stopping = (async () => {
      if (cur) {
        const grace = Math.max(0, graceMs ?? this.killGraceMs);
        this.log.debug('waiting for the running callout', { run: cur.run, graceMs: grace });
        const t = this.timers.setTimeout(() => {
          this.log.info('stopping: terminating the running callout', { run: cur.run });
          cur.terminate('stop');
        }, grace);
        await cur.done;
        this.timers.clearTimeout(t);
      }
      this.checkIdle();
    })();
    return this.stopping;
  }

  /**
   * Immediately SIGKILLs the in-flight run's process group, background
   * processes included (and stops the runner). `idle()` and `stop()` resolve
   * once the kill is confirmed (bounded).
   */
  kill(): void {
    this.shutdown();
    if (this.current) {
      this.log.info('killing the running callout', { run: this.current.run });
      this.current.kill();
    }
  }

  // --- scheduling -----------------------------------------------------------

  private shutdown(): void {
    this.stopped = true;
    this.clearWake();
    this.clearRetry();
    if (this.resyncTimer !== undefined) this.timers.clearTimeout(this.resyncTimer);
    this.resyncTimer = undefined;
    if (this.pending !== undefined) {
      this.pending = undefined;
      this.pendingSince = undefined;
      this.emit({ type: 'pending-changed', pending: false, at: this.now() });
    }
    for (const q of this.nowQueue.splice(0)) q.resolve(this.notRun());
    this.checkIdle();
  }

  private notRun(): RunResult {
    return { run: 0, result: 'skipped', durationMs: 0, message: 'runner stopped' };
  }

  private isIdle(): boolean {
    return this.current === undefined && this.pending === undefined && this.nowQueue.length === 0;
  }

  private checkIdle(): void {
    if (!this.isIdle() || this.idleWaiters.length === 0) return;
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const w of waiters) w();
  }

  private clearWake(): void {
    if (this.wakeTimer !== undefined) this.timers.clearTimeout(this.wakeTimer);
    this.wakeTimer = undefined;
  }

  private clearRetry(): void {
    if (this.retryTimer !== undefined) this.timers.clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
  }

  /** Starts the next run if one is due, or arms the debounce timer. */
  private schedule(): void {
    this.clearWake();
    if (this.current || this.stopped) return; // the end of the current run schedules again
    const req = this.nowQueue.shift();
    if (req) {
      this.launch(req.state, 'now', req.since, (r) => {
        if (r.result === 'ok') this.clearRetry(); // the newest state was applied
        req.resolve(r);
      });
      return;
    }
    if (this.pending === undefined) {
      this.checkIdle();
      return;
    }
    const delay = this.pendingDueAt - this.now();
    if (delay <= 0) this.startPending();
    else
      this.wakeTimer = this.timers.setTimeout(() => {
        this.wakeTimer = undefined;
        // Only the latest armed timer can fire; trust it even if the clock says a hair early.
        if (!this.current && !this.stopped && this.pending !== undefined) this.startPending();
      }, delay);
  }

  private startPending(): void {
    const state = this.pending!;
    const since = this.pendingSince;
    const reason = this.pendingReason;
    const force = this.force || reason !== 'change';
    this.pending = undefined;
    this.pendingSince = undefined;
    this.pendingReason = 'change';
    this.force = false;
    const at = this.now();
    this.emit({ type: 'pending-changed', pending: false, at });
    if (!force && this.lastOk !== undefined && sameState(state, this.lastOk)) {
      this.log.debug('callout run skipped: state unchanged since the last successful run', {
        services: state.services,
        bytes: state.bytes,
      });
      this.emit({ type: 'run-skipped', reason, pendingSince: since, at });
      this.checkIdle();
      return;
    }
    this.launch(state, reason, since, (r) => {
      if (r.result !== 'ok' && !this.stopped && this.pending === undefined) this.scheduleRetry(r);
    });
  }

  private scheduleRetry(failed: RunResult): void {
    const base = Math.min(this.retryMaxMs, this.retryMinMs * 2 ** Math.min(this.attempt, 40));
    // ±20% jitter so that many nodes failing together do not retry in lockstep.
    const delay = Math.max(1, Math.round(Math.min(this.retryMaxMs, base * (0.8 + 0.4 * this.random()))));
    this.attempt++;
    this.log.info(`retrying the callout in ${delay}ms`, { run: failed.run, attempt: this.attempt, delayMs: delay });
    this.emit({ type: 'retry-scheduled', run: failed.run, attempt: this.attempt, delayMs: delay, at: this.now() });
    this.retryTimer = this.timers.setTimeout(() => {
      this.retryTimer = undefined;
      if (this.stopped || this.latest === undefined) return;
      this.setPendingNow(this.latest, 'retry');
    }, delay);
  }

  private armResync(): void {
    if (this.resyncPeriodMs <= 0 || this.stopped) return;
    if (this.resyncTimer !== undefined) this.timers.clearTimeout(this.resyncTimer);
    this.resyncTimer = this.timers.setTimeout(() => {
      this.resyncTimer = undefined;
      if (this.stopped || this.latest === undefined) return;
      if (this.pending !== undefined) {
        this.force = true; // the coming run is the resync: do not skip it
        return;
      }
      // A run in flight, a queued runNow or a scheduled retry re-runs anyway
      // (and re-arms this timer when it ends).
      if (this.current || this.nowQueue.length > 0 || this.retryTimer !== undefined) return;
      this.log.debug('resync: re-running the newest state', { periodMs: this.resyncPeriodMs });
      this.setPendingNow(this.latest, 'resync');
    }, this.resyncPeriodMs);
  }

  private setPendingNow(state: State, reason: RunReason): void {
    const t = this.now();
    this.pending = state;
    this.pendingSince = t;
    this.pendingReason = reason;
    this.pendingDueAt = t;
    this.emit({ type: 'pending-changed', pending: true, pendingSince: t, at: t });
    this.schedule();
  }

  private launch(state: State, reason: RunReason, since: number | undefined, after: (r: RunResult) => void): void {
    const run = ++this.runCounter;
    const started = this.now();
    this.log.debug('callout run started', { run, reason, services: state.services, bytes: state.bytes, input: state.origin });
    this.emit({ type: 'run-started', run, reason, pendingSince: since, at: started, services: state.services, bytes: state.bytes });
    const inflight = this.execute(run, state, started);
    this.current = inflight;
    process.on('exit', this.onProcessExit); // one run at a time: at most one listener
    void inflight.done.then((r) => {
      process.removeListener('exit', this.onProcessExit);
      this.current = undefined;
      this.last = r;
      if (r.result === 'ok') {
        this.lastOk = state;
        this.attempt = 0;
      } else {
        // The callout may have applied part of this state: do not skip the next one.
        this.lastOk = undefined;
      }
      const fields = {
        run,
        status: r.result,
        durationMs: r.durationMs,
        exitCode: r.exitCode,
        signal: r.signal,
        input: state.origin,
      };
      // The callout's stderr was already shown live: only a failure repeats its tail.
      if (r.result === 'ok') this.log.info('callout run finished', fields);
      else if (r.stopped) this.log.info(r.message ?? `callout run ${run} stopped`, fields);
      else if (r.result === 'spawn-error') this.log.error(r.message ?? 'callout could not be started', { run, durationMs: r.durationMs, input: state.origin });
      else this.log.warn(r.message ?? describe(r, this.timeoutMs), { ...fields, stderr: r.stderrTail });
      this.emit({ type: 'run-finished', reason, pendingSince: since, at: this.now(), ...r });
      this.armResync();
      after(r);
      this.schedule();
    });
  }

  private emit(e: RunnerEvent): void {
    if (!this.onEvent) return;
    try {
      this.onEvent(e);
    } catch (err) {
      this.log.debug('runner event observer threw', { error: String(err) });
    }
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => this.timers.setTimeout(resolve, ms));
  }

  /** Resolves when `p` does or after `ms`, whichever first; no timer is left behind. */
  private within(p: Promise<void>, ms: number): Promise<void> {
    return new Promise((resolve) => {
      const h = this.timers.setTimeout(resolve, ms);
      void p.then(() => {
        this.timers.clearTimeout(h);
        resolve();
      });
    });
  }

  // --- one process ----------------------------------------------------------

  /** Our stdout and stderr as outlets (created once: their listeners must not pile up per run). */
  private getOutlets(): { out: Outlet; err: Outlet } {
    this.outlets ??= {
      out: new Outlet(this.outStream, (why) => this.log.debug(`our stdout is closed (${why}): the callout's stdout is dropped`)),
      err: new Outlet(this.errStream, (why) => this.log.debug(`our stderr is closed (${why}): the callout's stderr is dropped`)),
    };
    return this.outlets;
  }

  private execute(run: number, state: State, started: number): InFlight {
    const env: NodeJS.ProcessEnv = { ...this.baseEnv, KPNG_CALLOUT_RUN: String(run), KPNG_NODE_NAME: this.nodeName };
    const elapsed = (): number => Math.max(0, this.now() - started);
    const spawnFailed = (err: NodeJS.ErrnoException): RunResult => ({
      run,
      result: 'spawn-error',
      durationMs: elapsed(),
      message: spawnErrorMessage(this.file, err, env),
      ...(err.code ? { errorCode: err.code } : {}),
    });

    let child: ChildProcess;
    try {
      // detached: setsid(), so the callout leads its own process group and a
      // kill of -pid reaches everything it started.
      child = spawn(this.file, this.args, { detached: true, env, stdio: ['pipe', 'pipe', 'pipe'] });
    } catch (err) {
      // Invalid arguments and unusual errnos throw synchronously.
      const r = spawnFailed(err as NodeJS.ErrnoException);
      return { run, done: Promise.resolve(r), terminate() {}, kill() {} };
    }

    const pgid = child.pid;
    let killedBy: 'timeout' | 'stop' | 'kill' | undefined;
    let sigterm: 'SIGTERM' | undefined;
    let sigkillSent = false;
    let exited = false;
    let killTimer: unknown;
    let timeoutTimer: unknown;

    const signalAll = (sig: NodeJS.Signals): void => {
      if (pgid === undefined) return;
      const problem = signalGroup(pgid, sig);
      if (problem) this.log.debug(`cannot signal the callout's group: ${problem}`, { run });
    };
    const sendKill = (): void => {
      if (killTimer !== undefined) this.timers.clearTimeout(killTimer);
      killTimer = undefined;
      sigkillSent = true;
      signalAll('SIGKILL');
    };
    /** SIGTERM the group now and SIGKILL it after the grace (unless already under way). */
    const terminateGroup = (): void => {
      if (sigterm || sigkillSent) return;
      sigterm = 'SIGTERM';
      signalAll('SIGTERM');
      killTimer = this.timers.setTimeout(() => {
        killTimer = undefined;
        this.log.debug('callout group still running after SIGTERM: SIGKILL it', { run });
        sendKill();
      }, this.killGraceMs);
    };
    const terminate = (why: 'timeout' | 'stop'): void => {
      killedBy ??= why;
      terminateGroup();
    };
    const kill = (): void => {
      killedBy ??= 'kill';
      sendKill();
    };

    const outcome = new Promise<{ code: number | null; signal: NodeJS.Signals | null } | { error: NodeJS.ErrnoException }>((resolve) => {
      child.on('error', (err: NodeJS.ErrnoException) => {
        // Without a pid the spawn failed (ENOENT, EACCES...); later errors are informational.
        if (pgid === undefined) resolve({ error: err });
        else this.log.debug(`callout process error: ${err.message}`, { run });
      });
      child.once('exit', (code, signal) => resolve({ code, signal }));
    });

    if (pgid === undefined) {
      const done = outcome.then((o): RunResult => ('error' in o ? spawnFailed(o.error) : spawnFailed(Object.assign(new Error('no pid'), { code: 'EUNKNOWN' }))));
      return { run, done, terminate() {}, kill() {} };
    }

    const stdin = child.stdin!;
    const stdout = child.stdout!;
    const stderr = child.stderr!;

    // stdin: the cached line Buffers, corked so they go out as one writev.
    // A callout that does not read its stdin (e.g. `true`) gives EPIPE: fine.
    stdin.on('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EPIPE' || err.code === 'ECONNRESET' || err.code === 'ERR_STREAM_DESTROYED') {
        this.log.debug('callout did not read all of its input', { run, code: err.code });
      } else this.log.warn(`writing to the callout's stdin: ${err.message}`, { run });
    });
    stdin.cork();
    for (const line of state.lines) stdin.write(line);
    stdin.uncork();
    stdin.end((err?: Error | null) => {
      if (!err) this.emit({ type: 'input-written', run, bytes: state.bytes, at: this.now() });
    });

    // stdout/stderr: forwarded as they come, with backpressure from our side
    // (unless our side is broken: then dropped, but still read, so that the
    // callout never blocks on a full pipe).
    const outlets = this.getOutlets();
    const tail = new Tail();
    const lines = new StderrLines(this.stderrFormat === 'json' ? jsonLineFormat(run, this.now) : textLineFormat(run), tail);
    let activity = 0;
    let blocked = 0;
    let bytesAfterExit = 0;
    const cancels = new Set<() => void>();
    const forward = (src: Readable, outlet: Outlet, map: (b: Buffer) => Buffer | undefined): void => {
      src.on('data', (chunk: Buffer) => {
        activity++;
        if (exited) bytesAfterExit += chunk.length;
        const b = map(chunk);
        if (b === undefined || outlet.write(b)) return;
        src.pause();
        blocked++;
        const cancel = outlet.whenWritable(() => {
          cancels.delete(cancel);
          blocked--;
          src.resume();
        });
        cancels.add(cancel);
      });
      src.on('error', (err) => this.log.debug(`reading callout output: ${err.message}`, { run }));
    };
    forward(stdout, outlets.out, (b) => b);
    forward(stderr, outlets.err, (b) => lines.push(b));
    const closed = new Promise<void>((resolve) => child.once('close', () => resolve()));
    let isClosed = false;
    void closed.then(() => (isClosed = true));

    if (this.timeoutMs > 0) {
      timeoutTimer = this.timers.setTimeout(() => {
        timeoutTimer = undefined;
        if (exited) return;
        this.log.debug(`callout run ${run} timed out: SIGTERM its group`, { run, timeoutMs: this.timeoutMs });
        terminate('timeout');
      }, this.timeoutMs);
    }

    const alive = (): boolean => groupAlive(pgid);
    /** Waits until the group is gone: through the SIGTERM grace, then (bounded) after SIGKILL. */
    const waitGone = async (): Promise<void> => {
      while (!sigkillSent && alive()) await this.sleep(GROUP_POLL_MS);
      if (killTimer !== undefined) this.timers.clearTimeout(killTimer);
      killTimer = undefined;
      for (let waited = 0; sigkillSent && waited < AFTER_KILL_WAIT_MS && alive(); waited += GROUP_POLL_MS) {
        await this.sleep(GROUP_POLL_MS);
      }
    };

    const done = (async (): Promise<RunResult> => {
      const o = await outcome;
      exited = true;
      if (timeoutTimer !== undefined) this.timers.clearTimeout(timeoutTimer);
      timeoutTimer = undefined;
      const result = 'error' in o ? undefined : o;
      const killedAtExit = killedBy;

      // We killed it: make sure the rest of its group goes too, bounded by the
      // SIGKILL timer, which we cancel as soon as the group is gone.
      if (killedBy !== undefined) await waitGone();

      // Let the pipes reach EOF, but a background process may hold them open:
      // give up once they have been quiet for pipeDrainMs (unless we are only
      // waiting for our own output to drain, and the run was not killed), or
      // when output keeps coming after the exit (a background writer).
      let busyMs = 0;
      while (!isClosed) {
        const seen = activity;
        await this.within(closed, this.pipeDrainMs);
        if (isClosed) break;
        if (activity === seen && (blocked === 0 || killedBy !== undefined)) break;
        if (blocked === 0 && (busyMs += this.pipeDrainMs) >= AFTER_EXIT_BUSY_MS) break;
        if (bytesAfterExit > AFTER_EXIT_MAX_BYTES) break;
      }
      if (!isClosed) {
        this.log.debug('callout exited but its output is still open (background process?): stop reading', { run });
        stdout.destroy();
        stderr.destroy();
      }
      stdin.destroy();
      for (const cancel of cancels) cancel();
      cancels.clear();
      const rest = lines.flush();
      if (rest) outlets.err.write(rest);

      // Whatever is still alive in the group was started by the callout and
      // left behind: it must not outlive the run (nor overlap the next one).
      const left = groupMembers(pgid);
      const leftover = killedAtExit === undefined && left.length > 0 ? left : undefined;
      if (left.length > 0) {
        if (leftover) {
          this.log.warn(`callout run ${run} exited but left processes running (pids ${left.join(', ')}): terminating them; a callout must not leave background processes behind`, {
            run,
            pids: left.join(','),
            input: state.origin,
          });
        }
        if (!sigterm && !sigkillSent) terminateGroup();
        else if (sigkillSent) signalAll('SIGKILL'); // reaches what appeared since
        else if (killTimer === undefined) sendKill(); // an earlier SIGTERM's grace is over
        await waitGone();
        const still = groupMembers(pgid);
        if (still.length > 0) this.log.warn(`callout run ${run}: processes still present after SIGKILL (pids ${still.join(', ')})`, { run });
      }

      const r: RunResult = { run, result: 'ok', durationMs: elapsed() };
      if (result?.code != null) r.exitCode = result.code;
      if (result?.signal != null) r.signal = result.signal;
      if (killedBy === 'timeout') r.result = 'timeout';
      else if (result?.signal != null) r.result = 'signal';
      else if (result?.code !== 0) r.result = 'failed';
      const t = tail.text();
      if (t !== undefined) r.stderrTail = t;
      if (leftover) r.leftoverPids = leftover;
      if (killedBy === 'stop' || killedBy === 'kill') r.stopped = true;
      if (r.result !== 'ok') {
        r.message =
          killedBy === 'stop' || killedBy === 'kill' ? `callout run ${run} stopped (${r.signal ?? `exit status ${r.exitCode}`})` : describe(r, this.timeoutMs);
      }
      return r;
    })();

    return { run, done, terminate, kill };
  }
}
