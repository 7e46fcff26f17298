/**
 * The kube source (its list/watch loops, supervision and node view) against
 * a list/watch server on loopback (test/helpers/kube-api-server.ts); and what
 * it loads of the client library.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';
import { parseServiceProxyName } from '../../src/options.js';
import { createKubeSource, loadKubeConfig, serviceLabelSelector, type KubeSourceOptions } from '../../src/sources/kube.js';
import { stateText, type State } from '../../src/state.js';
import { makeCerts, opensslMissing } from '../helpers/certs.js';
import { tempDir } from '../helpers/files.js';
import { KubeApiServer, type KObject } from '../helpers/kube-api-server.js';
import { blogJsonl, blogView } from '../helpers/fixtures.js';
import { blogObjects, node, service, slice } from '../helpers/kube-objects.js';
import { captureLog, recordingSink, type RecordingSink } from '../helpers/sink.js';
import { within } from '../helpers/wait.js';

interface Line {
  Service: { Namespace: string; Name: string; [k: string]: unknown };
  Endpoints: Array<{ IPs?: { V4?: string[]; V6?: string[] }; Local?: boolean; Scopes?: { Internal?: boolean; External?: boolean }; [k: string]: unknown }> | null;
}

const lines = (s: State): Line[] =>
  stateText(s)
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as Line);

const names = (s: State): string[] => lines(s).map((l) => `${l.Service.Namespace}/${l.Service.Name}`);

/** `ip[:L][:I][:E]` per endpoint of service `name` (L = Local, I/E = scopes). */
function eps(s: State, name: string): string[] {
  const line = lines(s).find((l) => l.Service.Name === name);
  if (!line) return ['(no service)'];
  return (line.Endpoints ?? [])
    .map((e) => [...(e.IPs?.V4 ?? []), ...(e.IPs?.V6 ?? [])].join(',') + (e.Local ? ':L' : '') + (e.Scopes?.Internal ? ':I' : '') + (e.Scopes?.External ? ':E' : ''))
    .sort();
}

/** Resolves with the first pushed state (past or future) for which `pred` holds on the newest state. */
async function until(sink: RecordingSink, pred: (s: State) => boolean, what = 'a matching state'): Promise<State> {
  for (let n = Math.max(1, sink.states.length); ; n++) {
    const s = await within(sink.waitForStates(n), `waiting for ${what}`);
    if (n === sink.states.length && pred(s)) return s;
  }
}

/** Resolves once `n` watches are open. */
async function watching(srv: KubeApiServer, n = 3): Promise<void> {
  if (srv.watchCount() < n) await within(srv.waitForRequest(() => srv.watchCount() >= n), `${n} watches`);
}

interface Setup {
  srv: KubeApiServer;
  sink: RecordingSink;
  log: ReturnType<typeof captureLog>;
  done: Promise<void>;
}

async function setup(
  t: Test,
  o: { objects?: Array<['services' | 'endpointslices' | 'nodes', KObject]>; srv?: KubeApiServer; listen?: boolean; kubeconfig?: string } & Partial<KubeSourceOptions> = {},
): Promise<Setup> {
  const srv = o.srv ?? new KubeApiServer();
  for (const [r, obj] of o.objects ?? []) srv.add(r, obj);
  if (o.listen !== false) await srv.listen();
  const { kubeConfig } = loadKubeConfig({ kubeconfig: o.kubeconfig ?? srv.writeKubeconfig(), env: {} });
  const sink = recordingSink();
  const log = captureLog();
  const ac = new AbortController();
  const source = createKubeSource({
    kubeConfig,
    nodeName: o.nodeName ?? 'node-a',
    serviceProxyName: o.serviceProxyName,
    logger: log.logger,
    backoff: { minMs: 20, maxMs: 200 },
    watchTimeoutSeconds: o.watchTimeoutSeconds,
    once: o.once,
    now: o.now,
  });
  const done = source.run(sink, ac.signal);
  t.teardown(async () => {
    ac.abort();
    await done;
    await srv.close();
  });
  return { srv, sink, log, done };
}

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

