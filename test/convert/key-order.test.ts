/**
 * The order of endpoint keys from their hash words (src/convert/key-order.ts)
 * against the order of their hex strings (hex64), which it stands for.
 */
import t from 'tap';
import { randomInt } from 'node:crypto';
import { keyOrder } from '../../src/convert/key-order.js';
import { hex64 } from '../../src/convert/xxhash.js';

/** What keyOrder must give: indexes sorted by hex string, stable. */
const byHex = (words: number[]): number[] => {
  const keys = Array.from({ length: words.length / 2 }, (_, k) => hex64(words[2 * k]!, words[2 * k + 1]!));
  return keys.map((_, k) => k).sort((a, b) => (keys[a]! < keys[b]! ? -1 : keys[a]! > keys[b]! ? 1 : 0));
};

t.test('orders as the hex strings, leading zeros and prefixes included', async (t) => {
  // 0, 1, 0x10, 0xf, 0x100000000, 0x1f, 0xffffffffffffffff, 0xabc00000def, 0x0abc (prefixes of one another, short and long)
  const words = [0, 0, 0, 1, 0, 0x10, 0, 0xf, 1, 0, 0, 0x1f, -1, -1, 0x0abc, 0x00000def, 0, 0x0abc];
  t.same(keyOrder(words), byHex(words));
  t.same(keyOrder([]), []);
});

t.test('random keys, some with leading zero digits', async (t) => {
  let bad = 0;
  for (let round = 0; round < 2000; round++) {
    const words: number[] = [];
    for (let k = 0, n = randomInt(1, 20); k < n; k++) {
      const shift = randomInt(0, 64);
      const hi = shift >= 32 ? 0 : (randomInt(0, 2 ** 32) >>> shift) | 0;
      const lo = shift >= 32 ? (randomInt(0, 2 ** 32) >>> (shift - 32)) | 0 : randomInt(0, 2 ** 32) | 0;
      words.push(hi, lo);
    }
    const want = new Set(byHex(words).map((k) => hex64(words[2 * k]!, words[2 * k + 1]!))).size === words.length / 2 ? byHex(words) : undefined;
    if (JSON.stringify(keyOrder(words)) !== JSON.stringify(want)) bad++;
  }
  t.equal(bad, 0);
});

t.test('two equal keys: undefined', async (t) => {
  t.equal(keyOrder([0, 5, 1, 2, 0, 5]), undefined);
});
