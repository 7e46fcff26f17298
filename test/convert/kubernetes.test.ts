/**
 * Conversion golden tests: Kubernetes manifests in, kpng-json NDJSON out,
 * one case per rule of convert/kubernetes.ts (kpng's kube2store + the
 * node-local server rules), plus the helpers (IP parsing, globs, XXH64).
 */
import { readFileSync } from 'node:fs';
import t from 'tap';
import { parseAllDocuments } from 'yaml';
import { compileGlobs, splitGlobList } from '../../src/convert/glob.js';
import { ipFamily, ipSet } from '../../src/convert/ip.js';
import {
  ConversionError,
  convertEndpoints,
  convertObjects,
  convertService,
  endpointKey,
  isServiceSelected,
  type ConvertOptions,
  type KubeEndpointSlice,
  type KubeService,
} from '../../src/convert/kubernetes.js';
import { xxh64 } from '../../src/convert/xxhash.js';
import { stateText } from '../../src/state.js';

const docs = (yaml: string): unknown[] => parseAllDocuments(yaml).map((d) => d.toJS() as unknown);

function convert(yaml: string, opts: Partial<ConvertOptions> = {}, skipped: string[] = []): string {
  return stateText(convertObjects(docs(yaml), { nodeName: 'node-a', onSkip: (i, m) => skipped.push(`${i}: ${m}`), ...opts }));
}

/** One line per Service, as kpng-json prints them. */
const nd = (...lines: unknown[]): string => lines.map((l) => JSON.stringify(l) + '\n').join('');

const svcHead = (name: string, extra: Record<string, unknown> = {}) => ({ Namespace: 'default', Name: name, Type: 'ClusterIP', ...extra });

t.test('the blog example converts to the blog state, in the blog order', async (t) => {
  const yaml = readFileSync(new URL('../../fixtures/kpng-example.yaml', import.meta.url), 'utf8');
  const want = readFileSync(new URL('../../fixtures/kpng-example.jsonl', import.meta.url), 'utf8');
  t.equal(convert(yaml, { nodeName: 'vm-002', serviceProxyName: 'kpng-example' }), want);
  // The order the blog post shows: V6 1100::202, V4 11.0.2.2, V4 11.0.1.2, V6 1100::102.
  const eps = (JSON.parse(want) as { Endpoints: Array<{ IPs: { V4?: string[]; V6?: string[] } }> }).Endpoints;
  t.same(eps.map((e) => [...(e.IPs.V4 ?? []), ...(e.IPs.V6 ?? [])][0]), ['1100::202', '11.0.2.2', '11.0.1.2', '1100::102']);
});

t.test('Service: defaults of a hand-written manifest (namespace, type, protocol, targetPort)', async (t) => {
  t.equal(
    convert(`
apiVersion: v1
kind: Service
metadata: {name: plain}
spec:
  clusterIP: 10.96.0.5
  ports: [{port: 80}]
`),
    nd({ Service: { ...svcHead('plain'), IPs: { ClusterIPs: { V4: ['10.96.0.5'] }, ExternalIPs: {} }, Ports: [{ Protocol: 1, Port: 80, TargetPort: 80 }], SessionAffinity: null }, Endpoints: null }),
  );
});

t.test('Service: ClusterIPs from clusterIPs, clusterIP as fallback, None = headless with empty ClusterIPs', async (t) => {
  t.equal(
    convert(`
apiVersion: v1
kind: Service
metadata: {name: a, namespace: ns1}
spec: {clusterIP: 10.96.0.9, clusterIPs: [10.96.0.9, "fd00::9"]}
---
apiVersion: v1
kind: Service
metadata: {name: b, namespace: ns1}
spec: {clusterIP: 10.96.0.10}
---
apiVersion: v1
kind: Service
metadata: {name: c, namespace: ns1}
spec: {clusterIP: None, clusterIPs: [None]}
---
apiVersion: v1
kind: Service
metadata: {name: d, namespace: ns1}
spec: {type: ExternalName, externalName: example.com}
`),
    nd(
      { Service: { Namespace: 'ns1', Name: 'a', Type: 'ClusterIP', IPs: { ClusterIPs: { V4: ['10.96.0.9'], V6: ['fd00::9'] }, ExternalIPs: {} }, SessionAffinity: null }, Endpoints: null },
      { Service: { Namespace: 'ns1', Name: 'b', Type: 'ClusterIP', IPs: { ClusterIPs: { V4: ['10.96.0.10'] }, ExternalIPs: {} }, SessionAffinity: null }, Endpoints: null },
      { Service: { Namespace: 'ns1', Name: 'c', Type: 'ClusterIP', IPs: { ClusterIPs: {}, ExternalIPs: {}, Headless: true }, SessionAffinity: null }, Endpoints: null },
      { Service: { Namespace: 'ns1', Name: 'd', Type: 'ExternalName', IPs: { ClusterIPs: {}, ExternalIPs: {} }, SessionAffinity: null }, Endpoints: null },
    ),
  );
});

