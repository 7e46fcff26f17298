/**
 * End-to-end tests of the service-proxy callouts (kube-proxy semantics) with
 * real TCP and UDP traffic in the lab of test/helpers/service-lab.ts:
 * callouts/service-proxy-nft (table inet kpng_service_proxy, change sets too)
 * and callouts/service-proxy-iptables (chains KPNG-SP-*, full states only).
 * One lab per callout, reused by its subtests, both families throughout:
 *
 * - ClusterIP from the node and from a pod; hairpin (a pod through its own
 *   Service, masqueraded); ExternalIP, load-balancer IP and NodePort from the
 *   client; target port by TargetPort, by a named port (PortOverrides), and
 *   the Service port itself;
 * - 200 connections spread over both endpoints; ClientIP affinity;
 *   ExternalTrafficToLocal (External-scope endpoints only, client address
 *   kept) vs not (the node's address); Internal vs External scopes;
 * - a Service without endpoints refused at once (not a timeout);
 * - UDP from one client source port follows an endpoint move (conntrack);
 * - idempotent (same ruleset twice), invalid JSON (exit non-zero, rules
 *   kept), hostile strings (nothing injected), foreign rules kept, removal
 *   leaves nothing;
 * - the same through `kpng-callout replay --once`, and for nft through
 *   `replay s1 s2 --changes` (an incremental endpoint move and removal) and
 *   `replay s1 s2 --changes --persistent` (one callout, two frames).
 *
 * A callout whose file is not there yet is skipped, saying so; so is all of
 * it without root, `ip netns` or the tools (labMissing). KPSP_TEST_NFT /
 * KPSP_TEST_IPT run it against another implementation of the same contract.
 * "At once" is FAIL_FAST_MS: < 1.5 s, one SYN retransmission (IPv6's TCP
 * connect ends on an ICMPv6 error only then; an IPv4 ICMP error may be held
 * back by the kernel's rate limit under load; a reset ends it at once); a
 * connect timeout is several seconds.
 */
import t, { type Test as Tap } from 'tap';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { repoPath } from '../../helpers/fixtures.js';
import { tableShape } from '../../helpers/nft-table.js';
import {
  CLIENT,
  FAIL_FAST_MS,
  FAMILIES,
  labMissing,
  NODE,
  NODE_ADDRS,
  ServiceLab,
  svcIP,
  UNTRANSLATED,
  type Family,
} from '../../helpers/service-lab.js';
import type { Conn } from '../../helpers/service-agents.js';
import { serviceObject, stateText, type EndpointSpec, type ServiceSpec } from '../../helpers/service-states.js';

interface Callout {
  name: string;
  tag: string;
  path: string;
  kind: 'nft' | 'iptables';
  /** Applies change sets (KPNG_CALLOUT_INPUT=changes). */
  changes: boolean;
}

const CALLOUTS: Callout[] = [
  { name: 'service-proxy-nft', tag: 'nft', path: process.env.KPSP_TEST_NFT ?? repoPath('callouts/service-proxy-nft'), kind: 'nft', changes: true },
  { name: 'service-proxy-iptables', tag: 'ipt', path: process.env.KPSP_TEST_IPT ?? repoPath('callouts/service-proxy-iptables'), kind: 'iptables', changes: false },
];

// ---------------------------------------------------------------- the states

/** Both families of Service address i. */
const both = (i: number) => ({ v4: [svcIP('v4', i)], v6: [svcIP('v6', i)] });
const ep = (pod: 'pod1' | 'pod2', o: Omit<EndpointSpec, 'pod'> = { local: true }): EndpointSpec => ({ pod, ...o });

const I = { web: 10, one: 11, two: 12, sticky: 13, local: 14, scoped: 15, empty: 16, udp: 17, fresh: 18, hostile: 30 } as const;
const X = { web: 200, local: 201, scoped: 202, empty: 203 } as const;
const LB = { web: 220 } as const;
const NP = { http: 30080, alt: 30081, tls: 30443, raw: 30090, dns: 30053, local: 30100, empty: 30110, sticky: 30120, fresh: 30130 } as const;

