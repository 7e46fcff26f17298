// userspace-proxy: the state it is given, checked (every address and port a
// literal, everything else logged and skipped) and read frame by frame from
// stdin; -plan.mjs plans it into listeners. See userspace-proxy.mjs.
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

/** host:port, brackets around an IPv6 host. */
export const hp = (host, port) => `${String(host).includes(':') ? `[${host}]` : host}:${port}`;

/** Where a listener is, as a log line says it. */
export const where = (host, port, proto) => `${hp(host, port)}/${proto}`;

// ---------------------------------------------------------------------------
// Frames

/** Orders Service keys as kpng does (namespace, then name). */
const byKey = (a, b) => (a < b ? -1 : a > b ? 1 : 0);

/**
 * The Services kept between frames: key -> { raw, key, svc }. `apply` takes one
 * frame (its header text and lines) and returns { ok: true } or
 * { ok: false, why } (the Services are then left as they were).
 */
export class ServiceTable {
  constructor(why = () => {}) {
    /** @type {Map<string, { raw: string, key: string, svc: object | undefined }>} */
    this.services = new Map();
    /** The keys in kpng order; undefined when keys came or went since they were sorted. */
    this.sorted = undefined;
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
    // A full frame's unchanged lines keep their Service objects (and so their planned part, -plan.mjs).
    const before = input === 'full' ? new Map([...this.services.values()].map((e) => [e.raw, e])) : undefined;
    const touched = [];
    for (let i = 0; i < lines.length; i++) {
      const raw = lines[i];
      const same = before?.get(raw);
      if (same !== undefined && !next.has(same.key)) {
        next.set(same.key, same);
        continue;
      }
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
        touched.push(k);
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
      next.set(k, { raw, key: k, svc: readService(line, this.why) });
      touched.push(k);
    }
    if (input === 'full' || touched.some((k) => next.has(k) !== this.services.has(k))) this.sorted = undefined;
    this.services = next;
    this.based = true;
    return { ok: true };
  }

  /** The Services, in kpng order. */
  ordered() {
    this.sorted ??= [...this.services.keys()].sort(byKey);
    const out = [];
    for (const k of this.sorted) {
      const svc = this.services.get(k).svc;
      if (svc !== undefined) out.push(svc);
    }
    return out;
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
