// The measurements of the pipeline benchmarks (bench/run.js, which runs them
// and reports): the bench server as a child process, (a) ingest, (b)
// incremental runs (and issue 12's modes, as its variants) and (c)
// coalescing; see bench/run.js for what each measures.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { PerformanceObserver } from 'node:perf_hooks';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync, chmodSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { Writable } from 'node:stream';
import { handOverFloor, haveTime, measured, opt, quantile, root } from './lib.js';

/** The cluster the bench server holds. */
export const SERVICES = 10_000;
export const PER_SERVICE = 10;
/** (a)'s runs, (b)'s revisions. */
export const RUNS = Number(opt('--runs', '5'));
export const REVISIONS = Number(opt('--revisions', '1000'));

const { service, endpoint, servicePath, endpointPath } = await import(join(root, 'bench/kpng-bench-server.js'));
const { Store } = await import(join(root, 'dist/state.js'));

// ---------------------------------------------------------------- helpers

/** The bench server as a child process, driven by lines on its stdin. */
async function startServer() {
  const child = spawn(process.execPath, [join(root, 'bench/kpng-bench-server.js'), '--services', String(SERVICES), '--per-service', String(PER_SERVICE)], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const syncs = [];
  const waiters = [];
  let burstDone;
  let port;
  const listening = new Promise((res, rej) => {
    child.once('exit', (c) => rej(new Error(`bench server exited (${c})`)));
    createInterface({ input: child.stdout }).on('line', (l) => {
      const f = l.split(' ');
      if (f[0] === 'listening') {
        port = Number(l.slice(l.lastIndexOf(':') + 1));
        res();
      } else if (f[0] === 'sync') {
        const s = { stream: Number(f[1]), seq: Number(f[2]), t: BigInt(f[3]), ops: Number(f[4]) };
        syncs.push(s);
        for (const w of waiters.splice(0)) w();
      } else if (f[0] === 'burst-done') burstDone?.(Number(f[2]));
    });
  });
  await listening;
  return {
    address: `127.0.0.1:${port}`,
    syncs,
    /** Resolves when `n` Syncs in total were written. */
    async waitSyncs(n) {
      while (syncs.length < n) await new Promise((r) => waiters.push(r));
      return syncs[n - 1];
    },
    send: (line) => child.stdin.write(line + '\n'),
    burst: (n, ms) =>
      new Promise((r) => {
        burstDone = r;
        child.stdin.write(`burst ${n} ${ms}\n`);
      }),
    async close() {
      child.stdin.end('quit\n');
      await once(child, 'exit');
    },
  };
}

/** The NDJSON kpng-json must print for the bench state (our Store, from the model objects). */
function expectedState(versions = new Map()) {
  const store = new Store();
  for (let i = 0; i < SERVICES; i++) {
    store.setService(servicePath(i), service(i));
    for (let j = 0; j < PER_SERVICE; j++) store.setEndpoint(endpointPath(i, j), endpoint(i, j, versions.get(i * PER_SERVICE + j) ?? 0));
  }
  return store.snapshot();
}

function digest(bufs) {
  const h = createHash('sha256');
  for (const b of bufs) h.update(b);
  return h.digest('hex');
}

export const ms = (x, d = 2) => `${x.toFixed(d)} ms`;

/** Runs a command; resolves with wall ms, peak RSS KiB and stdout digest/size. */
async function measureProcess(cmd, argv, cwd = undefined) {
  const h = createHash('sha256');
  let size = 0;
  const onStdout = (b) => {
    h.update(b);
    size += b.length;
  };
  const r = await measured(cmd, argv, { env: { ...process.env, NODE_OPTIONS: '' }, ...(cwd ? { cwd } : {}), onStdout, pollMs: 5 });
  if (r.code !== 0) throw new Error(`${cmd} exited ${r.code}: ${r.stderr}`);
  return { wall: r.wallMs, rssKiB: r.peakKiB, digest: h.digest('hex'), size, stderr: r.stderr };
}

// ---------------------------------------------------------------- (a)

// Bare clients (node -e, from the repository for module resolution): connect,
// send one WatchReq, count messages until the Sync (a 2-byte message), exit.
const FLOOR_GRPC = `
import * as grpc from '@grpc/grpc-js';
const client = new grpc.Client(process.argv[1], grpc.credentials.createInsecure(), { 'grpc.max_receive_message_length': 1 << 26 });
const call = client.makeBidiStreamRequest('/localv1.Sets/Watch', (b) => b, (b) => b);
call.on('data', (b) => { if (b.length === 2 && b[0] === 0x0a) process.exit(0); });
call.on('error', (e) => { console.error(e.message); process.exit(1); });
call.write(Buffer.from([0x0a, 1, 0x6e]));`;
const FLOOR_H2 = `
import http2 from 'node:http2';
const s = http2.connect('http://' + process.argv[1]);
const req = s.request({ ':method': 'POST', ':path': '/localv1.Sets/Watch', 'content-type': 'application/grpc', te: 'trailers' });
let buf = Buffer.alloc(0);
req.on('data', (chunk) => {
  buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
  let off = 0;
  while (buf.length - off >= 5) {
    const len = buf.readUInt32BE(off + 1);
    if (buf.length - off < 5 + len) break;
    if (len === 2 && buf[off + 5] === 0x0a) process.exit(0);
    off += 5 + len;
  }
  buf = buf.subarray(off);
});
req.write(Buffer.from([0, 0, 0, 0, 3, 0x0a, 1, 0x6e]));`;

export async function benchIngest() {
  const server = await startServer();
  try {
    const expected = expectedState();
    const want = digest(expected.lines);
    const bin = join(root, 'bin/kpng-json');
    const argv = [bin, '--once', '--api', server.address, '--node-name', 'bench', '-q'];
    await measureProcess(process.execPath, argv); // warm the page cache
    const runs = [];
    for (let i = 0; i < RUNS; i++) {
      const r = await measureProcess(process.execPath, argv);
      if (r.digest !== want) throw new Error(`kpng-json printed ${r.size} bytes that differ from the expected ${expected.bytes}`);
      runs.push(r);
    }
    // Floors: a bare client that only counts the messages up to the Sync.
    const floor = async (code) => {
      const w = [];
      for (let i = 0; i < RUNS; i++) w.push((await measureProcess(process.execPath, ['--input-type=module', '-e', code, server.address], root)).wall);
      return quantile(w.sort((a, b) => a - b), 0.5);
    };
    const grpcFloor = await floor(FLOOR_GRPC);
    const h2Floor = await floor(FLOOR_H2);
    const walls = runs.map((r) => r.wall).sort((a, b) => a - b);
    const rss = runs.map((r) => r.rssKiB).sort((a, b) => a - b);
    return {
      bytes: expected.bytes,
      wallMedian: quantile(walls, 0.5),
      wallMax: walls[walls.length - 1],
      rssMedian: quantile(rss, 0.5) / 1024,
      rssMax: rss[rss.length - 1] / 1024,
      rssHow: haveTime ? '/usr/bin/time' : 'VmHWM polling',
      grpcFloor,
      h2Floor,
    };
  } finally {
    await server.close();
  }
}

// ---------------------------------------------------------------- (b)

/**
 * A persistent callout that says "x" and the time (CLOCK_MONOTONIC, ns: the clock of
 * process.hrtime and of the server's Sync times) on stdout once it has read a whole
 * frame (its empty line), then acks: the moment is taken by the callout, not when its
 * "x" reaches us.
 */
const PERSISTENT_READER = [
  '-c',
  'import os,sys,time\nf=sys.stdin.buffer\nack=os.fdopen(3,"w",buffering=1)\nwhile True:\n h=f.readline()\n if not h: break\n while True:\n  l=f.readline()\n  if l in (b"\\n", b""): break\n t=time.monotonic_ns()\n sys.stdout.write("x%d\\n" % t); sys.stdout.flush(); ack.write("ok\\n")\n',
];

export async function benchIncremental(variant = {}) {
  const { createKpngSource } = await import(join(root, 'dist/sources/kpng.js'));
  const { Runner } = await import(join(root, 'dist/runner/runner.js'));
  const server = await startServer();
  const ac = new AbortController();
  const events = [];
  let wake;
  const note = (e) => {
    events.push(e);
    wake?.();
  };
  const nextEvent = async (pred) => {
    for (;;) {
      const i = events.findIndex(pred);
      if (i >= 0) return events.splice(0, i + 1)[i];
      await new Promise((r) => (wake = r));
    }
  };
  // The callout says "x" on stdout once it has read its whole input (EOF): that
  // moment is what "the callout has the state" means.
  const runner = new Runner({
    file: variant.persistent ? 'python3' : 'sh',
    args: variant.persistent ? PERSISTENT_READER : ['-c', 'dd of=/dev/null bs=1M status=none; echo x'],
    changes: variant.changes ?? false,
    persistent: variant.persistent ?? false,
    debounceMs: 0,
    maxWaitMs: 0,
    timeoutMs: 60_000,
    nodeName: 'bench',
    stdout: new Writable({
      write: (c, _e, cb) => {
        // The persistent reader's own time when it says so; else when its marker arrives.
        const m = /x(\d+)/.exec(String(c));
        note({ type: 'input-read', hr: m ? BigInt(m[1]) : process.hrtime.bigint() });
        cb();
      },
    }),
    stderr: process.stderr,
    onEvent: (e) => note({ ...e, hr: process.hrtime.bigint() }),
  });
  const source = createKpngSource({ api: server.address, nodeName: 'bench', errorDelayMs: 100 });
  const run = source.run(
    {
      push: (state) => {
        note({ type: 'pushed', hr: process.hrtime.bigint(), state });
        runner.submit(state);
      },
    },
    ac.signal,
  );
  try {
    await nextEvent((e) => e.type === 'run-finished');
    const total = SERVICES * PER_SERVICE;
    const versions = new Map();
    const rows = [];
    let lastState;
    const revisions = variant.revisions ?? REVISIONS;
    // GC pauses during the revisions, to tell them from scheduling noise in the tail.
    const gcs = [];
    const gcObs = new PerformanceObserver((l) => gcs.push(...l.getEntries().map((e) => e.duration)));
    gcObs.observe({ entryTypes: ['gc'] });
    for (let i = 0; i < revisions; i++) {
      const k = (i * 7919 + 13) % total;
      versions.set(k, (versions.get(k) ?? 0) + 1);
      server.send(`change ${k}`);
      const pushed = await nextEvent((e) => e.type === 'pushed');
      const started = await nextEvent((e) => e.type === 'run-started');
      const written = await nextEvent((e) => e.type === 'input-read');
      const finished = await nextEvent((e) => e.type === 'run-finished');
      if (finished.result !== 'ok') throw new Error(`run ${finished.run}: ${finished.result}`);
      const sync = await server.waitSyncs(i + 2); // the first Sync was the full state
      lastState = pushed.state;
      rows.push({
        pushed: Number(pushed.hr - sync.t) / 1e6,
        started: Number(started.hr - sync.t) / 1e6,
        written: Number(written.hr - sync.t) / 1e6,
      });
    }
    // The last state the runner saw must be the server's.
    const want = digest(expectedState(versions).lines);
    if (digest(lastState.lines) !== want) throw new Error('incremental: the last state differs from the expected one');
    gcObs.disconnect();
    const q = (key, p) => quantile(rows.map((r) => r[key]).sort((a, b) => a - b), p);
    // The floor: spawning the same program with the same input (the whole state; with --changes the change set of one endpoint).
    const floorInput = variant.changes ? [Buffer.alloc(Math.round(lastState.bytes / SERVICES) * 2, 0x61)] : lastState.lines;
    // Per run the callout must also start (sh, dd) before it can say "x": the floor waits for the same marker.
    const floor = variant.persistent
      ? { p50: NaN, p99: NaN }
      : variant.changes
        ? await handOverFloor(floorInput, 300, { file: 'sh', args: ['-c', 'dd of=/dev/null bs=1M status=none; echo x'], marker: true })
        : await handOverFloor(floorInput, 300);
    return {
      floorP50: floor.p50,
      floorP99: floor.p99,
      bytes: lastState.bytes,
      p50: q('written', 0.5),
      p99: q('written', 0.99),
      max: q('written', 1),
      pushedP50: q('pushed', 0.5),
      pushedP99: q('pushed', 0.99),
      startedP50: q('started', 0.5),
      startedP99: q('started', 0.99),
      gcPauses: gcs.length,
      gcMaxMs: gcs.length ? Math.max(...gcs) : 0,
    };
  } finally {
    ac.abort();
    await run.catch(() => {});
    await runner.stop();
    await server.close();
  }
}

// ---------------------------------------------------------------- (c)

export async function benchCoalescing() {
  const server = await startServer();
  const dir = mkdtempSync(join(os.tmpdir(), 'kpng-bench-'));
  const callout = join(dir, 'callout');
  writeFileSync(callout, '#!/bin/sh\ncat > "$BENCH_OUT/in-$KPNG_CALLOUT_RUN"\nsleep 0.2\n');
  chmodSync(callout, 0o755);
  const child = spawn(process.execPath, [join(root, 'bin/kpng-callout'), '--api', server.address, '--node-name', 'bench', '--callout', callout, '-v'], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, NODE_OPTIONS: '', BENCH_OUT: dir },
  });
  const starts = [];
  const finishes = [];
  let wake;
  createInterface({ input: child.stderr }).on('line', (l) => {
    const m = / run=(\d+)/.exec(l);
    if (!m) return;
    if (l.includes('callout run started')) starts.push({ run: Number(m[1]), at: performance.now() });
    else if (/callout run (finished|\d+ )/.test(l)) finishes.push({ run: Number(m[1]), at: performance.now(), line: l });
    wake?.();
  });
  const until = async (pred, ms, what) => {
    const deadline = performance.now() + ms;
    while (!pred()) {
      if (performance.now() > deadline) throw new Error(`coalescing: timed out ${what}`);
      await Promise.race([new Promise((r) => (wake = r)), new Promise((r) => setTimeout(r, 50))]);
    }
  };
  try {
    await until(() => finishes.some((f) => f.run === 1), 30_000, 'waiting for the initial run');
    const before = starts.length;
    const t0 = performance.now();
    const burstMs = await server.burst(10_000, 1000);
    // Quiet: nothing running and no start for 2 s (past --max-wait).
    await until(
      () => {
        const lastStart = starts[starts.length - 1];
        const done = finishes.some((f) => f.run === lastStart.run);
        const quiet = performance.now() - Math.max(lastStart.at, finishes[finishes.length - 1]?.at ?? 0) > 2000;
        return starts.length > before && done && quiet;
      },
      60_000,
      'waiting for the runs to settle',
    );
    const runs = starts.length - before;
    const elapsed = finishes[finishes.length - 1].at - t0;
    // The final state, from a fresh stream.
    const final = await measureProcess(process.execPath, [join(root, 'bin/kpng-json'), '--once', '--api', server.address, '--node-name', 'bench', '-q']);
    const lastRun = starts[starts.length - 1].run;
    const lastInput = readFileSync(join(dir, `in-${lastRun}`));
    const exact = digest([lastInput]) === final.digest;
    return { runs, burstMs, exact, lastRun, settledMs: elapsed, bytes: lastInput.length };
  } finally {
    child.kill('SIGTERM');
    await once(child, 'exit');
    await server.close();
    rmSync(dir, { recursive: true, force: true });
  }
}