t.test('a dropped watch resumes from its resourceVersion; the state never empties', async (t) => {
  const { srv, sink, log } = await setup(t, { objects: [['services', service('web')], ['endpointslices', slice('web-a', 'web', [{ ip: '10.4.0.1' }])]] });
  await within(sink.waitForStates(1), 'first');
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'connected');
  const lists = srv.requests.filter((r) => !r.watch).length;
  const rewatch = srv.waitForRequest((r) => r.watch && r.path.endsWith('/endpointslices'));
  srv.dropWatches();
  // Watches cut together share a line: "watch services, watch endpointslices...: connection ... lost".
  await within(log.waitFor(/warn: (watch [^:,]+, )*watch endpointslices\.discovery\.k8s\.io(, watch [^:,]+)*: connection to .* lost; retrying/), 'drop logged');
  await within(sink.waitForStatus((s) => !s.connected && !s.synced && s.reconnects === 0 && /lost/.test(s.error ?? '')), 'disconnected status');
  const r = await within(rewatch, 're-watch');
  t.equal(r.query.resourceVersion, '102', 'resumes from the last resourceVersion');
  srv.update('endpointslices', slice('web-a', 'web', [{ ip: '10.4.0.2' }]));
  await until(sink, (s) => eps(s, 'web')[0] === '10.4.0.2:I:E');
  t.equal(srv.requests.filter((r) => !r.watch).length, lists, 'no re-list');
  t.equal(sink.states.length, 2, 'no state pushed for the failure');
  await within(sink.waitForStatus((s) => s.connected && s.reconnects >= 1), 'reconnected status');
});

t.test('410 Gone re-lists; a re-list is never seen half-applied', async (t) => {
  const { srv, sink, log } = await setup(t, {
    objects: [
      ['services', service('web')],
      ['services', service('gone')],
      ['endpointslices', slice('web-a', 'web', [{ ip: '10.5.0.1' }, { ip: '10.5.0.2' }])],
    ],
  });
  await within(sink.waitForStates(1), 'first');
  await watching(srv);

  // While disconnected: a Service deleted, the slice replaced by an identical one
  // under another name, history compacted. The reconnect gets 410 and re-lists.
  const relist = srv.waitForRequest((r) => !r.watch && r.path.endsWith('/endpointslices'));
  srv.dropWatches();
  srv.remove('services', 'default', 'gone');
  srv.remove('endpointslices', 'default', 'web-a');
  srv.add('endpointslices', slice('web-b', 'web', [{ ip: '10.5.0.1' }, { ip: '10.5.0.2' }]));
  srv.compact();
  await within(relist, 're-list');
  await log.waitFor(/410 Gone/);
  const s = await until(sink, (s) => names(s).length === 1);
  t.same(eps(s, 'web'), ['10.5.0.1:I:E', '10.5.0.2:I:E']);
  // A marker change, to be sure every effect of the re-list was pushed before it.
  srv.add('services', service('marker'));
  await until(sink, (s) => names(s).includes('default/marker'));
  for (const st of sink.states) t.not(eps(st, 'web').length, 0, 'web always has its endpoints');

  // 410 as an ERROR event on an open watch, and as an HTTP status.
  const relist2 = srv.waitForRequest((r) => !r.watch && r.path === '/api/v1/services');
  srv.expireWatches('services');
  await within(relist2, 're-list after ERROR 410');
  srv.expiredAsHttpStatus = true;
  const relist3 = srv.waitForRequest((r) => !r.watch && r.path.endsWith('/endpointslices'));
  srv.dropWatches('endpointslices');
  srv.update('endpointslices', slice('web-b', 'web', [{ ip: '10.5.0.3' }]));
  srv.compact();
  await within(relist3, 're-list after HTTP 410');
  t.same(eps(await until(sink, (s) => eps(s, 'web').length === 1), 'web'), ['10.5.0.3:I:E']);
});

