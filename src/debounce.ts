/**
 * The one debounce rule, shared by the runner (states) and replay --watch
 * (file events), as consul-template's wait {min, max}: act after `debounceMs`
 * of quiet, but no later than `maxWaitMs` after the first event of a burst.
 */

/** When a burst that began at `firstAt` and last moved at `lastAt` is due (milliseconds on the same clock). */
export function debounceDue(firstAt: number, lastAt: number, debounceMs: number, maxWaitMs: number): number {
  return Math.min(lastAt + debounceMs, firstAt + maxWaitMs);
}
