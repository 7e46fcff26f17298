/**
 * The states and checks of the service-proxy callouts' real-traffic suites
 * (test/e2e/callouts/service-proxy-traffic.test.ts and
 * service-proxy-replay.test.ts), in the lab of test/helpers/service-lab.ts:
 * the callouts under test, the Services (S1, and S2: the UDP endpoint moved,
 * web down to pod2, "one" removed), a Service of hostile strings, checks of
 * the connections' answers, the foreign rules each lab starts with, and
 * openLab(), one lab per callout and test file.
 */
import type { Test as Tap } from 'tap';
import { existsSync } from 'node:fs';
import { repoPath } from './fixtures.js';
import { FAIL_FAST_MS, FAMILIES, ServiceLab, svcIP, type Family } from './service-lab.js';
import type { Conn } from './service-agents.js';
import { serviceObject, stateText, type EndpointSpec, type ServiceSpec } from './service-states.js';

export interface Callout {
  name: string;
  tag: string;
  path: string;
  kind: 'nft' | 'iptables';
  /** Applies change sets (KPNG_CALLOUT_INPUT=changes). */
  changes: boolean;
}

export const CALLOUTS: Callout[] = [
  { name: 'service-proxy-nft', tag: 'nft', path: process.env.KPSP_TEST_NFT ?? repoPath('callouts/service-proxy-nft'), kind: 'nft', changes: true },
  { name: 'service-proxy-iptables', tag: 'ipt', path: process.env.KPSP_TEST_IPT ?? repoPath('callouts/service-proxy-iptables'), kind: 'iptables', changes: false },
];

// ---------------------------------------------------------------- the states

/** Both families of Service address i. */
export const both = (i: number) => ({ v4: [svcIP('v4', i)], v6: [svcIP('v6', i)] });
export const ep = (pod: 'pod1' | 'pod2', o: Omit<EndpointSpec, 'pod'> = { local: true }): EndpointSpec => ({ pod, ...o });

export const I = { web: 10, one: 11, two: 12, sticky: 13, local: 14, scoped: 15, empty: 16, udp: 17, fresh: 18, hostile: 30 } as const;
export const X = { web: 200, local: 201, scoped: 202, empty: 203 } as const;
export const LB = { web: 220 } as const;
export const NP = { http: 30080, alt: 30081, tls: 30443, raw: 30090, dns: 30053, local: 30100, empty: 30110, sticky: 30120, fresh: 30130 } as const;

