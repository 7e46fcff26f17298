/**
 * JSON exactly as Go's encoding/json (before Go 1.22, HTML escaping on)
 * prints kpng's generated structs: declaration order, `omitempty` on every
 * proto field, enums as numbers, map keys sorted by UTF-8 bytes, and the
 * untagged `SessionAffinity` oneof always present. See shared/kpng-localv1.md.
 */
import type {
  Endpoint,
  EndpointScopes,
  IPFilter,
  IPSet,
  PortMapping,
  PortName,
  Service,
  ServiceEndpoints,
  ServiceIPs,
} from './model.js';

const hex = '0123456789abcdef';
// Characters Go escapes, besides `"` and `\`: controls, <, >, &, U+2028/9.
const needsEscape = /["\\\u0000-\u001f<>&\u2028\u2029]/;

/** A Go-compatible JSON string literal. */
export function goString(s: string): string {
  if (!needsEscape.test(s)) return '"' + s + '"';
  let out = '"';
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    let esc: string | undefined;
    if (c < 0x20) {
      if (c === 0x0a) esc = '\\n';
      else if (c === 0x0d) esc = '\\r';
      else if (c === 0x09) esc = '\\t';
      else esc = '\\u00' + hex[c >> 4]! + hex[c & 15]!;
    } else if (c === 0x22) esc = '\\"';
    else if (c === 0x5c) esc = '\\\\';
    else if (c === 0x3c) esc = '\\u003c';
    else if (c === 0x3e) esc = '\\u003e';
    else if (c === 0x26) esc = '\\u0026';
    else if (c === 0x2028) esc = '\\u2028';
    else if (c === 0x2029) esc = '\\u2029';
    if (esc !== undefined) {
      out += s.slice(start, i) + esc;
      start = i + 1;
    }
  }
  return out + s.slice(start) + '"';
}

/**
 * The one UTF-8 string comparison: strings by their UTF-8 bytes (Go's string
 * order), which differs from JS's UTF-16 order only between surrogates and
 * U+E000..U+FFFF. With `slashFirst`, `/` sorts before every other byte
 * (kpng's path order, see state.ts comparePaths).
 */
export function compareUtf8(a: string, b: string, slashFirst = false): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x !== y) return utf8Rank(x, slashFirst) - utf8Rank(y, slashFirst);
  }
  return a.length - b.length;
}

/** A UTF-16 code unit's place in UTF-8 byte order (surrogates encode above U+FFFF). */
function utf8Rank(c: number, slashFirst: boolean): number {
  if (slashFirst && c === 0x2f) return -1;
  return c >= 0xd800 ? (c < 0xe000 ? c + 0x2000 : c - 0x800) : c;
}

class Obj {
  s = '{';
  private first = true;
  raw(key: string, json: string): void {
    this.s += (this.first ? '"' : ',"') + key + '":' + json;
    this.first = false;
  }
  str(key: string, v: string | undefined): void {
    if (v) this.raw(key, goString(v));
  }
  num(key: string, v: number | undefined): void {
    if (v) this.raw(key, String(v));
  }
  bool(key: string, v: boolean | undefined): void {
    if (v) this.raw(key, 'true');
  }
  strs(key: string, v: string[] | undefined): void {
    if (v && v.length > 0) this.raw(key, '[' + v.map(goString).join(',') + ']');
  }
  map(key: string, v: Record<string, string> | undefined): void {
    if (!v) return;
    const keys = Object.keys(v);
    if (keys.length === 0) return;
    keys.sort(compareUtf8);
    this.raw(key, '{' + keys.map((k) => goString(k) + ':' + goString(v[k]!)).join(',') + '}');
  }
  msg<T>(key: string, v: T | undefined, enc: (v: T) => string): void {
    if (v !== undefined && v !== null) this.raw(key, enc(v));
  }
  list<T>(key: string, v: T[] | undefined, enc: (v: T) => string): void {
    if (v && v.length > 0) this.raw(key, '[' + v.map((x) => (x == null ? 'null' : enc(x))).join(',') + ']');
  }
  end(): string {
    return this.s + '}';
  }
}

