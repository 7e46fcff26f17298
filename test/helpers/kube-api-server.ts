/**
 * A small Kubernetes API server on loopback for tests: list and watch of
 * Services, discovery.k8s.io/v1 EndpointSlices and Nodes with real object
 * JSON, resourceVersions, ADDED/MODIFIED/DELETED/BOOKMARK events, label and
 * field selectors applied server-side (including objects moving in and out of
 * a watch's selection), lists in pages (`limit`/`continue`, each token pinned
 * to its snapshot, 410 once expired), gzip-compressed lists on request, 410
 * Gone for a compacted resourceVersion, dropped watch connections, 401/403
 * answers, bearer-token checks (the token can rotate) and TLS with client
 * certificates.
 *
 * Enough of the API for the kube source's list/watch loops, nothing more.
 * Its parts: the objects and their history (kube-api-store.ts), list paging
 * and how a list is written (kube-api-lists.ts), selectors and the types (kube-api-objects.ts).
 */
import { EventEmitter, once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createTlsServer } from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tempDir, untilExit } from './files.js';
import { kubeconfigText, parseFieldSelector, parseLabelSelector, resources, status, type HistoryEvent, type KObject, type RequestRecord, type Resource, type Selector, type Watcher } from './kube-api-objects.js';
import { KubeObjectStore } from './kube-api-store.js';
import { ListPages, writeList, type ListQuirks } from './kube-api-lists.js';

export { kubeconfigText, parseLabelSelector, type KObject, type RequestRecord, type Resource };
export { listBytes } from './kube-api-lists.js';

export interface KubeApiServerOptions {
  /** Require `Authorization: Bearer TOKEN`; answer 401 otherwise. */
  token?: string;
  /** Serve HTTPS with this key and certificate; with `ca`, require a client certificate it signed. */
  tls?: { key: Buffer; cert: Buffer; ca?: Buffer };
}

/** The fake API server. Mutate it with add/update/remove; watchers see the events. */
export class KubeApiServer {
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();
  private readonly store = new KubeObjectStore((ev) => this.publish(ev));
  private readonly watchers = new Set<Watcher>();
  private readonly forbidden = new Map<string, string>();
  /** Every request received, in order. */
  readonly requests: RequestRecord[] = [];
  /** When set, a watch from an expired resourceVersion gets an HTTP 410 instead of a 200 with an ERROR event. */
  expiredAsHttpStatus = false;
  /** When set, watches ignore `timeoutSeconds` (a half-open connection looks like this). */
  ignoreWatchTimeout = false;
  /** When set, every watch is ended as soon as it is opened (a misbehaving proxy). */
  endWatchesAtOnce = false;
  /** When set, every watch gets an ERROR 410 at once, whatever its resourceVersion (a server whose history is always compacted). */
  expireWatchesAtOnce = false;
  /** When set, every watch is answered with this HTTP status (504 Too large resource version: a server restarted with a shorter history). */
  refuseWatches: { code: number; reason: string; message: string } | undefined;
  /** When set, list bodies are gzip-compressed for clients that accept it. */
  gzipLists = false;
  /** Lists: `limit` ignored (every list in one body), indented JSON, written in pieces of this many bytes a tick, metadata after the items (an array in it). */
  listQuirks: ListQuirks = {};
  /** Connections accepted so far (keep-alive shows as fewer connections than requests). */
  connections = 0;
  private token: string | undefined;
  private readonly tls: KubeApiServerOptions['tls'];
  private readonly lists = new ListPages();
  private readonly requestListeners = new Set<(r: RequestRecord) => void>();
  private readonly events = new EventEmitter();

  constructor(options: KubeApiServerOptions = {}) {
    this.token = options.token;
    this.tls = options.tls;
  }

  /** Requires another bearer token from now on (a rotated token). */
  setToken(token: string): void {
    this.token = token;
  }

  /** Forgets the lists in progress: their continue tokens get 410 Gone. */
  expireContinueTokens(): void {
    this.lists.expire();
  }

