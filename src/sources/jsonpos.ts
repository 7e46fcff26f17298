/**
 * Positions in JSON text, for error messages. `JSON.parse` is used to read
 * fixtures (it is fast); only when it fails, or when a parsed value is
 * rejected, the text is scanned again here to find where: the first syntax
 * error with a readable reason, or the offset of the value at a path.
 */
import type { FieldPath } from '../convert/kubernetes.js';

/** A syntax error: offset into the scanned text and the reason. */
export interface JsonSyntaxError {
  offset: number;
  reason: string;
}

class Stop {
  constructor(readonly offset: number) {}
}

class Scanner {
  pos: number;
  private readonly path: Array<string | number> = [];
  /** Offset of the deepest value matching a prefix of `target`, and its depth. */
  best = -1;
  private bestDepth = -1;

  constructor(
    private readonly s: string,
    start: number,
    private readonly end: number,
    private readonly target: FieldPath | undefined,
  ) {
    this.pos = start;
  }

  fail(reason: string, at = this.pos): never {
    throw { offset: at, reason } satisfies JsonSyntaxError;
  }

  private show(at: number): string {
    if (at >= this.end) return 'end of input';
    const cp = this.s.codePointAt(at)!;
    return cp < 0x20 ? `character U+${cp.toString(16).padStart(4, '0').toUpperCase()}` : `'${String.fromCodePoint(cp)}'`;
  }

  ws(): void {
    while (this.pos < this.end) {
      const c = this.s.charCodeAt(this.pos);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) this.pos++;
      else break;
    }
  }

  private mark(): void {
    const t = this.target;
    if (!t) return;
    const d = this.path.length;
    if (d <= t.length && d > this.bestDepth) {
      for (let i = 0; i < d; i++) if (this.path[i] !== t[i]) return;
      this.best = this.pos;
      this.bestDepth = d;
      if (d === t.length) throw new Stop(this.pos);
    }
  }

  value(): void {
    this.ws();
    this.mark();
    const c = this.s[this.pos];
    if (this.pos >= this.end) this.fail('unexpected end of input, expected a value');
    if (c === '{') this.object();
    else if (c === '[') this.array();
    else if (c === '"') this.string();
    else if (c === '-' || (c! >= '0' && c! <= '9')) this.number();
    else if (this.s.startsWith('true', this.pos)) this.pos += 4;
    else if (this.s.startsWith('false', this.pos)) this.pos += 5;
    else if (this.s.startsWith('null', this.pos)) this.pos += 4;
    else this.fail(`unexpected ${this.show(this.pos)}, expected a value`);
  }

  /** At `{` or `[`: skips it; true, and past `close`, when the container is empty. */
  private empty(close: '}' | ']'): boolean {
    this.pos++;
    this.ws();
    if (this.s[this.pos] !== close) return false;
    this.pos++;
    return true;
  }

  /**
   * After a member or element (objects and arrays alike): true past a `,`
   * (another one follows), false past `close`; else a syntax error.
   */
  private more(close: '}' | ']'): boolean {
    this.ws();
    const c = this.pos < this.end ? this.s[this.pos] : undefined;
    if (c === ',') {
      this.pos++;
      this.ws();
      if (this.s[this.pos] === close) this.fail(`unexpected '${close}' after ',' (trailing comma)`);
      return true;
    }
    if (c === close) {
      this.pos++;
      return false;
    }
    return this.fail(`unexpected ${this.show(this.pos)}, expected ',' or '${close}'`);
  }

  private object(): void {
    if (this.empty('}')) return;
    do {
      this.ws();
      if (this.s[this.pos] !== '"' || this.pos >= this.end) this.fail(`unexpected ${this.show(this.pos)}, expected a "quoted" property name`);
      const key = this.string();
      this.ws();
      if (this.s[this.pos] !== ':' || this.pos >= this.end) this.fail(`unexpected ${this.show(this.pos)}, expected ':' after property name`);
      this.pos++;
      this.path.push(key);
      this.value();
      this.path.pop();
    } while (this.more('}'));
  }

  private array(): void {
    if (this.empty(']')) return;
    let i = 0;
    do {
      this.path.push(i++);
      this.value();
      this.path.pop();
    } while (this.more(']'));
  }

  private string(): string {
    const start = this.pos++;
    for (;;) {
      if (this.pos >= this.end) this.fail('unterminated string', start);
      const c = this.s.charCodeAt(this.pos);
      if (c === 0x22) {
        this.pos++;
        return JSON.parse(this.s.slice(start, this.pos)) as string;
      }
      if (c < 0x20) this.fail(`${this.show(this.pos)} in string (escape it)`);
      if (c === 0x5c) {
        const e = this.s[this.pos + 1];
        if (e === 'u') {
          if (!/^[0-9a-fA-F]{4}$/.test(this.s.slice(this.pos + 2, this.pos + 6))) this.fail('invalid \\u escape in string');
          this.pos += 6;
          continue;
        }
        if (e === undefined || !'"\\/bfnrt'.includes(e)) this.fail('invalid escape in string');
        this.pos += 2;
        continue;
      }
      this.pos++;
    }
  }

  private number(): void {
    const m = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;
    m.lastIndex = this.pos;
    const r = m.exec(this.s);
    if (!r || r[0] === '-') this.fail(`unexpected ${this.show(this.pos)}, expected a value`);
    this.pos += r[0].length;
    const c = this.s[this.pos];
    if (c !== undefined && /[0-9.eE]/.test(c)) this.fail('invalid number');
  }
}

/** The first syntax error of the JSON value in `text[start, end)`, or undefined when it is valid. */
export function findJsonSyntaxError(text: string, start = 0, end = text.length): JsonSyntaxError | undefined {
  const sc = new Scanner(text, start, end, undefined);
  try {
    sc.ws();
    if (sc.pos >= end) return { offset: sc.pos, reason: 'no JSON value' };
    sc.value();
    sc.ws();
    if (sc.pos < end) return { offset: sc.pos, reason: 'unexpected text after the JSON value' };
    return undefined;
  } catch (err) {
    if (err instanceof Stop) return undefined;
    return err as JsonSyntaxError;
  }
}

/**
 * Offset of the value at `path` in the (valid) JSON value in `text[start,
 * end)`; for a path that does not exist, the offset of its deepest existing
 * ancestor.
 */
export function findJsonPath(text: string, path: FieldPath, start = 0, end = text.length): number {
  const sc = new Scanner(text, start, end, path);
  try {
    sc.value();
  } catch (err) {
    if (err instanceof Stop) return err.offset;
  }
  return sc.best >= 0 ? sc.best : start;
}

/** 1-based line and column (in UTF-16 units) of `offset`. */
export function lineCol(text: string, offset: number): { line: number; col: number } {
  let line = 1;
  let lineStart = 0;
  for (let i = text.indexOf('\n'); i >= 0 && i < offset; i = text.indexOf('\n', i + 1)) {
    line++;
    lineStart = i + 1;
  }
  return { line, col: offset - lineStart + 1 };
}