const web = (pods: Array<'pod1' | 'pod2'>): ServiceSpec => ({
  name: 'web',
  type: 'LoadBalancer',
  clusterIPs: both(I.web),
  externalIPs: both(X.web),
  lbIPs: both(LB.web),
  ports: [
    { name: 'http', protocol: 'TCP', port: 80, nodePort: NP.http, targetPort: 8080 },
    { name: 'alt', protocol: 'TCP', port: 81, nodePort: NP.alt, targetPort: 9090 },
    { name: 'tls', protocol: 'TCP', port: 443, nodePort: NP.tls, targetPort: 9999 },
    { name: 'raw', protocol: 'TCP', port: 9090, nodePort: NP.raw },
    { name: 'dns', protocol: 'UDP', port: 53, nodePort: NP.dns, targetPort: 8080 },
  ],
  // pod1 with both scopes spelled out, pod2 without Scopes (both); only "tls" is overridden
  endpoints: pods.map((p) =>
    p === 'pod1'
      ? ep(p, { local: true, scopes: { internal: true, external: true }, portOverrides: [{ name: 'tls', port: 8443 }] })
      : ep(p, { local: true, portOverrides: [{ name: 'tls', port: 8443 }] }),
  ),
});

const simple = (name: string, i: number, eps: EndpointSpec[] | null, extra: Partial<ServiceSpec> = {}): ServiceSpec => ({
  name,
  clusterIPs: both(i),
  ports: [{ protocol: 'TCP', port: 80, targetPort: 8080 }],
  endpoints: eps,
  ...extra,
});

const S1: ServiceSpec[] = [
  web(['pod1', 'pod2']),
  simple('one', I.one, [ep('pod1')]),
  simple('two', I.two, [ep('pod2')]),
  simple('sticky', I.sticky, [ep('pod1'), ep('pod2')], { affinity: 600, ports: [{ protocol: 'TCP', port: 80, nodePort: NP.sticky, targetPort: 8080 }] }),
  simple('local', I.local, [ep('pod1', { local: true, scopes: { internal: true, external: true } }), ep('pod2', { scopes: { internal: true } })], {
    type: 'NodePort',
    externalIPs: both(X.local),
    externalTrafficToLocal: true,
    ports: [{ protocol: 'TCP', port: 80, nodePort: NP.local, targetPort: 8080 }],
  }),
  simple('scoped', I.scoped, [ep('pod1', { local: true, scopes: { internal: true } }), ep('pod2', { local: true, scopes: { external: true } })], {
    externalIPs: both(X.scoped),
  }),
  simple('empty', I.empty, null, {
    type: 'NodePort',
    externalIPs: both(X.empty),
    ports: [{ protocol: 'TCP', port: 80, nodePort: NP.empty, targetPort: 8080 }],
  }),
  simple('udp', I.udp, [ep('pod1')], { ports: [{ protocol: 'UDP', port: 53, targetPort: 8080 }] }),
];

/** S1 with the UDP endpoint moved to pod2, web down to pod2, and "one" removed. */
const S2: ServiceSpec[] = S1.filter((s) => s.name !== 'one').map((s) =>
  s.name === 'udp' ? { ...s, endpoints: [ep('pod2')] } : s.name === 'web' ? web(['pod2']) : s,
);

const STATE1 = stateText(S1);
const STATE2 = stateText(S2);
/** S2 with the UDP Service's TargetPort changed (its endpoint, pod2, the same). */
const STATE2_PORT = stateText(S2.map((s) => (s.name === 'udp' ? { ...s, ports: [{ protocol: 'UDP', port: 53, targetPort: 9090 }] } : s)));

/** Every Service address and NodePort of S1 (what removal must leave no trace of). */
const ALL_IPS = [...Object.values(I), ...Object.values(X), ...Object.values(LB)].flatMap((i) => FAMILIES.map((f) => svcIP(f, i)));
const ALL_NODEPORTS = Object.values(NP);

/** A Service full of hostile strings, beside one valid ClusterIP and endpoint; `marker` must never be created. */
function hostile(marker: string): ReturnType<typeof serviceObject> {
  const o = serviceObject(simple('hostile', I.hostile, [ep('pod1')]));
  const inject = `$(touch ${marker})`;
  o.Service.IPs = {
    ClusterIPs: { V4: [svcIP('v4', I.hostile), inject, '192.0.2.31/0', '-F', '192.0.2.032'], V6: [svcIP('v6', I.hostile), '2001:db8:5::31%eth0', `\`touch ${marker}\``] },
    ExternalIPs: { V4: [`192.0.2.232; touch ${marker}`, '192.0.2.233\nflush ruleset'] },
  };
  o.Service.Ports = [
    { Name: `x"; touch ${marker}; #`, Protocol: 1, Port: 80, TargetPort: 8080 },
    { Protocol: 1, Port: `81; touch ${marker}`, TargetPort: 8080 },
    { Protocol: 1, Port: 82, TargetPort: inject },
    { Protocol: 1, Port: 70000, TargetPort: 8080 },
    { Protocol: 1, Port: 83, NodePort: `3; touch ${marker}`, TargetPort: 8080 },
  ];
  o.Endpoints = [
    ...(o.Endpoints ?? []),
    { IPs: { V4: [`198.51.100.9; touch ${marker}`] }, Local: true },
    { IPs: { V6: [inject] }, Local: true },
    { IPs: { V4: ['198.51.100.130'] }, Local: true, PortOverrides: [{ Port: `8080 ; touch ${marker}` }] },
  ];
  return o;
}

