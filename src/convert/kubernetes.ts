/**
 * Kubernetes objects (Service, discovery.k8s.io/v1 EndpointSlice, Node) ->
 * the node-local model, as kpng's controller (server/jobs/kube2store) and
 * server (server/pkg/endpoints, store2localdiff) build it for one node. Shared
 * by replay (manifests) and the Kubernetes API source.
 *
 * Input is plain object JSON as the API serves it (or as
 * @kubernetes/client-node hands it over): every field optional, `null`
 * allowed where the API may send it. Fields that are read are type-checked;
 * a wrong type throws a `ConversionError` naming the field's path, so replay
 * can point at the line and the API source can log and skip the object.
 *
 * Where kpng relies on the API server's defaults, the same defaults apply
 * here, so hand-written manifests convert like the objects the API server
 * would return for them: namespace `default`, type `ClusterIP`, protocol TCP,
 * targetPort = port, ClientIP affinity timeout 10800 s.
 */
import { marshalEndpoint } from '../codec.js';
import { encodeEndpoint } from '../gojson.js';
import type { Endpoint, IPSet, PortMapping, PortName, Service } from '../model.js';
import { Store, comparePaths, type State } from '../state.js';
import { filterMap, type GlobFilter } from './glob.js';
import { addIP, ipSet } from './ip.js';
import { xxh64 } from './xxhash.js';

/** Label naming the proxy that handles a Service (kube-proxy and kpng skip others). */
export const LABEL_SERVICE_PROXY_NAME = 'service.kubernetes.io/service-proxy-name';
/** Label that kube-proxy and kpng also exclude (`v1.IsHeadlessService`). */
export const LABEL_HEADLESS = 'service.kubernetes.io/headless';
/** Label tying an EndpointSlice to its Service. */
const LABEL_SERVICE_NAME = 'kubernetes.io/service-name';
/** Node label giving the node's zone (topology hints). */
export const LABEL_ZONE = 'topology.kubernetes.io/zone';
/** Kubernetes' default ClientIP session affinity timeout. */
const DEFAULT_AFFINITY_TIMEOUT = 10800;

// ---------------------------------------------------------------- input types

/** The metadata fields read here. */
export interface KubeMeta {
  name?: string | null;
  namespace?: string | null;
  labels?: Record<string, string> | null;
  annotations?: Record<string, string> | null;
}

/** One entry of a Service's `spec.ports`. */
export interface KubeServicePort {
  name?: string | null;
  protocol?: string | null;
  port?: number | null;
  nodePort?: number | null;
  /** IntOrString: a number is a port, a string a container port name. */
  targetPort?: number | string | null;
}

/** A core/v1 Service (the fields read here). */
export interface KubeService {
  apiVersion?: string;
  kind?: string;
  metadata?: KubeMeta | null;
  spec?: {
    type?: string | null;
    clusterIP?: string | null;
    clusterIPs?: string[] | null;
    externalIPs?: string[] | null;
    loadBalancerSourceRanges?: string[] | null;
    ports?: KubeServicePort[] | null;
    externalTrafficPolicy?: string | null;
    internalTrafficPolicy?: string | null;
    sessionAffinity?: string | null;
    sessionAffinityConfig?: { clientIP?: { timeoutSeconds?: number | null } | null } | null;
    healthCheckNodePort?: number | null;
  } | null;
  status?: { loadBalancer?: { ingress?: Array<{ ip?: string | null; hostname?: string | null }> | null } | null } | null;
}

/** One endpoint of a discovery.k8s.io/v1 EndpointSlice (the fields read here). */
export interface KubeSliceEndpoint {
  addresses?: string[] | null;
  conditions?: { ready?: boolean | null; serving?: boolean | null; terminating?: boolean | null } | null;
  hostname?: string | null;
  nodeName?: string | null;
  zone?: string | null;
  hints?: { forZones?: Array<{ name?: string | null }> | null } | null;
  targetRef?: { kind?: string | null; name?: string | null; namespace?: string | null } | null;
}

