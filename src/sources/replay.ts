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
 *
 * chokidar watches directory arguments. A file (fixture or callout) needs
 * more: an editor's save renames a new file over it, and chokidar's watch on
 * the file follows the old inode, so after two quick saves it could go deaf
 * for good; a deleted file is dropped and never watched again. So with fs
 * events a file is also watched through its directory, which outlives every
 * save, deletion and recreation: a plain fs.watch filtered by name (its
 * events name the entry, where chokidar would re-read and stat the whole
 * directory on every event in it: a core's worth in a busy /tmp). chokidar's
 * watch on the file itself stays for a symlink's target. With polling a file
 * is polled by path (fs.watchFile: one stat per interval), which sees a
 * rename, a deletion and a return alike.
 *
 * Every state pushed carries `origin`: the fixture's name, for the logs.
 */
import { watch as fsWatch, unwatchFile, watchFile, type FSWatcher as DirWatcher, type StatsListener } from 'node:fs';
import { readdir, readFile, stat } from 'node:fs/promises';
import { basename, dirname, join, resolve, sep } from 'node:path';
import { watch, type FSWatcher } from 'chokidar';
import { CalloutError } from '../errors.js';
import { compareUtf8 } from '../gojson.js';
import { silentLogger, type Logger } from '../log.js';
import type { Source, StateSink } from '../source.js';
import { sameState, type State } from '../state.js';
import { fixtureText, isFixtureName, parseFixture, type FixtureOptions } from './fixture.js';

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
  /** Poll instead of using fs events (network file systems, where no events come); default false. */
  usePolling?: boolean;
  /** With `usePolling`: how often each watched file and directory is stat'ed (chokidar's `interval`; default 1000 ms). */
  pollIntervalMs?: number;
}

/** One fixture of the sequence: how it is named in messages and where it is. */
interface Slot {
  /** As shown to the user: the path as given, or `dir/name`; `<stdin>` for `-`. */
  name: string;
  /** Absolute path; '' for stdin. */
  abs: string;
}

const STDIN_NAME = '<stdin>';
/**
 * chokidar drops a file's 'change' events for 50 ms after one it reported
 * (and its raw events for 5 ms): a save right after another is seen only by
 * looking again, past that window.
 */
const RECHECK_MS = 120;

/** In a watched directory: every fixture file (a directory argument), and/or these names (files given). */
interface WatchedDir {
  fixtures: boolean;
  names: Set<string>;
}

function errnoText(err: unknown): string {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') return 'no such file or directory';
  if (code === 'EACCES') return 'permission denied';
  return `cannot read (${code ?? (err as Error).message})`;
}

