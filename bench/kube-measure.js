// The measurements of the Kubernetes source benchmark (bench/kube.js, which
// runs them per size and reports; see there for what each measures): the
// bench server as a child process, (a) `kpng-json kube --once` and its check,
// the daemon and its idle memory (and (d) the re-list), (c) the latency of a
// change. Options it reads: --samples --gap-ms --idle-seconds
// --settled-seconds --bin-root --no-relist.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { chmodSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { changeable, expected } from './kube-bench-server.js';
import { flag, handOverFloor, measured, opt, quantile, root } from './lib.js';

export const SAMPLES = Number(opt('--samples', '500'));
export const GAP_MS = Number(opt('--gap-ms', '0'));
export const IDLE_S = Number(opt('--idle-seconds', '3'));
/** The second idle reading: after the daemon's later full collection (src/memory.ts: 1 s + 5.5 s after the last state). */
export const SETTLED_S = Number(opt('--settled-seconds', '8'));
/** Whose bin/kpng-json and bin/kpng-callout are measured (another checkout, e.g. a built snapshot of a commit). */
export const BIN_ROOT = opt('--bin-root', root);
/** (d): a re-list in which every object changed, after the idle readings (`--no-relist`: not measured). */
const RELIST = !flag('--no-relist');
export const PER_SERVICE = 10;
const NODE = 7;
const NODE_NAME = `node-${NODE}`;

export const dir = mkdtempSync(join(os.tmpdir(), 'kpng-bench-kube-'));
const env = { ...process.env };
delete env.NODE_OPTIONS;

/** Writes an executable shell script into the temp dir. */
function script(name, body) {
  const file = join(dir, name);
  writeFileSync(file, `#!/bin/sh\n${body}\n`);
  chmodSync(file, 0o755);
  return file;
}
const IDLE_CALLOUT = script('idle-callout', 'cat >/dev/null\necho ran >&2');
const MARKER_CALLOUT = script('marker-callout', 'cat >/dev/null\necho x');

/** VmRSS and VmHWM of a live process, MiB. */
export function memory(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (field) => Number(new RegExp(`${field}:\\s+(\\d+)`).exec(status)?.[1] ?? NaN);
  return { rss: kib('VmRSS') / 1024, hwm: kib('VmHWM') / 1024 };
}

/** Lines arriving one by one (a child's output): `next` resolves with the first one matching, consuming those up to it. */
function lineWaiter() {
  const lines = [];
  let wake;
  return {
    push(l) {
      lines.push(l);
      wake?.();
    },
    /** Forgets the lines received so far. */
    drain() {
      lines.length = 0;
    },
    async next(pred, ms, what) {
      const deadline = performance.now() + ms;
      for (;;) {
        const i = lines.findIndex(pred);
        if (i >= 0) return lines.splice(0, i + 1)[i];
        const left = deadline - performance.now();
        if (left <= 0) throw new Error(`timed out ${what}`);
        await new Promise((r) => {
          const t = setTimeout(r, left);
          wake = () => {
            clearTimeout(t);
            r();
          };
        });
      }
    },
  };
}

// ---------------------------------------------------------------- the server

