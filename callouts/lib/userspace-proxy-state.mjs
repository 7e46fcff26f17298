// userspace-proxy: the state it is given, checked (every address and port a
// literal, everything else logged and skipped), planned into listeners, and
// read frame by frame from stdin. See userspace-proxy.mjs.
import { canonicalIP, isIPv4Literal, isIPv6Literal, isPort } from './userspace-proxy-address.mjs';
import { DEFAULTS, log, q } from './userspace-proxy-common.mjs';

// ---------------------------------------------------------------------------
// Checking the state

/** kpng's Protocol numbers (a Map: a name such as `constructor` must find nothing). */
const PROTOCOLS = new Map([
  [1, 'tcp'],
  [2, 'udp'],
  [3, 'sctp'],
]);

const obj = (v) => (v !== null && typeof v === 'object' && !Array.isArray(v) ? v : undefined);
const arr = (v) => (Array.isArray(v) ? v : []);

/**
 * One state line (parsed JSON) as what the proxy uses, or undefined when it
 * is no Service (`why(msg)` is told). Invalid addresses, ports and protocols
 * are told to `why` and left out.
 *   { key, label, ports: [{ name, proto, port, nodePort, targetPort, named }],
 *     ips: { internal: { 4: [], 6: [] }, external: { 4: [], 6: [] } },
 *     endpoints: [{ ip: { 4?, 6? }, internal, external, overrides: Map }],
 *     affinityMs }
 */
export function readService(line, why = () => {}) {
  const svc = obj(obj(line)?.Service);
  if (!svc) {
    why('a line with no Service: skipped');
    return undefined;
  }
  const ns = typeof svc.Namespace === 'string' ? svc.Namespace : '';
  const name = typeof svc.Name === 'string' ? svc.Name : '';
  if (name === '') {
    why(`a Service with no name in namespace ${q(ns)}: skipped`);
    return undefined;
  }
  const label = q(`${ns}/${name}`);
  const say = (msg) => why(`${label}: ${msg}`);
  const ips = { internal: { 4: [], 6: [] }, external: { 4: [], 6: [] } };
  const addrs = obj(svc.IPs) ?? {};
  const take = (set, scope, what) => {
    const s = obj(set) ?? {};
    for (const [fam, list, check] of [
      [4, s.V4, isIPv4Literal],
      [6, s.V6, isIPv6Literal],
    ]) {
      for (const ip of arr(list)) {
        if (check(ip)) {
          const c = canonicalIP(ip);
          if (!ips[scope][fam].includes(c)) ips[scope][fam].push(c);
        } else say(`${what} ${q(ip)} is not a usable literal IPv${fam} address: skipped`);
      }
    }
  };
  take(addrs.ClusterIPs, 'internal', 'ClusterIP');
  take(addrs.ExternalIPs, 'external', 'ExternalIP');
  take(addrs.LoadBalancerIPs, 'external', 'LoadBalancerIP');
  const ports = [];
  for (const p of arr(svc.Ports)) {
    const o = obj(p) ?? {};
    const pname = typeof o.Name === 'string' ? o.Name : '';
    const proto = PROTOCOLS.get(o.Protocol);
    const port = o.Port;
    if (proto === undefined) {
      say(`port ${q(pname)}: protocol ${q(o.Protocol ?? 0)} is not TCP, UDP or SCTP: skipped`);
      continue;
    }
    if (proto === 'sctp') {
      say(`port ${q(pname)}: SCTP is not proxied in userspace: skipped`);
      continue;
    }
    if (!isPort(port)) {
      say(`port ${q(pname)}: ${q(port)} is not a port from 1 to 65535: skipped`);
      continue;
    }
    if (ports.some((x) => x.proto === proto && x.port === port)) {
      say(`port ${q(pname)}: ${port}/${proto} is listed twice: the first one is used`);
      continue;
    }
    let nodePort = 0;
    if (o.NodePort !== undefined && o.NodePort !== 0) {
      if (isPort(o.NodePort)) nodePort = o.NodePort;
      else say(`port ${q(pname)}: NodePort ${q(o.NodePort)} is not a port: no NodePort`);
    }
    let targetPort = 0;
    if (o.TargetPort !== undefined && o.TargetPort !== 0) {
      if (isPort(o.TargetPort)) targetPort = o.TargetPort;
      else say(`port ${q(pname)}: TargetPort ${q(o.TargetPort)} is not a port: Port used instead`);
    }
    // Its target named (TargetPortName, no TargetPort): only endpoints that have it serve it (targetPortOf).
    const named = targetPort === 0 && typeof o.TargetPortName === 'string' && o.TargetPortName !== '';
    ports.push({ name: pname, proto, port, nodePort, targetPort, named });
  }
  const endpoints = [];
  for (const e of arr(line.Endpoints)) {
    const o = obj(e);
    if (!o) continue;
    const s = obj(o.IPs) ?? {};
    const ip = {};
    const v4 = arr(s.V4).find(isIPv4Literal);
    const v6 = arr(s.V6).find(isIPv6Literal);
    if (v4 !== undefined) ip[4] = v4;
    if (v6 !== undefined) ip[6] = canonicalIP(v6);
    for (const bad of [...arr(s.V4).filter((x) => !isIPv4Literal(x)), ...arr(s.V6).filter((x) => !isIPv6Literal(x))]) {
      say(`endpoint address ${q(bad)} is not a usable literal IP address: skipped`);
    }
    if (v4 === undefined && v6 === undefined) continue;
    const scopes = obj(o.Scopes);
    const overrides = new Map();
    for (const po of arr(o.PortOverrides)) {
      const x = obj(po) ?? {};
      const n = typeof x.Name === 'string' ? x.Name : '';
      if (overrides.has(n)) continue;
      if (isPort(x.Port)) overrides.set(n, x.Port);
      else {
        say(`endpoint ${q(v4 ?? v6)}: port ${q(n)} is ${q(x.Port ?? 0)}, not a port: the endpoint is not used for it`);
        overrides.set(n, 0);
      }
    }
    endpoints.push({ ip, internal: scopes ? scopes.Internal === true : true, external: scopes ? scopes.External === true : true, overrides });
  }
  let affinityMs = 0;
  const aff = obj(obj(svc.SessionAffinity)?.ClientIP);
  if (aff) {
    const t = aff.TimeoutSeconds;
    const secs = Number.isInteger(t) && t > 0 ? Math.min(t, 86_400) : DEFAULTS.affinitySeconds;
    affinityMs = secs * 1000;
  }
  return { key: `${ns}\0${name}`, label, ports, ips, endpoints, affinityMs };
}

