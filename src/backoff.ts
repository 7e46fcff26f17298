/**
 * The one retry backoff: capped exponential with ±20% jitter, used by the
 * runner (failed runs), the kpng source (reconnects) and the kube source
 * (list/watch restarts). The jitter matters: after an API server restart,
 * identical nodes must not all retry in lockstep.
 */

/** Bounds of a backoff, in milliseconds. */
export interface BackoffBounds {
  /** Delay before the first retry. */
  minMs: number;
  /** Longest delay. */
  maxMs: number;
}

/** How far either way the jitter moves a delay (0.2 = ±20%). */
const JITTER = 0.2;

/**
 * The delay before retry number `attempt` (0 for the first retry after a
 * failure): `minMs * 2^attempt`, capped at `maxMs`, then moved by up to ±20%
 * (never past `maxMs`, never below 1 ms). `random` returns a value in [0, 1).
 */
export function backoffDelay(attempt: number, bounds: BackoffBounds, random: () => number = Math.random): number {
  const base = Math.min(bounds.maxMs, bounds.minMs * 2 ** Math.min(Math.max(0, attempt), 40));
  const jittered = base * (1 - JITTER + 2 * JITTER * random());
  return Math.max(1, Math.round(Math.min(bounds.maxMs, jittered)));
}
