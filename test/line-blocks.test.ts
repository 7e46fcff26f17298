/**
 * Lines packed into blocks (src/line-blocks.ts), and the Store keeping its
 * states packed: the blocks hold exactly the lines' bytes, every line is a
 * view of its block, and a change re-packs only the blocks it touches.
 */
import t, { type Test } from 'tap';
import { LINES_PER_BLOCK, packLines } from '../src/line-blocks.js';
import type { Service } from '../src/model.js';
import { stateFromItems, Store, type State } from '../src/state.js';

const svc = (name: string, port = 80): Service => ({ Namespace: 'ns', Name: name, Type: 'ClusterIP', IPs: { ClusterIPs: { V4: ['192.0.2.1'] } }, Ports: [{ Protocol: 1, Port: port }] });
const name = (i: number) => `svc-${String(i).padStart(4, '0')}`;

/** The blocks are the lines, byte for byte, and each line lies inside one block. */
function checkPacked(t: Test, s: State, msg: string): void {
  const blocks = s.blocks!;
  t.ok(blocks, `${msg}: packed`);
  t.equal(blocks.length, Math.ceil(s.lines.length / LINES_PER_BLOCK), `${msg}: ${LINES_PER_BLOCK} lines per block`);
  t.ok(Buffer.concat(blocks as Buffer[]).equals(Buffer.concat(s.lines as Buffer[])), `${msg}: the same bytes`);
  const views = s.lines.every((l, i) => l.buffer === blocks[Math.floor(i / LINES_PER_BLOCK)]!.buffer);
  t.ok(views, `${msg}: every line is a view of its block`);
  t.equal(blocks.reduce((n, b) => n + b.length, 0), s.bytes, `${msg}: bytes`);
}

t.test('packLines: strings and bytes, non-ASCII included, in order', async (t) => {
  const parts = ['{"a":"é"}\n', Buffer.from('{"b":"\u2028 😀"}\n'), ...Array.from({ length: 150 }, (_, i) => `{"i":${i}}\n`)];
  const { blocks, lineBlocks } = packLines(parts);
  const lines = lineBlocks.flat();
  t.equal(blocks.length, 3);
  t.same(
    lines.map((l) => l.toString()),
    parts.map((p) => p.toString()),
  );
  t.equal(Buffer.concat(blocks).toString(), parts.join(''));
  t.same(packLines([]).blocks, [], 'nothing: no block');
});

t.test('the Store keeps its states packed across changes, additions and removals', async (t) => {
  const store = new Store();
  for (let i = 0; i < 300; i++) store.setService(`ns/${name(i)}`, svc(name(i)));
  const s1 = store.snapshot();
  checkPacked(t, s1, 'first state');

  store.setService(`ns/${name(70)}`, svc(name(70), 8080)); // block 1
  const s2 = store.snapshot();
  checkPacked(t, s2, 'one Service changed');
  for (let b = 0; b < s2.blocks!.length; b++) {
    if (b === 1) t.not(s2.blocks![b], s1.blocks![b], 'its block is re-packed');
    else t.equal(s2.blocks![b], s1.blocks![b], `block ${b} is kept`);
  }
  t.match(s2.lines[70]!.toString(), /"Port":8080/);
  t.equal(s1.lines[70]!.toString().includes('8080'), false, 'the earlier state is unchanged');

  store.deleteService(`ns/${name(3)}`);
  store.setService('ns/zzz', svc('zzz'));
  const s3 = store.snapshot();
  checkPacked(t, s3, 'a Service removed, one added');
  t.equal(s3.lines.length, 300);
  t.match(s3.lines[299]!.toString(), /"Name":"zzz"/);

  store.setService('ns/zzz', svc('zzz', 9090)); // the last, partial block
  const s4 = store.snapshot();
  checkPacked(t, s4, 'a change in the last block');
  t.equal(s4.blocks![0], s3.blocks![0]);
});

t.test('replayed states are packed too', async (t) => {
  const s = stateFromItems(Array.from({ length: 70 }, (_, i) => ({ Service: svc(name(i)), Endpoints: [] })));
  checkPacked(t, s, 'stateFromItems');
});

t.test('consecutive states share the line arrays of the blocks a change did not touch', async (t) => {
  const { changeSet } = await import('../src/changes.js');
  const { sameState } = await import('../src/state.js');
  const store = new Store();
  for (let i = 0; i < 300; i++) store.setService(`ns/${name(i)}`, svc(name(i)));
  const s1 = store.snapshot();
  t.equal(s1.lineBlocks!.length, s1.blocks!.length, 'one line array per block');
  t.same(s1.lineBlocks!.flat(), s1.lines, 'lines are the blocks’ line arrays, in order');
  store.setService(`ns/${name(130)}`, svc(name(130), 81));
  const s2 = store.snapshot();
  const shared = s2.lineBlocks!.map((b, i) => b === s1.lineBlocks![i]);
  t.same(shared, [true, true, false, true, true], 'only the block of the changed Service has new line arrays');
  t.equal(s1.lines[130]!.toString().includes('"Port":80'), true, 'the earlier state is unchanged');
  t.equal(s2.lines[130]!.toString().includes('"Port":81'), true, 'the new state has the change');
  const copy = { ...s2 };
  t.same(copy.lines, s2.lines, '{ ...state } keeps its lines');
  // The same answers as for plain states of the same lines.
  const plain = (s: State): State => ({ lines: [...s.lines], services: s.services, endpoints: s.endpoints, bytes: s.bytes, keys: s.keys });
  t.equal(sameState(s1, s2), false, 'sameState: different');
  t.equal(sameState(s2, store.snapshot()), true, 'sameState: the same state again');
  const c = changeSet(s1, s2);
  const cp = changeSet(plain(s1), plain(s2));
  t.equal(Buffer.concat(c.chunks as Buffer[]).toString(), Buffer.concat(cp.chunks as Buffer[]).toString(), 'changeSet: the same as from plain states');
  t.match(Buffer.concat(c.chunks as Buffer[]).toString(), /^\{"Previous":.*"Port":80.*\}\n.*"Port":81/s, 'Previous line, then the new one');
  store.setService(`ns/${name(130)}`, svc(name(130), 80));
  t.equal(sameState(s1, store.snapshot()), true, 'changed back: the same as the first state (bytes compared in the unshared block)');
});
