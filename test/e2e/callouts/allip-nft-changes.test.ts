/**
 * callouts/kpng-example-allip-nft with change sets (KPNG_CALLOUT_INPUT=changes)
 * and as a persistent callout (KPNG_CALLOUT_MODE=persistent), fed directly:
 *
 * - the key property: from a full state P, the change set P -> N leaves
 *   exactly the table that N applied in full leaves (`nft -j list table`,
 *   handles dropped, elements and chains sorted), along a chain of states that
 *   adds, modifies and removes Services, moves endpoints, shares external IPs
 *   between Services (kpng order, "/" first), in both families; per run and
 *   persistent;
 * - a change set that cannot be applied (stale, table gone, other settings,
 *   nothing recorded) fails and changes nothing;
 * - real traffic after incremental changes, in netns-topology.ts's lab;
 * - the persistent loop: frames in, acks on fd 3, bad frames answered with
 *   `error` while the loop goes on, exit 0 at end of input with no process or
 *   temporary file left;
 * - DRY_RUN of a change set (the persistent dry run needs only jq).
 *
 * Needs jq; the rest needs root, `ip netns`, nft and socat (netnsMissing) and
 * skips, saying why, without them. Addresses: documentation ranges only.
 */
import t, { type Test as Tap } from 'tap';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { missingTools, mustRun, runCommand, type CommandResult } from '../../helpers/command.js';
import { tempDir } from '../../helpers/files.js';
import { repoPath } from '../../helpers/fixtures.js';
import { netnsMissing, PODS, Topology, XIP, type PodName } from '../../helpers/netns-topology.js';
import { groupMembers } from '../../helpers/procs.js';
import { frame, PersistentCallout } from '../../helpers/persistent-callout.js';
import { pollUntil } from '../../helpers/wait.js';

const NFT = repoPath('callouts/kpng-example-allip-nft');

/** A process's command line, '' once it is gone (a group's short-lived members come and go while it is read). */
function cmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8');
  } catch {
    return '';
  }
}
const IPT = repoPath('callouts/kpng-example-allip');

// ---------------------------------------------------------------- states and change sets

/** A Service of a test state. */
interface Svc {
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

const keyOf = (s: Svc) => `${s.ns ?? 'default'}/${s.name}`;

/** kpng's order of keys (state.ts comparePaths): bytes, "/" before any other (ASCII keys here). */
function kpngCompare(a: string, b: string): number {
  const rank = (c: number) => (c === 0x2f ? -1 : c);
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    if (a.charCodeAt(i) !== b.charCodeAt(i)) return rank(a.charCodeAt(i)) - rank(b.charCodeAt(i));
  }
  return a.length - b.length;
}

