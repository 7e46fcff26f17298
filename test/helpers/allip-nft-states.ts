/**
 * States, change sets and the kernel side of kpng-example-allip-nft's tests
 * (test/e2e/callouts/allip-nft-frames.test.ts, allip-nft-changes.test.ts and
 * allip-nft-traffic.test.ts): Services as kpng prints them, in kpng order; the
 * change set between two states; a chain of states to walk; running the
 * callout once; bare network namespaces (removed at the test's end, or at
 * exit); the callout's table, comparable across histories.
 */
import type { Test as Tap } from 'tap';
import { spawnSync } from 'node:child_process';
import { mustRun, runCommand, type CommandResult } from './command.js';
import { repoPath } from './fixtures.js';

/** The callout under test. */
export const NFT = repoPath('callouts/kpng-example-allip-nft');
/** The iptables callout, which refuses change sets. */
export const IPT = repoPath('callouts/kpng-example-allip');

// ---------------------------------------------------------------- states and change sets

/** A Service of a test state. */
export interface Svc {
  ns?: string;
  name: string;
  x4?: unknown[];
  x6?: unknown[];
  lb4?: string[];
  lb6?: string[];
  /** Addresses of local endpoints (one endpoint each). */
  l4?: unknown[];
  l6?: unknown[];
  /** Addresses of endpoints on other nodes. */
  r4?: string[];
  /** The Service's port: changes its line, not its mapping. */
  port?: number;
}

export const keyOf = (s: Svc) => `${s.ns ?? 'default'}/${s.name}`;

/** kpng's order of keys (state.ts comparePaths): bytes, "/" before any other (ASCII keys here). */
export function kpngCompare(a: string, b: string): number {
  const rank = (c: number) => (c === 0x2f ? -1 : c);
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    if (a.charCodeAt(i) !== b.charCodeAt(i)) return rank(a.charCodeAt(i)) - rank(b.charCodeAt(i));
  }
  return a.length - b.length;
}

/** One state line, shaped as kpng prints it. */
export function svcLine(s: Svc): string {
  const ips: Record<string, unknown> = { ClusterIPs: {}, ExternalIPs: {} };
  const fam = (v4?: unknown[], v6?: unknown[]) => ({ ...(v4?.length ? { V4: v4 } : {}), ...(v6?.length ? { V6: v6 } : {}) });
  ips.ExternalIPs = fam(s.x4, s.x6);
  if (s.lb4?.length || s.lb6?.length) ips.LoadBalancerIPs = fam(s.lb4, s.lb6);
  ips.Headless = true;
  const eps: unknown[] = [];
  for (const a of s.l4 ?? []) eps.push({ IPs: { V4: [a] }, Local: true, Scopes: { Internal: true, External: true } });
  for (const a of s.l6 ?? []) eps.push({ IPs: { V6: [a] }, Local: true, Scopes: { Internal: true, External: true } });
  for (const a of s.r4 ?? []) eps.push({ IPs: { V4: [a] }, Scopes: { Internal: true, External: true } });
  const port = s.port ?? 8080;
  return (
    JSON.stringify({
      Service: { Namespace: s.ns ?? 'default', Name: s.name, Type: 'ClusterIP', IPs: ips, Ports: [{ Protocol: 1, Port: port, TargetPort: port }], SessionAffinity: null },
      Endpoints: eps.length ? eps : null,
    }) + '\n'
  );
}

/** The state's lines by key, in kpng order. */
export function lines(svcs: Svc[]): Map<string, string> {
  return new Map(svcs.map((s) => [keyOf(s), svcLine(s)] as const).sort(([a], [b]) => kpngCompare(a, b)));
}

/** The full state, as the runner writes it. */
export const full = (svcs: Svc[]) => [...lines(svcs).values()].join('');

/** The change set from `prev` to `next`, as the runner writes it (src/changes.ts). */
export function changeSet(prev: Svc[], next: Svc[]): string {
  const p = lines(prev);
  const n = lines(next);
  let out = '';
  for (const key of [...new Set([...p.keys(), ...n.keys()])].sort(kpngCompare)) {
    const a = p.get(key);
    const b = n.get(key);
    if (a === b) continue;
    if (a !== undefined) out += `{"Previous":${a.slice(0, -1)}}\n`;
    if (b !== undefined) out += b;
  }
  return out;
}

/**
 * A chain of states, each step named by what it exercises. External IPs from
 * 192.0.2.0/24, 203.0.113.0/24 (load balancer) and 2001:db8:e::/64; endpoints
 * from 198.51.100.0/24 and 2001:db8:1::/64.
 */
