/**
 * The node view: Services, EndpointSlices and this node's Node in, the
 * node-local state kpng's server would have sent this node out (conversion in
 * convert/). It is pure and incremental: callers tell it what was added,
 * updated or deleted, as plain objects (parsed JSON), and ask for the state
 * when a change set is complete; only the Services touched since the last
 * state are recomputed.
 *
 * It keeps only what the conversion needs, converted as each object arrives,
 * never the object (which carries managedFields, last-applied annotations
 * and everything else a proxy never reads):
 * - a Service: its traffic policies, and its JSON until the next state
 *   puts it in the store (encoded as it arrives: one flat string survives
 *   the young generation's collections until then, where the model was a
 *   tree of small objects for them to copy, 10,000 in a first sync);
 * - a slice: its ready endpoints as this node sees them (convert/endpoints
 *   `compileSlice`: JSON up to the ports, key hash, Local, zone hints), read
 *   once per change; an update hashes only the endpoints it changed, and the
 *   store's endpoint JSON is `head + tail`, a pair of the compiled slice's
 *   strings rather than a copy.
 * Heap of the kept form alone at 10,000 Services × 10 endpoints shaped like
 * the API server's (`bench/node-view.js --forms`): the parsed objects 88 MB;
 * stripped to the fields read, as plain objects 30 MB, as JSON text parsed
 * again when a Service is recomputed 17.5 MB (plus ~150 ms to parse them all
 * on a zone change, and no text to share with the store); compiled 12 MB.
 *
 * It knows nothing of how the objects arrive, of timers or of the API
 * server, so it is tested with plain objects alone.
 */
import { compileSlice, nodeEndpointJsons, policiesOf, sameSlice, sliceServiceName, type CompiledSlice, type Policies } from '../../convert/endpoints.js';
import type { GlobFilter } from '../../convert/glob.js';
import { LABEL_ZONE, type KubeEndpointSlice, type KubeMeta, type KubeNode, type KubeService } from '../../convert/kube-objects.js';
import { convertService, isServiceSelected } from '../../convert/service.js';
import { encodeService } from '../../gojson.js';
import { silentLogger, type Logger } from '../../log.js';
import { flat, Store, type State } from '../../state.js';

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

/** What is kept of a Service. */
interface ServiceEntry {
  /** Converted and encoded (gojson `encodeService`), not yet in the store (the next state puts it there). */
  json: string | undefined;
  /** Why it does not convert (logged by each state that recomputes it; what was published stays). */
  error: string | undefined;
  policies: Policies;
}

/**
 * The index of what the API told us, and the state computed from it. Every
 * `set*`/`delete*` returns whether the state may have changed (then call
 * {@link state} once the change set is complete: a re-list's objects arrive
 * one by one, and a state built from part of them never existed).
 */
export class NodeView {
  private readonly log: Logger;
  private readonly services = new Map<string, ServiceEntry>();
  /** Service path -> its slices by slice name. */
  private readonly slicesByService = new Map<string, Map<string, CompiledSlice>>();
  /** Slice path -> the path of the Service it is filed under. */
  private readonly sliceOwner = new Map<string, string>();
  private nodeZone: string | undefined;
  /** This node's Node object is known (listed or watched, not deleted since). */
  private nodeFound = false;
  private readonly store = new Store();
  /** Service paths to recompute. */
  private readonly dirty = new Set<string>();

  constructor(private readonly options: NodeViewOptions) {
    this.log = options.logger ?? silentLogger;
  }

  /** Whether this node's Node object exists in the API (as far as the watch knows). */
  get nodeKnown(): boolean {
    return this.nodeFound;
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
    return this.stageService(svc)();
  }

  /**
   * `setService` in two steps: the Service is converted now, and the
   * returned function sets it (and returns what `setService` would). What is
   * kept in between is the conversion, not the object: a re-list stages its
   * objects as they are read, and sets them all once it is complete.
   */
  stageService(svc: KubeService): () => boolean {
    const path = pathOf(svc);
    if (!isServiceSelected(svc, this.options.serviceProxyName)) return () => this.forgetService(path);
    const entry: ServiceEntry = { json: undefined, error: undefined, policies: { internalLocal: false, externalLocal: false } };
    try {
      entry.json = flat(encodeService(convertService(svc, { labels: this.options.labels, annotations: this.options.annotations })));
      entry.policies = policiesOf(svc);
    } catch (err) {
      entry.error = (err as Error).message;
    }
    return () => {
      const had = this.services.get(path);
      this.services.set(path, entry);
      // The same for this node as what the store holds (an update of its status, or of what is not sent; every
      // Service of a re-list after a storage migration): nothing to recompute, and no copy of its line made.
      const same = had !== undefined && had.json === undefined && had.error === undefined && entry.error === undefined && had.policies === entry.policies;
      if (same && entry.json === this.store.serviceJson(path)) {
        entry.json = undefined;
        return false;
      }
      this.dirty.add(path);
      return true;
    };
  }

  deleteService(svc: KubeService): boolean {
    return this.forgetService(pathOf(svc));
  }

