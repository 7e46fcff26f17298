/**
 * XXH64 (seed 0), the hash kpng (github.com/cespare/xxhash) uses to key
 * endpoints. Hand-written because no installed package has it; in 32-bit
 * halves rather than BigInt: BigInt allocates on every operation and took
 * 3.6 µs for an endpoint-sized input (60 bytes; 0.24 s of a 10k × 10 first
 * sync), the halves take 0.5 µs.
 *
 * A 64-bit value is a pair (hi, lo) of 32-bit words, kept as signed int32
 * (`| 0`) so that V8 stores them unboxed; the helpers return theirs through
 * `H`/`L` (module scratch, no allocation).
 */

// The primes, as (hi, lo).
const P1H = 0x9e3779b1 | 0, P1L = 0x85ebca87 | 0; // 11400714785074694791
const P2H = 0xc2b2ae3d | 0, P2L = 0x27d4eb4f | 0; // 14029467366897019727
const P3H = 0x165667b1 | 0, P3L = 0x9e3779f9 | 0; // 1609587929392839161
const P4H = 0x85ebca77 | 0, P4L = 0xc2b2ae63 | 0; // 9650029242287828579
const P5H = 0x27d4eb2f | 0, P5L = 0x165667c5 | 0; // 2870177450012600261

/** Results of the helpers below. */
let H = 0;
let L = 0;

/**
 * (H, L) = low 64 bits of a × b: the low word by Math.imul, the high word
 * from the 32 × 32 -> 64 product of the low words (in 16-bit halves, every
 * partial product below 2^32) plus the two cross products' low words.
 */
function mul(ah: number, al: number, bh: number, bl: number): void {
  const xh = al >>> 16, xl = al & 0xffff, yh = bl >>> 16, yl = bl & 0xffff;
  const p0 = xl * yl, p1 = xh * yl, p2 = xl * yh;
  const mid = (p0 >>> 16) + (p1 & 0xffff) + (p2 & 0xffff);
  H = (xh * yh + (p1 >>> 16) + (p2 >>> 16) + (mid >>> 16) + Math.imul(ah, bl) + Math.imul(al, bh)) | 0;
  L = Math.imul(al, bl);
}

/** (H, L) = a + b mod 2^64. */
function add(ah: number, al: number, bh: number, bl: number): void {
  const lo = (al >>> 0) + (bl >>> 0);
  L = lo | 0;
  H = (ah + bh + (lo > 0xffffffff ? 1 : 0)) | 0;
}

/** (H, L) = a rotated left by r (0 < r < 32). */
function rotl(ah: number, al: number, r: number): void {
  H = (ah << r) | (al >>> (32 - r));
  L = (al << r) | (ah >>> (32 - r));
}

/** (H, L) = round(acc, lane) = rotl(acc + lane × P2, 31) × P1. */
function round(ah: number, al: number, lh: number, ll: number): void {
  mul(lh, ll, P2H, P2L);
  add(ah, al, H, L);
  rotl(H, L, 31);
  mul(H, L, P1H, P1L);
}

/** (H, L) = merge(acc, v) = (acc ^ round(0, v)) × P1 + P4. */
function merge(ah: number, al: number, vh: number, vl: number): void {
  round(0, 0, vh, vl);
  mul(ah ^ H, al ^ L, P1H, P1L);
  add(H, L, P4H, P4L);
}

/** Little-endian 32-bit word of `b` at `p`. */
const u32 = (b: Uint8Array, p: number): number => b[p]! | (b[p + 1]! << 8) | (b[p + 2]! << 16) | (b[p + 3]! << 24);

