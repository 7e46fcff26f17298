/**
 * Endpoint keys (src/convert/endpoint-key.ts): the hand-written protobuf
 * encoding of {Hostname, IPs, Local} hashes to the same key as protobufjs'
 * encoding (codec.ts), which is kpng's.
 */
import t from 'tap';
import { marshalEndpoint } from '../../src/codec.js';
import { writeEndpointKey } from '../../src/convert/endpoint-key.js';
import { hex64, xxh64 } from '../../src/convert/xxhash.js';
import type { IPSet } from '../../src/model.js';

/** The key as kpng computed it: XXH64 of the protobuf of the three fields, hex. */
function kpngKey(hostname: string | undefined, ips: IPSet | undefined, local: boolean): string {
  return xxh64(marshalEndpoint({ ...(hostname ? { Hostname: hostname } : {}), ...(ips ? { IPs: ips } : {}), ...(local ? { Local: true } : {}) })).toString(16);
}

function ours(hostname: string | undefined, ips: IPSet | undefined, local: boolean): string {
  const words: number[] = [1, 2, 3, 4];
  writeEndpointKey(hostname, ips, local, words, 1);
  t.same([words[0], words[3]], [1, 4], 'two words written, at the index given');
  return hex64(words[1]!, words[2]!);
}

t.test('the key equals the hash of protobufjs encoding, whatever is set', async (t) => {
  const many = Array.from({ length: 40 }, (_, i) => `10.0.${i}.${i + 100}`);
  const cases: Array<[string | undefined, IPSet | undefined, boolean]> = [
    [undefined, undefined, false],
    [undefined, undefined, true],
    ['', { V4: ['10.1.0.1'] }, false], // an empty hostname is left off
    [undefined, { V4: ['10.1.0.1'] }, false],
    [undefined, { V4: ['10.1.0.1'] }, true],
    ['web-0', { V4: ['10.1.0.1'], V6: ['fd00::1'] }, true],
    [undefined, {}, false], // a present but empty set is sent
    [undefined, { V6: ['2001:db8::1', '::ffff:1.2.3.4'] }, false],
    ['höst-ünïcode-名前', { V4: ['10.1.0.1'] }, false], // non-ASCII: UTF-8 bytes
    ['x'.repeat(200), { V4: many }, true], // lengths past one varint byte
    [undefined, { V4: many, V6: many.map((a) => `::ffff:${a}`) }, false],
  ];
  for (const [h, ips, local] of cases) t.equal(ours(h, ips, local), kpngKey(h, ips, local), JSON.stringify([h?.slice(0, 20), ips?.V4?.length, ips?.V6?.length, local]));
  // A buffer outgrown and regrown keeps working.
  t.equal(ours('y'.repeat(5000), undefined, false), kpngKey('y'.repeat(5000), undefined, false));
  t.equal(ours(undefined, { V4: ['10.9.9.9'] }, false), kpngKey(undefined, { V4: ['10.9.9.9'] }, false));
});