export const web = (pods: Array<'pod1' | 'pod2'>): ServiceSpec => ({
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

export const simple = (name: string, i: number, eps: EndpointSpec[] | null, extra: Partial<ServiceSpec> = {}): ServiceSpec => ({
  name,
  clusterIPs: both(i),
  ports: [{ protocol: 'TCP', port: 80, targetPort: 8080 }],
  endpoints: eps,
  ...extra,
});

export const S1: ServiceSpec[] = [
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
export const S2: ServiceSpec[] = S1.filter((s) => s.name !== 'one').map((s) =>
  s.name === 'udp' ? { ...s, endpoints: [ep('pod2')] } : s.name === 'web' ? web(['pod2']) : s,
);

export const STATE1 = stateText(S1);
export const STATE2 = stateText(S2);
/** S2 with the UDP Service's TargetPort changed (its endpoint, pod2, the same). */
export const STATE2_PORT = stateText(S2.map((s) => (s.name === 'udp' ? { ...s, ports: [{ protocol: 'UDP', port: 53, targetPort: 9090 }] } : s)));

/** Every Service address and NodePort of S1 (what removal must leave no trace of). */
export const ALL_IPS = [...Object.values(I), ...Object.values(X), ...Object.values(LB)].flatMap((i) => FAMILIES.map((f) => svcIP(f, i)));
export const ALL_NODEPORTS = Object.values(NP);

/** A Service full of hostile strings, beside one valid ClusterIP and endpoint; `marker` must never be created. */
export function hostile(marker: string): ReturnType<typeof serviceObject> {
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

export const summary = (cs: Conn[]): string =>
  [...new Set(cs.map((c) => (c.pod ? `${c.pod} ${c.src} ${c.port}` : `${c.err}`)))].slice(0, 6).join(' | ') + ` (max ${Math.max(...cs.map((c) => c.ms))} ms)`;

/** Counts answers per pod. */
export const byPod = (cs: Conn[]) => {
  const n: Record<string, number> = {};
  for (const c of cs) n[c.pod ?? `error ${c.err}`] = (n[c.pod ?? `error ${c.err}`] ?? 0) + 1;
  return n;
};

/** Only answers, from `pods`, on `port`. */
export function answered(t: Tap, cs: Conn[], pods: readonly string[], port: number, msg: string): void {
  const bad = cs.filter((c) => !c.pod || !pods.includes(c.pod) || c.port !== port);
  t.equal(bad.length, 0, `${msg}: every connection answered by ${pods.join('/')} on ${port}`, { got: summary(cs) });
}

/** Every one failed at once, with one of `errs` (not a timeout). */
export function refused(t: Tap, fam: Family, cs: Conn[], errs: readonly string[], msg: string): void {
  const fastMs = FAIL_FAST_MS[fam];
  const bad = cs.filter((c) => c.pod || !c.err || !errs.includes(c.err) || c.ms >= fastMs);
  t.equal(bad.length, 0, `${msg}: failed at once (${errs.join('/')}, < ${fastMs} ms)`, { got: summary(cs) });
}

/** The ruleset of what the callout writes, with what changes by itself (counters, expiry times) normalized. */
export async function ruleset(lab: ServiceLab, c: Callout): Promise<string> {
  const text = c.kind === 'nft' ? await lab.nftRuleset() : await lab.iptRuleset();
  return text.replace(/counter packets \d+ bytes \d+/g, 'counter').replace(/expires [0-9hms.]+/g, 'expires T');
}

/** The foreign rules each lab starts with: a table of another nft user, and iptables rules in nat and filter. */
export const FOREIGN_NFT = 'table inet kpsp_foreign {\n\tchain input {\n\t\ttype filter hook input priority 10; policy accept;\n\t\tip saddr 192.0.2.99 counter drop\n\t}\n}\n';

export async function addForeign(lab: ServiceLab): Promise<void> {
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

export async function foreignKept(t: Tap, lab: ServiceLab, msg: string): Promise<void> {
  const nft = await lab.exec('node', 'nft', ['list', 'table', 'inet', 'kpsp_foreign']);
  t.match(nft.stdout, /ip saddr 192\.0\.2\.99 counter packets \d+ bytes \d+ drop/, `${msg}: the foreign nft table and its rule are there`);
  const nat = await lab.exec('node', 'iptables-save', ['-t', 'nat']);
  t.match(nat.stdout, /-A FOREIGN-NAT -d 192\.0\.2\.98\/32 -j RETURN/, `${msg}: the foreign nat chain's rule is there`);
  t.match(nat.stdout, /-A PREROUTING -j FOREIGN-NAT/, `${msg}: the foreign jump is there`);
  const filter = await lab.exec('node', 'iptables-save', ['-t', 'filter']);
  t.match(filter.stdout, /-A INPUT -s 192\.0\.2\.97\/32 -j DROP/, `${msg}: the foreign filter rule is there`);
}

/**
 * Why callout c is skipped (false: it is not): the lab's reason, else
 * its file missing (said on stderr once per test file).
 */
export function skipFor(c: Callout, reason: string | undefined): string | false {
  if (reason) return reason;
  if (existsSync(c.path)) return false;
  console.error(`# skipping ${c.name}: ${c.path} does not exist (yet)`);
  return `${c.path} does not exist (yet)`;
}

/**
 * Callout c's lab for test t (its own namespaces, closed at the end of t),
 * with the foreign rules in place; `direct` runs c on a state there and
 * checks that it exits 0, `applyMs` the time of each such run.
 */
export async function openLab(t: Tap, c: Callout) {
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
  return { lab, direct, applyMs };
}
