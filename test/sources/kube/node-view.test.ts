/**
 * The node view (src/sources/kube/node-view.ts) with plain objects: no
 * server, no informer, no timers.
 */
import v8 from 'node:v8';
import { runInNewContext } from 'node:vm';
import t from 'tap';
import { compileGlobs } from '../../../src/convert/glob.js';
import type { KubeEndpointSlice, KubeNode, KubeService } from '../../../src/convert/kube-objects.js';
import { NodeView, type NodeViewOptions } from '../../../src/sources/kube/node-view.js';
import { sameState, stateText, type State } from '../../../src/state.js';
import { blogJsonl, blogView } from '../../helpers/fixtures.js';
import { blogObjects, node, service, slice } from '../../helpers/kube-objects.js';
import { captureLog } from '../../helpers/sink.js';

/** `namespace/name` of each Service line -> its endpoints as `ip[:L]`, sorted. */
function byService(s: State): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const text of stateText(s).split('\n')) {
    if (text === '') continue;
    const { Service: svc, Endpoints } = JSON.parse(text) as { Service: { Namespace: string; Name: string }; Endpoints: Array<{ IPs?: { V4?: string[]; V6?: string[] }; Local?: boolean }> | null };
    const eps = (Endpoints ?? []).map((e) => [...(e.IPs?.V4 ?? []), ...(e.IPs?.V6 ?? [])].join(',') + (e.Local ? ':L' : ''));
    out.set(`${svc.Namespace}/${svc.Name}`, eps.sort());
  }
  return out;
}

const names = (s: State): string[] => [...byService(s).keys()];

/** The endpoints of Service `default/<name>`. */
const eps = (s: State, name: string): string[] => byService(s).get(`default/${name}`) ?? [];

const view = (o: Partial<NodeViewOptions> = {}): { v: NodeView; log: ReturnType<typeof captureLog> } => {
  const log = captureLog();
  return { v: new NodeView({ nodeName: 'node-a', logger: log.logger, ...o }), log };
};

t.test("the blog example: the state of the node that hosts the local pods, as kpng's", async (t) => {
  const { v } = view(blogView);
  for (const [r, o] of blogObjects()) t.ok(r === 'services' ? v.setService(o as KubeService) : v.setSlice(o as KubeEndpointSlice));
  t.equal(stateText(v.state()), blogJsonl);
});

t.test('Services: selected by service-proxy-name, relabelled, deleted', async (t) => {
  const { v } = view({ serviceProxyName: 'mine' });
  t.equal(v.setService(service('other', { proxyName: 'other' })), false, 'not ours, not known: nothing to do');
  t.equal(v.setService(service('plain')), false);
  t.equal(v.setService(service('web', { proxyName: 'mine' })), true);
  t.same(names(v.state()), ['default/web']);
  // Relabelled to another proxy: as a delete.
  t.equal(v.setService(service('web', { proxyName: 'other' })), true);
  t.same(names(v.state()), []);
  t.equal(v.deleteService(service('web')), false, 'already gone');
  t.equal(v.setService(service('web', { proxyName: 'mine' })), true);
  t.equal(v.deleteService(service('web', { proxyName: 'mine' })), true);
  t.same(names(v.state()), []);

  // Without a proxy name: only unlabelled, never headless-labelled.
  const plain = view().v;
  plain.setService(service('plain'));
  plain.setService(service('mine', { proxyName: 'mine' }));
  plain.setService(service('odd', { labels: { 'service.kubernetes.io/headless': '' } }));
  t.same(names(plain.state()), ['default/plain']);
});

