/** A list page read one item at a time: the same items and metadata as JSON.parse of the whole page, whatever its shape. */
import t from 'tap';
import { NotAList, readListPage, type PageMeta } from '../../../src/sources/kube/list-page.js';

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