t.test('Service: ExternalIPs and LoadBalancerIPs split by family, parsed, sorted, deduplicated', async (t) => {
  t.equal(
    convert(`
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  clusterIPs: [10.96.1.1]
  externalIPs: [10.0.0.9, "2001:db8::1", 10.0.0.10, 10.0.0.9, "::ffff:10.0.0.1", 192.0.2.010, "fe80::1%eth0", bogus]
status:
  loadBalancer:
    ingress: [{ip: 203.0.113.7}, {hostname: lb.example.com}, {ip: "2001:db8:1::7"}, {ip: 203.0.113.5}]
---
apiVersion: v1
kind: Service
metadata: {name: lb-hostname-only}
spec: {type: LoadBalancer, clusterIPs: [10.96.1.2]}
status:
  loadBalancer:
    ingress: [{hostname: lb.example.com}]
---
apiVersion: v1
kind: Service
metadata: {name: lb-pending}
spec: {type: LoadBalancer, clusterIPs: [10.96.1.3]}
status: {loadBalancer: {}}
`),
    nd(
      {
        Service: {
          ...svcHead('lb', { Type: 'LoadBalancer' }),
          IPs: {
            ClusterIPs: { V4: ['10.96.1.1'] },
            // As written; the IPv4-mapped one counts as IPv4; 192.0.2.010 and the zoned address are dropped.
            ExternalIPs: { V4: ['10.0.0.10', '10.0.0.9', '::ffff:10.0.0.1'], V6: ['2001:db8::1'] },
            LoadBalancerIPs: { V4: ['203.0.113.5', '203.0.113.7'], V6: ['2001:db8:1::7'] },
          },
          SessionAffinity: null,
        },
        Endpoints: null,
      },
      { Service: { ...svcHead('lb-hostname-only', { Type: 'LoadBalancer' }), IPs: { ClusterIPs: { V4: ['10.96.1.2'] }, ExternalIPs: {}, LoadBalancerIPs: {} }, SessionAffinity: null }, Endpoints: null },
      { Service: { ...svcHead('lb-pending', { Type: 'LoadBalancer' }), IPs: { ClusterIPs: { V4: ['10.96.1.3'] }, ExternalIPs: {} }, SessionAffinity: null }, Endpoints: null },
    ),
  );
});

t.test('Service: ports (protocols, NodePort, integer and named targetPort, Name), source ranges', async (t) => {
  t.equal(
    convert(`
apiVersion: v1
kind: Service
metadata: {name: ports}
spec:
  type: NodePort
  clusterIPs: [10.96.2.2]
  loadBalancerSourceRanges: [10.0.0.0/8, "fc00::/7"]
  ports:
  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30080}
  - {name: dns, protocol: UDP, port: 53, targetPort: dns}
  - {name: sig, protocol: SCTP, port: 3868, targetPort: 3868}
  - {name: odd, protocol: QUIC, port: 443}
  - {port: 9000}
`),
    nd({
      Service: {
        ...svcHead('ports', { Type: 'NodePort' }),
        IPs: { ClusterIPs: { V4: ['10.96.2.2'] }, ExternalIPs: {} },
        IPFilters: [{ SourceRanges: ['10.0.0.0/8', 'fc00::/7'] }],
        Ports: [
          { Name: 'http', Protocol: 1, Port: 80, NodePort: 30080, TargetPort: 8080 },
          { Name: 'dns', Protocol: 2, Port: 53, TargetPortName: 'dns' },
          { Name: 'sig', Protocol: 3, Port: 3868, TargetPort: 3868 },
          { Name: 'odd', Port: 443, TargetPort: 443 },
          { Protocol: 1, Port: 9000, TargetPort: 9000 },
        ],
        SessionAffinity: null,
      },
      Endpoints: null,
    }),
  );
});