/** (H, L) = XXH64 of `buf[0, len)` with seed 0. */
function hash(buf: Uint8Array, len: number): void {
  let p = 0;
  let hh: number, hl: number;
  if (len >= 32) {
    add(P1H, P1L, P2H, P2L);
    let v1h = H, v1l = L;
    let v2h = P2H, v2l = P2L;
    let v3h = 0, v3l = 0;
    // -P1 mod 2^64
    let v4h = ~P1H, v4l = (~P1L + 1) | 0;
    for (; p <= len - 32; p += 32) {
      round(v1h, v1l, u32(buf, p + 4), u32(buf, p));
      v1h = H;
      v1l = L;
      round(v2h, v2l, u32(buf, p + 12), u32(buf, p + 8));
      v2h = H;
      v2l = L;
      round(v3h, v3l, u32(buf, p + 20), u32(buf, p + 16));
      v3h = H;
      v3l = L;
      round(v4h, v4l, u32(buf, p + 28), u32(buf, p + 24));
      v4h = H;
      v4l = L;
    }
    // XXH64's lane convergence, one step per lane, unrolled (the repeats are the spec's own).
    rotl(v1h, v1l, 1);
    hh = H;
    hl = L;
    rotl(v2h, v2l, 7);
    add(hh, hl, H, L);
    hh = H;
    hl = L;
    rotl(v3h, v3l, 12);
    add(hh, hl, H, L);
    hh = H;
    hl = L;
    rotl(v4h, v4l, 18);
    add(hh, hl, H, L);
    hh = H;
    hl = L;
    merge(hh, hl, v1h, v1l);
    merge(H, L, v2h, v2l);
    merge(H, L, v3h, v3l);
    merge(H, L, v4h, v4l);
    hh = H;
    hl = L;
  } else {
    hh = P5H;
    hl = P5L;
  }
  add(hh, hl, 0, len);
  hh = H;
  hl = L;
  for (; p + 8 <= len; p += 8) {
    round(0, 0, u32(buf, p + 4), u32(buf, p));
    rotl(hh ^ H, hl ^ L, 27);
    mul(H, L, P1H, P1L);
    add(H, L, P4H, P4L);
    hh = H;
    hl = L;
  }
  if (p + 4 <= len) {
    mul(0, u32(buf, p), P1H, P1L);
    rotl(hh ^ H, hl ^ L, 23);
    mul(H, L, P2H, P2L);
    add(H, L, P3H, P3L);
    hh = H;
    hl = L;
    p += 4;
  }
  for (; p < len; p++) {
    mul(0, buf[p]!, P5H, P5L);
    rotl(hh ^ H, hl ^ L, 11);
    mul(H, L, P1H, P1L);
    hh = H;
    hl = L;
  }
  // Avalanche: h ^= h >> 33; h *= P2; h ^= h >> 29; h *= P3; h ^= h >> 32.
  mul(hh, hl ^ (hh >>> 1), P2H, P2L);
  mul(H ^ (H >>> 29), L ^ ((H << 3) | (L >>> 29)), P3H, P3L);
  L ^= H;
}

/** XXH64 of `buf` with seed 0. */
export function xxh64(buf: Uint8Array): bigint {
  hash(buf, buf.length);
  return (BigInt(H >>> 0) << 32n) | BigInt(L >>> 0);
}

/**
 * XXH64 of the first `len` bytes of `buf`, written to `out[at]` and
 * `out[at + 1]` as two int32 words (high, low): numbers a JS array holds
 * unboxed, where a hex string would take 32 bytes of heap.
 */
export function xxh64Write(buf: Uint8Array, len: number, out: number[], at: number): void {
  hash(buf, len);
  out[at] = H;
  out[at + 1] = L;
}

/** Character codes of the hex digits, and room for 16 of them. */
const hexCodes = [...'0123456789abcdef'].map((c) => c.charCodeAt(0));
const digits: number[] = [];

/**
 * The 64-bit value (hi, lo) in hex without leading zeros (Go's
 * `strconv.FormatUint(h, 16)`, BigInt's `toString(16)`), as one flat string
 * (a concatenation would keep a tree).
 */
export function hex64(hi: number, lo: number): string {
  digits.length = 0;
  for (let i = 60; i >= 0; i -= 4) {
    const d = (i >= 32 ? hi >>> (i - 32) : lo >>> i) & 15;
    if (d !== 0 || digits.length > 0 || i === 0) digits.push(hexCodes[d]!);
  }
  return String.fromCharCode.apply(null, digits);
}

/** XXH64 of the first `len` bytes of `buf` (all of it by default), in hex (`hex64`). */
export function xxh64Hex(buf: Uint8Array, len = buf.length): string {
  hash(buf, len);
  return hex64(H, L);
}
