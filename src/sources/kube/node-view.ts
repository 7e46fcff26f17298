/**
 * The node view: Services, EndpointSlices and this node's Node in, the
 * node-local state kpng's server would have sent this node out (conversion in
 * convert/kubernetes). It is pure and incremental: callers tell it what was
 * added, updated or deleted, as plain objects (parsed JSON, or the client
 * library's typed objects), and ask for the state when a change set is
 * complete; only the Services touched since the last state are recomputed.
 *
 * It knows nothing of how the objects arrive (informers today, our own
 * list/watch loop later), of timers or of the API server, so it is tested
 * with plain objects alone.
 */
import { convertEndpoints, sliceServiceName } from '../../convert/endpoints.js';
import { ConversionError } from '../../convert/fields.js';
import { LABEL_ZONE, type KubeEndpointSlice, type KubeMeta, type KubeNode, type KubeService } from '../../convert/kube-objects.js';
import { convertService, isServiceSelected } from '../../convert/service.js';
import type { GlobFilter } from '../../convert/glob.js';
import { silentLogger, type Logger } from '../../log.js';
import type { Endpoint, Service } from '../../model.js';
import { Store, type State } from '../../state.js';

/** Options of {@link NodeView}. */
export interface NodeViewOptions {
  /** The node whose view is computed (Local, traffic policies, zone). */
  nodeName: string;
  /** Handle Services labelled service-proxy-name=NAME; unset: Services without the label. */
  serviceProxyName?: string | undefined;
  /** Service labels to send (`--with-service-labels`); none when unset, as kpng. */
  labels?: GlobFilter | undefined;
  /** Service annotations to send (`--with-service-annotations`); none when unset. */
  annotations?: GlobFilter | undefined;
  /** Told about malformed objects (left out) and zone changes. */
  logger?: Logger | undefined;
}

/** `namespace/name` of an object. */
const pathOf = (o: { metadata?: KubeMeta | null | undefined }): string => `${o.metadata?.namespace ?? ''}/${o.metadata?.name ?? ''}`;

/**
 * The index of what the API told us, and the state computed from it. Every
 * `set*`/`delete*` returns whether the state may have changed (then call
 * {@link state} once the change set is complete: a re-list's objects arrive
 * one by one, and a state built from part of them never existed).
 */
export class NodeView {
  private readonly log: Logger;
  private readonly services = new Map<string, KubeService>();
  /** Service path -> its slices by slice name. */
  private readonly slicesByService = new Map<string, Map<string, KubeEndpointSlice>>();
  /** Slice path -> the path of the Service it is filed under. */
  private readonly sliceOwner = new Map<string, string>();
  private nodeZone: string | undefined;
  private readonly store = new Store();
  /** Endpoint keys set in the store, per Service path. */
  private readonly published = new Map<string, Set<string>>();
  /** Service paths to recompute. */
  private readonly dirty = new Set<string>();
  /** Every Service to recompute (the zone changed). */
  private allDirty = false;

  constructor(private readonly options: NodeViewOptions) {
    this.log = options.logger ?? silentLogger;
  }

  /** The node's zone (`topology.kubernetes.io/zone` of its Node), undefined while unknown. */
  get zone(): string | undefined {
    return this.nodeZone;
  }

  /** EndpointSlices filed under a Service name. */
  get sliceCount(): number {
    return this.sliceOwner.size;
  }

  /** A Service added or updated (one not selected by the service-proxy-name rule counts as deleted). */
  setService(svc: KubeService): boolean {
    if (!isServiceSelected(svc, this.options.serviceProxyName)) return this.deleteService(svc);
    const path = pathOf(svc);
    this.services.set(path, svc);
    this.dirty.add(path);
    return true;
  }

  deleteService(svc: KubeService): boolean {
    const path = pathOf(svc);
    if (!this.services.delete(path)) return false;
    this.dirty.add(path);
    return true;
  }

  /** An EndpointSlice added or updated: filed under the Service its label names (moved when that changes). */
  setSlice(slice: KubeEndpointSlice): boolean {
    const svcName = sliceServiceName(slice);
    return this.fileSlice(slice, svcName ? `${slice.metadata?.namespace ?? ''}/${svcName}` : undefined);
  }

