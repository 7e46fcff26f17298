#!/usr/bin/env node
// A Kubernetes list/watch server for the kube source benchmark (npm run
// bench:kube; not a test helper: test/helpers/kube-api-server.ts is the one
// the tests use). Plain HTTP on 127.0.0.1, serving what
// @kubernetes/client-node requests, with every object serialised once, up
// front, so that the server costs next to nothing and the figures are the
// client's:
//
//   GET /api/v1/services                          labelSelector (=, ==, !=, key, !key)
//   GET /apis/discovery.k8s.io/v1/endpointslices
//   GET /api/v1/nodes                             fieldSelector metadata.name=...
//
// Lists honour `limit`/`continue` (a continue token pins the snapshot it
// started from; 410 once that snapshot is gone) and return the current
// resourceVersion whatever `resourceVersion` asks. `watch=true` streams stay
// open: without `resourceVersion` (or with 0) they start with ADDED for every
// object, else with what changed after it; BOOKMARKs go to watches that set
// `allowWatchBookmarks` (on command and every --bookmark-every seconds);
// `timeoutSeconds` ends a watch cleanly, as the API server does. Responses
// are never compressed.
//
// The cluster (bench/cluster.js): N Services (ClusterIP, two ports, one in
// ten with external IPs from 198.51.100.0/24 or 2001:db8::/32, one in fifty
// IPv6; one in a hundred labelled for another service proxy, so not selected;
// one in ten topology-aware), one EndpointSlice per Service with 10 endpoints
// over 100 Nodes (node-0..node-99, in zone-0..zone-2). Addresses are 10.x or
// documentation ranges: data only, never contacted.
//
// Run as a child process: node bench/kube-bench-server.js --services N
// [--per-service 10] [--nodes 100] [--bookmark-every 60] [--port 0]. It prints
// `listening on 127.0.0.1:PORT` once every body is built, then obeys lines on stdin:
//   change K        slice K (0-based Service index) gets a new address for one endpoint (MODIFIED)
//   relist          every object gets a new resourceVersion (as after a storage
//                   migration), the history is compacted, and every watch ends
//                   with an ERROR 410 Gone (a watch from an older resourceVersion
//                   gets one too): the client lists again, every object changed
//   bookmark        a BOOKMARK to every watch that allows them
//   fetch [RUNS]    time a plain client fetching the three lists (below)
//   quit
// and reports on stdout:
//   watch RESOURCE OPEN_COUNT      a watch was opened
//   event K RV HRTIME_NS WATCHERS  the MODIFIED of `change K` was written to
//                                  WATCHERS watches (HRTIME_NS from
//                                  process.hrtime.bigint(): CLOCK_MONOTONIC,
//                                  comparable across processes)
//   fetched MEDIAN_MS MIN_MS MAX_MS BYTES WALL_MEDIAN_MS
//
// "Fetch" (bench/kube-fetch.js) is the reference the kube source's first
// sync is measured against: a separate `node` process GETs the three lists
// the source lists (same selectors, concurrently, as the source does) with
// node:http and reads the bodies whole without parsing them. MEDIAN_MS is from its first request to
// its last body's end (median of RUNS, after one warm-up); WALL_MEDIAN_MS is
// that process from spawn to exit (node's start-up included).
import { createServer } from 'node:http';
import { resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { fetchTime } from './kube-fetch.js';
import { endpointSlice, node as nodeAt, nodeOf, pad, PROXY_LABEL, readyOf, service, shape as cluster, zoneOf } from './cluster.js';

/** What the kube source asks for (src/sources/kube.ts serviceLabelSelector, no --service-proxy-name). */
const SERVICE_SELECTOR = `!${PROXY_LABEL},!service.kubernetes.io/headless`;

// ---------------------------------------------------------------- the cluster

// Objects from bench/cluster.js as the API server lists them: no kind/apiVersion,
// no managedFields, no Service variants; slices move one more endpoint per version.
const serviceObject = (i, rv) => service(i, rv);
const sliceObject = (i, version, rv, perService) => endpointSlice(i, version, rv, { perService });
const nodeObject = (n, rv) => nodeAt(n, { rv });

/**
 * What `kpng-json kube --node-name node-NODE` must print for the cluster:
 * one line per selected Service, and the endpoints it sees (ready, and
 * hinted ones only for its own zone).
 */
export function expected(services, perService, node) {
  let lines = 0;
  let endpoints = 0;
  for (let i = 0; i < services; i++) {
    const c = cluster(i);
    if (!c.selected) continue;
    lines++;
    for (let j = 0; j < perService; j++) if (readyOf(i, j) && (!c.hinted || zoneOf(nodeOf(i, j)) === zoneOf(node))) endpoints++;
  }
  return { lines, endpoints };
}

/** Slices `change` may modify with an effect on node-7's state: selected, no hints. */
export const changeable = (i) => cluster(i).selected && !cluster(i).hinted;

// ---------------------------------------------------------------- selectors

/** Equality-based label selectors: `a=b`, `a==b`, `a!=b`, `a`, `!a`. */
function labelSelector(sel) {
  if (!sel) return () => true;
  const reqs = sel.split(',').map((part) => {
    const p = part.trim();
    let m;
    if ((m = /^([^!=]+?)\s*!=\s*(.*)$/.exec(p))) return (l) => l[m[1]] !== m[2];
    if ((m = /^([^!=]+?)\s*==?\s*(.*)$/.exec(p))) return (l) => l[m[1]] === m[2];
    if (p.startsWith('!')) return (l) => !(p.slice(1).trim() in l);
    return (l) => p in l;
  });
  return (item) => reqs.every((r) => r(item.labels));
}

/** `metadata.name=x`, `metadata.namespace=y` (=, ==, !=). */
function fieldSelector(sel) {
  if (!sel) return () => true;
  const reqs = sel.split(',').map((part) => {
    const m = /^([^!=]+?)\s*(!=|==|=)\s*(.*)$/.exec(part.trim());
    if (!m || (m[1] !== 'metadata.name' && m[1] !== 'metadata.namespace')) throw new Error(`unsupported field selector ${part}`);
    const get = m[1] === 'metadata.name' ? (it) => it.name : (it) => it.namespace;
    return m[2] === '!=' ? (it) => get(it) !== m[3] : (it) => get(it) === m[3];
  });
  return (item) => reqs.every((r) => r(item));
}

// ---------------------------------------------------------------- the store

const RESOURCES = {
  services: { path: '/api/v1/services', kind: 'Service', apiVersion: 'v1' },
  endpointslices: { path: '/apis/discovery.k8s.io/v1/endpointslices', kind: 'EndpointSlice', apiVersion: 'discovery.k8s.io/v1' },
  nodes: { path: '/api/v1/nodes', kind: 'Node', apiVersion: 'v1' },
};
const byPath = new Map(Object.entries(RESOURCES).map(([name, r]) => [r.path, name]));
/** Snapshots kept for `continue` tokens, per resource. */
const KEEP_SNAPSHOTS = 8;
const COMMA = Buffer.from(',');
const CLOSE = Buffer.from(']}');
/** A watch event: its resourceVersion is too old (the API server's words). */
const GONE = Buffer.from(JSON.stringify({ type: 'ERROR', object: { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: 'too old resource version', reason: 'Expired', code: 410 } }) + '\n');
const EVENT_END = Buffer.from('}\n');
/** An error answer: [code, a Status body]. */
const statusBody = (code, reason, message) => [code, Buffer.from(JSON.stringify({ kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code }))];

/** One stored object: what selectors need, and its JSON (as a list item, and as a watch event's object). */
function item(obj, info) {
  const json = Buffer.from(JSON.stringify(obj));
  // Watch events carry kind and apiVersion; list items do not.
  const head = `{"kind":"${info.kind}","apiVersion":"${info.apiVersion}",`;
  return {
    name: obj.metadata.name,
    namespace: obj.metadata.namespace,
    labels: obj.metadata.labels ?? {},
    json,
    event: (type) => Buffer.concat([Buffer.from(`{"type":"${type}","object":${head}`), json.subarray(1), EVENT_END]),
  };
}

/**
 * Starts the server in this process. Returns { port, change(i), bookmark(),
 * close() }; `onEvent(i, rv, hrtime, watchers)` observes each MODIFIED written,
 * `onWatch(resource, count)` each watch opened.
 */
export async function startKubeBenchServer({ services, perService = 10, nodes = 100, port = 0, bookmarkEverySeconds = 60, onEvent = () => {}, onWatch = () => {} }) {
  let rv = 1000;
  /** Per resource: { items: item[] in key order, rv } snapshots, newest last; changes copy the array. */
  const snapshots = {};
  /** Full-list bodies by resource + selectors (for the newest snapshot only). */
  let bodies = new Map();
  const history = []; // { rv, resource, item } of MODIFIED events
  const versions = new Uint32Array(services);
  const watchers = new Set();
  /** A watch from before this resourceVersion gets 410 Gone (`relist`). */
  let compactedRv = 0;

  const keyed = (objs, info) => objs.map((o) => item(o, info)).sort((a, b) => (`${a.namespace ?? ''}/${a.name}` < `${b.namespace ?? ''}/${b.name}` ? -1 : 1));
  const svc = [];
  const sl = [];
  for (let i = 0; i < services; i++) {
    svc.push(serviceObject(i, ++rv));
    sl.push(sliceObject(i, 0, ++rv, perService));
  }
  const nd = Array.from({ length: nodes }, (_, n) => nodeObject(n, ++rv));
  // A list's resourceVersion is the store's, whichever resource it lists.
  snapshots.services = [{ rv, items: keyed(svc, RESOURCES.services) }];
  snapshots.endpointslices = [{ rv, items: keyed(sl, RESOURCES.endpointslices) }];
  snapshots.nodes = [{ rv, items: keyed(nd, RESOURCES.nodes) }];
  /** Slice index in the (sorted) snapshot of Service i's slice. */
  const sliceIndex = new Map(snapshots.endpointslices[0].items.map((it, idx) => [it.name, idx]));
  const newest = (resource) => snapshots[resource][snapshots[resource].length - 1];

  /** The list body of `items` from `start` (at most `limit`), with a continue token when more remain. */
  function listBody(resource, snap, selected, start, limit) {
    const info = RESOURCES[resource];
    const end = limit > 0 ? Math.min(selected.length, start + limit) : selected.length;
    const more = end < selected.length;
    const meta = { resourceVersion: String(snap.rv), ...(more ? { continue: Buffer.from(JSON.stringify({ rv: snap.rv, start: end })).toString('base64url'), remainingItemCount: selected.length - end } : {}) };
    const parts = [Buffer.from(`{"kind":"${info.kind}List","apiVersion":"${info.apiVersion}","metadata":${JSON.stringify(meta)},"items":[`)];
    for (let k = start; k < end; k++) {
      if (k > start) parts.push(COMMA);
      parts.push(selected[k].json);
    }
    parts.push(CLOSE);
    return Buffer.concat(parts);
  }

  /** Parses the selectors of a request: a predicate on items, or throws (400). */
  function selectorOf(q) {
    const labels = labelSelector(q.get('labelSelector'));
    const fields = fieldSelector(q.get('fieldSelector'));
    return (it) => labels(it) && fields(it);
  }

  /** A list request's answer: [status code, body]. Whole lists of the newest snapshot are built once per selector. */
  function list(resource, q) {
    const select = selectorOf(q);
    const limit = Number(q.get('limit') ?? 0) || 0;
    let snap = newest(resource);
    let start = 0;
    if (q.get('continue')) {
      let token;
      try {
        token = JSON.parse(Buffer.from(q.get('continue'), 'base64url').toString());
      } catch {
        return statusBody(400, 'BadRequest', 'invalid continue token');
      }
      snap = snapshots[resource].find((s) => s.rv === token.rv);
      if (!snap) return statusBody(410, 'Expired', 'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.');
      start = token.start;
    }
    const whole = start === 0 && limit === 0 && snap === newest(resource);
    const cacheKey = `${resource}?${q.get('labelSelector') ?? ''}&${q.get('fieldSelector') ?? ''}`;
    let body = whole ? bodies.get(cacheKey) : undefined;
    if (!body) {
      body = listBody(resource, snap, snap.items.filter(select), start, limit);
      if (whole) bodies.set(cacheKey, body);
    }
    return [200, body];
  }

  function handle(req, res) {
    const url = new URL(req.url ?? '/', 'http://x');
    const resource = byPath.get(url.pathname);
    const q = url.searchParams;
    let answer;
    try {
      if (req.method !== 'GET' || !resource) answer = statusBody(404, 'NotFound', `the server could not find the requested resource (${url.pathname})`);
      else if (q.get('watch') === 'true' || q.get('watch') === '1') return watch(resource, q, selectorOf(q), res);
      else answer = list(resource, q);
    } catch (err) {
      answer = statusBody(400, 'BadRequest', String(err));
    }
    res.writeHead(answer[0], { 'content-type': 'application/json', 'content-length': answer[1].length });
    res.end(answer[1]);
  }

  function watch(resource, q, select, res) {
    const from = Number(q.get('resourceVersion') ?? 0) || 0;
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    res.flushHeaders();
    if (from !== 0 && from < compactedRv) return res.end(GONE);
    const w = { resource, res, select, bookmarks: q.get('allowWatchBookmarks') === 'true', timer: undefined };
    watchers.add(w);
    res.on('close', () => {
      watchers.delete(w);
      clearTimeout(w.timer);
    });
    if (from === 0) {
      const parts = [];
      for (const it of newest(resource).items) if (select(it)) parts.push(it.event('ADDED'));
      if (parts.length > 0) res.write(Buffer.concat(parts));
    } else {
      // Only slices change here; their watch has no selector.
      for (const ev of history) if (ev.resource === resource && ev.rv > from && select(ev.item)) res.write(ev.item.event('MODIFIED'));
    }
    const timeout = Number(q.get('timeoutSeconds') ?? 0);
    if (timeout > 0)
      w.timer = setTimeout(() => {
        watchers.delete(w);
        res.end();
      }, timeout * 1000);
    onWatch(resource, [...watchers].filter((x) => x.resource === resource).length);
  }

  /** Slice i gets a new address for one endpoint: a new snapshot, a MODIFIED to the slice watches. */
  function change(i) {
    versions[i]++;
    const snap = newest('endpointslices');
    const idx = sliceIndex.get(`${cluster(i).name}-${pad(i)}`);
    const it = item(sliceObject(i, versions[i], ++rv, perService), RESOURCES.endpointslices);
    const items = snap.items.slice();
    items[idx] = it;
    for (const r of Object.keys(RESOURCES)) {
      const s = r === 'endpointslices' ? { rv, items } : { rv, items: newest(r).items };
      snapshots[r].push(s);
      if (snapshots[r].length > KEEP_SNAPSHOTS) snapshots[r].shift();
    }
    bodies = new Map();
    history.push({ rv, resource: 'endpointslices', item: it });
    const ev = it.event('MODIFIED');
    let n = 0;
    for (const w of watchers) {
      if (w.resource !== 'endpointslices' || !w.select(it)) continue;
      w.res.write(ev);
      n++;
    }
    onEvent(i, rv, process.hrtime.bigint(), n);
  }

  /** Every object anew (a new resourceVersion each), the history compacted, every watch ended with 410 Gone. */
  function relist() {
    const s2 = [];
    const l2 = [];
    for (let i = 0; i < services; i++) {
      s2.push(serviceObject(i, ++rv));
      l2.push(sliceObject(i, versions[i], ++rv, perService));
    }
    const n2 = Array.from({ length: nodes }, (_, n) => nodeObject(n, ++rv));
    snapshots.services = [{ rv, items: keyed(s2, RESOURCES.services) }];
    snapshots.endpointslices = [{ rv, items: keyed(l2, RESOURCES.endpointslices) }];
    snapshots.nodes = [{ rv, items: keyed(n2, RESOURCES.nodes) }];
    bodies = new Map();
    history.length = 0;
    compactedRv = rv;
    for (const w of [...watchers]) {
      watchers.delete(w);
      clearTimeout(w.timer);
      w.res.end(GONE);
    }
  }

  function bookmark() {
    for (const w of watchers) {
      if (!w.bookmarks) continue;
      const info = RESOURCES[w.resource];
      w.res.write(`{"type":"BOOKMARK","object":{"kind":"${info.kind}","apiVersion":"${info.apiVersion}","metadata":{"resourceVersion":"${rv}"}}}\n`);
    }
  }

  const server = createServer(handle);
  const sockets = new Set();
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise((res, rej) => server.listen(port, '127.0.0.1', res).once('error', rej));
  const ticker = bookmarkEverySeconds > 0 ? setInterval(bookmark, bookmarkEverySeconds * 1000).unref() : undefined;
  const address = `http://127.0.0.1:${server.address().port}`;
  // Build the bodies the source asks for now, so that the first fetch does not pay for them.
  list('services', new URLSearchParams({ labelSelector: SERVICE_SELECTOR }));
  list('endpointslices', new URLSearchParams());
  return {
    port: server.address().port,
    url: address,
    change,
    relist,
    bookmark,
    close: () =>
      new Promise((res) => {
        clearInterval(ticker);
        for (const s of sockets) s.destroy();
        server.close(() => res());
      }),
  };
}

// ---------------------------------------------------------------- main

async function main() {
  const arg = (name, def) => {
    const i = process.argv.indexOf(`--${name}`);
    return i >= 0 ? Number(process.argv[i + 1]) : def;
  };
  const out = (line) => process.stdout.write(line + '\n');
  const srv = await startKubeBenchServer({
    services: arg('services', 10_000),
    perService: arg('per-service', 10),
    nodes: arg('nodes', 100),
    port: arg('port', 0),
    bookmarkEverySeconds: arg('bookmark-every', 60),
    onEvent: (i, rv, t, n) => out(`event ${i} ${rv} ${t} ${n}`),
    onWatch: (resource, n) => out(`watch ${resource} ${n}`),
  });
  out(`listening on 127.0.0.1:${srv.port}`);
  const rl = createInterface({ input: process.stdin });
  rl.on('line', (line) => {
    const [cmd, a] = line.trim().split(/\s+/);
    if (cmd === 'change') srv.change(Number(a));
    else if (cmd === 'bookmark') srv.bookmark();
    else if (cmd === 'relist') srv.relist();
    else if (cmd === 'fetch')
      fetchTime(srv.url, Number(a ?? 5), 'node-7', SERVICE_SELECTOR).then(
        (f) => out(`fetched ${f.median} ${f.min} ${f.max} ${f.bytes} ${f.wallMedian}`),
        (err) => out(`fetch-failed ${String(err.message).replace(/\s+/g, ' ')}`),
      );
    else if (cmd === 'quit') void srv.close().then(() => process.exit(0));
  });
  rl.on('close', () => void srv.close().then(() => process.exit(0)));
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) await main();
