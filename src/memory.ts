/**
 * Memory back after a burst: V8 keeps the heap it grew to while ingesting
 * (the garbage of a 40 MB initial list included) until allocation pressure
 * comes back, which for an idle daemon is never. Measured at 10,000 Services
 * (bench/kube.js): 167 MiB idle as left, 125 MiB after one full GC. So once
 * the pipeline has had no new state for `quietMs`, run V8's memory-reducing
 * collection (at most once per quiet period, never while states keep
 * coming), and two plain full collections later (see `createIdleCompactor`).
 *
 * The memory-reducing collection is what the inspector protocol's
 * `HeapProfiler.collectGarbage` runs (V8's low-memory notification: full
 * collections until nothing more is freed, and the young generation given
 * back), reached through an in-process inspector session (node:inspector's
 * Session: no port is opened). Measured at 10,000 Services: ~90-100 ms once,
 * and the idle daemon at 129-135 MiB 1 s after its last state, where a plain
 * full collection (~50 ms) left 164-167 MiB until V8 shrank its young
 * generation (32 MB after the ingest) by itself, ~5.5 s later.
 *
 * Only after a burst: a quiet period collects only when the heap (committed)
 * and its buffers grew by half since the last such collection (or the
 * start), and by at least `minGrowth`. A collection at 10,000 Services blocks for 40-60 ms (two
 * compacting passes, measured), and a change that arrives meanwhile waits for
 * it: collecting after every single-slice change put that wait into about one
 * change in ten when changes came a second apart (p99 36 ms against 9 ms).
 * A trickle of small changes is left to V8's own incremental collector.
 *
 * Sooner, a plain full collection after a burst (the heap's used part grew
 * so), at the first moment we only wait (`waiting`: a callout runs with its
 * whole input). Left to itself, V8
 * finished collecting the ingest's garbage during the first changes after a
 * first sync, in incremental steps of up to 12 ms and a 7 ms pause: 20-38 ms
 * for the changes it met, against 7 ms (measured at 10,000 Services). Run
 * while the callout reads, the same work (18-27 ms) delays only that run's
 * output we pass on and end, and the one change that comes in meanwhile.
 *
 * And from then on, a heap that may grow to twice what a full collection
 * kept (`steadyHeap`, V8's --heap-growing-percent, read at each collection):
 * V8's own choice after a first sync at 10,000 Services was ~1.2 times, and
 * the garbage of back-to-back changes (~130 KB each) then started a full
 * collection every ~70 changes, each one meeting a change (15-30 ms). With
 * twice, one per ~300 changes (measured). Not from the start: during the
 * ingest itself V8 grows the heap faster than that by itself.
 *
 * The plain collector is reached the way Node documents for code that cannot
 * set `--expose-gc` on its command line (our bins are started by npm shims,
 * containers and users): `v8.setFlagsFromString` then `vm.runInNewContext('gc')`.
 */
import { getHeapSpaceStatistics, getHeapStatistics, setFlagsFromString } from 'node:v8';
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

/**
 * V8's memory-reducing collection, run asynchronously (it returns at once,
 * and calls `done` once collected) through an in-process inspector session;
 * `fallback` (default: a plain full collection) where this Node has no
 * inspector (`hasInspector`) or the session fails.
 */
export function reducingGc(fallback: (() => void) | undefined = fullGc(), hasInspector: boolean = process.features.inspector): ((done?: () => void) => void) | undefined {
  if (!fallback && !hasInspector) return undefined;
  const plain = (done?: () => void): void => {
    fallback?.();
    done?.();
  };
  if (!hasInspector) return plain;
  return (done) => {
    // Loaded on first use: the module costs ~3 ms, which `kpng-json --once` never needs.
    import('node:inspector')
      .then(({ Session }) => {
        const session = new Session();
        session.connect();
        // Disconnecting from inside the callback leaves the process unable to exit (measured).
        session.post('HeapProfiler.collectGarbage', () =>
          setImmediate(() => {
            session.disconnect();
            done?.();
          }),
        );
      })
      .catch(() => plain(done));
  };
}

/**
 * What the heap (but its young generation) and the buffers outside it take
 * now (bytes): `committed`, what a memory-reducing collection can give back,
 * and `used`, what a full collection can free or keep. The young generation
 * is left out: it regrows by itself after a memory-reducing collection gave
 * it back (to 16-32 MB at the next few changes), which is no burst.
 */
export function footprint(): { committed: number; used: number } {
  const external = getHeapStatistics().external_memory;
  let committed = external;
  let used = external;
  for (const space of getHeapSpaceStatistics()) {
    if (space.space_name === 'new_space') continue;
    committed += space.space_size;
    used += space.space_used_size;
  }
  return { committed, used };
}

