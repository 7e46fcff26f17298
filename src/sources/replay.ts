/**
 * The replay source: fixture files (see fixture.ts) as successive states.
 *
 * Paths are files, directories (every fixture file in it, in name order) or
 * `-` (stdin). Without --watch every fixture is read first (a bad one fails
 * before anything runs), then each state is pushed in order, awaiting the
 * sink, so each run finishes before the next starts.
 *
 * With --watch the same first pass runs, then the paths (and the callout,
 * when it is a file) are watched with chokidar. Changes are debounced and
 * handled one batch at a time, awaiting the sink: a changed fixture is
 * reloaded and pushed when its state differs from its previous good one; a
 * fixture that fails to parse is reported once (file:line:col: reason) and
 * its last good state stays in force; a callout change pushes the last state
 * again. The watcher runs until the signal aborts.
 */
import { readdir, readFile, stat } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import { watch, type FSWatcher } from 'chokidar';
import { CalloutError } from '../errors.js';
import { compareUtf8 } from '../gojson.js';
import { silentLogger, type Logger } from '../log.js';
import type { Source, StateSink } from '../source.js';
import { sameState, type State } from '../state.js';
import { isFixtureName, parseFixture, type FixtureOptions } from './fixture.js';

/** Options of `createReplaySource`. */
export interface ReplayOptions extends FixtureOptions {
  /** Files, directories, `-` for stdin (at most once, not with `watch`). */
  paths: readonly string[];
  /** Keep watching and re-run on changes until aborted. */
  watch?: boolean;
  /** Push only the first state, then stop (`--once`). */
  once?: boolean;
  /** More files to watch (the callout): a change pushes the last state again. */
  watchExtra?: readonly string[];
  /** Quiet time after the last file event before reloading (default 100 ms). */
  debounceMs?: number;
  /** Longest delay from the first file event of a burst to its reload (default 1000 ms). */
  maxWaitMs?: number;
  /** Where `-` reads from (default process.stdin). */
  stdin?: NodeJS.ReadableStream;
  logger?: Logger;
  /** Poll instead of using fs events (network file systems); default false. */
  usePolling?: boolean;
}

/** One fixture of the sequence: how it is named in messages and where it is. */
interface Slot {
  /** As shown to the user: the path as given, or `dir/name`; `<stdin>` for `-`. */
  name: string;
  /** Absolute path; '' for stdin. */
  abs: string;
}

const STDIN_NAME = '<stdin>';
/** Past chokidar's 50 ms per-file 'change' throttle. */
const RECHECK_MS = 120;

function errnoText(err: unknown): string {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') return 'no such file or directory';
  if (code === 'EACCES') return 'permission denied';
  return `cannot read (${code ?? (err as Error).message})`;
}

async function readStream(s: NodeJS.ReadableStream): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of s) chunks.push(typeof c === 'string' ? Buffer.from(c) : (c as Buffer));
  return Buffer.concat(chunks).toString('utf8');
}

