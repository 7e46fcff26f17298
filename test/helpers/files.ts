/** Temporary directories and callout scripts for the CLI and fault tests. */
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Test } from 'tap';

/** A fresh directory under the system tmpdir, removed at `t`'s teardown. */
export function tempDir(t: Pick<Test, 'teardown'>, prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Writes an executable sh script `dir/name` running `body` and returns its path. */
export function shScript(dir: string, name: string, body: string): string {
  const p = join(dir, name);
  writeFileSync(p, '#!/bin/sh\n' + body);
  chmodSync(p, 0o755);
  return p;
}