  deleteSlice(slice: KubeEndpointSlice): boolean {
    return this.fileSlice(slice, undefined);
  }

  /** Files `slice` under the Service `owner` (undefined: under none), marking the Services it leaves and joins. */
  private fileSlice(slice: KubeEndpointSlice, owner: string | undefined): boolean {
    const key = pathOf(slice);
    const name = slice.metadata?.name ?? '';
    const before = this.sliceOwner.get(key);
    let changed = false;
    if (before !== undefined && before !== owner) {
      const group = this.slicesByService.get(before);
      group?.delete(name);
      if (group?.size === 0) this.slicesByService.delete(before);
      this.sliceOwner.delete(key);
      this.dirty.add(before);
      changed = true;
    }
    if (owner !== undefined) {
      let group = this.slicesByService.get(owner);
      if (!group) this.slicesByService.set(owner, (group = new Map()));
      group.set(name, slice);
      this.sliceOwner.set(key, owner);
      this.dirty.add(owner);
      changed = true;
    }
    return changed;
  }

  /** A Node added or updated: only this node's zone matters (other nodes are ignored). */
  setNode(node: KubeNode): boolean {
    return this.nodeZoneIs(node, node.metadata?.labels?.[LABEL_ZONE]);
  }

  deleteNode(node: KubeNode): boolean {
    return this.nodeZoneIs(node, undefined);
  }

  private nodeZoneIs(node: KubeNode, zone: string | undefined): boolean {
    const { nodeName } = this.options;
    if (node.metadata?.name !== nodeName || zone === this.nodeZone) return false;
    this.log.info(zone !== undefined ? `node ${nodeName}: zone ${zone}` : `node ${nodeName}: no zone`);
    this.nodeZone = zone;
    // Topology hints of every Service depend on the zone.
    this.allDirty = true;
    return true;
  }

  /** The node-local state: recomputes the Services changed since the last call. */
  state(): State {
    const paths = this.allDirty ? new Set([...this.services.keys(), ...this.published.keys()]) : this.dirty;
    for (const p of paths) this.rebuild(p);
    this.dirty.clear();
    this.allDirty = false;
    return this.store.snapshot();
  }

  /** Recomputes one Service and its endpoints in the store. A malformed object is logged and left out; the others stay. */
  private rebuild(path: string): void {
    const { store } = this;
    const svc = this.services.get(path);
    const had = this.published.get(path);
    if (!svc) {
      store.deleteService(path);
      if (had) for (const k of had) store.deleteEndpoint(`${path}/${k}`);
      this.published.delete(path);
      return;
    }
    let model: Service;
    try {
      model = convertService(svc, { labels: this.options.labels, annotations: this.options.annotations });
    } catch (err) {
      // Keep what we had.
      this.log.error(`service ${path}: cannot convert: ${(err as Error).message}`);
      return;
    }
    const eps = this.endpointsOf(path, svc);
    if (eps === undefined) return;
    store.setService(path, model);
    const keys = new Set<string>();
    for (const [k, ep] of eps) {
      store.setEndpoint(`${path}/${k}`, ep);
      keys.add(k);
    }
    if (had) for (const k of had) if (!keys.has(k)) store.deleteEndpoint(`${path}/${k}`);
    this.published.set(path, keys);
  }

  /** The endpoints of `svc` for this node, its malformed slices left out (undefined: none can be computed). */
  private endpointsOf(path: string, svc: KubeService): Array<[string, Endpoint]> | undefined {
    let slices = [...(this.slicesByService.get(path)?.values() ?? [])];
    for (;;) {
      try {
        return convertEndpoints(svc, slices, { nodeName: this.options.nodeName, nodeZone: this.nodeZone });
      } catch (err) {
        if (!(err instanceof ConversionError) || err.index === undefined) {
          this.log.error(`service ${path}: cannot compute endpoints: ${(err as Error).message}`);
          return undefined;
        }
        const bad = slices[err.index];
        this.log.error(`endpointslice ${bad ? pathOf(bad) : '?'}: cannot convert: ${err.message}`);
        slices = slices.filter((_, i) => i !== err.index);
      }
    }
  }
}
