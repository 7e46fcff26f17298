/**
 * One watched resource's list/watch loop, as a supervisor {@link Member}:
 *
 * - list in pages (`limit`, `continue`): each page is read item by item as
 *   it arrives (list-page.ts), so a 30 MB list (or a server that ignores
 *   `limit`) is never one allocation; the next page is asked for as soon as
 *   its continue token is in (the page's head); a continue token that
 *   expired (410) lists again from the start, once;
 * - then watch from the list's resourceVersion, with bookmarks and a
 *   server-side timeout asked for, reading the NDJSON stream line by line:
 *   ADDED/MODIFIED/DELETED are handed over, every event (BOOKMARK included)
 *   moves the resume point; a clean end (the server's timeout) watches
 *   again from there;
 * - 410 Gone (an ERROR event or the HTTP status) lists again: the objects no
 *   longer listed are handed over as deleted, and a re-list's changes all
 *   in one tick, so a state is never computed from half of one (each is
 *   staged as it is read, `stage`, so that the objects themselves are not
 *   kept until then);
 * - everything else is a failure, in words (failures.ts), for the
 *   supervisor, which restarts the loop: after a lost connection it resumes
 *   from its resourceVersion (no list); after a watch the server refused, it
 *   lists again (refusal). The idle watchdog ends a watch that
 *   stays silent past its timeout.
 *
 * Our own loop rather than the client library's informer: the informer keeps
 * a typed copy of every object in its cache (100,000 endpoints at 10k
 * Services), does not follow `continue`, stops on any error, and comes with
 * the library's ~0.5 s / ~70 MB import (measured). Here only each object's
 * key and resourceVersion are kept (to tell a re-list's deletions and
 * unchanged objects); the objects go to `onObject` as parsed JSON.
 */
import { PassThrough, pipeline, type Readable } from 'node:stream';
import type { Logger } from '../../log.js';
import { describeKubeError, qualified, stalledWatch, type Failure, type ResourceName } from './failures.js';
import { ApiError, eachChunk, readLines, type ApiClient } from './http.js';
import { continueToken, ListReader, NotAList, PageNotCut, type PageMeta } from './list-page.js';
import { IdleWatchdog, idleLimitMs, type ListWatchSupervisor, type Member } from './supervisor.js';

/** Objects per list page (`limit`), as client-go's reflector. */
export const PAGE_SIZE = 500;
/** A watch ended cleanly this soon (ms) without an event, this many times in a row, is a failure (no busy loop). */
const QUICK_END_MS = 1000;
const QUICK_ENDS = 3;

/** An object as the API serves it (parsed JSON): only its metadata is read here. */
export interface ApiObject {
  metadata?: { name?: string | null; namespace?: string | null; resourceVersion?: string | null } | null;
}

/** What is watched, where, and who is told. */
export interface ListWatchOptions extends ResourceName {
  client: ApiClient;
  /** Collection path of the list and the watch, e.g. `/api/v1/services`. */
  path: string;
  labelSelector?: string | undefined;
  fieldSelector?: string | undefined;
  /** Server-side watch timeout to ask for, per watch request (s). */
  timeoutSeconds: () => number;
  /** Objects per list page. Default {@link PAGE_SIZE}. */
  pageSize?: number | undefined;
  supervisor: ListWatchSupervisor;
  /** The API server's URL, for messages. */
  server: string;
  logger: Logger;
  /** An object added or updated (`deleted` false), or deleted (maybe only its namespace and name). */
  onObject: (obj: ApiObject, deleted: boolean) => void;
  /**
   * Readies an object a re-list changed, as it is read: what it returns is
   * kept instead of the object until the list is complete, then called in
   * place of `onObject(obj, false)`. Unset: the object itself is kept.
   */
  stage?: ((obj: ApiObject) => () => void) | undefined;
  /** A list completed (its objects handed over). */
  onListed?: (() => void) | undefined;
}

/** A failure already in words, thrown out of the loop. */
class Failed extends Error {
  constructor(readonly failure: Failure) {
    super(failure.reason);
  }
}

/** Thrown from a watch line: 410 Gone. */
const EXPIRED = Symbol('expired');

const keyOf = (o: ApiObject): string => `${o.metadata?.namespace ?? ''}/${o.metadata?.name ?? ''}`;