// ---------------------------------------------------------------- checks

const summary = (cs: Conn[]): string =>
  [...new Set(cs.map((c) => (c.pod ? `${c.pod} ${c.src} ${c.port}` : `${c.err}`)))].slice(0, 6).join(' | ') + ` (max ${Math.max(...cs.map((c) => c.ms))} ms)`;

/** Counts answers per pod. */
const byPod = (cs: Conn[]) => {
  const n: Record<string, number> = {};
  for (const c of cs) n[c.pod ?? `error ${c.err}`] = (n[c.pod ?? `error ${c.err}`] ?? 0) + 1;
  return n;
};

/** Only answers, from `pods`, on `port`. */
function answered(t: Tap, cs: Conn[], pods: readonly string[], port: number, msg: string): void {
  const bad = cs.filter((c) => !c.pod || !pods.includes(c.pod) || c.port !== port);
  t.equal(bad.length, 0, `${msg}: every connection answered by ${pods.join('/')} on ${port}`, { got: summary(cs) });
}

/** Every one failed at once, with one of `errs` (not a timeout). */
function refused(t: Tap, fam: Family, cs: Conn[], errs: readonly string[], msg: string): void {
  const fastMs = FAIL_FAST_MS[fam];
  const bad = cs.filter((c) => c.pod || !c.err || !errs.includes(c.err) || c.ms >= fastMs);
  t.equal(bad.length, 0, `${msg}: failed at once (${errs.join('/')}, < ${fastMs} ms)`, { got: summary(cs) });
}

/** The ruleset of what the callout writes, with what changes by itself (counters, expiry times) normalized. */
async function ruleset(lab: ServiceLab, c: Callout): Promise<string> {
  const text = c.kind === 'nft' ? await lab.nftRuleset() : await lab.iptRuleset();
  return text.replace(/counter packets \d+ bytes \d+/g, 'counter').replace(/expires [0-9hms.]+/g, 'expires T');
}

/** The foreign rules each lab starts with: a table of another nft user, and iptables rules in nat and filter. */
const FOREIGN_NFT = 'table inet kpsp_foreign {\n\tchain input {\n\t\ttype filter hook input priority 10; policy accept;\n\t\tip saddr 192.0.2.99 counter drop\n\t}\n}\n';

async function addForeign(lab: ServiceLab): Promise<void> {
  const r = await lab.exec('node', 'nft', ['-f', '-'], FOREIGN_NFT);
  if (r.code !== 0) throw new Error(`nft: ${r.stderr}`);
  for (const args of [
    ['-t', 'nat', '-N', 'FOREIGN-NAT'],
    ['-t', 'nat', '-A', 'FOREIGN-NAT', '-d', '192.0.2.98/32', '-j', 'RETURN'],
    ['-t', 'nat', '-A', 'PREROUTING', '-j', 'FOREIGN-NAT'],
    ['-t', 'filter', '-A', 'INPUT', '-s', '192.0.2.97/32', '-j', 'DROP'],
  ]) {
    const x = await lab.exec('node', 'iptables', args);
    if (x.code !== 0) throw new Error(`iptables ${args.join(' ')}: ${x.stderr}`);
  }
}

async function foreignKept(t: Tap, lab: ServiceLab, msg: string): Promise<void> {
  const nft = await lab.exec('node', 'nft', ['list', 'table', 'inet', 'kpsp_foreign']);
  t.match(nft.stdout, /ip saddr 192\.0\.2\.99 counter packets \d+ bytes \d+ drop/, `${msg}: the foreign nft table and its rule are there`);
  const nat = await lab.exec('node', 'iptables-save', ['-t', 'nat']);
  t.match(nat.stdout, /-A FOREIGN-NAT -d 192\.0\.2\.98\/32 -j RETURN/, `${msg}: the foreign nat chain's rule is there`);
  t.match(nat.stdout, /-A PREROUTING -j FOREIGN-NAT/, `${msg}: the foreign jump is there`);
  const filter = await lab.exec('node', 'iptables-save', ['-t', 'filter']);
  t.match(filter.stdout, /-A INPUT -s 192\.0\.2\.97\/32 -j DROP/, `${msg}: the foreign filter rule is there`);
}

// ---------------------------------------------------------------- the tests

