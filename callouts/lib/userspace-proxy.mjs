// userspace-proxy: a persistent kpng callout that proxies Services in
// userspace, with nothing but Node's standard library (Node >= 20).
// Started by callouts/userspace-proxy (the launcher) under
// `kpng-callout --persistent [--changes]`; see callouts/README.md.
//
// For every Service port (TCP, UDP; SCTP is skipped with a log line) it
// listens on each ClusterIP, ExternalIP and LoadBalancerIP at Port, and on
// NodePort on every address (0.0.0.0 and ::, IPv6-only so both bind), and
// forwards:
// - TCP: each connection to an endpoint of the listener's family, in turn
//   (round robin) among those the destination may use (ClusterIP: Internal
//   scope; the others: External; no Scopes: both), at the endpoint's
//   PortOverrides entry named as the Service port, else TargetPort, else
//   Port. A connect that fails tries the next endpoint (at most
//   USERSPACE_PROXY_CONNECT_ATTEMPTS, each with a doubling timeout); with no
//   usable endpoint the client is reset at once. Half-closes are passed on;
//   an error on either side destroys both.
// - UDP: one upstream socket per client address:port, kept while datagrams
//   flow (USERSPACE_PROXY_UDP_IDLE_TIMEOUT_MS); replies leave from the
//   listening socket (the Service address).
// - SessionAffinity ClientIP: a client IP keeps its endpoint for
//   TimeoutSeconds (10800 when 0 or missing), refreshed by each new
//   connection, as long as the endpoint stays.
//
// Frames (stdin) are applied one at a time: listeners of removed Services or
// ports are closed, new ones opened, the others keep their socket and their
// connections (only the endpoints used by new connections change; UDP
// sessions to an endpoint that is gone are closed). The ack on fd 3 is `ok`
// when every listener of the state is up, else `error` naming each address,
// port and errno that could not be bound (the rest serves; the bind is tried
// again on the next frame). Invalid addresses and ports are logged and
// skipped; state strings are only ever used as map keys and, JSON-quoted, in
// log lines. At the end of stdin, or on SIGTERM / SIGINT, the listeners and
// connections are closed and it exits 0. SIGUSR2 logs a stats line.
import dgram from 'node:dgram';
import { fstatSync, writeSync } from 'node:fs';
import net from 'node:net';

const PROG = 'userspace-proxy';

/** Defaults of the environment options (README: callouts/README.md "userspace-proxy"). */
export const DEFAULTS = Object.freeze({
  /** USERSPACE_PROXY_MAX_CONNECTIONS: TCP connections plus UDP sessions at once. */
  maxConnections: 10_000,
  /** USERSPACE_PROXY_UDP_IDLE_TIMEOUT_MS: a UDP session without a datagram either way for this long is closed. */
  udpIdleTimeoutMs: 30_000,
  /** USERSPACE_PROXY_CONNECT_TIMEOUT_MS: the first attempt's connect timeout; doubled at each further attempt. */
  connectTimeoutMs: 1_000,
  /** USERSPACE_PROXY_CONNECT_ATTEMPTS: endpoints tried per TCP connection (never more than there are). */
  connectAttempts: 4,
  /** USERSPACE_PROXY_BUFFER_BYTES: stream high-water mark per direction of a TCP connection. */
  bufferBytes: 256 * 1024,
  /** SessionAffinity ClientIP with no TimeoutSeconds (Kubernetes' default). */
  affinitySeconds: 10_800,
});

/** Datagrams kept per UDP session while its upstream socket connects. */
const UDP_PENDING_MAX = 64;

const log = (msg) => process.stderr.write(`${PROG}: ${msg}\n`);
/** A state string as it may appear in a log line: JSON-quoted (no control characters, no injection). */
const q = (s) => JSON.stringify(String(s));

