/**
 * States for comparing service-proxy-nft's two planners (node, and jq with
 * awk): Services of every kind the table distinguishes, and random ones.
 */
import { below, prng } from './random.js';
import { stateText, type ServiceSpec } from './service-states.js';

const v4v6 = (v4: string, v6: string) => ({ v4: [v4], v6: [v6] });

/** Services of every kind: families, external and LB IPs, NodePorts, protocols, affinity, scopes, named and overridden ports, none. */
export const VARIED: ServiceSpec[] = [
  {
    name: 'web',
    clusterIPs: v4v6('192.0.2.10', '2001:db8:10::10'),
    externalIPs: v4v6('203.0.113.10', '2001:db8:20::10'),
    lbIPs: { v4: ['203.0.113.11'] },
    ports: [
      { name: 'http', port: 80, targetPort: 8080, nodePort: 30080 },
      { name: 'dns', protocol: 'UDP', port: 53, targetPort: 5353, nodePort: 30053 },
      { name: 'sctp', protocol: 'SCTP', port: 9999 },
    ],
    endpoints: [{ pod: 'pod1', portOverrides: [{ name: 'http', port: 8081 }] }, { pod: 'pod2' }],
  },
  {
    name: 'sticky',
    clusterIPs: v4v6('192.0.2.11', '2001:db8:10::11'),
    externalIPs: { v4: ['203.0.113.12'] },
    ports: [{ port: 80, targetPort: 8080, nodePort: 30081 }],
    affinity: 30,
    externalTrafficToLocal: true,
    endpoints: [
      { pod: 'pod1', local: true, scopes: { internal: true, external: true } },
      { pod: 'pod2', scopes: { internal: true } },
    ],
  },
  { name: 'headless', headless: true, ports: [{ port: 80 }], endpoints: [{ pod: 'pod1' }] },
  { name: 'empty', clusterIPs: { v4: ['192.0.2.12'] }, ports: [{ protocol: 'UDP', port: 53, nodePort: 30082 }], endpoints: null },
  {
    name: 'named',
    clusterIPs: { v4: ['192.0.2.13'] },
    ports: [{ name: 'metrics', port: 9090, targetPortName: 'metrics' }],
    endpoints: [{ pod: 'pod1', portOverrides: [{ name: 'metrics', port: 9100 }] }, { pod: 'pod2', portOverrides: [{ name: 'other', port: 1 }] }],
  },
  { name: 'sticky-default', clusterIPs: { v4: ['192.0.2.14'] }, ports: [{ port: 443, nodePort: 30083 }], affinity: 0, endpoints: [{ pod: 'pod2' }] },
  // the cluster IP of `web` again, on another port: both held (cipdups4)
  { name: 'web-twin', clusterIPs: { v4: ['192.0.2.10'] }, ports: [{ port: 81 }], endpoints: [{ pod: 'pod1' }] },
  // its external IP is its cluster IP: one destination
  { name: 'self', clusterIPs: { v4: ['192.0.2.15'] }, externalIPs: { v4: ['192.0.2.15'] }, ports: [{ port: 80 }], endpoints: [{ pod: 'pod1' }] },
  {
    name: 'split-ports',
    clusterIPs: v4v6('192.0.2.16', '2001:db8:10::16'),
    ports: [{ name: 'a', port: 80, targetPort: 8080 }, { name: 'b', protocol: 'UDP', port: 80 }],
    endpoints: [{ pod: 'pod1', portOverrides: [{ name: 'a', port: 8081 }] }, { pod: 'pod2' }],
  },
  { name: 'external-only', externalIPs: { v4: ['203.0.113.13'] }, ports: [{ port: 80, nodePort: 30084 }], endpoints: [{ pod: 'pod1', scopes: { external: true } }] },
];

/** A random state of n Services (seeded: the same each run). */
export function randomState(n: number, seed: number): string {
  const r = prng(seed);
  const rnd = (k: number): number => below(r, k);
  const pods = ['pod1', 'pod2'] as const;
  const specs: ServiceSpec[] = [];
  for (let i = 0; i < n; i++) {
    const fam = rnd(3);
    const ip4 = `192.0.2.${i % 250}`;
    const ip6 = `2001:db8:${i.toString(16)}::${rnd(4)}`;
    const ports = Array.from({ length: 1 + rnd(3) }, (_, p) => ({
      name: rnd(2) ? `p${p}` : '',
      protocol: (['TCP', 'UDP', 'SCTP'] as const)[rnd(3)] ?? 'TCP',
      port: 80 + p,
      ...(rnd(3) === 0 ? { nodePort: 30000 + i * 3 + p } : {}),
      ...(rnd(2) ? { targetPort: 8000 + rnd(3) } : {}),
    }));
    const endpoints = rnd(6) === 0 ? null : Array.from({ length: 1 + rnd(2) }, (_, e) => ({
      pod: pods[e]!,
      ...(rnd(3) === 0 ? { scopes: { internal: rnd(2) === 0, external: rnd(2) === 0 } } : {}),
      ...(rnd(3) === 0 ? { portOverrides: [{ name: 'p0', port: 9000 + rnd(2) }] } : {}),
      ...(rnd(4) === 0 ? { families: [rnd(2) ? ('v6' as const) : ('v4' as const)] } : {}),
    }));
    specs.push({
      name: `svc-${i}`,
      clusterIPs: fam === 0 ? { v4: [ip4] } : fam === 1 ? { v6: [ip6] } : { v4: [ip4], v6: [ip6] },
      ...(rnd(3) === 0 ? { externalIPs: { v4: [`203.0.113.${i % 250}`] } } : {}),
      ...(rnd(8) === 0 ? { headless: true } : {}),
      ...(rnd(5) === 0 ? { affinity: rnd(2) * 60 } : {}),
      ...(rnd(4) === 0 ? { externalTrafficToLocal: true } : {}),
      ports,
      endpoints,
    });
  }
  return stateText(specs);
}

