/**
 * The kube source against a list/watch server on loopback
 * (test/helpers/kube-api-server.ts): the state it builds for a node (the
 * blog example, service-proxy-name, Local and Scopes, traffic policies,
 * readiness, several slices per Service, a malformed slice, topology hints),
 * 1,000 Services, --once, the label selector, a node with no Node object.
 * Lists, watches and the API's failures: kube-watch.test.ts.
 */
import t from 'tap';
import { parseServiceProxyName } from '../../src/options.js';
import { serviceLabelSelector } from '../../src/sources/kube.js';
import { stateText } from '../../src/state.js';
import { KubeApiServer, type KObject } from '../helpers/kube-api-server.js';
import { blogJsonl, blogView } from '../helpers/fixtures.js';
import { blogObjects, node, service, slice } from '../helpers/kube-objects.js';
import { eps, lines, names, setup, until, watching } from '../helpers/kube-source.js';
import { within } from '../helpers/wait.js';

t.test('the blog example: the state of the node that hosts the local pods', async (t) => {
  const { sink, srv } = await setup(t, { objects: [...blogObjects(), ['nodes', node(blogView.nodeName)]], ...blogView });
  const rv = srv.resourceVersion;
  const s = await within(sink.waitForStates(1), 'first state');
  t.equal(stateText(s), blogJsonl);
  // Lists carry the selectors; watches resume from the list's resourceVersion and ask for bookmarks.
  const svcList = srv.requests.find((r) => r.path === '/api/v1/services' && !r.watch);
  t.equal(svcList?.query.labelSelector, 'service.kubernetes.io/service-proxy-name=kpng-example,!service.kubernetes.io/headless');
  const nodeList = srv.requests.find((r) => r.path === '/api/v1/nodes' && !r.watch);
  t.equal(nodeList?.query.fieldSelector, 'metadata.name=vm-002');
  await watching(srv);
  for (const r of srv.requests.filter((r) => r.watch)) {
    t.equal(r.query.resourceVersion, rv, `${r.path} watches from the list's resourceVersion`);
    t.equal(r.query.allowWatchBookmarks, 'true');
  }
});

t.test('service-proxy-name selects Services; without it, only unlabelled ones (as kube-proxy)', async (t) => {
  const objects: Array<['services', KObject]> = [
    ['services', service('plain')],
    ['services', service('mine', { proxyName: 'kpng-example' })],
    ['services', service('other', { proxyName: 'other-proxy' })],
    ['services', service('odd', { labels: { 'service.kubernetes.io/headless': '' } })],
  ];
  const named = await setup(t, { objects, serviceProxyName: 'kpng-example' });
  const srv2 = new KubeApiServer();
  const unnamed = await setup(t, { objects, srv: srv2 });
  t.same(names(await within(named.sink.waitForStates(1), 'named')), ['default/mine']);
  t.same(names(await within(unnamed.sink.waitForStates(1), 'unnamed')), ['default/plain']);
  t.equal(unnamed.srv.requests.find((r) => !r.watch && r.path === '/api/v1/services')?.query.labelSelector, '!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless');

  // Relabelling moves a Service from one proxy to the other (the watch sees DELETED / ADDED).
  for (const srv of [named.srv, srv2]) srv.update('services', service('plain', { proxyName: 'kpng-example' }));
  t.same(names(await until(named.sink, (s) => names(s).length === 2)), ['default/mine', 'default/plain']);
  t.same(names(await until(unnamed.sink, (s) => names(s).length === 0)), []);
  for (const srv of [named.srv, srv2]) srv.update('services', service('mine'));
  t.same(names(await until(named.sink, (s) => !names(s).includes('default/mine'))), ['default/plain']);
  t.same(names(await until(unnamed.sink, (s) => names(s).length === 1)), ['default/mine']);
});