/** The port an endpoint takes for a Service port, 0 when it has none usable. */
export function targetPortOf(endpoint, port) {
  const o = endpoint.overrides.get(port.name);
  if (o !== undefined) return o;
  if (port.targetPort) return port.targetPort;
  // A named target port (TargetPortName) that overrides do not list: the pod
  // does not serve it, so it is no endpoint of this port (as kube-proxy).
  return port.named && endpoint.overrides.size > 0 ? 0 : port.port;
}

/** The endpoints a (Service port, scope, family) may use: [{ ip, port, id }], each ip:port once. */
function endpointsFor(svc, port, scope, fam) {
  const seen = new Set();
  const out = [];
  for (const e of svc.endpoints) {
    const ip = e.ip[fam];
    const target = targetPortOf(e, port);
    if (ip === undefined || !e[scope] || target === 0) continue;
    const id = `${ip} ${target}`;
    if (seen.has(id)) continue;
    seen.add(id);
    out.push({ ip, port: target, id });
  }
  return out;
}

/** host:port, brackets around an IPv6 host. */
export const hp = (host, port) => `${String(host).includes(':') ? `[${host}]` : host}:${port}`;

/** Where a listener is, as a log line says it. */
export const where = (host, port, proto) => `${hp(host, port)}/${proto}`;