t.test('Service: traffic policies, ClientIP affinity (default timeout 10800), HealthCheckNodePort', async (t) => {
  t.equal(
    convert(`
apiVersion: v1
kind: Service
metadata: {name: a}
spec:
  type: LoadBalancer
  clusterIPs: [10.96.3.1]
  externalTrafficPolicy: Local
  internalTrafficPolicy: Local
  healthCheckNodePort: 32000
  sessionAffinity: ClientIP
---
apiVersion: v1
kind: Service
metadata: {name: b}
spec:
  clusterIPs: [10.96.3.2]
  externalTrafficPolicy: Cluster
  internalTrafficPolicy: Cluster
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
---
apiVersion: v1
kind: Service
metadata: {name: c}
spec: {clusterIPs: [10.96.3.3], sessionAffinity: None}
`),
    nd(
      {
        Service: {
          ...svcHead('a', { Type: 'LoadBalancer' }),
          IPs: { ClusterIPs: { V4: ['10.96.3.1'] }, ExternalIPs: {} },
          ExternalTrafficToLocal: true,
          SessionAffinity: { ClientIP: { TimeoutSeconds: 10800 } },
          InternalTrafficToLocal: true,
          HealthCheckNodePort: 32000,
        },
        Endpoints: null,
      },
      { Service: { ...svcHead('b'), IPs: { ClusterIPs: { V4: ['10.96.3.2'] }, ExternalIPs: {} }, SessionAffinity: { ClientIP: { TimeoutSeconds: 60 } } }, Endpoints: null },
      { Service: { ...svcHead('c'), IPs: { ClusterIPs: { V4: ['10.96.3.3'] }, ExternalIPs: {} }, SessionAffinity: null }, Endpoints: null },
    ),
  );
});

t.test('Service: Labels and Annotations only for the configured globs (none by default, as kpng)', async (t) => {
  const yaml = `
apiVersion: v1
kind: Service
metadata:
  name: la
  labels: {app: web, tier: front, app.kubernetes.io/name: web}
  annotations: {prometheus.io/scrape: "true", note: "<b>&</b>"}
spec: {clusterIPs: [10.96.4.4]}
`;
  const ips = { ClusterIPs: { V4: ['10.96.4.4'] }, ExternalIPs: {} };
  t.equal(convert(yaml), nd({ Service: { ...svcHead('la'), IPs: ips, SessionAffinity: null }, Endpoints: null }), 'no globs: none sent');
  const out = convert(yaml, { labels: compileGlobs(['app*']), annotations: compileGlobs(['*']) });
  t.equal(
    out,
    nd({
      Service: { ...svcHead('la'), Labels: { app: 'web', 'app.kubernetes.io/name': 'web' }, Annotations: { note: '<b>&</b>', 'prometheus.io/scrape': 'true' }, IPs: ips, SessionAffinity: null },
      Endpoints: null,
    }).replace('<b>&</b>', '\\u003cb\\u003e\\u0026\\u003c/b\\u003e'),
  );
  t.equal(convert(yaml, { labels: compileGlobs(['nomatch']) }), nd({ Service: { ...svcHead('la'), IPs: ips, SessionAffinity: null }, Endpoints: null }), 'nothing matches: none sent');
});

