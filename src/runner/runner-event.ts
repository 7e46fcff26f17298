/** What the scheduler reports as runs happen: events (metrics and benchmarks observe them) and the log line of a run's end. */
import type { Logger } from '../log.js';
import type { State } from '../state.js';
import type { RunReason, RunResult } from './callout.js';

/**
 * Runner events, for metrics. `at` is `now()` when the event happened;
 * `pendingSince` is when the state that runs first became pending (a burst of
 * coalesced changes counts from its first change).
 */
export type RunnerEvent =
  | { type: 'pending-changed'; pending: boolean; pendingSince?: number | undefined; at: number }
  | { type: 'run-started'; run: number; reason: RunReason; pendingSince?: number | undefined; at: number; services: number; bytes: number }
  /** The run's input is handed over: until the callout ends, we only wait (a moment for work of our own). */
  | { type: 'input-written'; run: number; at: number }
  | ({ type: 'run-finished'; reason: RunReason; pendingSince?: number | undefined; at: number } & RunResult)
  | { type: 'run-skipped'; reason: RunReason; pendingSince?: number | undefined; at: number }
  | { type: 'retry-scheduled'; run: number; attempt: number; delayMs: number; at: number };

/** A run's end in our log. The callout's stderr was already shown live: only a failure repeats its tail. */
export function logRunFinished(log: Logger, r: RunResult, state: State): void {
  const fields = { run: r.run, status: r.result, durationMs: r.durationMs, exitCode: r.exitCode, signal: r.signal, input: state.origin };
  const message = r.message ?? `callout run ${r.run} ${r.result}`;
  if (r.result === 'ok') log.info('callout run finished', fields);
  else if (r.stopped) log.info(message, fields);
  else if (r.result === 'spawn-error') log.error(message, { run: r.run, durationMs: r.durationMs, input: state.origin });
  else log.warn(message, { ...fields, stderr: r.stderrTail });
}

/** Hands `e` to `onEvent` (when there is one); an observer that throws is logged, never breaks the runner. */
export function emitEvent(onEvent: ((e: RunnerEvent) => void) | undefined, log: Logger, e: RunnerEvent): void {
  if (!onEvent) return;
  try {
    onEvent(e);
  } catch (err) {
    log.debug('runner event observer threw', { error: String(err) });
  }
}