/**
 * The listeners a state needs: Map listener key -> {
 *   key, proto, family (4|6), host, port, nodePort (bool), label,
 *   backend: { key, affinityKey, endpoints: [{ ip, port, id }], affinityMs },
 *   routes?: [{ host, label, backend }], shared?: true }.
 * `services` in kpng order; an address:port claimed twice goes to the first
 * Service (the other is told to `why`). A Service address whose TCP port is
 * also a NodePort is served by the NodePort's socket (Linux lets no TCP
 * socket listen on an address and port that a wildcard one listens on):
 * that socket's `routes` pick the backend by the connection's local address.
 * UDP listeners sharing a port with a NodePort of their family are `shared`
 * (SO_REUSEADDR: the kernel hands each datagram to the most specific one).
 * An endpoint that is one of these listeners (`localAddresses`: the node's
 * own addresses, for NodePorts) would loop back into the proxy: it is told
 * to `why` and left out.
 */
export function planListeners(services, why = () => {}, localAddresses = new Set()) {
  const listeners = new Map();
  const plans = [];
  for (const svc of services) {
    for (const port of svc.ports) {
      const pl = `${svc.label} port ${port.port}/${port.proto}${port.name === '' ? '' : ` (${q(port.name)})`}`;
      const backends = {};
      const backend = (scope, fam) => {
        if (!backends[`${scope}${fam}`]) {
          const b = {
            key: `${svc.key}\0${port.proto}\0${port.port}\0${port.name}\0${scope}\0${fam}`,
            // One client keeps one endpoint per Service port, whichever address it came through (as kube-proxy).
            affinityKey: `${svc.key}\0${port.proto}\0${port.port}\0${port.name}\0${fam}`,
            affinityMs: svc.affinityMs,
            endpoints: endpointsFor(svc, port, scope, fam),
          };
          backends[`${scope}${fam}`] = b;
          plans.push({ b, proto: port.proto, fam, label: pl });
        }
        return backends[`${scope}${fam}`];
      };
      const add = (host, fam, lport, scope, nodePort) => {
        const key = `${port.proto} ${host} ${lport}`;
        const have = listeners.get(key);
        if (have) {
          if (have.label !== pl) why(`${where(host, lport, port.proto)} is claimed by ${have.label} already: not for ${pl}`);
          return;
        }
        listeners.set(key, { key, proto: port.proto, family: fam, host, port: lport, nodePort, label: pl, backend: backend(scope, fam) });
      };
      for (const fam of [4, 6]) {
        for (const ip of svc.ips.internal[fam]) add(ip, fam, port.port, 'internal', false);
        for (const ip of svc.ips.external[fam]) add(ip, fam, port.port, 'external', false);
      }
      if (port.nodePort) {
        add('0.0.0.0', 4, port.nodePort, 'external', true);
        add('::', 6, port.nodePort, 'external', true);
      }
    }
  }
  const wildcard = (proto, fam, port) => listeners.get(`${proto} ${fam === 4 ? '0.0.0.0' : '::'} ${port}`);
  for (const { b, proto, fam, label } of plans) {
    b.endpoints = b.endpoints.filter((e) => {
      const loops = listeners.has(`${proto} ${e.ip} ${e.port}`) || (wildcard(proto, fam, e.port) !== undefined && localAddresses.has(e.ip));
      if (loops) why(`${label}: endpoint ${hp(e.ip, e.port)} is an address this proxy listens on (a loop): skipped`);
      return !loops;
    });
  }
  for (const [key, l] of listeners) {
    if (l.nodePort) continue;
    const any = wildcard(l.proto, l.family, l.port);
    if (!any) continue;
    if (l.proto === 'udp') {
      l.shared = true;
      any.shared = true;
      continue;
    }
    (any.routes ??= []).push({ host: l.host, label: l.label, backend: l.backend });
    listeners.delete(key);
  }
  return listeners;
}

// ---------------------------------------------------------------------------
// Frames

/** Orders Service keys as kpng does (namespace, then name). */
const byKey = (a, b) => (a < b ? -1 : a > b ? 1 : 0);

/**
 * The Services kept between frames: key -> { raw, svc }. `apply` takes one
 * frame (its header text and lines) and returns { ok: true } or
 * { ok: false, why } (the Services are then left as they were).
 */