/** A discovery.k8s.io/v1 EndpointSlice (the fields read here). */
export interface KubeEndpointSlice {
  apiVersion?: string;
  kind?: string;
  metadata?: KubeMeta | null;
  addressType?: string | null;
  endpoints?: KubeSliceEndpoint[] | null;
  ports?: Array<{ name?: string | null; port?: number | null; protocol?: string | null }> | null;
}

/** A core/v1 Node (only its name and zone label are read). */
export interface KubeNode {
  apiVersion?: string;
  kind?: string;
  metadata?: KubeMeta | null;
}

// ---------------------------------------------------------------- errors

/** A path into an object: keys and array indexes (`['spec', 'ports', 0, 'port']`). */
export type FieldPath = ReadonlyArray<string | number>;

/** A field has the wrong type or a required one is missing. */
export class ConversionError extends Error {
  /** Where in the object (for replay: turned into line and column). */
  readonly path: FieldPath;
  /** Which object of `convertObjects`' input, when known. */
  index: number | undefined;
  /** The reason without the path. */
  readonly reason: string;
  constructor(path: FieldPath, reason: string, index?: number) {
    super(`${formatPath(path)}: ${reason}`);
    this.name = 'ConversionError';
    this.path = path;
    this.reason = reason;
    this.index = index;
  }
}

/** `spec.ports[0].port` */
export function formatPath(path: FieldPath): string {
  let s = '';
  for (const p of path) s += typeof p === 'number' ? `[${p}]` : s === '' ? p : '.' + p;
  return s === '' ? '(object)' : s;
}

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'object') return 'an object';
  if (typeof v === 'string') return JSON.stringify(v);
  return String(v);
}

type P = Array<string | number>;

// Typed readers: undefined/null read as absent; a wrong type throws with the field's path.
function obj(v: unknown, path: P): Record<string, unknown> | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'object' || Array.isArray(v)) throw new ConversionError(path, `expected an object, got ${describe(v)}`);
  return v as Record<string, unknown>;
}

function list(v: unknown, path: P): readonly unknown[] | undefined {
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v)) throw new ConversionError(path, `expected a list, got ${describe(v)}`);
  return v;
}

function str(v: unknown, path: P): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') throw new ConversionError(path, `expected a string, got ${describe(v)}`);
  return v;
}

function int32(v: unknown, path: P): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < -(2 ** 31) || v >= 2 ** 31) {
    throw new ConversionError(path, `expected an integer, got ${describe(v)}`);
  }
  return v;
}

function bool(v: unknown, path: P): boolean | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw new ConversionError(path, `expected true or false, got ${describe(v)}`);
  return v;
}

function strList(v: unknown, path: P): string[] | undefined {
  const l = list(v, path);
  if (!l) return undefined;
  for (let i = 0; i < l.length; i++) str(l[i], [...path, i]);
  return l as string[];
}

function strMap(v: unknown, path: P): Record<string, string> | undefined {
  const o = obj(v, path);
  if (o) for (const [k, x] of Object.entries(o)) if (typeof x !== 'string') throw new ConversionError([...path, k], `expected a string, got ${describe(x)}`);
  return o as Record<string, string> | undefined;
}

function meta(o: { metadata?: unknown }): Record<string, unknown> | undefined {
  return obj(o.metadata, ['metadata']);
}

function labelsOf(o: { metadata?: unknown }): Record<string, string> | undefined {
  return strMap(meta(o)?.labels, ['metadata', 'labels']);
}

/** `metadata.namespace` (default `default`, as `kubectl apply` in the default context) and `metadata.name` (required). */
function objectKey(o: { metadata?: unknown }): { namespace: string; name: string } {
  const m = meta(o);
  const name = str(m?.name, ['metadata', 'name']);
  if (!name) throw new ConversionError(['metadata', 'name'], 'missing name');
  const namespace = str(m?.namespace, ['metadata', 'namespace']) || 'default';
  return { namespace, name };
}

