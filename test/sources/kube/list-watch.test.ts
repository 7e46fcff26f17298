/**
 * One list/watch loop (src/sources/kube/list-watch.ts) under a real
 * supervisor, against the list/watch server on loopback: what it asks the
 * server (pages, resume points), what it hands over and when, and how its
 * failures are worded.
 */
import { EventEmitter, once } from 'node:events';
import t, { type Test } from 'tap';
import { credentialsFor } from '../../../src/sources/kube/auth.js';
import { loadKubeConfig } from '../../../src/sources/kube/config.js';
import { ApiClient } from '../../../src/sources/kube/http.js';
import { addListWatch, type ApiObject } from '../../../src/sources/kube/list-watch.js';
import { continueToken } from '../../../src/sources/kube/list-page.js';
import { ListWatchSupervisor } from '../../../src/sources/kube/supervisor.js';
import { fullGc } from '../../../src/memory.js';
import { KubeApiServer } from '../../helpers/kube-api-server.js';
import { service } from '../../helpers/kube-objects.js';
import { captureLog, recordingSink } from '../../helpers/sink.js';
import { pollUntil, within } from '../../helpers/wait.js';

const SELECTOR = '!service.kubernetes.io/headless';

/**
 * A services loop for `srv` (started listening here), started. `seen`
 * records what it hands over (`+ns/name`, `-ns/name`); `ticks` the same, one
 * array per tick of the event loop; `seenAt(n)` resolves once it holds `n`
 * entries.
 */
async function servicesLoop(t: Test, srv: KubeApiServer, o: { timeoutSeconds?: number; pageSize?: number; stage?: (obj: ApiObject) => ApiObject } = {}) {
  await srv.listen();
  const { kubeConfig } = loadKubeConfig({ kubeconfig: srv.writeKubeconfig(), env: {} });
  const client = new ApiClient({ server: srv.url, credentials: credentialsFor(kubeConfig) });
  const log = captureLog();
  const sink = recordingSink();
  const supervisor = new ListWatchSupervisor({ server: srv.url, backoff: { minMs: 10, maxMs: 40 }, logger: log.logger, onStatus: (s) => sink.status?.(s) });
  const seen: string[] = [];
  const ticks: string[][] = [];
  let tick: string[] | undefined;
  const ee = new EventEmitter();
  const handOver = (obj: ApiObject, deleted: boolean): void => {
    const what = `${deleted ? '-' : '+'}${obj.metadata?.namespace}/${obj.metadata?.name}`;
    seen.push(what);
    if (!tick) {
      ticks.push((tick = []));
      setImmediate(() => (tick = undefined));
    }
    tick.push(what);
    ee.emit('seen');
  };
  // With `o.stage`: a re-list keeps what it returns, handed over once the list is complete.
  const keep = o.stage;
  const stage = keep
    ? (obj: ApiObject) => {
        const kept = keep(obj);
        return () => handOver(kept, false);
      }
    : undefined;
  const loop = addListWatch({
    resource: 'services',
    group: '',
    path: '/api/v1/services',
    labelSelector: SELECTOR,
    client,
    pageSize: o.pageSize,
    timeoutSeconds: () => o.timeoutSeconds ?? 300,
    supervisor,
    server: srv.url,
    logger: log.logger,
    onObject: handOver,
    stage,
  });
  supervisor.start();
  t.teardown(async () => {
    supervisor.stop();
    client.close();
    await srv.close();
  });
  const seenAt = async (n: number): Promise<string[]> => {
    while (seen.length < n) await within(once(ee, 'seen'), `${n} objects handed over (have ${seen.join(' ')})`);
    return seen;
  };
  const watching = async (): Promise<void> => {
    if (srv.watchCount() === 0) await within(srv.waitForRequest((r) => r.watch), 'watching');
  };
  return { supervisor, loop, log, sink, seen, ticks, seenAt, watching };
}

const names = (...n: string[]) => n.map((x) => service(x));

