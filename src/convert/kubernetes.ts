/**
 * Kubernetes objects (Service, discovery.k8s.io/v1 EndpointSlice, Node) ->
 * the node-local model, as kpng's controller and server build it for one
 * node: a whole set of objects at once (replay's manifests, tests). The rules
 * for one Service and for one Service's slices are in service.ts and
 * endpoints.ts; field reading in fields.ts.
 *
 * This module is also where the sources take the conversion from: it
 * re-exports what the Kubernetes API source uses, so the split of convert/
 * stays its own business.
 */
import type { Service } from '../model.js';
import { Store, type State } from '../state.js';
import { convertEndpoints, sliceServiceName } from './endpoints.js';
import { ConversionError, describeValue } from './fields.js';
import { LABEL_SERVICE_NAME, LABEL_ZONE, labelsOf, objectKey, type KubeEndpointSlice, type KubeNode, type KubeService } from './kube-objects.js';
import { convertService, isServiceSelected, notSelectedReason, type ServiceOptions } from './service.js';


/** What a plain object is, for `convertObjects`. */
type ObjectKind = 'Service' | 'EndpointSlice' | 'Node' | 'other';

/** Classifies an object by apiVersion and kind (only discovery.k8s.io/v1 EndpointSlices are used). */
function kindOf(o: { apiVersion?: unknown; kind?: unknown }): ObjectKind {
  if (o.kind === 'Service' && o.apiVersion === 'v1') return 'Service';
  if (o.kind === 'Node' && o.apiVersion === 'v1') return 'Node';
  if (o.kind === 'EndpointSlice' && o.apiVersion === 'discovery.k8s.io/v1') return 'EndpointSlice';
  return 'other';
}

/** Options of `convertObjects`. */
export interface ConvertOptions extends ServiceOptions {
  /** Endpoints on this node are `Local`; its Node object (if given) gives the zone. */
  nodeName: string;
  /** The node's zone; overrides the zone label of a Node object in the input. */
  nodeZone?: string | undefined;
  /** kpng `--service-proxy-name`; see `isServiceSelected`. */
  serviceProxyName?: string | undefined;
  /**
   * Told about each object that does not make it into the state: other
   * kinds, unselected Services, slices without a Service. `index` is the
   * object's index in the input.
   */
  onSkip?: ((index: number, message: string, level: 'info' | 'debug') => void) | undefined;
}

/** `apps/v1 Deployment default/web`, from whatever an object has (for skip messages; never throws). */
function describeObject(o: { apiVersion?: unknown; kind?: unknown; metadata?: unknown }): string {
  const m = o.metadata && typeof o.metadata === 'object' ? (o.metadata as Record<string, unknown>) : {};
  const name = typeof m.name === 'string' ? m.name : '(no name)';
  const ns = typeof m.namespace === 'string' ? m.namespace + '/' : '';
  const kind = typeof o.kind === 'string' ? o.kind : '(no kind)';
  const api = typeof o.apiVersion === 'string' ? o.apiVersion + ' ' : '';
  return `${api}${kind} ${ns}${name}`;
}

/** A slice and where it was in `convertObjects`' input. */
interface IndexedSlice {
  slice: KubeEndpointSlice;
  index: number;
}

/**
 * A whole set of objects -> the node-local state, built through a `Store`
 * so the order equals the live sources'. Services, EndpointSlices and Nodes
 * are used; other kinds are reported through `onSkip`. A later object with
 * the same namespace/name replaces an earlier one. Throws `ConversionError`
 * with `index` set to the offending object.
 */
export function convertObjects(objects: readonly unknown[], opts: ConvertOptions): State {
  const services = new Map<string, { svc: KubeService; model: Service }>();
  const slices = new Map<string, Map<string, IndexedSlice>>();
  let nodeZone = opts.nodeZone;
  const skip = opts.onSkip ?? (() => {});
  objects.forEach((o, index) => {
    try {
      if (o === null || typeof o !== 'object' || Array.isArray(o)) throw new ConversionError([], `expected a Kubernetes object, got ${describeValue(o)}`);
      const k = kindOf(o);
      if (k === 'other') {
        skip(index, `ignoring ${describeObject(o)}: not a v1 Service, discovery.k8s.io/v1 EndpointSlice or v1 Node`, 'info');
        return;
      }
      const { namespace, name } = objectKey(o);
      if (k === 'Node') {
        if (opts.nodeZone === undefined && name === opts.nodeName) nodeZone = labelsOf(o as KubeNode)?.[LABEL_ZONE];
      } else if (k === 'Service') {
        const svc = o as KubeService;
        const model = convertService(svc, opts); // checks it even when not selected
        if (!isServiceSelected(svc, opts.serviceProxyName)) {
          skip(index, `skipping Service ${namespace}/${name}: ${notSelectedReason(svc, opts.serviceProxyName)}`, 'info');
          return;
        }
        services.set(`${namespace}/${name}`, { svc, model });
      } else {
        const slice = o as KubeEndpointSlice;
        const svcName = sliceServiceName(slice);
        if (!svcName) {
          skip(index, `ignoring EndpointSlice ${namespace}/${name}: no ${LABEL_SERVICE_NAME} label`, 'debug');
          return;
        }
        const path = `${namespace}/${svcName}`;
        let m = slices.get(path);
        if (!m) slices.set(path, (m = new Map()));
        m.set(name, { slice, index });
      }
    } catch (err) {
      if (err instanceof ConversionError && err.index === undefined) err.index = index;
      throw err;
    }
  });
  const store = new Store();
  const node = { nodeName: opts.nodeName, nodeZone };
  const endpointsOf = (svc: KubeService, group: Map<string, IndexedSlice>) => {
    const list = [...group.values()];
    try {
      return convertEndpoints(svc, list.map((x) => x.slice), node);
    } catch (err) {
      // convertEndpoints numbers the slices of this group; the caller wants the input's numbering.
      if (err instanceof ConversionError && err.index !== undefined) err.index = list[err.index]!.index;
      throw err;
    }
  };
  for (const [path, { svc, model }] of services) {
    store.setService(path, model);
    const group = slices.get(path);
    if (!group) continue;
    slices.delete(path);
    for (const [key, json] of endpointsOf(svc, group)) store.setEndpointJson(`${path}/${key}`, json);
  }
  for (const [path, group] of slices) {
    endpointsOf({}, group); // type-checks them all the same
    for (const { index } of group.values()) skip(index, `ignoring EndpointSlice for ${path}: no such Service (or not selected)`, 'debug');
  }
  return store.snapshot();
}