t.test('selection: kube-proxy rule on service.kubernetes.io/service-proxy-name, headless label excluded', async (t) => {
  const mk = (labels: Record<string, string>): KubeService => ({ apiVersion: 'v1', kind: 'Service', metadata: { name: 'x', labels } });
  t.equal(isServiceSelected(mk({})), true);
  t.equal(isServiceSelected(mk({ 'service.kubernetes.io/service-proxy-name': 'p' })), false);
  t.equal(isServiceSelected(mk({ 'service.kubernetes.io/service-proxy-name': '' })), false, 'present even if empty');
  t.equal(isServiceSelected(mk({ 'service.kubernetes.io/service-proxy-name': 'p' }), 'p'), true);
  t.equal(isServiceSelected(mk({ 'service.kubernetes.io/service-proxy-name': 'q' }), 'p'), false);
  t.equal(isServiceSelected(mk({}), 'p'), false);
  t.equal(isServiceSelected(mk({ 'service.kubernetes.io/headless': '' })), false);
  t.equal(isServiceSelected({ metadata: { name: 'x', labels: null } }), true);
  const skipped: string[] = [];
  convert(
    `
apiVersion: v1
kind: Service
metadata: {name: mine, labels: {service.kubernetes.io/service-proxy-name: other}}
spec: {clusterIPs: [10.96.0.1]}
`,
    {},
    skipped,
  );
  t.same(skipped, ['0: skipping Service default/mine: it is labelled service.kubernetes.io/service-proxy-name=other (use --service-proxy-name other)']);
});

const svcYaml = (extra = '') => `
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIPs: [10.96.5.5]
  ports: [{name: http, port: 80, targetPort: http}]
${extra ? extra + '\n' : ''}`;

const ipsOf = { ClusterIPs: { V4: ['10.96.5.5'] }, ExternalIPs: {} };
const webSvc = (extra: Record<string, unknown> = {}) => ({ ...svcHead('web'), IPs: ipsOf, Ports: [{ Name: 'http', Protocol: 1, Port: 80, TargetPortName: 'http' }], SessionAffinity: null, ...extra });

/** Endpoints of the only Service, as compact strings: `ip,ip host L I E ports`. */
function epsOf(out: string): string[] {
  const line = JSON.parse(out) as { Endpoints: Array<Record<string, any>> | null };
  return (line.Endpoints ?? []).map(
    (e) =>
      [...(e.IPs?.V4 ?? []), ...(e.IPs?.V6 ?? [])].join(',') +
      (e.Hostname ? ` host=${e.Hostname}` : '') +
      (e.Local ? ' L' : '') +
      (e.Scopes?.Internal ? ' I' : '') +
      (e.Scopes?.External ? ' E' : '') +
      ' ' +
      JSON.stringify(e.PortOverrides ?? null),
  );
}

t.test('Endpoints: ready only (missing = ready), families, hostname, Local, PortOverrides', async (t) => {
  const out = convert(
    svcYaml() +
      `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {port: 9090}]
endpoints:
- {addresses: [10.1.0.1], conditions: {ready: true}, nodeName: node-a, hostname: web-0}
- {addresses: [10.1.0.2], nodeName: node-b}
- {addresses: [10.1.0.3], conditions: {}, nodeName: node-b}
- {addresses: [10.1.0.4], conditions: {ready: false, serving: true, terminating: true}, nodeName: node-a}
- {addresses: [10.1.0.5, 10.1.0.05], conditions: {ready: null}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-def, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}, {port: 9090}]
endpoints:
- {addresses: ["fd00::1"], conditions: {ready: true}, nodeName: node-a, hostname: web-0}
- {addresses: ["fe80::1%eth0"], nodeName: node-b}
`,
  );
  const ports = '[{"Name":"http","Port":8080},{"Port":9090}]';
  t.same(epsOf(out).sort(), [
    ` I E ${ports}`, // fe80::1%eth0 is dropped: the IPs set stays, empty (as kpng)
    `10.1.0.1 host=web-0 L I E ${ports}`,
    `10.1.0.2 I E ${ports}`,
    `10.1.0.3 I E ${ports}`,
    `10.1.0.5 I E ${ports}`,
    `fd00::1 host=web-0 L I E ${ports}`,
  ]);
  t.match(out, /"IPs":\{\},"PortOverrides"/, 'an endpoint whose only address is invalid keeps an empty IPs');
  t.equal(JSON.parse(out).Service.Name, 'web');
});

