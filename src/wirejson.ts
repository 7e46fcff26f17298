/**
 * Fast paths for the hot loop of a kpng stream (one message per Service and
 * per Endpoint, ten Endpoints per Service is common):
 * - `decodeOpItem`: an `OpItem` without protobufjs message objects;
 * - `endpointJson`: the wire bytes of an `Endpoint` straight to its
 *   Go-compatible JSON, without protobufjs or model objects or string
 *   concatenation.
 *
 * The fast path handles the canonical encoding (fields in ascending number
 * order, no unknown or repeated-singular fields, varints of at most 5 bytes,
 * valid UTF-8) and writes the JSON bytes as it reads. Anything else, malformed
 * input included, falls back to the reference path
 * `encodeEndpoint(unmarshalEndpoint(bytes))`, so the result (or the error) is
 * always exactly the reference one. test/wirejson.test.ts checks both paths
 * agree.
 */
import { unmarshalEndpoint, unmarshalOpItem, type OpItem, type Value } from './codec.js';
import { utf8CodePoint, utf8Length } from './utf8.js';
import { encodeEndpoint } from './gojson.js';

/** Scratch output, grown on demand; one conversion at a time (synchronous). */
let out = Buffer.allocUnsafe(4096);
let pos = 0;
let ascii = true;

/** Thrown inside the fast path: not canonical, use the reference path. */
const FALLBACK = new Error('wirejson: not canonical');

function room(n: number): void {
  if (pos + n <= out.length) return;
  const bigger = Buffer.allocUnsafe(Math.max(out.length * 2, pos + n));
  out.copy(bigger, 0, 0, pos);
  out = bigger;
}

const enc = (s: string): Uint8Array => Buffer.from(s, 'latin1');
const K = {
  open: enc('{'),
  hostname: enc('"Hostname":'),
  ips: enc('"IPs":'),
  local: enc('"Local":true'),
  portOverrides: enc('"PortOverrides":['),
  scopes: enc('"Scopes":'),
  v4: enc('"V4":['),
  v6: enc('"V6":['),
  name: enc('"Name":'),
  port: enc('"Port":'),
  internal: enc('"Internal":true'),
  external: enc('"External":true'),
};

function raw(b: Uint8Array): void {
  room(b.length);
  for (let i = 0; i < b.length; i++) out[pos++] = b[i]!;
}

function byte(c: number): void {
  room(1);
  out[pos++] = c;
}

/**
 * Starts an object member: `,` unless it is the first (`any` false), then
 * its key `k`. Returns true, the new `any`.
 */
function member(any: boolean, k: Uint8Array): true {
  if (any) byte(0x2c);
  raw(k);
  return true;
}

const hex = '0123456789abcdef';

/**
 * Reads a varint that fits 32 bits; anything longer (negative int32s, odd
 * bools) is rare and left to protobufjs, whose readers differ per type there.
 */
function varint(buf: Uint8Array, p: { i: number }, end: number): number {
  let v = 0;
  for (let shift = 0; shift < 28; shift += 7) {
    if (p.i >= end) throw FALLBACK;
    const b = buf[p.i++]!;
    v |= (b & 0x7f) << shift;
    if (b < 0x80) return v >>> 0;
  }
  if (p.i >= end) throw FALLBACK;
  const b = buf[p.i++]!;
  if (b > 0x0f) throw FALLBACK;
  return (v | (b << 28)) >>> 0;
}

/**
 * Writes `buf[start, end)` as a Go JSON string literal, escaping as Go's
 * encoding/json (before 1.22) did; throws FALLBACK on invalid UTF-8.
 */
function str(buf: Uint8Array, start: number, end: number): void {
  room((end - start) * 6 + 2);
  out[pos++] = 0x22;
  let i = start;
  while (i < end) {
    const c = buf[i]!;
    if (c >= 0x20 && c < 0x80) {
      if (c === 0x22 || c === 0x5c) {
        out[pos++] = 0x5c;
        out[pos++] = c;
      } else if (c === 0x3c || c === 0x3e || c === 0x26) {
        escU(c);
      } else out[pos++] = c;
      i++;
      continue;
    }
    if (c < 0x20) {
      if (c === 0x0a) (out[pos++] = 0x5c), (out[pos++] = 0x6e);
      else if (c === 0x0d) (out[pos++] = 0x5c), (out[pos++] = 0x72);
      else if (c === 0x09) (out[pos++] = 0x5c), (out[pos++] = 0x74);
      else escU(c);
      i++;
      continue;
    }
    // Multi-byte UTF-8: validate (no overlongs, surrogates or > U+10FFFF), copy raw.
    const cp = utf8CodePoint(buf, i, end);
    if (cp < 0) throw FALLBACK;
    const n = utf8Length(cp);
    ascii = false;
    if (cp === 0x2028 || cp === 0x2029) {
      // \u2028 and \u2029, as Go escapes them.
      out[pos++] = 0x5c;
      out[pos++] = 0x75;
      out[pos++] = 0x32;
      out[pos++] = 0x30;
      out[pos++] = 0x32;
      out[pos++] = cp === 0x2028 ? 0x38 : 0x39;
    } else for (let k = 0; k < n; k++) out[pos++] = buf[i + k]!;
    i += n;
  }
  out[pos++] = 0x22;
}

