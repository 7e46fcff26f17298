/**
 * Memory back after a burst: V8 keeps the heap it grew to while ingesting
 * (the garbage of a 40 MB initial list included) until allocation pressure
 * comes back, which for an idle daemon is never. Measured at 10,000 Services
 * (bench/kube.js): 167 MiB idle as left, 125 MiB after one full GC. So once
 * the pipeline has had no new state for `quietMs`, run one full GC (about
 * 50 ms at that size; at most once per quiet period, never while states
 * keep coming), and another 5.5 s later for the young generation (see
 * `createIdleCompactor`).
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
  /** Quiet time after the first collection before the second, which shrinks the young generation (ms). Default {@link YOUNG_QUIET_MS}. */
  youngQuietMs?: number | undefined;
  /** Timers (tests). */
  setTimeout?: ((fn: () => void, ms: number) => NodeJS.Timeout) | undefined;
}

/** Runs a full GC after each quiet period that follows new work (`poke`), and one more once V8 will shrink its young generation. */
export interface IdleCompactor {
  /** New work happened (a state arrived): collect after the next quiet period. */
  poke(): void;
  /** No more collections. */
  stop(): void;
}

export function createIdleCompactor(options: IdleCompactorOptions): IdleCompactor {
  const collect = options.collect ?? fullGc();
  const set = options.setTimeout ?? setTimeout;
  let timers: NodeJS.Timeout[] = [];
  let stopped = false;
  const clear = (): void => {
    for (const t of timers) clearTimeout(t);
    timers = [];
  };
  return {
    poke() {
      if (stopped || !collect) return;
      clear();
      // Once quiet: the old generation's garbage. Again once V8 has seen
      // YOUNG_QUIET_MS without allocation: only then does a collection also
      // shrink the young generation, which the burst grew to 32 MB (measured:
      // V8 11 shrinks it when the last 5 s allocated under 1 KB/ms).
      const young = options.youngQuietMs ?? YOUNG_QUIET_MS;
      // (A third time: V8's rate window does not always agree at the second, measured under load.)
      for (const ms of [options.quietMs, options.quietMs + young, options.quietMs + 2 * young]) {
        const timer = set(() => {
          if (stopped) return;
          // A rate of exactly 0 counts as unknown, not low (V8): allocate a
          // little, so that a process that allocated nothing at all since
          // the first collection is seen as idle too.
          sink.nudge = new Array<number>(64).fill(ms);
          collect();
        }, ms);
        // Never what keeps the process alive.
        timer.unref?.();
        timers.push(timer);
      }
    },
    stop() {
      stopped = true;
      clear();
    },
  };
}

/** Kept so that the allocation that makes V8 see a low rate is not optimized away. */
const sink = { nudge: [] as number[] };
/** How long after the first collection the second runs (ms): V8's allocation-rate window (5 s) and some margin. */
export const YOUNG_QUIET_MS = 5500;
