// userspace-proxy: a persistent kpng callout that proxies Services in
// userspace, with nothing but Node's standard library (Node >= 20).
// Started by callouts/userspace-proxy (the launcher) under
// `kpng-callout --persistent [--changes]`; see callouts/README.md.
//
// For every Service port (TCP, UDP; SCTP is skipped with a log line) it
// listens on each ClusterIP, ExternalIP and LoadBalancerIP at Port, and on
// NodePort on every address (0.0.0.0 and ::, IPv6-only so both bind), and
// forwards:
// - TCP: each connection to an endpoint of the listener's family, round
//   robin among those the destination may use (ClusterIP: Internal scope;
//   the others: External; no Scopes: both), at its PortOverrides entry
//   named as the Service port, else TargetPort, else Port. A connect that
//   fails tries the next endpoint (at most
//   USERSPACE_PROXY_CONNECT_ATTEMPTS, each with a doubling timeout); with no
//   usable endpoint the client is reset at once. Half-closes are passed on;
//   an error on either side destroys both.
// - UDP: one upstream socket per client address:port, kept while datagrams
//   flow; replies leave from the listening socket (the Service address).
// - SessionAffinity ClientIP: a client IP keeps its endpoint for
//   TimeoutSeconds (10800 when 0 or missing), through any Service address.
// - A Service address whose TCP port is also a NodePort is served by the
//   NodePort's socket, by the connection's local address (Linux lets no
//   socket listen beside a wildcard one); UDP ones share the port
//   (SO_REUSEADDR). An endpoint that is one of the proxy's own listeners is
//   skipped (a loop), and so are loopback and link-local addresses; a loop
//   the state cannot show (a node address of a local route at a NodePort)
//   is refused at run time: a connection or datagram from one of the
//   proxy's own upstream sockets.
//
// Frames (stdin) are applied one at a time: listeners of removed Services or
// ports are closed, new ones opened, the others keep their socket and
// connections (UDP sessions to an endpoint that is gone are closed). The ack
// on fd 3 is `ok` when every listener is up, else `error` naming each
// address, port and errno not bound (tried again on the next frame). State
// strings are only map keys and, JSON-quoted, log lines. At the end of
// stdin, or on SIGTERM / SIGINT, everything is closed and it exits 0;
// SIGUSR2 logs a stats line. This module is the proxy; -main.mjs its main
// (frames in, acks out), -state.mjs reads frames and checks the state,
// -plan.mjs plans listeners, -address.mjs checks addresses, -backend.mjs
// picks endpoints, -common.mjs holds the options and logging.
import dgram from 'node:dgram';
import net from 'node:net';
import { Backend, closeQuietly, reset } from './userspace-proxy-backend.mjs';
import { log } from './userspace-proxy-common.mjs';
import { canonicalIP } from './userspace-proxy-address.mjs';
import { hp, where } from './userspace-proxy-state.mjs';
export { Backend } from './userspace-proxy-backend.mjs'; // the launcher and the tests import this module only
export { DEFAULTS, readOptions } from './userspace-proxy-common.mjs';
export * from './userspace-proxy-state.mjs';
export * from './userspace-proxy-plan.mjs';
export * from './userspace-proxy-address.mjs';
export { main } from './userspace-proxy-main.mjs';

// Datagrams kept per UDP session while its upstream socket connects; the longest timer Node keeps (a longer
// one fires at once); a TCP connection by its ends.
const UDP_PENDING_MAX = 64;
const MAX_TIMER_MS = 2 ** 31 - 1;
const tuple = (a, ap, b, bp) => `${canonicalIP(a ?? '')} ${ap} ${canonicalIP(b ?? '')} ${bp}`;

export class UserspaceProxy {
  constructor(options) {
    this.o = options;
    /** listener key -> listener */
    this.listeners = new Map();
    /** backend key -> Backend */
    this.backends = new Map();
    /** affinity key -> client IP -> { id, until }: shared by the backends of one Service port and family. */
    this.affinities = new Map();
    this.tcp = 0;
    this.udp = 0;
    /** Every TCP socket we hold (clients and upstreams), to close them all at the end. */
    this.sockets = new Set();
    this.stopping = false;
    this.lastLogged = new Map(); // line kind -> when one was last logged (logOnceASecond)
    /** Our own upstream sockets (TCP: both ends, `tuple`; UDP: `address port`): a connection or datagram from one is a loop. */
    this.ownTcp = new Set();
    this.ownUdp = new Set();
    this.sweeper = setInterval(() => this.sweep(), Math.max(50, Math.min(5_000, Math.floor(options.udpIdleTimeoutMs / 4))));
  }

