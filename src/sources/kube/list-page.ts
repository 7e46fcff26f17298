/**
 * A list page (the API server's JSON bytes) read one item at a time, as its
 * bytes arrive: each item is parsed on its own and handed over before the
 * next, so the objects of one item, not of 500, are alive at once, and the
 * page's bytes are dropped as its items are read.
 *
 * Why (measured at 10,000 Services, bench/kube.js): `JSON.parse` of a whole
 * 1.7 MB page of EndpointSlices builds ~6 MB of objects that all stay alive
 * until the page is handed over (~140 ms of young-generation collections
 * over the first sync). A server that ignores `limit` sends the whole list
 * as one body (38 MB at 10,000 slices): kept whole, then copied into one
 * buffer, it took the first sync to 232–270 MiB, and parsing started only
 * after its last byte (a hunt's naive server).
 *
 * How: items of one list are encoded alike, so every item starts with the
 * first item's first key; an item ends at a `}` followed by `,`, `{` and that
 * key (whitespace allowed between them, as Python's or indented encoders
 * write). Each such piece is parsed alone; one that does not parse (the key
 * inside an item, e.g. a second managedFields entry) is joined with the next.
 * Correct whatever the cuts: JSON never has an unescaped quote inside a
 * string, and a piece from an item's start parses only when it ends where
 * that item ends. The page outside its items (kind, metadata:
 * resourceVersion, continue) is parsed on its own, from the text around them.
 * A page not shaped so is kept whole and parsed by `JSON.parse` (whose error
 * is the one thrown when it is not JSON); a streamed page found wrong only at
 * its end, its bytes gone, throws {@link PageNotCut}: the caller reads it
 * again whole.
 */

/** What a list page says besides its items. */
export interface PageMeta {
  resourceVersion?: string;
  continue?: string;
}

/** Thrown: the page is JSON but not a list (no `items` array). */
export class NotAList extends Error {
  constructor() {
    super('the answer is not a list');
  }
}

/** Thrown by {@link ListReader.end}: a streamed page turned out not to cut into items; read it whole. */
export class PageNotCut extends Error {
  constructor() {
    super('the list page could not be read item by item');
  }
}

const ITEMS = Buffer.from('"items"');
/** A page whose `items` has not begun after this much is read whole. */
const MAX_HEAD = 1 << 20;
const isSpace = (c: number | undefined): boolean => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

function skipSpace(bytes: Buffer, i: number): number {
  while (isSpace(bytes[i])) i++;
  return i;
}

/**
 * Reads one list page pushed in chunks (`push`), handing each item to
 * `onItem` as soon as it is complete; `end` returns the page's metadata.
 * With `whole`, or for a page not shaped like the API server's, the bytes
 * are kept and parsed at the end by `JSON.parse`.
 */
export class ListReader {
  /** Bytes not yet consumed: the head, then from the current item's start (a view of `store`). */
  private buf: Buffer = Buffer.alloc(0);
  /** Where `buf` lives, grown by doubling: appending a chunk copies the chunk, not every byte kept. */
  private store: Buffer = Buffer.alloc(0);
  private phase: 'head' | 'items' | 'whole';
  /** Every chunk, while they may still be needed whole. */
  private kept: Buffer[] = [];
  private head = '';
  /** The first item's first key, quoted; undefined for an empty list. */
  private key: Buffer | undefined;
  /** Offsets in `buf`: the current item's `{`, and where the next search for a cut starts. */
  private start = 0;
  private scan = 0;
  /**
   * Once a cut failed to parse (it was inside the current item), each next cut is first checked by
   * counting brackets from the item's start: where the next byte to count is (-1: not counting),
   * the depth, inside a string, after a backslash. Without it, an item holding many objects that
   * begin like an item would be parsed again from its start at each: quadratic.
   */
  private counted = -1;
  private depth = 0;
  private inString = false;
  private escaped = false;

  /** `onHead` gets the page's bytes up to its `"items"` (its continue token: {@link continueToken}) as soon as they are in. */
  constructor(
    private readonly onItem: (item: unknown) => void,
    private readonly onHead?: (head: Buffer) => void,
    whole = false,
  ) {
    this.phase = whole ? 'whole' : 'head';
  }

