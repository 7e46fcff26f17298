/**
 * The seam between the scheduler and the callout. The scheduler decides
 * *when* a state runs (debounce, coalescing, retry, one at a time) and hands
 * it to a `Callout`, which decides *how*: today one process per run
 * (`CalloutProcess`); a long-lived process fed one frame per state is a second
 * implementation of the same interface, with the scheduler unchanged.
 * Types only.
 */
import type { State } from '../state.js';

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
  /** One-line description of a failure (also logged); set on every result but `ok`. */
  message?: string;
  /** errno code of a spawn error (ENOENT, EACCES, ...). */
  errorCode?: string;
  /**
   * Processes still running in the callout's process group after it exited
   * (background processes it started), which were then killed.
   */
  leftoverPids?: number[];
  /** We ended it (stop, kill): not the callout's failure, so not logged as one. */
  stopped?: boolean;
}

/** Why a run started. */
export type RunReason = 'change' | 'retry' | 'resync' | 'now';

/** One state to hand to the callout. */
export interface RunRequest {
  /** Run number, from 1 (KPNG_CALLOUT_RUN). */
  run: number;
  state: State;
  /** Why it runs. */
  reason: RunReason;
  /**
   * The state the callout last applied successfully, when this run may hand
   * over only what changed since (`--changes`); undefined when the input must
   * be the full state: the first run, any run after one that did not
   * succeed, a resync.
   */
  previous?: State | undefined;
}

/** A run in flight. */
export interface InFlight {
  readonly run: number;
  /** Resolves (never rejects) once the run is over and nothing it started is left running. */
  readonly done: Promise<RunResult>;
  /** Resolves (never rejects) once the input is handed over (stdin ended, or the callout stopped reading); a callout that has no such moment leaves it out. */
  readonly written?: Promise<void>;
  /** We are stopping: SIGTERM now, SIGKILL after the kill grace; the result is `stopped`. */
  terminate(): void;
  /** SIGKILL now (the result is `stopped`). */
  kill(): void;
}

/** Hands states to the callout. The scheduler never starts a run while another is in flight. */
export interface Callout {
  start(request: RunRequest): InFlight;
  /**
   * The runner stops: end whatever outlives a run (a persistent process: its
   * stdin closed and its exit awaited; with `kill`, SIGKILLed at once). Called
   * with `graceful` by stop() once the last run is over, with `kill` by
   * kill() at once (a run in flight is also killed through its handle);
   * either may follow the other. A process per run has nothing left.
   */
  close(how: 'graceful' | 'kill'): Promise<void>;
  /**
   * The runner is stopping (SIGINT/SIGTERM): no run will follow the one in
   * flight. A persistent callout's stdin is closed at once, so that it can
   * acknowledge its last frame and exit within the grace.
   */
  stopping?(): void;
  /**
   * A callout that outlives runs (persistent) tells here when it went away
   * between runs: the newest state must be handed over again, in full.
   */
  lost?(listener: (why: string) => void): void;
}

/** The variables we set for a callout, by mode and option: never passed through from our own environment. */
const OWN_VARIABLES = ['KPNG_CALLOUT_RUN', 'KPNG_CALLOUT_INPUT', 'KPNG_CALLOUT_MODE', 'KPNG_NODE_NAME'] as const;

/**
 * `base` without the variables we own (a `KPNG_CALLOUT_MODE` inherited from
 * a shell must not tell a callout it is persistent when it is not), as a
 * plain object. Copy it once, not at every run: each read of `process.env`
 * goes through the C++ environment (copying it took ~0.17 ms per run at
 * 10,000 Services, on the way to the spawn; measured).
 */
export function calloutBaseEnv(base: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...base };
  for (const name of OWN_VARIABLES) delete env[name];
  return env;
}

/** A callout's environment: `base` without the variables we own (see {@link calloutBaseEnv}), plus `own`. */
export function calloutEnv(base: NodeJS.ProcessEnv, own: Record<string, string>): NodeJS.ProcessEnv {
  return Object.assign(calloutBaseEnv(base), own);
}
