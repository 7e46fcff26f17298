/**
 * The programs the service-proxy lab (service-lab.ts) runs in its
 * namespaces: an agent per client namespace that opens TCP connections and
 * sends UDP datagrams on request (one line of JSON in, one out), and the pod
 * server that answers with its name and the source address it sees.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { within } from './wait.js';

/** What one connection or exchange gave. */
export interface Conn {
  /** The answer: the pod, the source it saw, its port; undefined when it failed. */
  pod?: string;
  src?: string;
  port?: number;
  /** Why it failed: an errno code (ECONNREFUSED...), 'timeout', or 'closed' (no answer). */
  err?: string;
  /** How long it took, in ms. */
  ms: number;
}

export interface ConnOptions {
  /** How many connections (default 1). */
  n?: number;
  /** How many at a time (default 1). */
  parallel?: number;
  /** Per connection (default 1500 ms). */
  timeoutMs?: number;
  /** UDP: the source port (each exchange then uses it, one after the other). */
  srcPort?: number;
}

/** The agent: JSON requests on stdin, one JSON answer per line on stdout. */
const AGENT = String.raw`
const net = require('node:net');
const dgram = require('node:dgram');
const rl = require('node:readline').createInterface({ input: process.stdin });
const clean = (a) => (a || '').replace(/^::ffff:/, '');
function parse(text) {
  const [pod, src, port] = text.trim().split(' ');
  return pod ? { pod, src, port: Number(port) } : { err: 'closed' };
}
function tcp(r) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    let text = '';
    let done = false;
    const finish = (o) => { if (!done) { done = true; clearTimeout(timer); s.destroy(); resolve({ ...o, ms: Date.now() - t0 }); } };
    const s = net.connect({ host: r.addr, port: r.port });
    const timer = setTimeout(() => finish({ err: 'timeout' }), r.timeoutMs);
    s.setEncoding('utf8');
    s.on('data', (d) => (text += d));
    s.on('end', () => finish(parse(text)));
    s.on('error', (e) => finish({ err: e.code || String(e) }));
  });
}
function udp(r) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    let done = false;
    const s = dgram.createSocket({ type: r.addr.includes(':') ? 'udp6' : 'udp4', reuseAddr: true });
    const finish = (o) => { if (!done) { done = true; clearTimeout(timer); try { s.close(); } catch {} resolve({ ...o, ms: Date.now() - t0 }); } };
    const timer = setTimeout(() => finish({ err: 'timeout' }), r.timeoutMs);
    s.on('error', (e) => finish({ err: e.code || String(e) }));
    s.on('message', (m) => finish(parse(m.toString('utf8'))));
    s.bind(r.srcPort || 0, () => s.connect(r.port, r.addr, (e) => (e ? finish({ err: e.code || String(e) }) : s.send('x'))));
  });
}
rl.on('line', async (line) => {
  const r = JSON.parse(line);
  const one = r.op === 'udp' ? udp : tcp;
  const out = new Array(r.n);
  let next = 0;
  const parallel = r.srcPort ? 1 : Math.max(1, r.parallel);
  await Promise.all(Array.from({ length: Math.min(parallel, r.n) }, async () => {
    while (next < r.n) { const i = next++; out[i] = await one(r); }
  }));
  process.stdout.write(JSON.stringify({ id: r.id, out }) + '\n');
});
`;

/** The pod server: TCP and UDP on every port of POD_PORTS, answering `<pod> <source> <port>`. */
export const SERVER = String.raw`
const net = require('node:net');
const dgram = require('node:dgram');
const [pod, ports] = [process.argv[1], JSON.parse(process.argv[2])];
const clean = (a) => (a || '').replace(/^::ffff:/, '');
for (const port of ports) {
  net.createServer((s) => { s.on('error', () => {}); s.end(pod + ' ' + clean(s.remoteAddress) + ' ' + port + '\n'); }).listen(port, '::');
  const u = dgram.createSocket({ type: 'udp6', ipv6Only: false });
  u.on('message', (m, rinfo) => u.send(pod + ' ' + clean(rinfo.address) + ' ' + port + '\n', rinfo.port, rinfo.address));
  u.bind(port, '::');
}
`;

export class Agent {
  private readonly child: ChildProcess;
  private readonly waiting = new Map<number, (out: Conn[]) => void>();
  private seq = 0;
  private stderr = '';

  constructor(ns: string) {
    this.child = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', AGENT], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { PATH: process.env.PATH },
    });
    this.child.stdin!.on('error', () => {});
    this.child.stderr!.setEncoding('utf8').on('data', (d: string) => (this.stderr += d));
    createInterface(this.child.stdout!).on('line', (l) => {
      const { id, out } = JSON.parse(l) as { id: number; out: Conn[] };
      this.waiting.get(id)?.(out);
      this.waiting.delete(id);
    });
  }

  run(op: 'tcp' | 'udp', addr: string, port: number, o: ConnOptions = {}): Promise<Conn[]> {
    const id = ++this.seq;
    const req = { id, op, addr, port, n: o.n ?? 1, parallel: o.parallel ?? 1, timeoutMs: o.timeoutMs ?? 1500, srcPort: o.srcPort ?? 0 };
    const answer = new Promise<Conn[]>((resolve) => this.waiting.set(id, resolve));
    this.child.stdin!.write(JSON.stringify(req) + '\n');
    const bound = (req.timeoutMs + 500) * Math.ceil(req.n / (req.srcPort ? 1 : req.parallel)) + 15_000;
    return within(answer, () => `the agent's answer to ${op} ${addr} ${port} (agent stderr: ${this.stderr})`, bound);
  }

  kill(): void {
    this.child.kill('SIGKILL');
  }
}
