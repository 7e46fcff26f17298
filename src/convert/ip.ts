/**
 * IP address handling as kpng does it (Go's `net.ParseIP` plus kpng's
 * `IPSet.Add`): invalid strings are dropped, IPv4 and IPv4-mapped IPv6 go to
 * `V4`, the rest to `V6`, each list sorted as strings without duplicates. The
 * strings themselves are kept as written.
 *
 * Parsing is node:net's: `isIP` accepts what Go accepts (no leading zeros in
 * IPv4, at most four hex digits a group, an ellipsis standing for at least
 * one group) except zones, which Go's ParseIP rejects and we reject here.
 */
import { BlockList, isIP } from 'node:net';
import type { IPSet } from '../model.js';

/** Address family of a string Go's `net.ParseIP` accepts. */
type Family = 4 | 6;

/** ::ffff:0:0/96, the IPv4-mapped addresses, which Go's `To4` (and so kpng) files as IPv4. */
const ipv4Mapped = new BlockList();
ipv4Mapped.addSubnet('::ffff:0:0', 96, 'ipv6');
const hasFfff = /ffff/i;

/**
 * The family kpng files an address under: 4 for IPv4 and IPv4-mapped IPv6
 * (`::ffff:a.b.c.d`), 6 for other IPv6, undefined for what Go's `net.ParseIP`
 * rejects (leading zeros such as `192.0.2.010`, zones such as `fe80::1%eth0`).
 */
function ipFamily(s: string): Family | undefined {
  const f = isIP(s);
  if (f === 4) return 4;
  if (f !== 6 || s.includes('%')) return undefined;
  // A mapped address spells out its ffff group (at most four digits a group);
  // the BlockList check costs a SocketAddress per call, so only then.
  return hasFfff.test(s) && ipv4Mapped.check(s, 'ipv6') ? 4 : 6;
}

function insertSorted(list: string[], s: string): void {
  // Lists are short; a linear scan from the end keeps already sorted input cheap.
  let i = list.length;
  while (i > 0 && list[i - 1]! > s) i--;
  if (i > 0 && list[i - 1] === s) return;
  if (i === list.length) list.push(s);
  else list.splice(i, 0, s);
}

/** Adds an address to `set` (kpng `IPSet.Add`); returns false when the address was dropped. */
export function addIP(set: IPSet, s: string): boolean {
  const f = ipFamily(s);
  if (f === undefined) return false;
  const list = f === 4 ? set.V4 : set.V6;
  // A new list as a literal of one: an empty one grows to room for 17 on its first push (one address per endpoint is the rule).
  if (list) insertSorted(list, s);
  else if (f === 4) set.V4 = [s];
  else set.V6 = [s];
  return true;
}

/** A present IP set holding the valid addresses of `ips` (kpng `NewIPSet`). */
export function ipSet(ips: readonly unknown[] | undefined): IPSet {
  const set: IPSet = {};
  if (ips) for (const ip of ips) if (typeof ip === 'string') addIP(set, ip);
  return set;
}
