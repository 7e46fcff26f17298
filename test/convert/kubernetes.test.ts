/**
 * Whole sets of Kubernetes objects (src/convert/kubernetes.ts): the blog
 * example, what is skipped and why, the order, errors naming the object and
 * the field, and the realistic fixtures against their golden outputs.
 */
import { readFileSync } from 'node:fs';
import t from 'tap';
import { ConversionError } from '../../src/convert/fields.js';
import { convertService } from '../../src/convert/service.js';
import { stateText } from '../../src/state.js';
import { convert, nd, svcYaml, webSvc } from '../helpers/convert.js';
import { blogJsonl, blogView, blogYaml, repoPath } from '../helpers/fixtures.js';

t.test('the blog example converts to the blog state, in the blog order', async (t) => {
  const want = blogJsonl;
  t.equal(convert(blogYaml, blogView), want);
  // The order the blog post shows: V6 1100::202, V4 11.0.2.2, V4 11.0.1.2, V6 1100::102.
  const eps = (JSON.parse(want) as { Endpoints: Array<{ IPs: { V4?: string[]; V6?: string[] } }> }).Endpoints;
  t.same(eps.map((e) => [...(e.IPs.V4 ?? []), ...(e.IPs.V6 ?? [])][0]), ['1100::202', '11.0.2.2', '11.0.1.2', '1100::102']);
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

t.test('golden: the realistic fixtures, seen from a node', async (t) => {
  const { parseFixture } = await import('../../src/sources/fixture.js');
  // `<fixture>.<node>.jsonl`: fixtures/<fixture>.yaml replayed with --node-name <node>.
  for (const [fixture, node] of [
    ['dual-stack-cluster', 'kind-worker'],
    ['dual-stack-cluster', 'kind-control-plane'],
    ['nodeport-local', 'node-a'],
    ['no-endpoints', 'node-a'],
  ] as const) {
    const yaml = readFileSync(repoPath('fixtures', `${fixture}.yaml`), 'utf8');
    const want = readFileSync(repoPath('test', 'convert', 'golden', `${fixture}.${node}.jsonl`), 'utf8');
    t.equal(stateText(parseFixture(yaml, `${fixture}.yaml`, { nodeName: node })), want, `${fixture} on ${node}`);
  }
});

t.test('a Node without a zone label has no zone: endpoints hinted for any zone, "" included, are not sent (as the kube source)', async (t) => {
  const objs = `${svcYaml()}---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {kubernetes.io/hostname: node-a}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints:
- {addresses: [192.0.2.10], hints: {forZones: [{name: ""}]}}
- {addresses: [192.0.2.11], hints: {forZones: [{}]}}
- {addresses: [192.0.2.12]}
ports: [{name: http, port: 8080, protocol: TCP}]
`;
  const out = convert(objs);
  t.match(out, /192\.0\.2\.12/);
  t.notMatch(out, /192\.0\.2\.1[01]"/, 'the hinted ones are left out');
});
