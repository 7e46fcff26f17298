/**
 * A callout's stdout and stderr: forwarded to our streams as they come
 * (stdout unchanged, stderr line by line through `StderrLines`), with
 * backpressure from our side unless our side is broken (then dropped, but
 * still read, so that the callout never blocks on a full pipe); and, once the
 * callout has exited, read to the end, but only for a bounded time: a
 * background process may hold the pipes open, or keep writing.
 */
import type { ChildProcess } from 'node:child_process';
import type { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import type { LogFields, Logger } from '../log.js';
import type { Outlet } from './outlet.js';
import type { StderrLines } from './stderr-lines.js';

/**
 * After the callout exited, output can only be what was left in its pipes
 * (at most the pipe capacity, 1 MiB at most on Linux) unless a background
 * process writes: past this many bytes, or this long of output flowing with
 * nothing blocking it, we stop reading (and the writer is killed with the group).
 */
const AFTER_EXIT_MAX_BYTES = 4 * 1024 * 1024;
const AFTER_EXIT_BUSY_MS = 2000;

/** Options of a `ChildOutput`. */
export interface ChildOutputOptions {
  /** Where the child's stdout and (formatted) stderr go. */
  out: Outlet;
  err: Outlet;
  stderrLines: StderrLines;
  /** After the exit, how long the pipes may stay quiet before we stop reading them. */
  pipeDrainMs: number;
  logger: Logger;
  /** Fields of our log lines about this child (`{ run }`). */
  fields: LogFields;
}

/** The output side of one spawned child (spawned with stdout and stderr piped). */
export class ChildOutput {
  private activity = 0;
  /** Pipes paused until an outlet drains. */
  private blocked = 0;
  private exited = false;
  private bytesAfterExit = 0;
  private isClosed = false;
  private readonly closed: Promise<void>;
  private readonly cancels = new Set<() => void>();
  private readonly stdout: Readable;
  private readonly stderr: Readable;

  constructor(
    child: ChildProcess,
    private readonly options: ChildOutputOptions,
  ) {
    this.stdout = child.stdout!;
    this.stderr = child.stderr!;
    this.forward(this.stdout, options.out, (b) => b);
    this.forward(this.stderr, options.err, (b) => options.stderrLines.push(b));
    this.closed = new Promise<void>((resolve) => child.once('close', () => resolve()));
    void this.closed.then(() => (this.isClosed = true));
  }

  /** The child has exited: from now on output is what its pipes held, or a background writer's. */
  noteExit(): void {
    this.exited = true;
  }

  /**
   * Reads the pipes to their end after the exit, but gives up once they have
   * been quiet for pipeDrainMs (unless we are only waiting for our own output
   * to drain and the run was not killed), or when output keeps coming after
   * the exit (a background writer). Then stops reading and writes the final
   * partial stderr line.
   */
  async drain(killed: () => boolean): Promise<void> {
    const { pipeDrainMs } = this.options;
    let busyMs = 0;
    while (!this.isClosed) {
      const seen = this.activity;
      await this.closedWithin(pipeDrainMs);
      if (this.isClosed) break;
      if (this.activity === seen && (this.blocked === 0 || killed())) break;
      if (this.blocked === 0 && (busyMs += pipeDrainMs) >= AFTER_EXIT_BUSY_MS) break;
      if (this.bytesAfterExit > AFTER_EXIT_MAX_BYTES) break;
    }
    if (!this.isClosed) {
      this.options.logger.debug('callout exited but its output is still open (background process?): stop reading', this.options.fields);
      this.stdout.destroy();
      this.stderr.destroy();
    }
    for (const cancel of this.cancels) cancel();
    this.cancels.clear();
    const rest = this.options.stderrLines.flush();
    if (rest) this.options.err.write(rest);
  }

  /** Resolves when the pipes close or after `ms`, whichever first; no timer is left behind. */
  private async closedWithin(ms: number): Promise<void> {
    const ac = new AbortController();
    await Promise.race([this.closed, sleep(ms, undefined, { signal: ac.signal }).catch(() => {})]);
    ac.abort();
  }

  private forward(src: Readable, outlet: Outlet, map: (b: Buffer) => Buffer | undefined): void {
    src.on('data', (chunk: Buffer) => {
      this.activity++;
      if (this.exited) this.bytesAfterExit += chunk.length;
      const b = map(chunk);
      if (b === undefined || outlet.write(b)) return;
      src.pause();
      this.blocked++;
      const cancel = outlet.whenWritable(() => {
        this.cancels.delete(cancel);
        this.blocked--;
        src.resume();
      });
      this.cancels.add(cancel);
    });
    src.on('error', (err) => this.options.logger.debug(`reading callout output: ${err.message}`, this.options.fields));
  }
}