t.test('slices: before or after their Service, several per Service, moved, deleted', async (t) => {
  const { v } = view();
  // A slice may come before its Service: filed, used once the Service comes.
  t.equal(v.setSlice(slice('web-a', 'web', [{ ip: '10.0.0.1', node: 'node-a' }, { ip: '10.0.0.2', node: 'node-b' }])), true);
  t.same(names(v.state()), []);
  v.setService(service('web'));
  t.same(eps(v.state(), 'web'), ['10.0.0.1:L', '10.0.0.2']);
  // The same endpoint in a second slice collapses.
  v.setSlice(slice('web-b', 'web', [{ ip: '10.0.0.2', node: 'node-b' }, { ip: '10.0.0.3' }]));
  t.same(eps(v.state(), 'web'), ['10.0.0.1:L', '10.0.0.2', '10.0.0.3']);
  t.equal(v.sliceCount, 2);
  // Relabelled to another Service: moves with its label.
  v.setService(service('api'));
  v.setSlice(slice('web-b', 'api', [{ ip: '10.0.0.3' }]));
  let s = v.state();
  t.same(eps(s, 'web'), ['10.0.0.1:L', '10.0.0.2']);
  t.same(eps(s, 'api'), ['10.0.0.3']);
  // Deleted.
  t.equal(v.deleteSlice(slice('web-a', 'web', [])), true);
  s = v.state();
  t.same(eps(s, 'web'), []);
  t.same(names(s), ['default/api', 'default/web'], 'a Service without endpoints stays');
  t.equal(v.sliceCount, 1);
  // A slice of no Service is not filed; deleting what is not filed changes nothing.
  t.equal(v.setSlice(slice('orphan', undefined, [{ ip: '10.9.9.9' }])), false);
  t.equal(v.deleteSlice(slice('orphan', undefined, [])), false);
  // A slice in another namespace belongs to that namespace's Service.
  t.equal(v.setSlice(slice('api-x', 'api', [{ ip: '10.0.0.4' }], { namespace: 'other' })), true);
  t.same(eps(v.state(), 'api'), ['10.0.0.3']);
  // Deleting a Service keeps its slices for when it comes back.
  v.deleteService(service('api'));
  t.same(names(v.state()), ['default/web']);
  v.setService(service('api'));
  t.same(eps(v.state(), 'api'), ['10.0.0.3']);
});

t.test('staged (as a re-list does): nothing changes until applied; applied, as set*, moves and relabels included', async (t) => {
  const { v } = view({ serviceProxyName: 'mine' });
  const { v: ref } = view({ serviceProxyName: 'mine' });
  type Obj = [KubeService | KubeEndpointSlice, boolean];
  const set = (x: NodeView, [o, isSvc]: Obj): boolean => (isSvc ? x.setService(o as KubeService) : x.setSlice(o as KubeEndpointSlice));
  const stage = (x: NodeView, [o, isSvc]: Obj): (() => boolean) => (isSvc ? x.stageService(o as KubeService) : x.stageSlice(o as KubeEndpointSlice));
  const first: Obj[] = [
    [service('web', { proxyName: 'mine' }), true],
    [service('api', { proxyName: 'mine' }), true],
    [slice('web-a', 'web', [{ ip: '10.0.0.1', node: 'node-a' }, { ip: '10.0.0.2' }]), false],
    [slice('web-b', 'web', [{ ip: '10.0.0.3' }]), false],
  ];
  for (const o of first) for (const x of [v, ref]) set(x, o);
  const before = v.state();
  // The re-list: web relabelled away, web-b moved to api, web-a's endpoints changed, a new slice.
  const second: Obj[] = [
    [service('web', { proxyName: 'other' }), true],
    [slice('web-a', 'web', [{ ip: '10.0.0.1', node: 'node-a' }, { ip: '10.0.0.5' }]), false],
    [slice('web-b', 'api', [{ ip: '10.0.0.3' }]), false],
    [slice('api-c', 'api', [{ ip: '10.0.0.6', node: 'node-a' }]), false],
  ];
  const staged = second.map((o) => stage(v, o));
  t.equal(v.state(), before, 'staging changes nothing (the same state)');
  t.same(
    staged.map((apply) => apply()),
    second.map((o) => set(ref, o)),
    'each applied says what set* says',
  );
  t.ok(sameState(v.state(), ref.state()), 'the same state as set*');
  t.same(eps(v.state(), 'api'), ['10.0.0.3', '10.0.0.6:L']);
  t.equal(v.sliceCount, ref.sliceCount);
  t.same(
    second.slice(1).map((o) => stage(v, o)()),
    [false, false, false],
    'slices staged again unchanged mark nothing',
  );
});

t.test("the zone: from this node's Node only; topology hints follow it", async (t) => {
  const { v, log } = view();
  v.setService(service('hinted'));
  v.setSlice(slice('hinted-1', 'hinted', [{ ip: '10.3.0.1', zones: ['z1'] }, { ip: '10.3.0.2', zones: ['z2'] }, { ip: '10.3.0.3' }]));
  t.same(eps(v.state(), 'hinted'), ['10.3.0.3'], 'zone unknown: no hinted endpoint');
  t.equal(v.setNode(node('node-b', 'z1') as KubeNode), false, 'another node');
  t.equal(v.zone, undefined);
  t.equal(v.setNode(node('node-a', 'z1') as KubeNode), true);
  t.equal(v.zone, 'z1');
  t.same(eps(v.state(), 'hinted'), ['10.3.0.1', '10.3.0.3']);
  t.equal(v.setNode(node('node-a', 'z1') as KubeNode), false, 'same zone');
  v.setNode(node('node-a', 'z2') as KubeNode);
  t.same(eps(v.state(), 'hinted'), ['10.3.0.2', '10.3.0.3']);
  t.equal(v.deleteNode(node('node-a') as KubeNode), true);
  t.same(eps(v.state(), 'hinted'), ['10.3.0.3']);
  t.same(log.matching(/node node-a/), ['kpng-callout info: node node-a: zone z1', 'kpng-callout info: node node-a: zone z2', 'kpng-callout info: node node-a: no zone']);
});