t.test('Local and Scopes per node, traffic policies, readiness', async (t) => {
  const objects: Array<['services' | 'endpointslices', KObject]> = [];
  const policies = { cc: ['Cluster', 'Cluster'], el: ['Local', 'Cluster'], il: ['Cluster', 'Local'], ll: ['Local', 'Local'] } as const;
  for (const [name, [etp, itp]] of Object.entries(policies)) {
    objects.push(['services', service(name, { externalTrafficPolicy: etp, internalTrafficPolicy: itp, type: 'NodePort' })]);
    objects.push([
      'endpointslices',
      slice(`${name}-1`, name, [
        { ip: '10.1.0.1', node: 'node-a' },
        { ip: '10.1.0.2', node: 'node-b' },
        { ip: '10.1.0.3', node: 'node-a', ready: false },
        { ip: '10.1.0.4' }, // no node: never local
      ]),
    ]);
  }
  const a = await setup(t, { objects });
  const b = await setup(t, { objects, srv: new KubeApiServer(), nodeName: 'node-b' });
  const sa = await within(a.sink.waitForStates(1), 'node-a');
  const sb = await within(b.sink.waitForStates(1), 'node-b');
  // Both policies Cluster: every ready endpoint, in both scopes; Local only on its node.
  t.same(eps(sa, 'cc'), ['10.1.0.1:L:I:E', '10.1.0.2:I:E', '10.1.0.4:I:E']);
  t.same(eps(sb, 'cc'), ['10.1.0.1:I:E', '10.1.0.2:L:I:E', '10.1.0.4:I:E']);
  // externalTrafficPolicy Local: remote endpoints only for internal traffic.
  t.same(eps(sa, 'el'), ['10.1.0.1:L:I:E', '10.1.0.2:I', '10.1.0.4:I']);
  // internalTrafficPolicy Local: remote endpoints only for external traffic.
  t.same(eps(sa, 'il'), ['10.1.0.1:L:I:E', '10.1.0.2:E', '10.1.0.4:E']);
  // Both Local: a remote endpoint has no scope left and is not sent.
  t.same(eps(sa, 'll'), ['10.1.0.1:L:I:E']);
  t.same(eps(sb, 'll'), ['10.1.0.2:L:I:E']);
  const ll = lines(sa).find((l) => l.Service.Name === 'll')!.Service;
  t.equal(ll.ExternalTrafficToLocal, true);
  t.equal(ll.InternalTrafficToLocal, true);

  // A policy change re-evaluates the Service's endpoints.
  a.srv.update('services', service('ll', { type: 'NodePort' }));
  t.same(eps(await until(a.sink, (s) => eps(s, 'll').length === 3), 'll'), ['10.1.0.1:L:I:E', '10.1.0.2:I:E', '10.1.0.4:I:E']);
});

t.test('several slices per Service, duplicates collapse, slice churn and Service deletion', async (t) => {
  const { srv, sink } = await setup(t, {
    objects: [
      ['services', service('web')],
      ['endpointslices', slice('web-a', 'web', [{ ip: '10.2.0.1', node: 'node-a' }, { ip: '10.2.0.2', node: 'node-b' }])],
      // The same endpoint in a second slice (slice migration), and an IPv6 slice.
      ['endpointslices', slice('web-b', 'web', [{ ip: '10.2.0.2', node: 'node-b', pod: 'web-a-pod-1' }])],
      ['endpointslices', slice('web-c', 'web', [{ ip: '2001:db8::2', node: 'node-b' }])],
      ['endpointslices', slice('orphan', undefined, [{ ip: '10.9.9.9' }])],
    ],
  });
  const first = await within(sink.waitForStates(1), 'first');
  t.same(eps(first, 'web'), ['10.2.0.1:L:I:E', '10.2.0.2:I:E', '2001:db8::2:I:E']);

  srv.update('endpointslices', slice('web-a', 'web', [{ ip: '10.2.0.1', node: 'node-a' }, { ip: '10.2.0.3', node: 'node-a' }]));
  t.same(eps(await until(sink, (s) => eps(s, 'web').includes('10.2.0.3:L:I:E')), 'web'), ['10.2.0.1:L:I:E', '10.2.0.2:I:E', '10.2.0.3:L:I:E', '2001:db8::2:I:E']);

  srv.remove('endpointslices', 'default', 'web-b');
  t.same(eps(await until(sink, (s) => eps(s, 'web').length === 3), 'web'), ['10.2.0.1:L:I:E', '10.2.0.3:L:I:E', '2001:db8::2:I:E']);

  // A slice relabelled to another Service moves with it.
  srv.add('services', service('api'));
  srv.update('endpointslices', slice('web-c', 'api', [{ ip: '2001:db8::2', node: 'node-b' }]));
  const moved = await until(sink, (s) => eps(s, 'api').length === 1 && eps(s, 'web').length === 2);
  t.same(eps(moved, 'api'), ['2001:db8::2:I:E']);

  // Deleting the Service removes its line; its slices come back with it.
  srv.remove('services', 'default', 'web');
  t.same(names(await until(sink, (s) => names(s).length === 1)), ['default/api']);
  srv.add('services', service('web'));
  t.same(eps(await until(sink, (s) => names(s).length === 2), 'web'), ['10.2.0.1:L:I:E', '10.2.0.3:L:I:E']);
  // Never an empty or endpoint-less intermediate state for `api` after it got its slice.
  const i = sink.states.indexOf(moved);
  t.ok(sink.states.slice(i).every((s) => eps(s, 'api').length === 1));
});

t.test('a malformed slice is logged and left out; the others stay', async (t) => {
  const { srv, sink, log } = await setup(t, { objects: [['services', service('web')], ['endpointslices', slice('web-a', 'web', [{ ip: '10.2.1.1' }])]] });
  await within(sink.waitForStates(1), 'first');
  const bad = slice('web-b', 'web', [{ ip: '10.2.1.2' }]);
  (bad.endpoints as Array<Record<string, unknown>>)[0]!.addresses = 'not-a-list';
  srv.add('endpointslices', bad);
  srv.add('endpointslices', slice('web-c', 'web', [{ ip: '10.2.1.3' }]));
  t.same(eps(await until(sink, (s) => eps(s, 'web').length === 2), 'web'), ['10.2.1.1:I:E', '10.2.1.3:I:E']);
  t.match(await log.waitFor(/endpointslice default\/web-b: cannot convert/), /endpoints\[0\]\.addresses: expected a list/);
});

