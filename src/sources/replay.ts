/**
 * The replay source: fixture files (see fixture.ts) as successive states.
 *
 * Paths are files, directories (every fixture file in it, in name order) or
 * `-` (stdin); see replay/fixtures.ts. Without --watch every fixture is read
 * first (a bad one fails before anything runs), then each state is pushed in
 * order, awaiting the sink, so each run finishes before the next starts.
 * With --watch the same first pass runs, then the files are watched
 * (replay/watch.ts).
 *
 * Every state pushed carries `origin`: the fixture's name, for the logs.
 */
import { silentLogger, type Logger } from '../log.js';
import type { Source, StateSink } from '../source.js';
import type { State } from '../state.js';
import type { FixtureOptions } from './fixture.js';
import { expandPaths, loadSlot, warnIfEmpty } from './replay/fixtures.js';
import { runWatch } from './replay/watch.js';

/** Options of `createReplaySource`. */
export interface ReplayOptions extends FixtureOptions {
  /** Files, directories, `-` for stdin (at most once, not with `watch`). */
  paths: readonly string[];
  /** Keep watching and re-run on changes until aborted. */
  watch?: boolean | undefined;
  /** Push only the first state, then stop (`--once`). */
  once?: boolean | undefined;
  /** More files to watch (the callout): a change pushes the last state again. */
  watchExtra?: readonly string[] | undefined;
  /** Quiet time after the last file event before reloading (default DEFAULTS.debounceMs). */
  debounceMs?: number | undefined;
  /** Longest delay from the first file event of a burst to its reload (default DEFAULTS.maxWaitMs). */
  maxWaitMs?: number | undefined;
  /** Where `-` reads from (default process.stdin). */
  stdin?: NodeJS.ReadableStream | undefined;
  logger?: Logger | undefined;
  /** Poll instead of using fs events (network file systems, where no events come); default false. */
  usePolling?: boolean | undefined;
  /** With `usePolling`: how often each watched file and directory is stat'ed (default DEFAULTS.watchIntervalMs). */
  pollIntervalMs?: number | undefined;
}

/**
 * Checks replay paths before anything starts; returns a usage message or
 * undefined. (`-` at most once, and not with --watch.)
 */
export function checkReplayPaths(paths: readonly string[], watch: boolean): string | undefined {
  if (paths.length === 0) return 'replay needs at least one path';
  const stdins = paths.filter((p) => p === '-').length;
  if (stdins > 1) return '- (stdin) can be given only once';
  if (stdins > 0 && watch) return '--watch cannot watch - (stdin)';
  return undefined;
}

/** Creates the replay source. */
export function createReplaySource(options: ReplayOptions): Source {
  const opts = { ...options, logger: options.logger ?? silentLogger };
  const log = opts.logger;

  async function runSequential(sink: StateSink, signal: AbortSignal): Promise<void> {
    const slots = await expandPaths(opts.paths, false);
    // Read everything first: a bad fixture fails before any run.
    const states: State[] = [];
    for (const s of slots) {
      try {
        states.push(await loadSlot(s, opts, signal));
      } catch (err) {
        // Stopped while reading (stdin that stays open): nothing to run.
        if (signal.aborted) return;
        throw err;
      }
      if (opts.once) break;
    }
    for (const st of states) {
      if (signal.aborted) return;
      warnIfEmpty(st, log);
      await sink.push(st);
    }
  }

  return {
    run(sink: StateSink, signal: AbortSignal): Promise<void> {
      return opts.watch && !opts.once ? runWatch(opts, sink, signal) : runSequential(sink, signal);
    },
  };
}