// ---------------------------------------------------------------- services

/**
 * kube-proxy's (and kpng's) rule for which Services a proxy handles: with a
 * proxy name, those labelled `service.kubernetes.io/service-proxy-name: NAME`;
 * without, those without that label. Services labelled
 * `service.kubernetes.io/headless` are never handled.
 */
export function isServiceSelected(svc: KubeService, serviceProxyName?: string): boolean {
  const labels = labelsOf(svc);
  if (labels && Object.prototype.hasOwnProperty.call(labels, LABEL_HEADLESS)) return false;
  const proxy = labels && Object.prototype.hasOwnProperty.call(labels, LABEL_SERVICE_PROXY_NAME) ? labels[LABEL_SERVICE_PROXY_NAME] : undefined;
  return serviceProxyName ? proxy === serviceProxyName : proxy === undefined;
}

/** Options of `convertService`. */
export interface ServiceOptions {
  /** Labels to send (kpng `--with-service-labels`); none when undefined. */
  labels?: GlobFilter | undefined;
  /** Annotations to send (kpng `--with-service-annotations`); none when undefined. */
  annotations?: GlobFilter | undefined;
}

const protocols: Record<string, number> = { TCP: 1, UDP: 2, SCTP: 3 };

/** A Kubernetes Service as kpng's controller models it. Throws `ConversionError`. */
export function convertService(svc: KubeService, opts: ServiceOptions = {}): Service {
  const { namespace, name } = objectKey(svc);
  const m = meta(svc);
  const spec = obj(svc.spec, ['spec']) ?? {};
  const type = str(spec.type, ['spec', 'type']) || 'ClusterIP';
  const out: Service = { Namespace: namespace, Name: name, Type: type };

  const labels = filterMap(strMap(m?.labels, ['metadata', 'labels']), opts.labels);
  if (labels) out.Labels = labels;
  const annotations = filterMap(strMap(m?.annotations, ['metadata', 'annotations']), opts.annotations);
  if (annotations) out.Annotations = annotations;

  // ClusterIPs is always present ({} for headless and ExternalName); clusterIP for pre-dual-stack objects.
  let clusterIPs = strList(spec.clusterIPs, ['spec', 'clusterIPs']);
  if (!clusterIPs || clusterIPs.length === 0) {
    const one = str(spec.clusterIP, ['spec', 'clusterIP']);
    clusterIPs = one ? [one] : [];
  }
  const cips: IPSet = {};
  let headless = false;
  for (const ip of clusterIPs) {
    if (ip === 'None') headless = true;
    else addIP(cips, ip);
  }
  out.IPs = { ClusterIPs: cips, ExternalIPs: ipSet(strList(spec.externalIPs, ['spec', 'externalIPs'])) };
  const status = obj(svc.status, ['status']);
  const lb = obj(status?.loadBalancer, ['status', 'loadBalancer']);
  const ingress = list(lb?.ingress, ['status', 'loadBalancer', 'ingress']);
  if (ingress && ingress.length > 0) {
    const lbs: IPSet = {};
    ingress.forEach((ing, i) => {
      const ip = str(obj(ing, ['status', 'loadBalancer', 'ingress', i])?.ip, ['status', 'loadBalancer', 'ingress', i, 'ip']);
      if (ip) addIP(lbs, ip);
    });
    out.IPs.LoadBalancerIPs = lbs;
  }
  if (headless) out.IPs.Headless = true;

  const ranges = strList(spec.loadBalancerSourceRanges, ['spec', 'loadBalancerSourceRanges']);
  if (ranges && ranges.length > 0) out.IPFilters = [{ SourceRanges: [...ranges] }];

  const ports = list(spec.ports, ['spec', 'ports']) ?? [];
  out.Ports = ports.map((p, i): PortMapping => {
    const path: P = ['spec', 'ports', i];
    const po = obj(p, path) ?? {};
    const port = int32(po.port, [...path, 'port']);
    const proto = str(po.protocol, [...path, 'protocol']) || 'TCP';
    const pm: PortMapping = {};
    const pname = str(po.name, [...path, 'name']);
    if (pname) pm.Name = pname;
    pm.Protocol = protocols[proto] ?? 0;
    if (port) pm.Port = port;
    const nodePort = int32(po.nodePort, [...path, 'nodePort']);
    if (nodePort) pm.NodePort = nodePort;
    const tp = po.targetPort;
    if (tp === undefined || tp === null) {
      if (port) pm.TargetPort = port;
    } else if (typeof tp === 'string') {
      if (tp) pm.TargetPortName = tp;
    } else {
      const n = int32(tp, [...path, 'targetPort']);
      if (n) pm.TargetPort = n;
    }
    return pm;
  });

  if (str(spec.externalTrafficPolicy, ['spec', 'externalTrafficPolicy']) === 'Local') out.ExternalTrafficToLocal = true;
  if (str(spec.internalTrafficPolicy, ['spec', 'internalTrafficPolicy']) === 'Local') out.InternalTrafficToLocal = true;

  if (str(spec.sessionAffinity, ['spec', 'sessionAffinity']) === 'ClientIP') {
    const cfg = obj(spec.sessionAffinityConfig, ['spec', 'sessionAffinityConfig']);
    const cip = obj(cfg?.clientIP, ['spec', 'sessionAffinityConfig', 'clientIP']);
    const t = int32(cip?.timeoutSeconds, ['spec', 'sessionAffinityConfig', 'clientIP', 'timeoutSeconds']);
    out.SessionAffinity = { ClientIP: { TimeoutSeconds: t ?? DEFAULT_AFFINITY_TIMEOUT } };
  }
  const hc = int32(spec.healthCheckNodePort, ['spec', 'healthCheckNodePort']);
  if (hc) out.HealthCheckNodePort = hc;
  return out;
}

