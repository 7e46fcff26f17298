/**
 * Watching replay's files (src/sources/replay/watcher.ts) on a temporary
 * directory: the fixtures of a directory argument, a file given (through
 * editors' atomic saves), an extra file, polling; only what matters is
 * reported, and a change is looked at again past chokidar's throttle.
 */
import { EventEmitter, once } from 'node:events';
import { copyFileSync, mkdirSync, renameSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { watchFiles, type WatchFilesOptions } from '../../../src/sources/replay/watcher.js';
import { replaceFile, tempDir } from '../../helpers/files.js';
import { captureLog } from '../../helpers/sink.js';
import { pollUntil, within } from '../../helpers/wait.js';

/** Watches as `opts` say, recording what is reported; closed at the test's end. */
async function watching(t: Test, opts: Omit<WatchFilesOptions, 'onChange' | 'log' | 'usePolling' | 'pollIntervalMs'> & Partial<WatchFilesOptions>) {
  const ee = new EventEmitter();
  const changes: string[] = [];
  const log = captureLog();
  const w = await watchFiles({
    usePolling: false,
    pollIntervalMs: 20,
    log: log.logger,
    ...opts,
    onChange: (abs) => {
      changes.push(abs);
      ee.emit('change');
    },
  });
  t.teardown(() => w.close());
  await within(w.ready, 'the watches to be ready');
  /** Resolves when `abs` was reported `n` times in all (past reports count). */
  const seen = async (abs: string, n = 1) => {
    while (changes.filter((c) => c === abs).length < n) await within(once(ee, 'change'), `waiting for change #${n} of ${abs} (have ${changes.join(', ')})`);
  };
  return { changes, seen, log, close: () => w.close() };
}

t.test("a directory argument: its fixture files, not its other entries", async (t) => {
  const dir = tempDir(t, 'replay-watcher-');
  const { changes, seen } = await watching(t, { paths: [dir], extra: [] });
  writeFileSync(join(dir, 'notes.txt'), 'x');
  writeFileSync(join(dir, '.hidden.yaml'), 'x');
  writeFileSync(join(dir, 'a.yaml'), 'x');
  await seen(join(dir, 'a.yaml'));
  writeFileSync(join(dir, 'a.yaml'), 'y');
  await seen(join(dir, 'a.yaml'), 2);
  t.notOk(changes.some((c) => c.endsWith('notes.txt') || c.endsWith('.hidden.yaml')), 'other entries not reported');
});

t.test('a file given: edits and atomic saves, each looked at again past the throttle', async (t) => {
  const dir = tempDir(t, 'replay-watcher-');
  const f = join(dir, 's.jsonl');
  writeFileSync(f, '1');
  writeFileSync(join(dir, 'other.jsonl'), '1');
  const { changes, seen, log } = await watching(t, { paths: [f], extra: [] });
  replaceFile(f, '2');
  await seen(f);
  const n = changes.length;
  await seen(f, n + 1);
  t.pass('reported again by the recheck');
  replaceFile(f, '3');
  replaceFile(f, '4');
  await seen(f, n + 2);
  writeFileSync(join(dir, 'other.jsonl'), '2');
  t.notOk(changes.some((c) => c.endsWith('other.jsonl')), "the directory's other files are not reported");
  t.ok(log.matching(new RegExp(`debug: watch: \\S+( \\(directory\\))? ${f}$`)).length > 0, 'events logged at debug level');
});

t.test('an extra file (the callout) and a missing fixture that appears later', async (t) => {
  const dir = tempDir(t, 'replay-watcher-');
  const callout = join(dir, 'callout.sh');
  writeFileSync(callout, '#!/bin/sh\n');
  const later = join(dir, 'later.yaml');
  const { seen } = await watching(t, { paths: [later], extra: [callout] });
  replaceFile(callout, '#!/bin/sh\n# 2\n');
  await seen(callout);
  writeFileSync(later, 'a: 1\n');
  await seen(later);
});

t.test('polling: files by path, a directory through chokidar', async (t) => {
  const dir = tempDir(t, 'replay-watcher-');
  const f = join(dir, 's.jsonl');
  writeFileSync(f, '1');
  const fx = join(dir, 'fx');
  mkdirSync(fx);
  const { seen, close } = await watching(t, { paths: [f, fx], extra: [], usePolling: true, pollIntervalMs: 20 });
  replaceFile(f, '2');
  await seen(f);
  writeFileSync(join(fx, 'a.json'), '{}');
  await seen(join(fx, 'a.json'));
  await close();
  t.pass('closes');
});

t.test('polling a directory: a fixture replaced by one of the same size and an older modification time is seen', async (t) => {
  // chokidar's poller reports a change only when the size changed or the mtime went forward: restoring a
  // backup (`mv a.yaml~ a.yaml`, `cp -p`, `tar x`, rsync -a) would go unseen.
  const dir = tempDir(t, 'replay-watcher-');
  const fx = join(dir, 'fx');
  mkdirSync(fx);
  const a = join(fx, 'a.yaml');
  writeFileSync(a, 'port: 80\n');
  const backup = join(dir, 'a.yaml.orig');
  writeFileSync(backup, 'port: 81\n');
  const past = new Date(Date.now() - 3600_000);
  utimesSync(backup, past, past);
  const { seen } = await watching(t, { paths: [fx], extra: [], usePolling: true, pollIntervalMs: 20 });
  // Let the poller take its first stat of the file.
  await new Promise((r) => setTimeout(r, 100));
  renameSync(backup, a);
  await seen(a);
  // The same in place (`cp -p`): same inode and size, the old mtime back; only the ctime moves.
  const again = join(dir, 'again');
  writeFileSync(again, 'port: 82\n');
  utimesSync(again, past, past);
  await new Promise((r) => setTimeout(r, 100));
  copyFileSync(again, a);
  utimesSync(a, past, past);
  t.ok(Math.abs(statSync(a).mtimeMs - past.getTime()) < 1000, 'the old mtime is back');
  await seen(a, 2);
});

t.test('polling files only: no chokidar, ready at once', async (t) => {
  const dir = tempDir(t, 'replay-watcher-');
  const f = join(dir, 's.jsonl');
  writeFileSync(f, '1');
  const { changes } = await watching(t, { paths: [f], extra: [], usePolling: true, pollIntervalMs: 20 });
  // fs.watchFile takes its first stat in the background, with nothing to wait on: an edit made before it
  // is part of the baseline. Edit until one is seen.
  let n = 1;
  await pollUntil(() => {
    writeFileSync(f, String(++n));
    return changes.includes(f);
  }, 'an edit to be seen by polling');
});

t.test('polling: a directory argument renamed away and made again is polled again', async (t) => {
  const dir = tempDir(t, 'replay-watcher-');
  const fx = join(dir, 'fx');
  mkdirSync(fx);
  writeFileSync(join(fx, 'a.yaml'), '1');
  const { seen } = await watching(t, { paths: [fx], extra: [], usePolling: true, pollIntervalMs: 20 });
  renameSync(fx, join(dir, 'away'));
  // Away for a few polls (chokidar drops the directory's poller), back before the next look-up (1 s).
  await new Promise((r) => setTimeout(r, 200));
  renameSync(join(dir, 'away'), fx);
  // Once the watches are set up again (the directory is reported as a whole), an edit of a fixture is seen.
  await seen(fx);
  await new Promise((r) => setTimeout(r, 200));
  writeFileSync(join(fx, 'a.yaml'), '22');
  await seen(join(fx, 'a.yaml'));
});
