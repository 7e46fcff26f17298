// userspace-proxy: the listeners a state needs (planListeners), and a
// Planner that plans each frame from what the Services that did not change
// planned before. See userspace-proxy.mjs.
//
// Why a Planner: planning every Service again at each frame took 1.4–2.8 s
// at 10,000 Services (40,000 listeners, 400,000 endpoints: a string per
// endpoint per frame, and the collections they made), and no connection was
// accepted meanwhile. A Service's part of the plan (its claims and backends)
// is kept with its object, which ServiceTable keeps while the Service's line
// does not change; a frame then costs a few look-ups per listener, and the
// per-endpoint loop check runs only when an index of every endpoint address
// says that some endpoint is one of the listeners.
import { q } from './userspace-proxy-common.mjs';
import { hp, where } from './userspace-proxy-state.mjs';

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

/** The port an endpoint takes for a Service port, 0 when it has none usable. */
export function targetPortOf(endpoint, port) {
  const o = endpoint.overrides.get(port.name);
  if (o !== undefined) return o;
  if (port.targetPort) return port.targetPort;
  // A named target port (TargetPortName) that overrides do not list: the pod
  // does not serve it, so it is no endpoint of this port (as kube-proxy).
  return port.named && endpoint.overrides.size > 0 ? 0 : port.port;
}

const anyHost = (fam) => (fam === 4 ? '0.0.0.0' : '::');
/** Index of a (protocol, family) pair, for the per-frame sets of wildcard ports. */
const pf = (proto, fam) => (proto === 'udp' ? 2 : 0) + (fam === 6 ? 1 : 0);

/**
 * A Service's part of a plan, in its order: `claims` [{ l, b }] (the
 * listener it asks for and its backend's entry) and `backends`
 * [{ b, proto, fam, label, lkeys }] (lkeys: each endpoint as a listener key,
 * `proto ip port`). Never changed once made: a frame copies what it changes.
 */
