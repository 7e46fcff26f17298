/**
 * The lists of the test Kubernetes API server: their paging
 * (`limit`/`continue`: each list that does not fit one page keeps the
 * snapshot it started from, which its continue tokens page through until the
 * last page, or `expire`), how a list answer is written (quirks, gzip), and
 * reading one whole through the source's client (listBytes).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { gzipSync } from 'node:zlib';
import { eachChunk, type ApiClient } from '../../src/sources/kube/http.js';
import type { KObject } from './kube-api-objects.js';

/** A list in progress: the snapshot its continue tokens page through. */
interface ListSnapshot {
  rv: number;
  items: KObject[];
}

/** What a list answer carries besides kind and apiVersion. */
export interface ListPage {
  metadata: { resourceVersion: string; continue?: string; remainingItemCount?: number };
  items: KObject[];
}

export class ListPages {
  private readonly snapshots = new Map<number, ListSnapshot>();
  private snapshotId = 0;

  /** Every continue token given so far is gone (its next request gets 410). */
  expire(): void {
    this.snapshots.clear();
  }

  /**
   * The page `query` asks for: of a new snapshot (`take`) without `continue`,
   * else of the token's; undefined when the token's snapshot is gone.
   */
  page(query: Record<string, string>, take: () => ListSnapshot): ListPage | undefined {
    let snap: ListSnapshot | undefined;
    let id: number;
    let start = 0;
    if (query.continue) {
      const [sid, offset] = query.continue.split(':').map(Number) as [number, number];
      snap = this.snapshots.get(sid);
      if (!snap) return undefined;
      id = sid;
      start = offset;
    } else {
      id = ++this.snapshotId;
      snap = take();
    }
    const limit = Number(query.limit) > 0 ? Number(query.limit) : snap.items.length;
    const end = Math.min(snap.items.length, start + limit);
    const more = end < snap.items.length;
    if (more) this.snapshots.set(id, snap);
    else this.snapshots.delete(id);
    const metadata = { resourceVersion: String(snap.rv), ...(more ? { continue: `${id}:${end}`, remainingItemCount: snap.items.length - end } : {}) };
    return { metadata, items: snap.items.slice(start, end) };
  }
}

/** Lists: `limit` ignored (every list in one body), indented JSON, written in pieces of this many bytes a tick, metadata after the items (an array in it). */
export interface ListQuirks {
  ignoreLimit?: boolean;
  indented?: boolean;
  pieceBytes?: number;
  metadataLast?: boolean;
}

/**
 * Writes the list answer `body` (status 200): with quirks `q`, as they say;
 * else gzip-compressed when `gzip` and the client accepts it; else plain.
 */
export function writeList(req: IncomingMessage, res: ServerResponse, body: { kind: string; apiVersion: string } & ListPage, q: ListQuirks, gzip: boolean): void {
  if (q.indented || q.pieceBytes || q.metadataLast) {
    const { metadata, ...rest } = body;
    const text = JSON.stringify(q.metadataLast ? { ...rest, metadata: { ...metadata, x: [1] } } : body, null, q.indented ? 2 : undefined);
    res.writeHead(200, { 'content-type': 'application/json' });
    const step = q.pieceBytes || text.length;
    const write = (at: number): void => {
      if (at >= text.length) return void res.end();
      res.write(text.slice(at, at + step));
      setImmediate(() => write(at + step));
    };
    write(0);
    return;
  }
  if (!gzip || !/\bgzip\b/.test(String(req.headers['accept-encoding'] ?? ''))) {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
    return;
  }
  res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
  res.end(gzipSync(JSON.stringify(body)));
}

/** GET a list page through `client`, its body read whole, as bytes (what the source reads with a ListReader). */
export async function listBytes(client: ApiClient, path: string, query: Record<string, string | number | undefined>, o: { signal: AbortSignal }): Promise<Buffer> {
  const { body } = await client.get(path, query, { ...o, stream: false });
  const chunks: Buffer[] = [];
  await eachChunk(body, (c) => chunks.push(c));
  return Buffer.concat(chunks);
}
