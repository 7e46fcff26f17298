/**
 * A callout's processes and its stderr: which processes of a run are still
 * alive (and signalling them all), and stderr split into lines, each written
 * as text (`[run N] line`) or as a JSON object, with a bounded tail kept for
 * failure logs. Used by the runner.
 */
import { readdirSync, readFileSync } from 'node:fs';

const STDERR_TAIL_LINES = 10;
const STDERR_TAIL_BYTES = 2048;
/** A stderr "line" without newline is flushed once it reaches this size. */
const MAX_LINE_BYTES = 16 * 1024;
const NL = Buffer.from('\n');

interface Member {
  pid: number;
  pgrp: number;
}

/**
 * Live processes of a run, read from /proc: those in process group `pgid`, and
 * those of session `pgid` that moved to another group (a shell with job
 * control puts each background job in a group of its own). The callout is
 * spawned with setsid(), so both ids equal its pid and only its descendants
 * carry them. Zombies are skipped: they never go away when PID 1 does not reap
 * orphans (containers without an init). Undefined without /proc.
 */
function scan(pgid: number): Member[] | undefined {
  if (process.platform !== 'linux') return undefined;
  let names: string[];
  try {
    names = readdirSync('/proc');
  } catch {
    return undefined;
  }
  const found: Member[] = [];
  for (const name of names) {
    if (!/^\d+$/.test(name)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${name}/stat`, 'latin1');
    } catch {
      continue; // exited meanwhile
    }
    // pid (comm) state ppid pgrp session ...; comm may contain spaces and parentheses.
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (f[0] === 'Z' || f[0] === 'X') continue;
    const pgrp = Number(f[2]);
    if (pgrp === pgid || Number(f[3]) === pgid) found.push({ pid: Number(name), pgrp });
  }
  return found;
}

/** Whether signal 0 reaches process group `pgid` (zombies count: used only without /proc). */
function groupProbe(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Pids of the live (non-zombie) processes a run left: its process group
 * `pgid` and the rest of its session (see `signalGroup`), ascending. Without
 * /proc (not Linux) the members cannot be listed: `[pgid]` stands for the
 * group while signal 0 still reaches it.
 */
export function groupMembers(pgid: number): number[] {
  const m = scan(pgid);
  if (m === undefined) return groupProbe(pgid) ? [pgid] : [];
  return m.map((x) => x.pid).sort((a, b) => a - b);
}

/** True while a run's process group (or session) has a live member. */
export function groupAlive(pgid: number): boolean {
  return groupMembers(pgid).length > 0;
}

/**
 * Sends `sig` to process group `pgid` and to the members of session `pgid`
 * that left the group (background jobs of a shell with job control). Never
 * throws; returns an error message when the group could not be signalled for
 * another reason than being gone.
 */
export function signalGroup(pgid: number, sig: NodeJS.Signals): string | undefined {
  let problem: string | undefined;
  try {
    process.kill(-pgid, sig);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ESRCH') problem = String(err);
  }
  for (const m of scan(pgid) ?? []) {
    if (m.pgrp === pgid) continue; // reached through the group
    try {
      process.kill(m.pid, sig);
    } catch {
      /* exited meanwhile */
    }
  }
  return problem;
}

/** Keeps the last lines of stderr within a line and byte budget. */
export class Tail {
  private lines: string[] = [];
  private bytes = 0;
  /** Adds one line, without its newline (a CR before it is dropped too). */
  add(line: Buffer): void {
    let s = line.toString('utf8');
    if (s.endsWith('\r')) s = s.slice(0, -1);
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

/** How one stderr line (without its newline) is written to our stderr, newline included. */
export type LineFormat = (line: Buffer) => Buffer;

/** Text format: `[run N] line\n`, the line's bytes unchanged. */
export function textLineFormat(run: number): LineFormat {
  const prefix = Buffer.from(`[run ${run}] `);
  return (line) => Buffer.concat([prefix, line, NL]);
}

/**
 * JSON format: one object per line, e.g.
 * `{"time":"…","level":"info","run":1,"stream":"stderr","msg":"…"}`. The line
 * is decoded as UTF-8 (invalid bytes become U+FFFD, a trailing CR is dropped),
 * so the output is always valid JSON.
 */
export function jsonLineFormat(run: number, now: () => number): LineFormat {
  return (line) => {
    let msg = line.toString('utf8');
    if (msg.endsWith('\r')) msg = msg.slice(0, -1);
    const rec = { time: new Date(now()).toISOString(), level: 'info', run, stream: 'stderr', msg };
    return Buffer.from(JSON.stringify(rec) + '\n');
  };
}

/**
 * Length of `b` cut back to a UTF-8 character boundary (at most 3 bytes
 * back), so that a long line split in two does not split a character.
 */
function charBoundary(b: Buffer): number {
  const i = b.length;
  for (let k = i - 1; k >= 0 && k >= i - 4; k--) {
    const c = b[k]!;
    if ((c & 0xc0) === 0x80) continue; // a continuation byte: look for its lead byte
    const need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    return i - k < need ? k : i;
  }
  return i;
}

/**
 * Splits stderr chunks into lines and formats each one; every line also goes
 * to the tail. A line longer than 16 KiB is cut into pieces of at most that
 * size (at UTF-8 character boundaries), each written as a line of its own: a
 * line is never buffered without bound, nor one log record huge.
 */
export class StderrLines {
  private partial: Buffer[] = [];
  private partialBytes = 0;
  constructor(
    private readonly format: LineFormat,
    private readonly tail: Tail,
  ) {}

  /** The bytes to write for this chunk (complete lines only), or undefined. */
  push(chunk: Buffer): Buffer | undefined {
    const out: Buffer[] = [];
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(10, start);
      if (nl < 0) break;
      const piece = chunk.subarray(start, nl);
      let line = this.partialBytes > 0 ? Buffer.concat([...this.partial, piece]) : piece;
      this.partial = [];
      this.partialBytes = 0;
      line = this.cutLong(line, out);
      out.push(this.emit(line));
      start = nl + 1;
    }
    if (start < chunk.length) {
      const rest = chunk.subarray(start);
      this.partial.push(rest);
      this.partialBytes += rest.length;
      if (this.partialBytes > MAX_LINE_BYTES) {
        const left = this.cutLong(Buffer.concat(this.partial), out);
        this.partial = [left];
        this.partialBytes = left.length;
      }
    }
    return out.length > 0 ? Buffer.concat(out) : undefined;
  }

  /** Emits full-size pieces of `line` into `out` while it is too long; returns the rest. */
  private cutLong(line: Buffer, out: Buffer[]): Buffer {
    while (line.length > MAX_LINE_BYTES) {
      let cut = charBoundary(line.subarray(0, MAX_LINE_BYTES));
      if (cut === 0) cut = MAX_LINE_BYTES;
      out.push(this.emit(line.subarray(0, cut)));
      line = line.subarray(cut);
    }
    return line;
  }

  /** The final partial line, formatted, or undefined. */
  flush(): Buffer | undefined {
    if (this.partialBytes === 0) return undefined;
    const line = Buffer.concat(this.partial);
    this.partial = [];
    this.partialBytes = 0;
    return this.emit(line);
  }

  private emit(line: Buffer): Buffer {
    this.tail.add(line);
    return this.format(line);
  }
}
