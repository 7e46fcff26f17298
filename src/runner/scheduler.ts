/**
 * The scheduler: turns a stream of complete `State`s into runs of a `Callout`,
 * and decides nothing about processes (kube-proxy's BoundedFrequencyRunner
 * and consul-template's quiescence keep this apart from the work the same way).
 *
 * - One run at a time; states arriving during a run coalesce into one following
 *   run with the newest state.
 * - Debounce (`debounceMs` of quiet, bounded by `maxWaitMs` from the first
 *   pending change: `debounceDue`).
 * - Skips a run whose input equals the last run's input when that run succeeded;
 *   `resyncPeriodMs` forces a periodic re-run anyway.
 * - Failures are retried with the jittered `backoffDelay`; a newer state
 *   supersedes a pending retry.
 * - `runNow` (one-shot and replay path) queues ahead of debounced states;
 *   by its options it skips identical input, retries a failure, or hands
 *   the state over in full.
 *
 * Pure: time comes from the injected clock and timers, runs from the injected
 * `Callout`, so every rule here is tested on a fake clock with a fake callout.
 */
import { onlyReordered } from '../changes.js';
import { debounceDue } from '../debounce.js';
import { DEFAULTS } from '../defaults.js';
import { silentLogger, type Logger } from '../log.js';
import { sameState, type State } from '../state.js';
import type { Callout, InFlight, RunReason, RunResult } from './callout.js';
import { ResyncTimer } from './resync-timer.js';
import { RetryTimer } from './retry-timer.js';
import { emitEvent, logRunFinished, type RunnerEvent } from './runner-event.js';
import { nodeTimers, type RunNowOptions, type SchedulerOptions, type Timers } from './scheduler-options.js';

export type { RunnerEvent } from './runner-event.js';
export type { RunNowOptions, SchedulerOptions, Timers } from './scheduler-options.js';

interface NowRequest {
  state: State;
  since: number;
  options: RunNowOptions;
  resolve: (r: RunResult) => void;
}

/** The result of a `runNow` that never ran because the runner stopped. */
const NOT_RUN: Readonly<RunResult> = { run: 0, result: 'skipped', durationMs: 0, message: 'runner stopped' };

/**
 * Runs the callout for states. `submit` is the daemon path (debounced,
 * coalesced, skip-identical, retried); `runNow` is the one-shot path.
 */
export class Scheduler {
  private readonly callout: Callout;
  private readonly debounceMs: number;
  private readonly maxWaitMs: number;
  private readonly killGraceMs: number;
  private readonly changes: boolean;
  private readonly resync: ResyncTimer;
  private readonly retry: RetryTimer;
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly timers: Timers;
  private readonly onEvent: ((e: RunnerEvent) => void) | undefined;

  /** Newest state waiting to run (daemon path). */
  private pending: State | undefined;
  private pendingSince: number | undefined;
  private pendingReason: RunReason = 'change';
  private pendingDueAt = 0;
  /** The next pending run must not be skipped (a resync fell due meanwhile). */
  private force = false;
  private wakeTimer: unknown;
  /** The callout was lost (lost()) while the current run was in flight. */
  private lostDuringRun = false;
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
  /** Failures are retried: a daemon (submit, or runNow with retry), not a one-shot or a finite replay. */
  private retries = false;

  constructor(options: SchedulerOptions) {
    this.callout = options.callout;
    this.debounceMs = Math.max(0, options.debounceMs ?? DEFAULTS.debounceMs);
    this.maxWaitMs = Math.max(0, options.maxWaitMs ?? DEFAULTS.maxWaitMs);
    this.killGraceMs = Math.max(0, options.killGraceMs ?? DEFAULTS.killGraceMs);
    this.changes = options.changes ?? false;
    const minMs = Math.max(1, options.retryMinMs ?? DEFAULTS.retryMinMs);
    this.log = options.logger ?? silentLogger;
    this.now = options.now ?? Date.now;
    this.timers = options.timers ?? nodeTimers;
    this.retry = new RetryTimer({ minMs, maxMs: Math.max(minMs, options.retryMaxMs ?? DEFAULTS.retryMaxMs) }, options.random ?? Math.random, this.timers);
    this.resync = new ResyncTimer(Math.max(0, options.resyncPeriodMs ?? DEFAULTS.resyncPeriodMs), this.timers, () => this.resyncEnded());
    this.onEvent = options.onEvent;
    this.callout.lost?.((why) => this.calloutLost(why));
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
    this.retries = true;
    this.retry.clear(); // a newer state supersedes a pending retry
    if (this.pending === undefined) this.pendingSince = t;
    this.pending = state;
    this.pendingReason = 'change';
    this.pendingDueAt = debounceDue(this.pendingSince ?? t, t, this.debounceMs, this.maxWaitMs);
    this.emit({ type: 'pending-changed', pending: true, pendingSince: this.pendingSince, at: t });
    this.schedule();
  }

