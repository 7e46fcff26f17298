/**
 * The runner the pipeline uses: a `Scheduler` (when states run) driving a
 * `CalloutProcess` (one process group per run), configured from one set of
 * options. It knows nothing of gRPC, files or Kubernetes.
 */
import type { CalloutProcessOptions } from './callout-process.js';
import { CalloutProcess } from './callout-process.js';
import { Scheduler, type SchedulerOptions } from './scheduler.js';

/**
 * Options of a `Runner`: the scheduler's and the callout process's (the
 * callout itself comes from `file`, `args`, ...). Durations are in
 * milliseconds; omitted ones default to `DEFAULTS`. `killGraceMs` is both the
 * grace `stop()` gives a run in flight and the SIGTERM -> SIGKILL grace.
 */
export type RunnerOptions = Omit<SchedulerOptions, 'callout'> & CalloutProcessOptions;

/**
 * Runs the callout for states. `submit` is the daemon path (debounced,
 * coalesced, skip-identical, retried); `runNow` is the one-shot path; `idle`,
 * `stop` and `kill` end it (see `Scheduler`).
 */
export class Runner extends Scheduler {
  constructor(options: RunnerOptions) {
    super({ ...options, callout: new CalloutProcess(options) });
  }
}
