/**
 * A callout's process group and its stderr: whether the group still has a
 * live member, and stderr split into run-prefixed lines with a bounded tail
 * kept for failure logs. Used by the runner.
 */
import { readdirSync, readFileSync } from 'node:fs';

const STDERR_TAIL_LINES = 10;
const STDERR_TAIL_BYTES = 2048;
/** A stderr "line" without newline is flushed once it reaches this size. */
const MAX_LINE_BYTES = 16 * 1024;
const NL = Buffer.from('\n');

/**
 * True while a process group has a live (non-zombie) member. kill(-pgid, 0)
 * also counts zombies, which never go away when PID 1 does not reap orphans
 * (containers without an init), so on Linux confirm with /proc.
 */
export function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
  if (process.platform !== 'linux') return true;
  let names: string[];
  try {
    names = readdirSync('/proc');
  } catch {
    return true;
  }
  for (const name of names) {
    if (!/^\d+$/.test(name)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${name}/stat`, 'latin1');
    } catch {
      continue;
    }
    // pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(f[2]) === pgid && f[0] !== 'Z' && f[0] !== 'X') return true;
  }
  return false;
}

/** Keeps the last lines of stderr within a line and byte budget. */
export class Tail {
  private lines: string[] = [];
  private bytes = 0;
  add(line: Buffer): void {
    let s = line.toString('utf8');
    if (s.endsWith('\n')) s = s.slice(0, -1);
    if (s.length > STDERR_TAIL_BYTES) s = '…' + s.slice(-STDERR_TAIL_BYTES);
    this.lines.push(s);
    this.bytes += s.length + 1;
    while (this.lines.length > STDERR_TAIL_LINES || (this.bytes > STDERR_TAIL_BYTES && this.lines.length > 1)) {
      this.bytes -= this.lines.shift()!.length + 1;
    }
  }
  text(): string | undefined {
    return this.lines.length > 0 ? this.lines.join('\n') : undefined;
  }
}

/** Splits stderr chunks into lines, each prefixed with the run tag. */
export class PrefixedLines {
  private partial: Buffer[] = [];
  private partialBytes = 0;
  constructor(
    private readonly prefix: Buffer,
    private readonly tail: Tail,
  ) {}

  /** The bytes to write for this chunk (complete lines only), or undefined. */
  push(chunk: Buffer): Buffer | undefined {
    const out: Buffer[] = [];
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(10, start);
      if (nl < 0) break;
      const piece = chunk.subarray(start, nl + 1);
      const line = this.partialBytes > 0 ? Buffer.concat([...this.partial, piece]) : piece;
      this.partial = [];
      this.partialBytes = 0;
      out.push(this.prefix, line);
      this.tail.add(line);
      start = nl + 1;
    }
    if (start < chunk.length) {
      const rest = chunk.subarray(start);
      this.partial.push(rest);
      this.partialBytes += rest.length;
      // A huge line without newline: flush it rather than buffer without bound.
      if (this.partialBytes >= MAX_LINE_BYTES) {
        const f = this.flush();
        if (f) out.push(f);
      }
    }
    return out.length > 0 ? Buffer.concat(out) : undefined;
  }

  /** The final partial line, newline-terminated, or undefined. */
  flush(): Buffer | undefined {
    if (this.partialBytes === 0) return undefined;
    const line = Buffer.concat([...this.partial, NL]);
    this.partial = [];
    this.partialBytes = 0;
    this.tail.add(line);
    return Buffer.concat([this.prefix, line]);
  }
}