/** Reads the options from `env`; throws naming the variable on a bad value. */
export function readOptions(env = process.env) {
  const int = (name, dflt, min, max) => {
    const raw = env[name];
    if (raw === undefined || raw === '') return dflt;
    if (!/^[0-9]+$/.test(raw) || Number(raw) < min || Number(raw) > max) {
      throw new Error(`${name} must be an integer from ${min} to ${max}, not ${q(raw)}`);
    }
    return Number(raw);
  };
  const logMode = env.USERSPACE_PROXY_LOG ?? '';
  if (logMode !== '' && logMode !== 'connections') throw new Error(`USERSPACE_PROXY_LOG must be "connections" or empty, not ${q(logMode)}`);
  return {
    maxConnections: int('USERSPACE_PROXY_MAX_CONNECTIONS', DEFAULTS.maxConnections, 1, 1_000_000),
    udpIdleTimeoutMs: int('USERSPACE_PROXY_UDP_IDLE_TIMEOUT_MS', DEFAULTS.udpIdleTimeoutMs, 10, 86_400_000),
    connectTimeoutMs: int('USERSPACE_PROXY_CONNECT_TIMEOUT_MS', DEFAULTS.connectTimeoutMs, 10, 600_000),
    connectAttempts: int('USERSPACE_PROXY_CONNECT_ATTEMPTS', DEFAULTS.connectAttempts, 1, 100),
    bufferBytes: int('USERSPACE_PROXY_BUFFER_BYTES', DEFAULTS.bufferBytes, 1024, 64 * 1024 * 1024),
    logConnections: logMode === 'connections',
  };
}

// ---------------------------------------------------------------------------
// Checking the state

