/**
 * Protobuf wire codec for kpng's localv1 API (see proto/localv1.proto).
 *
 * protobufjs decodes with the reflection types parsed from our .proto at
 * load time; the results are then copied into the plain model types of
 * model.ts, keeping presence: an absent sub-message is `undefined`, a
 * present-but-empty one is `{}` (a headless Service has `IPs.ClusterIPs =
 * {}`), the `SessionAffinity` oneof becomes `{ClientIP: {...}}` only when it
 * is on the wire. Enum values we do not know stay numbers (proto3 enums are
 * open). A string field holding invalid UTF-8 makes the decode throw, as Go's
 * decoder does: proto3 forbids such strings.
 *
 * `marshal*` functions build wire bytes from the same model types (the test
 * server uses them; so can a future server).
 */
import { isValidUtf8 } from './utf8.js';
import { readFileSync } from 'node:fs';
import protobuf from 'protobufjs';
import type { ClientIPAffinity, Endpoint, EndpointScopes, IPFilter, IPSet, PortMapping, PortName, Service, ServiceIPs } from './model.js';

/** `Ref`: which set and which path an op addresses. */
export interface Ref {
  /** `Set` enum: 1 Services, 2 Endpoints; other values are kept as numbers. */
  Set: number;
  Path: string;
}

/** `Value`: the encoded Service or Endpoint stored at `Ref`. */
export interface Value {
  /** Absent when the sender left it out (a broken server). */
  Ref?: Ref;
  Bytes: Uint8Array;
}

/**
 * One `OpItem`: exactly one of the members is set, or none when the sender
 * used an op this codec does not know (a future server).
 */
export interface OpItem {
  Sync?: Record<string, never>;
  Set?: Value;
  Delete?: Ref;
  Reset?: Record<string, never>;
}

/** `WatchReq`. */
export interface WatchReq {
  NodeName: string;
}

// The .proto sits next to src/ and dist/ (package.json ships `proto`), so
// one relative URL works from the sources, the build and an installed package.
const protoUrl = new URL('../proto/localv1.proto', import.meta.url);

function loadRoot(): protobuf.Root {
  let text: string;
  try {
    text = readFileSync(protoUrl, 'utf8');
  } catch (err) {
    throw new Error(`cannot read the localv1 protocol definition ${protoUrl.pathname}: ${(err as Error).message}`, { cause: err });
  }
  // keepCase: the Go-style field names are the model's property names.
  const root = protobuf.parse(text, { keepCase: true }).root;
  root.resolveAll();
  return root;
}

const root = loadRoot();
const T = {
  WatchReq: root.lookupType('localv1.WatchReq'),
  OpItem: root.lookupType('localv1.OpItem'),
  Service: root.lookupType('localv1.Service'),
  Endpoint: root.lookupType('localv1.Endpoint'),
};

// protobufjs verifies proto3 strings with a fatal TextDecoder, which a Node
// built without ICU lacks (it then silently decodes lossily). Check once at
// load and, only if needed, verify with our own validator instead.
(function ensureStrictStrings(): void {
  const bad = Uint8Array.of(0x0a, 0x02, 0xc3, 0x28); // WatchReq{NodeName: C3 28}
  try {
    T.WatchReq.decode(bad);
  } catch {
    return; // rejected: protobufjs is strict already
  }
  const proto = protobuf.Reader.prototype as unknown as {
    stringVerify: (this: protobuf.Reader) => string;
    string: (this: protobuf.Reader) => string;
  };
  proto.stringVerify = function stringVerify(this: protobuf.Reader): string {
    const start = this.pos;
    const len = this.uint32();
    const from = this.pos;
    if (from + len > this.len) throw new RangeError('index out of range');
    if (!isValidUtf8(this.buf, from, from + len)) throw new Error('invalid UTF-8 in a string field');
    this.pos = start;
    return this.string();
  };
})();

/* ---------- wire objects -> model (presence kept) ---------- */

// protobufjs messages carry proto3 defaults on their prototype and set an own
// property only for what the wire held (non-default scalars, present
// messages, non-empty lists and maps), so truthiness and `!= null` tell
// exactly what is present.
type Wire = any;

const own = Object.prototype.hasOwnProperty;

function ipSet(m: Wire): IPSet {
  const v: IPSet = {};
  if (m.V4.length) v.V4 = m.V4;
  if (m.V6.length) v.V6 = m.V6;
  return v;
}

function serviceIPs(m: Wire): ServiceIPs {
  const v: ServiceIPs = {};
  if (m.ClusterIPs != null) v.ClusterIPs = ipSet(m.ClusterIPs);
  if (m.ExternalIPs != null) v.ExternalIPs = ipSet(m.ExternalIPs);
  if (m.LoadBalancerIPs != null) v.LoadBalancerIPs = ipSet(m.LoadBalancerIPs);
  if (m.Headless) v.Headless = true;
  return v;
}

function ipFilter(m: Wire): IPFilter {
  const v: IPFilter = {};
  if (m.TargetIPs != null) v.TargetIPs = ipSet(m.TargetIPs);
  if (m.SourceRanges.length) v.SourceRanges = m.SourceRanges;
  return v;
}