export async function startServer(services) {
  const child = spawn(process.execPath, [join(root, 'bench/kube-bench-server.js'), '--services', String(services), '--per-service', String(PER_SERVICE)], {
    stdio: ['pipe', 'pipe', 'inherit'],
    env,
  });
  const out = lineWaiter();
  createInterface({ input: child.stdout }).on('line', (l) => out.push(l));
  const exited = once(child, 'exit').then(([code]) => {
    throw new Error(`bench server exited (${code})`);
  });
  exited.catch(() => {});
  const listening = await Promise.race([out.next((l) => l.startsWith('listening on '), 300_000, 'waiting for the bench server'), exited]);
  const url = `http://${listening.slice('listening on '.length)}`;
  const kubeconfig = join(dir, `kubeconfig-${services}`);
  writeFileSync(
    kubeconfig,
    ['apiVersion: v1', 'kind: Config', 'clusters:', '- name: bench', '  cluster:', `    server: ${url}`, '    insecure-skip-tls-verify: true', 'users:', '- name: bench', '  user: {}', 'contexts:', '- name: bench', '  context: {cluster: bench, user: bench}', 'current-context: bench', ''].join('\n'),
  );
  return {
    url,
    kubeconfig,
    /** The server's report lines, consumed by `next`. */
    next: (pred, ms, what) => out.next(pred, ms, what),
    drain: () => out.drain(),
    send: (line) => child.stdin.write(line + '\n'),
    async fetch() {
      child.stdin.write('fetch 5\n');
      const l = await out.next((x) => x.startsWith('fetched ') || x.startsWith('fetch-failed '), 120_000, 'fetching the lists');
      if (l.startsWith('fetch-failed')) throw new Error(l);
      const [median, min, max, bytes, wall] = l.split(' ').slice(1).map(Number);
      return { median, min, max, bytes, wall };
    },
    async close() {
      child.stdin.end('quit\n');
      await once(child, 'exit');
    },
  };
}

// ---------------------------------------------------------------- (a)

/** `kpng-json kube --once` once: wall ms, peak RSS MiB, stdout. */
export async function runOnce(server) {
  const argv = [join(BIN_ROOT, 'bin/kpng-json'), 'kube', '--once', '--node-name', NODE_NAME, '-q'];
  const chunks = [];
  const r = await measured(process.execPath, argv, { env: { ...env, KUBECONFIG: server.kubeconfig }, onStdout: (b) => chunks.push(b) });
  if (r.code !== 0) throw new Error(`kpng-json kube --once exited ${r.code}: ${r.stderr}`);
  return { wall: r.wallMs, peakMiB: r.peakKiB / 1024, stdout: Buffer.concat(chunks) };
}

/** Checks kpng-json's output against the cluster: one line per selected Service, the endpoints node-7 sees. */
export function check(stdout, services) {
  const want = expected(services, PER_SERVICE, NODE);
  const lines = stdout.toString('utf8').split('\n').filter((l) => l.length > 0);
  let endpoints = 0;
  for (const l of lines) endpoints += JSON.parse(l).Endpoints?.length ?? 0;
  if (lines.length !== want.lines || endpoints !== want.endpoints)
    throw new Error(`kpng-json printed ${lines.length} Services and ${endpoints} endpoints; the cluster has ${want.lines} and ${want.endpoints} for ${NODE_NAME}`);
  return { lines: lines.length, endpoints };
}

// ---------------------------------------------------------------- the daemon

/** Starts `kpng-callout kube` against the server; its stderr and stdout lines go to waiters. */
function startDaemon(server, extra, callout) {
  const child = spawn(process.execPath, [join(BIN_ROOT, 'bin/kpng-callout'), 'kube', '--node-name', NODE_NAME, '--callout', callout, ...extra], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...env, KUBECONFIG: server.kubeconfig },
  });
  const log = lineWaiter();
  const logTail = [];
  createInterface({ input: child.stderr }).on('line', (l) => {
    log.push(l);
    logTail.push(l);
    if (logTail.length > 20) logTail.shift();
  });
  const exited = once(child, 'exit').then(([code, signal]) => {
    throw new Error(`kpng-callout exited (${signal ?? code}): ${logTail.join('\n')}`);
  });
  exited.catch(() => {});
  let stopping = false;
  return {
    child,
    /** The next log line matching `pred` (fails when the daemon exits first). */
    log: (pred, ms, what) => Promise.race([log.next(pred, ms, what), stopping ? new Promise(() => {}) : exited]),
    async stop() {
      stopping = true;
      child.kill('SIGTERM');
      if (child.exitCode === null && child.signalCode === null) await once(child, 'exit');
    },
  };
}

const FINISHED = (l) => l.includes('callout run finished');

/**
 * (b): the daemon's first run, then RSS after IDLE_S and SETTLED_S idle;
 * then (d) the server's `relist` (every object anew, every watch 410 Gone):
 * once the daemon watches the three resources again, its VmHWM (the re-list's
 * peak: above the first sync's) and, SETTLED_S later, its RSS.
 */