function escU(c: number): void {
  out[pos++] = 0x5c;
  out[pos++] = 0x75;
  out[pos++] = 0x30;
  out[pos++] = 0x30;
  out[pos++] = hex.charCodeAt(c >> 4);
  out[pos++] = hex.charCodeAt(c & 15);
}

function int(v: number): void {
  const s = String(v);
  room(s.length);
  for (let i = 0; i < s.length; i++) out[pos++] = s.charCodeAt(i);
}

/** Length-delimited field: returns its end and moves `p` to its start. */
function len(buf: Uint8Array, p: { i: number }, end: number): number {
  const n = varint(buf, p, end);
  const e = p.i + n;
  if (e > end) throw FALLBACK;
  return e;
}

/** IPSet at [p.i, end): `{"V4":[...],"V6":[...]}`. */
function ipSet(buf: Uint8Array, p: { i: number }, end: number): void {
  byte(0x7b);
  let last = 0; // last field number; repeated fields must be contiguous
  let any = false;
  while (p.i < end) {
    const tag = varint(buf, p, end);
    const f = tag >>> 3;
    if ((tag & 7) !== 2 || (f !== 1 && f !== 2) || f < last) throw FALLBACK;
    const e = len(buf, p, end);
    if (f !== last) {
      if (last !== 0) byte(0x5d); // close the V4 list
      any = member(any, f === 1 ? K.v4 : K.v6);
      last = f;
    } else byte(0x2c);
    str(buf, p.i, e);
    p.i = e;
  }
  if (last !== 0) byte(0x5d);
  byte(0x7d);
}

// One tag loop per message reader, on purpose: a shared one costs a callback per field on the hot path.
/** PortName at [p.i, end): `{"Name":"...","Port":N}`. */
function portName(buf: Uint8Array, p: { i: number }, end: number): void {
  byte(0x7b);
  let last = 0;
  let any = false;
  while (p.i < end) {
    const tag = varint(buf, p, end);
    const f = tag >>> 3;
    if (f <= last) throw FALLBACK;
    last = f;
    if (f === 1 && (tag & 7) === 2) {
      const e = len(buf, p, end);
      if (e > p.i) {
        any = member(any, K.name);
        str(buf, p.i, e);
      }
      p.i = e;
    } else if (f === 2 && (tag & 7) === 0) {
      const v = varint(buf, p, end) | 0;
      if (v !== 0) {
        member(any, K.port);
        int(v);
      }
    } else throw FALLBACK;
  }
  byte(0x7d);
}

/** EndpointScopes at [p.i, end). */
function scopes(buf: Uint8Array, p: { i: number }, end: number): void {
  byte(0x7b);
  let last = 0;
  let any = false;
  while (p.i < end) {
    const tag = varint(buf, p, end);
    const f = tag >>> 3;
    if ((tag & 7) !== 0 || f <= last || f > 2) throw FALLBACK;
    last = f;
    if (varint(buf, p, end) !== 0) any = member(any, f === 1 ? K.internal : K.external);
  }
  byte(0x7d);
}