/** An object known only by its key: what a re-list hands over as deleted. */
function stub(key: string): ApiObject {
  const i = key.indexOf('/');
  const namespace = key.slice(0, i);
  return { metadata: { ...(namespace ? { namespace } : {}), name: key.slice(i + 1) } };
}

const statusOf = (err: unknown): number | undefined => (err instanceof ApiError ? err.statusCode : undefined);

// A re-list's change, to apply once it is complete. Made here, not in the
// list's item callback: a closure made there would keep the callback's
// whole scope, the parsed object included, whatever `stage` kept instead.
const handOver =
  (o: ListWatchOptions, obj: ApiObject): (() => void) =>
  () =>
    o.onObject(obj, false);
const staged =
  (known: Map<string, string>, key: string, version: string, apply: () => void): (() => void) =>
  () => {
    known.set(key, version);
    apply();
  };

/** A list/watch loop for one resource, added to `o.supervisor` (which starts it). */
export function addListWatch(o: ListWatchOptions): ListWatch {
  const member = new ListWatch(o);
  o.supervisor.add(member);
  return member;
}

/** See the module comment. */
export class ListWatch implements Member {
  readonly resource: string;
  readonly group: string;
  /** Where a watch resumes; undefined: list first. */
  private rv: string | undefined;
  /** Key -> resourceVersion of every object handed over and not deleted. */
  private readonly known = new Map<string, string>();
  /** A list completed once: a later list is a re-list, handed over in one tick. */
  private listedOnce = false;
  /** The running loop (aborting it ends its requests). */
  private run: AbortController | undefined;
  private readonly watchdog = new IdleWatchdog();
  /** Watches in a row that the server ended at once. */
  private quickEnds = 0;
  /** Watches in a row that expired (410) at once: re-listing cannot help, so the supervisor's backoff comes in. */
  private quickExpiries = 0;
  /** Watches in a row the server refused (each re-list in between looks healthy: the backoff's streak). */
  private refused = 0;
  /** Failures in a row for quick ends or expiries (the backoff's streak: each list in between looks healthy). */
  private unstable = 0;
  /** Pages are read whole (one did not cut into items: list-page.ts). */
  private wholePages = false;
  /** Watches in a row that failed at once after they opened (a cut stream, a line that is not JSON). */
  private cutShort = 0;

  constructor(private readonly o: ListWatchOptions) {
    this.resource = o.resource;
    this.group = o.group;
  }

  /** The objects handed over and not deleted. */
  get size(): number {
    return this.known.size;
  }

  start(): void {
    this.end();
    const run = new AbortController();
    this.run = run;
    this.loop(run.signal).catch((err: unknown) => this.fail(run, err instanceof Failed ? err.failure : describeKubeError(err, 'watch', this, this.o.server)));
  }

  stop(): void {
    this.end();
  }

  private end(): void {
    this.watchdog.disarm();
    this.run?.abort();
    this.run = undefined;
  }

  /** Ends `run` (if still the current one) and tells the supervisor. */
  private fail(run: AbortController, failure: Failure): void {
    if (this.run !== run || this.o.supervisor.isStopped) return;
    this.end();
    this.o.supervisor.failed(this, failure);
  }

  private async loop(signal: AbortSignal): Promise<void> {
    for (;;) {
      if (this.rv === undefined) await this.list(signal);
      if (signal.aborted) return;
      const opened = Date.now();
      const expired = await this.watch(signal);
      if (signal.aborted) return;
      const quick = Date.now() - opened < QUICK_END_MS;
      this.quickExpiries = expired && quick ? this.quickExpiries + 1 : 0;
      if (!quick) this.unstable = 0;
      if (expired) this.rv = undefined;
      if (this.quickExpiries >= QUICK_ENDS) {
        this.quickExpiries = 0;
        this.unstable++;
        throw new Failed({ op: `watch ${qualified(this)}`, reason: `the resourceVersion of ${QUICK_ENDS} fresh lists in a row expired at once (410 Gone)`, routine: false, streak: this.unstable });
      }
      if (expired) this.o.logger.info(`watch ${qualified(this)}: resourceVersion expired (410 Gone); listing again`);
    }
  }

  /** An object added or updated: remembered and handed over. */
  private take(obj: ApiObject): void {
    this.known.set(keyOf(obj), obj.metadata?.resourceVersion ?? '');
    this.o.onObject(obj, false);
  }