  /** Starts listening on 127.0.0.1 (on `port` when given, to bring a "down" server up). Returns the URL. */
  async listen(port = 0): Promise<string> {
    const handler = (req: IncomingMessage, res: ServerResponse): void => this.handle(req, res);
    const tls = this.tls;
    const server: Server = tls ? createTlsServer({ key: tls.key, cert: tls.cert, ...(tls.ca ? { ca: tls.ca, requestCert: true, rejectUnauthorized: true } : {}) }, handler) : createServer(handler);
    server.on(tls ? 'secureConnection' : 'connection', (s: Socket) => {
      this.connections++;
      this.sockets.add(s);
      s.on('close', () => this.sockets.delete(s));
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, '127.0.0.1', () => resolve());
    });
    this.server = server;
    return this.url;
  }

  get port(): number {
    return (this.server!.address() as AddressInfo).port;
  }

  get url(): string {
    return `${this.tls ? 'https' : 'http'}://127.0.0.1:${this.port}`;
  }

  /** Stops listening and cuts every connection. */
  async close(): Promise<void> {
    for (const w of this.watchers) clearTimeout(w.timer);
    this.watchers.clear();
    for (const s of this.sockets) s.destroy();
    const server = this.server;
    this.server = undefined;
    if (server) await new Promise<void>((r) => server.close(() => r()));
  }

  /**
   * Takes a free port, writes a kubeconfig for it and stops listening: an API
   * server that is down when the client starts. `listen(port)` brings it up.
   */
  async startDown(): Promise<{ port: number; kubeconfig: string }> {
    await this.listen();
    const down = { port: this.port, kubeconfig: this.writeKubeconfig() };
    await this.close();
    return down;
  }

  /** A kubeconfig file (in a fresh temp dir, removed at exit) pointing at this server, with `token` when given. */
  writeKubeconfig(options: { token?: string; url?: string } = {}): string {
    const file = join(tempDir(untilExit, 'kubeconfig-'), 'config');
    writeFileSync(file, kubeconfigText(options.url ?? this.url, options.token));
    return file;
  }

  /** Calls `fn` for every request received from now on; returns an unsubscribe function. */
  onRequest(fn: (r: RequestRecord) => void): () => void {
    this.requestListeners.add(fn);
    return () => this.requestListeners.delete(fn);
  }

  /** Resolves at the first request matching `pred` (from now on). */
  waitForRequest(pred: (r: RequestRecord) => boolean): Promise<RequestRecord> {
    return new Promise((resolve) => {
      const off = this.onRequest((r) => {
        if (pred(r)) {
          off();
          resolve(r);
        }
      });
    });
  }

  /** Resolves when at most `n` watch connections are open. */
  async waitForWatchCount(n: number): Promise<void> {
    while (this.watchCount() > n) await once(this.events, 'watchers');
  }

  /** Number of open watch connections (all resources, or one). */
  watchCount(resource?: Resource): number {
    let n = 0;
    for (const w of this.watchers) if (!resource || w.resource === resource) n++;
    return n;
  }

  /** The current resourceVersion. */
  get resourceVersion(): string {
    return String(this.store.rv);
  }

  /** Makes `verb` (list or watch) on `resource` answer 403 until `allow`. */
  forbid(resource: Resource, verb: 'list' | 'watch', user = 'system:serviceaccount:kube-system:kpng-callout'): void {
    this.forbidden.set(`${verb} ${resource}`, user);
  }

  allow(resource: Resource, verb: 'list' | 'watch'): void {
    this.forbidden.delete(`${verb} ${resource}`);
  }

  /** Adds (or replaces) objects, one event each. */
  add(resource: Resource, ...objs: KObject[]): void {
    for (const o of objs) this.store.put(resource, o);
  }

  /** Replaces an object (MODIFIED). */
  update(resource: Resource, obj: KObject): void {
    this.store.put(resource, obj);
  }

  /** Deletes an object by namespace/name. Returns false when absent. */
  remove(resource: Resource, namespace: string | undefined, name: string): boolean {
    return this.store.remove(resource, namespace, name);
  }

  /** Returns a copy of a stored object. */
  get(resource: Resource, namespace: string | undefined, name: string): KObject | undefined {
    return this.store.get(resource, namespace, name);
  }

  /** Every stored object with its kind and apiVersion (for `convertObjects`). */
  all(): KObject[] {
    return this.store.all();
  }

  /** Forgets history: a watch from any resourceVersion before now gets 410 Gone. */
  compact(): void {
    this.store.compact();
  }

  /** Sends an ERROR 410 event to open watches and ends them (as etcd compaction does). */
  expireWatches(resource?: Resource): void {
    this.compact();
    for (const w of [...this.watchers]) {
      if (resource && w.resource !== resource) continue;
      this.send(w, { type: 'ERROR', object: status(410, 'Expired', 'too old resource version') });
      this.endWatch(w);
    }
  }

  /** Sends an ERROR event with a Status of `code` to open watches, and ends them. */
  sendError(code: number, reason: string, message: string, resource?: Resource): void {
    for (const w of [...this.watchers]) {
      if (resource && w.resource !== resource) continue;
      this.send(w, { type: 'ERROR', object: status(code, reason, message) });
      this.endWatch(w);
    }
  }

  /** Cuts open watch connections abruptly (socket destroyed mid-stream). */
  dropWatches(resource?: Resource): void {
    for (const w of [...this.watchers]) {
      if (resource && w.resource !== resource) continue;
      this.watchers.delete(w);
      clearTimeout(w.timer);
      w.res.socket?.destroy();
    }
  }

  /** Ends open watches cleanly (as the server's watch timeout does). */
  endWatches(resource?: Resource): void {
    for (const w of [...this.watchers]) if (!resource || w.resource === resource) this.endWatch(w);
  }

  /** Sends a BOOKMARK at the current resourceVersion to watches that asked for bookmarks. */
  bookmark(): void {
    for (const w of this.watchers) {
      if (!w.bookmarks) continue;
      const info = resources[w.resource];
      this.send(w, { type: 'BOOKMARK', object: { kind: info.kind, apiVersion: info.apiVersion, metadata: { resourceVersion: String(this.store.rv) } } });
    }
  }

  private publish(ev: HistoryEvent): void {
    for (const w of this.watchers) if (w.resource === ev.resource) this.deliver(w, ev);
  }

  /** Sends an event as the watch's selector sees it (objects entering or leaving the selection). */
  private deliver(w: Watcher, ev: HistoryEvent): void {
    const now = ev.type !== 'DELETED' && w.selector(ev.obj);
    const before = ev.old !== undefined && w.selector(ev.old);
    let type: string;
    if (ev.type === 'DELETED') {
      if (!before) return;
      type = 'DELETED';
    } else if (now && before) type = 'MODIFIED';
    else if (now) type = 'ADDED';
    else if (before) type = 'DELETED';
    else return;
    const info = resources[ev.resource];
    this.send(w, { type, object: { kind: info.kind, apiVersion: info.apiVersion, ...ev.obj } });
  }

  private send(w: Watcher, event: unknown): void {
    w.res.write(JSON.stringify(event) + '\n');
  }

  private endWatch(w: Watcher): void {
    this.watchers.delete(w);
    clearTimeout(w.timer);
    w.res.end();
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const url = new URL(req.url ?? '/', 'http://x');
    const query = Object.fromEntries(url.searchParams);
    const watch = query.watch === 'true' || query.watch === '1';
    const record: RequestRecord = { method: req.method ?? 'GET', path: url.pathname, query, watch, status: 200 };
    const reply = (code: number, body: unknown): void => {
      record.status = code;
      res.writeHead(code, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    try {
      this.route(req, res, url, query, watch, record, reply);
    } finally {
      this.requests.push(record);
      for (const fn of [...this.requestListeners]) fn(record);
    }
  }

  private route(
    req: IncomingMessage,
    res: ServerResponse,
    url: URL,
    query: Record<string, string>,
    watch: boolean,
    record: RequestRecord,
    reply: (code: number, body: unknown) => void,
  ): void {
    if (this.token !== undefined && req.headers.authorization !== `Bearer ${this.token}`) {
      reply(401, status(401, 'Unauthorized', 'Unauthorized'));
      return;
    }
    const resource = (Object.keys(resources) as Resource[]).find((r) => resources[r].path === url.pathname);
    if (req.method !== 'GET' || !resource) {
      reply(404, status(404, 'NotFound', `the server could not find the requested resource (${url.pathname})`));
      return;
    }
    const info = resources[resource];
    const verb = watch ? 'watch' : 'list';
    const user = this.forbidden.get(`${verb} ${resource}`);
    if (user !== undefined) {
      const msg = `${resource}${info.group ? '.' + info.group : ''} is forbidden: User "${user}" cannot ${verb} resource "${resource}" in API group "${info.group}" at the cluster scope`;
      reply(403, status(403, 'Forbidden', msg, { kind: resource, ...(info.group ? { group: info.group } : {}) }));
      return;
    }
    let selector: Selector;
    try {
      const labels = parseLabelSelector(query.labelSelector);
      const fields = parseFieldSelector(query.fieldSelector);
      selector = (o) => labels(o) && fields(o);
    } catch (err) {
      reply(400, status(400, 'BadRequest', String(err)));
      return;
    }
    if (!watch) {
      this.list(req, res, query, resource, selector, record, reply);
      return;
    }
    const from = query.resourceVersion ? Number(query.resourceVersion) : undefined;
    if (this.refuseWatches) {
      const { code, reason, message } = this.refuseWatches;
      reply(code, status(code, reason, message));
      return;
    }
    if ((from !== undefined && from < this.store.compactedRv) || this.expireWatchesAtOnce) {
      if (this.expiredAsHttpStatus) {
        reply(410, status(410, 'Expired', `too old resource version: ${from} (${this.store.compactedRv})`));
        return;
      }
      record.status = 200;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ type: 'ERROR', object: status(410, 'Expired', `too old resource version: ${from} (${this.store.compactedRv})`) }) + '\n');
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    res.flushHeaders();
    const w: Watcher = { resource, res, selector, bookmarks: query.allowWatchBookmarks === 'true' };
    this.watchers.add(w);
    res.on('close', () => {
      this.watchers.delete(w);
      clearTimeout(w.timer);
      this.events.emit('watchers');
    });
    if (from === undefined) {
      for (const o of this.store.objects[resource].values()) if (selector(o)) this.send(w, { type: 'ADDED', object: { kind: info.kind, apiVersion: info.apiVersion, ...o } });
    } else {
      for (const ev of this.store.history) if (ev.resource === resource && ev.rv > from) this.deliver(w, ev);
    }
    const timeout = Number(query.timeoutSeconds);
    if (this.endWatchesAtOnce) this.endWatch(w);
    else if (timeout > 0 && !this.ignoreWatchTimeout) w.timer = setTimeout(() => this.endWatch(w), timeout * 1000);
  }

  /** A list, or one page of it (`limit`, `continue`); gzip-compressed when asked for and `gzipLists`. */
  private list(
    req: IncomingMessage,
    res: ServerResponse,
    query: Record<string, string>,
    resource: Resource,
    selector: Selector,
    record: RequestRecord,
    reply: (code: number, body: unknown) => void,
  ): void {
    const info = resources[resource];
    // Stored objects are replaced, never changed in place: a snapshot of them stays as it was.
    const page = this.lists.page(this.listQuirks.ignoreLimit ? { ...query, limit: '' } : query, () => this.store.snapshot(resource, selector));
    if (!page) {
      reply(410, status(410, 'Expired', 'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.'));
      return;
    }
    record.status = 200;
    writeList(req, res, { kind: info.kind + 'List', apiVersion: info.apiVersion, ...page }, this.listQuirks, this.gzipLists);
  }
}