t.test('Endpoints: identical ones collapse across slices; order is by the kpng endpoint hash', async (t) => {
  const slice = (name: string, addrs: string[]) => `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ${name}, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
${addrs.map((a) => `- {addresses: [${a}], nodeName: node-b, targetRef: {kind: Pod, name: p-${a.replace(/\./g, '-')}}}`).join('\n')}
`;
  const out = convert(svcYaml() + slice('s1', ['10.1.0.1', '10.1.0.2']) + slice('s2', ['10.1.0.2', '10.1.0.3']));
  const got = epsOf(out).map((e) => e.split(' ')[0]);
  t.same([...got].sort(), ['10.1.0.1', '10.1.0.2', '10.1.0.3'], 'the duplicate of 10.1.0.2 collapsed');
  // The path key is the hex XXH64 of the endpoint's protobuf {Hostname, IPs, Local}.
  const keys = got.map((ip) => endpointKey({ IPs: { V4: [ip!] } }));
  t.same(keys, [...keys].sort(), 'endpoints ordered by key');
  // Slice order does not matter.
  t.equal(convert(svcYaml() + slice('s2', ['10.1.0.2', '10.1.0.3']) + slice('s1', ['10.1.0.1', '10.1.0.2'])), out);
});

t.test('Endpoints: same hostname/IPs/locality with different ports keep one endpoint each', async (t) => {
  const svc = docs(svcYaml())[0] as KubeService;
  const mk = (port: number): KubeEndpointSlice => ({ metadata: { name: `s${port}` }, ports: [{ name: 'http', port }], endpoints: [{ addresses: ['10.1.0.1'], nodeName: 'node-b' }] });
  const eps = convertEndpoints(svc, [mk(8080), mk(8081)], { nodeName: 'node-a' });
  const base = endpointKey({ IPs: { V4: ['10.1.0.1'] } });
  t.equal(eps.length, 2);
  for (const [k] of eps) t.match(k, new RegExp(`^${base}-[0-9a-f]+$`));
  t.not(eps[0]![0], eps[1]![0]);
});

t.test('Endpoints: scopes from traffic policies; both false means not sent', async (t) => {
  const slice = `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.1.0.1], nodeName: node-a}
- {addresses: [10.1.0.2], nodeName: node-b}
`;
  const p = '[{"Name":"http","Port":8080}]';
  t.same(epsOf(convert(svcYaml('  externalTrafficPolicy: Local') + slice)).sort(), [`10.1.0.1 L I E ${p}`, `10.1.0.2 I ${p}`]);
  t.same(epsOf(convert(svcYaml('  internalTrafficPolicy: Local') + slice)).sort(), [`10.1.0.1 L I E ${p}`, `10.1.0.2 E ${p}`]);
  t.same(epsOf(convert(svcYaml('  internalTrafficPolicy: Local\n  externalTrafficPolicy: Local') + slice)), [`10.1.0.1 L I E ${p}`]);
  t.same(epsOf(convert(svcYaml('  internalTrafficPolicy: Local\n  externalTrafficPolicy: Local') + slice, { nodeName: 'node-c' })), [], 'no endpoint on node-c');
  t.match(convert(svcYaml('  internalTrafficPolicy: Local\n  externalTrafficPolicy: Local') + slice, { nodeName: 'node-c' }), /"Endpoints":null/);
});

t.test('Endpoints: topology hints keep only endpoints hinted for the node zone', async (t) => {
  const slice = `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints:
- {addresses: [10.1.0.1], nodeName: node-b, zone: z1, hints: {forZones: [{name: z1}]}}
- {addresses: [10.1.0.2], nodeName: node-c, zone: z2, hints: {forZones: [{name: z2}, {name: z3}]}}
- {addresses: [10.1.0.3], nodeName: node-c, zone: z2}
- {addresses: [10.1.0.4], nodeName: node-c, zone: z2, hints: {forZones: []}}
`;
  const node = (zone: string) => `---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: ${zone}}}
`;
  const ips = (out: string) => epsOf(out).map((e) => e.split(' ')[0]).sort();
  t.same(ips(convert(svcYaml() + slice)), ['10.1.0.3', '10.1.0.4'], 'unknown node: no zone, hinted endpoints dropped');
  t.same(ips(convert(svcYaml() + slice + node('z3'))), ['10.1.0.2', '10.1.0.3', '10.1.0.4'], 'zone from the Node object');
  t.same(ips(convert(svcYaml() + slice + node('z3'), { nodeZone: 'z1' })), ['10.1.0.1', '10.1.0.3', '10.1.0.4'], '--node-zone wins');
  const other = `---
apiVersion: v1
kind: Node
metadata: {name: node-b, labels: {topology.kubernetes.io/zone: z1}}
`;
  t.same(ips(convert(svcYaml() + slice + other)), ['10.1.0.3', '10.1.0.4'], "another node's zone does not count");
});