export function chainOfStates(): Array<{ what: string; state: Svc[] }> {
  const a: Svc = { name: 'a', x4: ['192.0.2.1'], x6: ['2001:db8:e::1'], l4: ['198.51.100.2'], l6: ['2001:db8:1::2'] };
  const b: Svc = { name: 'b', x4: ['192.0.2.2'], l4: ['198.51.100.3', '198.51.100.4'], r4: ['198.51.100.99'] };
  const c: Svc = { name: 'c', lb4: ['203.0.113.10'], l4: ['198.51.100.5'] };
  const d: Svc = { name: 'd', x4: ['192.0.2.3'], x6: ['2001:db8:e::3'], l4: ['198.51.100.6'], l6: ['2001:db8:1::6'] };
  const a2: Svc = { ...a, l4: ['198.51.100.7'], l6: ['2001:db8:1::7'] };
  const e: Svc = { name: 'e', x4: ['192.0.2.1', '192.0.2.5'], l4: ['198.51.100.8'] };
  const w: Svc = { ns: 'alpha', name: 'w', x4: ['192.0.2.1'], x6: ['2001:db8:e::1'], l4: ['198.51.100.9'], l6: ['2001:db8:1::9'] };
  // default-x/y sorts after default/b in kpng order ("/" first), before it byte-wise
  const y: Svc = { ns: 'default-x', name: 'y', x4: ['192.0.2.2'], l4: ['198.51.100.10'] };
  const a3: Svc = { ...a2, l4: ['198.51.100.7', '198.51.100.11'], l6: ['2001:db8:1::7', '2001:db8:1::11'] };
  const b2: Svc = { ...b, l4: ['198.51.100.3'] };
  const c2: Svc = { ...c, port: 9090 };
  const f: Svc = { name: 'f', x4: ['$(touch /nonexistent)', '192.0.2.20'], x6: ['2001:db8:e::20'], r4: ['198.51.100.20'] };
  const g: Svc = { name: 'g', x4: ['192.0.2.21', '192.0.2.21/0', '-F'], l4: ['198.51.100.21', '-j DROP', 7] };
  const c3: Svc = { ...c2, lb6: ['2001:db8:e::30'], l6: ['2001:db8:1::5'] };
  const s0 = [a, b, c];
  return [
    { what: 'first state', state: s0 },
    { what: 'a Service added', state: [a, b, c, d] },
    { what: 'local endpoints moved, both families', state: [a2, b, c, d] },
    { what: 'a Service claiming a used external IP (after its owner) and a free one', state: [a2, b, c, d, e] },
    { what: 'a Service claiming used external IPs from before their owner; "/" sorts first', state: [w, a2, b, c, d, e, y] },
    { what: 'the owner of shared external IPs removed', state: [a2, b, c, d, e, y] },
    { what: 'one endpoint -> several and several -> one, both families', state: [a3, b2, c, d, e, y] },
    { what: 'a shared IP owner with several endpoints removed', state: [b2, c, d, e, y] },
    { what: 'a line change that changes no mapping; no local endpoint; hostile strings', state: [b2, c2, d, e, f, g, y] },
    { what: 'an IPv6 load-balancer IP', state: [b2, c3, d, e, f, g, y] },
    { what: 'no Service at all', state: [] },
    { what: 'the first state again', state: s0 },
  ];
}

// ---------------------------------------------------------------- running it

/** Runs the callout once (in network namespace `ns` when given) with `input` on stdin. */
export function runOnce(ns: string | undefined, input: string, env: NodeJS.ProcessEnv, callout = NFT): Promise<CommandResult> {
  const [cmd, args] = ns ? ['ip', ['netns', 'exec', ns, callout]] : [callout, []];
  return runCommand(cmd as string, args as string[], { input, env: { ...process.env, ...env }, timeoutMs: 60_000 });
}

// ---------------------------------------------------------------- the kernel side

const NS_PREFIX = `kpngallip-${process.pid}-`;
const namespaces = new Set<string>();
process.once('exit', () => {
  for (const n of namespaces) spawnSync('ip', ['netns', 'del', n], { stdio: 'ignore' });
});

/** A bare network namespace for a callout's table, removed at the test's end. */
export async function netns(t: Tap, tag: string): Promise<string> {
  const name = NS_PREFIX + tag;
  await mustRun('ip', ['netns', 'add', name]);
  namespaces.add(name);
  t.teardown(() => {
    spawnSync('ip', ['netns', 'del', name], { stdio: 'ignore' });
    namespaces.delete(name);
  });
  return name;
}

/**
 * The callout's table in `ns`, comparable across histories: `nft -j` without
 * handles, maps' elements sorted, sets/maps and chains sorted by name, each
 * chain followed by its rules in order. One JSON object per line.
 */
export async function table(ns: string): Promise<string> {
  const r = await runCommand('ip', ['netns', 'exec', ns, 'nft', '-j', 'list', 'table', 'inet', 'kpng_allip']);
  if (r.code !== 0) return `(no table: ${r.stderr.trim()})`;
  const strip = (v: unknown): unknown =>
    Array.isArray(v) ? v.map(strip) : v && typeof v === 'object' ? Object.fromEntries(Object.entries(v).filter(([k]) => k !== 'handle').map(([k, x]) => [k, strip(x)])) : v;
  const sets: string[] = [];
  const chains = new Map<string, { chain: string; rules: string[] }>();
  const chainOf = (name: string) => chains.get(name) ?? chains.set(name, { chain: '', rules: [] }).get(name)!;
  let tableLine = '';
  for (const item of (JSON.parse(r.stdout) as { nftables: Array<Record<string, Record<string, unknown>>> }).nftables) {
    const [kind, body] = Object.entries(item)[0]!;
    const o = strip(body) as Record<string, unknown>;
    if (kind === 'table') tableLine = JSON.stringify({ table: o });
    else if (kind === 'set' || kind === 'map') {
      if (Array.isArray(o.elem)) o.elem = (o.elem as unknown[]).map((e) => JSON.stringify(e)).sort();
      sets.push(JSON.stringify({ [kind]: o }));
    } else if (kind === 'chain') chainOf(o.name as string).chain = JSON.stringify({ chain: o });
    else if (kind === 'rule') chainOf(o.chain as string).rules.push(JSON.stringify({ rule: o }));
  }
  const chainLines = [...chains.keys()].sort().flatMap((name) => [chains.get(name)!.chain, ...chains.get(name)!.rules]);
  return [tableLine, ...sets.sort(), ...chainLines].join('\n') + '\n';
}