  /**
   * Requests one list page (its body, read as it comes). Not awaited at once
   * when prefetched: its rejection is then handled where it is awaited.
   */
  private page(signal: AbortSignal, cont: string | undefined, prefetch = false): { cont: string | undefined; body: Promise<Readable>; abort: () => void } {
    const { o } = this;
    const own = new AbortController();
    const query = { labelSelector: o.labelSelector, fieldSelector: o.fieldSelector, limit: o.pageSize ?? PAGE_SIZE, continue: cont };
    // A prefetched page (`limit` objects) is read into memory as it comes (up to 256 MiB): left unread while
    // the page before it is read, its connection would fall silent past the request timeout and be cut.
    const got = o.client.get(o.path, query, { signal: AbortSignal.any([signal, own.signal]), stream: false });
    const body = got.then((r) => (prefetch ? pipeline(r.body, new PassThrough({ highWaterMark: 256 << 20 }), () => {}) : r.body));
    body.catch(() => {});
    return { cont, body, abort: () => own.abort() };
  }

  /** Lists every page; hands the changes over (see the module comment); sets the resume point. */
  private async list(signal: AbortSignal): Promise<void> {
    const { o } = this;
    // Before the first complete list nothing is published (the supervisor is
    // not synced): pages go over as they come. Later, in one tick at the end.
    const direct = !this.listedOnce;
    const seen = new Set<string>();
    let changed: Array<() => void> = [];
    let restarted = false;
    let rv: string | undefined;
    let next = this.page(signal, undefined);
    // Each item as it is read (list-page.ts): an item may come twice, harmlessly (a set of keys, idempotent takes).
    const onItem = (item: unknown): void => {
      if (!item || typeof item !== 'object') throw new NotAList();
      const obj = item as ApiObject;
      const key = keyOf(obj);
      seen.add(key);
      const version = obj.metadata?.resourceVersion;
      if (version && this.known.get(key) === version) return;
      if (direct) return this.take(obj);
      changed.push(staged(this.known, key, version ?? '', o.stage ? o.stage(obj) : handOver(o, obj)));
    };
    for (;;) {
      let meta: PageMeta;
      let prefetched: ReturnType<ListWatch['page']> | undefined;
      try {
        const body = await next.body;
        if (signal.aborted) return void body.destroy();
        // The continue token comes before the items: ask for the next page while this one is read.
        const onHead = (head: Buffer): void => {
          const early = continueToken(head);
          if (early !== undefined) prefetched = this.page(signal, early, true);
        };
        const reader = new ListReader(onItem, onHead, this.wholePages);
        await eachChunk(body, (chunk) => reader.push(chunk));
        meta = reader.end();
      } catch (err) {
        prefetched?.abort();
        if (signal.aborted) return;
        // A page found not to cut into items only at its end (its bytes gone): this resource's pages are read whole from now on.
        const notCut = err instanceof PageNotCut && !this.wholePages;
        if (notCut || (next.cont !== undefined && statusOf(err) === 410 && !restarted)) {
          if (notCut) this.wholePages = true;
          else restarted = true;
          changed = [];
          seen.clear();
          const why = notCut ? 'a page could not be read item by item (pages read whole from now on)' : 'continue token expired (410 Gone)';
          o.logger[notCut ? 'debug' : 'info'](`list ${qualified(this)}: ${why}; listing again from the start`);
          next = this.page(signal, undefined);
          continue;
        }
        throw new Failed(describeKubeError(err, 'list', this, o.server));
      }
      const cont = meta.continue || undefined;
      if (cont !== prefetched?.cont) prefetched?.abort();
      if (cont === undefined) {
        rv = meta.resourceVersion || undefined;
        break;
      }
      next = cont === prefetched?.cont ? prefetched : this.page(signal, cont);
    }
    for (const apply of changed) apply();
    for (const key of this.known.keys()) {
      if (seen.has(key)) continue;
      this.known.delete(key);
      o.onObject(stub(key), true);
    }
    this.rv = rv;
    this.listedOnce = true;
    o.supervisor.listed(this, seen.size);
    o.onListed?.();
  }