function portMapping(m: Wire): PortMapping {
  const v: PortMapping = {};
  if (m.Name) v.Name = m.Name;
  if (m.Protocol) v.Protocol = m.Protocol;
  if (m.Port) v.Port = m.Port;
  if (m.NodePort) v.NodePort = m.NodePort;
  if (m.TargetPort) v.TargetPort = m.TargetPort;
  if (m.TargetPortName) v.TargetPortName = m.TargetPortName;
  return v;
}

function portName(m: Wire): PortName {
  const v: PortName = {};
  if (m.Name) v.Name = m.Name;
  if (m.Port) v.Port = m.Port;
  return v;
}

function stringMap(m: Wire, key: string): Record<string, string> | undefined {
  // The decoder builds a fresh plain object per message: safe to keep.
  return own.call(m, key) && Object.keys(m[key]).length > 0 ? m[key] : undefined;
}

function serviceFromWire(m: Wire): Service {
  const v: Service = {};
  if (m.Namespace) v.Namespace = m.Namespace;
  if (m.Name) v.Name = m.Name;
  if (m.Type) v.Type = m.Type;
  const labels = stringMap(m, 'Labels');
  if (labels) v.Labels = labels;
  const annotations = stringMap(m, 'Annotations');
  if (annotations) v.Annotations = annotations;
  if (m.IPs != null) v.IPs = serviceIPs(m.IPs);
  if (m.IPFilters.length) v.IPFilters = m.IPFilters.map(ipFilter);
  if (m.MapIP) v.MapIP = true;
  if (m.Ports.length) v.Ports = m.Ports.map(portMapping);
  if (m.ExternalTrafficToLocal) v.ExternalTrafficToLocal = true;
  if (m.ClientIP != null) {
    const c: ClientIPAffinity = {};
    if (m.ClientIP.TimeoutSeconds) c.TimeoutSeconds = m.ClientIP.TimeoutSeconds;
    v.SessionAffinity = { ClientIP: c };
  }
  if (m.InternalTrafficToLocal) v.InternalTrafficToLocal = true;
  if (m.HealthCheckNodePort) v.HealthCheckNodePort = m.HealthCheckNodePort;
  return v;
}

function endpointFromWire(m: Wire): Endpoint {
  const v: Endpoint = {};
  if (m.Hostname) v.Hostname = m.Hostname;
  if (m.IPs != null) v.IPs = ipSet(m.IPs);
  if (m.Local) v.Local = true;
  if (m.PortOverrides.length) v.PortOverrides = m.PortOverrides.map(portName);
  if (m.Scopes != null) {
    const s: EndpointScopes = {};
    if (m.Scopes.Internal) s.Internal = true;
    if (m.Scopes.External) s.External = true;
    v.Scopes = s;
  }
  return v;
}

function refFromWire(m: Wire): Ref {
  return { Set: m.Set, Path: m.Path };
}

/* ---------- decoding ---------- */

/** Decodes a `Service`; throws on malformed bytes or invalid UTF-8. */
export function unmarshalService(bytes: Uint8Array): Service {
  return serviceFromWire(T.Service.decode(bytes));
}

/** Decodes an `Endpoint`; throws on malformed bytes or invalid UTF-8. */
export function unmarshalEndpoint(bytes: Uint8Array): Endpoint {
  return endpointFromWire(T.Endpoint.decode(bytes));
}

/**
 * Decodes an `OpItem`. `Set.Bytes` is left encoded (a view into `bytes`, not
 * a copy) so that one bad value costs only that value, not the stream.
 */
export function unmarshalOpItem(bytes: Uint8Array): OpItem {
  const m: Wire = T.OpItem.decode(bytes);
  switch (m.Op as string | undefined) {
    case 'Sync':
      return { Sync: {} };
    case 'Set': {
      const s = m.Set;
      const v: Value = { Bytes: s.Bytes };
      if (s.Ref != null) v.Ref = refFromWire(s.Ref);
      return { Set: v };
    }
    case 'Delete':
      return { Delete: refFromWire(m.Delete) };
    case 'Reset':
      return { Reset: {} };
    default:
      return {};
  }
}

/** Decodes a `WatchReq` (server side). */
export function unmarshalWatchReq(bytes: Uint8Array): WatchReq {
  const m: Wire = T.WatchReq.decode(bytes);
  return { NodeName: m.NodeName };
}

/* ---------- encoding ---------- */

// protobufjs encodes plain objects, writing a field when it is an own
// property: the model types fit as they are, except the oneof, which the
// wire carries as the `ClientIP` field of Service itself.
function serviceToWire(s: Service): Wire {
  const { SessionAffinity, ...rest } = s;
  return SessionAffinity?.ClientIP ? { ...rest, ClientIP: SessionAffinity.ClientIP } : rest;
}

/** Encodes a `Service`. */
export function marshalService(s: Service): Uint8Array {
  return T.Service.encode(serviceToWire(s)).finish();
}

/** Encodes an `Endpoint`. */
export function marshalEndpoint(e: Endpoint): Uint8Array {
  return T.Endpoint.encode(e as Wire).finish();
}

/** Encodes an `OpItem`. */
export function marshalOpItem(op: OpItem): Uint8Array {
  return T.OpItem.encode(op as Wire).finish();
}

/** Encodes a `WatchReq`. */
export function marshalWatchReq(req: WatchReq): Uint8Array {
  return T.WatchReq.encode(req as Wire).finish();
}
