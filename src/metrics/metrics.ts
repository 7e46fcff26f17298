/**
 * Observability state: Prometheus metrics (`/metrics`), liveness (`/healthz`) and
 * readiness (`/readyz`) on `--metrics-addr`; `/healthz` and `/readyz` alone
 * on `--health-addr` (metrics on loopback, probes on the node's address, as
 * kube-proxy splits them).
 *
 * `Metrics` is fed by the CLI from three places and knows nothing else:
 * runner events (`onRunnerEvent`), source status (`onSourceStatus`) and the
 * complete states the source pushes (`onState`). kpng-json has no runner: its
 * health and readiness follow the source alone.
 *
 * Health (kpng-callout): 200 while the source is synced and the last run
 * succeeded, or failed and is being retried (a retry is scheduled and not
 * overdue, or a newer run is pending or in progress); otherwise 503, the
 * reason in the body. Readiness: 200 from the first successful run on.
 * For kpng-json: health = the source is synced; ready = a state was printed.
 * A source that reports no status (replay) counts as synced from its first
 * state on.
 */
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { RunStatus } from '../runner/callout.js';
import type { RunnerEvent } from '../runner/scheduler.js';
import type { SourceStatus } from '../source.js';
import type { State } from '../state.js';

/** Options of {@link Metrics}. */
export interface MetricsOptions {
  /** True for kpng-callout (runs a callout); false for kpng-json (prints). */
  runner: boolean;
  /** Node's default process metrics (default true). */
  processMetrics?: boolean;
  /** Millisecond clock (default Date.now); must match the runner's clock. */
  now?: () => number;
}

/** Outcome of a health or readiness check: HTTP 200 when `ok`, else 503. */
export interface Check {
  ok: boolean;
  /** One line for the response body. */
  reason: string;
}

const RESULTS: RunStatus[] = ['ok', 'failed', 'timeout', 'signal', 'spawn-error', 'skipped'];
/** A retry may fire this late (a busy event loop) before health calls it overdue. */
const RETRY_SLACK_MS = 5000;

const P = 'kpng_callout_';

/** The metric set of one process, with its own registry. */
export class Metrics {
  /** The registry `/metrics` serves (not prom-client's global one). */
  readonly registry = new Registry();
  private readonly hasRunner: boolean;
  private readonly now: () => number;

  private readonly runs: Counter<'result'>;
  private readonly runDuration: Histogram;
  private readonly latency: Histogram;
  private readonly runPending: Gauge;
  private readonly runInProgress: Gauge;
  private readonly lastSuccess: Gauge;
  private readonly lastRunOk: Gauge;
  private readonly failures: Gauge;
  private readonly retries: Counter;
  private readonly backoff: Gauge;
  private readonly connected: Gauge;
  private readonly synced: Gauge;
  private readonly reconnects: Counter;
  private readonly statesTotal: Counter;
  private readonly services: Gauge;
  private readonly endpoints: Gauge;
  private readonly stateBytes: Gauge;

  // Source view.
  private statusKnown = false;
  private status: SourceStatus = { connected: false, synced: false, reconnects: 0 };
  private statesSeen = 0;
  // Runner view.
  private statePending = false;
  private retryDueAt: number | undefined;
  private retryAttempt = 0;
  private running: number | undefined;
  private lastResult: { run: number; result: RunStatus; message?: string | undefined } | undefined;
  private consecutiveFailures = 0;
  private firstSuccessAt: number | undefined;
  /** Earliest change not yet handed to a run (debouncing or waiting for the current run). */
  private waitingSince: number | undefined;
  /** Earliest change the run in progress applies. */
  private inflightSince: number | undefined;
  /** Earliest change whose run failed: still to be applied. */
  private unappliedSince: number | undefined;