export class ServiceTable {
  constructor(why = () => {}) {
    /** @type {Map<string, { raw: string, svc: object | undefined }>} */
    this.services = new Map();
    /** A full frame has been applied, and no change set failed since. */
    this.based = false;
    this.why = why;
  }

  apply(header, lines) {
    let input;
    try {
      input = JSON.parse(header)?.Frame?.Input;
    } catch {
      input = undefined;
    }
    if (input !== 'full' && input !== 'changes') {
      this.based = false;
      return { ok: false, why: 'not a frame header (want {"Frame":{"Seq":N,"Input":"full"|"changes"}})' };
    }
    if (input === 'changes' && !this.based) return { ok: false, why: 'a change set with no full state applied before it (waiting for a full frame)' };
    const next = input === 'full' ? new Map() : new Map(this.services);
    for (let i = 0; i < lines.length; i++) {
      const raw = lines[i];
      let line;
      try {
        line = JSON.parse(raw);
      } catch {
        this.based = false;
        return { ok: false, why: `line ${i + 1} of the frame is not JSON: frame not applied` };
      }
      const prev = input === 'changes' ? obj(obj(line)?.Previous) : undefined;
      if (prev) {
        const k = keyOf(prev);
        const have = k === undefined ? undefined : next.get(k);
        const text = raw.startsWith('{"Previous":') && raw.endsWith('}') ? raw.slice(12, -1) : undefined;
        if (!have || (text !== undefined && text !== have.raw)) {
          this.based = false;
          return { ok: false, why: `line ${i + 1}: a Previous line that is not the Service as last applied: frame not applied` };
        }
        next.delete(k);
        continue;
      }
      const k = keyOf(line);
      if (k === undefined) {
        if (input === 'changes') {
          this.based = false;
          return { ok: false, why: `line ${i + 1}: no Service in a change set line: frame not applied` };
        }
        this.why(`line ${i + 1}: no Service (namespace and name): skipped`);
        continue;
      }
      if (next.has(k)) {
        if (input === 'changes') {
          this.based = false;
          return { ok: false, why: `line ${i + 1}: a Service added twice: frame not applied` };
        }
        this.why(`line ${i + 1}: the same Service twice: the first one is used`);
        continue;
      }
      next.set(k, { raw, svc: readService(line, this.why) });
    }
    this.services = next;
    this.based = true;
    return { ok: true };
  }

  /** The Services, in kpng order. */
  ordered() {
    return [...this.services.keys()]
      .sort(byKey)
      .map((k) => this.services.get(k).svc)
      .filter((s) => s !== undefined);
  }
}

function keyOf(line) {
  const svc = obj(obj(line)?.Service);
  if (!svc || typeof svc.Name !== 'string' || svc.Name === '') return undefined;
  return `${typeof svc.Namespace === 'string' ? svc.Namespace : ''}\0${svc.Name}`;
}

/** Splits a stream of text into frames: `onFrame(header, lines)` at each empty line. */
export class FrameReader {
  constructor(onFrame) {
    this.onFrame = onFrame;
    this.pending = '';
    this.header = undefined;
    this.lines = [];
  }

  push(text) {
    let start = 0;
    let text2 = this.pending === '' ? text : this.pending + text;
    this.pending = '';
    for (let nl = text2.indexOf('\n', start); nl >= 0; nl = text2.indexOf('\n', start)) {
      this.line(text2.charCodeAt(nl - 1) === 13 && nl > start ? text2.slice(start, nl - 1) : text2.slice(start, nl));
      start = nl + 1;
    }
    this.pending = text2.slice(start);
    text2 = '';
  }

  /** True when the input ended inside a frame. */
  end() {
    const cut = this.header !== undefined || this.pending !== '';
    this.header = undefined;
    this.lines = [];
    this.pending = '';
    return cut;
  }

  line(l) {
    if (l === '') {
      if (this.header === undefined) {
        log('an empty line outside a frame: ignored');
        return;
      }
      const h = this.header;
      const lines = this.lines;
      this.header = undefined;
      this.lines = [];
      this.onFrame(h, lines);
    } else if (this.header === undefined) this.header = l;
    else this.lines.push(l);
  }
}
