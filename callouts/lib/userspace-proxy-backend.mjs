// userspace-proxy: choosing an endpoint (round robin, ClientIP affinity),
// and resetting a socket or closing a listener. See userspace-proxy.mjs.


/** Resets a socket (RST) when it can, else destroys it. */
export function reset(sock) {
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

/** Closes a listening socket or server that may never have been bound, or be closed already. */
export function closeQuietly(handle) {
  try {
    handle?.close();
  } catch {
    // never bound, or closed already
  }
}

/** An endpoint chooser for one (Service port, scope, family): round robin, and ClientIP affinity. */
export class Backend {
  /** `affinity`: client IP -> { id, until }, shared by the backends of one Service port (its addresses and scopes). */
  constructor(key, affinity = new Map()) {
    this.key = key;
    this.endpoints = [];
    this.ids = new Set();
    this.next = 0;
    this.affinityMs = 0;
    this.affinity = affinity;
  }

  update(plan) {
    // A plan's endpoints are not changed once planned: the same list, the same ids.
    if (plan.endpoints !== this.endpoints) {
      this.endpoints = plan.endpoints;
      this.ids = new Set(plan.endpoints.map((e) => e.id));
    }
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
      // A retry (tried not empty) does not move the turn: moving it past the endpoint that answers would hand the
      // next connection back to the one that failed (with two endpoints, every connection would try a dead one first).
      if (tried.size === 0) this.next = (this.next + i + 1) % eps.length;
      if (this.affinityMs) this.affinity.set(clientIp, { id: ep.id, until: now + this.affinityMs });
      return ep;
    }
    return undefined;
  }

  /** Drops expired affinities (one whose endpoint left is replaced by the client's next connection). */
  sweep(now) {
    for (const [ip, a] of this.affinity) if (a.until <= now) this.affinity.delete(ip);
  }
}

/** The running proxy: listeners, backends, connections. */