  /** Applies a plan (planListeners); resolves with the binds that failed: [{ where, label, why }] (not logged). */
  async reconcile(plan) {
    for (const [key, l] of this.listeners) {
      if (!plan.has(key)) {
        this.closeListener(l);
        this.listeners.delete(key);
      }
    }
    const backends = new Map();
    const affinities = new Map();
    const backendFor = (wb) => {
      let b = backends.get(wb.key);
      if (b) return b;
      const affinity = affinities.get(wb.affinityKey) ?? this.affinities.get(wb.affinityKey) ?? new Map();
      affinities.set(wb.affinityKey, affinity);
      b = this.backends.get(wb.key) ?? new Backend(wb.key, affinity);
      b.affinity = affinity;
      b.update(wb);
      backends.set(b.key, b);
      return b;
    };
    const binds = [];
    for (const [key, want] of plan) {
      const b = backendFor(want.backend);
      let l = this.listeners.get(key);
      // Shared with a NodePort now (or no longer): bound again with (or without) SO_REUSEADDR, in place: its
      // sessions stay (their replies leave through l.handle, the new socket), so that its clients keep their endpoint.
      if (l && l.up && l.proto === 'udp' && l.shared !== (want.shared === true)) {
        closeQuietly(l.handle);
        l.handle = undefined;
        l.up = false;
      }
      if (l && !l.up) l.shared = want.shared === true;
      if (!l) {
        l = { key, proto: want.proto, family: want.family, host: want.host, port: want.port, nodePort: want.nodePort, shared: want.shared === true, label: want.label, backend: b, routes: undefined, handle: undefined, up: false, failed: undefined, sessions: new Map() };
        this.listeners.set(key, l);
      }
      l.backend = b;
      if (l.up && l.label !== want.label) log(`${where(l.host, l.port, l.proto)} now for ${want.label} (was ${l.label})`);
      l.label = want.label;
      l.routes = want.routes ? new Map(want.routes.map((r) => [r.host, { host: r.host, label: r.label, backend: backendFor(r.backend) }])) : undefined;
      if (l.proto === 'udp') this.pruneSessions(l);
      if (!l.up) binds.push(this.bind(l));
    }
    this.backends = backends;
    this.affinities = affinities;
    await Promise.all(binds);
    const failed = [];
    for (const l of this.listeners.values()) if (!l.up) failed.push({ where: where(l.host, l.port, l.proto), label: l.label, why: l.failed ?? 'not bound' });
    return failed;
  }

