/**
 * Memory back after a burst: V8 keeps the heap it grew to while ingesting
 * (the garbage of a 40 MB initial list included) until allocation pressure
 * comes back, which for an idle daemon is never. Measured at 10,000 Services
 * (bench/kube.js): 167 MiB idle as left, 125 MiB after one full GC. So once
 * the pipeline has had no new state for `quietMs`, run one full GC (about
 * 50 ms at that size; at most once per quiet period, never while states
 * keep coming).
 *
 * The collector is reached the way Node documents for code that cannot set
 * `--expose-gc` on its command line (our bins are started by npm shims,
 * containers and users): `v8.setFlagsFromString` then `vm.runInNewContext('gc')`.
 */
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/** A full garbage collection, if this Node lets us run one. */
export function fullGc(): (() => void) | undefined {
  const existing = (globalThis as { gc?: () => void }).gc;
  if (typeof existing === 'function') return existing;
  try {
    setFlagsFromString('--expose-gc');
    const gc: unknown = runInNewContext('gc');
    return typeof gc === 'function' ? (gc as () => void) : undefined;
  } catch {
    return undefined;
  }
}

/** Options of {@link createIdleCompactor}. */
export interface IdleCompactorOptions {
  /** Quiet time after the last `poke` before collecting (ms). */
  quietMs: number;
  /** What collects (default: {@link fullGc}). */
  collect?: (() => void) | undefined;
  /** Timers (tests). */
  setTimeout?: ((fn: () => void, ms: number) => NodeJS.Timeout) | undefined;
}

/** Runs one full GC after each quiet period that follows new work (`poke`). */
export interface IdleCompactor {
  /** New work happened (a state arrived): collect after the next quiet period. */
  poke(): void;
  /** No more collections. */
  stop(): void;
}

export function createIdleCompactor(options: IdleCompactorOptions): IdleCompactor {
  const collect = options.collect ?? fullGc();
  const set = options.setTimeout ?? setTimeout;
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  return {
    poke() {
      if (stopped || !collect) return;
      if (timer) clearTimeout(timer);
      timer = set(() => {
        timer = undefined;
        if (!stopped) collect();
      }, options.quietMs);
      // Never what keeps the process alive.
      timer.unref?.();
    },
    stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      timer = undefined;
    },
  };
}