function endpointFast(buf: Uint8Array): string {
  pos = 0;
  ascii = true;
  const p = { i: 0 };
  const end = buf.length;
  let last = 0;
  let any = false;
  let inList = false;
  byte(0x7b);
  while (p.i < end) {
    const tag = varint(buf, p, end);
    const f = tag >>> 3;
    const wt = tag & 7;
    if (f < last || (f === last && f !== 4)) throw FALLBACK;
    if (inList && f !== 4) {
      byte(0x5d);
      inList = false;
    }
    last = f;
    switch (f) {
      case 1: {
        if (wt !== 2) throw FALLBACK;
        const e = len(buf, p, end);
        if (e > p.i) {
          any = member(any, K.hostname);
          str(buf, p.i, e);
        }
        p.i = e;
        break;
      }
      case 2: {
        if (wt !== 2) throw FALLBACK;
        const e = len(buf, p, end);
        any = member(any, K.ips);
        ipSet(buf, p, e);
        break;
      }
      case 3:
        if (wt !== 0) throw FALLBACK;
        if (varint(buf, p, end) !== 0) any = member(any, K.local);
        break;
      case 4: {
        if (wt !== 2) throw FALLBACK;
        const e = len(buf, p, end);
        if (!inList) {
          any = member(any, K.portOverrides);
          inList = true;
        } else byte(0x2c);
        portName(buf, p, e);
        break;
      }
      case 5: {
        if (wt !== 2) throw FALLBACK;
        const e = len(buf, p, end);
        any = member(any, K.scopes);
        scopes(buf, p, e);
        break;
      }
      default:
        throw FALLBACK;
    }
  }
  if (inList) byte(0x5d);
  byte(0x7d);
  return out.toString(ascii ? 'latin1' : 'utf8', 0, pos);
}

/**
 * The Go JSON of the `Endpoint` encoded in `bytes`, exactly
 * `encodeEndpoint(unmarshalEndpoint(bytes))`; throws what unmarshalEndpoint
 * throws on bytes that do not decode.
 */
export function endpointJson(bytes: Uint8Array): string {
  try {
    return endpointFast(bytes);
  } catch (err) {
    if (err !== FALLBACK) throw err;
    return encodeEndpoint(unmarshalEndpoint(bytes));
  }
}

/** For tests: the fast path only (undefined where it defers to the reference path). */
export function endpointJsonFast(bytes: Uint8Array): string | undefined {
  try {
    return endpointFast(bytes);
  } catch (err) {
    if (err !== FALLBACK) throw err;
    return undefined;
  }
}

/* ---------- OpItem ---------- */

/** An ASCII proto3 string at [start, end); FALLBACK for anything else (validation left to protobufjs). */
function asciiString(buf: Buffer, start: number, end: number): string {
  for (let i = start; i < end; i++) if (buf[i]! >= 0x80) throw FALLBACK;
  return buf.toString('latin1', start, end);
}

/** `Ref` at [p.i, end). */
function ref(buf: Buffer, p: { i: number }, end: number): { Set: number; Path: string } {
  let set = 0;
  let path = '';
  let last = 0;
  while (p.i < end) {
    const tag = varint(buf, p, end);
    const f = tag >>> 3;
    if (f <= last) throw FALLBACK;
    last = f;
    if (f === 1 && (tag & 7) === 0) set = varint(buf, p, end) | 0;
    else if (f === 2 && (tag & 7) === 2) {
      const e = len(buf, p, end);
      path = asciiString(buf, p.i, e);
      p.i = e;
    } else throw FALLBACK;
  }
  return { Set: set, Path: path };
}

function opItemFast(bytes: Uint8Array): OpItem {
  const buf = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const p = { i: 0 };
  const end = buf.length;
  if (end === 0) return {};
  const tag = varint(buf, p, end);
  if ((tag & 7) !== 2) throw FALLBACK;
  const e = len(buf, p, end);
  if (e !== end) throw FALLBACK; // more than one field: let protobufjs decide
  switch (tag >>> 3) {
    case 1:
      if (e !== p.i) throw FALLBACK;
      return { Sync: {} };
    case 4:
      if (e !== p.i) throw FALLBACK;
      return { Reset: {} };
    case 3:
      return { Delete: ref(buf, p, e) };
    case 2: {
      let r: { Set: number; Path: string } | undefined;
      let bytes: Uint8Array | undefined;
      let last = 0;
      while (p.i < e) {
        const t = varint(buf, p, e);
        const f = t >>> 3;
        if ((t & 7) !== 2 || f <= last) throw FALLBACK;
        last = f;
        const fe = len(buf, p, e);
        if (f === 1) r = ref(buf, p, fe);
        else if (f === 2) bytes = buf.subarray(p.i, fe);
        else throw FALLBACK;
        p.i = fe;
      }
      const v: Value = { Bytes: bytes ?? buf.subarray(0, 0) };
      if (r) v.Ref = r;
      return { Set: v };
    }
    default:
      throw FALLBACK;
  }
}

/**
 * Decodes an `OpItem`, exactly as `unmarshalOpItem` (which it falls back to
 * for anything but the canonical encoding of one op with ASCII paths).
 */
export function decodeOpItem(bytes: Uint8Array): OpItem {
  try {
    return opItemFast(bytes);
  } catch (err) {
    if (err !== FALLBACK) throw err;
    return unmarshalOpItem(bytes);
  }
}