const reason = await labMissing();
if (reason) console.error(`# skipping service-proxy callout tests: ${reason}`);

for (const c of CALLOUTS) {
  const absent = existsSync(c.path) ? undefined : `${c.path} does not exist (yet)`;
  if (absent && !reason) console.error(`# skipping ${c.name}: ${absent}`);

  t.test(`${c.name} with real traffic`, { skip: reason ?? absent ?? false }, async (t) => {
    const lab = new ServiceLab(c.tag);
    t.teardown(() => lab.close());
    await lab.open();
    await addForeign(lab);
    const applyMs: number[] = [];
    const direct = async (t: Tap, state: string, msg: string) => {
      const t0 = Date.now();
      const r = await lab.direct(c.path, state);
      applyMs.push(Date.now() - t0);
      t.equal(r.code, 0, `${msg}: exits 0`, { stderr: r.stderr });
      return r;
    };

    let R1 = '';
    let applied = false;
    await t.test('a full state applies; the same state again changes nothing', async (t) => {
      applied = (await direct(t, STATE1, 'the first state')).code === 0;
      R1 = await ruleset(lab, c);
      await direct(t, STATE1, 'the same state again');
      t.equal(await ruleset(lab, c), R1, 'the same ruleset text twice');
      await foreignKept(t, lab, 'after two runs');
    });
    if (!applied) return; // the rest needs the first state in place

    await t.test('invalid JSON: exit non-zero, rules untouched', async (t) => {
      for (const bad of ['{"Service":\n', STATE1 + 'not json\n', '{"Service":null}\n' + STATE1, '[1,2,3]\n' + STATE1]) {
        const r = await lab.direct(c.path, bad);
        t.not(r.code, 0, `exits non-zero on ${JSON.stringify(bad.slice(-12))}`);
        t.equal(await ruleset(lab, c), R1, 'the ruleset is unchanged');
      }
    });

    await t.test('ClusterIP from the node and from a pod; hairpin', async (t) => {
      for (const fam of FAMILIES) {
        answered(t, await lab.tcp('node', svcIP(fam, I.web), 80, { n: 10, parallel: 5 }), ['pod1', 'pod2'], 8080, `${fam} node -> web ClusterIP:80`);
        answered(t, await lab.tcp('node', svcIP(fam, I.two), 80, { n: 3 }), ['pod2'], 8080, `${fam} node -> two ClusterIP:80`);
        answered(t, await lab.tcp('pod1', svcIP(fam, I.two), 80, { n: 3 }), ['pod2'], 8080, `${fam} pod1 -> two ClusterIP:80`);
        const hair = await lab.tcp('pod1', svcIP(fam, I.one), 80, { n: 3 });
        answered(t, hair, ['pod1'], 8080, `${fam} hairpin pod1 -> one ClusterIP:80 (its own Service)`);
        t.ok(
          hair.every((h) => h.src === NODE.pod1[fam]),
          `${fam} hairpin: pod1 sees the node's address ${NODE.pod1[fam]}, masqueraded`,
          { got: summary(hair) },
        );
      }
    });

    await t.test('ExternalIP, load-balancer IP and NodePort from the client', async (t) => {
      for (const fam of FAMILIES) {
        answered(t, await lab.tcp('client', svcIP(fam, X.web), 80, { n: 6, parallel: 3 }), ['pod1', 'pod2'], 8080, `${fam} client -> web ExternalIP:80`);
        answered(t, await lab.tcp('client', svcIP(fam, LB.web), 80, { n: 6, parallel: 3 }), ['pod1', 'pod2'], 8080, `${fam} client -> web LB IP:80`);
        answered(t, await lab.tcp('client', NODE.client[fam], NP.http, { n: 6, parallel: 3 }), ['pod1', 'pod2'], 8080, `${fam} client -> node:${NP.http} (NodePort)`);
        answered(t, await lab.tcp('client', svcIP(fam, I.web), 80, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 8080, `${fam} client -> web ClusterIP:80`);
        const u = await lab.udp('client', NODE.client[fam], NP.dns, { n: 4 });
        answered(t, u, ['pod1', 'pod2'], 8080, `${fam} UDP client -> node:${NP.dns} (NodePort)`);
        // web's ExternalIP and LB IP share its ClusterIP's endpoints (nft: keyed by the ClusterIP, the
        // destination rewritten first): UDP too, whose checksum the rewrite must keep
        answered(t, await lab.udp('client', svcIP(fam, X.web), 53, { n: 4 }), ['pod1', 'pod2'], 8080, `${fam} UDP client -> web ExternalIP:53`);
        answered(t, await lab.udp('client', svcIP(fam, LB.web), 53, { n: 4 }), ['pod1', 'pod2'], 8080, `${fam} UDP client -> web LB IP:53`);
      }
    });

    await t.test('target ports: TargetPort, a named port (PortOverrides), the port itself', async (t) => {
      for (const fam of FAMILIES) {
        answered(t, await lab.tcp('node', svcIP(fam, I.web), 81, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 9090, `${fam} web:81 -> TargetPort 9090`);
        answered(t, await lab.tcp('node', svcIP(fam, I.web), 443, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 8443, `${fam} web:443 -> the override of "tls", 8443 (not TargetPort 9999)`);
        answered(t, await lab.tcp('client', NODE.client[fam], NP.tls, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 8443, `${fam} NodePort ${NP.tls} -> 8443`);
        answered(t, await lab.tcp('node', svcIP(fam, I.web), 9090, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 9090, `${fam} web:9090 (no TargetPort) -> 9090`);
        answered(t, await lab.udp('node', svcIP(fam, I.web), 53, { n: 4 }), ['pod1', 'pod2'], 8080, `${fam} UDP web:53 -> 8080`);
      }
    });

    await t.test('200 connections are spread over both endpoints', async (t) => {
      for (const fam of FAMILIES) {
        const cs = await lab.tcp('node', svcIP(fam, I.web), 80, { n: 200, parallel: 20 });
        answered(t, cs, ['pod1', 'pod2'], 8080, `${fam} 200 connections`);
        const n = byPod(cs);
        t.ok((n.pod1 ?? 0) >= 50 && (n.pod2 ?? 0) >= 50, `${fam}: each pod gets >= 25% (${JSON.stringify(n)})`);
      }
    });

    await t.test('ClientIP affinity: one client, one pod', async (t) => {
      for (const fam of FAMILIES) {
        for (const from of ['client', 'node'] as const) {
          const cs = await lab.tcp(from, svcIP(fam, I.sticky), 80, { n: 20, parallel: 1 });
          answered(t, cs, ['pod1', 'pod2'], 8080, `${fam} ${from} -> sticky`);
          t.equal(Object.keys(byPod(cs)).length, 1, `${fam} ${from}: all 20 connections to one pod (${JSON.stringify(byPod(cs))})`);
          if (from !== 'client') continue;
          // The affinity is the Service port's, whichever of its addresses the client uses (as kube-proxy).
          const np = await lab.tcp('client', NODE.client[fam], NP.sticky, { n: 10, parallel: 1 });
          t.same(byPod(np), { [cs[0]!.pod!]: 10 }, `${fam} client: its NodePort connections go to the same pod as its ClusterIP ones`);
        }
      }
    });

    await t.test('ExternalTrafficToLocal keeps the client address and uses External endpoints only', async (t) => {
      for (const fam of FAMILIES) {
        for (const [what, addr, port] of [
          ['ExternalIP', svcIP(fam, X.local), 80],
          ['NodePort', NODE.client[fam], NP.local],
        ] as const) {
          const cs = await lab.tcp('client', addr, port, { n: 20, parallel: 4 });
          answered(t, cs, ['pod1'], 8080, `${fam} local ${what}: the External endpoint only`);
          t.ok(cs.every((x) => x.src === CLIENT[fam]), `${fam} local ${what}: the pod sees the client ${CLIENT[fam]}`, { got: summary(cs) });
        }
        const inside = await lab.tcp('node', svcIP(fam, I.local), 80, { n: 20, parallel: 4 });
        answered(t, inside, ['pod1', 'pod2'], 8080, `${fam} local ClusterIP: Internal endpoints`);
        t.equal(Object.keys(byPod(inside)).length, 2, `${fam} local ClusterIP: both Internal endpoints used (${JSON.stringify(byPod(inside))})`);
        const cs = await lab.tcp('client', svcIP(fam, X.web), 80, { n: 10, parallel: 5 });
        answered(t, cs, ['pod1', 'pod2'], 8080, `${fam} web ExternalIP`);
        t.ok(cs.every((x) => x.src !== undefined && NODE_ADDRS.includes(x.src)), `${fam} web (Cluster policy) ExternalIP: the pod sees a node address`, { got: summary(cs) });
        const np = await lab.tcp('client', NODE.client[fam], NP.http, { n: 10, parallel: 5 });
        t.ok(np.every((x) => x.src !== undefined && NODE_ADDRS.includes(x.src)), `${fam} web NodePort: the pod sees a node address`, { got: summary(np) });
      }
    });

    await t.test('Scopes: Internal endpoints for the ClusterIP, External ones for the ExternalIP', async (t) => {
      for (const fam of FAMILIES) {
        answered(t, await lab.tcp('node', svcIP(fam, I.scoped), 80, { n: 12, parallel: 4 }), ['pod1'], 8080, `${fam} scoped ClusterIP -> the Internal endpoint`);
        answered(t, await lab.tcp('client', svcIP(fam, X.scoped), 80, { n: 12, parallel: 4 }), ['pod2'], 8080, `${fam} scoped ExternalIP -> the External endpoint`);
      }
    });

    await t.test('a Service without endpoints is refused at once (TCP)', async (t) => {
      for (const fam of FAMILIES) {
        refused(t, fam, await lab.tcp('node', svcIP(fam, I.empty), 80, { n: 2 }), ['ECONNREFUSED', 'ECONNRESET'], `${fam} node -> empty ClusterIP`);
        refused(t, fam, await lab.tcp('client', svcIP(fam, I.empty), 80, { n: 2 }), ['ECONNREFUSED', 'ECONNRESET'], `${fam} client -> empty ClusterIP`);
        refused(t, fam, await lab.tcp('client', svcIP(fam, X.empty), 80, { n: 2 }), ['ECONNREFUSED', 'ECONNRESET'], `${fam} client -> empty ExternalIP`);
        refused(t, fam, await lab.tcp('client', NODE.client[fam], NP.empty, { n: 2 }), ['ECONNREFUSED', 'ECONNRESET'], `${fam} client -> empty NodePort`);
        // The lab itself: an address of no Service is not translated and the sink answers "unreachable".
        refused(t, fam, await lab.tcp('client', svcIP(fam, 99), 81, { n: 2 }), UNTRANSLATED, `${fam} (lab) an address of no Service`);
        // A port a ClusterIP does not serve: nft rejects it (as kube-proxy's nftables mode); iptables leaves it (as its iptables mode).
        for (const from of ['client', 'node'] as const) {
          const cs = await lab.tcp(from, svcIP(fam, I.empty), 81, { n: 2 });
          if (c.kind === 'nft') refused(t, fam, cs, ['ECONNREFUSED', 'ECONNRESET'], `${fam} ${from} -> a ClusterIP port no Service serves`);
          else refused(t, fam, cs, UNTRANSLATED, `${fam} ${from} -> a ClusterIP port no Service serves: not translated`);
        }
      }
    });

    await t.test('hostile strings inject nothing', async (t) => {
      const marker = join(lab.dir, 'pwned');
      const r = await lab.direct(c.path, stateText([...S1, hostile(marker)]));
      t.equal(r.code, 0, 'exits 0: bad values are skipped, not fatal', { stderr: r.stderr });
      t.notOk(existsSync(marker), 'the marker file was not created');
      const rules = await ruleset(lab, c);
      for (const s of ['touch', 'pwned', '192.0.2.31', '192.0.2.232', '192.0.2.233', '2001:db8:5::31', '70000']) {
        t.notOk(rules.includes(s), `no rule holds ${JSON.stringify(s)}`);
      }
      t.match(r.stderr, /skip/i, 'stderr logs what was skipped');
      for (const fam of FAMILIES) {
        // pod2 (198.51.100.130, v4) has a hostile PortOverride: skipping the override (TargetPort) or the endpoint are both fine
        answered(t, await lab.tcp('node', svcIP(fam, I.hostile), 80, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 8080, `${fam} the valid ClusterIP of the hostile Service still works`);
      }
      answered(t, await lab.tcp('node', svcIP('v4', I.web), 80, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 8080, 'the other Services still work');
      await direct(t, STATE1, 'back to the first state');
      t.equal(await ruleset(lab, c), R1, 'the hostile Service leaves no trace');
    });

    await t.test('UDP from one source port follows an endpoint move', async (t) => {
      for (const fam of FAMILIES) {
        const before = await lab.udp('client', svcIP(fam, I.udp), 53, { n: 3, srcPort: 40053 });
        answered(t, before, ['pod1'], 8080, `${fam} UDP from port 40053 -> pod1`);
      }
      await direct(t, STATE2, 'the endpoint moved');
      for (const fam of FAMILIES) {
        const after = await lab.udp('client', svcIP(fam, I.udp), 53, { n: 3, srcPort: 40053 });
        answered(t, after, ['pod2'], 8080, `${fam} UDP from the same port 40053 -> pod2 now`);
        answered(t, await lab.tcp('node', svcIP(fam, I.web), 80, { n: 10, parallel: 5 }), ['pod2'], 8080, `${fam} web: pod2 only`);
        refused(t, fam, await lab.tcp('node', svcIP(fam, I.one), 80, { n: 2 }), UNTRANSLATED, `${fam} a removed Service: not translated any more`);
      }
      t.notMatch(await lab.conntrack(), /dport=53 .*src=198\.51\.100\.2 |dport=53 .*src=2001:db8:1::2 /, 'no UDP conntrack entry to the old endpoint left');
      // The same endpoint at another port (as kube-proxy, a flow is stale when the endpoint's IP:port went away).
      await direct(t, STATE2_PORT, 'the TargetPort changed');
      for (const fam of FAMILIES) {
        answered(t, await lab.udp('client', svcIP(fam, I.udp), 53, { n: 3, srcPort: 40053 }), ['pod2'], 9090, `${fam} UDP from the same port 40053 -> pod2:9090 now`);
      }
    });

    await t.test('UDP sent to a Service address before the Service existed reaches it once it does (same source port)', async (t) => {
      // As kube-proxy (a newly active UDP Service): the flows the client made while nothing
      // translated that address (untranslated, so never to an endpoint) are deleted.
      const s2p = S2.map((s) => (s.name === 'udp' ? { ...s, ports: [{ protocol: 'UDP' as const, port: 53, targetPort: 9090 }] } : s));
      const fresh = simple('fresh', I.fresh, [ep('pod2')], { type: 'NodePort', ports: [{ protocol: 'UDP', port: 53, nodePort: NP.fresh, targetPort: 8080 }] });
      for (const fam of FAMILIES) {
        await lab.udp('client', svcIP(fam, I.fresh), 53, { n: 1, srcPort: 40054 });
        await lab.udp('client', NODE.client[fam], NP.fresh, { n: 1, srcPort: 40055 });
      }
      await direct(t, stateText([...s2p, fresh]), 'a new UDP Service');
      for (const fam of FAMILIES) {
        answered(t, await lab.udp('client', svcIP(fam, I.fresh), 53, { n: 2, srcPort: 40054 }), ['pod2'], 8080, `${fam} ClusterIP from the same port 40054 -> pod2`);
        answered(t, await lab.udp('client', NODE.client[fam], NP.fresh, { n: 2, srcPort: 40055 }), ['pod2'], 8080, `${fam} NodePort from the same port 40055 -> pod2`);
      }
      await direct(t, stateText(s2p), 'the new Service removed');
    });

    await t.test('the same through kpng-callout replay --once', async (t) => {
      await direct(t, STATE1, 'direct');
      const want = await ruleset(lab, c);
      const r = await lab.replay(c.path, [STATE1], { once: true });
      t.equal(r.code, 0, 'replay --once exits 0', { stderr: r.stderr });
      t.equal(await ruleset(lab, c), want, 'the ruleset of a direct run');
      for (const fam of FAMILIES) {
        answered(t, await lab.udp('client', svcIP(fam, I.udp), 53, { n: 2, srcPort: 40054 }), ['pod1'], 8080, `${fam} UDP from port 40054 -> pod1`);
        answered(t, await lab.tcp('client', svcIP(fam, X.web), 80, { n: 6, parallel: 3 }), ['pod1', 'pod2'], 8080, `${fam} web ExternalIP`);
      }
      const r2 = await lab.replay(c.path, [STATE2], { once: true });
      t.equal(r2.code, 0, 'replay --once of the moved state exits 0', { stderr: r2.stderr });
      for (const fam of FAMILIES) {
        answered(t, await lab.udp('client', svcIP(fam, I.udp), 53, { n: 2, srcPort: 40054 }), ['pod2'], 8080, `${fam} UDP from port 40054 -> pod2 now`);
      }
    });

    if (c.changes) {
      await t.test('change sets: replay s1 s2 --changes', async (t) => {
        await direct(t, STATE1, 'direct, first state');
        for (const fam of FAMILIES) {
          answered(t, await lab.udp('client', svcIP(fam, I.udp), 53, { n: 2, srcPort: 40055 }), ['pod1'], 8080, `${fam} UDP from port 40055 -> pod1`);
        }
        const r = await lab.replay(c.path, [STATE1, STATE2], { changes: true });
        t.equal(r.code, 0, 'replay s1 s2 --changes exits 0', { stderr: r.stderr });
        for (const fam of FAMILIES) {
          answered(t, await lab.udp('client', svcIP(fam, I.udp), 53, { n: 2, srcPort: 40055 }), ['pod2'], 8080, `${fam} after the change set: UDP from 40055 -> pod2`);
          answered(t, await lab.tcp('node', svcIP(fam, I.web), 80, { n: 10, parallel: 5 }), ['pod2'], 8080, `${fam} after the change set: web to pod2 only`);
          refused(t, fam, await lab.tcp('node', svcIP(fam, I.one), 80, { n: 2 }), UNTRANSLATED, `${fam} after the change set: "one" is gone`);
          answered(t, await lab.tcp('client', svcIP(fam, X.local), 80, { n: 4 }), ['pod1'], 8080, `${fam} after the change set: the unchanged Services still work`);
        }
        const r2 = await lab.replay(c.path, [STATE2, ''], { changes: true });
        t.equal(r2.code, 0, 'replay s2 (empty) --changes exits 0', { stderr: r2.stderr });
        for (const fam of FAMILIES) {
          refused(t, fam, await lab.tcp('node', svcIP(fam, I.web), 80, { n: 2 }), UNTRANSLATED, `${fam} all removed by a change set: web not translated`);
        }
        const rules = await ruleset(lab, c);
        t.ok(!ALL_IPS.some((ip) => rules.includes(ip)), 'all removed by a change set: no Service IP in the ruleset', { leftover: ALL_IPS.filter((ip) => rules.includes(ip)) });
      });
    }

    if (c.changes) {
      await t.test('persistent: replay s1 s2 --changes --persistent (one callout, frames)', async (t) => {
        await direct(t, '', 'direct, no Service');
        const r = await lab.replay(c.path, [STATE1, STATE2], { changes: true, persistent: true });
        t.equal(r.code, 0, 'replay s1 s2 --changes --persistent exits 0', { stderr: r.stderr });
        t.match(r.stderr, /frame 1 \(full\) applied/, 'frame 1 applied in full');
        t.match(r.stderr, /frame 2 \(changes\) applied/, 'frame 2 applied as a change set');
        for (const fam of FAMILIES) {
          answered(t, await lab.udp('client', svcIP(fam, I.udp), 53, { n: 2, srcPort: 40056 }), ['pod2'], 8080, `${fam} persistent: UDP -> pod2`);
          answered(t, await lab.tcp('node', svcIP(fam, I.web), 80, { n: 10, parallel: 5 }), ['pod2'], 8080, `${fam} persistent: web to pod2 only`);
          refused(t, fam, await lab.tcp('node', svcIP(fam, I.one), 80, { n: 2 }), UNTRANSLATED, `${fam} persistent: "one" is gone`);
          answered(t, await lab.tcp('client', svcIP(fam, X.local), 80, { n: 4 }), ['pod1'], 8080, `${fam} persistent: the unchanged Services work`);
        }
        // (our table as tables of the same elements and rules compare: a change set adds a shared chain it needs)
        const table = async () => tableShape((await lab.exec('node', 'nft', ['-j', 'list', 'table', 'inet', 'kpng_service_proxy'])).stdout);
        const want = await table();
        await direct(t, STATE2, 'direct, the second state in full');
        t.same(await table(), want, 'the same table as a run of the second state in full');
      });
    }

    await t.test('removal leaves nothing; foreign rules survive', async (t) => {
      await direct(t, STATE1, 'the first state');
      await direct(t, '', 'no Service at all');
      const rules = await ruleset(lab, c);
      const ips = ALL_IPS.filter((ip) => new RegExp(`(^|[^0-9a-f:.])${ip.replace(/\./g, '\\.')}([^0-9a-f:.]|$)`, 'm').test(rules));
      t.same(ips, [], 'no Service IP in the ruleset');
      const ports = ALL_NODEPORTS.filter((p) => rules.includes(String(p)));
      t.same(ports, [], 'no NodePort in the ruleset');
      for (const fam of FAMILIES) {
        refused(t, fam, await lab.tcp('node', svcIP(fam, I.web), 80, { n: 2 }), UNTRANSLATED, `${fam} web ClusterIP from the node`);
        refused(t, fam, await lab.tcp('client', svcIP(fam, X.web), 80, { n: 2 }), UNTRANSLATED, `${fam} web ExternalIP from the client`);
        refused(t, fam, await lab.tcp('client', NODE.client[fam], NP.http, { n: 2 }), ['ECONNREFUSED'], `${fam} web NodePort from the client`);
        refused(t, fam, await lab.tcp('client', svcIP(fam, I.empty), 80, { n: 2 }), UNTRANSLATED, `${fam} the former empty Service: not rejected any more`);
      }
      await foreignKept(t, lab, 'at the end');
      const sorted = [...applyMs].sort((a, b) => a - b);
      t.comment(`${c.name}: ${applyMs.length} direct runs, median ${sorted[Math.floor(sorted.length / 2)]} ms, max ${sorted[sorted.length - 1]} ms`);
    });
  });
}
