/**
 * Runs a command to its end and collects its output: for tools around a test
 * (ip, iptables-save, socat) and for callout scripts fed directly; and which
 * tools are missing. A built bin that a test talks to while it runs is
 * bin-process.ts's.
 */
import { spawn, spawnSync } from 'node:child_process';
import { WAIT_MS } from './wait.js';

export interface CommandResult {
  /** Exit code; null after a signal, -1 when it could not be started. */
  code: number | null;
  stdout: string;
  stderr: string;
}

export interface CommandOptions {
  /** Written to its stdin, which is then closed (default: nothing). */
  input?: string | undefined;
  /** Its whole environment (default: this process's). */
  env?: NodeJS.ProcessEnv | undefined;
  cwd?: string | undefined;
  /** Killed (SIGKILL) after this long: a hung tool must not hang the suite. */
  timeoutMs?: number | undefined;
}

/** Runs `cmd args` without a shell; never rejects, whatever the exit. */
export function runCommand(cmd: string, args: string[], o: CommandOptions = {}): Promise<CommandResult> {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'], env: o.env ?? process.env, cwd: o.cwd });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), o.timeoutMs ?? WAIT_MS);
    child.on('error', (err) => {
      clearTimeout(timer);
      resolve({ code: -1, stdout, stderr: stderr + String(err) });
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
    // A command that exits without reading its input must not fail the test with EPIPE.
    child.stdin.on('error', () => {});
    child.stdin.end(o.input ?? '');
  });
}

/** Runs `cmd args` and resolves with its stdout; rejects with its stderr when it fails. */
export async function mustRun(cmd: string, args: string[]): Promise<string> {
  const r = await runCommand(cmd, args);
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.code}: ${r.stderr}`);
  return r.stdout;
}

/** Those of `names` that are not commands in $PATH (a suite that needs them skips, saying which). */
export function missingTools(names: string[]): string[] {
  return names.filter((n) => spawnSync('sh', ['-c', 'command -v "$1"', 'sh', n], { stdio: 'ignore' }).status !== 0);
}
