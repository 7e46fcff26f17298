/**
 * replay --watch: after a first pass over every fixture, changes (seen by
 * watcher.ts) are debounced with the runner's rule (debounce.ts) and handled
 * one batch at a time, awaiting the sink. A changed fixture is reloaded and
 * pushed when its state differs from its previous good one; a fixture that
 * fails to parse is reported once (file:line:col: reason) and its last good
 * state stays in force; a callout change pushes the last state again. Runs
 * until the signal aborts.
 *
 * A file may be seen while it is being written (a program writing in steps,
 * an editor truncating then writing): a changed fixture that looks cut short
 * (empty, or its last line not ended; a cut JSON document fails to parse
 * instead) is read once it has been still for SETTLE_QUIET_MS, and so is a
 * changed callout that looks cut short (an empty one is never run); a changed
 * fixture of 0 bytes (made or truncated, its content to come) is not run
 * either.
 */
import { setTimeout as delay } from 'node:timers/promises';
import { open, readFile, stat } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
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

/** Per fixture: the content last read, its state when it parsed, the error reported for it, whether its absence was told. */
interface FixtureRecord {
  data?: Buffer | undefined;
  good?: State | undefined;
  error?: string | undefined;
  goneTold?: boolean;
}

/** How long a file that may still be written must stay unchanged (size, times) before it is read. */
const SETTLE_QUIET_MS = 500;
const SETTLE_POLL_MS = 50;
/** A file written without a pause for this long is read as it is. */
const SETTLE_MAX_MS = 5000;

/** Content (or its last byte) that may be the start of a longer one: empty, or its last line not ended. */
const unended = (tail: Buffer): boolean => tail.length === 0 || tail[tail.length - 1] !== 0x0a;

/**
 * A fixture file that may be being written: `unended` (a JSON document that
 * is cut does not parse instead). Reads only its last byte.
 */
async function looksCut(slot: Slot): Promise<boolean> {
  const fh = await open(slot.abs).catch(() => undefined);
  if (!fh) return false;
  try {
    const { size } = await fh.stat();
    const { buffer, bytesRead } = await fh.read(Buffer.alloc(1), 0, Math.min(1, size), Math.max(0, size - 1));
    return unended(buffer.subarray(0, bytesRead)) && (size === 0 || !slot.name.toLowerCase().endsWith('.json'));
  } finally {
    await fh.close();
  }
}

