/**
 * XXH64 (seed 0), the hash kpng (github.com/cespare/xxhash) uses to key
 * endpoints. BigInt arithmetic: about 2 µs for an endpoint-sized input, which
 * is only paid when an endpoint changes.
 */
const M = (1n << 64n) - 1n;
const P1 = 11400714785074694791n;
const P2 = 14029467366897019727n;
const P3 = 1609587929392839161n;
const P4 = 9650029242287828579n;
const P5 = 2870177450012600261n;

const rotl = (x: bigint, r: bigint): bigint => ((x << r) | (x >> (64n - r))) & M;

function round(acc: bigint, lane: bigint): bigint {
  acc = (acc + lane * P2) & M;
  return (rotl(acc, 31n) * P1) & M;
}

function merge(acc: bigint, v: bigint): bigint {
  acc ^= round(0n, v);
  return (acc * P1 + P4) & M;
}

/** XXH64 of `buf` with seed 0. */
export function xxh64(buf: Uint8Array): bigint {
  const dv = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const len = buf.length;
  let p = 0;
  let h: bigint;
  if (len >= 32) {
    let v1 = (P1 + P2) & M;
    let v2 = P2;
    let v3 = 0n;
    let v4 = (M + 1n - P1) & M;
    for (; p <= len - 32; p += 32) {
      v1 = round(v1, dv.getBigUint64(p, true));
      v2 = round(v2, dv.getBigUint64(p + 8, true));
      v3 = round(v3, dv.getBigUint64(p + 16, true));
      v4 = round(v4, dv.getBigUint64(p + 24, true));
    }
    h = (rotl(v1, 1n) + rotl(v2, 7n) + rotl(v3, 12n) + rotl(v4, 18n)) & M;
    h = merge(merge(merge(merge(h, v1), v2), v3), v4);
  } else {
    h = P5;
  }
  h = (h + BigInt(len)) & M;
  for (; p + 8 <= len; p += 8) {
    h ^= round(0n, dv.getBigUint64(p, true));
    h = (rotl(h, 27n) * P1 + P4) & M;
  }
  if (p + 4 <= len) {
    h ^= (BigInt(dv.getUint32(p, true)) * P1) & M;
    h = (rotl(h, 23n) * P2 + P3) & M;
    p += 4;
  }
  for (; p < len; p++) {
    h ^= (BigInt(buf[p]!) * P5) & M;
    h = (rotl(h, 11n) * P1) & M;
  }
  h ^= h >> 33n;
  h = (h * P2) & M;
  h ^= h >> 29n;
  h = (h * P3) & M;
  h ^= h >> 32n;
  return h;
}