  constructor(options: MetricsOptions) {
    this.hasRunner = options.runner;
    this.now = options.now ?? Date.now;
    const registers = [this.registry];
    if (options.processMetrics ?? true) collectDefaultMetrics({ register: this.registry });

    this.connected = new Gauge({ name: P + 'source_connected', help: '1 while the source has a stream/watch established', registers });
    this.synced = new Gauge({ name: P + 'source_synced', help: '1 while the current connection has delivered a complete state', registers });
    this.reconnects = new Counter({ name: P + 'source_reconnects_total', help: 'Reconnections of the source since start', registers });
    this.statesTotal = new Counter({ name: P + 'states_total', help: 'Complete states received from the source', registers });
    this.services = new Gauge({ name: P + 'services', help: 'Services in the current state', registers });
    this.endpoints = new Gauge({ name: P + 'endpoints', help: 'Endpoints in the current state', registers });
    this.stateBytes = new Gauge({ name: P + 'state_bytes', help: 'Size of the current state as NDJSON', registers });

    // Runner metrics exist only where there is a runner (kpng-json has none).
    const runnerRegisters = this.hasRunner ? registers : [];
    this.runs = new Counter({ name: P + 'runs_total', help: 'Callout runs by result (skipped: identical to the last successful input)', labelNames: ['result'], registers: runnerRegisters });
    for (const r of RESULTS) this.runs.inc({ result: r }, 0);
    this.runDuration = new Histogram({
      name: P + 'run_duration_seconds',
      help: 'Duration of callout runs, from spawn to exit',
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120],
      registers: runnerRegisters,
    });
    this.latency = new Histogram({
      name: P + 'programming_latency_seconds',
      help: 'From the first change of a state to the end of the successful run that applied it (debounce, queueing and retries included)',
      buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300],
      registers: runnerRegisters,
    });
    this.runPending = new Gauge({ name: P + 'run_pending', help: '1 while a run waits to start (for its debounce, for the run in progress, or as a scheduled retry)', registers: runnerRegisters });
    this.runInProgress = new Gauge({ name: P + 'run_in_progress', help: '1 while a callout process runs', registers: runnerRegisters });
    this.lastSuccess = new Gauge({ name: P + 'last_success_timestamp_seconds', help: 'Unix time of the end of the last successful run (0: none yet)', registers: runnerRegisters });
    this.lastRunOk = new Gauge({ name: P + 'last_run_success', help: '1 when the last finished run succeeded', registers: runnerRegisters });
    this.failures = new Gauge({ name: P + 'consecutive_failures', help: 'Failed runs since the last successful one', registers: runnerRegisters });
    this.retries = new Counter({ name: P + 'retries_total', help: 'Retries scheduled after failed runs', registers: runnerRegisters });
    this.backoff = new Gauge({ name: P + 'retry_backoff_seconds', help: 'Delay of the scheduled retry (0: none scheduled)', registers: runnerRegisters });
  }

  /** A complete state from the source (before it is run or printed). */
  onState(state: State): void {
    this.statesSeen++;
    this.statesTotal.inc();
    this.services.set(state.services);
    this.endpoints.set(state.endpoints);
    this.stateBytes.set(state.bytes);
    if (!this.statusKnown) {
      // Replay reports no status: having a state is being in sync.
      this.connected.set(1);
      this.synced.set(1);
    }
  }

  /** A status change of the source. */
  onSourceStatus(s: SourceStatus): void {
    this.statusKnown = true;
    const more = s.reconnects - this.status.reconnects;
    if (more > 0) this.reconnects.inc(more);
    this.status = { ...s };
    this.connected.set(s.connected ? 1 : 0);
    this.synced.set(s.synced ? 1 : 0);
  }

  /** A runner event (RunnerOptions.onEvent). */
  onRunnerEvent(e: RunnerEvent): void {
    switch (e.type) {
      case 'pending-changed':
        this.statePending = e.pending;
        if (e.pending) {
          // A pending state supersedes a scheduled retry.
          this.clearRetry();
          if (this.waitingSince === undefined && e.pendingSince !== undefined) this.waitingSince = e.pendingSince;
        }
        break;
      case 'run-started': {
        this.clearRetry();
        this.running = e.run;
        this.runInProgress.set(1);
        // A retry or resync re-runs known input: only real changes (and a
        // failed run's changes, carried over) count for the latency.
        const change = e.reason === 'change' || e.reason === 'now' ? (this.waitingSince ?? e.pendingSince) : undefined;
        this.inflightSince = minDefined(this.unappliedSince, change);
        this.unappliedSince = undefined;
        this.waitingSince = undefined;
        break;
      }
      case 'run-finished': {
        this.running = undefined;
        this.runInProgress.set(0);
        this.runs.inc({ result: e.result });
        this.runDuration.observe(e.durationMs / 1000);
        this.lastResult = { run: e.run, result: e.result, message: e.message };
        if (e.result === 'ok') {
          if (this.inflightSince !== undefined) this.latency.observe(Math.max(0, e.at - this.inflightSince) / 1000);
          this.consecutiveFailures = 0;
          this.firstSuccessAt ??= e.at;
          this.lastSuccess.set(e.at / 1000);
          this.lastRunOk.set(1);
        } else {
          this.unappliedSince = this.inflightSince;
          this.consecutiveFailures++;
          this.lastRunOk.set(0);
        }
        this.inflightSince = undefined;
        this.failures.set(this.consecutiveFailures);
        break;
      }
      case 'run-skipped':
        // Identical to what the last successful run applied: nothing to apply.
        this.runs.inc({ result: 'skipped' });
        this.waitingSince = undefined;
        break;
      case 'retry-scheduled':
        this.retries.inc();
        this.retryDueAt = e.at + e.delayMs;
        this.retryAttempt = e.attempt;
        this.backoff.set(e.delayMs / 1000);
        break;
    }
    this.runPending.set(this.statePending || this.retryDueAt !== undefined ? 1 : 0);
  }

  private clearRetry(): void {
    this.retryDueAt = undefined;
    this.backoff.set(0);
  }

  private sourceCheck(): Check {
    if (this.statusKnown) {
      if (this.status.synced) return { ok: true, reason: 'source synced' };
      const why = this.status.error ?? (this.status.connected ? 'connected, waiting for the first complete state' : 'not connected yet');
      return { ok: false, reason: `source not synced: ${why}` };
    }
    return this.statesSeen > 0 ? { ok: true, reason: 'source delivered a state' } : { ok: false, reason: 'source not synced: no complete state yet' };
  }

  /** Liveness, as /healthz reports it. */
  health(): Check {
    const src = this.sourceCheck();
    if (!src.ok || !this.hasRunner) return src;
    const last = this.lastResult;
    if (last === undefined) return { ok: true, reason: this.running !== undefined ? 'ok: first run in progress' : 'ok: waiting for the first run' };
    if (last.result === 'ok') return { ok: true, reason: `ok: run ${last.run} succeeded` };
    const failed = `run ${last.run} ${last.result}${last.message ? ` (${last.message})` : ''}`;
    if (this.running !== undefined) return { ok: true, reason: `ok: run ${this.running} in progress after ${failed}` };
    if (this.statePending) return { ok: true, reason: `ok: a new run is pending after ${failed}` };
    if (this.retryDueAt !== undefined) {
      const left = this.retryDueAt - this.now();
      if (left >= -RETRY_SLACK_MS) {
        return { ok: true, reason: `ok: retrying after ${failed}: retry ${this.retryAttempt} in ${(Math.max(0, left) / 1000).toFixed(1)}s` };
      }
      return { ok: false, reason: `${failed}; its retry is overdue by ${(-left / 1000).toFixed(1)}s` };
    }
    return { ok: false, reason: `${failed}; no retry scheduled` };
  }

  /** Readiness, as /readyz reports it. */
  readiness(): Check {
    if (!this.hasRunner) {
      return this.statesSeen > 0 ? { ok: true, reason: 'ready: a complete state was printed' } : { ok: false, reason: 'not ready: no complete state yet' };
    }
    if (this.firstSuccessAt !== undefined) return { ok: true, reason: `ready: first successful run at ${new Date(this.firstSuccessAt).toISOString()}` };
    const last = this.lastResult;
    return { ok: false, reason: `not ready: no successful run yet${last ? ` (last: run ${last.run} ${last.result})` : ''}` };
  }
}

function minDefined(a: number | undefined, b: number | undefined): number | undefined {
  if (a === undefined) return b;
  if (b === undefined) return a;
  return Math.min(a, b);
}
