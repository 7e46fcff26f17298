/**
 * Whether the callout can be started, decided as execvp would, with a message
 * that says how to fix it. The CLI checks at startup (so a typo in --callout
 * fails at once, with 127 or 126 as a shell would, instead of when the first
 * state arrives); a callout process words its spawn errors with the same
 * messages.
 */
import { accessSync, closeSync, constants, openSync, readSync, statSync, type Stats } from 'node:fs';
import { resolve } from 'node:path';

/** Outcome of `checkCallout`: the file that would run, or why none would. */
export type CalloutCheck =
  | { ok: true; path: string }
  | {
      ok: false;
      /** As a shell: 127 when nothing to run was found, 126 when it cannot be executed. */
      exitCode: 126 | 127;
      /** Starts `callout NAME: `; may span lines (an example script). */
      message: string;
      /** errno a spawn would report (ENOENT, EACCES, ENOTDIR). */
      code: string;
    };

/** PATH that execvp (and libuv) searches when the environment has none. */
const DEFAULT_PATH = '/usr/bin:/bin';
const FIX = 'set --callout or $CALLOUT to an executable file';

/** The name as given, quoted when it holds spaces or shell-special characters. */
function show(name: string): string {
  return /^[\w@%+=:,./-]+$/.test(name) ? name : JSON.stringify(name);
}

/** Why a file cannot run; `exists` when the file is there (its mode or its interpreter is the problem). */
type Problem = { exitCode: 126 | 127; code: string; why: string; exists?: boolean };

/** Why `path` cannot be executed, or undefined when it can. */
function examine(path: string, name: string): Problem | undefined {
  let st: Stats;
  try {
    st = statSync(path);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? 'ENOENT';
    if (code === 'ENOTDIR') return { exitCode: 127, code, why: `not found (ENOTDIR): a part of its path is a file, not a directory; ${FIX}` };
    if (code === 'EACCES') return { exitCode: 126, code, why: `cannot be reached (EACCES): a directory on its path is not searchable` };
    return { exitCode: 127, code: 'ENOENT', why: `not found (${code}); ${FIX}` };
  }
  if (st.isDirectory()) return { exitCode: 126, code: 'EACCES', why: `is a directory, not a program; ${FIX}`, exists: true };
  if (!st.isFile()) return { exitCode: 126, code: 'EACCES', why: `is not a regular file (EACCES); ${FIX}`, exists: true };
  try {
    accessSync(path, constants.X_OK);
  } catch {
    return { exitCode: 126, code: 'EACCES', why: `is not executable (EACCES); make it executable: chmod +x ${show(name)}`, exists: true };
  }
  const p = interpreterProblem(path, name);
  return p && { ...p, exists: true };
}

/**
 * A script whose `#!` interpreter is missing fails to start with ENOENT even
 * though the file exists: say so, and spot the CR that Windows line endings
 * leave on that line.
 */
function interpreterProblem(path: string, name: string): Problem | undefined {
  let head: string;
  try {
    const fd = openSync(path, 'r');
    try {
      const buf = Buffer.alloc(256);
      head = buf.subarray(0, readSync(fd, buf, 0, buf.length, 0)).toString('latin1');
    } finally {
      closeSync(fd);
    }
  } catch {
    return undefined; // unreadable: execve decides (a binary may be execute-only)
  }
  if (!head.startsWith('#!')) return undefined;
  const m = /^#![ \t]*([^ \t\n]*)/.exec(head);
  let interp = m?.[1] ?? '';
  if (interp === '') return undefined;
  if (interp.endsWith('\r')) {
    return {
      exitCode: 127,
      code: 'ENOENT',
      why: `its #! line ends with a carriage return (Windows CRLF line endings), so its interpreter is not found; convert the file, e.g. sed -i 's/\\r$//' ${show(name)}`,
    };
  }
  interp = resolve(path, '..', interp);
  try {
    const st = statSync(interp);
    if (!st.isFile()) return { exitCode: 126, code: 'EACCES', why: `its interpreter ${interp} (on its #! line) is not a program` };
    accessSync(interp, constants.X_OK);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT' || (err as NodeJS.ErrnoException).code === 'ENOTDIR') {
      return { exitCode: 127, code: 'ENOENT', why: `its interpreter ${interp} (on its #! line) is not installed (ENOENT)` };
    }
    return { exitCode: 126, code: 'EACCES', why: `its interpreter ${interp} (on its #! line) is not executable (EACCES)` };
  }
  return undefined;
}

