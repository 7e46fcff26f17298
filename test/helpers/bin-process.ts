/**
 * Runs a built bin (bin/kpng-callout, bin/kpng-json) as a child process and
 * waits on its output lines (markers) and its exit, never on fixed sleeps.
 * Every child is killed when its test ends, and when the test process exits
 * (a failure that cuts a test short must not orphan a bin retrying a dead
 * server for ever).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import type { Test } from 'tap';
import { repoPath, repoRoot } from './fixtures.js';
import { WAIT_MS, within } from './wait.js';

type Stream = 'stdout' | 'stderr';

export interface BinProcess {
  proc: ChildProcess;
  /** Lines read so far. */
  stdout: string[];
  stderr: string[];
  /** The bytes read so far on `stream` (for byte-for-byte comparisons: lines lose \r). */
  bytes(stream: Stream): Buffer;
  /** Resolves with the first line (past or future) of `stream` matching `re`. */
  line(stream: Stream, re: RegExp, what?: string, ms?: number): Promise<string>;
  /** Resolves with the first `n` lines (past or future) of `stream` matching `re`. */
  matching(stream: Stream, re: RegExp, n: number, what?: string): Promise<string[]>;
  /** Resolves once `stream` holds at least `n` lines. */
  lines(stream: Stream, n: number, what?: string): Promise<string[]>;
  /** Exited; the exit code (null after a signal). */
  exit: Promise<number | null>;
  /** Exited and both pipes read to their end; the exit code. */
  done: Promise<number | null>;
  /** `done`, within WAIT_MS: a hang fails naming `what` and the last output. */
  exited(what?: string): Promise<number | null>;
}

/**
 * The argv that runs `bin/<tool> args` under this node. `env -u NODE_OPTIONS`:
 * tap adds its loaders to every child's NODE_OPTIONS, and they cannot load the
 * extensionless ESM bin.
 */
export function binArgv(tool: string, args: string[]): [string, ...string[]] {
  return ['/usr/bin/env', '-u', 'NODE_OPTIONS', process.execPath, repoPath('bin', tool), ...args];
}

/** Children still running, killed if the test process exits first. */
const running = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of running) c.kill('SIGKILL');
});

export interface BinOptions {
  /** Its environment, besides PATH (nothing else is inherited). */
  env?: NodeJS.ProcessEnv | undefined;
  /** Its working directory (default: the repository). */
  cwd?: string | undefined;
  /** Its whole input (default: no stdin). */
  stdin?: string | undefined;
  /** A command that runs it (exec'ing it), e.g. `setpriv --reuid …`. */
  wrap?: readonly string[] | undefined;
}

/** Runs `bin/<tool> args`; the child is killed when the test ends. */
export function runBin(t: Pick<Test, 'teardown'>, tool: string, args: string[], o: BinOptions = {}): BinProcess {
  const [cmd, ...argv] = [...(o.wrap ?? []), ...binArgv(tool, args)] as [string, ...string[]];
  const proc = spawn(cmd, argv, {
    env: { PATH: process.env.PATH, ...o.env },
    cwd: o.cwd ?? repoRoot,
    stdio: [o.stdin === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
  });
  running.add(proc);
  if (o.stdin !== undefined) proc.stdin!.end(o.stdin);
  const out: Record<Stream, string[]> = { stdout: [], stderr: [] };
  const raw: Record<Stream, Buffer[]> = { stdout: [], stderr: [] };
  const waiters = new Set<{ ready: () => boolean; resolve: () => void }>();
  for (const stream of ['stdout', 'stderr'] as const) {
    // Bytes first: a line's waiter then sees its bytes too.
    proc[stream]!.on('data', (b: Buffer) => raw[stream].push(b));
    createInterface(proc[stream]!).on('line', (l) => {
      out[stream].push(l);
      for (const w of waiters) {
        if (w.ready()) {
          waiters.delete(w);
          w.resolve();
        }
      }
    });
  }
  const exit = new Promise<number | null>((resolve) => proc.on('exit', (code) => resolve(code)));
  // 'close': exited and every pipe closed (read to its end, or destroyed by the test).
  const done = once(proc, 'close').then(() => exit);
  void done.then(() => running.delete(proc));
  t.teardown(async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGKILL');
      await exit;
    }
  });
  const tail = (): string => `stdout: ${out.stdout.slice(-5).join('\n')}; stderr: ${out.stderr.slice(-5).join('\n')}`;
  /** Resolves when `ready` holds after a line (or at once), within `ms`. */
  const when = (ready: () => boolean, what: string, ms: number): Promise<void> =>
    ready() ? Promise.resolve() : within(new Promise<void>((resolve) => waiters.add({ ready, resolve })), () => `waiting for ${what}; ${tail()}`, ms);
  return {
    proc,
    ...out,
    exit,
    done,
    bytes: (stream) => Buffer.concat(raw[stream]),
    async line(stream, re, what = `${stream} line ${re}`, ms = WAIT_MS) {
      const hit = (): string | undefined => out[stream].find((l) => re.test(l));
      await when(() => hit() !== undefined, what, ms);
      return hit()!;
    },
    async matching(stream, re, n, what = `${n} ${stream} lines ${re}`) {
      const hits = (): string[] => out[stream].filter((l) => re.test(l));
      await when(() => hits().length >= n, what, WAIT_MS);
      return hits().slice(0, n);
    },
    async lines(stream, n, what = `${n} lines on ${stream}`) {
      await when(() => out[stream].length >= n, what, WAIT_MS);
      return out[stream];
    },
    exited: (what = `${tool} to exit`) => within(done, () => `waiting for ${what}; ${tail()}`, WAIT_MS),
  };
}