const V4 = /^(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(?:\.(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$/;

/** A literal IPv4 address (dotted quad, no leading zeros), not 0.0.0.0 nor a broadcast/multicast address. */
export function isIPv4Literal(s) {
  if (typeof s !== 'string' || !V4.test(s)) return false;
  const first = Number(s.slice(0, s.indexOf('.')));
  return s !== '0.0.0.0' && first < 224;
}

/** The 8 groups of an IPv6 address Node accepts, as numbers. */
function groups6(s) {
  let text = s;
  const dot = text.lastIndexOf(':');
  if (text.includes('.')) {
    const v4 = text.slice(dot + 1).split('.').map(Number);
    text = `${text.slice(0, dot + 1)}${((v4[0] << 8) | v4[1]).toString(16)}:${((v4[2] << 8) | v4[3]).toString(16)}`;
  }
  const [head, tail] = text.includes('::') ? text.split('::') : [text, undefined];
  const h = head === '' ? [] : head.split(':');
  const t = tail === undefined || tail === '' ? [] : tail.split(':');
  const fill = tail === undefined ? [] : new Array(8 - h.length - t.length).fill('0');
  return [...h, ...fill, ...t].map((g) => parseInt(g, 16));
}

/** A literal IPv6 address (no zone, no prefix, no brackets), not :: nor multicast nor IPv4-mapped. */
export function isIPv6Literal(s) {
  if (typeof s !== 'string' || s.length > 45 || !/^[0-9A-Fa-f:.]+$/.test(s) || !net.isIPv6(s)) return false;
  if (s.includes('.') && !V4.test(s.slice(s.lastIndexOf(':') + 1))) return false;
  const g = groups6(s);
  if (g.length !== 8 || g.some((x) => !(x >= 0 && x <= 0xffff))) return false;
  if (g.every((x) => x === 0)) return false;
  if ((g[0] & 0xff00) === 0xff00) return false;
  if (g.slice(0, 5).every((x) => x === 0) && g[5] === 0xffff) return false;
  return true;
}

/** An integer port, 1 to 65535. */
export const isPort = (p) => Number.isInteger(p) && p >= 1 && p <= 65535;

const PROTOCOLS = { 1: 'tcp', 2: 'udp', 3: 'sctp' };

const obj = (v) => (v !== null && typeof v === 'object' && !Array.isArray(v) ? v : undefined);
const arr = (v) => (Array.isArray(v) ? v : []);

/**
 * One state line (parsed JSON) as what the proxy uses, or undefined when it
 * is no Service (`why(msg)` is told). Invalid addresses, ports and protocols
 * are told to `why` and left out.
 *   { key, label, ports: [{ name, proto, port, nodePort, targetPort }],
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
          if (!ips[scope][fam].includes(ip)) ips[scope][fam].push(ip);
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
    const proto = PROTOCOLS[o.Protocol];
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
    ports.push({ name: pname, proto, port, nodePort, targetPort });
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
    if (v6 !== undefined) ip[6] = v6;
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
  return port.targetPort || port.port;
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
const hp = (host, port) => `${String(host).includes(':') ? `[${host}]` : host}:${port}`;

/** Where a listener is, as a log line says it. */
export const where = (host, port, proto) => `${hp(host, port)}/${proto}`;

/**
 * The listeners a state needs: Map listener key -> {
 *   key, proto, family (4|6), host, port, nodePort (bool), label,
 *   backend: { key, endpoints: [{ ip, port, id }], affinityMs } }.
 * `services` in kpng order; an address:port claimed twice goes to the first
 * Service (the other is told to `why`).
 */
export function planListeners(services, why = () => {}) {
  const listeners = new Map();
  for (const svc of services) {
    for (const port of svc.ports) {
      const pl = `${svc.label} port ${port.port}/${port.proto}${port.name === '' ? '' : ` (${q(port.name)})`}`;
      const backends = {};
      const backend = (scope, fam) =>
        (backends[`${scope}${fam}`] ??= {
          key: `${svc.key}\0${port.proto}\0${port.port}\0${port.name}\0${scope}\0${fam}`,
          affinityMs: svc.affinityMs,
          endpoints: endpointsFor(svc, port, scope, fam),
        });
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

// ---------------------------------------------------------------------------
// The proxy

/** Resets a socket (RST) when it can, else destroys it. */
function reset(sock) {
  if (typeof sock.resetAndDestroy === 'function' && !sock.destroyed) {
    try {
      sock.resetAndDestroy();
      return;
    } catch {
      // fall through
    }
  }
  sock.destroy();
}

/** An endpoint chooser for one (Service port, scope, family): round robin, and ClientIP affinity. */
export class Backend {
  constructor(key) {
    this.key = key;
    this.endpoints = [];
    this.ids = new Set();
    this.next = 0;
    this.affinityMs = 0;
    /** client IP -> { id, until } */
    this.affinity = new Map();
  }

  update(plan) {
    this.endpoints = plan.endpoints;
    this.ids = new Set(plan.endpoints.map((e) => e.id));
    this.affinityMs = plan.affinityMs;
    if (!this.affinityMs) this.affinity.clear();
    if (this.next >= this.endpoints.length) this.next = 0;
  }

  has(id) {
    return this.ids.has(id);
  }

  /** The endpoint for a new connection from `clientIp`, skipping those in `tried`; undefined when none is left. */
  pick(clientIp, tried, now) {
    const eps = this.endpoints;
    if (eps.length === 0) return undefined;
    if (this.affinityMs && tried.size === 0) {
      const a = this.affinity.get(clientIp);
      if (a && a.until > now) {
        const ep = eps.find((e) => e.id === a.id);
        if (ep) {
          a.until = now + this.affinityMs;
          return ep;
        }
      }
    }
    for (let i = 0; i < eps.length; i++) {
      const ep = eps[(this.next + i) % eps.length];
      if (tried.has(ep.id)) continue;
      this.next = (this.next + i + 1) % eps.length;
      if (this.affinityMs) this.affinity.set(clientIp, { id: ep.id, until: now + this.affinityMs });
      return ep;
    }
    return undefined;
  }

  sweep(now) {
    for (const [ip, a] of this.affinity) if (a.until <= now || !this.ids.has(a.id)) this.affinity.delete(ip);
  }
}

/** The running proxy: listeners, backends, connections. */
export class UserspaceProxy {
  constructor(options) {
    this.o = options;
    /** listener key -> listener */
    this.listeners = new Map();
    /** backend key -> Backend */
    this.backends = new Map();
    this.tcp = 0;
    this.udp = 0;
    /** Every TCP socket we hold (clients and upstreams), to close them all at the end. */
    this.sockets = new Set();
    this.stopping = false;
    this.capLogged = 0;
    this.sweeper = setInterval(() => this.sweep(), Math.max(50, Math.min(5_000, Math.floor(options.udpIdleTimeoutMs / 4))));
  }

  /** Applies a plan (planListeners); resolves with the binds that failed: [{ where, why }]. */
  async reconcile(plan) {
    for (const [key, l] of this.listeners) {
      if (!plan.has(key)) {
        this.closeListener(l);
        this.listeners.delete(key);
      }
    }
    const backends = new Map();
    const binds = [];
    for (const [key, want] of plan) {
      let b = backends.get(want.backend.key) ?? this.backends.get(want.backend.key);
      if (!b) b = new Backend(want.backend.key);
      if (!backends.has(b.key)) {
        b.update(want.backend);
        backends.set(b.key, b);
      }
      let l = this.listeners.get(key);
      if (!l) {
        l = { key, proto: want.proto, family: want.family, host: want.host, port: want.port, nodePort: want.nodePort, label: want.label, backend: b, handle: undefined, up: false, failed: undefined, sessions: new Map() };
        this.listeners.set(key, l);
      }
      l.backend = b;
      l.label = want.label;
      if (l.proto === 'udp') this.pruneSessions(l);
      if (!l.up) binds.push(this.bind(l));
    }
    this.backends = backends;
    await Promise.all(binds);
    const failed = [];
    for (const l of this.listeners.values()) if (!l.up) failed.push({ where: where(l.host, l.port, l.proto), why: l.failed ?? 'not bound' });
    return failed;
  }

  bind(l) {
    return new Promise((resolve) => {
      const done = (err) => {
        if (err) {
          l.handle = undefined;
          l.up = false;
          const code = err.code ?? 'error';
          l.failed = `${code}${err.message && !err.message.startsWith(code) ? ` (${err.message})` : ''}`;
          log(`cannot listen on ${where(l.host, l.port, l.proto)} for ${l.label}: ${l.failed}`);
        } else {
          l.up = true;
          l.failed = undefined;
          log(`listening on ${where(l.host, l.port, l.proto)} for ${l.label}`);
        }
        resolve();
      };
      if (l.proto === 'tcp') {
        const server = net.createServer({ allowHalfOpen: true, pauseOnConnect: true, noDelay: true, highWaterMark: this.o.bufferBytes }, (c) => this.onTcp(l, c));
        l.handle = server;
        server.once('error', done);
        server.listen({ host: l.host, port: l.port, ipv6Only: l.host === '::', backlog: 1024 }, () => {
          server.off('error', done);
          server.on('error', (err) => log(`${where(l.host, l.port, l.proto)}: ${err.code ?? err.message}`));
          done();
        });
      } else {
        const sock = dgram.createSocket({ type: l.family === 6 ? 'udp6' : 'udp4', ipv6Only: l.host === '::' });
        l.handle = sock;
        sock.once('error', done);
        sock.on('message', (msg, rinfo) => this.onUdp(l, msg, rinfo));
        sock.bind({ address: l.host, port: l.port, exclusive: true }, () => {
          sock.off('error', done);
          // Send errors (no callback given) come here: one bad client must not close the listener.
          sock.on('error', () => {});
          done();
        });
      }
    });
  }

  closeListener(l) {
    if (l.handle) {
      try {
        l.handle.close();
      } catch {
        // already closed
      }
      l.handle = undefined;
    }
    for (const s of l.sessions.values()) this.closeSession(l, s);
    if (l.up) log(`closed ${where(l.host, l.port, l.proto)} (${l.label})`);
    l.up = false;
  }

  capped() {
    if (this.tcp + this.udp < this.o.maxConnections) return false;
    const now = Date.now();
    if (now - this.capLogged > 1000) {
      this.capLogged = now;
      log(`${this.tcp + this.udp} connections and UDP sessions: the cap (USERSPACE_PROXY_MAX_CONNECTIONS=${this.o.maxConnections}) is reached, refusing new ones`);
    }
    return true;
  }

  // --- TCP

  onTcp(l, client) {
    if (this.stopping || this.capped()) return reset(client);
    const clientIp = client.remoteAddress ?? '';
    if (l.backend.endpoints.length === 0) {
      if (this.o.logConnections) log(`tcp ${hp(clientIp, client.remotePort)} -> ${where(l.host, l.port, 'tcp')}: no endpoint, reset`);
      return reset(client);
    }
    this.tcp++;
    this.sockets.add(client);
    // `open`: its sockets not closed yet (the client, the upstream attempts); none left: the connection is gone.
    const conn = { client, up: undefined, paired: false, open: 1 };
    client.on('error', () => this.kill(conn));
    client.once('close', () => {
      this.sockets.delete(client);
      // A client gone while we dial: drop the attempt; paired, the other side is passed the end (below).
      if (conn.up && !conn.paired) conn.up.destroy();
      this.closed(conn);
    });
    this.dial(l, conn, clientIp, new Set());
  }

  closed(conn) {
    if (--conn.open === 0) this.tcp--;
  }

  dial(l, conn, clientIp, tried) {
    const b = l.backend;
    const client = conn.client;
    if (client.destroyed) return;
    const ep = tried.size < this.o.connectAttempts ? b.pick(clientIp, tried, Date.now()) : undefined;
    if (!ep) {
      if (this.o.logConnections) log(`tcp ${hp(clientIp, client.remotePort)} -> ${where(l.host, l.port, 'tcp')}: no endpoint answered (${tried.size} tried), reset`);
      return reset(client);
    }
    tried.add(ep.id);
    const up = net.connect({ host: ep.ip, port: ep.port, family: l.family, allowHalfOpen: true, noDelay: true, highWaterMark: this.o.bufferBytes });
    conn.up = up;
    conn.open++;
    this.sockets.add(up);
    const timer = setTimeout(() => up.destroy(Object.assign(new Error('connect timed out'), { code: 'ETIMEDOUT' })), this.o.connectTimeoutMs * 2 ** (tried.size - 1));
    const failed = (err) => {
      clearTimeout(timer);
      up.destroy();
      if (client.destroyed) return;
      if (this.o.logConnections) log(`tcp ${hp(clientIp, client.remotePort)} -> ${where(l.host, l.port, 'tcp')}: ${hp(ep.ip, ep.port)} failed (${err.code ?? err.message})`);
      // Not this one again for this client (affinity is chosen again).
      if (b.affinity.get(clientIp)?.id === ep.id) b.affinity.delete(clientIp);
      this.dial(l, conn, clientIp, tried);
    };
    up.once('error', failed);
    up.once('close', () => {
      clearTimeout(timer);
      this.sockets.delete(up);
      this.closed(conn);
    });
    up.once('connect', () => {
      clearTimeout(timer);
      up.off('error', failed);
      if (client.destroyed) return up.destroy();
      conn.paired = true;
      if (this.o.logConnections) log(`tcp ${hp(clientIp, client.remotePort)} -> ${where(l.host, l.port, 'tcp')} -> ${hp(ep.ip, ep.port)}`);
      up.on('error', () => this.kill(conn));
      // Either side gone before its peer's data was all passed on (an error, a reset, a destroy): the other goes too.
      client.on('close', () => {
        if (!up.readableEnded) up.destroy();
      });
      up.on('close', () => {
        if (!client.readableEnded) client.destroy();
      });
      client.pipe(up);
      up.pipe(client);
    });
  }

  kill(conn) {
    conn.client.destroy();
    conn.up?.destroy();
  }

  // --- UDP

  onUdp(l, msg, rinfo) {
    const key = `${rinfo.address} ${rinfo.port}`;
    let s = l.sessions.get(key);
    if (!s) {
      if (this.stopping || this.capped()) return;
      const ep = l.backend.pick(rinfo.address, new Set(), Date.now());
      if (!ep) {
        if (this.o.logConnections) log(`udp ${hp(rinfo.address, rinfo.port)} -> ${where(l.host, l.port, 'udp')}: no endpoint, dropped`);
        return;
      }
      s = this.openSession(l, key, ep, rinfo);
    }
    s.last = Date.now();
    if (s.pending) {
      if (s.pending.length < UDP_PENDING_MAX) s.pending.push(msg);
    } else s.up.send(msg);
  }

  openSession(l, key, ep, rinfo) {
    const up = dgram.createSocket(l.family === 6 ? 'udp6' : 'udp4');
    const s = { key, ep, up, addr: rinfo.address, port: rinfo.port, last: Date.now(), pending: [] };
    l.sessions.set(key, s);
    this.udp++;
    up.on('message', (reply) => {
      s.last = Date.now();
      l.handle?.send(reply, s.port, s.addr);
    });
    // A refused datagram (ICMP port unreachable) or a send error: the session ends, the next datagram opens another.
    up.on('error', () => this.closeSession(l, s));
    up.connect(ep.port, ep.ip, () => {
      const pending = s.pending;
      s.pending = undefined;
      for (const m of pending ?? []) up.send(m);
    });
    if (this.o.logConnections) log(`udp ${hp(s.addr, s.port)} -> ${where(l.host, l.port, 'udp')} -> ${hp(ep.ip, ep.port)}`);
    return s;
  }

  closeSession(l, s) {
    if (l.sessions.get(s.key) !== s) return;
    l.sessions.delete(s.key);
    this.udp--;
    try {
      s.up.close();
    } catch {
      // closed already
    }
  }

  /** UDP sessions whose endpoint left the listener's backend are closed (as conntrack entries would be flushed). */
  pruneSessions(l) {
    for (const s of l.sessions.values()) if (!l.backend.has(s.ep.id)) this.closeSession(l, s);
  }

  sweep() {
    const now = Date.now();
    const idle = now - this.o.udpIdleTimeoutMs;
    for (const l of this.listeners.values()) for (const s of l.sessions.values()) if (s.last <= idle) this.closeSession(l, s);
    for (const b of this.backends.values()) if (b.affinity.size) b.sweep(now);
  }

  stats() {
    const handles = {};
    for (const r of process.getActiveResourcesInfo()) handles[r] = (handles[r] ?? 0) + 1;
    const up = [...this.listeners.values()].filter((l) => l.up).length;
    return `stats listeners=${up} tcp=${this.tcp} tcp-sockets=${this.sockets.size} udp-sessions=${this.udp} handles=${Object.entries(handles)
      .sort()
      .map(([k, v]) => `${k}:${v}`)
      .join(',')}`;
  }

  /** Closes every listener, connection and session. */
  stop() {
    this.stopping = true;
    clearInterval(this.sweeper);
    for (const l of this.listeners.values()) this.closeListener(l);
    this.listeners.clear();
    for (const s of this.sockets) s.destroy();
  }
}

// ---------------------------------------------------------------------------
// main

/** Writes one ack line on fd 3. */
function ack(line) {
  const buf = Buffer.from(line.replace(/[\r\n]+/g, ' ').slice(0, 4000) + '\n');
  for (let off = 0; off < buf.length; ) {
    try {
      off += writeSync(3, buf, off);
    } catch (err) {
      if (err.code === 'EAGAIN') continue;
      log(`cannot write the ack on fd 3 (${err.code ?? err.message}): exiting`);
      process.exit(1);
    }
  }
}

export function main() {
  if (process.env.KPNG_CALLOUT_MODE !== 'persistent') {
    log('a persistent callout: run it with `kpng-callout --persistent [--changes] --callout …/userspace-proxy` (KPNG_CALLOUT_MODE is not "persistent")');
    process.exit(1);
  }
  try {
    fstatSync(3);
  } catch {
    log('file descriptor 3 (the acks) is not open: run it with `kpng-callout --persistent`');
    process.exit(1);
  }
  let options;
  try {
    options = readOptions();
  } catch (err) {
    log(err.message);
    process.exit(1);
  }
  const proxy = new UserspaceProxy(options);
  const table = new ServiceTable((msg) => log(msg));
  log(`started (pid ${process.pid}, node ${process.version}; max connections ${options.maxConnections}, UDP idle timeout ${options.udpIdleTimeoutMs} ms)`);

  let queue = Promise.resolve();
  let exiting = false;
  const exit = (why) => {
    if (exiting) return;
    exiting = true;
    proxy.stop();
    log(`${why}: listeners closed, exiting`);
    // stderr is a pipe (synchronous on Linux): every line is out.
    process.exit(0);
  };
  const frames = new FrameReader((header, lines) => {
    queue = queue.then(async () => {
      if (exiting) return;
      const r = table.apply(header, lines);
      if (!r.ok) {
        log(`frame not applied: ${r.why}`);
        ack(`error ${r.why}`);
        return;
      }
      const failed = await proxy.reconcile(planListeners(table.ordered(), (msg) => log(msg)));
      if (exiting) return;
      if (failed.length === 0) ack('ok');
      else ack(`error cannot listen on ${failed.map((f) => `${f.where}: ${f.why}`).join('; ')}`);
    });
  });
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (text) => frames.push(text));
  process.stdin.on('end', () => {
    if (frames.end()) log('the input ended inside a frame: that frame is ignored');
    queue = queue.then(() => exit('end of input'));
  });
  process.stdin.on('error', (err) => exit(`stdin: ${err.code ?? err.message}`));
  process.on('SIGTERM', () => exit('SIGTERM'));
  process.on('SIGINT', () => exit('SIGINT'));
  process.on('SIGUSR2', () => log(proxy.stats()));
}
