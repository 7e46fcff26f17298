/**
 * One informer (src/sources/kube/informer.ts) under a real supervisor,
 * against the list/watch server on loopback: what it asks the server, what
 * it hands over, and how its failures are worded.
 */
import { EventEmitter, once } from 'node:events';
import { CoreV1Api, type V1Service } from '@kubernetes/client-node';
import t, { type Test } from 'tap';
import { loadKubeConfig } from '../../../src/sources/kube/config.js';
import { addInformer } from '../../../src/sources/kube/informer.js';
import { ListWatchSupervisor } from '../../../src/sources/kube/supervisor.js';
import { KubeApiServer } from '../../helpers/kube-api-server.js';
import { service } from '../../helpers/kube-objects.js';
import { captureLog, recordingSink } from '../../helpers/sink.js';
import { within } from '../../helpers/wait.js';

const SELECTOR = '!service.kubernetes.io/headless';

/**
 * A services informer for `srv` (started listening here), started. `seen`
 * records what it hands over (`+ns/name`, `-ns/name`); `seenAt(n)` resolves
 * once it holds `n` entries.
 */
async function servicesInformer(t: Test, srv: KubeApiServer, o: { timeoutSeconds?: number } = {}) {
  await srv.listen();
  const { kubeConfig } = loadKubeConfig({ kubeconfig: srv.writeKubeconfig(), env: {} });
  const log = captureLog();
  const sink = recordingSink();
  const supervisor = new ListWatchSupervisor({ server: srv.url, backoff: { minMs: 10, maxMs: 40 }, logger: log.logger, onStatus: (s) => sink.status?.(s) });
  const seen: string[] = [];
  const ee = new EventEmitter();
  const core = kubeConfig.makeApiClient(CoreV1Api);
  addInformer<V1Service>({
    kubeConfig,
    resource: 'services',
    group: '',
    path: '/api/v1/services',
    labelSelector: SELECTOR,
    list: () => core.listServiceForAllNamespaces({ labelSelector: SELECTOR }),
    timeoutSeconds: () => o.timeoutSeconds ?? 300,
    supervisor,
    server: srv.url,
    logger: log.logger,
    onObject: (obj, deleted) => {
      seen.push(`${deleted ? '-' : '+'}${obj.metadata?.namespace}/${obj.metadata?.name}`);
      ee.emit('seen');
    },
  });
  supervisor.start();
  t.teardown(async () => {
    supervisor.stop();
    await srv.close();
  });
  const seenAt = async (n: number): Promise<string[]> => {
    while (seen.length < n) await within(once(ee, 'seen'), `${n} objects handed over (have ${seen.join(' ')})`);
    return seen;
  };
  return { supervisor, log, sink, seen, seenAt };
}

t.test('lists with its selector, then watches from the list with bookmarks and a timeout; hands every change over', async (t) => {
  const srv = new KubeApiServer();
  srv.add('services', service('web'), service('api'));
  const watched = srv.waitForRequest((r) => r.watch);
  const { sink, log, seenAt } = await servicesInformer(t, srv, { timeoutSeconds: 123 });
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  t.same([...(await seenAt(2))].sort(), ['+default/api', '+default/web']);
  t.equal(srv.requests.find((r) => !r.watch)?.query.labelSelector, SELECTOR);
  const w = await within(watched, 'the watch');
  t.same([w.query.labelSelector, w.query.allowWatchBookmarks, w.query.timeoutSeconds, w.query.resourceVersion], [SELECTOR, 'true', '123', '102']);
  t.ok(await log.waitFor(/debug: services: initial list complete items=2$/));
  srv.remove('services', 'default', 'api');
  srv.update('services', service('web', { port: 81 }));
  t.same((await seenAt(4)).slice(2), ['-default/api', '+default/web']);
});

t.test('a list failure is worded as the list, a watch failure as the watch; both restarted', async (t) => {
  const srv = new KubeApiServer();
  srv.forbid('services', 'list');
  const { sink, log } = await servicesInformer(t, srv);
  t.match(await within(log.waitFor(/list services: 403/), 'list 403'), /^kpng-callout error: list services: 403 Forbidden: RBAC does not allow verb "list" on resource "services" in API group ""/);
  srv.forbid('services', 'watch');
  srv.allow('services', 'list');
  t.match(await within(log.waitFor(/watch services: 403/), 'watch 403'), /verb "watch" on resource "services"/);
  t.equal(sink.statuses.some((s) => s.synced), true, 'the list succeeded meanwhile');
  srv.allow('services', 'watch');
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'connected');
  t.ok(await within(log.waitFor(/^kpng-callout info: services: connected again after \d+ failed attempt\(s\)$/), 'back'));
});

t.test('410 Gone: said, and listed again', async (t) => {
  const srv = new KubeApiServer();
  srv.add('services', service('web'));
  const { sink, log, seenAt } = await servicesInformer(t, srv);
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  if (srv.watchCount() === 0) await within(srv.waitForRequest((r) => r.watch), 'watching');
  const relist = srv.waitForRequest((r) => !r.watch);
  srv.expireWatches('services');
  await within(relist, 're-list');
  t.ok(await within(log.waitFor(/^kpng-callout info: watch services: resourceVersion expired \(410 Gone\); listing again$/), 'said'));
  srv.add('services', service('api'));
  t.same(await seenAt(2), ['+default/web', '+default/api'], 'watching again after the re-list');
});

t.test('stop ends the watch', async (t) => {
  const srv = new KubeApiServer();
  const { sink, supervisor } = await servicesInformer(t, srv);
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  if (srv.watchCount() === 0) await within(srv.waitForRequest((r) => r.watch), 'watching');
  t.equal(srv.watchCount(), 1);
  supervisor.stop();
  await within(srv.waitForWatchCount(0), 'watch closed');
});

t.test('a watch silent past its timeout is aborted by the watchdog and restarted', async (t) => {
  const srv = new KubeApiServer();
  srv.ignoreWatchTimeout = true;
  const { log } = await servicesInformer(t, srv, { timeoutSeconds: 1 });
  const rv = srv.resourceVersion;
  // Silent for 1 s plus 1 s of grace.
  const line = await within(log.waitFor(/no event for longer/), 'stall detected', 6000);
  t.match(line, /^kpng-callout warn: watch services: no event for longer than the watch timeout; retrying in \d+ms$/);
  const rewatch = srv.waitForRequest((r) => r.watch);
  t.equal((await within(rewatch, 're-watch')).query.resourceVersion, rv, 'resumes from where it was');
  t.equal(srv.requests.filter((r) => !r.watch).length, 1, 'without a list');
});
