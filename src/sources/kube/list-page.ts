/**
 * A list page (the API server's JSON bytes) read one item at a time: each
 * item is decoded and parsed on its own and handed over before the next, so
 * the objects of one item, not of 500, are alive at once.
 *
 * Why (measured at 10,000 Services, bench/kube.js): `JSON.parse` of a whole
 * 1.7 MB page of EndpointSlices builds ~6 MB of objects that all stay alive
 * until the page is handed over; every young-generation collection in that
 * window copied them and moved them to the old generation, where they piled
 * up as garbage (~140 ms of collections over the first sync, the heap at 78
 * MB before the first full collection), and the page's text, a 1.7 MB
 * string, went to the large-object space until then too.
 *
 * How: items of one list are encoded alike by the API server, so every item
 * starts with the first item's first key; the page is cut where `},` is
 * followed by that start (a native byte search), and each piece parsed
 * alone. Correct whatever the cuts: JSON never has an unescaped quote inside
 * a string, and a piece that does not parse (a cut in the wrong place, or a
 * page not shaped like the API server's) falls back to `JSON.parse` of the
 * whole page, whose error is the one thrown when it is not JSON. The page
 * outside its items (kind, metadata: resourceVersion, continue) is parsed on
 * its own, from the text around the items.
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

const ITEMS = Buffer.from('"items"');

/**
 * Hands each item of the list page `bytes` to `onItem`, in order, and
 * returns the page's metadata. Throws JSON.parse's SyntaxError when the page
 * is not JSON, {@link NotAList} when it has no `items` array. Should a cut
 * turn out wrong after items were handed over, the whole page is parsed and
 * every item handed over again (handing an object over twice is harmless).
 */
export function readListPage(bytes: Buffer, onItem: (item: unknown) => void): PageMeta {
  const fast = itemsSpan(bytes);
  if (fast) {
    let ok = true;
    for (const [from, to] of fast.pieces) {
      let item: unknown;
      try {
        item = JSON.parse(bytes.toString('utf8', from, to));
      } catch {
        ok = false;
        break;
      }
      onItem(item);
    }
    if (ok) return fast.meta;
  }
  const page = JSON.parse(bytes.toString('utf8')) as { metadata?: PageMeta | null; items?: unknown } | null;
  if (!page || typeof page !== 'object' || !Array.isArray(page.items)) throw new NotAList();
  for (const item of page.items) onItem(item);
  return metaOf(page);
}

function metaOf(page: { metadata?: unknown }): PageMeta {
  const m = page.metadata;
  if (!m || typeof m !== 'object') return {};
  const { resourceVersion, continue: cont } = m as Record<string, unknown>;
  return { ...(typeof resourceVersion === 'string' ? { resourceVersion } : {}), ...(typeof cont === 'string' ? { continue: cont } : {}) };
}

/**
 * Where the items of the page are, cut into pieces of one item each, and the
 * rest of the page parsed; undefined when the page does not look like the
 * API server's (then it is parsed whole).
 */
function itemsSpan(bytes: Buffer): { meta: PageMeta; pieces: Array<[number, number]> } | undefined {
  const at = bytes.indexOf(ITEMS);
  if (at < 0) return undefined;
  let open = at + ITEMS.length;
  open = skipSpace(bytes, open);
  if (bytes[open] !== 0x3a) return undefined;
  open = skipSpace(bytes, open + 1);
  if (bytes[open] !== 0x5b) return undefined;
  const close = bytes.lastIndexOf(0x5d);
  if (close < open) return undefined;
  const head = bytes.toString('utf8', 0, at);
  if (!atTopLevel(head)) return undefined;
  let rest: unknown;
  try {
    rest = JSON.parse(`${head}"items":[]${bytes.toString('utf8', close + 1)}`);
  } catch {
    return undefined;
  }
  // The items must be the page's own (not some other `items` the cut found).
  const r = rest as { items?: unknown; metadata?: unknown } | null;
  if (!r || typeof r !== 'object' || !Array.isArray(r.items) || r.items.length !== 0) return undefined;
  const meta = metaOf(r);
  const first = skipSpace(bytes, open + 1);
  if (first >= close) return { meta, pieces: [] };
  // The first item's start up to its first key's colon, e.g. `{"metadata":`.
  const colon = bytes.indexOf(0x3a, first);
  if (bytes[first] !== 0x7b || colon < 0 || colon > first + 256 || colon > close) return { meta, pieces: [[first, close]] };
  const start = bytes.subarray(first, colon + 1);
  const sep = Buffer.concat([Buffer.from('},'), start]);
  const pieces: Array<[number, number]> = [];
  let from = first;
  for (let cut = bytes.indexOf(sep, from); cut >= 0 && cut < close; cut = bytes.indexOf(sep, from)) {
    pieces.push([from, cut + 1]);
    from = cut + 2;
  }
  pieces.push([from, close]);
  return { meta, pieces };
}

function skipSpace(bytes: Buffer, i: number): number {
  for (let c = bytes[i]; c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09; c = bytes[++i]);
  return i;
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