  bind(l) {
    return new Promise((resolve) => {
      const done = (err) => {
        if (err) {
          closeQuietly(l.handle);
          l.handle = undefined;
          l.up = false;
          const code = err.code ?? 'error';
          l.failed = `${code}${err.message && !err.message.startsWith(code) ? ` (${err.message})` : ''}`;
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
        const sock = dgram.createSocket({ type: l.family === 6 ? 'udp6' : 'udp4', ipv6Only: l.host === '::', reuseAddr: l.shared });
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
    closeQuietly(l.handle);
    l.handle = undefined;
    for (const s of l.sessions.values()) this.closeSession(l, s);
    if (l.up) log(`closed ${where(l.host, l.port, l.proto)} (${l.label})`);
    l.up = false;
  }

  /** Logs `line` unless a line of this `kind` was logged in the last second. */
  logOnceASecond(kind, line) {
    const now = Date.now();
    if (now - (this.lastLogged.get(kind) ?? 0) <= 1000) return;
    this.lastLogged.set(kind, now);
    log(line);
  }

  /** An endpoint that leads back into the proxy (one of the node's addresses at a NodePort, found at run time). */
  loop(what) {
    this.logOnceASecond('loop', `${what}: it comes from this proxy itself (an endpoint that is one of its own listeners, a loop): refused`);
  }

  capped() {
    if (this.tcp + this.udp < this.o.maxConnections) return false;
    this.logOnceASecond('cap', `${this.tcp + this.udp} connections and UDP sessions: the cap (USERSPACE_PROXY_MAX_CONNECTIONS=${this.o.maxConnections}) is reached, refusing new ones`);
    return true;
  }

  // --- TCP

  onTcp(l, client) {
    if (this.stopping || this.capped()) return reset(client);
    const clientIp = client.remoteAddress ?? '';
    // A NodePort socket also serving Service addresses at its port: the address the client asked for decides.
    const route = l.routes && client.localAddress ? l.routes.get(canonicalIP(client.localAddress)) : undefined;
    const dest = route ?? { host: l.host, backend: l.backend };
    if (dest.backend.endpoints.length === 0) {
      if (this.o.logConnections) log(`tcp ${hp(clientIp, client.remotePort)} -> ${where(dest.host, l.port, 'tcp')}: no endpoint, reset`);
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
    // A connection from one of our own upstream sockets is a loop (its 'connect' has been seen by the next turn);
    // both ends count: two sockets connected to different places may share a local port.
    const from = tuple(clientIp, client.remotePort, client.localAddress, client.localPort);
    setImmediate(() => {
      if (this.ownTcp.has(from)) {
        this.loop(`tcp ${hp(clientIp, client.remotePort)} -> ${where(dest.host, l.port, 'tcp')}`);
        return reset(client);
      }
      this.dial(l, dest, conn, clientIp, new Set());
    });
  }

  closed(conn) {
    if (--conn.open === 0) this.tcp--;
  }

  dial(l, dest, conn, clientIp, tried) {
    const b = dest.backend;
    const client = conn.client;
    if (client.destroyed) return;
    const ep = tried.size < this.o.connectAttempts ? b.pick(clientIp, tried, Date.now()) : undefined;
    if (!ep) {
      if (this.o.logConnections) log(`tcp ${hp(clientIp, client.remotePort)} -> ${where(dest.host, l.port, 'tcp')}: no endpoint answered (${tried.size} tried), reset`);
      return reset(client);
    }
    tried.add(ep.id);
    const up = net.connect({ host: ep.ip, port: ep.port, family: l.family, allowHalfOpen: true, noDelay: true, highWaterMark: this.o.bufferBytes });
    conn.up = up;
    conn.open++;
    this.sockets.add(up);
    const timeoutMs = Math.min(MAX_TIMER_MS, this.o.connectTimeoutMs * 2 ** (tried.size - 1));
    const timer = setTimeout(() => up.destroy(Object.assign(new Error('connect timed out'), { code: 'ETIMEDOUT' })), timeoutMs);
    const failed = (err) => {
      clearTimeout(timer);
      up.destroy();
      if (client.destroyed) return;
      if (this.o.logConnections) log(`tcp ${hp(clientIp, client.remotePort)} -> ${where(dest.host, l.port, 'tcp')}: ${hp(ep.ip, ep.port)} failed (${err.code ?? err.message})`);
      // Not this one again for this client (affinity is chosen again).
      if (b.affinity.get(clientIp)?.id === ep.id) b.affinity.delete(clientIp);
      this.dial(l, dest, conn, clientIp, tried);
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
      const own = tuple(up.localAddress, up.localPort, up.remoteAddress, up.remotePort);
      this.ownTcp.add(own);
      up.once('close', () => this.ownTcp.delete(own));
      if (this.o.logConnections) log(`tcp ${hp(clientIp, client.remotePort)} -> ${where(dest.host, l.port, 'tcp')} -> ${hp(ep.ip, ep.port)}`);
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

  /** An error or a reset on either side: the other side is reset too (not closed: a FIN would pass a cut stream off as complete). */
  kill(conn) {
    reset(conn.client);
    if (conn.up) {
      if (conn.paired) reset(conn.up);
      else conn.up.destroy();
    }
  }

  // --- UDP

  onUdp(l, msg, rinfo) {
    const key = `${rinfo.address} ${rinfo.port}`;
    let s = l.sessions.get(key);
    if (!s) {
      if (this.stopping) return;
      if (this.ownUdp.has(`${canonicalIP(rinfo.address)} ${rinfo.port}`)) return this.loop(`udp ${hp(rinfo.address, rinfo.port)} -> ${where(l.host, l.port, 'udp')}`);
      if (this.capped()) return;
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
      try {
        const a = up.address();
        if (l.sessions.get(s.key) === s) {
          s.own = `${canonicalIP(a.address)} ${a.port}`;
          this.ownUdp.add(s.own);
        }
      } catch {
        // closed already
      }
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
    if (s.own) this.ownUdp.delete(s.own);
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
