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
  const lines: Buffer[] = [];
  const blocks = packLines(parts, lines);
  t.equal(blocks.length, 3);
  t.same(
    lines.map((l) => l.toString()),
    parts.map((p) => p.toString()),
  );
  t.equal(Buffer.concat(blocks).toString(), parts.join(''));
  t.same(packLines([], []), [], 'nothing: no block');
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
