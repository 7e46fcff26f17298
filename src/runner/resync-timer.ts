/**
 * The scheduler's `--resync-period` clock (scheduler.ts): a full state every
 * period, however busy the source.
 *
 * The period counts from the last run whose input was full: with change sets
 * (`--changes`) a change-set run repairs no drift, so it must not postpone
 * the resync (kube-proxy times its full syncs from the last full one too).
 * A period that ends while the scheduler is busy (a run, a retry wait, a
 * queued run) is remembered (`due`) and taken when it is free, unless the run
 * that kept it busy handed its state over in full (`restart` forgets it).
 */
import type { Timers } from './scheduler-options.js';

export class ResyncTimer {
  private timer: unknown;
  /** The period ended while the scheduler was busy: resync when it is free. */
  due = false;

  constructor(
    /** 0: no resync. */
    readonly periodMs: number,
    private readonly timers: Timers,
    /** Called when a period ends. */
    private readonly ended: () => void,
  ) {}

  /** A full input was handed over: a new period starts. */
  restart(): void {
    this.due = false;
    this.stop();
    if (this.periodMs <= 0) return;
    this.timer = this.timers.setTimeout(() => {
      this.timer = undefined;
      this.ended();
    }, this.periodMs);
  }

  stop(): void {
    if (this.timer !== undefined) this.timers.clearTimeout(this.timer);
    this.timer = undefined;
  }
}