  private forgetService(path: string): boolean {
    if (!this.services.delete(path)) return false;
    this.dirty.add(path);
    return true;
  }

  /** An EndpointSlice added or updated: filed under the Service its label names (moved when that changes). */
  setSlice(slice: KubeEndpointSlice): boolean {
    return this.stageSlice(slice)();
  }

  /**
   * `setSlice` in two steps (see `stageService`): the slice is compiled now
   * (for the node, against the slice as filed now), and the returned
   * function files it.
   */
  stageSlice(slice: KubeEndpointSlice): () => boolean {
    const svcName = sliceServiceName(slice);
    const owner = svcName ? `${slice.metadata?.namespace ?? ''}/${svcName}` : undefined;
    const key = pathOf(slice);
    const name = slice.metadata?.name ?? '';
    let compiled: CompiledSlice | undefined;
    if (owner !== undefined) {
      const before = this.sliceOwner.get(key);
      compiled = compileSlice(slice, this.options.nodeName, before !== undefined ? this.slicesByService.get(before)?.get(name) : undefined);
    }
    return () => this.fileSlice(key, name, owner, compiled);
  }

  deleteSlice(slice: KubeEndpointSlice): boolean {
    return this.fileSlice(pathOf(slice), slice.metadata?.name ?? '', undefined, undefined);
  }

  /**
   * Files the slice `key` (named `name`), compiled as `compiled`, under the
   * Service `owner` (undefined: under none), marking the Services it leaves
   * and joins; an update that changes nothing this node sees marks none.
   */
  private fileSlice(key: string, name: string, owner: string | undefined, compiled: CompiledSlice | undefined): boolean {
    const before = this.sliceOwner.get(key);
    const old = before !== undefined ? this.slicesByService.get(before)?.get(name) : undefined;
    let changed = false;
    if (before !== undefined && before !== owner) {
      const group = this.slicesByService.get(before);
      group?.delete(name);
      if (group?.size === 0) this.slicesByService.delete(before);
      this.sliceOwner.delete(key);
      this.dirty.add(before);
      changed = true;
    }
    if (owner !== undefined && compiled !== undefined) {
      if (before === owner && old !== undefined && sameSlice(old, compiled)) return false;
      let group = this.slicesByService.get(owner);
      if (!group) this.slicesByService.set(owner, (group = new Map()));
      group.set(name, compiled);
      this.sliceOwner.set(key, owner);
      this.dirty.add(owner);
      changed = true;
    }
    return changed;
  }

  /** A Node added or updated: only this node's zone matters (other nodes are ignored). */
  setNode(node: KubeNode): boolean {
    if (node.metadata?.name === this.options.nodeName) this.nodeFound = true;
    return this.nodeZoneIs(node, node.metadata?.labels?.[LABEL_ZONE]);
  }

  deleteNode(node: KubeNode): boolean {
    if (node.metadata?.name === this.options.nodeName) this.nodeFound = false;
    return this.nodeZoneIs(node, undefined);
  }

  private nodeZoneIs(node: KubeNode, zone: string | undefined): boolean {
    const { nodeName } = this.options;
    if (node.metadata?.name !== nodeName || zone === this.nodeZone) return false;
    this.log.info(zone !== undefined ? `node ${nodeName}: zone ${zone}` : `node ${nodeName}: no zone`);
    this.nodeZone = zone;
    // What the node sees of slices with topology hints depends on the zone.
    for (const [path, group] of this.slicesByService) {
      for (const s of group.values()) {
        if (s.zoned) {
          this.dirty.add(path);
          break;
        }
      }
    }
    return true;
  }

  /** The node-local state: recomputes the Services changed since the last call. */
  state(): State {
    for (const p of this.dirty) this.rebuild(p);
    this.dirty.clear();
    return this.store.snapshot();
  }

  /** Recomputes one Service and its endpoints in the store. A malformed object is logged and left out; the others stay. */
  private rebuild(path: string): void {
    const svc = this.services.get(path);
    if (!svc) {
      this.store.deleteService(path);
      this.store.setEndpointsJson(path, []);
      return;
    }
    if (svc.error !== undefined) {
      // Keep what we had.
      this.log.error(`service ${path}: cannot convert: ${svc.error}`);
      return;
    }
    const group = this.slicesByService.get(path);
    let eps: string[];
    try {
      eps = nodeEndpointJsons(group ? [...group.values()] : [], svc.policies, this.nodeZone, (i, err) => {
        // The slice's path: its namespace is its Service's.
        const name = [...group!.keys()][i];
        this.log.error(`endpointslice ${path.slice(0, path.indexOf('/'))}/${name}: cannot convert: ${err.message}`);
      });
    } catch (err) {
      this.log.error(`service ${path}: cannot compute endpoints: ${(err as Error).message}`);
      return;
    }
    if (svc.json !== undefined) {
      this.store.setServiceJson(path, svc.json);
      svc.json = undefined;
    }
    // An endpoint's JSON shares the compiled slice's strings (`head + tail` is a pair of them, not a copy).
    this.store.setEndpointsJson(path, eps);
  }
}