t.test('slices without the service-name label, of unknown services, and other kinds are skipped', async (t) => {
  const skipped: string[] = [];
  const out = convert(
    svcYaml() +
      `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: nolabel}
addressType: IPv4
endpoints: [{addresses: [10.9.9.9]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ghost-1, labels: {kubernetes.io/service-name: ghost}}
addressType: IPv4
endpoints: [{addresses: [10.9.9.8]}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
---
apiVersion: discovery.k8s.io/v1beta1
kind: EndpointSlice
metadata: {name: old, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.9.9.7]}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: web}
`,
    {},
    skipped,
  );
  t.equal(out, nd({ Service: webSvc(), Endpoints: null }));
  t.same(skipped, [
    '1: ignoring EndpointSlice default/nolabel: no kubernetes.io/service-name label',
    '3: ignoring apps/v1 Deployment default/web: not a v1 Service, discovery.k8s.io/v1 EndpointSlice or v1 Node',
    '4: ignoring discovery.k8s.io/v1beta1 EndpointSlice old: not a v1 Service, discovery.k8s.io/v1 EndpointSlice or v1 Node',
    '5: ignoring v1 Endpoints web: not a v1 Service, discovery.k8s.io/v1 EndpointSlice or v1 Node',
    '2: ignoring EndpointSlice for default/ghost: no such Service (or not selected)',
  ]);
});

t.test('services are ordered by path, as the live sources order them', async (t) => {
  const svc = (ns: string, name: string) => `---
apiVersion: v1
kind: Service
metadata: {name: ${name}, namespace: ${ns}}
spec: {clusterIPs: [10.96.0.1]}
`;
  const out = convert(svc('b', 'x') + svc('a', 'a-b') + svc('a', 'a') + svc('a', 'a.b'));
  t.same(
    out.trim().split('\n').map((l) => { const s = (JSON.parse(l) as { Service: { Namespace: string; Name: string } }).Service; return `${s.Namespace}/${s.Name}`; }),
    ['a/a', 'a/a-b', 'a/a.b', 'b/x'],
  );
});

t.test('wrong types throw ConversionError with the path and the object index', async (t) => {
  const bad = (yaml: string) => {
    try {
      convert(yaml);
    } catch (err) {
      if (err instanceof ConversionError) return `${err.index}: ${err.message}`;
      throw err;
    }
    return 'no error';
  };
  t.equal(bad(svcYaml().replace('port: 80', 'port: "80"')), '0: spec.ports[0].port: expected an integer, got "80"');
  t.equal(bad('apiVersion: v1\nkind: Service\nmetadata: {namespace: x}\n'), '0: metadata.name: missing name');
  t.equal(bad('apiVersion: v1\nkind: Service\nmetadata: {name: x, labels: {a: 1}}\n'), '0: metadata.labels.a: expected a string, got 1');
  t.equal(
    bad(svcYaml() + '---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, labels: {kubernetes.io/service-name: web}}\nendpoints: [{addresses: 10.0.0.1}]\n'),
    '1: endpoints[0].addresses: expected a list, got "10.0.0.1"',
  );
  t.equal(bad('- a\n- b\n'), '0: (object): expected a Kubernetes object, got a list');
  t.throws(() => convertService({ metadata: { name: 'x' }, spec: { clusterIPs: 'x' as unknown as string[] } }), ConversionError);
});