/** Advice for a name that was not found, when we can guess what was meant. */
function notFoundHint(file: string, cwd: string): string | undefined {
  const cmd = file.trim();
  if (cmd !== file && !/\s/.test(cmd)) return `the name has leading or trailing spaces: did you mean ${show(cmd)}?`;
  if (/\s/.test(cmd)) {
    return (
      `a callout is run without a shell, so its name cannot carry arguments: ` +
      `put the command in a wrapper script (chmod +x) and pass that script's path, for example\n` +
      `  #!/bin/sh\n` +
      `  exec ${cmd}`
    );
  }
  if (!file.includes('/')) {
    try {
      const here = resolve(cwd, file);
      if (statSync(here).isFile()) {
        let runnable = true;
        try {
          accessSync(here, constants.X_OK);
        } catch {
          runnable = false;
        }
        return `a name without '/' is looked up in $PATH only: for the file in the current directory, use ./${file}${runnable ? '' : ` (and make it executable: chmod +x ${file})`}`;
      }
    } catch {
      /* not there either */
    }
  }
  return undefined;
}

/**
 * Resolves the callout as execvp would: a name containing `/` is a path
 * (relative to `cwd`); any other name is searched in `env.PATH` (default
 * `/usr/bin:/bin`, an empty entry meaning `cwd`) for an executable regular
 * file. Also checks a script's `#!` interpreter. Messages start with
 * `callout NAME: ` and say how to fix the problem; a name with spaces and a
 * name found only in `cwd` get their own advice.
 */
export function checkCallout(file: string, env: NodeJS.ProcessEnv, cwd: string = process.cwd()): CalloutCheck {
  const name = show(file);
  const fail = (p: Problem, prefix = ''): CalloutCheck => ({ ok: false, exitCode: p.exitCode, code: p.code, message: `callout ${name}: ${prefix}${p.why}` });
  if (file === '') return fail({ exitCode: 127, code: 'ENOENT', why: `empty name; ${FIX}` });

  if (file.includes('/')) {
    const path = resolve(cwd, file);
    const p = examine(path, file);
    if (!p) return { ok: true, path };
    const hint = p.exists || p.code !== 'ENOENT' ? undefined : notFoundHint(file, cwd);
    return fail(hint ? { ...p, why: `not found (ENOENT); ${hint}` } : p);
  }

  const search = env.PATH ?? DEFAULT_PATH;
  // execvp goes on past a candidate it cannot execute (and past PATH entries
  // that are missing or not directories); when nothing later works, the first
  // candidate it could not execute explains the failure.
  let unusable: { path: string; problem: Problem } | undefined;
  for (const dir of search.split(':')) {
    const path = resolve(cwd, dir, file);
    const p = examine(path, path);
    if (!p) return { ok: true, path };
    if (p.exists || p.code === 'EACCES') unusable ??= { path, problem: p };
  }
  if (unusable) return fail(unusable.problem, `${unusable.path}: `);
  const hint = notFoundHint(file, cwd) ?? `${FIX}, or to a program name in $PATH (PATH=${search})`;
  return fail({ exitCode: 127, code: 'ENOENT', why: `not found in $PATH (ENOENT); ${hint}` });
}

/**
 * The message for a callout that failed to start at run time (deleted or
 * changed since startup): `checkCallout`'s explanation when it finds one, else
 * the errno.
 */
export function spawnErrorMessage(file: string, err: NodeJS.ErrnoException, env: NodeJS.ProcessEnv): string {
  const c = checkCallout(file, env);
  if (!c.ok) return c.message;
  const name = show(file);
  switch (err.code) {
    case 'ENOENT':
      return `callout ${name}: not found (ENOENT); ${FIX}`;
    case 'EACCES':
      return `callout ${name}: is not executable (EACCES); ${FIX}`;
    default:
      return `callout ${name}: could not be started (${err.code ?? 'error'}): ${err.message}`;
  }
}

/**
 * The program file's identity and times, when `file` is a path (a persistent
 * callout is restarted when it changes); undefined for a name looked up in
 * $PATH or a file we cannot stat.
 */
export function programStamp(file: string): string | undefined {
  if (!file.includes('/')) return undefined;
  try {
    const s = statSync(file);
    return `${s.dev}:${s.ino}:${s.size}:${s.mtimeMs}:${s.ctimeMs}`;
  } catch {
    return undefined;
  }
}
