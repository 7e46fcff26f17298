#!/usr/bin/env node
// Benchmark of callouts/userspace-proxy's frames at scale: how long a change
// holds it up (npm run bench:userspace-frames).
//
// For N Services (each: one IPv4 ClusterIP and one ExternalIP, TCP ports 80
// and 443, 10 endpoints: 4 listeners a Service), in a network namespace
// created per size, where 198.18.0.0/16 is a local route so that every
// Service address can be bound (RFC 2544's benchmarking range: the
// documentation ranges hold 768 IPv4 addresses; no packet is sent): the
// proxy is started as kpng-callout --persistent starts it, given the state as
// a full frame, then --frames change frames (one endpoint of one Service
// moved, moved back, ...), then the same full state again. Each figure is
// from writing a frame to its ack on fd 3. The proxy handles no traffic
// while it plans a frame, so a change frame's time is how long a change
// stalls every Service. The open-file limit bounds N: 4 sockets a Service.
//
// Options: --sizes 1000,4000  --frames 30  --launcher PATH (another copy of
// callouts/userspace-proxy, to compare). Prints a table (no record: copy it to
// bench/RESULTS.md). Needs root and `ip netns`; exits 0 saying why when not.
import { spawn, spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { machine, opt, root, runDate } from './lib.js';

const SIZES = opt('--sizes', '1000,4000').split(',').map(Number);
const FRAMES = Number(opt('--frames', '30'));
const LAUNCHER = opt('--launcher', join(root, 'callouts/userspace-proxy'));

const ip = (second, i) => `198.${second}.${(i >> 8) & 255}.${i & 255}`;

/** Service i's line, as kpng prints it; `moved` moves one endpoint. */
function line(i, moved = false) {
  const eps = Array.from({ length: 10 }, (_, j) => ({
    IPs: { V4: [moved && j === 0 ? '198.51.100.77' : ip(19, ((i * 10 + j) % 65534) + 1)] },
    Scopes: { Internal: true, External: true },
    PortOverrides: [
      { Name: 'http', Port: 8080 },
      { Name: 'https', Port: 8443 },
    ],
  }));
  const svc = {
    Namespace: `ns${i % 100}`,
    Name: `svc${i}`,
    Type: 'ClusterIP',
    IPs: { ClusterIPs: { V4: [ip(18, i + 1)] }, ExternalIPs: { V4: [ip(18, 32768 + i)] } },
    Ports: [
      { Name: 'http', Protocol: 1, Port: 80, TargetPort: 8080 },
      { Name: 'https', Protocol: 1, Port: 443, TargetPort: 8443 },
    ],
  };
  return JSON.stringify({ Service: svc, Endpoints: eps });
}

function skipReason() {
  if (process.platform !== 'linux') return 'network namespaces need Linux';
  if (process.getuid?.() !== 0) return 'network namespaces need root';
  if (spawnSync('ip', ['netns', 'list']).status !== 0) return '`ip netns` is missing';
  return undefined;
}

async function measure(n) {
  const ns = `kpng-bench-uspf-${process.pid}`;
  const run = (...argv) => spawnSync('ip', argv, { stdio: 'ignore' }).status === 0;
  if (!run('netns', 'add', ns)) throw new Error(`cannot create the network namespace ${ns}`);
  try {
    run('-n', ns, 'link', 'set', 'lo', 'up');
    run('-n', ns, 'route', 'add', 'local', '198.18.0.0/16', 'dev', 'lo');
    const lines = Array.from({ length: n }, (_, i) => line(i));
    const child = spawn('ip', ['netns', 'exec', ns, process.execPath, LAUNCHER], { stdio: ['pipe', 'ignore', 'ignore', 'pipe'], env: { ...process.env, KPNG_CALLOUT_MODE: 'persistent' } });
    const waiting = [];
    let buf = '';
    child.stdio[3].setEncoding('utf8');
    child.stdio[3].on('data', (d) => {
      buf += d;
      for (let at = buf.indexOf('\n'); at >= 0; at = buf.indexOf('\n')) {
        const ack = buf.slice(0, at);
        buf = buf.slice(at + 1);
        waiting.shift()?.(ack);
      }
    });
    const exited = new Promise((resolve) => child.on('exit', resolve));
    let seq = 0;
    const frame = async (input, body) => {
      const t0 = performance.now();
      const ack = await Promise.race([new Promise((resolve) => (waiting.push(resolve), child.stdin.write(`{"Frame":{"Seq":${++seq},"Input":"${input}"}}\n${body.join('\n')}\n\n`))), exited.then(() => 'exited')]);
      if (ack !== 'ok') throw new Error(`frame ${seq} at ${n} Services: ${ack}`);
      return performance.now() - t0;
    };
    const first = await frame('full', lines);
    const times = [];
    for (let k = 0; k < FRAMES; k++) {
      const [was, now] = k % 2 === 0 ? [line(5), line(5, true)] : [line(5, true), line(5)];
      times.push(await frame('changes', [`{"Previous":${was}}`, now]));
    }
    if (FRAMES % 2 === 1) await frame('changes', [`{"Previous":${line(5, true)}}`, line(5)]);
    const again = await frame('full', lines);
    child.stdin.end();
    await exited;
    times.sort((a, b) => a - b);
    return { first, median: times[times.length >> 1] ?? 0, max: times.at(-1) ?? 0, again };
  } finally {
    run('netns', 'delete', ns);
  }
}

const why = skipReason();
if (why) {
  console.log(`bench/userspace-proxy-frames.js: skipped: ${why}`);
  process.exit(0);
}
console.log(`Run on ${runDate()} UTC, ${machine()} (\`node bench/userspace-proxy-frames.js --sizes ${SIZES.join(',')} --frames ${FRAMES}\`${LAUNCHER === join(root, 'callouts/userspace-proxy') ? '' : `, --launcher ${LAUNCHER}`}).\n`);
console.log('| Services (listeners) | first full frame | one-endpoint change frame: median | max | the same full state again |');
console.log('|---:|---:|---:|---:|---:|');
for (const n of SIZES) {
  const r = await measure(n);
  const ms = (x) => `${x.toFixed(x < 100 ? 1 : 0)} ms`;
  console.log(`| ${n.toLocaleString('en-US')} (${(4 * n).toLocaleString('en-US')}) | ${ms(r.first)} | ${ms(r.median)} | ${ms(r.max)} | ${ms(r.again)} |`);
}
