#!/usr/bin/env node
// A stripped-down kpng localv1 server for the benchmarks (not a test helper):
// plain node:http2 speaking just enough gRPC for `/localv1.Sets/Watch`, with
// every message encoded once, up front, by our own codec (dist/codec.js), so
// that the server costs next to nothing and the figures are the client's.
//
// It holds a synthetic state of SERVICES Services with PER_SERVICE Endpoints
// each and behaves as kpng does: a new stream gets Reset + the full state +
// Sync; each later WatchReq gets the diff of everything changed since the
// last answer on that stream (waiting for a change when there is none).
//
// Run as a child process (node bench/kpng-bench-server.js --services N
// --per-service M); it prints `listening on 127.0.0.1:PORT`, then obeys
// lines on stdin:
//   change K [TAG]     give endpoint K (0-based over all endpoints) a new IP
//   burst N MS         N changes spread evenly over MS milliseconds
//   quit
// and reports on stdout:
//   sync STREAM SEQ HRTIME_NS OPS   a Sync was written (HRTIME_NS from
//                                   process.hrtime.bigint(): CLOCK_MONOTONIC,
//                                   comparable across processes)
//   burst-done N
import http2 from 'node:http2';
import { createInterface } from 'node:readline';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const { marshalEndpoint, marshalOpItem, marshalService } = await import(join(root, 'dist/codec.js'));

/** One gRPC length-prefixed message. */
function frame(msg) {
  const b = Buffer.allocUnsafe(5 + msg.length);
  b[0] = 0;
  b.writeUInt32BE(msg.length, 1);
  b.set(msg, 5);
  return b;
}

/** The benchmark's model objects: what a kpng server sends for an ordinary cluster. */
export function service(i) {
  return {
    Namespace: `ns-${i % 50}`,
    Name: `svc-${i}`,
    Type: 'ClusterIP',
    IPs: { ClusterIPs: { V4: [`10.96.${i >> 8}.${i & 255}`] }, ExternalIPs: {} },
    Ports: [{ Name: 'http', Protocol: 1, Port: 80, TargetPort: 8080 }],
  };
}

export function endpoint(i, j, version = 0) {
  const v = (i * 16 + j + version * 7919) % 16_000_000;
  return {
    IPs: { V4: [`10.${128 + (v >> 16)}.${(v >> 8) & 255}.${v & 255}`] },
    Local: j === 0,
    PortOverrides: [{ Name: 'http', Port: 8080 }],
    Scopes: { Internal: true, External: true },
  };
}

export const servicePath = (i) => `ns-${i % 50}/svc-${i}`;
export const endpointPath = (i, j) => `${servicePath(i)}/svc-${i}-7d9f8b6c5-${j.toString(36).padStart(5, 'x')}`;

const setOp = (set, path, bytes) => frame(marshalOpItem({ Set: { Ref: { Set: set, Path: path }, Bytes: bytes } }));
const SYNC = frame(marshalOpItem({ Sync: {} }));
const RESET = frame(marshalOpItem({ Reset: {} }));

/**
 * Starts the server in this process. Returns { port, change(k), close() };
 * `onSync(stream, seq, hrtime, ops)` observes every Sync written.
 */
