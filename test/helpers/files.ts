/**
 * Files for tests: temporary directories that clean themselves up, editors'
 * atomic saves, and sh scripts (callouts) written the same way, so that a
 * script rewritten while a run may exec it never hits ETXTBSY; and a callout
 * that records the input of each run.
 */
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import type { Test } from 'tap';

/** Who removes a temp dir: a test (at its teardown) or, with `untilExit`, the test process. */
export type Owner = Pick<Test, 'teardown'>;

/** An owner for files with no test to belong to (a helper's kubeconfig): removed when the process exits. */
export const untilExit: Owner = {
  teardown: (fn) => void process.once('exit', () => void fn()),
};

/** A fresh directory under the system tmpdir, removed at `owner`'s teardown. */
export function tempDir(owner: Owner, prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  owner.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

let saves = 0;

/**
 * An editor's atomic save (sed -i, vim, VS Code): `text` written to a new file
 * beside `path` and renamed over it, so readers see the old or the new file,
 * never half of one.
 */
export function replaceFile(path: string, text: string | Buffer, mode?: number): string {
  const part = join(dirname(path), `.${basename(path)}.${process.pid}.${++saves}.part`);
  writeFileSync(part, text);
  if (mode !== undefined) chmodSync(part, mode);
  renameSync(part, path);
  return path;
}

/**
 * Writes the sh script `dir/name` running `body` and returns its path;
 * executable unless `mode` says otherwise (0o644: a callout that cannot run).
 */
export function shScript(dir: string, name: string, body: string, mode = 0o755): string {
  return replaceFile(join(dir, name), '#!/bin/sh\n' + body, mode);
}

/** A callout that records its runs: see `recordingCallout`. */
export interface RecordingCallout {
  /** The script's path. */
  path: string;
  /** The input of run `n` (KPNG_CALLOUT_RUN). */
  run(n: number): string;
  /** The inputs of every run so far, in run order. */
  runs(): string[];
}

/**
 * A callout `dir/name` that saves each run's input as `dir/name.runs/<n>`
 * and then prints `ran <n>` (the marker a test waits for).
 */
export function recordingCallout(dir: string, name: string): RecordingCallout {
  const runsDir = join(dir, `${name}.runs`);
  mkdirSync(runsDir);
  const path = shScript(dir, name, `cat > '${runsDir}'/$KPNG_CALLOUT_RUN; echo "ran $KPNG_CALLOUT_RUN"\n`);
  const run = (n: number): string => readFileSync(join(runsDir, String(n)), 'utf8');
  return {
    path,
    run,
    runs: () =>
      readdirSync(runsDir)
        .map(Number)
        .sort((a, b) => a - b)
        .map(run),
  };
}
