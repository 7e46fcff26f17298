/**
 * EndpointSlices -> the endpoints one node sees for a Service, as kpng's
 * server (server/pkg/endpoints, store2localdiff) computes them for a node,
 * and the key each endpoint is stored under.
 */
import { marshalEndpoint } from '../codec.js';
import { encodeEndpoint } from '../gojson.js';
import type { Endpoint, PortName } from '../model.js';
import { comparePaths } from '../state.js';
import { ConversionError, Fields } from './fields.js';
import { addIP } from './ip.js';
import { LABEL_SERVICE_NAME, labelsOf, type KubeEndpointSlice, type KubeService } from './kube-objects.js';
import { xxh64 } from './xxhash.js';

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
function endpointKey(ep: Endpoint): string {
  // Only the fields kpng hashed, and only when set: proto3 leaves zero values off the wire.
  const hashed: Endpoint = {};
  if (ep.Hostname) hashed.Hostname = ep.Hostname;
  if (ep.IPs) hashed.IPs = ep.IPs;
  if (ep.Local) hashed.Local = true;
  return xxh64(marshalEndpoint(hashed)).toString(16);
}

/** The traffic policies of a Service that decide an endpoint's scopes. */
interface Policies {
  internalLocal: boolean;
  externalLocal: boolean;
}

/** The endpoints of one slice that reach `node`, in slice order. */
function sliceEndpoints(slice: KubeEndpointSlice, policies: Policies, node: NodeOptions, add: (ep: Endpoint) => void): void {
  const s = Fields.orEmpty(slice, []);
  const eps = s.list('endpoints');
  if (!eps || eps.length === 0) return;
  // One PortOverrides list per slice, shared by its endpoints (never mutated).
  const overrides: PortName[] =
    s.map('ports', (v, path) => {
      const p = Fields.orEmpty(v, path);
      const pn: PortName = {};
      const name = p.string('name');
      if (name) pn.Name = name;
      const port = p.int32('port');
      if (port) pn.Port = port;
      return pn;
    }) ?? [];
  eps.forEach((v, i) => {
    const e = Fields.orEmpty(v, s.at('endpoints', i));
    // A missing ready condition counts as ready; not-ready endpoints never reach a node.
    if (e.object('conditions')?.bool('ready') === false) return;
    const zones = e.object('hints')?.map('forZones', (z, path) => Fields.orEmpty(z, path).string('name') ?? '');
    if (zones && zones.length > 0 && !(node.nodeZone !== undefined && zones.includes(node.nodeZone))) return;
    const local = node.nodeName !== '' && e.string('nodeName') === node.nodeName;
    const internal = local || !policies.internalLocal;
    const external = local || !policies.externalLocal;
    if (!internal && !external) return;
    const ep: Endpoint = {};
    const hostname = e.string('hostname');
    if (hostname) ep.Hostname = hostname;
    const addrs = e.strings('addresses');
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
  });
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
  const spec = Fields.read(svc.spec, ['spec']);
  const policies: Policies = {
    internalLocal: spec?.value('internalTrafficPolicy') === 'Local',
    externalLocal: spec?.value('externalTrafficPolicy') === 'Local',
  };
  const unique = new Map<string, Endpoint>();
  slices.forEach((slice, si) => {
    try {
      sliceEndpoints(slice, policies, opts, (ep) => {
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