export async function startBenchServer({ services, perService, port = 0, onSync = () => {} }) {
  // The full state as one buffer of frames: a fresh stream gets it in one
  // write. As kpng, in plain byte order of the paths.
  const byPath = [];
  for (let i = 0; i < services; i++) byPath.push([Buffer.from(servicePath(i)), i, -1]);
  for (let i = 0; i < services; i++) for (let j = 0; j < perService; j++) byPath.push([Buffer.from(endpointPath(i, j)), i, j]);
  byPath.sort((a, b) => Buffer.compare(a[0], b[0]));
  const parts = [RESET];
  const epFrames = new Array(services * perService);
  /** Index in `parts` of each endpoint's frame. */
  const epPart = new Uint32Array(services * perService);
  for (const [, i, j] of byPath) {
    if (j < 0) parts.push(setOp(1, servicePath(i), marshalService(service(i))));
    else {
      const f = setOp(2, endpointPath(i, j), marshalEndpoint(endpoint(i, j)));
      epFrames[i * perService + j] = f;
      epPart[i * perService + j] = parts.length;
      parts.push(f);
    }
  }
  let full; // rebuilt lazily after changes
  const fullState = () => (full ??= Buffer.concat(parts));
  const versions = new Uint32Array(services * perService);

  /** Per open stream: keys changed since its last answer, whether a request waits. */
  const streams = new Set();
  let nextStream = 0;

  const answer = (st) => {
    st.waiting = false;
    let ops;
    if (!st.sentFull) {
      st.sentFull = true;
      st.dirty.clear();
      st.h2.write(fullState());
      ops = 1 + services * (1 + perService);
    } else {
      const bufs = [];
      for (const k of st.dirty) bufs.push(epFrames[k]);
      st.dirty.clear();
      ops = bufs.length;
      st.h2.write(bufs.length === 1 ? bufs[0] : Buffer.concat(bufs));
    }
    st.h2.write(SYNC);
    onSync(st.id, ++st.seq, process.hrtime.bigint(), ops);
  };

  const change = (k) => {
    const i = Math.floor(k / perService);
    const j = k % perService;
    versions[k]++;
    const f = setOp(2, endpointPath(i, j), marshalEndpoint(endpoint(i, j, versions[k])));
    epFrames[k] = f;
    parts[epPart[k]] = f;
    full = undefined;
    for (const st of streams) {
      st.dirty.add(k);
      if (st.waiting) answer(st);
    }
  };

  const server = http2.createServer({ settings: { initialWindowSize: 1 << 24 } });
  server.on('stream', (h2, headers) => {
    if (headers[':path'] !== '/localv1.Sets/Watch') {
      h2.respond({ ':status': 200, 'content-type': 'application/grpc', 'grpc-status': '12', 'grpc-message': 'unknown method' }, { endStream: true });
      return;
    }
    const st = { id: ++nextStream, h2, dirty: new Set(), waiting: false, sentFull: false, seq: 0 };
    streams.add(st);
    h2.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
    h2.on('wantTrailers', () => h2.sendTrailers({ 'grpc-status': '0' }));
    let pending = Buffer.alloc(0);
    h2.on('data', (chunk) => {
      pending = pending.length ? Buffer.concat([pending, chunk]) : chunk;
      while (pending.length >= 5) {
        const len = pending.readUInt32BE(1);
        if (pending.length < 5 + len) break;
        pending = pending.subarray(5 + len);
        // A WatchReq: answer now when there is something to send.
        if (!st.sentFull || st.dirty.size > 0) answer(st);
        else st.waiting = true;
      }
    });
    const gone = () => streams.delete(st);
    h2.on('close', gone);
    h2.on('error', gone);
  });
  const sessions = new Set();
  server.on('session', (s) => {
    sessions.add(s);
    s.on('close', () => sessions.delete(s));
  });
  await new Promise((res, rej) => server.listen(port, '127.0.0.1', res).once('error', rej));
  return {
    port: server.address().port,
    change,
    close: () =>
      new Promise((res) => {
        for (const s of sessions) s.destroy();
        server.close(() => res());
      }),
  };
}

async function main() {
  const arg = (name, def) => {
    const i = process.argv.indexOf(`--${name}`);
    return i >= 0 ? Number(process.argv[i + 1]) : def;
  };
  const srv = await startBenchServer({
    services: arg('services', 10_000),
    perService: arg('per-service', 10),
    port: arg('port', 0),
    onSync: (stream, seq, t, ops) => process.stdout.write(`sync ${stream} ${seq} ${t} ${ops}\n`),
  });
  process.stdout.write(`listening on 127.0.0.1:${srv.port}\n`);
  const rl = createInterface({ input: process.stdin });
  rl.on('line', (line) => {
    const [cmd, a, b] = line.trim().split(/\s+/);
    if (cmd === 'change') srv.change(Number(a));
    else if (cmd === 'burst') {
      const n = Number(a);
      const ms = Number(b);
      const total = arg('services', 10_000) * arg('per-service', 10);
      const t0 = performance.now();
      let done = 0;
      // Changes land in small batches on a timer, spread over `ms`.
      const tick = () => {
        const due = Math.min(n, Math.ceil(((performance.now() - t0) / ms) * n));
        while (done < due) srv.change((done++ * 7919) % total);
        if (done < n) setTimeout(tick, 1);
        else process.stdout.write(`burst-done ${n} ${Math.round(performance.now() - t0)}\n`);
      };
      tick();
    } else if (cmd === 'quit') void srv.close().then(() => process.exit(0));
  });
  rl.on('close', () => void srv.close().then(() => process.exit(0)));
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) await main();
