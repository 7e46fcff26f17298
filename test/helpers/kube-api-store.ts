/**
 * The objects of the test Kubernetes API server and their history: every
 * change gets the next resourceVersion and becomes an event (told to the
 * server, which sends it to its watches); `compact` forgets the history, as
 * etcd compaction does. Objects are replaced, never changed in place, so a
 * list's snapshot of them stays as it was.
 */
import { keyOf, resources, type HistoryEvent, type KObject, type Resource, type Selector } from './kube-api-objects.js';

export class KubeObjectStore {
  readonly objects: Record<Resource, Map<string, KObject>> = { services: new Map(), endpointslices: new Map(), nodes: new Map() };
  readonly history: HistoryEvent[] = [];
  /** The current resourceVersion. */
  rv = 100;
  /** Watches from a resourceVersion below this get 410 Gone. */
  compactedRv = 0;
  private uid = 0;

  constructor(private readonly onEvent: (ev: HistoryEvent) => void) {}

  /** Adds or replaces an object (ADDED or MODIFIED), with the defaults the API server fills in. */
  put(resource: Resource, input: KObject): void {
    const info = resources[resource];
    const obj = structuredClone(input);
    if (info.namespaced) obj.metadata.namespace ??= 'default';
    const key = keyOf(obj);
    const old = this.objects[resource].get(key);
    obj.metadata.uid ??= old?.metadata.uid ?? `00000000-0000-4000-8000-${String(++this.uid).padStart(12, '0')}`;
    obj.metadata.creationTimestamp ??= old?.metadata.creationTimestamp ?? '2021-10-18T00:00:00Z';
    obj.metadata.resourceVersion = String(++this.rv);
    delete obj.kind;
    delete obj.apiVersion;
    this.objects[resource].set(key, obj);
    this.record({ rv: this.rv, resource, type: old ? 'MODIFIED' : 'ADDED', obj, old });
  }

  /** Deletes an object by namespace/name (DELETED). Returns false when absent. */
  remove(resource: Resource, namespace: string | undefined, name: string): boolean {
    const key = `${namespace ?? ''}/${name}`;
    const old = this.objects[resource].get(key);
    if (!old) return false;
    this.objects[resource].delete(key);
    const obj = structuredClone(old);
    obj.metadata.resourceVersion = String(++this.rv);
    this.record({ rv: this.rv, resource, type: 'DELETED', obj, old });
    return true;
  }

  /** A copy of a stored object. */
  get(resource: Resource, namespace: string | undefined, name: string): KObject | undefined {
    const o = this.objects[resource].get(`${namespace ?? ''}/${name}`);
    return o ? structuredClone(o) : undefined;
  }

  /** Every stored object with its kind and apiVersion. */
  all(): KObject[] {
    return (Object.keys(resources) as Resource[]).flatMap((r) =>
      [...this.objects[r].values()].map((o) => ({ kind: resources[r].kind, apiVersion: resources[r].apiVersion, ...structuredClone(o) })),
    );
  }

  /** Forgets history: a watch from any resourceVersion before now gets 410 Gone. */
  compact(): void {
    this.compactedRv = this.rv;
    this.history.length = 0;
  }

  /** The objects of `resource` that `selector` lets through, by key, at the current resourceVersion (a list). */
  snapshot(resource: Resource, selector: Selector): { rv: number; items: KObject[] } {
    return { rv: this.rv, items: [...this.objects[resource].values()].filter(selector).sort((a, b) => (keyOf(a) < keyOf(b) ? -1 : 1)) };
  }

  private record(ev: HistoryEvent): void {
    this.history.push(ev);
    this.onEvent(ev);
  }
}