function pieceOf(svc) {
  const claims = [];
  const backends = [];
  for (const port of svc.ports) {
    const pl = `${svc.label} port ${port.port}/${port.proto}${port.name === '' ? '' : ` (${q(port.name)})`}`;
    const mine = {};
    const backend = (scope, fam) => {
      let entry = mine[`${scope}${fam}`];
      if (!entry) {
        const b = {
          key: `${svc.key}\0${port.proto}\0${port.port}\0${port.name}\0${scope}\0${fam}`,
          // One client keeps one endpoint per Service port, whichever address it came through (as kube-proxy).
          affinityKey: `${svc.key}\0${port.proto}\0${port.port}\0${port.name}\0${fam}`,
          affinityMs: svc.affinityMs,
          endpoints: endpointsFor(svc, port, scope, fam),
        };
        entry = { b, proto: port.proto, fam, label: pl, lkeys: b.endpoints.map((e) => `${port.proto} ${e.ip} ${e.port}`) };
        mine[`${scope}${fam}`] = entry;
        backends.push(entry);
      }
      return entry;
    };
    const add = (host, fam, lport, scope, nodePort) => {
      const entry = backend(scope, fam);
      claims.push({ l: { key: `${port.proto} ${host} ${lport}`, proto: port.proto, family: fam, host, port: lport, nodePort, label: pl, backend: entry.b }, b: entry });
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
  return { claims, backends };
}

/**
 * Plans frames: `plan(services, why, localAddresses)` is planListeners'
 * answer, with each Service's piece kept while its object is given again.
 */
export class Planner {
  constructor() {
    /** Service object -> its piece. */
    this.pieces = new WeakMap();
    /** The Services of the last plan, whose endpoints the indexes count. */
    this.indexed = new Set();
    /** `proto ip port` of every endpoint of those Services -> how many. */
    this.endpointKeys = new Map();
    /** pf(proto, family) * 65536 + port -> endpoint address -> how many (loops through a NodePort). */
    this.endpointPorts = new Map();
  }

  piece(svc) {
    let p = this.pieces.get(svc);
    if (!p) {
      p = pieceOf(svc);
      this.pieces.set(svc, p);
    }
    return p;
  }

  /** Counts the endpoints of `svc` in (by +1) or out of (by -1) the indexes. */
  count(svc, by) {
    for (const { b, proto, fam, lkeys } of this.piece(svc).backends) {
      for (let i = 0; i < lkeys.length; i++) {
        const n = (this.endpointKeys.get(lkeys[i]) ?? 0) + by;
        if (n === 0) this.endpointKeys.delete(lkeys[i]);
        else this.endpointKeys.set(lkeys[i], n);
        const e = b.endpoints[i];
        const pk = pf(proto, fam) * 65536 + e.port;
        let ips = this.endpointPorts.get(pk);
        if (!ips) this.endpointPorts.set(pk, (ips = new Map()));
        const m = (ips.get(e.ip) ?? 0) + by;
        if (m === 0) ips.delete(e.ip);
        else ips.set(e.ip, m);
        if (ips.size === 0) this.endpointPorts.delete(pk);
      }
    }
  }

  plan(services, why = () => {}, localAddresses = new Set()) {
    const now = new Set(services);
    for (const svc of services) if (!this.indexed.has(svc)) this.count(svc, 1);
    for (const svc of this.indexed) if (!now.has(svc)) this.count(svc, -1);
    this.indexed = now;

    const listeners = new Map();
    // The backends some listener of this plan uses, in the order they are first used (a Set keeps it).
    const used = new Set();
    for (const svc of services) {
      for (const { l, b } of this.piece(svc).claims) {
        const have = listeners.get(l.key);
        if (have) {
          if (have.label !== l.label) why(`${where(l.host, l.port, l.proto)} is claimed by ${have.label} already: not for ${l.label}`);
          continue;
        }
        listeners.set(l.key, l);
        used.add(b);
      }
    }
    // Listeners copied for this frame (a piece's are never changed).
    const fresh = new Set();
    const own = (l) => {
      if (fresh.has(l)) return l;
      const c = { ...l };
      fresh.add(c);
      listeners.set(c.key, c);
      return c;
    };
    // The wildcard (NodePort) ports of this plan, per protocol and family.
    const wild = [new Set(), new Set(), new Set(), new Set()];
    let loops = false;
    for (const l of listeners.values()) {
      if (this.endpointKeys.has(l.key)) loops = true;
      if (l.host !== anyHost(l.family)) continue;
      wild[pf(l.proto, l.family)].add(l.port);
      const ips = this.endpointPorts.get(pf(l.proto, l.family) * 65536 + l.port);
      if (ips) for (const a of localAddresses) if (ips.has(a)) loops = true;
    }
    if (loops) this.dropLoops(listeners, used, own, wild, why, localAddresses);
    for (const [key, l] of listeners) {
      if (l.nodePort || !wild[pf(l.proto, l.family)].has(l.port)) continue;
      const anyKey = `${l.proto} ${anyHost(l.family)} ${l.port}`;
      if (l.proto === 'udp') {
        own(l).shared = true;
        own(listeners.get(anyKey)).shared = true;
        continue;
      }
      const any = own(listeners.get(anyKey));
      (any.routes ??= []).push({ host: l.host, label: l.label, backend: l.backend });
      listeners.delete(key);
    }
    return listeners;
  }

  /** Leaves out of the backends the endpoints that are listeners of this plan (told to `why`). */
  dropLoops(listeners, used, own, wild, why, localAddresses) {
    const swapped = new Map();
    for (const { b, proto, fam, label } of used) {
      const keep = b.endpoints.filter((e) => {
        const loop = listeners.has(`${proto} ${e.ip} ${e.port}`) || (wild[pf(proto, fam)].has(e.port) && localAddresses.has(e.ip));
        if (loop) why(`${label}: endpoint ${hp(e.ip, e.port)} is an address this proxy listens on (a loop): skipped`);
        return !loop;
      });
      if (keep.length !== b.endpoints.length) swapped.set(b, { ...b, endpoints: keep });
    }
    if (swapped.size === 0) return;
    for (const l of [...listeners.values()]) {
      const b = swapped.get(l.backend);
      if (b) own(l).backend = b;
    }
  }
}

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
 * to `why` and left out. A frame after another plans with a {@link Planner}.
 */
export function planListeners(services, why = () => {}, localAddresses = new Set()) {
  return new Planner().plan(services, why, localAddresses);
}
