/**
 * Waiting in tests: a guard that turns a lost event into a quick, named
 * failure instead of a tap timeout, and a poll for the few things that have no
 * event to wait on (process state in /proc, a metrics endpoint, a connection).
 * Tests wait on events and output markers; these bound the wait, they never
 * stand in for it.
 */
import { setTimeout as sleep } from 'node:timers/promises';

/**
 * The bound on a wait for a built bin (start, a marker, an exit). Generous:
 * a guard against a hang, not a timing assertion; node startup on a loaded
 * 2-CPU machine can take seconds.
 */
export const WAIT_MS = 30_000;

/** Text of a failure, or a function that words it when it happens (with the state seen last). */
export type What = string | (() => string);

const word = (what: What): string => (typeof what === 'function' ? what() : what);

/** Rejects with `what` when `p` takes longer than `ms`. */
export async function within<T>(p: Promise<T>, what: What, ms = 8000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const guard = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms}ms ${word(what)}`)), ms);
  });
  try {
    return await Promise.race([p, guard]);
  } finally {
    clearTimeout(timer);
  }
}

/** What a truthy test lets through. */
type Truthy<T> = Exclude<T, false | 0 | '' | null | undefined>;

/**
 * Calls `condition` every `everyMs` until it returns a truthy value, and
 * resolves with that value; rejects naming `what` after `ms`. For state that
 * has no event (a pid gone from /proc, a metric reaching a value).
 */
export async function pollUntil<T>(
  condition: () => T | Promise<T>,
  what: What,
  ms = 10_000,
  everyMs = 20,
): Promise<Truthy<T>> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await condition();
    if (v) return v as Truthy<T>;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms}ms waiting for ${word(what)}`);
    await sleep(everyMs);
  }
}