t.test('malformed objects are logged and left out; the others stay', async (t) => {
  const { v, log } = view();
  v.setService(service('web'));
  v.setSlice(slice('web-a', 'web', [{ ip: '10.2.1.1' }]));
  const bad = slice('web-b', 'web', [{ ip: '10.2.1.2' }]);
  (bad.endpoints as Array<Record<string, unknown>>)[0]!.addresses = 'not-a-list';
  v.setSlice(bad);
  v.setSlice(slice('web-c', 'web', [{ ip: '10.2.1.3' }]));
  t.same(eps(v.state(), 'web'), ['10.2.1.1', '10.2.1.3']);
  t.match(log.matching(/endpointslice default\/web-b: cannot convert/)[0], /endpoints\[0\]\.addresses: expected a list/);

  // A Service that does not convert keeps what was there.
  const broken = service('web');
  (broken.spec as Record<string, unknown>).ports = 'eighty';
  v.setService(broken);
  t.same(eps(v.state(), 'web'), ['10.2.1.1', '10.2.1.3']);
  t.match(log.matching(/service default\/web: cannot convert/)[0], /spec\.ports/);
});

t.test('incremental: an unchanged view gives the same state; a change only touches its Service', async (t) => {
  const { v } = view();
  for (let i = 0; i < 20; i++) {
    v.setService(service(`s${i}`));
    v.setSlice(slice(`s${i}-a`, `s${i}`, [{ ip: `10.1.0.${i}` }]));
  }
  const first = v.state();
  t.equal(first.services, 20);
  t.equal(first.endpoints, 20);
  t.ok(sameState(first, v.state()), 'nothing changed');
  v.setSlice(slice('s7-a', 's7', [{ ip: '10.1.1.7' }, { ip: '10.1.2.7' }]));
  const next = v.state();
  t.equal(next.endpoints, 21);
  t.same(eps(next, 's7'), ['10.1.1.7', '10.1.2.7']);
  const before = stateText(first).split('\n');
  const changed = stateText(next)
    .split('\n')
    .filter((l, i) => l !== before[i]);
  t.same(changed.map((l) => (JSON.parse(l) as { Service: { Name: string } }).Service.Name), ['s7']);
});

t.test('keeps nothing of the objects handed over: changing or dropping them afterwards changes nothing', async (t) => {
  v8.setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  const { v } = view();
  let svc: KubeService | undefined = service('web');
  let sl: KubeEndpointSlice | undefined = slice('web-a', 'web', [{ ip: '10.4.0.1', node: 'node-a' }]);
  const refs = [new WeakRef(svc), new WeakRef(sl)];
  v.setService(svc);
  v.setSlice(sl);
  (svc.spec as Record<string, unknown>).clusterIPs = ['10.96.9.9'];
  (sl.endpoints as Array<Record<string, unknown>>)[0]!.addresses = ['10.4.9.9'];
  svc = sl = undefined;
  const text = stateText(v.state());
  t.match(text, /"10\.96\.0\.10".*"10\.4\.0\.1"/);
  // A WeakRef holds its target until the current job ends.
  await new Promise((r) => setImmediate(r));
  gc();
  t.same(
    refs.map((r) => r.deref()),
    [undefined, undefined],
    'both collected',
  );
  t.equal(stateText(v.state()), text);
});

t.test('API objects as the server sends them: managedFields, last-applied and other annotations are dropped unless selected', async (t) => {
  const applied = JSON.stringify({ apiVersion: 'v1', kind: 'Service', metadata: { name: 'web', annotations: { 'example.com/team': 'a' } }, spec: { ports: [{ port: 80 }] } });
  const svc = service('web', { labels: { app: 'web', tier: 'front' } });
  const meta = svc.metadata as Record<string, unknown>;
  meta.annotations = { 'kubectl.kubernetes.io/last-applied-configuration': applied, 'example.com/team': 'a', 'example.com/big': 'x'.repeat(100_000) };
  meta.managedFields = [{ manager: 'kubectl-client-side-apply', operation: 'Update', fieldsType: 'FieldsV1', fieldsV1: { 'f:metadata': { 'f:annotations': {} } } }];
  const sl = slice('web-a', 'web', [{ ip: '10.4.0.1' }]);
  (sl.metadata as Record<string, unknown>).managedFields = [{ manager: 'kube-controller-manager', fieldsV1: { 'f:endpoints': {} } }];
  const plain = view().v;
  plain.setService(svc);
  plain.setSlice(sl);
  const line = JSON.parse(stateText(plain.state())) as { Service: Record<string, unknown> };
  t.equal(line.Service.Labels, undefined);
  t.equal(line.Service.Annotations, undefined);
  const selecting = view({ labels: compileGlobs(['app']), annotations: compileGlobs(['example.com/team']) }).v;
  selecting.setService(svc);
  selecting.setSlice(sl);
  const sel = JSON.parse(stateText(selecting.state())) as { Service: Record<string, unknown> };
  t.same(sel.Service.Labels, { app: 'web' });
  t.same(sel.Service.Annotations, { 'example.com/team': 'a' });
});