/** Resolves once `abs` has not changed (size, modification and change times) for SETTLE_QUIET_MS, or is gone. */
async function stillFor(abs: string, signal: AbortSignal): Promise<void> {
  const sig = (): Promise<string> => stat(abs).then((st) => `${st.size}:${st.mtimeMs}:${st.ctimeMs}:${st.ino}`, () => 'gone');
  const start = Date.now();
  let last = await sig();
  let quietSince = Date.now();
  while (!signal.aborted && Date.now() - quietSince < SETTLE_QUIET_MS && Date.now() - start < SETTLE_MAX_MS) {
    await delay(SETTLE_POLL_MS);
    const now = await sig();
    if (now !== last) {
      last = now;
      quietSince = Date.now();
    }
  }
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
  /** Ends the wait of the loop below (a batch is due, or the stop). */
  const wakeUp = (): void => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const flush = (): void => {
    timer = undefined;
    firstEventAt = 0;
    wakeUp();
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

  /**
   * Directory arguments seen as directories (absolute) -> whether it was
   * empty when last seen and that was told (once per time it is empty). One
   * that goes is told as gone, not as an error.
   */
  const dirArgs = new Map<string, boolean>();
  const expand = (): Promise<Slot[]> =>
    expandPaths(options.paths, true, ({ name, abs, fixtures }) => {
      if (fixtures === 0 && dirArgs.get(abs) !== true) log.warn(`${name}: no fixture files yet; watching`);
      dirArgs.set(abs, fixtures === 0);
      // Back: its going again is told again.
      const f = files.get(abs);
      if (f) f.goneTold = false;
    });
  let last: State | undefined;
  const push = async (st: State): Promise<void> => {
    last = st;
    await sink.push(st);
  };
  /**
   * Reads a fixture; its state when it changed and parses, else undefined
   * (errors reported once per content). `changed`: read after a change, when
   * a 0-byte fixture is one being written (not run).
   */
  const reload = async (slot: Slot, changed = false): Promise<State | undefined> => {
    const f = files.get(slot.abs) ?? {};
    files.set(slot.abs, f);
    let data: Buffer;
    try {
      data = await readSlot(slot, options.stdin);
    } catch (err) {
      if (!(err instanceof CalloutError)) throw err;
      if (!f.goneTold) {
        if (f.data !== undefined || f.good) {
          log.info(`${slot.name}: gone; keeping its last good state until it comes back`);
          f.goneTold = true;
        } else if (dirArgs.has(slot.abs)) {
          // A directory argument deleted or renamed away: its fixtures' states stay, as a file's does.
          log.info(`${slot.name}: gone; ${dirArgs.get(slot.abs) ? 'watching for it to come back' : 'keeping the last good states of its fixtures until it comes back'}`);
          f.goneTold = true;
          // Back empty: told again.
          dirArgs.set(slot.abs, false);
        } else if (f.error !== err.message) log.error(err.message);
      }
      f.error = err.message;
      f.data = undefined;
      return undefined;
    }
    f.goneTold = false;
    if (f.data?.equals(data)) return undefined; // touched, not changed
    if (changed && data.length === 0) {
      // Made or truncated and not written yet (`kubectl get … > file` truncates at once, writes at the end).
      log.info(`${slot.name}: empty; waiting for its content (a file holding only a newline is an empty state)`);
      f.data = data;
      return undefined;
    }
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
    for (const slot of await expand()) {
      if (signal.aborted) return;
      const st = await reload(slot);
      if (!st) continue;
      warnIfEmpty(st, log);
      await push(st);
    }
    const watched = [...watchedPaths, ...(options.watchExtra ?? [])];
    if (signal.aborted) return;
    log.info(`watching ${watched.join(', ')} for changes${polling ? ` (polling every ${pollMs} ms)` : ''}`);

    // The stop wakes the wait below too. (Not a Promise.race with one promise for the whole loop: each
    // race would leave a reaction on it until the stop, a leak of one per batch for the life of the watch.)
    signal.addEventListener('abort', wakeUp, { once: true });
    while (!signal.aborted) {
      if (pending.size === 0 || timer) {
        // Nothing to do, or still debouncing.
        await new Promise<void>((res) => (wake = res));
        continue;
      }
      const changed = new Set(pending);
      pending.clear();
      let calloutChanged: string | undefined;
      for (const [abs, before] of extra) {
        if (!changed.has(abs)) continue;
        // A program may be rewritten in place: one that looks cut short is read once still; an empty one is
        // not run (its content follows).
        let now = await readFile(abs).catch(() => undefined);
        if (now && unended(now) && !before?.equals(now)) {
          await stillFor(abs, signal);
          now = await readFile(abs).catch(() => undefined);
        }
        if (now && now.length > 0 && !(before && before.equals(now))) calloutChanged = extraNames.get(abs);
        if (now && now.length > 0) extra.set(abs, now);
      }
      let pushed = false;
      // Changed fixtures in sequence order (a directory may have gained files); a directory argument
      // reported as a whole (it appeared, or was made again) stands for each of its fixtures.
      const slots = (await expand()).filter((slot) => changed.has(slot.abs) || changed.has(dirname(slot.abs)));
      // Those that may still be being written are read once still, all in one wait.
      await Promise.all(slots.map(async (slot) => (slot.abs !== '' && (await looksCut(slot)) ? stillFor(slot.abs, signal) : undefined)));
      for (const slot of slots) {
        if (signal.aborted) return;
        const st = await reload(slot, true);
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
    signal.removeEventListener('abort', wakeUp);
    if (timer) clearTimeout(timer);
    await watcher.close();
  }
}