t.test('lists in pages with its selector, then watches from the list with bookmarks and a timeout; hands every change over', async (t) => {
  const srv = new KubeApiServer();
  srv.add('services', ...names('a', 'b', 'c', 'd', 'e'));
  const watched = srv.waitForRequest((r) => r.watch);
  const { sink, log, seenAt, loop } = await servicesLoop(t, srv, { timeoutSeconds: 123, pageSize: 2 });
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  t.same(await seenAt(5), ['+default/a', '+default/b', '+default/c', '+default/d', '+default/e']);
  const lists = srv.requests.filter((r) => !r.watch);
  t.same(
    lists.map((r) => [r.query.labelSelector, r.query.limit, r.query.continue]),
    [
      [SELECTOR, '2', undefined],
      [SELECTOR, '2', lists[1]?.query.continue],
      [SELECTOR, '2', lists[2]?.query.continue],
    ],
    'three pages of two, each with the continue token of the one before',
  );
  t.ok(lists[1]?.query.continue && lists[2]?.query.continue !== lists[1]?.query.continue);
  const w = await within(watched, 'the watch');
  t.same([w.query.watch, w.query.labelSelector, w.query.allowWatchBookmarks, w.query.timeoutSeconds, w.query.resourceVersion], ['1', SELECTOR, 'true', '123', '105']);
  t.ok(await log.waitFor(/debug: services: initial list complete items=5$/));
  t.equal(loop.size, 5);
  srv.remove('services', 'default', 'a');
  srv.update('services', service('b', { port: 81 }));
  t.same((await seenAt(7)).slice(5), ['-default/a', '+default/b']);
  t.equal(loop.size, 4);
});

t.test('a server that ignores `limit`, indents its JSON and writes it in small pieces: every object, read as it comes; one that puts an array in the metadata after the items: read again whole, once', async (t) => {
  const srv = new KubeApiServer();
  srv.add('services', ...names('a', 'b', 'c', 'd', 'e'));
  srv.listQuirks = { ignoreLimit: true, indented: true, pieceBytes: 37 };
  const { sink, log, seenAt } = await servicesLoop(t, srv, { pageSize: 2 });
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  t.same(await seenAt(5), ['+default/a', '+default/b', '+default/c', '+default/d', '+default/e']);
  t.equal(srv.requests.filter((r) => !r.watch).length, 1, 'one list request: the whole list in one body');
  t.same(log.matching(/pages read whole/), []);

  const srv2 = new KubeApiServer();
  srv2.add('services', ...names('a', 'b'));
  srv2.listQuirks = { metadataLast: true, pieceBytes: 16 };
  const two = await servicesLoop(t, srv2);
  await within(two.sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  t.same((await two.seenAt(2)).slice(-2), ['+default/a', '+default/b']);
  t.equal(srv2.requests.filter((r) => !r.watch).length, 2, 'listed again, once');
  t.match(two.log.matching(/pages read whole/), [/debug: list services: a page could not be read item by item \(pages read whole from now on\); listing again from the start$/]);
});

t.test('a continue token that expired: listed again from the start, once, and said', async (t) => {
  const srv = new KubeApiServer();
  srv.add('services', ...names('a', 'b', 'c'));
  // Expire the tokens as soon as the first page is served.
  const off = srv.onRequest((r) => {
    if (!r.watch && !r.query.continue) {
      off();
      srv.expireContinueTokens();
    }
  });
  const { sink, log, seenAt } = await servicesLoop(t, srv, { pageSize: 2 });
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  t.ok(await log.waitFor(/^kpng-callout info: list services: continue token expired \(410 Gone\); listing again from the start$/));
  t.same([...(await seenAt(3))].sort(), ['+default/a', '+default/b', '+default/c'], 'each object once: a page already handed over is not handed over again');
  t.same(
    srv.requests.filter((r) => !r.watch).map((r) => [r.status, r.query.continue === undefined]),
    [
      [200, true],
      [410, false],
      [200, true],
      [200, false],
    ],
  );
});

t.test('a list failure is worded as the list, a watch failure as the watch; both restarted', async (t) => {
  const srv = new KubeApiServer();
  srv.forbid('services', 'list');
  const { sink, log } = await servicesLoop(t, srv);
  t.match(await within(log.waitFor(/list services: 403/), 'list 403'), /^kpng-callout error: list services: 403 Forbidden: RBAC does not allow verb "list" on resource "services" in API group ""/);
  srv.forbid('services', 'watch');
  srv.allow('services', 'list');
  t.match(await within(log.waitFor(/watch services: 403/), 'watch 403'), /verb "watch" on resource "services"/);
  t.equal(sink.statuses.some((s) => s.synced), true, 'the list succeeded meanwhile');
  srv.allow('services', 'watch');
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'connected');
  t.ok(await within(log.waitFor(/^kpng-callout info: services: connected again after \d+ failed attempt\(s\)$/), 'back'));
});

