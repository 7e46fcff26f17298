/**
 * Watching replay's files for --watch: the fixture paths (files and
 * directories) and the extra files (the callout), reported as "this path may
 * have changed"; what changed, and whether it matters, the caller finds out
 * by reading.
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
 * rename, a deletion and a return alike. Where no fs events can be had (the
 * inotify limits, EMFILE/ENOSPC; EACCES), files given are polled the same way,
 * with a warning.
 *
 * Events come from the directories and files as they were when watched: a
 * directory that did not exist yet, one renamed away and made again, a
 * symlink pointed at another file, leave those watches deaf. So every
 * REWATCH_CHECK_MS the watched paths are looked up again (one stat or
 * realpath each); when one is no longer what is watched, every watch is set
 * up again and every path reported as possibly changed (a directory argument
 * as its own path: all its fixtures). With polling too, and a directory
 * argument chokidar saw go away counts as changed even if it is back (the
 * same directory) by the next look-up: its poller was dropped with it.
 */
import { watch as fsWatch, unwatchFile, watchFile, type FSWatcher as DirWatcher, type Stats, type StatsListener } from 'node:fs';
import { realpath, stat } from 'node:fs/promises';
import { basename, dirname, join, resolve, sep } from 'node:path';
import { watch, type FSWatcher } from 'chokidar';
import type { Logger } from '../../log.js';
import { isFixtureName } from '../fixture.js';
import { errnoText } from './fixtures.js';

/** What to do when the inotify limits (EMFILE, ENOSPC) leave a directory without events. */
const INOTIFY_HINT = '(raise fs.inotify.max_user_instances and max_user_watches, or use --watch-poll)';

/**
 * chokidar drops a file's 'change' events for 50 ms after one it reported
 * (and its raw events for 5 ms): a save right after another is seen only by
 * looking again, past that window.
 */
const RECHECK_MS = 120;
/** How often the watched directories and symlinks are looked up again (see the module comment). */
const REWATCH_CHECK_MS = 1000;

/** Options of `watchFiles`. */
export interface WatchFilesOptions {
  /** Fixture paths as given: files and directories (not `-`). */
  paths: readonly string[];
  /** More files (the callout), absolute. Their deletion is not reported: an editor's save brings them back. */
  extra: readonly string[];
  /** Poll instead of using fs events. */
  usePolling: boolean;
  /** With `usePolling`: how often each file and directory is stat'ed. */
  pollIntervalMs: number;
  log: Logger;
  /** A fixture (of a directory argument, or given) or an extra file may have changed. */
  onChange(abs: string): void;
}

/** Watches started by `watchFiles`. */
export interface FileWatcher {
  /** Resolves when every watch is in place: a change made after it is not missed. */
  readonly ready: Promise<void>;
  /** Stops every watch and pending recheck. */
  close(): Promise<void>;
}

/** In a watched directory: every fixture file (a directory argument), and/or these names (files given). */
interface WatchedDir {
  fixtures: boolean;
  names: Set<string>;
}

/**
 * What the watches are attached to: per path watched (directory, file given,
 * symlink), its inode or its target. A difference later means the watches
 * follow something else than the paths now name.
 */
async function identity(paths: readonly string[]): Promise<string> {
  // A file's own inode is left out: an atomic save gives it a new one, and the watch of its directory sees that.
  const one = async (abs: string): Promise<string> => {
    const st = await stat(abs).catch(() => undefined);
    const target = await realpath(abs).catch(() => '');
    if (!st) return 'missing';
    return st.isDirectory() ? `d:${st.dev}:${st.ino}:${target}` : `f:${target}`;
  };
  return (await Promise.all(paths.map(one))).join('\n');
}

/** Starts watching; see the module comment. */
export async function watchFiles(opts: WatchFilesOptions): Promise<FileWatcher> {
  // With polling too: chokidar's poller of a directory argument is dropped when the directory goes away,
  // and is not set up again when it comes back (or appears later).
  // What decides the watches: each path given, its directory, and the callout's directory.
  const looked = [...new Set([...opts.paths, ...opts.extra].flatMap((p) => [resolve(p), dirname(resolve(p))]))];
  // A directory argument that chokidar saw go away has lost its poller (with --watch-poll): set up
  // again at the next check, even if by then the same directory is back.
  let seen = '';
  const stale = (): void => void (seen = '');
  let current = await watchOnce(opts, stale);
  seen = await identity(looked);
  let closed = false;
  /** A check (and maybe a re-arm) in flight: close() waits for it, so that no watch outlives close(). */
  let checking: Promise<void> | undefined;
  const check = async (): Promise<void> => {
    const now = await identity(looked);
    if (now === seen || closed) return;
    seen = now;
    opts.log.debug('watch: a watched path now names another file or directory: watching again');
    const old = current;
    current = await watchOnce(opts, stale);
    await old.close();
    await current.ready;
    // Whatever happened meanwhile: every path may have changed (a directory argument stands for its fixtures).
    if (!closed) for (const p of [...opts.paths, ...opts.extra]) opts.onChange(resolve(p));
  };
  const timer = setInterval(() => {
    if (checking || closed) return;
    checking = check()
      .catch((err: unknown) => opts.log.warn(`watch: ${(err as Error).message}`))
      .finally(() => (checking = undefined));
  }, REWATCH_CHECK_MS);
  // Not unref'd: when no watch could be set up (inotify instances or watches exhausted, EMFILE/ENOSPC; a
  // directory we may not read), nothing else keeps the process alive, and Node would end it with status 13
  // (a top-level await never settled) right after "watching ... for changes". close() clears it.
  return {
    ready: current.ready,
    async close() {
      closed = true;
      clearInterval(timer);
      await checking;
      await current.close();
    },
  };
}