// One encoder per message, each listing its fields in declaration order (the
// pairs the duplicates tool reports here): the field order is the contract.

export function encodeIPSet(v: IPSet): string {
  const o = new Obj();
  o.strs('V4', v.V4);
  o.strs('V6', v.V6);
  return o.end();
}

function encodeServiceIPs(v: ServiceIPs): string {
  const o = new Obj();
  o.msg('ClusterIPs', v.ClusterIPs, encodeIPSet);
  o.msg('ExternalIPs', v.ExternalIPs, encodeIPSet);
  o.msg('LoadBalancerIPs', v.LoadBalancerIPs, encodeIPSet);
  o.bool('Headless', v.Headless);
  return o.end();
}

function encodeIPFilter(v: IPFilter): string {
  const o = new Obj();
  o.msg('TargetIPs', v.TargetIPs, encodeIPSet);
  o.strs('SourceRanges', v.SourceRanges);
  return o.end();
}

function encodePortMapping(v: PortMapping): string {
  const o = new Obj();
  o.str('Name', v.Name);
  o.num('Protocol', v.Protocol);
  o.num('Port', v.Port);
  o.num('NodePort', v.NodePort);
  o.num('TargetPort', v.TargetPort);
  o.str('TargetPortName', v.TargetPortName);
  return o.end();
}

function encodePortName(v: PortName): string {
  const o = new Obj();
  o.str('Name', v.Name);
  o.num('Port', v.Port);
  return o.end();
}

function encodeScopes(v: EndpointScopes): string {
  const o = new Obj();
  o.bool('Internal', v.Internal);
  o.bool('External', v.External);
  return o.end();
}

export function encodeService(v: Service): string {
  const o = new Obj();
  o.str('Namespace', v.Namespace);
  o.str('Name', v.Name);
  o.str('Type', v.Type);
  o.map('Labels', v.Labels);
  o.map('Annotations', v.Annotations);
  o.msg('IPs', v.IPs, encodeServiceIPs);
  o.list('IPFilters', v.IPFilters, encodeIPFilter);
  o.bool('MapIP', v.MapIP);
  o.list('Ports', v.Ports, encodePortMapping);
  o.bool('ExternalTrafficToLocal', v.ExternalTrafficToLocal);
  // The oneof interface field has no json tag: never omitted.
  const sa = v.SessionAffinity;
  if (!sa) o.raw('SessionAffinity', 'null');
  else {
    const c = sa.ClientIP;
    o.raw('SessionAffinity', '{"ClientIP":' + (c ? (c.TimeoutSeconds ? `{"TimeoutSeconds":${c.TimeoutSeconds}}` : '{}') : 'null') + '}');
  }
  o.bool('InternalTrafficToLocal', v.InternalTrafficToLocal);
  o.num('HealthCheckNodePort', v.HealthCheckNodePort);
  return o.end();
}

export function encodeEndpoint(v: Endpoint): string {
  const o = new Obj();
  o.str('Hostname', v.Hostname);
  o.msg('IPs', v.IPs, encodeIPSet);
  o.bool('Local', v.Local);
  o.list('PortOverrides', v.PortOverrides, encodePortName);
  o.msg('Scopes', v.Scopes, encodeScopes);
  return o.end();
}

/**
 * One NDJSON line (with its trailing newline) as Go's json.Encoder prints a
 * client.ServiceEndpoints. `encodedEndpoints` lets the caller reuse cached
 * endpoint encodings.
 */
export function encodeLine(svcJson: string, encodedEndpoints: readonly string[]): string {
  const eps = encodedEndpoints.length === 0 ? 'null' : '[' + encodedEndpoints.join(',') + ']';
  return '{"Service":' + svcJson + ',"Endpoints":' + eps + '}\n';
}

/** Convenience: encode a whole item (tests, replay). */
export function encodeServiceEndpoints(item: ServiceEndpoints): string {
  return encodeLine(encodeService(item.Service), item.Endpoints.map(encodeEndpoint));
}