/** One state line, shaped as kpng prints it. */
function svcLine(s: Svc): string {
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
function lines(svcs: Svc[]): Map<string, string> {
  return new Map(svcs.map((s) => [keyOf(s), svcLine(s)] as const).sort(([a], [b]) => kpngCompare(a, b)));
}

/** The full state, as the runner writes it. */
const full = (svcs: Svc[]) => [...lines(svcs).values()].join('');

/** The change set from `prev` to `next`, as the runner writes it (src/changes.ts). */
function changeSet(prev: Svc[], next: Svc[]): string {
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
function chainOfStates(): Array<{ what: string; state: Svc[] }> {
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
function runOnce(ns: string | undefined, input: string, env: NodeJS.ProcessEnv, callout = NFT): Promise<CommandResult> {
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
async function netns(t: Tap, tag: string): Promise<string> {
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
async function table(ns: string): Promise<string> {
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

// ---------------------------------------------------------------- the tests

const noJq = missingTools(['jq']).length > 0;
if (noJq) console.error('# skipping nft change-set tests: jq is missing (apt-get install jq)');
const reason = noJq ? 'jq is missing' : await netnsMissing();
if (reason && !noJq) console.error(`# skipping nft change-set tests that need the kernel: ${reason}`);

t.test('dry runs of change sets and of a persistent callout', { skip: noJq ? 'jq is missing' : false }, async (t) => {
  const a: Svc = { name: 'a', x4: ['192.0.2.1'], x6: ['2001:db8:e::1'], l4: ['198.51.100.2'], l6: ['2001:db8:1::2'] };
  const a1: Svc = { ...a, l4: ['198.51.100.3'], l6: ['2001:db8:1::2', '2001:db8:1::3'] };
  const b: Svc = { name: 'b', x4: ['192.0.2.2'], l4: ['198.51.100.4', '198.51.100.5'] };
  const c: Svc = { ns: 'default-x', name: 'c', x4: ['192.0.2.1', '192.0.2.3'], l4: ['198.51.100.9'] };
  const s0 = [a];
  const s1 = [a1, b];
  const s2 = [a1, c];
  const T = 'inet kpng_allip';

  await t.test('persistent: a full frame, then change sets print only what changes', async (t) => {
    const tmp = tempDir(t, 'kpng-nft-dry-');
    const p = new PersistentCallout(NFT, undefined, { DRY_RUN: '1', TMPDIR: tmp });
    t.equal(await p.frame('full', full(s0)), 'ok', 'the full frame is acknowledged');
    t.equal(await p.frame('changes', changeSet(s0, s1)), 'ok', 'a change set is acknowledged');
    t.equal(await p.frame('changes', changeSet(s1, s2)), 'ok', 'a change set with a shared IP is acknowledged');
    t.equal(await p.frame('changes', changeSet(s2, [a1, { ...c, port: 9090 }])), 'ok', 'a change set that changes no mapping');
    t.equal(await p.frame('full', full(s2)), 'ok', 'a full frame again');
    t.same(await p.end(), { code: 0, signal: null }, 'exits 0 at end of input');

    const perRun = await runOnce(undefined, full(s0), { DRY_RUN: '1' });
    t.equal(perRun.code, 0);
    t.ok(p.stdout.startsWith(perRun.stdout), 'the full frame prints what a run with the full state prints');
    const rest = p.stdout.slice(perRun.stdout.length);
    const genless = rest.replace(/gen \{ \d+ \}/g, 'gen { H }').replace(/elements = \{ \d+ \}/g, 'elements = { H }');
    const fullS2 = (await runOnce(undefined, full(s2), { DRY_RUN: '1' })).stdout;
    t.equal(
      genless,
      [
        `delete element ${T} gen { H }`,
        `add element ${T} gen { H }`,
        `delete element ${T} dnat4 { 192.0.2.1 }`,
        `delete element ${T} dnat6 { 2001:db8:e::1 }`,
        `create element ${T} dnat4 { 192.0.2.1 : 198.51.100.3 }`,
        `create chain ${T} m6_2001_db8_e__1`,
        `add rule ${T} m6_2001_db8_e__1 dnat ip6 to numgen inc mod 2 map { 0 : 2001:db8:1::2, 1 : 2001:db8:1::3 }`,
        `create element ${T} multi6 { 2001:db8:e::1 : goto m6_2001_db8_e__1 }`,
        `create chain ${T} m4_192.0.2.2`,
        `add rule ${T} m4_192.0.2.2 dnat ip to numgen inc mod 2 map { 0 : 198.51.100.4, 1 : 198.51.100.5 }`,
        `create element ${T} multi4 { 192.0.2.2 : goto m4_192.0.2.2 }`,
        `delete element ${T} gen { H }`,
        `add element ${T} gen { H }`,
        `delete element ${T} multi4 { 192.0.2.2 }`,
        `delete chain ${T} m4_192.0.2.2`,
        `create element ${T} dnat4 { 192.0.2.3 : 198.51.100.9 }`,
        '',
      ].join('\n') + fullS2.replace(/elements = \{ \d+ \}/, 'elements = { H }'),
      'each change set is the incremental script; a change of no mapping prints nothing',
    );
    // The gen element: each change set swaps the hash the table holds for the new one,
    // and the hash of a state is the same however it was reached.
    const gens = [...p.stdout.matchAll(/(?:gen \{|elements = \{) (\d+) \}/g)].map((m) => m[1]);
    t.equal(gens.length, 6, 'full, two swaps, full');
    t.equal(gens[1], gens[0], 'the first change set starts from the full state hash');
    t.equal(gens[3], gens[2], 'the second starts where the first ended');
    t.equal(gens[5], gens[4], 'the full state reached by change sets has the hash of the same state in full');
    t.not(gens[2], gens[0], 'a change changes the hash');
    t.match(p.stderr, /"default-x\/c": skipping external IP 192\.0\.2\.1: already used by "default\/a"/, 'the first claim in kpng order ("/" first) wins');
    t.same(readdirSync(tmp), [], 'no temporary file left');
    t.end();
  });

  await t.test('per run: a change set needs a recorded state; the iptables callout refuses change sets', async (t) => {
    const dir = tempDir(t, 'kpng-nft-state-');
    const r = await runOnce(undefined, changeSet(s0, s1), { DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'changes', KPNG_ALLIP_NFT_STATE_DIR: dir });
    t.equal(r.code, 1, 'exits 1');
    t.equal(r.stdout, '', 'prints no script');
    t.match(r.stderr, /no applied state to apply a change set to/);
    const bad = await runOnce(undefined, full(s0), { DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'diff' });
    t.equal(bad.code, 1, 'an unknown KPNG_CALLOUT_INPUT: exit 1');
    t.match(bad.stderr, /KPNG_CALLOUT_INPUT must be full or changes/);
    const ipt = await runOnce(undefined, changeSet(s0, s1), { DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'changes' }, IPT);
    t.equal(ipt.code, 1, 'kpng-example-allip: exit 1 on a change set');
    t.equal(ipt.stdout, '', 'kpng-example-allip: prints nothing');
    t.match(ipt.stderr, /kpng-example-allip: a change set \(KPNG_CALLOUT_INPUT=changes\) cannot be applied/);
    const iptBad = await runOnce(undefined, full(s0), { DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'diff' }, IPT);
    t.equal(iptBad.code, 1, 'kpng-example-allip: an unknown KPNG_CALLOUT_INPUT is not taken for full: exit 1');
    t.equal(iptBad.stdout, '', 'kpng-example-allip: prints nothing for it');
    t.match(iptBad.stderr, /kpng-example-allip: KPNG_CALLOUT_INPUT must be full/);
    const iptFull = await runOnce(undefined, full(s0), { DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'full' }, IPT);
    t.equal(iptFull.code, 0, 'kpng-example-allip: a full state with KPNG_CALLOUT_INPUT=full works');
    const iptLoop = await runOnce(undefined, frame(1, 'full', full(s0)), { DRY_RUN: '1', KPNG_CALLOUT_MODE: 'persistent' }, IPT);
    t.equal(iptLoop.code, 1, 'kpng-example-allip: exit 1 as a persistent callout');
    t.match(iptLoop.stderr, /kpng-example-allip: .*persistent/);
    t.end();
  });

  await t.test('persistent: bad frames get an error ack and the loop goes on', async (t) => {
    const tmp = tempDir(t, 'kpng-nft-dry-');
    const p = new PersistentCallout(NFT, undefined, { DRY_RUN: '1', TMPDIR: tmp });
    t.match(await p.send('garbage\n' + full(s0) + '\n'), /^error .*Frame header/, 'no header');
    t.match(await p.send('{"Frame":{"Seq":"x","Input":"full"}}\n\n'), /^error .*header/, 'a header without a numeric Seq');
    t.match(await p.send('{"Frame":{"Seq":3,"Input":"diff"}}\n\n'), /^error .*header/, 'a header with another Input');
    t.match(await p.send(frame(4, 'full', full(s0) + '{"Service":\n')), /^error cannot read the state as JSON lines/, 'a line that is not JSON');
    t.match(await p.send('\n'), /^error /, 'an empty line outside a frame');
    t.match(await p.send(frame(5, 'changes', changeSet(s0, s1))), /^error no applied state/, 'a change set before any full frame');
    t.equal(await p.send(frame(6, 'full', full(s0))), 'ok', 'a full frame');
    t.match(await p.send(frame(7, 'changes', '[1,2]\n')), /^error a change set line that is not a Service/, 'a change set line that is not a Service');
    t.match(await p.send(frame(8, 'changes', changeSet(s0, s1))), /^error no applied state/, 'after an error, only a full frame');
    t.equal(await p.send(frame(9, 'full', full(s0))), 'ok', 'a full frame');
    t.match(await p.send(frame(10, 'changes', changeSet(s1, s2))), /^error the change set does not match the applied state/, 'a change set from another state');
    t.equal(await p.send(frame(11, 'full', full(s0))), 'ok');
    t.match(await p.send(frame(12, 'changes', svcLine(a1) + svcLine(a1))), /^error change set lines repeated/, 'a Service twice');
    t.equal(await p.send(frame(13, 'full', full(s0))), 'ok');
    t.equal(await p.send(frame(14, 'changes', changeSet(s0, s1))), 'ok', 'then a change set applies');
    // End of input in the middle of a frame: the frame is dropped, the exit is clean.
    p.child.stdin!.write('{"Frame":{"Seq":15,"Input":"full"}}\n' + full(s1));
    t.same(await p.end(), { code: 0, signal: null }, 'exits 0 at end of input');
    await pollUntil(() => groupMembers(p.pgid).length === 0, 'the callout process group to be empty');
    t.same(readdirSync(tmp), [], 'no temporary file left');
    t.notMatch(p.stderr, /awk:|jq: error/, 'no tool error');
    t.end();
  });
  t.end();
});

t.test('kpng-example-allip-nft change sets in the kernel', { skip: reason ?? false }, async (t) => {
  const steps = chainOfStates();

  /**
   * Three namespaces named after `tag`: `inc` (change sets per run, recorded in a state directory of its own:
   * `env`), `ref` (full states) and `per`, where `p` runs persistent (with `perEnv`).
   */
  const threeWays = async (t: Tap, tag: string, perEnv: NodeJS.ProcessEnv = {}) => {
    const env = { KPNG_ALLIP_NFT_STATE_DIR: tempDir(t, 'kpng-nft-state-') };
    const inc = await netns(t, tag);
    const ref = await netns(t, `${tag}ref`);
    const per = await netns(t, `${tag}per`);
    const p = new PersistentCallout(NFT, per, perEnv);
    t.teardown(() => void p.child.stdin!.end());
    return { env, inc, ref, per, p };
  };

  await t.test('a change set P -> N leaves exactly the table of N in full (per run and persistent)', async (t) => {
    const tmp = tempDir(t, 'kpng-nft-tmp-');
    const { env, inc, ref, per, p } = await threeWays(t, 'inc', { TMPDIR: tmp });
    let prev: Svc[] | undefined;
    for (const { what, state } of steps) {
      const input = prev ? changeSet(prev, state) : full(state);
      const kind = prev ? 'changes' : 'full';
      const r = await runOnce(inc, input, { ...env, KPNG_CALLOUT_INPUT: kind });
      t.equal(r.code, 0, `${what}: the ${kind} run exits 0`, { stderr: r.stderr });
      t.equal(await p.frame(kind, input), 'ok', `${what}: the persistent callout acks ok`);
      const want = await runOnce(ref, full(state), { ...env, KPNG_CALLOUT_INPUT: 'full' });
      t.equal(want.code, 0, `${what}: the full run exits 0`, { stderr: want.stderr });
      const expected = await table(ref);
      t.equal(await table(inc), expected, `${what}: per run, the same table as the state in full`);
      t.equal(await table(per), expected, `${what}: persistent, the same table as the state in full`);
      prev = state;
    }
    t.match(await table(ref), /"dnat4"/, 'tables were compared');

    // A change set the kernel refuses: the table was deleted by hand.
    const [s0, s1, s2] = steps.map((s) => s.state);
    t.equal(await p.frame('full', full(s0!)), 'ok');
    await mustRun('ip', ['netns', 'exec', per, 'nft', 'delete', 'table', 'inet', 'kpng_allip']);
    t.match(await p.frame('changes', changeSet(s0!, s1!)), /^error nft failed/, 'a change set onto a deleted table: error');
    t.match(await table(per), /^\(no table/, 'nothing created');
    t.match(await p.frame('changes', changeSet(s1!, s2!)), /^error a full state is needed/, 'then only a full frame');
    t.equal(await p.frame('full', full(s1!)), 'ok', 'a full frame applies');
    t.equal(await p.frame('changes', changeSet(s1!, s2!)), 'ok', 'and change sets again');
    t.equal((await runOnce(ref, full(s2!), {})).code, 0);
    t.equal(await table(per), await table(ref), 'the same table as the state in full');

    t.same(await p.end(), { code: 0, signal: null }, 'the persistent callout exits 0 at end of input');
    await pollUntil(() => groupMembers(p.pgid).length === 0, 'the callout process group (nft -i included) to be empty');
    t.same(readdirSync(tmp), [], 'no temporary file left');
    t.end();
  });

  await t.test('hand-written states out of kpng order: shared IPs go to the first in kpng order; change sets in their order apply', async (t) => {
    const { env, inc, ref, per, p } = await threeWays(t, 'uo');
    const zeta = (l4: string, x4: string[]): Svc => ({ ns: 'zeta', name: 'b', x4, l4: [l4] });
    const alpha = (x4: string[]): Svc => ({ ns: 'alpha', name: 'a', x4, l4: ['198.51.100.3'] });
    // In the fixture's order, not kpng's: zeta first.
    const s1 = [zeta('198.51.100.2', ['192.0.2.71', '192.0.2.72']), alpha(['192.0.2.70', '192.0.2.72'])];
    const s2 = [zeta('198.51.100.4', ['192.0.2.71', '192.0.2.72']), alpha(['192.0.2.70'])];
    const text = (svcs: Svc[]) => svcs.map(svcLine).join('');
    const set = (svcs: Svc[]) => svcs.map((s) => keyOf(s));
    const changes = (prev: Svc[], next: Svc[]) =>
      set(next)
        .map((k, i) => `{"Previous":${svcLine(prev[i]!).slice(0, -1)}}\n${svcLine(next[i]!)}`)
        .filter((_, i) => svcLine(prev[i]!) !== svcLine(next[i]!))
        .join('');
    let r = await runOnce(inc, text(s1), { ...env, KPNG_CALLOUT_INPUT: 'full' });
    t.equal(r.code, 0, 'the full state applies', { stderr: r.stderr });
    t.match(r.stderr, /"zeta\/b": skipping external IP 192\.0\.2\.72: already used by "alpha\/a"/, 'the first in kpng order keeps it, and the log says so');
    t.equal(await p.frame('full', text(s1)), 'ok');
    t.equal((await runOnce(ref, full(s1), env)).code, 0);
    t.equal(await table(inc), await table(ref), 'the same table as the state in kpng order');
    r = await runOnce(inc, changes(s1, s2), { ...env, KPNG_CALLOUT_INPUT: 'changes' });
    t.equal(r.code, 0, 'a change set in the fixture order applies', { stderr: r.stderr });
    t.equal(await p.frame('changes', changes(s1, s2)), 'ok', 'persistent too');
    t.equal((await runOnce(ref, full(s2), env)).code, 0);
    t.equal(await table(inc), await table(ref), 'per run: the table of the next state');
    t.equal(await table(per), await table(ref), 'persistent: the table of the next state');
    t.same(await p.end(), { code: 0, signal: null });
  });

  await t.test('a change set that cannot be applied fails and changes nothing; a full state heals', async (t) => {
    const stateDir = tempDir(t, 'kpng-nft-state-');
    const ns = await netns(t, 'fail');
    const [s0, s1, s2] = steps.map((s) => s.state);
    const run = (input: string, kind: string, env: NodeJS.ProcessEnv = {}) =>
      runOnce(ns, input, { KPNG_ALLIP_NFT_STATE_DIR: stateDir, KPNG_CALLOUT_INPUT: kind, ...env });

    t.equal((await run(full(s0!), 'full')).code, 0);
    const before = await table(ns);
    const [stateFile] = readdirSync(stateDir);
    const recorded = readFileSync(join(stateDir, stateFile!), 'utf8');

    const dry = await run(changeSet(s0!, s1!), 'changes', { DRY_RUN: '1' });
    t.equal(dry.code, 0, 'DRY_RUN=1 with a change set exits 0');
    t.match(dry.stdout, /^delete element inet kpng_allip gen \{ \d+ \}\nadd element inet kpng_allip gen \{ \d+ \}\ncreate element inet kpng_allip dnat4 \{ 192\.0\.2\.3 : 198\.51\.100\.6 \}\n/, 'it prints the incremental script');
    t.notMatch(dry.stdout, /table|192\.0\.2\.1\b/, 'only what changes');
    t.equal(await table(ns), before, 'the dry run changed no rule');
    t.equal(readFileSync(join(stateDir, stateFile!), 'utf8'), recorded, 'nor the recorded state');

    t.equal((await run(changeSet(s0!, s1!), 'changes')).code, 0, 'the change set applies');
    const after = await table(ns);
    const again = await run(changeSet(s0!, s1!), 'changes');
    t.equal(again.code, 1, 'the same change set again (a stale one): exit 1');
    t.match(again.stderr, /does not match the applied state/);
    t.equal(await table(ns), after, 'nothing changed');

    await mustRun('ip', ['netns', 'exec', ns, 'nft', 'delete', 'table', 'inet', 'kpng_allip']);
    const gone = await run(changeSet(s1!, s2!), 'changes');
    t.equal(gone.code, 1, 'a change set when the table was deleted by hand: exit 1');
    t.match(gone.stderr, /nft -f failed; rules unchanged/);
    t.match(await table(ns), /^\(no table/, 'nothing created');

    t.equal((await run(full(s2!), 'full')).code, 0, 'a full state applies');
    await mustRun('ip', ['netns', 'exec', ns, 'nft', 'flush', 'set', 'inet', 'kpng_allip', 'gen']);
    const flushed = await run(changeSet(s2!, s1!), 'changes');
    t.equal(flushed.code, 1, 'a change set onto a table whose gen element is gone: exit 1');

    t.equal((await run(full(s2!), 'full')).code, 0);
    const lbOff = await run(changeSet(s2!, s1!), 'changes', { KPNG_ALLIP_LB_IPS: '0' });
    t.equal(lbOff.code, 1, 'a change set under another KPNG_ALLIP_LB_IPS than the recorded state: exit 1');
    t.match(lbOff.stderr, /no applied state/);

    t.equal((await run(full(s1!), 'full')).code, 0, 'a full state heals');
    const ref = await netns(t, 'failref');
    t.equal((await runOnce(ref, full(s1!), {})).code, 0);
    t.equal(await table(ns), await table(ref), 'exactly the state');
    t.end();
  });

  await t.test('persistent: nft -i killed, a table holding another mapping, a NUL in a key', async (t) => {
    const ns = await netns(t, 'odd');
    const ref = await netns(t, 'oddref');
    const p = new PersistentCallout(NFT, ns, {});
    t.teardown(() => void p.child.stdin!.end());
    const a: Svc = { name: 'a', x4: ['192.0.2.10'], l4: ['198.51.100.2'] };
    const b: Svc = { name: 'b', x4: ['192.0.2.11'], l4: ['198.51.100.130'] };
    const a2: Svc = { ...a, l4: ['198.51.100.3'] };
    t.equal(await p.frame('full', full([a, b])), 'ok');

    // nft -i ends (killed): the session goes on through nft -f.
    const nfti = groupMembers(p.pgid).filter((pid) => cmdline(pid) === 'nft\0-i\0');
    t.equal(nfti.length, 1, 'one nft -i');
    process.kill(nfti[0]!, 'SIGKILL');
    t.equal(await p.frame('changes', changeSet([a, b], [a2, b])), 'ok', 'a change set after nft -i was killed');
    t.match(p.stderr, /nft -i ended; applying with nft -f from now on/);
    t.equal(await p.frame('changes', changeSet([a2, b], [a, b])), 'ok', 'and the next one');
    t.equal((await runOnce(ref, full([a, b]), {})).code, 0);
    t.equal(await table(ns), await table(ref), 'the table of the state in full');

    // Someone applied the same Services with their endpoints swapped: the gen differs, a change set fails.
    const swapped: Svc[] = [{ ...a, l4: b.l4! }, { ...b, l4: a.l4! }];
    t.equal((await runOnce(ns, full(swapped), {})).code, 0);
    const c: Svc = { name: 'c', x4: ['192.0.2.12'], l4: ['198.51.100.4'] };
    t.match(await p.frame('changes', changeSet([a, b], [a, b, c])), /^error nft failed/, 'a change set onto a table of another mapping');
    t.equal(await p.frame('full', full([a, b, c])), 'ok', 'a full frame heals');

    // A key with a NUL sorts before "a!" (kpng: bytes, "/" first): it owns the shared IP.
    const x: Svc = { ns: 'h', name: 'a\u0000', x4: ['192.0.2.20'], l4: ['198.51.100.5'] };
    const y: Svc = { ns: 'h', name: 'a!', x4: ['192.0.2.20'], l4: ['198.51.100.6'] };
    t.equal(await p.frame('full', full([x])), 'ok');
    t.equal(await p.frame('changes', changeSet([x], [x, y])), 'ok');
    t.equal((await runOnce(ref, full([x, y]), {})).code, 0);
    t.equal(await table(ns), await table(ref), 'the table of the state in full: the NUL key owns 192.0.2.20');
    t.match(await table(ns), /198\.51\.100\.5/);
    t.same(await p.end(), { code: 0, signal: null });
    t.end();
  });

  await t.test('persistent: a change set nft -i refuses is told as a bounded excerpt', async (t) => {
    const ns = await netns(t, 'long');
    const tmp = tempDir(t, 'kpng-allip-nft-err-');
    const p = new PersistentCallout(NFT, ns, { TMPDIR: tmp });
    t.teardown(() => void p.child.stdin!.end());
    // 200 Services all moving their endpoint: a change set of ~13 KB on one nft -i line.
    const at = (i: number, net: string) => `${net}.${i + 1}`;
    const before: Svc[] = Array.from({ length: 200 }, (_, i) => ({ name: `s${i}`, x4: [at(i, '192.0.2')], l4: [at(i, '198.51.100')] }));
    const after: Svc[] = before.map((s, i) => ({ ...s, l4: [at(i, '203.0.113')] }));
    // Someone else's mapping (the endpoints rotated by one): the change set's guard fails.
    const other: Svc[] = before.map((s, i) => ({ ...s, l4: before[(i + 1) % before.length]!.l4! }));
    for (let i = 1; i <= 2; i++) {
      t.equal(await p.frame('full', full(before)), 'ok');
      t.equal((await runOnce(ns, full(other), {})).code, 0);
      const said = p.stderr.length;
      t.match(await p.frame('changes', changeSet(before, after)), /^error nft failed/, `refused (${i})`);
      const told = p.stderr.slice(said);
      t.match(told, /Error: /, "nft's error is told");
      t.ok(told.split('\n').every((l) => l.length <= 300), 'in lines of at most 300 characters', { longest: Math.max(...told.split('\n').map((l) => l.length)) });
      t.ok(told.length < 12_000, 'not the whole transaction', { length: told.length });
      const errs = readdirSync(tmp, { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('nft.err'));
      t.same(errs.map((f) => readFileSync(join(tmp, f), 'utf8')), [''], "nft's error file emptied");
    }
    t.equal(await p.frame('full', full(before)), 'ok', 'a full frame heals');
    t.equal(await p.frame('changes', changeSet(before, after)), 'ok', 'and the change set applies through nft -i');
    t.equal(p.stderr.match(/Error: /g)?.length, 2, 'no other error told');
    t.same(await p.end(), { code: 0, signal: null });
    t.end();
  });

  await t.test('real traffic after incremental changes', async (t) => {
    const topo = new Topology('nftc');
    t.teardown(() => topo.close());
    await topo.open();
    const stateDir = join(topo.dirPath, 'nft-state');
    mkdirSync(stateDir);
    const pod = (p: PodName) => ({ l4: [PODS[p].v4], l6: [PODS[p].v6] });
    const pods = (...ps: PodName[]) => ({ l4: ps.map((p) => PODS[p].v4), l6: ps.map((p) => PODS[p].v6) });
    let prev: Svc[] | undefined;
    const apply = async (t: Tap, state: Svc[]) => {
      const input = prev ? changeSet(prev, state) : full(state);
      const r = await runOnce(topo.ns.node, input, { KPNG_ALLIP_NFT_STATE_DIR: stateDir, KPNG_CALLOUT_INPUT: prev ? 'changes' : 'full' });
      t.equal(r.code, 0, `the ${prev ? 'change set' : 'full state'} applies`, { stderr: r.stderr });
      prev = state;
    };
    const expectAt = async (t: Tap, addr: string, want: PodName | '', msg: string) => {
      for (const from of ['client', 'node'] as const) {
        const got = want ? await topo.poll(from, addr, 8080, want) : await topo.connect(from, addr, 8080);
        t.equal(got, want, `${msg}: ${from} -> ${addr}`);
      }
    };
    const [v4, v4b] = XIP.v4;
    const [v6, v6b] = XIP.v6;

    await apply(t, [{ name: 'web', x4: [v4], x6: [v6], ...pod('pod1'), r4: [PODS.pod2.v4] }]);
    for (const addr of [v4, v6]) await expectAt(t, addr, 'pod1', 'full state: to pod1');
    // A UDP client that keeps its source port (its conntrack entry lives on).
    const udpPort = (addr: string) => (addr.includes(':') ? 40106 : 40104);
    for (const addr of [v4, v6]) t.equal(await topo.udp('client', addr, 8080, udpPort(addr)), 'pod1', `UDP from one source port: ${addr} -> pod1`);

    await apply(t, [{ name: 'web', x4: [v4], x6: [v6], ...pod('pod2'), r4: [PODS.pod1.v4] }]);
    for (const addr of [v4, v6]) await expectAt(t, addr, 'pod2', 'endpoint moved: to pod2');
    // Its flow to the endpoint that went was deleted (as kube-proxy): the same source port reaches the new one.
    for (const addr of [v4, v6]) t.equal(await topo.udp('client', addr, 8080, udpPort(addr)), 'pod2', `UDP from the same source port after the move: ${addr} -> pod2`);
    const rules = (await runCommand('ip', ['netns', 'exec', topo.ns.node, 'nft', 'list', 'table', 'inet', 'kpng_allip'])).stdout;
    t.notMatch(rules, PODS.pod1.v4, 'no rule for the old IPv4 endpoint');
    t.notMatch(rules, PODS.pod1.v6, 'no rule for the old IPv6 endpoint');

    const web2: Svc = { name: 'web', x4: [v4, v4b], x6: [v6, v6b], ...pod('pod2') };
    await apply(t, [web2]);
    for (const addr of [v4, v4b, v6, v6b]) await expectAt(t, addr, 'pod2', 'two external IPs per family');

    // "db" sorts before "web": the second IP of each family goes to it.
    const db: Svc = { name: 'db', x4: [v4b], x6: [v6b], ...pod('pod1') };
    await apply(t, [db, web2]);
    for (const addr of [v4b, v6b]) await expectAt(t, addr, 'pod1', 'shared external IP: to the first Service');
    for (const addr of [v4, v6]) await expectAt(t, addr, 'pod2', 'the other IPs stay');

    await apply(t, [db, { ...web2, ...pods('pod1', 'pod2') }]);
    for (const addr of [v4, v6]) {
      const seen = new Set<string>();
      for (let i = 0; i < 4; i++) seen.add(await topo.connect(i % 2 ? 'node' : 'client', addr));
      t.same([...seen].sort(), ['pod1', 'pod2'], `several local endpoints: connections to ${addr} reach both pods`);
    }

    await apply(t, [{ ...web2, ...pods('pod1', 'pod2') }]);
    for (const addr of [v4b, v6b]) {
      const seen = new Set<string>();
      for (let i = 0; i < 4; i++) seen.add(await topo.connect(i % 2 ? 'node' : 'client', addr));
      t.same([...seen].sort(), ['pod1', 'pod2'], `the shared IP's first Service removed: ${addr} goes to the other`);
    }

    await apply(t, []);
    for (const addr of [v4, v4b, v6, v6b]) await expectAt(t, addr, '', 'all Services removed: refused by the node');
    t.ok(existsSync(stateDir) && readdirSync(stateDir).length === 1, 'one recorded state for the node namespace');

    // Persistent: a change frame and a full frame that move the endpoint clear its UDP flows too.
    const p = new PersistentCallout(NFT, topo.ns.node, {});
    t.teardown(() => void p.child.stdin!.end());
    const at1: Svc[] = [{ name: 'web', x4: [v4], x6: [v6], ...pod('pod1') }];
    const at2: Svc[] = [{ name: 'web', x4: [v4], x6: [v6], ...pod('pod2') }];
    t.equal(await p.frame('full', full(at1)), 'ok');
    for (const addr of [v4, v6]) t.equal(await topo.udp('client', addr, 9090, udpPort(addr)), 'pod1', `persistent: UDP ${addr} -> pod1`);
    t.equal(await p.frame('changes', changeSet(at1, at2)), 'ok');
    for (const addr of [v4, v6]) t.equal(await topo.udp('client', addr, 9090, udpPort(addr)), 'pod2', `persistent change frame: the same source port -> pod2`);
    t.equal(await p.frame('full', full(at1)), 'ok');
    for (const addr of [v4, v6]) t.equal(await topo.udp('client', addr, 9090, udpPort(addr)), 'pod1', `persistent full frame: the same source port -> pod1`);
    t.same(await p.end(), { code: 0, signal: null });
    t.end();
  });
  t.end();
});