/** Fixture files of a directory, in name (byte) order. */
async function listDir(dir: string): Promise<string[]> {
  const ents = await readdir(dir, { withFileTypes: true });
  return ents
    .filter((e) => (e.isFile() || e.isSymbolicLink()) && isFixtureName(e.name))
    .map((e) => e.name)
    .sort(compareUtf8);
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
  const log = options.logger ?? silentLogger;
  const fixtureOpts: FixtureOptions = { ...options, logger: log };
  const debounceMs = Math.max(0, options.debounceMs ?? 100);
  const maxWaitMs = Math.max(debounceMs, options.maxWaitMs ?? 1000);

  /** The fixtures the paths stand for, now; directories are listed (missing paths: error, or kept when watching). */
  async function expand(tolerant: boolean): Promise<Slot[]> {
    const out: Slot[] = [];
    for (const p of options.paths) {
      if (p === '-') {
        out.push({ name: STDIN_NAME, abs: '' });
        continue;
      }
      let isDir = false;
      try {
        isDir = (await stat(p)).isDirectory();
      } catch (err) {
        if (!tolerant) throw new CalloutError('input', `${p}: ${errnoText(err)}`, { cause: err });
      }
      if (!isDir) {
        out.push({ name: p, abs: resolve(p) });
        continue;
      }
      let names: string[];
      try {
        names = await listDir(p);
      } catch (err) {
        if (!tolerant) throw new CalloutError('input', `${p}: ${errnoText(err)}`, { cause: err });
        continue;
      }
      if (names.length === 0) {
        if (!tolerant) throw new CalloutError('input', `${p}: no fixture files (*.jsonl, *.ndjson, *.json, *.yaml, *.yml) in this directory`);
        log.warn(`${p}: no fixture files yet; watching`);
      }
      for (const n of names) out.push({ name: join(p, n), abs: resolve(p, n) });
    }
    return out;
  }

  async function readText(slot: Slot): Promise<string> {
    try {
      return slot.abs === '' ? await readStream(options.stdin ?? process.stdin) : await readFile(slot.abs, 'utf8');
    } catch (err) {
      throw new CalloutError('input', `${slot.name}: ${errnoText(err)}`, { cause: err });
    }
  }

  function parse(slot: Slot, text: string): State {
    const state = parseFixture(text, slot.name, fixtureOpts);
    log.debug(`${slot.name}: ${state.services} services, ${state.endpoints} endpoints`);
    return state;
  }

  async function runSequential(sink: StateSink, signal: AbortSignal): Promise<void> {
    const slots = await expand(false);
    // Read everything first: a bad fixture fails before any run.
    const states: State[] = [];
    for (const s of slots) {
      states.push(parse(s, await readText(s)));
      if (options.once) break;
    }
    for (const st of states) {
      if (signal.aborted) return;
      await sink.push(st);
    }
  }

  async function runWatch(sink: StateSink, signal: AbortSignal): Promise<void> {
    /** Per fixture: the text last read, its state when it parsed, the error reported for it. */
    const files = new Map<string, { text?: string; good?: State; error?: string }>();
    const extra = new Map<string, Buffer | undefined>(); // callout path -> content last run
    for (const p of options.watchExtra ?? []) extra.set(resolve(p), await readFile(p).catch(() => undefined));
    const pending = new Set<string>();
    const rechecks = new Map<string, NodeJS.Timeout>();
    let last: State | undefined;
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
    const kick = (): void => {
      const now = Date.now();
      if (firstEventAt === 0) firstEventAt = now;
      if (timer) clearTimeout(timer);
      timer = setTimeout(flush, Math.max(0, Math.min(debounceMs, firstEventAt + maxWaitMs - now)));
    };
    const onEvent = (event: string, path: string): void => {
      const abs = resolve(path);
      if (!extra.has(abs)) {
        const explicit = options.paths.some((p) => p !== '-' && resolve(p) === abs);
        if (!explicit && !isFixtureName(basename(abs))) return;
      } else if (event === 'unlink') return; // an editor replacing the callout: its 'add' follows
      log.debug(`watch: ${event} ${path}`);
      pending.add(abs);
      // chokidar drops a file's 'change' events for 50 ms after one it reported: look again after that.
      clearTimeout(rechecks.get(abs));
      rechecks.set(
        abs,
        setTimeout(() => {
          rechecks.delete(abs);
          pending.add(abs);
          kick();
        }, RECHECK_MS),
      );
      kick();
    };

    const watched = [...options.paths.filter((p) => p !== '-'), ...(options.watchExtra ?? [])];
    const watcher: FSWatcher = watch(watched, {
      ignoreInitial: true,
      depth: 0,
      persistent: true,
      usePolling: options.usePolling ?? false,
      interval: 100,
    });
    watcher.on('all', (event, path) => {
      if (event === 'add' || event === 'change' || event === 'unlink') onEvent(event, path);
    });
    watcher.on('error', (err) => log.warn(`watch: ${(err as Error).message}`));

    const push = async (st: State): Promise<void> => {
      last = st;
      await sink.push(st);
    };
    /** Reads a fixture; its state when it changed and parses, else undefined (errors reported once per content). */
    const reload = async (slot: Slot): Promise<State | undefined> => {
      const f = files.get(slot.abs) ?? {};
      files.set(slot.abs, f);
      let text: string;
      try {
        text = await readText(slot);
      } catch (err) {
        if (!(err instanceof CalloutError)) throw err;
        if (f.text !== undefined || f.good) log.info(`${slot.name}: gone; keeping its last good state until it comes back`);
        else if (f.error !== err.message) log.error(err.message);
        f.error = err.message;
        f.text = undefined;
        return undefined;
      }
      if (text === f.text) return undefined; // touched, not changed
      f.text = text;
      let st: State;
      try {
        st = parse(slot, text);
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
      await new Promise<void>((res) => watcher.once('ready', res));
      for (const slot of await expand(true)) {
        if (signal.aborted) return;
        const st = await reload(slot);
        if (st) await push(st);
      }
      log.info(`watching ${watched.join(', ')} for changes`);

      const aborted = new Promise<void>((res) => signal.addEventListener('abort', () => res(), { once: true }));
      while (!signal.aborted) {
        if (pending.size === 0 || timer) {
          // Nothing to do, or still debouncing.
          await Promise.race([new Promise<void>((res) => (wake = res)), aborted]);
          continue;
        }
        const changed = new Set(pending);
        pending.clear();
        let calloutChanged = false;
        for (const [abs, before] of extra) {
          if (!changed.has(abs)) continue;
          const now = await readFile(abs).catch(() => undefined);
          if (now && !(before && before.equals(now))) calloutChanged = true;
          if (now) extra.set(abs, now);
        }
        let pushed = false;
        // Changed fixtures in sequence order (a directory may have gained files).
        for (const slot of await expand(true)) {
          if (signal.aborted) return;
          if (!changed.has(slot.abs)) continue;
          const st = await reload(slot);
          if (!st) continue;
          log.info(`${slot.name}: changed, running`);
          await push(st);
          pushed = true;
        }
        if (calloutChanged && !pushed && last && !signal.aborted) {
          log.info('callout changed, running again');
          await push(last);
        }
      }
    } finally {
      if (timer) clearTimeout(timer);
      for (const t of rechecks.values()) clearTimeout(t);
      await watcher.close();
    }
  }

  return {
    run(sink: StateSink, signal: AbortSignal): Promise<void> {
      return options.watch && !options.once ? runWatch(sink, signal) : runSequential(sink, signal);
    },
  };
}
