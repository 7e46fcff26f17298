/**
 * The paging of the test Kubernetes API server's lists (`limit`/`continue`):
 * each list that does not fit one page keeps the snapshot it started from,
 * which its continue tokens page through until the last page (or `expire`).
 */
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
