/**
 * Runs a built bin (bin/kpng-callout, bin/kpng-json) as a child process and
 * waits on its output lines (markers), never on fixed sleeps.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { Test } from 'tap';
import { within } from './sink.js';

const root = fileURLToPath(new URL('../..', import.meta.url));

export interface BinProcess {
  proc: ChildProcess;
  /** Lines read so far. */
  stdout: string[];
  stderr: string[];
  /** Resolves with the first line (past or future) of `stream` matching `re`. */
  line(stream: 'stdout' | 'stderr', re: RegExp, what?: string, ms?: number): Promise<string>;
  exit: Promise<number | null>;
  /** Exited and both pipes read to their end. */
  done: Promise<number | null>;
}

/**
 * Runs `bin/<tool>` with exactly `env` (plus PATH), from `cwd` (default the
 * repository). `env -u NODE_OPTIONS`: tap adds its loaders to every child's
 * NODE_OPTIONS, and they cannot load the extensionless ESM bin. The child is
 * killed when the test ends.
 */
export function runBin(t: Test, tool: string, args: string[], o: { env?: NodeJS.ProcessEnv; cwd?: string; stdin?: string } = {}): BinProcess {
  const proc = spawn('/usr/bin/env', ['-u', 'NODE_OPTIONS', process.execPath, join(root, 'bin', tool), ...args], {
    env: { PATH: process.env.PATH, ...o.env },
    cwd: o.cwd ?? root,
    stdio: [o.stdin === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
  });
  if (o.stdin !== undefined) proc.stdin!.end(o.stdin);
  const out: Record<'stdout' | 'stderr', string[]> = { stdout: [], stderr: [] };
  const waiters: Array<{ stream: 'stdout' | 'stderr'; re: RegExp; resolve: (l: string) => void }> = [];
  const closed: Array<Promise<unknown>> = [];
  for (const stream of ['stdout', 'stderr'] as const) {
    const rl = createInterface(proc[stream]!);
    closed.push(once(rl, 'close'));
    rl.on('line', (l) => {
      out[stream].push(l);
      for (const w of [...waiters]) {
        if (w.stream === stream && w.re.test(l)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(l);
        }
      }
    });
  }
  const exit = new Promise<number | null>((resolve) => proc.on('exit', (code) => resolve(code)));
  const done = Promise.all([exit, ...closed]).then(() => exit);
  t.teardown(async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGKILL');
      await exit;
    }
  });
  return {
    proc,
    ...out,
    exit,
    done,
    line(stream, re, what = `${stream} line ${re}`, ms = 30_000) {
      const hit = out[stream].find((l) => re.test(l));
      if (hit !== undefined) return Promise.resolve(hit);
      return within(
        new Promise<string>((resolve) => waiters.push({ stream, re, resolve })),
        `waiting for ${what}; stdout: ${out.stdout.slice(-5).join('\n')}; stderr: ${out.stderr.slice(-5).join('\n')}`,
        ms,
      );
    },
  };
}