t.test('410 Gone (ERROR event, then HTTP status): listed again; the changes in one tick, the objects gone handed over as deleted', async (t) => {
  const srv = new KubeApiServer();
  srv.add('services', ...names('keep', 'change', 'gone'));
  const { sink, log, seenAt, ticks, watching } = await servicesLoop(t, srv, { pageSize: 1 });
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  await seenAt(3);
  await watching();
  // While the watch is cut: changes, then history compacted; the reconnect gets an ERROR 410.
  srv.dropWatches();
  srv.update('services', service('change', { port: 81 }));
  srv.remove('services', 'default', 'gone');
  srv.add('services', service('new'));
  srv.compact();
  const relist = srv.waitForRequest((r) => !r.watch);
  await within(relist, 're-list');
  await within(log.waitFor(/^kpng-callout info: watch services: resourceVersion expired \(410 Gone\); listing again$/), 'said');
  const after = await seenAt(6);
  t.same(after.slice(3), ['+default/change', '+default/new', '-default/gone'], 'unchanged objects are not handed over again');
  t.same(ticks.at(-1), ['+default/change', '+default/new', '-default/gone'], 'a re-list of four pages is handed over in one tick');

  // As an HTTP status on the watch request.
  srv.expiredAsHttpStatus = true;
  await watching();
  srv.dropWatches();
  srv.remove('services', 'default', 'keep');
  srv.compact();
  t.same((await seenAt(7)).slice(6), ['-default/keep']);
  srv.add('services', service('later'));
  t.same((await seenAt(8)).slice(7), ['+default/later'], 'watching again after the re-list');
});

t.test('a re-list stages each changed object as it is read (`stage`), keeps only what that returns, and applies them all in one tick once complete', async (t) => {
  const gc = fullGc();
  t.ok(gc, 'a garbage collector to call');
  if (!gc) return;
  const srv = new KubeApiServer();
  srv.add('services', ...names('keep', 'change', 'gone'));
  const staged: string[] = [];
  // Per object staged: how many of the objects staged before it are still alive (after a full collection).
  const alive: number[] = [];
  const refs: Array<WeakRef<ApiObject>> = [];
  const stage = (obj: ApiObject): ApiObject => {
    gc();
    alive.push(refs.filter((r) => r.deref() !== undefined).length);
    refs.push(new WeakRef(obj));
    staged.push(`${obj.metadata?.namespace}/${obj.metadata?.name}`);
    return { metadata: { namespace: obj.metadata?.namespace ?? null, name: obj.metadata?.name ?? null } };
  };
  const { sink, seen, seenAt, ticks, watching } = await servicesLoop(t, srv, { pageSize: 1, stage });
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  t.same([...(await seenAt(3))].sort(), ['+default/change', '+default/gone', '+default/keep'], 'the first list is handed over as it comes');
  t.same(staged, [], 'nothing staged');
  await watching();
  srv.dropWatches();
  srv.update('services', service('change', { port: 81 }));
  srv.remove('services', 'default', 'gone');
  srv.add('services', service('new'));
  srv.add('services', service('newer'));
  srv.compact();
  const after = await seenAt(7);
  t.same(staged, ['default/change', 'default/new', 'default/newer'], 'the changed and new objects were staged (one per page), the unchanged not');
  t.same(alive, [0, 0, 0], 'the parsed objects staged before are not kept');
  t.same(after.slice(3), ['+default/change', '+default/new', '+default/newer', '-default/gone'], 'what was staged applied, then the deletions');
  t.same(ticks.at(-1), ['+default/change', '+default/new', '+default/newer', '-default/gone'], 'in one tick');
  await watching();
  srv.update('services', service('keep', { port: 82 }));
  t.same((await seenAt(8)).slice(7), ['+default/keep'], 'watch events are handed over as before');
  t.equal(staged.length, 3, 'not staged');
  const relist = srv.waitForRequest((r) => !r.watch);
  srv.expireWatches('services');
  await within(relist, 'another re-list');
  await watching();
  t.equal(staged.length, 3, 'a re-list that changed nothing staged nothing');
  t.equal(seen.length, 8, 'and handed nothing over');
});

