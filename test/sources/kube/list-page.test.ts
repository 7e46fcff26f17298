/** A list page read one item at a time: the same items and metadata as JSON.parse of the whole page, whatever its shape. */
import t from 'tap';
import { ListReader, NotAList, PageNotCut, type PageMeta } from '../../../src/sources/kube/list-page.js';

/** A whole page through a ListReader, as the source reads it: one that does not cut is read again whole (list-watch.ts). */
function readListPage(bytes: Buffer, onItem: (item: unknown) => void): PageMeta {
  try {
    const r = new ListReader(onItem);
    r.push(bytes);
    return r.end();
  } catch (err) {
    if (!(err instanceof PageNotCut)) throw err;
    const whole = new ListReader(onItem, undefined, true);
    whole.push(bytes);
    return whole.end();
  }
}

/** Every item handed over (the last of each index when a page is read twice), and the metadata. */
function read(text: string): { items: unknown[]; meta: PageMeta; handed: number } {
  const handed: unknown[] = [];
  const meta = readListPage(Buffer.from(text, 'utf8'), (item) => handed.push(item));
  const n = (JSON.parse(text) as { items: unknown[] }).items.length;
  return { items: handed.slice(handed.length - n), meta, handed: handed.length };
}

const slice = (i: number, extra: Record<string, unknown> = {}): Record<string, unknown> => ({
  metadata: { name: `svc-${i}-abc`, namespace: 'ns', resourceVersion: String(100 + i), labels: { 'kubernetes.io/service-name': `svc-${i}` } },
  addressType: 'IPv4',
  endpoints: [{ addresses: [`192.0.2.${i}`], conditions: { ready: true }, nodeName: 'node-1', targetRef: { kind: 'Pod', name: `p${i}` } }],
  ...extra,
});

t.test('an API server page: each item as JSON.parse gives it, in order, one at a time; its metadata', async (t) => {
  const page = { kind: 'EndpointSliceList', apiVersion: 'discovery.k8s.io/v1', metadata: { resourceVersion: '77', continue: 'tok', remainingItemCount: 3 }, items: [0, 1, 2, 3, 4].map((i) => slice(i)) };
  const text = JSON.stringify(page);
  const r = read(text);
  t.same(r.items, page.items);
  t.equal(r.handed, 5, 'each item once');
  t.same(r.meta, { resourceVersion: '77', continue: 'tok' });
});

t.test('pages not shaped like the API server: the same items (the whole page parsed)', async (t) => {
  const items = [slice(1), slice(2), slice(3)];
  const cases: Record<string, string> = {
    'pretty-printed': JSON.stringify({ metadata: { resourceVersion: '5' }, items }, null, 2),
    'metadata after the items': JSON.stringify({ items, metadata: { resourceVersion: '5', continue: 'c' } }),
    'items with other first keys': JSON.stringify({ metadata: {}, items: [slice(1), { apiVersion: 'v1', ...slice(2) }, slice(3)] }),
    'a nested array whose objects start like an item': JSON.stringify({ metadata: {}, items: [slice(1, { x: [{ a: 1 }, { metadata: 2 }] }), slice(2)] }),
    'strings that look like cuts': JSON.stringify({ metadata: {}, items: [slice(1, { note: '},{"metadata":{"name":"evil"}},{' }), slice(2, { '},{"metadata":': '"items":[' })] }),
    'an "items" key inside the metadata': JSON.stringify({ metadata: { items: [1, 2] }, items }),
    'non-ASCII and escapes': JSON.stringify({ metadata: {}, items: [slice(1, { s: 'ünïcødé \u2028 "q" \\ \n' }), slice(2)] }),
    'empty items': '{"metadata":{"resourceVersion":"9"},"items":[]}',
    'empty items with space': '{"metadata":{"resourceVersion":"9"},"items": [ ]}',
    'one item': JSON.stringify({ metadata: {}, items: [slice(7)] }),
    'duplicate items keys': '{"items":[{"metadata":{"name":"a"}}],"metadata":{},"items":[{"metadata":{"name":"b"}}]}',
    'trailing newline': JSON.stringify({ metadata: {}, items }) + '\n',
  };
  for (const [name, text] of Object.entries(cases)) {
    const whole = JSON.parse(text) as { items: unknown[]; metadata?: PageMeta };
    const r = read(text);
    t.same(r.items, whole.items, name);
    t.same(r.meta, { ...(whole.metadata?.resourceVersion ? { resourceVersion: whole.metadata.resourceVersion } : {}), ...(whole.metadata?.continue ? { continue: whole.metadata.continue } : {}) }, `${name}: metadata`);
  }
});

