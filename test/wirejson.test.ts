/**
 * The Endpoint wire -> JSON fast path must give exactly what the reference
 * path (protobufjs decode + gojson encode) gives, for canonical bytes (fast
 * path taken) and for anything else (fallback), errors included.
 */
import t from 'tap';
import protobuf from 'protobufjs';
import { marshalEndpoint, marshalOpItem, unmarshalEndpoint, unmarshalOpItem } from '../src/codec.js';
import { encodeEndpoint } from '../src/gojson.js';
import type { Endpoint } from '../src/model.js';
import { decodeOpItem, endpointJson, endpointJsonFast } from '../src/wirejson.js';

function reference(bytes: Uint8Array): { json?: string; error?: string } {
  try {
    return { json: encodeEndpoint(unmarshalEndpoint(bytes)) };
  } catch (err) {
    return { error: (err as Error).message };
  }
}

function ours(bytes: Uint8Array): { json?: string; error?: string } {
  try {
    return { json: endpointJson(bytes) };
  } catch (err) {
    return { error: (err as Error).message };
  }
}

// A deterministic PRNG so that a failure reproduces.
let seed = 12345;
const rnd = (): number => {
  seed = (seed * 1103515245 + 12345) & 0x7fffffff;
  return seed / 0x80000000;
};
const pick = <T>(xs: T[]): T => xs[Math.floor(rnd() * xs.length)]!;
const texts = ['', 'a', 'web-0', 'x"y\\z', '<&>', 'tab\there\nnl\r', '\u0001\u001f\u007f', 'caf\u00e9', '\u2028\u2029', '\u{1F600}', '\uFF21', 'é<\u2029>'];

function randomEndpoint(): Endpoint {
  const e: Endpoint = {};
  if (rnd() < 0.5) e.Hostname = pick(texts);
  if (rnd() < 0.8) {
    e.IPs = {};
    if (rnd() < 0.8) e.IPs.V4 = Array.from({ length: 1 + Math.floor(rnd() * 3) }, () => pick(['10.0.0.1', '', '192.0.2.7', pick(texts)]));
    if (rnd() < 0.3) e.IPs.V6 = [pick(['2001:db8::1', 'fe80::1', pick(texts)])];
  }
  if (rnd() < 0.3) e.Local = true;
  if (rnd() < 0.6) {
    e.PortOverrides = Array.from({ length: Math.floor(rnd() * 3) }, () => {
      const p: { Name?: string; Port?: number } = {};
      if (rnd() < 0.7) p.Name = pick(texts);
      if (rnd() < 0.8) p.Port = pick([1, 80, 8080, 65535, 2147483647, -1, -2147483648]);
      return p;
    });
  }
  if (rnd() < 0.7) {
    e.Scopes = {};
    if (rnd() < 0.7) e.Scopes.Internal = true;
    if (rnd() < 0.7) e.Scopes.External = true;
  }
  return e;
}

t.test('canonical bytes: the fast path gives the reference JSON', async (t) => {
  let fast = 0;
  for (let n = 0; n < 3000; n++) {
    const bytes = marshalEndpoint(randomEndpoint());
    const want = reference(bytes);
    const got = ours(bytes);
    if (want.json !== got.json || want.error !== got.error) {
      t.same(got, want, `endpoint bytes ${Buffer.from(bytes).toString('hex')}`);
      return;
    }
    if (endpointJsonFast(bytes) !== undefined) fast++;
  }
  // Only negative ports (10-byte varints) leave the fast path.
  t.ok(fast > 2000, `fast path taken for ${fast} of 3000`);
  t.equal(endpointJsonFast(marshalEndpoint({ IPs: { V4: ['10.1.2.3'] }, Scopes: { Internal: true, External: true } })), '{"IPs":{"V4":["10.1.2.3"]},"Scopes":{"Internal":true,"External":true}}');
  t.equal(endpointJsonFast(new Uint8Array()), '{}');
});

/** Hand-built bytes: field tags, lengths, varints. */
const w = protobuf.Writer;