t.test('watches that expire (410) at once, again and again: a failure after three, retried with the backoff, not a tight loop', async (t) => {
  const srv = new KubeApiServer();
  srv.add('services', service('web'));
  const { sink, log, watching } = await servicesLoop(t, srv);
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  await watching();
  srv.expireWatchesAtOnce = true;
  srv.dropWatches();
  const failed = await within(log.waitFor(/fresh lists in a row expired/), 'a failure');
  t.match(failed, /^kpng-callout error: watch services: the resourceVersion of 3 fresh lists in a row expired at once \(410 Gone\); retrying in \d+ms$/);
  // The backoff grows from failure to failure, although each list in between succeeds (10, 20, 40 ms +-20%).
  await pollUntil(() => log.matching(/fresh lists in a row expired/).length >= 3, 'three failures', 10_000);
  const delays = log.matching(/fresh lists in a row expired/).map((l) => Number(/retrying in (\d+)ms/.exec(l)?.[1]));
  t.ok(delays[1]! > delays[0]! && delays[2]! > delays[1]!, `the delays grow: ${delays.join(', ')}`);
  srv.expireWatchesAtOnce = false;
  t.ok(await within(log.waitFor(/services: connected again after \d+ failed attempt\(s\)/), 'back'));
});

t.test('a watch ERROR other than 410 is a failure with what the server said; the restart lists again (as client-go)', async (t) => {
  const srv = new KubeApiServer();
  srv.add('services', service('web'));
  const { sink, log, watching } = await servicesLoop(t, srv);
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  await watching();
  const relist = srv.waitForRequest((r) => !r.watch);
  srv.sendError(500, 'InternalError', 'etcd leader changed');
  t.match(await within(log.waitFor(/watch services: HTTP 500/), 'logged'), /^kpng-callout error: watch services: HTTP 500 \(server: etcd leader changed\); retrying in \d+ms$/);
  await within(relist, 'a list after the error');
});

t.test('a watch the server refuses (504 Too large resource version: it restarted with a shorter history): listed again, changes made meanwhile handed over', async (t) => {
  const srv = new KubeApiServer();
  srv.add('services', service('web'));
  const { sink, log, seen, seenAt, watching } = await servicesLoop(t, srv);
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  await watching();
  const before = seen.length;
  srv.refuseWatches = { code: 504, reason: 'Timeout', message: 'Too large resource version: 9999, current: 3' };
  const relist = srv.waitForRequest((r) => !r.watch);
  srv.dropWatches();
  t.match(await within(log.waitFor(/watch services: HTTP 504/), 'logged'), /Too large resource version/);
  srv.refuseWatches = undefined;
  srv.add('services', service('new'));
  await within(relist, 'a list after the refusal');
  t.ok((await seenAt(before + 1)).includes('+default/new'), 'the Service made meanwhile is handed over');
});

t.test('watches refused again and again (403 on watch only): each retry lists, and waits longer (the backoff grows)', async (t) => {
  const srv = new KubeApiServer();
  srv.add('services', service('web'));
  srv.refuseWatches = { code: 403, reason: 'Forbidden', message: 'services is forbidden: cannot watch' };
  const { log } = await servicesLoop(t, srv);
  await pollUntil(() => log.matching(/watch services: 403/).length >= 4, 'four refusals');
  const delays = log.matching(/watch services: 403.*retrying in \d+ms/).map((l) => Number(/retrying in (\d+)ms/.exec(l)![1]));
  t.ok(delays[0]! <= 12, `the first retry at the shortest wait (${delays[0]} ms)`);
  t.ok(delays[3]! >= 30, `the fourth retry waits longer (${delays.join(', ')} ms; backoff 10 ms doubling to 40 ms)`);
});