  /**
   * Runs `state` once, after any in-flight run (before debounced ones): no
   * debounce; skip-identical, retry and full input only as `options` say.
   * After stop() it resolves at once with result `skipped` (run 0), as do
   * requests still queued at stop().
   */
  runNow(state: State, options: RunNowOptions = {}): Promise<RunResult> {
    if (this.stopped) return Promise.resolve({ ...NOT_RUN });
    this.latest = state;
    if (options.retry) this.retries = true;
    this.retry.clear(); // a newer state supersedes a pending retry
    return new Promise((resolve) => {
      this.nowQueue.push({ state, since: this.now(), options, resolve });
      this.schedule();
    });
  }

  /**
   * Resolves when nothing is running, nothing waits for its debounce and no
   * runNow is queued. A scheduled retry (and the resync timer) does not count:
   * a callout that keeps failing must not keep a finite replay from ending
   * (the `run-finished` events and `runNow`'s results tell how runs ended).
   */
  idle(): Promise<void> {
    if (this.isIdle()) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /**
   * Stops accepting states, cancels the pending debounce, retry and resync, lets
   * an in-flight run finish within `graceMs` (default killGraceMs), then
   * terminates it (SIGTERM, SIGKILL killGraceMs later), then closes the
   * callout. Resolves when the run is over and nothing of it is left running.
   */
  stop(graceMs?: number): Promise<void> {
    if (this.stopping) return this.stopping;
    this.shutdown();
    this.callout.stopping?.();
    const cur = this.current;
    this.stopping = (async () => {
      if (cur) {
        const grace = Math.max(0, graceMs ?? this.killGraceMs);
        this.log.debug('waiting for the running callout', { run: cur.run, graceMs: grace });
        const t = this.timers.setTimeout(() => {
          this.log.info('stopping: terminating the running callout', { run: cur.run });
          cur.terminate();
        }, grace);
        await cur.done;
        this.timers.clearTimeout(t);
      }
      await this.callout.close('graceful');
      this.checkIdle();
    })();
    return this.stopping;
  }

  /**
   * Immediately SIGKILLs the in-flight run, background processes included
   * (and stops the runner). `idle()` and `stop()` resolve once the kill is
   * confirmed (bounded).
   */
  kill(): void {
    this.shutdown();
    if (this.current) {
      this.log.info('killing the running callout', { run: this.current.run });
      this.current.kill();
    }
    void this.callout.close('kill');
  }

  // --- state ----------------------------------------------------------------

  private shutdown(): void {
    this.stopped = true;
    this.clearWake();
    this.retry.clear();
    this.resync.stop();
    if (this.pending !== undefined) {
      this.pending = undefined;
      this.pendingSince = undefined;
      this.emit({ type: 'pending-changed', pending: false, at: this.now() });
    }
    for (const q of this.nowQueue.splice(0)) q.resolve({ ...NOT_RUN });
    this.checkIdle();
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

  private emit(e: RunnerEvent): void {
    emitEvent(this.onEvent, this.log, e);
  }

  // --- scheduling -----------------------------------------------------------

  /** Starts the next run if one is due, or arms the debounce timer. */
  private schedule(): void {
    this.clearWake();
    if (this.current || this.stopped) return; // the end of the current run schedules again
    const req = this.nowQueue.shift();
    if (req) {
      const o = req.options;
      // Compared when it comes to run: the runs queued before it set the baseline.
      if (o.skipIdentical && !o.full && this.skipsUnchanged(req.state, 'now', req.since, this.now())) {
        req.resolve({ run: 0, result: 'skipped', durationMs: 0, message: 'state unchanged since the last successful run' });
        this.schedule();
        return;
      }
      this.launch(
        req.state,
        'now',
        req.since,
        (r) => {
          if (r.result === 'ok') this.retry.clear(); // the newest state was applied
          else if (o.retry && !r.stopped && !this.stopped && !this.newerWaiting()) this.scheduleRetry(r);
          req.resolve(r);
        },
        o.full ?? false,
      );
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
    // A resync hands over the full state, also when it fell due while this state waited.
    const full = reason === 'resync' || this.force;
    this.pending = undefined;
    this.pendingSince = undefined;
    this.pendingReason = 'change';
    this.force = false;
    const at = this.now();
    this.emit({ type: 'pending-changed', pending: false, at });
    if (!force && this.skipsUnchanged(state, reason, since, at)) {
      this.checkIdle();
      return;
    }
    const retryOnFailure = (r: RunResult): void => {
      if (r.result !== 'ok' && !this.stopped && !this.newerWaiting()) this.scheduleRetry(r);
    };
    this.launch(state, reason, since, retryOnFailure, full);
  }

  /**
   * True (the skip logged and told) when `state` has nothing to run after the
   * last applied state: the same input; with change sets, an empty change set.
   */
  private skipsUnchanged(state: State, reason: RunReason, since: number | undefined, at: number): boolean {
    const applied = this.lastOk;
    if (applied === undefined || !(sameState(state, applied) || (this.changes && onlyReordered(applied, state)))) return false;
    this.log.debug('callout run skipped: state unchanged since the last successful run', { services: state.services, bytes: state.bytes });
    this.emit({ type: 'run-skipped', reason, pendingSince: since, at });
    return true;
  }

  /** A newer state waits (pending, or queued by runNow): it runs next anyway, no retry needed. */
  private newerWaiting(): boolean {
    return this.pending !== undefined || this.nowQueue.length > 0;
  }

  /** The newest state again, in full, after the backoff; unless a newer state or an armed retry hands it over anyway. */
  private retryAfterLoss(run: number, message: string): void {
    if (!this.retries || this.stopped || this.latest === undefined || this.newerWaiting() || this.retry.armed) return;
    this.scheduleRetry({ run, result: 'failed', durationMs: 0, message });
  }

  private scheduleRetry(failed: RunResult): void {
    const { delayMs, attempt } = this.retry.arm(() => {
      if (!this.stopped && this.latest !== undefined) this.setPendingNow(this.latest, 'retry');
    });
    this.log.info(`retrying the callout in ${delayMs}ms`, { run: failed.run, attempt, delayMs });
    this.emit({ type: 'retry-scheduled', run: failed.run, attempt, delayMs, at: this.now() });
  }

  /** The callout went away between runs: hand the newest state over again, in full, after the backoff. */
  private calloutLost(why: string): void {
    this.lastOk = undefined;
    if (this.stopped || this.latest === undefined) return;
    // During a run (its ack and a stray one in the same read): its end must not count it applied.
    if (this.current) {
      this.lostDuringRun = true;
      return;
    }
    this.retryAfterLoss(0, `callout ${why}`);
  }

  /** A resync period ended (resync-timer.ts). */
  private resyncEnded(): void {
    if (this.stopped || this.latest === undefined) return;
    if (this.pending !== undefined) {
      this.force = true; // the coming run is the resync: do not skip it
      return;
    }
    // Busy (a run, a queued runNow, a retry wait): after it, unless that run hands the state over in full.
    if (this.current || this.nowQueue.length > 0 || this.retry.armed) {
      this.resync.due = true;
      return;
    }
    this.log.debug('resync: re-running the newest state', { periodMs: this.resync.periodMs });
    this.setPendingNow(this.latest, 'resync');
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

  /** Starts a run; its input may be a change set from the last applied state unless `full`. */
  private launch(state: State, reason: RunReason, since: number | undefined, after: (r: RunResult) => void, full = false): void {
    const run = ++this.runCounter;
    this.log.debug('callout run started', { run, reason, services: state.services, bytes: state.bytes, input: state.origin });
    this.emit({ type: 'run-started', run, reason, pendingSince: since, at: this.now(), services: state.services, bytes: state.bytes });
    const previous = full ? undefined : this.lastOk;
    // With change sets, only a full input repairs drift: the resync period counts from the last full one.
    const inputFull = !this.changes || previous === undefined;
    const inflight = this.callout.start({ run, state, reason, previous });
    this.current = inflight;
    void inflight.written?.then(() => this.emit({ type: 'input-written', run, at: this.now() }));
    this.lostDuringRun = false;
    void inflight.done.then((r) => {
      this.current = undefined;
      const lost = this.lostDuringRun;
      this.lostDuringRun = false;
      // A failed run may have applied part of its state: do not skip the next one.
      this.lastOk = r.result === 'ok' && !lost ? state : undefined;
      if (r.result === 'ok') this.retry.succeeded();
      logRunFinished(this.log, r, state);
      this.emit({ type: 'run-finished', reason, pendingSince: since, at: this.now(), ...r });
      if (inputFull && !this.stopped) this.resync.restart();
      after(r);
      if (lost) this.retryAfterLoss(r.run, 'callout lost during the run');
      if (this.resync.due) {
        this.resync.due = false;
        this.resyncEnded();
      }
      this.schedule();
    });
  }
}
