/**
 * IP address handling as kpng does it (Go's `net.ParseIP` plus kpng's
 * `IPSet.Add`): invalid strings are dropped, IPv4 and IPv4-mapped IPv6 go to
 * `V4`, the rest to `V6`, each list sorted as strings without duplicates. The
 * strings themselves are kept as written.
 */
import type { IPSet } from '../model.js';

/** Address family of a string Go's `net.ParseIP` accepts, or undefined when it rejects it. */
export type Family = 4 | 6;

// Go (1.17+) rejects leading zeros ("010") because they were read as octal elsewhere.
function parseV4(s: string, start: number, out: number[] | undefined): boolean {
  let parts = 0;
  let i = start;
  while (parts < 4) {
    const begin = i;
    let v = 0;
    while (i < s.length) {
      const c = s.charCodeAt(i);
      if (c < 0x30 || c > 0x39) break;
      v = v * 10 + (c - 0x30);
      i++;
    }
    const n = i - begin;
    if (n === 0 || n > 3 || v > 255 || (n > 1 && s.charCodeAt(begin) === 0x30)) return false;
    out?.push(v);
    parts++;
    if (parts < 4) {
      if (s.charCodeAt(i) !== 0x2e) return false;
      i++;
    }
  }
  return i === s.length;
}

function hexVal(c: number): number {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  if (c >= 0x61 && c <= 0x66) return c - 0x57;
  if (c >= 0x41 && c <= 0x46) return c - 0x37;
  return -1;
}

/** The 8 16-bit groups of an IPv6 address, or undefined (zones are rejected, as Go's ParseIP does). */
function parseV6(s: string): number[] | undefined {
  const groups: number[] = [];
  let ellipsis = -1;
  let i = 0;
  if (s.startsWith('::')) {
    ellipsis = 0;
    i = 2;
    if (i === s.length) return [0, 0, 0, 0, 0, 0, 0, 0];
  }
  while (groups.length < 8) {
    const begin = i;
    let v = 0;
    while (i < s.length && i - begin < 5) {
      const h = hexVal(s.charCodeAt(i));
      if (h < 0) break;
      v = v * 16 + h;
      i++;
    }
    if (i === begin || i - begin > 4) return undefined;
    if (s.charCodeAt(i) === 0x2e) {
      // Trailing dotted IPv4: only in the last 32 bits.
      if (ellipsis < 0 && groups.length !== 6) return undefined;
      if (groups.length > 6) return undefined;
      const b: number[] = [];
      if (!parseV4(s, begin, b)) return undefined;
      groups.push((b[0]! << 8) | b[1]!, (b[2]! << 8) | b[3]!);
      i = s.length;
      break;
    }
    groups.push(v);
    if (i === s.length) break;
    if (s.charCodeAt(i) !== 0x3a || i + 1 === s.length) return undefined;
    i++;
    if (s.charCodeAt(i) === 0x3a) {
      if (ellipsis >= 0) return undefined;
      ellipsis = groups.length;
      i++;
      if (i === s.length) break;
    }
  }
  if (i !== s.length) return undefined;
  if (groups.length < 8) {
    if (ellipsis < 0) return undefined;
    groups.splice(ellipsis, 0, ...new Array<number>(8 - groups.length).fill(0));
  } else if (ellipsis >= 0) {
    // An ellipsis must stand for at least one group.
    return undefined;
  }
  return groups;
}

/**
 * The family kpng files an address under: 4 for IPv4 and IPv4-mapped IPv6
 * (`::ffff:a.b.c.d`), 6 for other IPv6, undefined for what Go's `net.ParseIP`
 * rejects (leading zeros such as `192.0.2.010`, zones such as `fe80::1%eth0`).
 */
export function ipFamily(s: string): Family | undefined {
  if (s.length === 0 || s.length > 45) return undefined;
  if (s.indexOf(':') < 0) return parseV4(s, 0, undefined) ? 4 : undefined;
  const g = parseV6(s);
  if (!g) return undefined;
  const mapped = g[0] === 0 && g[1] === 0 && g[2] === 0 && g[3] === 0 && g[4] === 0 && g[5] === 0xffff;
  return mapped ? 4 : 6;
}

function insertSorted(list: string[], s: string): void {
  // Lists are short; a linear scan from the end keeps already sorted input cheap.
  let i = list.length;
  while (i > 0 && list[i - 1]! > s) i--;
  if (i > 0 && list[i - 1] === s) return;
  list.splice(i, 0, s);
}

/** Adds an address to `set` (kpng `IPSet.Add`); returns false when the address was dropped. */
export function addIP(set: IPSet, s: string): boolean {
  const f = ipFamily(s);
  if (f === undefined) return false;
  if (f === 4) insertSorted((set.V4 ??= []), s);
  else insertSorted((set.V6 ??= []), s);
  return true;
}

/** A present IP set holding the valid addresses of `ips` (kpng `NewIPSet`). */
export function ipSet(ips: readonly unknown[] | undefined): IPSet {
  const set: IPSet = {};
  if (ips) for (const ip of ips) if (typeof ip === 'string') addIP(set, ip);
  return set;
}