// ---------------------------------------------------------------- endpoints

/** Which node the endpoints are computed for. */
export interface NodeOptions {
  /** Endpoints on this node are `Local`. */
  nodeName: string;
  /**
   * The node's zone (`topology.kubernetes.io/zone` of its Node object);
   * undefined when the node is unknown: then endpoints with zone hints are
   * not sent, as kpng does.
   */
  nodeZone?: string | undefined;
}

/** The name of the Service an EndpointSlice belongs to (its `kubernetes.io/service-name` label), or undefined. */
export function sliceServiceName(slice: KubeEndpointSlice): string | undefined {
  return labelsOf(slice)?.[LABEL_SERVICE_NAME] || undefined;
}

/**
 * The path key of an endpoint under its Service: kpng's endpoint hash from
 * before it keyed endpoints by pod name (Oct 2021, the build of the blog
 * post): XXH64 of the protobuf encoding of the endpoint's Hostname, IPs and
 * Local, in hex. It orders the blog example exactly as the post shows, and
 * keeps both entries of a dual-stack pod (keying by pod name loses one).
 */
export function endpointKey(ep: Endpoint): string {
  // Only the fields kpng hashed, and only when set: proto3 leaves zero values off the wire.
  return xxh64(
    marshalEndpoint({
      ...(ep.Hostname ? { Hostname: ep.Hostname } : {}),
      ...(ep.IPs ? { IPs: ep.IPs } : {}),
      ...(ep.Local ? { Local: true } : {}),
    }),
  ).toString(16);
}

