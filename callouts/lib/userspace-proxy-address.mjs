// userspace-proxy: which addresses and ports of the state it uses: literal
// IPs only, never the node's loopback or link-local ones, each in one
// spelling. See userspace-proxy.mjs.
import net from 'node:net';
import os from 'node:os';

const V4 = /^(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(?:\.(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$/;

/**
 * A literal IPv4 address (dotted quad, no leading zeros) a Service or an
 * endpoint may use: not in 0.0.0.0/8, loopback (127/8), link-local
 * (169.254/16), multicast or above (Kubernetes refuses them too, and an
 * endpoint there would reach the node's own loopback services or a cloud's
 * metadata server).
 */
export function isIPv4Literal(s) {
  if (typeof s !== 'string' || !V4.test(s)) return false;
  const [a, b] = s.split('.', 2).map(Number);
  return a !== 0 && a !== 127 && a < 224 && !(a === 169 && b === 254);
}

/** The 8 groups of an IPv6 address Node accepts, as numbers. */
function groups6(s) {
  let text = s;
  const dot = text.lastIndexOf(':');
  if (text.includes('.')) {
    const v4 = text.slice(dot + 1).split('.').map(Number);
    text = `${text.slice(0, dot + 1)}${((v4[0] << 8) | v4[1]).toString(16)}:${((v4[2] << 8) | v4[3]).toString(16)}`;
  }
  const [head, tail] = text.includes('::') ? text.split('::') : [text, undefined];
  const h = head === '' ? [] : head.split(':');
  const t = tail === undefined || tail === '' ? [] : tail.split(':');
  const fill = tail === undefined ? [] : new Array(8 - h.length - t.length).fill('0');
  return [...h, ...fill, ...t].map((g) => parseInt(g, 16));
}

/** A literal IPv6 address (no zone, no prefix, no brackets), not ::, ::1, link-local (fe80::/10), multicast nor IPv4-mapped. */
export function isIPv6Literal(s) {
  if (typeof s !== 'string' || s.length > 45 || !/^[0-9A-Fa-f:.]+$/.test(s) || !net.isIPv6(s)) return false;
  if (s.includes('.') && !V4.test(s.slice(s.lastIndexOf(':') + 1))) return false;
  const g = groups6(s);
  if (g.length !== 8 || g.some((x) => !(x >= 0 && x <= 0xffff))) return false;
  if (g.slice(0, 7).every((x) => x === 0) && g[7] <= 1) return false;
  if ((g[0] & 0xff00) === 0xff00 || (g[0] & 0xffc0) === 0xfe80) return false;
  if (g.slice(0, 5).every((x) => x === 0) && g[5] === 0xffff) return false;
  return true;
}

/**
 * An address in one spelling per address, so that two spellings of it
 * (`2001:DB8::1`, `2001:db8:0::1`) are one listener and one endpoint: IPv6
 * as the WHATWG URL serializer writes it (lower case, the longest run of
 * zero groups compressed, RFC 5952), IPv4 as it is (leading zeros are
 * refused already).
 */
export function canonicalIP(s) {
  return s.includes(':') ? new URL(`http://[${s}]/`).hostname.slice(1, -1) : s;
}

/** An integer port, 1 to 65535. */
export const isPort = (p) => Number.isInteger(p) && p >= 1 && p <= 65535;

/** The node's own addresses (an endpoint there at a NodePort would loop back into the proxy). */
export function localAddresses() {
  const out = new Set();
  for (const list of Object.values(os.networkInterfaces())) for (const a of list ?? []) out.add(canonicalIP(a.address));
  return out;
}