/** Lets V8's heap grow to (1 + percent/100) times what each full collection kept, from now on. */
export function heapGrowing(percent: number): void {
  setFlagsFromString(`--heap-growing-percent=${percent}`);
}

/** Options of {@link createIdleCompactor}. */
export interface IdleCompactorOptions {
  /** Quiet time after the last `poke` before collecting (ms). */
  quietMs: number;
  /** What collects first, once quiet; calls `done` once collected (default: {@link reducingGc}). */
  collectFirst?: ((done?: () => void) => void) | undefined;
  /** What collects later, twice (default: {@link fullGc}). */
  collect?: (() => void) | undefined;
  /** Quiet time after the first collection before the second, which shrinks the young generation (ms). Default {@link YOUNG_QUIET_MS}. */
  youngQuietMs?: number | undefined;
  /** The least growth of the footprint (committed once quiet, used when `waiting`) since the last collection that is worth one, bytes (half the footprint then, if more): a burst, not a trickle of single changes. */
  minGrowth: number;
  /** Called once, at the first `waiting` (before its collection, which sets the next limit): the steady state's heap settings. */
  steadyHeap?: (() => void) | undefined;
  /** Bytes held now (default: {@link footprint}; tests). */
  footprint?: (() => { committed: number; used: number }) | undefined;
  /** Timers (tests). */
  setTimeout?: ((fn: () => void, ms: number) => NodeJS.Timeout) | undefined;
}

/** Runs a full GC after each quiet period that follows a burst of new work (`poke`), and one more once V8 will shrink its young generation. */
export interface IdleCompactor {
  /** New work happened (a state arrived): collect after the next quiet period. */
  poke(): void;
  /** We only wait now (a callout runs with its input): a plain full collection at once, if a burst grew the heap since the last one. */
  waiting(): void;
  /** A source did a burst of work (read a whole list), whatever state it gave: the memory-reducing collection after the next quiet period, grown or not. */
  burst(): void;
  /** No more collections. */
  stop(): void;
}

export function createIdleCompactor(options: IdleCompactorOptions): IdleCompactor {
  const collect = options.collect ?? fullGc();
  const collectFirst = options.collectFirst ?? reducingGc(collect);
  const set = options.setTimeout ?? setTimeout;
  const held = options.footprint ?? footprint;
  const minGrowth = options.minGrowth;
  // Committed after the last memory-reducing collection, and used after the last collection of any kind.
  let { committed: since, used: sinceAny } = held();
  const grown = (now: number, from: number): boolean => now - from >= Math.max(minGrowth, from / 2);
  // A burst collected while waiting, or told (`burst`): what it left still goes back once quiet.
  let owed = false;
  let steadyHeap = options.steadyHeap;
  let timers: NodeJS.Timeout[] = [];
  let stopped = false;
  const young = options.youngQuietMs ?? YOUNG_QUIET_MS;
  const clear = (): void => {
    for (const t of timers) clearTimeout(t);
    timers = [];
  };
  const after = (ms: number, fn: () => void): void => {
    const timer = set(() => {
      if (!stopped) fn();
    }, ms);
    // Never what keeps the process alive.
    timer.unref?.();
    timers.push(timer);
  };
  const poke = (): void => {
    if (stopped || !collect) return;
    clear();
    // Once quiet: the memory-reducing collection. Again, plain, once V8
    // has seen YOUNG_QUIET_MS without allocation: then even a plain
    // collection shrinks the young generation (measured: V8 11 shrinks it
    // when the last 5 s allocated under 1 KB/ms), should the first not
    // have (no inspector in this Node).
    after(options.quietMs, () => {
      if (!owed && !grown(held().committed, since)) return;
      owed = false;
      const collected = (): void => {
        ({ committed: since, used: sinceAny } = held());
      };
      collectFirst?.(collected);
      // (A third time: V8's rate window does not always agree at the second, measured under load.)
      for (const ms of [young, 2 * young]) {
        after(ms, () => {
          // A rate of exactly 0 counts as unknown, not low (V8): allocate a
          // little, so that a process that allocated nothing at all since
          // the first collection is seen as idle too.
          sink.nudge = new Array<number>(64).fill(ms);
          collect();
          collected();
        });
      }
    });
  };
  return {
    poke,
    burst() {
      owed = true;
      poke();
    },
    waiting() {
      if (stopped) return;
      steadyHeap?.();
      steadyHeap = undefined;
      if (!collect || !grown(held().used, sinceAny)) return;
      collect();
      sinceAny = held().used;
      owed = true;
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