function sliceEndpoints(
  slice: KubeEndpointSlice,
  itl: boolean,
  etl: boolean,
  node: NodeOptions,
  add: (ep: Endpoint) => void,
): void {
  const eps = list(slice.endpoints, ['endpoints']);
  if (!eps || eps.length === 0) return;
  // One PortOverrides list per slice, shared by its endpoints (never mutated).
  const ports = list(slice.ports, ['ports']) ?? [];
  const overrides: PortName[] = ports.map((p, i) => {
    const po = obj(p, ['ports', i]) ?? {};
    const pn: PortName = {};
    const name = str(po.name, ['ports', i, 'name']);
    if (name) pn.Name = name;
    const port = int32(po.port, ['ports', i, 'port']);
    if (port) pn.Port = port;
    return pn;
  });
  for (let i = 0; i < eps.length; i++) {
    const path: P = ['endpoints', i];
    const e = obj(eps[i], path) ?? {};
    const cond = obj(e.conditions, [...path, 'conditions']);
    // A missing ready condition counts as ready; not-ready endpoints never reach a node.
    if (bool(cond?.ready, [...path, 'conditions', 'ready']) === false) continue;
    const hints = obj(e.hints, [...path, 'hints']);
    const zones = list(hints?.forZones, [...path, 'hints', 'forZones']);
    if (zones && zones.length > 0) {
      let forNode = false;
      zones.forEach((z, zi) => {
        const zn = str(obj(z, [...path, 'hints', 'forZones', zi])?.name, [...path, 'hints', 'forZones', zi, 'name']) ?? '';
        if (node.nodeZone !== undefined && zn === node.nodeZone) forNode = true;
      });
      if (!forNode) continue;
    }
    const nodeName = str(e.nodeName, [...path, 'nodeName']);
    const local = node.nodeName !== '' && nodeName === node.nodeName;
    const internal = local || !itl;
    const external = local || !etl;
    if (!internal && !external) continue;
    const ep: Endpoint = {};
    const hostname = str(e.hostname, [...path, 'hostname']);
    if (hostname) ep.Hostname = hostname;
    const addrs = strList(e.addresses, [...path, 'addresses']);
    if (addrs && addrs.length > 0) {
      // As kpng: the set is present even when no address parses.
      ep.IPs = {};
      for (const a of addrs) addIP(ep.IPs, a);
    }
    if (local) ep.Local = true;
    if (overrides.length > 0) ep.PortOverrides = overrides;
    ep.Scopes = {};
    if (internal) ep.Scopes.Internal = true;
    if (external) ep.Scopes.External = true;
    add(ep);
  }
}

/**
 * The endpoints one node sees for a Service, from all the EndpointSlices of
 * that Service (the caller groups slices by their `kubernetes.io/service-name`
 * label; see `sliceServiceName`). Applies kpng's node-local rules: not-ready
 * endpoints dropped (missing ready = ready), `Local` = on `nodeName`, Scopes
 * from the traffic policies (both false: dropped), zone hints, identical
 * endpoints collapsed (even across slices).
 *
 * Returns `[key, endpoint]` pairs in path order; store each at
 * `namespace/name/key` (`Store.setEndpoint`). The key is `endpointKey`; when
 * two different endpoints share it (same hostname, IPs and locality but e.g.
 * different ports), both get `-` and the hash of their full encoding appended.
 * Throws `ConversionError` (with `index` = the slice's index in `slices`).
 */
export function convertEndpoints(svc: KubeService, slices: readonly KubeEndpointSlice[], opts: NodeOptions): Array<[key: string, endpoint: Endpoint]> {
  const spec = obj(svc.spec, ['spec']);
  const itl = spec?.internalTrafficPolicy === 'Local';
  const etl = spec?.externalTrafficPolicy === 'Local';
  const unique = new Map<string, Endpoint>();
  slices.forEach((slice, si) => {
    try {
      sliceEndpoints(slice, itl, etl, opts, (ep) => {
        const json = encodeEndpoint(ep);
        if (!unique.has(json)) unique.set(json, ep);
      });
    } catch (err) {
      if (err instanceof ConversionError) err.index = si;
      throw err;
    }
  });
  const byKey = new Map<string, Array<[string, Endpoint]>>();
  for (const [json, ep] of unique) {
    const k = endpointKey(ep);
    const g = byKey.get(k);
    if (g) g.push([json, ep]);
    else byKey.set(k, [[json, ep]]);
  }
  const out: Array<[string, Endpoint]> = [];
  for (const [k, g] of byKey) {
    if (g.length === 1) out.push([k, g[0]![1]]);
    else for (const [json, ep] of g) out.push([k + '-' + xxh64(Buffer.from(json, 'utf8')).toString(16), ep]);
  }
  out.sort((a, b) => comparePaths(a[0], b[0]));
  return out;
}