t.test('topology hints: only endpoints hinted for this node zone; zone from the Node, live', async (t) => {
  const objects: Array<['services' | 'endpointslices' | 'nodes', KObject]> = [
    ['services', service('hinted')],
    ['endpointslices', slice('hinted-1', 'hinted', [{ ip: '10.3.0.1', zones: ['z1'] }, { ip: '10.3.0.2', zones: ['z2'] }, { ip: '10.3.0.3' }])],
    ['nodes', node('node-a', 'z1')],
    ['nodes', node('node-b', 'z2')],
  ];
  const { srv, sink, log } = await setup(t, { objects });
  t.same(eps(await within(sink.waitForStates(1), 'first'), 'hinted'), ['10.3.0.1:I:E', '10.3.0.3:I:E']);
  t.notOk(srv.requests.some((r) => r.path === '/api/v1/nodes' && r.query.fieldSelector !== 'metadata.name=node-a'), 'only this Node is watched');
  srv.update('nodes', node('node-a', 'z2'));
  t.same(eps(await until(sink, (s) => eps(s, 'hinted').includes('10.3.0.2:I:E')), 'hinted'), ['10.3.0.2:I:E', '10.3.0.3:I:E']);
  // Other nodes' changes are not seen at all.
  srv.update('nodes', node('node-b', 'z1'));
  // A node without a zone gets no hinted endpoint.
  srv.update('nodes', node('node-a'));
  t.same(eps(await until(sink, (s) => eps(s, 'hinted').length === 1), 'hinted'), ['10.3.0.3:I:E']);
  await log.waitFor(/node node-a: no zone/);
});

t.test('1,000 Services in the initial list', async (t) => {
  const objects: Array<['services' | 'endpointslices', KObject]> = [];
  for (let i = 0; i < 1000; i++) {
    const name = `svc-${String(i).padStart(4, '0')}`;
    objects.push(['services', service(name, { clusterIP: `10.96.${i >> 8}.${i & 255}` })]);
    objects.push(['endpointslices', slice(`${name}-x`, name, [{ ip: `10.7.${i >> 8}.${i & 255}`, node: i % 2 ? 'node-a' : 'node-b' }, { ip: `10.8.${i >> 8}.${i & 255}` }])]);
  }
  const started = Date.now();
  const { sink } = await setup(t, { objects });
  const s = await within(sink.waitForStates(1), 'first state', 20_000);
  t.equal(s.services, 1000);
  t.equal(s.endpoints, 2000);
  t.equal(names(s)[999], 'default/svc-0999');
  t.equal(eps(s, 'svc-0001')[0], '10.7.0.1:L:I:E');
  t.comment(`first state of 1000 services after ${Date.now() - started} ms`);
});

t.test('--once: stops after the first state', async (t) => {
  const { sink, done, srv } = await setup(t, { objects: [['services', service('web')]], once: true });
  await within(done, 'run resolves');
  t.equal(sink.states.length, 1);
  await within(srv.waitForWatchCount(0), 'watches closed');
});

t.test('the Services label selector kpng used; --service-proxy-name must be a label value', async (t) => {
  t.equal(serviceLabelSelector('kpng-example'), 'service.kubernetes.io/service-proxy-name=kpng-example,!service.kubernetes.io/headless');
  t.equal(serviceLabelSelector(), '!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless');
  t.equal(parseServiceProxyName('--service-proxy-name', 'kpng-example'), 'kpng-example');
  for (const bad of ['', '-x', 'x-', 'a b', 'a/b', 'x'.repeat(64)]) t.throws(() => parseServiceProxyName('--service-proxy-name', bad), { code: 'usage' }, JSON.stringify(bad));
});

t.test('a --node-name with no Node in the API is warned about once the lists are complete', async (t) => {
  const missing = await setup(t, { objects: [...blogObjects(), ['nodes', node(blogView.nodeName, 'z1')]], serviceProxyName: blogView.serviceProxyName, nodeName: 'vm-typo' });
  await within(missing.sink.waitForStates(1), 'first state');
  t.equal(missing.log.matching(/warn: node vm-typo: no such Node in the API: .*--node-name/).length, 1, 'warned once');

  const found = await setup(t, { objects: [...blogObjects(), ['nodes', node(blogView.nodeName, 'z1')]], ...blogView });
  await within(found.sink.waitForStates(1), 'first state');
  t.same(found.log.matching(/no such Node/), [], 'no warning for a Node that exists');
});