  push(chunk: Buffer): void {
    if (this.phase === 'whole') {
      this.kept.push(chunk);
      return;
    }
    this.append(chunk);
    if (this.phase === 'head') {
      this.kept.push(chunk);
      this.begin();
    }
    if (this.phase === 'items') this.cut();
  }

  /** Adds `chunk` after `buf` (amortized: a long item or a page that does not cut is not copied again at every chunk). */
  private append(chunk: Buffer): void {
    const n = this.buf.length;
    if (n === 0) {
      this.buf = chunk;
      return;
    }
    if (this.buf.buffer !== this.store.buffer || this.buf.byteOffset !== this.store.byteOffset || n + chunk.length > this.store.length) {
      const store = Buffer.allocUnsafe(Math.max(2 * (n + chunk.length), 64 * 1024));
      this.buf.copy(store, 0);
      this.store = store;
    }
    chunk.copy(this.store, n);
    this.buf = this.store.subarray(0, n + chunk.length);
  }

  /** The page's metadata, once every chunk was pushed. */
  end(): PageMeta {
    if (this.phase !== 'items') return readWhole(this.kept.length === 1 ? this.kept[0]! : Buffer.concat(this.kept), this.onItem);
    const close = this.buf.lastIndexOf(0x5d);
    if (close < this.start) throw new PageNotCut();
    let meta: PageMeta | undefined;
    try {
      meta = restOf(`${this.head}"items":[]${this.buf.toString('utf8', close + 1)}`);
    } catch {
      // not the page's own items' end
    }
    if (meta === undefined) throw new PageNotCut();
    if (this.key !== undefined) {
      let end = close - 1;
      while (end > this.start && isSpace(this.buf[end])) end--;
      if (!this.piece(this.start, end + 1)) throw new PageNotCut();
    } else if (skipSpace(this.buf, this.start) !== close) throw new PageNotCut();
    return meta;
  }

  /** Finds the items' start; settles how the page is read. */
  private begin(): void {
    const { buf } = this;
    const at = buf.indexOf(ITEMS);
    if (at < 0) {
      if (buf.length > MAX_HEAD) this.phase = 'whole';
      return;
    }
    let open = skipSpace(buf, at + ITEMS.length);
    if (open >= buf.length) return;
    if (buf[open] !== 0x3a) return void (this.phase = 'whole');
    open = skipSpace(buf, open + 1);
    if (open >= buf.length) return;
    const head = buf.toString('utf8', 0, at);
    if (buf[open] !== 0x5b || !atTopLevel(head)) return void (this.phase = 'whole');
    const first = skipSpace(buf, open + 1);
    if (first >= buf.length) return;
    if (buf[first] === 0x7b) {
      // The first item's first key, e.g. `"metadata"` (no escape in it, at most 256 bytes).
      const q = skipSpace(buf, first + 1);
      const qEnd = q < buf.length ? buf.indexOf(0x22, q + 1) : -1;
      if (qEnd < 0) {
        if (buf.length - first > 512) this.phase = 'whole';
        return;
      }
      if (buf[q] !== 0x22 || qEnd - q > 256 || buf.subarray(q, qEnd).includes(0x5c)) return void (this.phase = 'whole');
      this.key = Buffer.from(buf.subarray(q, qEnd + 1));
    } else if (buf[first] !== 0x5d) return void (this.phase = 'whole');
    this.head = head;
    this.onHead?.(Buffer.from(buf.subarray(0, at + ITEMS.length)));
    this.kept = [];
    this.phase = 'items';
    this.start = first;
    this.scan = first + 1;
  }