t.test('random pages: the same items as JSON.parse', async (t) => {
  let seed = 7;
  const rnd = (n: number): number => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) % n);
  const pieces = ['},{', '"metadata":', '{', '}', '[', ']', '"', '\\', 'x', 'é', ',', ':', '"items":['];
  const str = (): string => Array.from({ length: rnd(6) }, () => pieces[rnd(pieces.length)]).join('');
  const value = (depth: number): unknown => {
    const k = rnd(depth > 2 ? 4 : 6);
    if (k === 0) return str();
    if (k === 1) return rnd(1000) - 500;
    if (k === 2) return rnd(2) === 0;
    if (k === 3) return null;
    if (k === 4) return Array.from({ length: rnd(3) }, () => value(depth + 1));
    return Object.fromEntries(Array.from({ length: rnd(4) }, () => [rnd(3) === 0 ? 'metadata' : str(), value(depth + 1)]));
  };
  for (let round = 0; round < 300; round++) {
    const items = Array.from({ length: rnd(5) }, () => ({ metadata: { name: str() }, ...(value(1) as object) }));
    const text = JSON.stringify({ metadata: { resourceVersion: String(round) }, items });
    t.same(read(text).items, items, `round ${round}`);
  }
});

t.test('not JSON: JSON.parse\'s own error; not a list: NotAList', async (t) => {
  for (const text of ['{"metadata":{},"items":[{"a":1},{"a":]}', '{"items":[{"metadata":{}}', 'nope', '{"metadata":{},"items":[{"metadata":{}},{"metadata":{}}],}']) {
    let expected: Error | undefined;
    try {
      JSON.parse(text);
    } catch (err) {
      expected = err as Error;
    }
    t.throws(() => readListPage(Buffer.from(text), () => {}), { name: 'SyntaxError', message: expected!.message }, text);
  }
  for (const text of ['{"kind":"Status","code":500}', '{"items":3}', '{"items":null}', '[1,2]', 'null']) {
    let thrown: unknown;
    try {
      readListPage(Buffer.from(text), () => {});
    } catch (err) {
      thrown = err;
    }
    t.ok(thrown instanceof NotAList, text);
  }
});

/** The page pushed in chunks of `size` bytes (a function: varying sizes) to a ListReader. */
function stream(text: string, size: (i: number) => number): { items: unknown[]; meta: PageMeta; heads: string[]; pending: number } {
  const items: unknown[] = [];
  const heads: string[] = [];
  const r = new ListReader((item) => items.push(item), (head) => heads.push(head.toString()));
  const bytes = Buffer.from(text, 'utf8');
  let pending = 0;
  for (let at = 0, i = 0; at < bytes.length; i++) {
    const n = Math.max(1, size(i));
    r.push(bytes.subarray(at, at + n));
    at += n;
    pending = Math.max(pending, (r as unknown as { buf: Buffer }).buf.length);
  }
  return { items, meta: r.end(), heads, pending };
}