  /** Watches from the resume point until the stream ends. Resolves true on 410 Gone. */
  private async watch(signal: AbortSignal): Promise<boolean> {
    const { o } = this;
    const run = this.run!;
    const seconds = o.timeoutSeconds();
    const query = { watch: 1, resourceVersion: this.rv, allowWatchBookmarks: 'true', timeoutSeconds: seconds, labelSelector: o.labelSelector, fieldSelector: o.fieldSelector };
    let body;
    try {
      ({ body } = await o.client.get(o.path, query, { signal, stream: true }));
    } catch (err) {
      if (signal.aborted) return false;
      if (statusOf(err) === 410) return true;
      throw new Failed(this.refusal(err, describeKubeError(err, 'watch', this, o.server)));
    }
    if (signal.aborted) {
      body.destroy();
      return false;
    }
    o.supervisor.healthy(this);
    // Silent past the timeout the server was asked for (plus some grace): the
    // connection is dead (half-open TCP); the restart resumes.
    this.watchdog.arm(idleLimitMs(seconds), () => this.fail(run, stalledWatch(this)));
    const opened = Date.now();
    let events = 0;
    try {
      await readLines(
        body,
        (line) => {
          events++;
          this.event(line);
        },
        () => this.watchdog.poke(),
      );
    } catch (err) {
      if (err === EXPIRED) return true;
      if (signal.aborted) return false;
      const failure = this.refusal(err, describeKubeError(err, 'watch', this, o.server));
      // Opened (healthy: the supervisor's backoff starts over), then failed at once (cut, not JSON):
      // again and again, that is the backoff's streak, or it would retry at the shortest wait for ever.
      if (Date.now() - opened >= QUICK_END_MS) this.cutShort = 0;
      else failure.streak = Math.max(failure.streak ?? 0, ++this.cutShort);
      throw new Failed(failure);
    } finally {
      this.watchdog.disarm();
    }
    this.cutShort = 0;
    this.quickEnds = events === 0 && Date.now() - opened < QUICK_END_MS ? this.quickEnds + 1 : 0;
    if (this.quickEnds >= QUICK_ENDS) {
      this.quickEnds = 0;
      this.unstable++;
      throw new Failed({ op: `watch ${qualified(this)}`, reason: `the API server ended ${QUICK_ENDS} watches in a row at once`, routine: false, streak: this.unstable });
    }
    return false;
  }

  /**
   * A watch the server refused (an HTTP status, or an ERROR event), other than
   * 429: the next try lists again, as client-go's reflector does. A server
   * restarted with a shorter history answers a watch from our resourceVersion
   * with 504 (Too large resource version) for ever; resuming would never see
   * what changed. A connection lost resumes from where it was. The refusals
   * in a row are the backoff's streak: each list in between succeeds, and the
   * supervisor would otherwise start every retry from its shortest wait.
   */
  private refusal(err: unknown, failure: Failure): Failure {
    const status = statusOf(err);
    if (status === undefined || status === 429) return failure;
    this.rv = undefined;
    return { ...failure, streak: ++this.refused };
  }

  /** One watch event (a line of the stream). Throws EXPIRED on 410 Gone, an error on another ERROR. */
  private event(line: string): void {
    let ev: { type?: unknown; object?: ApiObject & { code?: unknown; reason?: unknown } };
    try {
      ev = JSON.parse(line) as typeof ev;
    } catch (err) {
      throw new Error(`the server sent a watch event that is not JSON (${(err as Error).message})`);
    }
    const obj = ev?.object;
    // An event other than ERROR: this watch was not refused.
    if (ev?.type !== 'ERROR') this.refused = 0;
    switch (ev?.type) {
      case 'ADDED':
      case 'MODIFIED':
        if (obj) this.take(obj);
        break;
      case 'DELETED':
        if (obj) {
          this.known.delete(keyOf(obj));
          this.o.onObject(obj, true);
        }
        break;
      case 'ERROR': {
        if (obj?.code === 410) throw EXPIRED;
        const code = typeof obj?.code === 'number' ? obj.code : 0;
        throw new ApiError(code, JSON.stringify(obj ?? null), typeof obj?.reason === 'string' ? obj.reason : 'watch ERROR event');
      }
      default:
        // BOOKMARK (and anything new): only its resourceVersion matters.
        break;
    }
    const version = obj?.metadata?.resourceVersion;
    if (version) this.rv = version;
  }
}
