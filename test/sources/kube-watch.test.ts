/**
 * The kube source's lists and watches against a list/watch server on
 * loopback (test/helpers/kube-api-server.ts): a dropped watch, 410 Gone,
 * the API down at start, 403 and 401, a kubeconfig with a token, bookmarks,
 * a silent watch, in-cluster TLS, a re-list that changes nothing; and which
 * modules of the client library it loads. The state it builds:
 * kube.test.ts.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { createKubeSource, loadKubeConfig } from '../../src/sources/kube.js';
import { makeCerts, opensslMissing } from '../helpers/certs.js';
import { tempDir } from '../helpers/files.js';
import { KubeApiServer } from '../helpers/kube-api-server.js';
import { node, service, slice } from '../helpers/kube-objects.js';
import { eps, names, setup, until, watching } from '../helpers/kube-source.js';
import { recordingSink } from '../helpers/sink.js';
import { within } from '../helpers/wait.js';

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