t.test('ipFamily follows Go net.ParseIP (and To4)', async (t) => {
  const cases: Array<[string, 4 | 6 | undefined]> = [
    ['10.0.0.1', 4], ['0.0.0.0', 4], ['255.255.255.255', 4], ['256.0.0.1', undefined], ['1.2.3', undefined], ['1.2.3.4.5', undefined],
    ['192.0.2.010', undefined], ['01.2.3.4', undefined], ['1.2.3.4 ', undefined], ['', undefined],
    ['::', 6], ['::1', 6], ['fd00::1', 6], ['FD00::A', 6], ['1:2:3:4:5:6:7:8', 6], ['1:2:3:4:5:6:7::', 6], ['::2:3:4:5:6:7:8', 6],
    ['1:2:3:4:5:6:7:8:9', undefined], ['1::2::3', undefined], ['12345::1', undefined], ['1:2:3:4:5:6:7:8::', undefined], [':1::', undefined],
    ['fe80::1%eth0', undefined], ['::ffff:10.0.0.1', 4], ['::ffff:a00:1', 4], ['::10.0.0.1', 6], ['1:2:3:4:5:6:1.2.3.4', 6],
    ['1:2:3:4:5:6:7:1.2.3.4', undefined], ['::ffff:1.2.3.04', undefined], ['0:0:0:0:0:ffff:c000:201', 4],
  ];
  for (const [s, f] of cases) t.equal(ipFamily(s), f, s);
  t.same(ipSet(['b::1', '10.0.0.2', 'a::1', '10.0.0.10', 'a::1', 'x']), { V4: ['10.0.0.10', '10.0.0.2'], V6: ['a::1', 'b::1'] });
});

t.test('globs use gobwas/glob syntax without separators', async (t) => {
  const m = (globs: string[], key: string) => compileGlobs(globs)!.matches(key);
  t.ok(m(['*'], 'app.kubernetes.io/name'));
  t.ok(m(['app*'], 'app.kubernetes.io/name'));
  t.notOk(m(['app'], 'app.kubernetes.io/name'));
  t.ok(m(['?pp'], 'app'));
  t.ok(m(['[ab]pp'], 'bpp'));
  t.notOk(m(['[!ab]pp'], 'bpp'));
  t.ok(m(['[a-c]x'], 'bx'));
  t.ok(m(['{foo,bar}.io/*'], 'bar.io/x'));
  t.ok(m(['a\\*'], 'a*'));
  t.notOk(m(['a\\*'], 'ab'));
  t.ok(m(['x.y'], 'x.y'));
  t.notOk(m(['x.y'], 'xzy'));
  t.equal(compileGlobs([]), undefined);
  t.throws(() => compileGlobs(['[abc']), { message: 'invalid glob "[abc": unclosed [' });
  t.same(splitGlobList('a*,{b,c}d,,e'), ['a*', '{b,c}d', 'e']);
});

t.test('XXH64 matches the reference vectors', async (t) => {
  const h = (s: string) => xxh64(Buffer.from(s)).toString(16);
  t.equal(h(''), 'ef46db3751d8e999');
  t.equal(h('abc'), '44bc2cf5ad770999');
  t.equal(h('Nobody inspects the spammish repetition'), 'fbcea83c8a378bf1');
});

t.test('golden: the realistic fixtures, seen from a node', async (t) => {
  const { parseFixture } = await import('../../src/sources/fixture.js');
  const golden = new URL('./golden/', import.meta.url);
  // `<fixture>.<node>.jsonl`: fixtures/<fixture>.yaml replayed with --node-name <node>.
  for (const [fixture, node] of [
    ['dual-stack-cluster', 'kind-worker'],
    ['dual-stack-cluster', 'kind-control-plane'],
    ['nodeport-local', 'node-a'],
    ['no-endpoints', 'node-a'],
  ] as const) {
    const yaml = readFileSync(new URL(`../../fixtures/${fixture}.yaml`, import.meta.url), 'utf8');
    const want = readFileSync(new URL(`${fixture}.${node}.jsonl`, golden), 'utf8');
    t.equal(stateText(parseFixture(yaml, `${fixture}.yaml`, { nodeName: node })), want, `${fixture} on ${node}`);
  }
});
