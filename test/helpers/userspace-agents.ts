/**
 * The programs of the userspace-proxy lab (userspace-lab.ts): the pod
 * server, and the agent (`Agent`) that makes connections on request in the
 * client and the node namespaces.
 */
import type { ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { WAIT_MS, within } from './wait.js';

/** The ports the pod servers listen on (TCP and UDP). */
export const POD_PORTS = [8080, 9090] as const;

/** The pod server: `node -e POD_SERVER NAME`. */
export const POD_SERVER = `
const net = require('node:net'), dgram = require('node:dgram');
const name = process.argv[1];
for (const port of ${JSON.stringify(POD_PORTS)}) {
  net.createServer({ allowHalfOpen: true }, (s) => {
    s.on('error', () => {});
    s.write(name + ':' + port + '\\n');
    s.pipe(s);
  }).listen(port, '::');
  const u = dgram.createSocket({ type: 'udp6', ipv6Only: false });
  u.on('message', (m, r) => u.send(name + ':' + port + ' ' + m, r.port, r.address));
  u.bind(port, '::');
}
`;

/**
 * The agent: JSON commands on stdin, one per line, each `{id, op, ...}`;
 * answers `{id, r}` on stdout, in any order. Results of a connection: its
 * first line, or 'ERR:<code>' (reset, refused...), 'CLOSED' (closed with
 * nothing said), 'TIMEOUT'; with the milliseconds it took.
 */
export const AGENT = `
const net = require('node:net'), dgram = require('node:dgram');
const held = new Map(), servers = new Map();
let nextId = 1;
function tcpOnce(c) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    let buf = '', done = false;
    const s = net.connect({ host: c.host, port: c.port });
    const finish = (r) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      s.destroy();
      resolve({ r, ms: Date.now() - t0 });
    };
    const timer = setTimeout(() => finish('TIMEOUT'), c.timeoutMs || 5000);
    s.setEncoding('utf8');
    s.on('data', (d) => { buf += d; const i = buf.indexOf('\\n'); if (i >= 0) finish(buf.slice(0, i)); });
    s.on('error', (e) => finish('ERR:' + e.code));
    s.on('close', () => finish(buf || 'CLOSED'));
  });
}
async function pool(n, conc, one) {
  const out = new Array(n);
  let next = 0;
  const worker = async () => { while (next < n) { const i = next++; out[i] = await one(i); } };
  await Promise.all(Array.from({ length: Math.min(conc, n) }, worker));
  return out;
}
function udpAsk(sock, c, payload) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const timer = setTimeout(() => { sock.off('message', on); resolve({ r: 'TIMEOUT', ms: Date.now() - t0 }); }, c.timeoutMs || 5000);
    const on = (m, rinfo) => { clearTimeout(timer); sock.off('message', on); resolve({ r: String(m), from: rinfo.address + ' ' + rinfo.port, ms: Date.now() - t0 }); };
    sock.on('message', on);
    sock.send(payload, c.port, c.host);
  });
}
const udpSocket = (host) => new Promise((resolve) => {
  const s = dgram.createSocket(host.includes(':') ? 'udp6' : 'udp4');
  s.on('error', () => {});
  s.bind(0, () => resolve(s));
});
function waitLine(h) {
  return new Promise((resolve) => {
    const check = () => {
      h.wake = undefined;
      const i = h.buf.indexOf('\\n');
      if (i >= 0) { const l = h.buf.slice(0, i); h.buf = h.buf.slice(i + 1); return resolve(l); }
      if (h.closed) return resolve(h.err ? 'ERR:' + h.err : 'CLOSED');
      h.wake = check;
    };
    check();
  });
}
const ops = {
  async tcp(c) { return pool(c.n || 1, c.conc || 1, () => tcpOnce(c)); },
  async churn(c) {
    const rs = await pool(c.n, c.conc || 20, () => tcpOnce(c));
    const counts = {};
    for (const x of rs) counts[x.r] = (counts[x.r] || 0) + 1;
    return counts;
  },
  async udp(c) {
    // fresh: a new socket (a new client port) per datagram; else one socket for all.
    const out = [];
    let sock = c.fresh ? undefined : await udpSocket(c.host);
    for (let i = 0; i < (c.n || 1); i++) {
      if (c.fresh) sock = await udpSocket(c.host);
      out.push(await udpAsk(sock, c, c.payload || 'ping'));
      if (c.fresh) sock.close();
    }
    if (!c.fresh) sock.close();
    return out;
  },
  async hold(c) {
    const id = nextId++;
    const h = { s: net.connect({ host: c.host, port: c.port }), buf: '', closed: false, err: '', wake: undefined };
    h.s.setEncoding('utf8');
    h.s.on('data', (d) => { h.buf += d; h.wake?.(); });
    h.s.on('error', (e) => { h.err = e.code; });
    h.s.on('close', () => { h.closed = true; h.wake?.(); });
    held.set(id, h);
    return { id, first: await waitLine(h) };
  },
  async echo(c) {
    const h = held.get(c.hid);
    h.s.write(c.text + '\\n');
    return waitLine(h);
  },
  async halfclose(c) {
    // The first line, then c.text sent and our side closed: what comes back until the server closes.
    const h = held.get(c.hid);
    h.s.end(c.text + '\\n');
    await new Promise((resolve) => (h.closed ? resolve() : h.s.once('close', resolve)));
    held.delete(c.hid);
    return { rest: h.buf, err: h.err };
  },
  async release(c) {
    const h = held.get(c.hid);
    held.delete(c.hid);
    h.s.destroy();
    return true;
  },
  async listen(c) {
    const s = net.createServer();
    return new Promise((resolve) => {
      s.once('error', (e) => resolve('ERR:' + e.code));
      s.listen({ host: c.host, port: c.port }, () => { servers.set(c.host + ' ' + c.port, s); resolve('ok'); });
    });
  },
  async unlisten(c) {
    const s = servers.get(c.host + ' ' + c.port);
    servers.delete(c.host + ' ' + c.port);
    await new Promise((resolve) => s.close(resolve));
    return 'ok';
  },
};
require('node:readline').createInterface(process.stdin).on('line', async (l) => {
  const c = JSON.parse(l);
  let r;
  try { r = await ops[c.op](c); } catch (e) { r = { error: String(e && e.stack || e) }; }
  process.stdout.write(JSON.stringify({ id: c.id, r }) + '\\n');
});
process.stdout.write(JSON.stringify({ id: 0, r: 'ready' }) + '\\n');
`;

/** One connection's result: its first line (or 'ERR:<code>', 'CLOSED', 'TIMEOUT') and how long it took. */
export interface Answer {
  r: string;
  ms: number;
  /** UDP: the address and port the answer came from. */
  from?: string;
}

/** An agent process in a namespace. */
export class Agent {
  private readonly waiting = new Map<number, (r: unknown) => void>();
  private seq = 0;
  readonly ready: Promise<unknown>;

  constructor(readonly child: ChildProcess) {
    this.ready = new Promise((resolve) => this.waiting.set(0, resolve));
    createInterface(child.stdout!).on('line', (l) => {
      const { id, r } = JSON.parse(l) as { id: number; r: unknown };
      const w = this.waiting.get(id);
      this.waiting.delete(id);
      w?.(r);
    });
  }

  call<T>(op: string, args: Record<string, unknown>, ms = WAIT_MS): Promise<T> {
    const id = ++this.seq;
    const p = new Promise<T>((resolve, reject) => {
      this.waiting.set(id, (r) => {
        const e = r as { error?: string } | null;
        if (e && typeof e === 'object' && 'error' in e) reject(new Error(`agent ${op}: ${e.error}`));
        else resolve(r as T);
      });
    });
    this.child.stdin!.write(JSON.stringify({ id, op, ...args }) + '\n');
    return within(p, `the agent's ${op} ${JSON.stringify(args)}`, ms);
  }

  /** `n` TCP connections to host:port (`conc` at a time): each one's first line. */
  tcp(host: string, port: number, n = 1, conc = 1, timeoutMs?: number): Promise<Answer[]> {
    return this.call('tcp', { host, port, n, conc, timeoutMs });
  }

  /** `n` datagrams to host:port, from one socket (or a new one each with `fresh`): each answer. */
  udp(host: string, port: number, n = 1, fresh = false, payload = 'ping'): Promise<Answer[]> {
    return this.call('udp', { host, port, n, fresh, payload });
  }
}