t.test('a page streamed in chunks of any size: each item once, as soon as it is complete, whatever the encoder (compact, Python, indented)', async (t) => {
  const items = Array.from({ length: 40 }, (_, i) => slice(i, i % 3 === 0 ? { managedFields: [{ manager: 'a', apiVersion: 'v1' }, { manager: 'b', metadata: { x: 1 } }] } : {}));
  const page = { kind: 'EndpointSliceList', metadata: { resourceVersion: '12', continue: 'next' }, items };
  const py = (v: unknown): string => JSON.stringify(v).replace(/","/g, '", "').replace(/},{/g, '}, {').replace(/":/g, '": ');
  const texts: Record<string, string> = {
    compact: JSON.stringify(page),
    python: py(page),
    indented: JSON.stringify(page, null, 4),
    'apiVersion first (kubectl), also first in managedFields entries': JSON.stringify({ ...page, items: items.map((x) => ({ apiVersion: 'discovery.k8s.io/v1', ...x, managedFields: [{ apiVersion: 'v1', f: 1 }, { apiVersion: 'v1', f: 2 }] })) }),
    'one item with another first key': JSON.stringify({ ...page, items: items.map((x, i) => (i === 5 ? { kind: 'X', ...x } : x)) }),
  };
  for (const [name, text] of Object.entries(texts)) {
    const want = (JSON.parse(text) as { items: unknown[] }).items;
    for (const [how, size] of [
      ['1 byte', () => 1],
      ['7 bytes', () => 7],
      ['random', (i: number) => ((i * 7919) % 3000) + 1],
      ['whole', () => text.length * 4],
    ] as Array<[string, (i: number) => number]>) {
      const r = stream(text, size);
      t.same(r.items, want, `${name}, ${how}: the items, each once`);
      t.same(r.meta, { resourceVersion: '12', continue: 'next' }, `${name}, ${how}: metadata`);
      t.equal(r.heads.length, 1, `${name}, ${how}: the head told once`);
      t.match(r.heads[0], /"continue": ?"next".*"items"$/s);
    }
  }
});

t.test('a streamed page keeps about one item of bytes, not the page', async (t) => {
  const items = Array.from({ length: 2000 }, (_, i) => slice(i));
  const text = JSON.stringify({ metadata: { resourceVersion: '1' }, items });
  const r = stream(text, () => 4096);
  t.equal(r.items.length, 2000);
  t.ok(r.pending < 8192, `at most ${r.pending} bytes held (the page: ${text.length})`);
});

t.test('a streamed page found wrong only at its end throws PageNotCut (read it again whole); read again whole, it reads', async (t) => {
  const text = '{"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}],"metadata":{"resourceVersion":"3","x":[1]}}';
  const r = new ListReader(() => {});
  r.push(Buffer.from(text));
  let thrown: unknown;
  try {
    r.end();
  } catch (err) {
    thrown = err;
  }
  t.ok(thrown instanceof PageNotCut, 'PageNotCut');
  t.same(read(text).items, [{ metadata: { name: 'a' } }, { metadata: { name: 'b' } }]);
  t.same(read(text).meta, { resourceVersion: '3' });
  const whole = new ListReader(() => {}, undefined, true);
  for (const c of text) whole.push(Buffer.from(c));
  t.same(whole.end(), { resourceVersion: '3' }, 'read whole when asked');
});

t.test('adversarial pages stay linear: an item full of objects that begin like an item, a page that never cuts', async (t) => {
  // 20,000 nested objects whose first key is the items' first key: each looks like a cut.
  const inner = Array.from({ length: 20_000 }, (_, i) => ({ metadata: i }));
  const nested = JSON.stringify({ metadata: {}, items: [{ metadata: {}, x: inner }, { metadata: {} }] });
  const parse = JSON.parse;
  let parses = 0;
  JSON.parse = ((text: string, reviver?: Parameters<typeof parse>[1]) => {
    parses++;
    return parse(text, reviver);
  }) as typeof JSON.parse;
  let r;
  try {
    r = stream(nested, () => 65536);
  } finally {
    JSON.parse = parse;
  }
  t.equal(r.items.length, 2);
  t.ok(parses < 100, `the item is not parsed again at each nested object (${parses} parses)`);
  // Only the first item begins with `kind`: no cut until the end; 16 MB in 1 KB chunks.
  const items = Array.from({ length: 60_000 }, (_, i) => slice(i));
  items[0] = { kind: 'EndpointSlice', ...items[0] };
  const never = JSON.stringify({ metadata: { resourceVersion: '1' }, items });
  const t0 = Date.now();
  t.equal(stream(never, () => 1024).items.length, 60_000);
  t.ok(Date.now() - t0 < 3000, `bytes not copied again at every chunk (${Date.now() - t0} ms for ${never.length} bytes)`);
});