/** The watches of the paths as they are now. */
async function watchOnce(opts: WatchFilesOptions, onRootGone?: () => void): Promise<FileWatcher> {
  const { log } = opts;
  const extra = new Set(opts.extra);
  // What each directory holds for us: a directory argument, its fixture files; the directory of a
  // file given (or of a missing path), that name.
  const dirs = new Map<string, WatchedDir>();
  const dirFor = (abs: string): WatchedDir => {
    let d = dirs.get(abs);
    if (!d) dirs.set(abs, (d = { fixtures: false, names: new Set() }));
    return d;
  };
  for (const p of opts.paths) {
    const abs = resolve(p);
    if (await stat(abs).then((st) => st.isDirectory(), () => false)) dirFor(abs).fixtures = true;
    else dirFor(dirname(abs)).names.add(basename(abs));
  }
  for (const abs of extra) dirFor(dirname(abs)).names.add(basename(abs));
  /** An entry of a watched directory that matters. */
  const wanted = (abs: string): boolean => {
    const d = dirs.get(dirname(abs));
    const name = basename(abs);
    return d !== undefined && (d.names.has(name) || (d.fixtures && isFixtureName(name)));
  };

  const rechecks = new Map<string, NodeJS.Timeout>();
  let closed = false;
  const onEvent = (event: string, path: string): void => {
    const abs = resolve(path);
    if (!wanted(abs)) return;
    log.debug(`watch: ${event} ${path}`);
    if (extra.has(abs) && event === 'unlink') return; // deleted, or an editor replacing it: an 'add' follows when it is back
    if (closed) return;
    // A save that chokidar's throttle dropped is seen by looking again.
    clearTimeout(rechecks.get(abs));
    rechecks.set(
      abs,
      setTimeout(() => {
        rechecks.delete(abs);
        opts.onChange(abs);
      }, RECHECK_MS),
    );
    opts.onChange(abs);
  };

  const polling = opts.usePolling;
  const pollMs = opts.pollIntervalMs;
  const dirArgs = [...dirs].filter(([, d]) => d.fixtures).map(([abs]) => abs);
  const fileDirs = [...dirs].filter(([, d]) => d.names.size > 0);
  const filePaths = fileDirs.flatMap(([abs, d]) => [...d.names].map((n) => join(abs, n)));
  const roots = [...new Set([...dirArgs, ...(polling ? [] : filePaths)])];
  const rootSet = new Set(roots);
  // No roots (files only, polling): no chokidar, which would never be 'ready'.
  const watcher: FSWatcher | undefined =
    roots.length === 0
      ? undefined
      : watch(roots, {
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
  /** Polls a file by path (one stat per interval). */
  const poll = (abs: string): void => {
    const listener: StatsListener = () => onEvent('poll', abs);
    watchFile(abs, { persistent: true, interval: pollMs }, listener);
    pollers.set(abs, listener);
  };
  if (polling) filePaths.forEach(poll);
  else {
    for (const [abs, d] of fileDirs) {
      try {
        const w = fsWatch(abs, { persistent: true }, (event, name) => {
          // No name (some platforms): any of ours may have changed.
          for (const n of name ? [name.toString()] : d.names) if (d.names.has(n)) onEvent(`${event} (directory)`, join(abs, n));
        });
        w.on('error', (err) => log.warn(`watch: ${abs}: ${err.message}`));
        dirWatchers.push(w);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'ENOENT' || code === 'ENOTDIR') {
          // A missing directory: chokidar watches for the file to appear, through its ancestors.
          log.debug(`watch: ${abs}: ${errnoText(err)}`);
        } else {
          // No events to be had (EMFILE, ENOSPC: the inotify limits; EACCES): poll its files by path instead.
          log.warn(`watch: ${abs}: ${errnoText(err)}: polling ${[...d.names].join(', ')} every ${pollMs} ms instead ${INOTIFY_HINT}`);
          for (const n of d.names) poll(join(abs, n));
        }
      }
    }
  }
  watcher?.on('all', (event, path) => {
    if (event === 'add' || event === 'change' || event === 'unlink') onEvent(event, path);
  });
  if (polling) {
    // chokidar's poller reports a file's change only when its size changed or its mtime went forward: a file
    // replaced by one of the same size and an older or equal mtime (`mv backup file`, `cp -p`, `tar x`, two
    // saves within a coarse mtime tick) would go unseen. Its raw events carry every stat change.
    watcher?.on('raw', (_event: string, path: string, details: unknown) => {
      const d = details as { curr?: Stats; prev?: Stats } | undefined;
      const { curr, prev } = d ?? {};
      if (!curr || !prev) return;
      if (curr.ino !== prev.ino || curr.size !== prev.size || curr.mtimeMs !== prev.mtimeMs || curr.ctimeMs !== prev.ctimeMs) onEvent('poll', path);
    });
  }
  watcher?.on('unlinkDir', (path) => {
    if (rootSet.has(resolve(path))) onRootGone?.();
  });
  watcher?.on('error', (err) => {
    const code = (err as NodeJS.ErrnoException).code;
    // The inotify limits: this directory goes unwatched; polling needs no inotify.
    const hint = code === 'EMFILE' || code === 'ENOSPC' ? ` ${INOTIFY_HINT}` : '';
    log.warn(`watch: ${(err as Error).message}${hint}`);
  });

  return {
    ready: watcher ? new Promise<void>((res) => watcher.once('ready', () => res())) : Promise.resolve(),
    async close() {
      closed = true;
      for (const t of rechecks.values()) clearTimeout(t);
      rechecks.clear();
      for (const w of dirWatchers) w.close();
      for (const [abs, listener] of pollers) unwatchFile(abs, listener);
      await watcher?.close();
    },
  };
}
