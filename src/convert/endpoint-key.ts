/**
 * The path key of an endpoint under its Service: kpng's endpoint hash from
 * before it keyed endpoints by pod name (Oct 2021, the build of the blog
 * post): XXH64 of the protobuf encoding of the endpoint's Hostname, IPs and
 * Local, in hex. It orders the blog example exactly as the post shows, and
 * keeps both entries of a dual-stack pod (keying by pod name loses one).
 *
 * The three fields are encoded here by hand, into one reused buffer, rather
 * than through protobufjs (codec.ts `marshalEndpoint`, which gives the same
 * bytes: test/convert/endpoint-key.test.ts checks it): protobufjs builds a
 * writer and a fresh buffer per call, ~1 µs, paid for every endpoint of a
 * first sync.
 */
import type { IPSet } from '../model.js';
import { xxh64Write } from './xxhash.js';

let buf = Buffer.allocUnsafe(1024);
let pos = 0;

const varintSize = (n: number): number => (n < 0x80 ? 1 : n < 0x4000 ? 2 : n < 0x200000 ? 3 : n < 0x10000000 ? 4 : 5);

function varint(n: number): void {
  while (n >= 0x80) {
    buf[pos++] = (n & 0x7f) | 0x80;
    n >>>= 7;
  }
  buf[pos++] = n;
}

/** UTF-8 length of `s` (addresses and hostnames are ASCII: counted here, without a call into C++). */
function utf8Length(s: string): number {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 0x7f) return Buffer.byteLength(s, 'utf8');
  return s.length;
}

/** A length-delimited string field (`tag` = field number << 3 | 2) of `bytes` UTF-8 bytes. */
function stringField(tag: number, s: string, bytes: number): void {
  buf[pos++] = tag;
  varint(bytes);
  if (bytes === s.length) for (let i = 0; i < s.length; i++) buf[pos++] = s.charCodeAt(i);
  else pos += buf.write(s, pos, 'utf8');
}

/** Bytes of the repeated string field `list` (tag, length, bytes each). */
function listSize(list: readonly string[] | undefined): number {
  let n = 0;
  if (list) for (const s of list) {
    const b = utf8Length(s);
    n += 1 + varintSize(b) + b;
  }
  return n;
}

/**
 * Writes to `out[at]` and `out[at + 1]` the key of the endpoint with these
 * fields, as the two words of its hash (xxhash.ts `hex64` makes the key of
 * them). Proto3: an empty Hostname and a false Local are left off the wire; a
 * present IPs set is sent even when empty.
 */
export function writeEndpointKey(hostname: string | undefined, ips: IPSet | undefined, local: boolean, out: number[], at: number): void {
  const host = hostname ? utf8Length(hostname) : 0;
  const inner = ips ? listSize(ips.V4) + listSize(ips.V6) : 0;
  // Field 1 (Hostname), field 2 (IPs: V4 = 1, V6 = 2), field 3 (Local); at most 5 bytes per tag and length.
  const need = (hostname ? 6 + host : 0) + (ips ? 6 + inner : 0) + 2;
  if (need > buf.length) buf = Buffer.allocUnsafe(need * 2);
  pos = 0;
  if (hostname) stringField(0x0a, hostname, host);
  if (ips) {
    buf[pos++] = 0x12;
    varint(inner);
    if (ips.V4) for (const s of ips.V4) stringField(0x0a, s, utf8Length(s));
    if (ips.V6) for (const s of ips.V6) stringField(0x12, s, utf8Length(s));
  }
  if (local) {
    buf[pos++] = 0x18;
    buf[pos++] = 1;
  }
  xxh64Write(buf, pos, out, at);
}