async function readStream(s: NodeJS.ReadableStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of s) chunks.push(typeof c === 'string' ? Buffer.from(c) : (c as Buffer));
  return Buffer.concat(chunks);
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

  /** A fixture's bytes (not readFile(…, 'utf8'): decoding would hide a binary file behind replacement characters). */
  async function readBytes(slot: Slot): Promise<Buffer> {
    try {
      return slot.abs === '' ? await readStream(options.stdin ?? process.stdin) : await readFile(slot.abs);
    } catch (err) {
      throw new CalloutError('input', `${slot.name}: ${errnoText(err)}`, { cause: err });
    }
  }

  /** The fixture's state, its `origin` set to the fixture's name. */
  function parse(slot: Slot, data: Buffer): State {
    const state = parseFixture(fixtureText(data, slot.name), slot.name, fixtureOpts);
    log.debug(`${slot.name}: ${state.services} services, ${state.endpoints} endpoints`);
    return { ...state, origin: slot.name };
  }

  /** Says so when a state about to run is empty: legitimate, but to a data-plane callout it means "delete every rule". */
  function warnIfEmpty(st: State): void {
    if (st.services === 0) {
      log.warn(`${st.origin ?? STDIN_NAME}: no Services in this fixture: the state is empty (a data-plane callout given it deletes every rule it made)`);
    }
  }

  async function runSequential(sink: StateSink, signal: AbortSignal): Promise<void> {
    const slots = await expand(false);
    // Read everything first: a bad fixture fails before any run.
    const states: State[] = [];
    for (const s of slots) {
      states.push(parse(s, await readBytes(s)));
      if (options.once) break;
    }
    for (const st of states) {
      if (signal.aborted) return;
      warnIfEmpty(st);
      await sink.push(st);
    }
  }

  async function runWatch(sink: StateSink, signal: AbortSignal): Promise<void> {
    /** Per fixture: the content last read, its state when it parsed, the error reported for it. */
    const files = new Map<string, { data?: Buffer; good?: State; error?: string }>();
    const extra = new Map<string, Buffer | undefined>(); // callout path -> content last run
    const extraNames = new Map<string, string>(); // callout path -> as given
    for (const p of options.watchExtra ?? []) {
      extra.set(resolve(p), await readFile(p).catch(() => undefined));
      extraNames.set(resolve(p), p);
    }
    const watched = [...options.paths.filter((p) => p !== '-'), ...(options.watchExtra ?? [])];
    // What each directory holds for us: a directory argument, its fixture files; the directory of a
    // file given (or of a missing path), that name.
    const dirs = new Map<string, WatchedDir>();
    const dirFor = (abs: string): WatchedDir => {
      let d = dirs.get(abs);
      if (!d) dirs.set(abs, (d = { fixtures: false, names: new Set() }));
      return d;
    };
    for (const p of options.paths) {
      if (p === '-') continue;
      const abs = resolve(p);
      if (await stat(abs).then((st) => st.isDirectory(), () => false)) dirFor(abs).fixtures = true;
      else dirFor(dirname(abs)).names.add(basename(abs));
    }
    for (const abs of extra.keys()) dirFor(dirname(abs)).names.add(basename(abs));
    /** An entry of a watched directory that matters. */
    const wanted = (abs: string): boolean => {
      const d = dirs.get(dirname(abs));
      const name = basename(abs);
      return d !== undefined && (d.names.has(name) || (d.fixtures && isFixtureName(name)));
    };
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
      if (!wanted(abs)) return;
      log.debug(`watch: ${event} ${path}`);
      if (extra.has(abs) && event === 'unlink') return; // deleted, or an editor replacing it: an 'add' follows when it is back
      pending.add(abs);
      // A save that chokidar's throttle dropped is seen here.
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

    const polling = options.usePolling ?? false;
    const pollMs = Math.max(1, options.pollIntervalMs ?? 1000);
    const dirArgs = [...dirs].filter(([, d]) => d.fixtures).map(([abs]) => abs);
    const fileDirs = [...dirs].filter(([, d]) => d.names.size > 0);
    const filePaths = fileDirs.flatMap(([abs, d]) => [...d.names].map((n) => join(abs, n)));
    const roots = [...new Set([...dirArgs, ...(polling ? [] : filePaths)])];
    const rootSet = new Set(roots);
    // No roots (files only, polling): no chokidar, which would never be 'ready'.
    const watcher: FSWatcher | undefined = roots.length === 0 ? undefined : watch(roots, {
      ignoreInitial: true,
      depth: 0,
      persistent: true,
      // The other entries of a directory argument get no watcher or poller. chokidar asks about the
      // roots themselves and, while one is missing, about its ancestors: keep those.
      ignored: (p: string) => {
        const abs = resolve(p);
        if (rootSet.has(abs) || wanted(abs)) return false;
        const prefix = abs.endsWith(sep) ? abs : abs + sep;
        return !roots.some((r) => r.startsWith(prefix));
      },
      usePolling: polling,
      interval: pollMs,
      binaryInterval: pollMs,
    });
    const dirWatchers: DirWatcher[] = [];
    const pollers = new Map<string, StatsListener>();
    if (polling) {
      for (const abs of filePaths) {
        const listener: StatsListener = () => onEvent('poll', abs);
        watchFile(abs, { persistent: true, interval: pollMs }, listener);
        pollers.set(abs, listener);
      }
    } else {
      for (const [abs, d] of fileDirs) {
        try {
          const w = fsWatch(abs, { persistent: true }, (event, name) => {
            // No name (some platforms): any of ours may have changed.
            for (const n of name ? [name.toString()] : d.names) if (d.names.has(n)) onEvent(`${event} (directory)`, join(abs, n));
          });
          w.on('error', (err) => log.warn(`watch: ${abs}: ${err.message}`));
          dirWatchers.push(w);
        } catch (err) {
          // A missing directory: chokidar watches for the file to appear, through its ancestors.
          log.debug(`watch: ${abs}: ${errnoText(err)}`);
        }
      }
    }
    watcher?.on('all', (event, path) => {
      if (event === 'add' || event === 'change' || event === 'unlink') onEvent(event, path);
    });
    watcher?.on('error', (err) => log.warn(`watch: ${(err as Error).message}`));

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
        data = await readBytes(slot);
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
        st = parse(slot, data);
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
      if (watcher) await new Promise<void>((res) => watcher.once('ready', res));
      for (const slot of await expand(true)) {
        if (signal.aborted) return;
        const st = await reload(slot);
        if (!st) continue;
        warnIfEmpty(st);
        await push(st);
      }
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
        for (const slot of await expand(true)) {
          if (signal.aborted) return;
          if (!changed.has(slot.abs)) continue;
          const st = await reload(slot);
          if (!st) continue;
          log.info(`${slot.name}: changed, running`);
          warnIfEmpty(st);
          await push(st);
          pushed = true;
        }
        if (calloutChanged !== undefined && !pushed && last && !signal.aborted) {
          log.info(`${calloutChanged}: callout changed, running ${last.origin ?? 'the last state'} again`);
          await push(last);
        }
      }
    } finally {
      if (timer) clearTimeout(timer);
      for (const t of rechecks.values()) clearTimeout(t);
      for (const w of dirWatchers) w.close();
      for (const [abs, listener] of pollers) unwatchFile(abs, listener);
      await watcher?.close();
    }
  }

  return {
    run(sink: StateSink, signal: AbortSignal): Promise<void> {
      return options.watch && !options.once ? runWatch(sink, signal) : runSequential(sink, signal);
    },
  };
}