  /** Hands over every complete item in `buf` and drops their bytes. */
  private cut(): void {
    const { key } = this;
    if (key === undefined) return;
    const buf = this.buf;
    for (;;) {
      const q = buf.indexOf(key, this.scan);
      if (q < 0) {
        // A key cut by the chunk's end is found in the next search.
        this.scan = Math.max(this.scan, buf.length - key.length + 1);
        break;
      }
      const colon = skipSpace(buf, q + key.length);
      if (colon >= buf.length) {
        this.scan = q;
        break;
      }
      this.scan = q + 1;
      if (buf[colon] !== 0x3a) continue;
      let b = q - 1;
      while (isSpace(buf[b])) b--;
      if (buf[b] !== 0x7b) continue;
      const open = b--;
      while (isSpace(buf[b])) b--;
      if (buf[b] !== 0x2c) continue;
      b--;
      while (isSpace(buf[b])) b--;
      if (buf[b] !== 0x7d || b <= this.start) continue;
      if (this.counted >= 0 && !this.closesAt(b)) continue;
      if (this.piece(this.start, b + 1)) {
        this.start = open;
        this.counted = -1;
      } else if (this.counted < 0) {
        this.counted = this.start;
        this.depth = 0;
        this.inString = this.escaped = false;
        this.closesAt(b);
      }
    }
    if (this.start > 0) {
      if (this.counted >= 0) this.counted -= this.start;
      // What is left (part of one item) moves to the start of the store, which stays for what comes.
      if (buf.buffer === this.store.buffer && buf.byteOffset === this.store.byteOffset) {
        buf.copyWithin(0, this.start);
        this.buf = this.store.subarray(0, buf.length - this.start);
      } else this.buf = buf.subarray(this.start);
      this.scan -= this.start;
      this.start = 0;
    }
  }

  /** Counts brackets up to `b` (included): whether every value begun since the item's start is closed there. */
  private closesAt(b: number): boolean {
    const buf = this.buf;
    let { depth, inString, escaped } = this;
    for (let i = this.counted; i <= b; i++) {
      const c = buf[i];
      if (inString) {
        if (escaped) escaped = false;
        else if (c === 0x5c) escaped = true;
        else if (c === 0x22) inString = false;
      } else if (c === 0x22) inString = true;
      else if (c === 0x7b || c === 0x5b) depth++;
      else if (c === 0x7d || c === 0x5d) depth--;
    }
    Object.assign(this, { depth, inString, escaped, counted: b + 1 });
    return depth === 0 && !inString;
  }

  /**
   * Parses bytes [from, to) as one item, else as a run of items (a cut
   * missed: an item with another first key); hands them over. False when
   * they are neither (the cut is inside an item: joined with the next).
   */
  private piece(from: number, to: number): boolean {
    const text = this.buf.toString('utf8', from, to);
    let item: unknown;
    try {
      item = JSON.parse(text);
    } catch {
      let items: unknown[];
      try {
        items = JSON.parse(`[${text}]`) as unknown[];
      } catch {
        return false;
      }
      for (const x of items) this.onItem(x);
      return true;
    }
    this.onItem(item);
    return true;
  }
}

/**
 * The continue token of a list page, read from its bytes before the items
 * (where the API server writes the list's metadata); undefined when not there.
 */
export function continueToken(head: Buffer): string | undefined {
  const items = head.indexOf(ITEMS);
  const text = items < 0 ? '' : head.toString('latin1', 0, items);
  return /"continue"\s*:\s*"([^"\\]+)"/.exec(text)?.[1];
}

/** The page parsed whole by `JSON.parse`. */
function readWhole(bytes: Buffer, onItem: (item: unknown) => void): PageMeta {
  const page = JSON.parse(bytes.toString('utf8')) as { metadata?: PageMeta | null; items?: unknown } | null;
  if (!page || typeof page !== 'object' || !Array.isArray(page.items)) throw new NotAList();
  for (const item of page.items) onItem(item);
  return metaOf(page);
}

/** The page outside its items, given with `"items":[]`: its metadata; throws when it is not that. */
function restOf(text: string): PageMeta {
  const r = JSON.parse(text) as { items?: unknown; metadata?: unknown } | null;
  // The items must be the page's own (not some other `items` the search found).
  if (!r || typeof r !== 'object' || !Array.isArray(r.items) || r.items.length !== 0) throw new NotAList();
  return metaOf(r);
}

function metaOf(page: { metadata?: unknown }): PageMeta {
  const m = page.metadata;
  if (!m || typeof m !== 'object') return {};
  const { resourceVersion, continue: cont } = m as Record<string, unknown>;
  return { ...(typeof resourceVersion === 'string' ? { resourceVersion } : {}), ...(typeof cont === 'string' ? { continue: cont } : {}) };
}

/** The text (a page's start) ends inside its top-level object, outside any string or nested value. */
function atTopLevel(head: string): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < head.length; i++) {
    const c = head.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x7b || c === 0x5b) depth++;
    else if (c === 0x7d || c === 0x5d) depth--;
  }
  return depth === 1 && !inString;
}