t.test('API down at start: one line per attempt, repeats once a minute; nothing pushed before every list completed', async (t) => {
  const srv = new KubeApiServer();
  const { port, kubeconfig } = await srv.startDown();
  srv.add('services', service('web'));
  srv.add('endpointslices', slice('web-a', 'web', [{ ip: '10.6.0.1' }]));
  let clock = 1_000_000;
  const { sink, log } = await setup(t, { srv, listen: false, kubeconfig, now: () => clock });
  // Retried with backoff (20, 40, 80 ms... each ±20%) until the server is back:
  // 64..96 ms is the third attempt's delay, and no other's.
  await within(log.waitFor(/; retrying in (6[4-9]|[78]\d|9[0-6])ms /), 'third attempt');
  // One line per attempt naming the three lists (not one per resource): the
  // first an error, the same failure again at debug level.
  const unreachable = 'cannot reach the Kubernetes API server http://127.0.0.1:PORT: connection refused (ECONNREFUSED; list services, list endpointslices.discovery.k8s.io, list nodes)';
  const attempts = (): string[] => log.matching(/cannot reach/).map((l) => l.replace(/127\.0\.0\.1:\d+/, '127.0.0.1:PORT'));
  const first3 = attempts().slice(0, 3);
  t.same(
    first3.map((l) => l.replace(/retrying in \d+ms/, 'retrying in Nms')),
    [
      `kpng-callout error: ${unreachable}; retrying in Nms waiting="initial list"`,
      `kpng-callout debug: ${unreachable}; retrying in Nms waiting="initial list"`,
      `kpng-callout debug: ${unreachable}; retrying in Nms waiting="initial list"`,
    ],
  );
  first3.forEach((l, i) => {
    const delay = Number(/retrying in (\d+)ms/.exec(l)?.[1]);
    const base = 20 * 2 ** i;
    t.ok(delay >= base * 0.8 && delay <= base * 1.2, `attempt ${i + 1}: ${delay}ms is ${base}ms ±20%`);
  });
  // A minute later the same failure is an error again, with how often it repeated meanwhile.
  clock += 60_000;
  const again = await within(log.waitFor(/error: cannot reach .* repeated=\d+$/), 'the repeat a minute later');
  const before = log.lines.slice(0, log.lines.indexOf(again));
  const quiet = before.filter((l) => /^kpng-callout debug: cannot reach/.test(l)).length;
  t.ok(quiet >= 2);
  t.match(again, new RegExp(`; retrying in \\d+ms waiting="initial list" repeated=${quiet}$`), 'counts the attempts logged at debug level');
  t.equal(attempts().filter((l) => l.startsWith('kpng-callout error:')).length, 2, 'two errors in all');
  t.equal(sink.states.length, 0, 'nothing before the lists');
  t.ok(sink.statuses.every((s) => !s.synced));
  // Only services can be listed: still nothing (no partial first state).
  srv.forbid('endpointslices', 'list');
  // Waited on from before the server is back: the watch may come before the 403 line.
  const servicesWatched = srv.waitForRequest((r) => r.path === '/api/v1/services' && r.watch);
  await srv.listen(port);
  await within(log.waitFor(/list endpointslices\.discovery\.k8s\.io: 403 Forbidden/), '403 logged');
  await within(servicesWatched, 'services watched');
  t.equal(sink.states.length, 0, 'nothing while a list is missing');
  srv.allow('endpointslices', 'list');
  const s = await within(sink.waitForStates(1), 'first state');
  t.same(eps(s, 'web'), ['10.6.0.1:I:E'], 'the first state is complete');
});

t.test('403 and 401 name the verb, the resource and what to grant', async (t) => {
  const srv = new KubeApiServer();
  srv.forbid('services', 'watch');
  srv.forbid('nodes', 'list');
  const { log, sink } = await setup(t, { srv });
  const line = await within(log.waitFor(/list nodes: 403/), 'nodes 403');
  t.match(line, /RBAC does not allow verb "list" on resource "nodes" in API group ""/);
  t.match(line, /ClusterRole needs get, list and watch on nodes/);
  t.match(line, /User \\?"system:serviceaccount:kube-system:kpng-callout\\?" cannot list resource/);
  srv.allow('nodes', 'list');
  const w = await within(log.waitFor(/watch services: 403/), 'services watch 403');
  t.match(w, /verb "watch" on resource "services"/);
  srv.allow('services', 'watch');
  await within(sink.waitForStates(1), 'state once allowed');

  const locked = new KubeApiServer({ token: 'sekret' });
  const bad = await setup(t, { srv: locked });
  t.match(await within(bad.log.waitFor(/401 Unauthorized/), '401'), /rejected the credentials/);
  t.equal(bad.sink.states.length, 0);
});

t.test('kubeconfig from a file with a bearer token', async (t) => {
  const srv = new KubeApiServer({ token: 'sekret' });
  await srv.listen();
  const { sink } = await setup(t, { srv, listen: false, kubeconfig: srv.writeKubeconfig({ token: 'sekret' }), objects: [['services', service('web')]] });
  t.same(names(await within(sink.waitForStates(1), 'state')), ['default/web']);
  t.ok(srv.requests.every((r) => r.status === 200));
});

t.test('bookmarks move the resume point; a server-ended watch resumes without a list', async (t) => {
  const { srv, sink, log } = await setup(t, { objects: [['services', service('web')]], watchTimeoutSeconds: 300 });
  await within(sink.waitForStates(1), 'first');
  await watching(srv);
  t.equal(srv.requests.find((r) => r.watch)?.query.timeoutSeconds, '300');
  srv.add('nodes', node('elsewhere'));
  srv.add('nodes', node('elsewhere-2'));
  const rv = srv.resourceVersion;
  srv.bookmark();
  const lists = srv.requests.filter((r) => !r.watch).length;
  const rewatch = srv.waitForRequest((r) => r.watch && r.path === '/api/v1/services');
  srv.endWatches('services');
  t.equal((await within(rewatch, 're-watch')).query.resourceVersion, rv, 'from the bookmark');
  t.equal(srv.requests.filter((r) => !r.watch).length, lists, 'no list');
  t.equal(log.matching(/^kpng-callout error/).length, 0, 'a clean end is not an error');
});