// ---------------------------------------------------------------- whole sets

/** What a plain object is, for `convertObjects`. */
export type ObjectKind = 'Service' | 'EndpointSlice' | 'Node' | 'other';

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
  onSkip?: (index: number, message: string, level: 'info' | 'debug') => void;
}

function describeObject(o: { apiVersion?: unknown; kind?: unknown; metadata?: unknown }): string {
  const m = o.metadata && typeof o.metadata === 'object' ? (o.metadata as Record<string, unknown>) : {};
  const name = typeof m.name === 'string' ? m.name : '(no name)';
  const ns = typeof m.namespace === 'string' ? m.namespace + '/' : '';
  const kind = typeof o.kind === 'string' ? o.kind : '(no kind)';
  const api = typeof o.apiVersion === 'string' ? o.apiVersion + ' ' : '';
  return `${api}${kind} ${ns}${name}`;
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
  const slices = new Map<string, Map<string, { slice: KubeEndpointSlice; index: number }>>();
  let nodeZone = opts.nodeZone;
  const skip = opts.onSkip ?? (() => {});
  objects.forEach((o, index) => {
    try {
      if (o === null || typeof o !== 'object' || Array.isArray(o)) throw new ConversionError([], `expected a Kubernetes object, got ${describe(o)}`);
      const k = kindOf(o as KubeService);
      if (k === 'other') {
        skip(index, `ignoring ${describeObject(o as KubeService)}: not a v1 Service, discovery.k8s.io/v1 EndpointSlice or v1 Node`, 'info');
        return;
      }
      const { namespace, name } = objectKey(o as KubeService);
      if (k === 'Node') {
        if (opts.nodeZone === undefined && name === opts.nodeName) nodeZone = labelsOf(o as KubeNode)?.[LABEL_ZONE] ?? '';
      } else if (k === 'Service') {
        const svc = o as KubeService;
        const model = convertService(svc, opts); // checks it even when not selected
        if (!isServiceSelected(svc, opts.serviceProxyName)) {
          const proxy = labelsOf(svc)?.[LABEL_SERVICE_PROXY_NAME];
          const why =
            labelsOf(svc)?.[LABEL_HEADLESS] !== undefined
              ? `it is labelled ${LABEL_HEADLESS}`
              : proxy !== undefined
                ? `it is labelled ${LABEL_SERVICE_PROXY_NAME}=${proxy}` + (opts.serviceProxyName ? '' : ` (use --service-proxy-name ${proxy})`)
                : `it is not labelled ${LABEL_SERVICE_PROXY_NAME}=${opts.serviceProxyName}`;
          skip(index, `skipping Service ${namespace}/${name}: ${why}`, 'info');
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
  const endpointsOf = (svc: KubeService, group: Map<string, { slice: KubeEndpointSlice; index: number }>) => {
    const list = [...group.values()];
    try {
      return convertEndpoints(svc, list.map((x) => x.slice), node);
    } catch (err) {
      if (err instanceof ConversionError && err.index !== undefined) err.index = list[err.index]!.index;
      throw err;
    }
  };
  for (const [path, { svc, model }] of services) {
    store.setService(path, model);
    const group = slices.get(path);
    if (!group) continue;
    slices.delete(path);
    for (const [key, ep] of endpointsOf(svc, group)) store.setEndpoint(`${path}/${key}`, ep);
  }
  for (const [path, group] of slices) {
    endpointsOf({}, group); // type-checks them all the same
    for (const { index } of group.values()) skip(index, `ignoring EndpointSlice for ${path}: no such Service (or not selected)`, 'debug');
  }
  return store.snapshot();
}
