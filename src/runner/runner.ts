/**
 * The runner the pipeline uses: a `Scheduler` (when states run) driving a
 * `CalloutProcess` (one process group per run) or, with `persistent`, a
 * `PersistentCallout` (one long-lived process, a frame per state),
 * configured from one set of options. It knows nothing of gRPC, files or Kubernetes.
 */
import type { CalloutProcessOptions } from './callout-process.js';
import { CalloutProcess } from './callout-process.js';
import { PersistentCallout } from './persistent-callout.js';
import { Scheduler, type SchedulerOptions } from './scheduler.js';

/**
 * Options of a `Runner`: the scheduler's and the callout process's (the
 * callout itself comes from `file`, `args`, ...). Durations are in
 * milliseconds; omitted ones default to `DEFAULTS`. `killGraceMs` is both the
 * grace `stop()` gives a run in flight and the SIGTERM -> SIGKILL grace.
 */
export type RunnerOptions = Omit<SchedulerOptions, 'callout'> &
  CalloutProcessOptions & {
    /** `--persistent`: one long-lived callout fed a frame per state (persistent-callout.ts) instead of a process per run. */
    persistent?: boolean | undefined;
  };

/**
 * Runs the callout for states. `submit` is the daemon path (debounced,
 * coalesced, skip-identical, retried); `runNow` is the one-shot path; `idle`,
 * `stop` and `kill` end it (see `Scheduler`).
 */
export class Runner extends Scheduler {
  constructor(options: RunnerOptions) {
    super({ ...options, callout: options.persistent ? new PersistentCallout(options) : new CalloutProcess(options) });
  }
}
