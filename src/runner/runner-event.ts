/** What the scheduler reports as runs happen (metrics and benchmarks observe it). Types only. */
import type { RunReason, RunResult } from './callout.js';

/**
 * Runner events, for metrics. `at` is `now()` when the event happened;
 * `pendingSince` is when the state that runs first became pending (a burst of
 * coalesced changes counts from its first change).
 */
export type RunnerEvent =
  | { type: 'pending-changed'; pending: boolean; pendingSince?: number | undefined; at: number }
  | { type: 'run-started'; run: number; reason: RunReason; pendingSince?: number | undefined; at: number; services: number; bytes: number }
  | ({ type: 'run-finished'; reason: RunReason; pendingSince?: number | undefined; at: number } & RunResult)
  | { type: 'run-skipped'; reason: RunReason; pendingSince?: number | undefined; at: number }
  | { type: 'retry-scheduled'; run: number; attempt: number; delayMs: number; at: number };
