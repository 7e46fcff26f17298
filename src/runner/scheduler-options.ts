/**
 * The options of a `Scheduler` (scheduler.ts) and of its `runNow`, apart
 * from the scheduling itself; their defaults are `DEFAULTS` (defaults.ts).
 */
import type { Logger } from '../log.js';
import type { Callout } from './callout.js';
import type { RunnerEvent } from './runner-event.js';

/** Timer functions, injectable for tests (method syntax so the Node globals fit). */
export interface Timers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

/** Options of a `Scheduler`. Durations are in milliseconds; defaults from `DEFAULTS`. */
export interface SchedulerOptions {
  /** What runs the states. */
  callout: Callout;
  /** `--changes`: a state whose change set from the last applied one is empty (its lines merely reordered) is unchanged too. */
  changes?: boolean | undefined;
  /** Quiet time after the last change before a run; 0 runs at once. */
  debounceMs?: number | undefined;
  /** Upper bound from the first pending change to the run. */
  maxWaitMs?: number | undefined;
  /** How long `stop()` lets a run in flight finish before terminating it (by default). */
  killGraceMs?: number | undefined;
  /** Re-run the newest state this long after the last run even if identical (0 = off). */
  resyncPeriodMs?: number | undefined;
  /** First retry delay after a failure, doubling with jitter... */
  retryMinMs?: number | undefined;
  /** ...up to this cap. */
  retryMaxMs?: number | undefined;
  /** Our own log lines (default: silent). */
  logger?: Logger | undefined;
  /** Millisecond clock for event times (default Date.now). */
  now?: (() => number) | undefined;
  /** Timer functions (default the Node globals). */
  timers?: Timers | undefined;
  /** Observer of runner events (metrics). Must not throw. */
  onEvent?: ((e: RunnerEvent) => void) | undefined;
  /** Random source in [0,1) for the retry jitter (default Math.random). */
  random?: (() => number) | undefined;
}

/** How a `runNow` state is treated; by default it runs once, whatever the last run was. */
export interface RunNowOptions {
  /** Skip it (result `skipped`) when it equals the last successful run's input (a change set would be empty). */
  skipIdentical?: boolean | undefined;
  /** On failure, retry the newest state with the backoff, as the daemon path does (replay --watch). */
  retry?: boolean | undefined;
  /** Hand it over in full, never as a change set (the callout program changed). */
  full?: boolean | undefined;
}

/** The Node globals, the default `timers`. */
export const nodeTimers: Timers = { setTimeout: (fn, ms) => setTimeout(fn, ms), clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout) };
