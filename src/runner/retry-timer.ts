/**
 * The scheduler's retry clock (scheduler.ts): at most one retry armed, after
 * the jittered backoff (`backoffDelay`) of the failures in a row.
 */
import { backoffDelay } from '../backoff.js';
import type { Timers } from './scheduler-options.js';

export class RetryTimer {
  private timer: unknown;
  /** Failures in a row (the backoff's exponent). */
  private attempt = 0;

  constructor(
    private readonly backoff: { minMs: number; maxMs: number },
    private readonly random: () => number,
    private readonly timers: Timers,
  ) {}

  /** A retry is armed. */
  get armed(): boolean {
    return this.timer !== undefined;
  }

  /** Arms the retry (instead of one armed); `fire` runs when it is due. Returns its delay and its number in the row. */
  arm(fire: () => void): { delayMs: number; attempt: number } {
    this.clear();
    const delayMs = backoffDelay(this.attempt, this.backoff, this.random);
    this.attempt++;
    this.timer = this.timers.setTimeout(() => {
      this.timer = undefined;
      fire();
    }, delayMs);
    return { delayMs, attempt: this.attempt };
  }

  clear(): void {
    if (this.timer !== undefined) this.timers.clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** A run succeeded: the next failure starts the backoff again. */
  succeeded(): void {
    this.attempt = 0;
  }
}
