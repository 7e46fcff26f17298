/**
 * A small seeded PRNG (mulberry32) for generated test cases, so that a failure
 * reproduces: `prng(seed)` gives numbers in [0, 1); `below(r, n)` an integer
 * in [0, n).
 */
export function prng(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let x = Math.imul(a ^ (a >>> 15), 1 | a);
    x = (x + Math.imul(x ^ (x >>> 7), 61 | x)) ^ x;
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

/** An integer in [0, n) from `r`. */
export const below = (r: () => number, n: number): number => Math.floor(r() * n);