export async function idle(server) {
  const t0 = performance.now();
  const d = startDaemon(server, [], IDLE_CALLOUT);
  try {
    await d.log(FINISHED, 300_000, 'waiting for the first callout run');
    const firstRun = performance.now() - t0;
    await new Promise((r) => setTimeout(r, IDLE_S * 1000));
    const early = memory(d.child.pid);
    await new Promise((r) => setTimeout(r, Math.max(0, SETTLED_S - IDLE_S) * 1000));
    const settled = memory(d.child.pid).rss;
    if (!RELIST) return { firstRun, ...early, settled };
    server.drain();
    const r0 = performance.now();
    server.send('relist');
    const watching = new Set();
    while (watching.size < 3) watching.add((await server.next((l) => l.startsWith('watch '), 300_000, 'waiting for the watches after the re-list')).split(' ')[1]);
    const relistMs = performance.now() - r0;
    await new Promise((r) => setTimeout(r, SETTLED_S * 1000));
    // VmHWM only grows: read now, it holds the state computed after the list too.
    const after = memory(d.child.pid);
    return { firstRun, ...early, settled, relistMs, relistPeak: after.hwm, relistSettled: after.rss };
  } finally {
    await d.stop();
  }
}

// ---------------------------------------------------------------- (c)

export async function latency(server, services, stdin) {
  server.drain(); // "watch" lines of earlier clients
  const d = startDaemon(server, ['--debounce', '0'], MARKER_CALLOUT);
  const markers = [];
  let wake;
  d.child.stdout.on('data', (b) => {
    const t = process.hrtime.bigint();
    for (const c of b) if (c === 0x78) markers.push(t); // "x"
    wake?.();
  });
  const marker = async (n, ms, what) => {
    const deadline = performance.now() + ms;
    while (markers.length < n) {
      if (performance.now() > deadline) throw new Error(`timed out ${what}`);
      await new Promise((r) => {
        wake = r;
        setTimeout(r, 100);
      });
    }
    return markers[n - 1];
  };
  try {
    await marker(1, 300_000, 'waiting for the first run');
    await server.next((l) => l.startsWith('watch endpointslices '), 60_000, 'waiting for the slice watch');
    const times = [];
    let i = 0;
    for (let k = 0; k < SAMPLES; k++) {
      do i = (i + 7919) % services;
      while (!changeable(i));
      if (GAP_MS > 0) await new Promise((r) => setTimeout(r, GAP_MS));
      server.send(`change ${i}`);
      const ev = await server.next((l) => l.startsWith('event '), 10_000, `waiting for the event of change ${k}`);
      const [, , , hr, watchers] = ev.split(' ');
      if (Number(watchers) !== 1) throw new Error(`change ${k} went to ${watchers} watches`);
      const got = await marker(k + 2, 30_000, `waiting for the run of change ${k}`);
      times.push(Number(got - BigInt(hr)) / 1e6);
    }
    await new Promise((r) => setTimeout(r, 200));
    if (markers.length !== SAMPLES + 1) throw new Error(`${markers.length} runs for ${SAMPLES} changes and the first state`);
    const daemonMem = memory(d.child.pid);
    times.sort((a, b) => a - b);
    // The floor, from a process of the daemon's size.
    const ballast = Buffer.alloc(Math.max(0, Math.round((daemonMem.rss - process.memoryUsage().rss / 2 ** 20) * 2 ** 20)), 1);
    const floorRss = process.memoryUsage().rss / 2 ** 20;
    const floor = await handOverFloor([stdin], SAMPLES, { file: MARKER_CALLOUT, args: [], marker: true, gapMs: GAP_MS });
    ballast.fill(0);
    return { p50: quantile(times, 0.5), p99: quantile(times, 0.99), max: times[times.length - 1], floor, floorRss, daemonRss: daemonMem.rss, bytes: stdin.length };
  } finally {
    await d.stop();
  }
}
