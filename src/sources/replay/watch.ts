/**
 * replay --watch: after a first pass over every fixture, changes (seen by
 * watcher.ts) are debounced with the runner's rule (debounce.ts) and handled
 * one batch at a time, awaiting the sink. A changed fixture is reloaded and
 * pushed when its state differs from its previous good one; a fixture that
 * fails to parse is reported once (file:line:col: reason) and its last good
 * state stays in force; a callout change pushes the last state again. Runs
 * until the signal aborts.
 */
import { readFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { debounceDue } from '../../debounce.js';
import { DEFAULTS } from '../../defaults.js';
import { CalloutError } from '../../errors.js';
import type { Logger } from '../../log.js';
import type { StateSink } from '../../source.js';
import { sameState, type State } from '../../state.js';
import type { FixtureOptions } from '../fixture.js';
import { expandPaths, parseSlot, readSlot, warnIfEmpty, type Slot } from './fixtures.js';
import { watchFiles } from './watcher.js';

/** What --watch needs to know (ReplayOptions, with the logger settled). */
export interface WatchOptions extends FixtureOptions {
  /** Files and directories (`-`, stdin, is read but not watched). */
  paths: readonly string[];
  /** Where `-` reads from (default process.stdin). */
  stdin?: NodeJS.ReadableStream | undefined;
  /** More files to watch (the callout): a change pushes the last state again. */
  watchExtra?: readonly string[] | undefined;
  /** Quiet time after the last file event before reloading. */
  debounceMs?: number | undefined;
  /** Longest delay from the first file event of a burst to its reload. */
  maxWaitMs?: number | undefined;
  /** Poll instead of using fs events (network file systems, where no events come). */
  usePolling?: boolean | undefined;
  /** With `usePolling`: how often each watched file and directory is stat'ed. */
  pollIntervalMs?: number | undefined;
  logger: Logger;
}

/** Per fixture: the content last read, its state when it parsed, the error reported for it. */
interface FixtureRecord {
  data?: Buffer | undefined;
  good?: State | undefined;
  error?: string | undefined;
}

/** Runs replay --watch until `signal` aborts. */
export async function runWatch(options: WatchOptions, sink: StateSink, signal: AbortSignal): Promise<void> {
  const log = options.logger;
  const debounceMs = Math.max(0, options.debounceMs ?? DEFAULTS.debounceMs);
  const maxWaitMs = Math.max(debounceMs, options.maxWaitMs ?? DEFAULTS.maxWaitMs);
  const polling = options.usePolling ?? false;
  const pollMs = Math.max(1, options.pollIntervalMs ?? DEFAULTS.watchIntervalMs);
  const files = new Map<string, FixtureRecord>();
  const extra = new Map<string, Buffer | undefined>(); // callout path -> content last run
  const extraNames = new Map<string, string>(); // callout path -> as given
  for (const p of options.watchExtra ?? []) {
    extra.set(resolve(p), await readFile(p).catch(() => undefined));
    extraNames.set(resolve(p), p);
  }

  // Changes waiting for the batch, and the debounce over them.
  const pending = new Set<string>();
  let wake: (() => void) | undefined;
  let timer: NodeJS.Timeout | undefined;
  let firstEventAt = 0;
  const flush = (): void => {
    timer = undefined;
    firstEventAt = 0;
    const w = wake;
    wake = undefined;
    w?.();
  };
  const watchedPaths = options.paths.filter((p) => p !== '-');
  const watcher = await watchFiles({
    paths: watchedPaths,
    extra: [...extra.keys()],
    usePolling: polling,
    pollIntervalMs: pollMs,
    log,
    onChange: (abs) => {
      pending.add(abs);
      const now = Date.now();
      if (firstEventAt === 0) firstEventAt = now;
      if (timer) clearTimeout(timer);
      timer = setTimeout(flush, Math.max(0, debounceDue(firstEventAt, now, debounceMs, maxWaitMs) - now));
    },
  });

  let last: State | undefined;
  const push = async (st: State): Promise<void> => {
    last = st;
    await sink.push(st);
  };
  /** Reads a fixture; its state when it changed and parses, else undefined (errors reported once per content). */
  const reload = async (slot: Slot): Promise<State | undefined> => {
    const f = files.get(slot.abs) ?? {};
    files.set(slot.abs, f);
    let data: Buffer;
    try {
      data = await readSlot(slot, options.stdin);
    } catch (err) {
      if (!(err instanceof CalloutError)) throw err;
      if (f.data !== undefined || f.good) log.info(`${slot.name}: gone; keeping its last good state until it comes back`);
      else if (f.error !== err.message) log.error(err.message);
      f.error = err.message;
      f.data = undefined;
      return undefined;
    }
    if (f.data?.equals(data)) return undefined; // touched, not changed
    f.data = data;
    let st: State;
    try {
      st = parseSlot(slot, data, options);
    } catch (err) {
      if (!(err instanceof CalloutError)) throw err;
      if (f.error !== err.message) log.error(err.message + (f.good ? ' (keeping its last good state)' : ''));
      f.error = err.message;
      return undefined;
    }
    f.error = undefined;
    const prev = f.good;
    f.good = st;
    if (prev && sameState(prev, st)) {
      log.debug(`${slot.name}: same state`);
      return undefined;
    }
    return st;
  };

  try {
    // Ready before the first pass: no edit made after the first run can be missed.
    await watcher.ready;
    for (const slot of await expandPaths(options.paths, true, log)) {
      if (signal.aborted) return;
      const st = await reload(slot);
      if (!st) continue;
      warnIfEmpty(st, log);
      await push(st);
    }
    const watched = [...watchedPaths, ...(options.watchExtra ?? [])];
    log.info(`watching ${watched.join(', ')} for changes${polling ? ` (polling every ${pollMs} ms)` : ''}`);

    const aborted = new Promise<void>((res) => signal.addEventListener('abort', () => res(), { once: true }));
    while (!signal.aborted) {
      if (pending.size === 0 || timer) {
        // Nothing to do, or still debouncing.
        await Promise.race([new Promise<void>((res) => (wake = res)), aborted]);
        continue;
      }
      const changed = new Set(pending);
      pending.clear();
      let calloutChanged: string | undefined;
      for (const [abs, before] of extra) {
        if (!changed.has(abs)) continue;
        const now = await readFile(abs).catch(() => undefined);
        if (now && !(before && before.equals(now))) calloutChanged = extraNames.get(abs);
        if (now) extra.set(abs, now);
      }
      let pushed = false;
      // Changed fixtures in sequence order (a directory may have gained files).
      for (const slot of await expandPaths(options.paths, true, log)) {
        if (signal.aborted) return;
        if (!changed.has(slot.abs)) continue;
        const st = await reload(slot);
        if (!st) continue;
        log.info(`${slot.name}: changed, running`);
        warnIfEmpty(st, log);
        // The callout changed in the same batch: its first run is in full too.
        if (calloutChanged !== undefined && !pushed) {
          last = st;
          await sink.push(st, { again: true });
        } else await push(st);
        pushed = true;
      }
      if (calloutChanged !== undefined && !pushed && last && !signal.aborted) {
        log.info(`${calloutChanged}: callout changed, running ${last.origin ?? 'the last state'} again`);
        await sink.push(last, { again: true });
      }
    }
  } finally {
    if (timer) clearTimeout(timer);
    await watcher.close();
  }
}