t.test('an update this node does not see changes nothing; the state stays the same object', async (t) => {
  const { v } = view();
  v.setService(service('web'));
  t.equal(v.setSlice(slice('web-a', 'web', [{ ip: '10.5.0.1' }, { ip: '10.5.0.2', ready: false }])), true);
  const first = v.state();
  t.equal(v.setSlice(slice('web-a', 'web', [{ ip: '10.5.0.1' }, { ip: '10.5.0.2', ready: false }])), false, 'the same slice again (a re-list)');
  t.equal(v.setSlice(slice('web-a', 'web', [{ ip: '10.5.0.1', pod: 'renamed' }, { ip: '10.5.9.9', ready: false }])), false, 'a pod name, a not-ready address');
  t.equal(v.state(), first);
  t.equal(v.setSlice(slice('web-a', 'web', [{ ip: '10.5.0.1' }, { ip: '10.5.0.2' }])), true, 'ready now');
  t.same(eps(v.state(), 'web'), ['10.5.0.1', '10.5.0.2']);

  // Services: the same again (a status update, a re-list after a storage migration) marks nothing.
  const second = v.state();
  const lb = (o: ReturnType<typeof service>) => ({ ...o, status: { loadBalancer: {} }, metadata: { ...(o.metadata as object), resourceVersion: '99' } });
  t.equal(v.setService(lb(service('web')) as KubeService), false, 'the same Service, another resourceVersion and status');
  t.equal(v.stageService(service('web'))(), false, 'staged, the same');
  t.equal(v.state(), second, 'the same state');
  t.equal(v.setService(service('web', { port: 81 })), true, 'a port changed');
  const third = v.state();
  t.not(third, second);
  t.equal(v.setService(service('web', { port: 81, labels: { 'service.kubernetes.io/topology-mode': 'Auto' } })), false, 'a label not sent');
  t.equal(v.state(), third);
  const withPolicy = service('web', { port: 81 }) as KubeService;
  (withPolicy.spec as Record<string, unknown>).internalTrafficPolicy = 'Local';
  t.equal(v.setService(withPolicy), true, 'the same JSON, another traffic policy: its endpoints are recomputed');
  // One that did not convert, then the same as before it: recomputed (its endpoints were not, meanwhile).
  const broken = service('web', { port: 81 }) as KubeService;
  (broken.spec as Record<string, unknown>).ports = 'nope';
  t.equal(v.setService(broken), true);
  v.state();
  t.equal(v.setService(withPolicy), true, 'after one that did not convert');
});

t.test('a zone change recomputes the Services with hinted endpoints, and only them', async (t) => {
  const { v, log } = view();
  v.setNode(node('node-a', 'z1') as KubeNode);
  v.setService(service('plain'));
  v.setSlice(slice('plain-1', 'plain', [{ ip: '10.6.0.1' }]));
  v.setService(service('hinted'));
  v.setSlice(slice('hinted-1', 'hinted', [{ ip: '10.6.1.1', zones: ['z1'] }, { ip: '10.6.1.2', zones: ['z2'] }]));
  // A malformed endpoint for another zone is never read here, until the zone is its.
  const bad = slice('hinted-2', 'hinted', [{ ip: '10.6.2.1', zones: ['z2'] }]);
  (bad.endpoints as Array<Record<string, unknown>>)[0]!.addresses = 'x';
  v.setSlice(bad);
  const before = v.state();
  t.same(eps(before, 'hinted'), ['10.6.1.1']);
  t.same(log.matching(/cannot convert/), []);
  v.setNode(node('node-a', 'z2') as KubeNode);
  const after = v.state();
  t.same(eps(after, 'hinted'), ['10.6.1.2']);
  t.match(log.matching(/cannot convert/), [/endpointslice default\/hinted-2: cannot convert: endpoints\[0\]\.addresses: expected a list/]);
  const lineOf = (s: State, name: string) => s.lines.find((l) => l.includes(`"Name":"${name}"`));
  t.equal(lineOf(after, 'plain')?.toString(), lineOf(before, 'plain')?.toString(), 'the line of the Service without hints is unchanged');
});
