/**
 * Service conversion (src/convert/service.ts), as golden tests: manifests in,
 * kpng-json out, one case per rule of kpng's kube2store; and kube-proxy's
 * selection rule.
 */
import t from 'tap';
import { compileGlobs } from '../../src/convert/glob.js';
import type { KubeService } from '../../src/convert/kube-objects.js';
import { isServiceSelected } from '../../src/convert/service.js';
import { convert, nd, svcHead } from '../helpers/convert.js';

/** A hand-written Service `plain` at 10.96.0.5 with these ports (YAML flow list), converted; and the line expected for `Ports`. */
const plain = (ports: string): string => convert(`
apiVersion: v1
kind: Service
metadata: {name: plain}
spec:
  clusterIP: 10.96.0.5
  ports: ${ports}
`);
const plainLine = (Ports: unknown[]): string => nd({ Service: { ...svcHead('plain'), IPs: { ClusterIPs: { V4: ['10.96.0.5'] }, ExternalIPs: {} }, Ports, SessionAffinity: null }, Endpoints: null });

t.test('Service: defaults of a hand-written manifest (namespace, type, protocol, targetPort)', async (t) => {
  t.equal(plain('[{port: 80}]'), plainLine([{ Protocol: 1, Port: 80, TargetPort: 80 }]));
});

t.test('Service: targetPort 0, "" and null default to the port, as the API server defaults them (SetDefaults_Service)', async (t) => {
  t.equal(
    plain('[{name: a, port: 80, targetPort: 0}, {name: b, port: 81, targetPort: ""}, {name: c, port: 82, targetPort: null}]'),
    plainLine([
      { Name: 'a', Protocol: 1, Port: 80, TargetPort: 80 },
      { Name: 'b', Protocol: 1, Port: 81, TargetPort: 81 },
      { Name: 'c', Protocol: 1, Port: 82, TargetPort: 82 },
    ]),
  );
});

t.test("Service: a protocol named like an Object property (constructor, toString, __proto__) is unknown (0), as Go's ParseProtocol", async (t) => {
  t.equal(
    plain('[{name: a, port: 80, protocol: constructor}, {name: b, port: 81, protocol: toString}, {name: c, port: 82, protocol: __proto__}]'),
    plainLine([
      { Name: 'a', Port: 80, TargetPort: 80 },
      { Name: 'b', Port: 81, TargetPort: 81 },
      { Name: 'c', Port: 82, TargetPort: 82 },
    ]),
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
  // An empty label value: no --service-proxy-name selects it (an empty one is refused), so no hint.
  const empty: string[] = [];
  convert(
    `
apiVersion: v1
kind: Service
metadata: {name: mine, labels: {service.kubernetes.io/service-proxy-name: ""}}
spec: {clusterIPs: [10.96.0.1]}
`,
    {},
    empty,
  );
  t.same(empty, ['0: skipping Service default/mine: it is labelled service.kubernetes.io/service-proxy-name=']);
});