t.test('non-canonical and malformed bytes: same result as the reference, by fallback', async (t) => {
  const cases: Array<[string, Uint8Array]> = [
    ['fields out of order', w.create().uint32((5 << 3) | 2).fork().ldelim().uint32((1 << 3) | 2).string('h').finish()],
    ['a singular field twice', w.create().uint32((1 << 3) | 2).string('a').uint32((1 << 3) | 2).string('b').finish()],
    ['IPs twice', w.create().uint32((2 << 3) | 2).fork().uint32((1 << 3) | 2).string('10.0.0.1').ldelim().uint32((2 << 3) | 2).fork().uint32((2 << 3) | 2).string('::1').ldelim().finish()],
    ['unknown field', w.create().uint32((9 << 3) | 0).uint32(7).uint32((1 << 3) | 2).string('h').finish()],
    ['interrupted repeated field', w.create().uint32((4 << 3) | 2).fork().ldelim().uint32((5 << 3) | 2).fork().ldelim().uint32((4 << 3) | 2).fork().ldelim().finish()],
    ['V6 before V4', w.create().uint32((2 << 3) | 2).fork().uint32((2 << 3) | 2).string('::1').uint32((1 << 3) | 2).string('10.0.0.1').ldelim().finish()],
    ['Local as a long varint', w.create().uint32((3 << 3) | 0).uint64(2 ** 32).finish()],
    ['Local = 2', w.create().uint32((3 << 3) | 0).uint32(2).finish()],
    ['empty Hostname on the wire', w.create().uint32((1 << 3) | 2).string('').finish()],
    ['zero Port on the wire', w.create().uint32((4 << 3) | 2).fork().uint32((2 << 3) | 0).uint32(0).ldelim().finish()],
    ['wrong wire type', w.create().uint32((1 << 3) | 0).uint32(1).finish()],
    ['truncated', marshalEndpoint({ Hostname: 'abcdef' }).slice(0, 4)],
    ['length past the end', Uint8Array.of(0x0a, 0x7f, 0x61)],
    ['invalid UTF-8', Uint8Array.of(0x0a, 0x02, 0xc3, 0x28)],
    ['overlong UTF-8', Uint8Array.of(0x0a, 0x02, 0xc0, 0xaf)],
    ['surrogate in UTF-8', Uint8Array.of(0x0a, 0x03, 0xed, 0xa0, 0x80)],
    ['truncated UTF-8 sequence', Uint8Array.of(0x0a, 0x02, 0x61, 0xe2)],
    ['garbage', Uint8Array.of(0xff, 0xff, 0xff, 0xff, 0xff, 0xff)],
  ];
  for (const [what, bytes] of cases) t.same(ours(bytes), reference(bytes), what);
});

t.test('decodeOpItem equals unmarshalOpItem, canonical or not', async (t) => {
  const same = (bytes: Uint8Array, what: string): void => {
    let want: unknown;
    let got: unknown;
    try {
      want = unmarshalOpItem(bytes);
    } catch (err) {
      want = { error: (err as Error).message };
    }
    try {
      got = decodeOpItem(bytes);
    } catch (err) {
      got = { error: (err as Error).message };
    }
    t.same(got, want, what);
  };
  const ep = marshalEndpoint({ IPs: { V4: ['10.0.0.1'] } });
  same(marshalOpItem({ Sync: {} }), 'Sync');
  same(marshalOpItem({ Reset: {} }), 'Reset');
  same(marshalOpItem({ Set: { Ref: { Set: 2, Path: 'default/a/pod-1' }, Bytes: ep } }), 'Set');
  same(marshalOpItem({ Set: { Ref: { Set: 1, Path: 'default/a' }, Bytes: new Uint8Array() } }), 'Set with empty bytes');
  same(marshalOpItem({ Set: { Bytes: ep } }), 'Set without Ref');
  same(marshalOpItem({ Set: { Ref: { Set: 10, Path: 'x' }, Bytes: ep } }), 'Set of an unknown set');
  same(marshalOpItem({ Delete: { Set: 2, Path: 'default/a/pod-1' } }), 'Delete');
  same(marshalOpItem({ Delete: { Set: 0, Path: '' } }), 'Delete of nothing');
  same(marshalOpItem({ Set: { Ref: { Set: 2, Path: 'default/caf\u00e9/p' }, Bytes: ep } }), 'non-ASCII path');
  same(marshalOpItem({ Set: { Ref: { Set: -1, Path: 'x' }, Bytes: ep } }), 'negative enum');
  same(new Uint8Array(), 'empty message (an unknown op)');
  same(Uint8Array.of(0x2a, 0x00), 'an op this codec does not know');
  same(Uint8Array.of(0x0a, 0x00, 0x22, 0x00), 'two ops: the last one wins');
  same(Uint8Array.of(0x12, 0x04, 0x0a, 0x02, 0x12, 0x02), 'Ref with a truncated Path');
  same(Uint8Array.of(0x12, 0x05, 0x0a, 0x03, 0x12, 0x01, 0xff), 'Ref with an invalid UTF-8 Path');
  same(Uint8Array.of(0x12, 0x7f), 'length past the end');
  same(w.create().uint32((2 << 3) | 2).fork().uint32((2 << 3) | 2).bytes(ep).uint32((1 << 3) | 2).fork().uint32(8).uint32(2).ldelim().ldelim().finish(), 'Bytes before Ref');
});
