/**
 * A callout's stderr, line by line: each line written to our stderr as text
 * (`[run N] line`) or as one JSON object, so that it is attributable and, with
 * `--log-format json`, every line on our stderr is JSON; and the last lines
 * kept (bounded) for the failure log.
 */

const TAIL_LINES = 10;
const TAIL_BYTES = 2048;
/** A stderr "line" without newline is cut once it reaches this size. */
const MAX_LINE_BYTES = 16 * 1024;
const NL = Buffer.from('\n');

/** How one stderr line (without its newline) is written to our stderr, newline included. */
export type LineFormat = (line: Buffer) => Buffer;

/**
 * Text format: `[run N] line\n`, the line's bytes unchanged; with a function,
 * `[LABEL] line\n`, the label asked for each line (a persistent callout's
 * `frame N`, N the newest frame).
 */
export function textLineFormat(run: number | (() => string)): LineFormat {
  if (typeof run === 'function') return (line) => Buffer.concat([Buffer.from(`[${run()}] `), line, NL]);
  const prefix = Buffer.from(`[run ${run}] `);
  return (line) => Buffer.concat([prefix, line, NL]);
}

/** A line as text: decoded as UTF-8 (invalid bytes become U+FFFD), a trailing CR dropped. */
function lineText(line: Buffer): string {
  const s = line.toString('utf8');
  return s.endsWith('\r') ? s.slice(0, -1) : s;
}

/**
 * JSON format: one object per line, e.g.
 * `{"time":"…","level":"info","run":1,"stream":"stderr","msg":"…"}` (with a function, its
 * fields instead of `run`, e.g. `"frame":N`), always
 * valid JSON whatever the bytes (see `lineText`). `now` is a millisecond clock.
 */
export function jsonLineFormat(run: number | (() => Record<string, number>), now: () => number): LineFormat {
  return (line) => {
    const who = typeof run === 'function' ? run() : { run };
    const rec = { time: new Date(now()).toISOString(), level: 'info', ...who, stream: 'stderr', msg: lineText(line) };
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
 * Splits stderr chunks into lines and formats each one, keeping the last
 * lines (10 lines, 2 KB at most) as the tail. A line longer than 16 KiB is cut
 * into pieces of at most that size (at UTF-8 character boundaries), each
 * written as a line of its own: a line is never buffered without bound, nor
 * one log record huge.
 */
export class StderrLines {
  private partial: Buffer[] = [];
  private partialBytes = 0;
  private tailLines: string[] = [];
  private tailBytes = 0;

  constructor(private readonly format: LineFormat) {}

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

  /** The final partial line, formatted, or undefined. */
  flush(): Buffer | undefined {
    if (this.partialBytes === 0) return undefined;
    const line = Buffer.concat(this.partial);
    this.partial = [];
    this.partialBytes = 0;
    return this.emit(line);
  }

  /** The last lines seen, joined with newlines (without CRs), or undefined when there were none. */
  tail(): string | undefined {
    return this.tailLines.length > 0 ? this.tailLines.join('\n') : undefined;
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

  private emit(line: Buffer): Buffer {
    this.keep(line);
    return this.format(line);
  }

  /** Adds a line to the tail, within its line and byte budget. */
  private keep(line: Buffer): void {
    let s = lineText(line);
    if (s.length > TAIL_BYTES) s = '…' + s.slice(-TAIL_BYTES);
    this.tailLines.push(s);
    this.tailBytes += s.length + 1;
    while (this.tailLines.length > TAIL_LINES || (this.tailBytes > TAIL_BYTES && this.tailLines.length > 1)) {
      this.tailBytes -= this.tailLines.shift()!.length + 1;
    }
  }
}
