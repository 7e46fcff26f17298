/** Change sets (--changes): exact bytes, order, and their cost (references compared, not bytes). */
import t from 'tap';
import { LINES_PER_BLOCK } from '../src/line-blocks.js';
import { changeSet, fullInput } from '../src/changes.js';
import type { Service } from '../src/model.js';
import { Store, stateFromItems, type State } from '../src/state.js';

const svc = (ns: string, name: string, port = 80): Service => ({ Namespace: ns, Name: name, Type: 'ClusterIP', Ports: [{ Protocol: 1, Port: port }] });
const text = (chunks: readonly Buffer[]): string => Buffer.concat(chunks as Buffer[]).toString('utf8');
const lineOf = (s: State, key: string): string => s.lines[s.keys!.indexOf(key)]!.toString('utf8');

t.test('add, modify, remove: Previous lines then new lines, in kpng order, unchanged Services left out', async (t) => {
  const store = new Store();
  for (const [ns, n] of [['a', 'x'], ['a', 'y'], ['b', 'z'], ['c', 'w']] as const) store.setService(`${ns}/${n}`, svc(ns, n));
  const p = store.snapshot();
  store.setService('a/y', svc('a', 'y', 81)); // modified
  store.deleteService('b/z'); // removed
  store.setService('a/x-new', svc('a', 'x-new')); // added: sorts after a/x, before a/y ("/" first)
  store.setService('d/v', svc('d', 'v')); // added last
  const n = store.snapshot();
  const c = changeSet(p, n);
  t.equal(c.kind, 'changes');
  const prev = (s: State, key: string): string => `{"Previous":${lineOf(s, key).slice(0, -1)}}\n`;
  const expected = lineOf(n, 'a/x-new') + prev(p, 'a/y') + lineOf(n, 'a/y') + prev(p, 'b/z') + lineOf(n, 'd/v');
  t.equal(text(c.chunks), expected);
  t.equal(c.bytes, Buffer.byteLength(expected));
  for (const l of text(c.chunks).trimEnd().split('\n')) JSON.parse(l); // every line is JSON
  t.equal(text(changeSet(n, n).chunks), '', 'no change: empty');
  t.equal(text(changeSet({ lines: [], services: 0, endpoints: 0, bytes: 0 }, n).chunks), text(fullInput(n).chunks), 'from nothing: every line added');
  t.equal(
    text(changeSet(n, { lines: [], services: 0, endpoints: 0, bytes: 0 }).chunks),
    n.lines.map((l) => `{"Previous":${l.toString().slice(0, -1)}}\n`).join(''),
    'to nothing: every line a Previous',
  );
});

t.test('states not in kpng order (a JSONL fixture in its own order): the full state\'s order, a removed Service after its predecessor', async (t) => {
  const item = (n: string, port = 80) => ({ Service: svc('n', n, port), Endpoints: [] });
  // kept order: z, a, m, b; then z modified, m removed, k added between a and b, b kept
  const p = stateFromItems([item('z'), item('a'), item('m'), item('b')]);
  const n = stateFromItems([item('z', 81), item('a'), item('k'), item('b', 82)]);
  t.not(p.lines[0]!.toString(), n.lines[0]!.toString());
  const line = (s: State, i: number): string => s.lines[i]!.toString();
  const prev = (s: State, i: number): string => `{"Previous":${line(s, i).slice(0, -1)}}\n`;
  t.equal(text(changeSet(p, n).chunks), prev(p, 0) + line(n, 0) + prev(p, 2) + line(n, 2) + prev(p, 3) + line(n, 3));
  const first = stateFromItems([item('y'), item('a')]);
  t.equal(text(changeSet(first, stateFromItems([item('a')])).chunks), prev(first, 0), 'a removed first Service comes first');
});

t.test('lines are compared by reference first, by bytes when not the same Buffer; states without keys work too', async (t) => {
  const a = stateFromItems([{ Service: svc('n', 'a'), Endpoints: [] }, { Service: svc('n', 'b'), Endpoints: [] }]);
  const b = stateFromItems([{ Service: svc('n', 'a'), Endpoints: [] }, { Service: svc('n', 'b', 90), Endpoints: [] }]);
  t.not(a.lines[0], b.lines[0], 'fresh Buffers');
  t.equal(text(changeSet(a, b).chunks), `{"Previous":${a.lines[1]!.toString().slice(0, -1)}}\n${b.lines[1]!.toString()}`);
  const { keys: _k, ...noKeys } = b;
  const { keys: _j, ...noKeysA } = a;
  t.equal(text(changeSet(noKeysA, noKeys).chunks), text(changeSet(a, b).chunks), 'keys read from the lines');
});

t.test('one change among 10,000 Services costs reference comparisons, bytes only within one block', async (t) => {
  const store = new Store();
  for (let i = 0; i < 10_000; i++) store.setService(`ns/svc-${i}`, svc('ns', `svc-${i}`));
  const p = store.snapshot();
  store.setService('ns/svc-5000', svc('ns', 'svc-5000', 8080));
  const n = store.snapshot();
  let equalsCalls = 0;
  const orig = Buffer.prototype.equals;
  Buffer.prototype.equals = function (this: Buffer, other: Uint8Array) {
    equalsCalls++;
    return orig.call(this, other);
  };
  try {
    const c = changeSet(p, n);
    t.equal(c.chunks.length, 4, 'one Previous (3 pieces) and one line');
  } finally {
    Buffer.prototype.equals = orig;
  }
  // The other lines of the changed line's block are new views of the same bytes (line-blocks.ts).
  t.ok(equalsCalls >= 1 && equalsCalls <= LINES_PER_BLOCK, `only the changed line's block compared by bytes (${equalsCalls})`);
});