t.test('a dropped watch is "connection lost" (a warning) and resumes without a list', async (t) => {
  const srv = new KubeApiServer();
  srv.add('services', service('web'));
  const { sink, log, watching } = await servicesLoop(t, srv);
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  await watching();
  const rewatch = srv.waitForRequest((r) => r.watch);
  srv.dropWatches();
  t.match(await within(log.waitFor(/watch services: connection/), 'logged'), /^kpng-callout warn: watch services: connection to http:\/\/127\.0\.0\.1:\d+ lost; retrying in \d+ms$/);
  t.equal((await within(rewatch, 're-watch')).query.resourceVersion, '101');
  t.equal(srv.requests.filter((r) => !r.watch).length, 1, 'one list in all');
});

t.test('bookmarks move the resume point; a watch ended by the server resumes at once from there', async (t) => {
  const srv = new KubeApiServer();
  const { sink, log, watching } = await servicesLoop(t, srv);
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  await watching();
  srv.add('nodes', { metadata: { name: 'elsewhere' } });
  const rv = srv.resourceVersion;
  srv.bookmark();
  const rewatch = srv.waitForRequest((r) => r.watch);
  srv.endWatches();
  t.equal((await within(rewatch, 're-watch')).query.resourceVersion, rv, 'from the bookmark');
  t.equal(log.lines.filter((l) => /error|warn/.test(l)).length, 0, 'a clean end is no failure');
});

t.test('watches the server ends at once, again and again: a failure, so the backoff applies', async (t) => {
  const srv = new KubeApiServer();
  srv.endWatchesAtOnce = true;
  const { log } = await servicesLoop(t, srv);
  t.match(await within(log.waitFor(/ended 3 watches/), 'failure'), /^kpng-callout error: watch services: the API server ended 3 watches in a row at once; retrying in \d+ms$/);
});

t.test('stop ends the watch', async (t) => {
  const srv = new KubeApiServer();
  const { sink, supervisor, watching } = await servicesLoop(t, srv);
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  await watching();
  t.equal(srv.watchCount(), 1);
  supervisor.stop();
  await within(srv.waitForWatchCount(0), 'watch closed');
});

t.test('a watch silent past its timeout is aborted by the watchdog and restarted', async (t) => {
  const srv = new KubeApiServer();
  srv.ignoreWatchTimeout = true;
  const { log } = await servicesLoop(t, srv, { timeoutSeconds: 1 });
  const rv = srv.resourceVersion;
  // Silent for 1 s plus 1 s of grace.
  const line = await within(log.waitFor(/no event for longer/), 'stall detected', 6000);
  t.match(line, /^kpng-callout warn: watch services: no event for longer than the watch timeout; retrying in \d+ms$/);
  const rewatch = srv.waitForRequest((r) => r.watch);
  t.equal((await within(rewatch, 're-watch')).query.resourceVersion, rv, 'resumes from where it was');
  t.equal(srv.requests.filter((r) => !r.watch).length, 1, 'without a list');
});

t.test('the continue token is read from the head of a page, never from its items', async (t) => {
  t.equal(continueToken(Buffer.from('{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"7","continue":"eyJ2IjoxfQ","remainingItemCount":3},"items":[]}')), 'eyJ2IjoxfQ');
  t.equal(continueToken(Buffer.from('{"metadata":{"resourceVersion":"7"},"items":[{"metadata":{"annotations":{"continue":"x"}}}]}')), undefined);
  t.equal(continueToken(Buffer.from('{"items":[],"metadata":{"continue":"late"}}')), undefined, 'after the items: read once parsed');
  t.equal(continueToken(Buffer.from('{"metadata":{}}')), undefined);
});

t.test('watches cut right after they open, again and again: the backoff grows (no retry at the shortest wait for ever)', async (t) => {
  const srv = new KubeApiServer();
  srv.add('services', service('web'));
  srv.onRequest((r) => {
    if (r.watch) setTimeout(() => srv.dropWatches(), 20);
  });
  const { log } = await servicesLoop(t, srv);
  await pollUntil(() => log.matching(/watch services: connection.*retrying in/).length >= 4, 'four cut watches');
  const delays = log.matching(/watch services: connection.*retrying in \d+ms/).map((l) => Number(/retrying in (\d+)ms/.exec(l)![1]));
  t.ok(delays[0]! <= 12, `the first retry at the shortest wait (${delays[0]} ms)`);
  t.ok(delays[3]! >= 30, `the fourth retry waits longer (${delays.join(', ')} ms; backoff 10 ms doubling to 40 ms)`);
});
