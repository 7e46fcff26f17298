/**
 * One of our output streams (stdout, stderr) as callouts write to it. Our
 * streams may break (EPIPE when the reader of our stdout went away): once one
 * errors or closes it stays broken, what is meant for it is dropped and
 * nothing waits for its 'drain', so a callout is never held by a reader that
 * is gone. Handling the stream's 'error' here also keeps a broken stream from
 * crashing the process with an unhandled 'error' event while a run forwards
 * to it.
 */
import type { Writable } from 'node:stream';

/** A destination stream that tolerates breaking; see the module comment. */
export class Outlet {
  private isBroken: boolean;
  private readonly waiters = new Set<() => void>();

  /** `onBroken` is told once, with the errno code (or `closed`), when the stream breaks. */
  constructor(
    private readonly dest: NodeJS.WritableStream,
    private readonly onBroken: (why: string) => void,
  ) {
    const d = dest as Partial<Writable>;
    this.isBroken = d.destroyed === true || d.writableEnded === true;
    dest.on('error', (err: NodeJS.ErrnoException) => this.fail(err.code ?? err.message));
    dest.on('close', () => this.fail('closed'));
    dest.on('drain', () => this.release());
  }

  /** Writes `b` (dropped when broken); false when the caller should wait for `whenWritable` (backpressure). */
  write(b: Buffer): boolean {
    if (this.isBroken) return true;
    try {
      return this.dest.write(b) || this.isBroken;
    } catch (err) {
      this.fail((err as NodeJS.ErrnoException).code ?? String(err));
      return true;
    }
  }

  /** Calls `fn` once the stream drains or breaks; returns a canceller. */
  whenWritable(fn: () => void): () => void {
    if (this.isBroken) {
      queueMicrotask(fn); // never synchronously: the caller is still registering
      return () => {};
    }
    this.waiters.add(fn);
    return () => void this.waiters.delete(fn);
  }

  private fail(why: string): void {
    if (this.isBroken) return;
    this.isBroken = true;
    this.onBroken(why);
    this.release();
  }

  private release(): void {
    const fns = [...this.waiters];
    this.waiters.clear();
    for (const fn of fns) fn();
  }
}

/** Our stdout and stderr as the outlets a callout's output goes to; a broken one is said at debug level. */
export function calloutOutlets(stdout: NodeJS.WritableStream, stderr: NodeJS.WritableStream, log: { debug(msg: string): void }): { out: Outlet; err: Outlet } {
  return {
    out: new Outlet(stdout, (why) => log.debug(`our stdout is closed (${why}): the callout's stdout is dropped`)),
    err: new Outlet(stderr, (why) => log.debug(`our stderr is closed (${why}): the callout's stderr is dropped`)),
  };
}
