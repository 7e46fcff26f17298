/**
 * UTF-8 well-formedness (RFC 3629: no overlong forms, no surrogates, nothing
 * above U+10FFFF), the rule Go's proto3 decoder applies to strings and the
 * one fixture files must meet. The yes/no answer is node:buffer's `isUtf8`;
 * the code point reader serves the callers that walk the bytes anyway (the
 * JSON fast path copies them as it validates) and those that must say where
 * the first bad byte is.
 */
import { isUtf8 } from 'node:buffer';

/**
 * The code point of the multi-byte UTF-8 sequence whose lead byte (>= 0x80)
 * is `bytes[i]`, or -1 when it is not well-formed (overlong, surrogate, above
 * U+10FFFF, truncated at `end`). Its length follows from the code point (see
 * `utf8Length`).
 */
export function utf8CodePoint(bytes: Uint8Array, i: number, end: number): number {
  const c = bytes[i]!;
  let n: number;
  let min: number;
  let cp: number;
  if (c >= 0xc2 && c <= 0xdf) (n = 1), (min = 0x80), (cp = c & 0x1f);
  else if (c >= 0xe0 && c <= 0xef) (n = 2), (min = 0x800), (cp = c & 0x0f);
  else if (c >= 0xf0 && c <= 0xf4) (n = 3), (min = 0x10000), (cp = c & 0x07);
  else return -1;
  if (i + n >= end) return -1; // truncated sequence
  for (let k = 1; k <= n; k++) {
    const d = bytes[i + k]!;
    if ((d & 0xc0) !== 0x80) return -1;
    cp = (cp << 6) | (d & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return -1;
  return cp;
}

/** Bytes of the (well-formed, non-ASCII) UTF-8 encoding of `cp`: overlongs are rejected, so it is determined. */
export const utf8Length = (cp: number): number => (cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);

/** True when `bytes[start, end)` is well-formed UTF-8. */
export function isValidUtf8(bytes: Uint8Array, start = 0, end = bytes.length): boolean {
  return isUtf8(bytes.subarray(start, end));
}

/**
 * Offset of the first byte in `bytes[start, end)` that does not start a
 * well-formed sequence, or -1 when there is none (for messages that say
 * where a file stops being text).
 */
export function firstInvalidUtf8(bytes: Uint8Array, start = 0, end = bytes.length): number {
  if (isValidUtf8(bytes, start, end)) return -1;
  for (let i = start; i < end; ) {
    if (bytes[i]! < 0x80) {
      i++;
      continue;
    }
    const cp = utf8CodePoint(bytes, i, end);
    if (cp < 0) return i;
    i += utf8Length(cp);
  }
  return -1;
}
