/**
 * A persistent callout (KPNG_CALLOUT_MODE=persistent) driven by a test:
 * frames written to its stdin, acknowledgements read from its fd 3. Its
 * process group is killed if the test process exits first.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import type { Readable } from 'node:stream';
import { WAIT_MS, within } from './wait.js';

/** One frame of the persistent protocol. */
export const frame = (seq: number, input: 'full' | 'changes', body: string): string => `{"Frame":{"Seq":${seq},"Input":"${input}"}}\n${body}\n`;

/** A persistent callout driven by the test: frames on its stdin, acks read from its fd 3. */
export class PersistentCallout {
  readonly child: ChildProcess;
  readonly pgid: number;
  stdout = '';
  stderr = '';
  private readonly acks: string[] = [];
  private wake: (() => void) | undefined;
  private onStdout: (() => void) | undefined;
  private partial = '';
  private seq = 0;
  readonly exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  /** Starts `callout` (in network namespace `ns` when given) with KPNG_CALLOUT_MODE=persistent and `env`. */
  constructor(callout: string, ns: string | undefined, env: NodeJS.ProcessEnv) {
    const [cmd, args] = ns ? ['ip', ['netns', 'exec', ns, callout]] : [callout, []];
    this.child = spawn(cmd as string, args as string[], {
      stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
      detached: true,
      env: { ...process.env, KPNG_CALLOUT_MODE: 'persistent', ...env },
    });
    this.pgid = this.child.pid!;
    persistents.add(this.child);
    this.child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      this.stdout += d;
      this.onStdout?.();
    });
    this.child.stderr!.setEncoding('utf8').on('data', (d: string) => (this.stderr += d));
    const fd3 = this.child.stdio[3] as Readable;
    fd3.setEncoding('utf8');
    fd3.on('data', (d: string) => {
      const parts = (this.partial + d).split('\n');
      this.partial = parts.pop()!;
      this.acks.push(...parts);
      this.wake?.();
    });
    this.child.stdin!.on('error', () => {});
    this.exit = new Promise((resolve) =>
      this.child.on('exit', (code, signal) => {
        persistents.delete(this.child);
        this.wake?.();
        resolve({ code, signal });
      }),
    );
  }

  /** Writes raw bytes (a frame, or garbage) and resolves with the next ack. */
  async send(text: string): Promise<string> {
    this.child.stdin!.write(text);
    return this.nextAck();
  }

  /** Writes a frame with the next Seq and resolves with its ack. */
  frame(input: 'full' | 'changes', body: string): Promise<string> {
    return this.send(frame(++this.seq, input, body));
  }

  private async nextAck(): Promise<string> {
    const next = async (): Promise<string> => {
      for (;;) {
        const ack = this.acks.shift();
        if (ack !== undefined) return ack;
        if (this.child.exitCode !== null || this.child.signalCode !== null) throw new Error('the callout exited');
        await new Promise<void>((resolve) => (this.wake = resolve));
      }
    };
    return within(next(), () => `an ack on fd 3 (stderr so far: ${this.stderr})`, WAIT_MS);
  }

  /** Resolves once `stdout` holds at least `length` characters (its pipe is not ordered with fd 3). */
  waitStdout(length: number): Promise<void> {
    const until = new Promise<void>((resolve) => {
      const check = (): void => {
        if (this.stdout.length < length) return;
        this.onStdout = undefined;
        resolve();
      };
      this.onStdout = check;
      check();
    });
    return within(until, () => `${length} characters on stdout (so far ${this.stdout.length}; stderr: ${this.stderr})`, WAIT_MS);
  }

  /** Closes stdin and resolves with the exit. */
  async end(): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    this.child.stdin!.end();
    return within(this.exit, () => `the callout to exit at end of input (stderr: ${this.stderr})`, WAIT_MS);
  }
}
const persistents = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of persistents) if (c.pid) spawnSync('kill', ['-KILL', `-${c.pid}`]);
});