t.test('a silent watch past its timeout is restarted', async (t) => {
  const srv = new KubeApiServer();
  srv.ignoreWatchTimeout = true;
  const { sink, log } = await setup(t, { srv, objects: [['services', service('web')]], watchTimeoutSeconds: 1 });
  await within(sink.waitForStates(1), 'first');
  // The three watches go silent together: one line may name them all.
  await within(log.waitFor(/warn: (watch [^:,]+, )*watch services(, watch [^:,]+)*: no event for longer than the watch timeout; retrying in/), 'stall detected', 6000);
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

t.test('only the light modules of the client library are imported statically (the full library is ~0.5 s and ~70 MB)', async (t) => {
  const src = resolve(dirname(fileURLToPath(import.meta.url)), '../../src');
  const bare = new Set<string>();
  const seen = new Set<string>();
  const walk = (file: string): void => {
    if (seen.has(file)) return;
    seen.add(file);
    const text = readFileSync(file, 'utf8');
    // Static value imports and re-exports (`import type` is erased; `import(...)` is dynamic).
    for (const m of text.matchAll(/^(?:import|export)\s+(?!type\s)[^;]*?\sfrom\s+'([^']+)'/gms)) {
      const spec = m[1]!;
      if (spec.startsWith('.')) walk(join(dirname(file), spec.replace(/\.js$/, '.ts')));
      else bare.add(spec);
    }
  };
  walk(join(src, 'sources/kube.ts'));
  walk(join(src, 'sources/kube/config.ts'));
  t.same(
    [...bare].filter((s) => s.startsWith('@kubernetes/')).sort(),
    ['@kubernetes/client-node/dist/config_types.js', '@kubernetes/client-node/dist/exec_auth.js', '@kubernetes/client-node/dist/file_auth.js'],
  );
  t.ok(seen.has(join(src, 'sources/kube/list-watch.ts')), 'the walk followed the source');
});

t.test('in-cluster: the service account token and CA, over TLS', { skip: opensslMissing() ?? false }, async (t) => {
  const certs = makeCerts(t);
  const srv = new KubeApiServer({ token: 'sa-token', tls: { key: certs.serverKey, cert: certs.serverCert } });
  srv.add('services', service('web'));
  await srv.listen();
  t.teardown(() => srv.close());
  const sa = tempDir(t, 'kube-in-cluster-');
  writeFileSync(join(sa, 'token'), 'sa-token');
  writeFileSync(join(sa, 'ca.crt'), certs.ca);
  const { kubeConfig, from } = loadKubeConfig({ env: { KUBERNETES_SERVICE_HOST: '127.0.0.1', KUBERNETES_SERVICE_PORT: String(srv.port) }, serviceAccountDir: sa });
  t.equal(from, 'in-cluster service account');
  const sink = recordingSink();
  const ac = new AbortController();
  const done = createKubeSource({ kubeConfig, nodeName: 'node-a', once: true }).run(sink, ac.signal);
  t.teardown(() => ac.abort());
  await within(done, 'the first state');
  t.same(names(sink.states[0]!), ['default/web']);
  t.ok(srv.requests.every((r) => r.status === 200));
});

t.test('a --node-name with no Node in the API is warned about once the lists are complete', async (t) => {
  const missing = await setup(t, { objects: [...blogObjects(), ['nodes', node(blogView.nodeName, 'z1')]], serviceProxyName: blogView.serviceProxyName, nodeName: 'vm-typo' });
  await within(missing.sink.waitForStates(1), 'first state');
  t.equal(missing.log.matching(/warn: node vm-typo: no such Node in the API: .*--node-name/).length, 1, 'warned once');

  const found = await setup(t, { objects: [...blogObjects(), ['nodes', node(blogView.nodeName, 'z1')]], ...blogView });
  await within(found.sink.waitForStates(1), 'first state');
  t.same(found.log.matching(/no such Node/), [], 'no warning for a Node that exists');
});

t.test('a re-list that changes nothing publishes no state, yet tells the sink it worked (memory is given back)', async (t) => {
  const { sink, srv } = await setup(t, { objects: [['services', service('web')], ['endpointslices', slice('web-a', 'web', [{ ip: '10.9.0.1' }])], ['nodes', node('node-a')]] });
  await within(sink.waitForStates(1), 'first state');
  await watching(srv);
  let worked = 0;
  (sink as { worked?: () => void }).worked = () => worked++;
  const relist = srv.waitForRequest((r) => !r.watch && r.path === '/api/v1/services');
  srv.expireWatches('services');
  await within(relist, 're-list after ERROR 410');
  await watching(srv);
  t.equal(sink.states.length, 1, 'no new state: nothing changed');
  t.ok(worked >= 1, 'the re-list was reported');
});
