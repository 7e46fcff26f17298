/**
 * XXH64, seed 0 (src/convert/xxhash.ts), against the reference
 * implementation's values (libxxhash 0.8): every input length class (under 4,
 * 4-byte and 8-byte tails, one and several 32-byte stripes).
 */
import t from 'tap';
import { randomBytes } from 'node:crypto';
import { hex64, xxh64, xxh64Hex, xxh64Write } from '../../src/convert/xxhash.js';

t.test('XXH64 matches the reference vectors', async (t) => {
  const h = (b: Buffer) => xxh64(b).toString(16).padStart(16, '0');
  const cases: Array<[Buffer, string]> = [
    [Buffer.from(''), 'ef46db3751d8e999'],
    [Buffer.from('a'), 'd24ec4f1a98c6e5b'],
    [Buffer.from('abc'), '44bc2cf5ad770999'],
    [Buffer.from('0123456789abcdef0123456789abcdef'), '642a94958e71e6c5'],
    [Buffer.from('Nobody inspects the spammish repetition'), 'fbcea83c8a378bf1'],
    [Buffer.from('The quick brown fox jumps over the lazy dog'), '0b242d361fda71bc'],
    [Buffer.from(Array.from({ length: 100 }, (_, i) => i)), '6ac1e58032166597'],
  ];
  for (const [input, want] of cases) t.equal(h(input), want, `${input.length} bytes`);
});

/** XXH64 as the specification writes it, in BigInt (the implementation before issue 11): the oracle. */
function reference(buf: Uint8Array): bigint {
  const M = (1n << 64n) - 1n;
  const [P1, P2, P3, P4, P5] = [11400714785074694791n, 14029467366897019727n, 1609587929392839161n, 9650029242287828579n, 2870177450012600261n];
  const rotl = (x: bigint, r: bigint) => ((x << r) | (x >> (64n - r))) & M;
  const round = (acc: bigint, lane: bigint) => (rotl((acc + lane * P2) & M, 31n) * P1) & M;
  const merge = (acc: bigint, v: bigint) => ((acc ^ round(0n, v)) * P1 + P4) & M;
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const len = buf.length;
  let p = 0;
  let h: bigint;
  if (len >= 32) {
    let [v1, v2, v3, v4] = [(P1 + P2) & M, P2, 0n, (M + 1n - P1) & M];
    for (; p <= len - 32; p += 32) {
      v1 = round(v1, dv.getBigUint64(p, true));
      v2 = round(v2, dv.getBigUint64(p + 8, true));
      v3 = round(v3, dv.getBigUint64(p + 16, true));
      v4 = round(v4, dv.getBigUint64(p + 24, true));
    }
    h = (rotl(v1, 1n) + rotl(v2, 7n) + rotl(v3, 12n) + rotl(v4, 18n)) & M;
    h = merge(merge(merge(merge(h, v1), v2), v3), v4);
  } else h = P5;
  h = (h + BigInt(len)) & M;
  for (; p + 8 <= len; p += 8) h = (rotl(h ^ round(0n, dv.getBigUint64(p, true)), 27n) * P1 + P4) & M;
  if (p + 4 <= len) {
    h = (rotl(h ^ ((BigInt(dv.getUint32(p, true)) * P1) & M), 23n) * P2 + P3) & M;
    p += 4;
  }
  for (; p < len; p++) h = (rotl(h ^ ((BigInt(buf[p]!) * P5) & M), 11n) * P1) & M;
  h = ((h ^ (h >> 33n)) * P2) & M;
  h = ((h ^ (h >> 29n)) * P3) & M;
  return h ^ (h >> 32n);
}

t.test('the 32-bit implementation equals the BigInt one for every length up to 300, in every form', async (t) => {
  let bad = 0;
  for (let len = 0; len <= 300; len++) {
    for (let k = 0; k < 4; k++) {
      const b = randomBytes(len);
      const want = reference(b);
      // The prefix forms hash the first `len` bytes of a longer buffer.
      const longer = Buffer.concat([b, randomBytes(5)]);
      const words: number[] = [7, 0, 0, 8];
      xxh64Write(longer, len, words, 1);
      const fromWords = (BigInt(words[1]! >>> 0) << 32n) | BigInt(words[2]! >>> 0);
      if (xxh64(b) !== want || fromWords !== want || words[0] !== 7 || words[3] !== 8 || xxh64Hex(b) !== want.toString(16) || xxh64Hex(longer, len) !== want.toString(16)) bad++;
    }
  }
  t.equal(bad, 0);
});

t.test('hex64: hex without leading zeros, as BigInt prints it', async (t) => {
  t.equal(hex64(0, 0), '0');
  t.equal(hex64(0, 1), '1');
  t.equal(hex64(0, -1), 'ffffffff');
  t.equal(hex64(1, 0), '100000000');
  t.equal(hex64(-1, -1), 'ffffffffffffffff');
  t.equal(hex64(0x0abc, 0x00000def), 'abc00000def');
});
