/**
 * XXH64, seed 0 (src/convert/xxhash.ts), against the reference
 * implementation's values (libxxhash 0.8): every input length class (under 4,
 * 4-byte and 8-byte tails, one and several 32-byte stripes).
 */
import t from 'tap';
import { xxh64 } from '../../src/convert/xxhash.js';

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
