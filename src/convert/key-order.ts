/**
 * The order of endpoint keys (xxhash.ts `hex64`: hex without leading zeros)
 * from their hash words, without making the hex strings: a first sync at
 * 10,000 Services × 10 endpoints otherwise makes 90,000 strings (and an
 * object each to sort them by) only to order each Service's endpoints.
 *
 * Hex digits sort as their values ('0'-'9' before 'a'-'f'), so two keys
 * compare as their digits shifted to the top of 64 bits (a zero after the
 * last digit is the smallest digit: a prefix sorts first), then the one with
 * fewer digits first (of two equal after the shift, the shorter is a prefix
 * of the longer).
 */

/**
 * The indexes of the keys `words` (pairs of int32 words: hi, lo, as
 * endpoint-key.ts writes them) in the order of their hex strings, or
 * undefined when two keys are equal (the caller takes the way that compares
 * whole endpoints).
 */
export function keyOrder(words: readonly number[]): number[] | undefined {
  const n = words.length >> 1;
  // Per key: its digits at the top (two unsigned words) and its digit count.
  const top = new Array<number>(2 * n);
  const digits = new Array<number>(n);
  const order = new Array<number>(n);
  for (let k = 0; k < n; k++) {
    const hi = words[2 * k]! >>> 0;
    const lo = words[2 * k + 1]! >>> 0;
    const zeros = hi !== 0 ? Math.clz32(hi) >>> 2 : lo !== 0 ? 8 + (Math.clz32(lo) >>> 2) : 15;
    const s = 4 * zeros;
    top[2 * k] = s === 0 ? hi : s < 32 ? ((hi << s) | (lo >>> (32 - s))) >>> 0 : (lo << (s - 32)) >>> 0;
    top[2 * k + 1] = s < 32 ? (lo << s) >>> 0 : 0;
    digits[k] = 16 - zeros;
    order[k] = k;
  }
  order.sort((a, b) => top[2 * a]! - top[2 * b]! || top[2 * a + 1]! - top[2 * b + 1]! || digits[a]! - digits[b]!);
  for (let k = 1; k < n; k++) {
    const a = order[k - 1]!;
    const b = order[k]!;
    if (top[2 * a] === top[2 * b] && top[2 * a + 1] === top[2 * b + 1] && digits[a] === digits[b]) return undefined;
  }
  return order;
}
