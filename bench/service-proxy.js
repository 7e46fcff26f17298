#!/usr/bin/env node
// Benchmark of the service proxier callouts (callouts/service-proxy-nft and,
// when the file exists, callouts/service-proxy-iptables). service-proxy-nft-awk
// is service-proxy-nft with its full states planned by jq and awk
// (SERVICE_PROXY_NFT_PLANNER=awk: as without node), the "before" of node's.
//
// For N = 1,000 and 10,000 Services (each: one IPv4 ClusterIP, one IPv4
// ExternalIP, ports TCP 80 -> 8080 and TCP 443 -> 8443, 10 endpoints), in a
// network namespace created per run (the host's rules are never touched):
//   from scratch     the callout on an empty namespace;
//   re-apply         the same state again;
//   one change       the same state with one endpoint of Service 0 moved (full input);
//   change set       nft only: the same change as a change set (KPNG_CALLOUT_INPUT=changes);
//   persistent       nft only: one callout (KPNG_CALLOUT_MODE=persistent) given the state as a
//                    full frame, then --frames change frames (the endpoint moved, moved back...):
//                    the time from writing a frame to its acknowledgement on fd 3, median and max.
// Times are wall-clock seconds of one callout run (stdin fed from memory),
// the median of --runs runs (a fresh namespace each). Floors, measured in the
// same run (--no-floors: not), the least any callout of this kind pays for the
// same state, whatever its planning: jq reading it (`jq empty`), and `nft -f`
// of a bare table holding only its endpoints in one map, keyed three ways: per
// destination (each ClusterIP and ExternalIP its own elements, as service-proxy-nft
// keyed them until 2026-11-28 01:00), per Service port (destination -> an id, id .
// index -> endpoint: keyed by one destination of each Service port, the others
// rewritten to it, as it did until 2026-11-28 03:00), and per Service (id . index
// -> endpoint address, Service id . port -> target port: when all its ports
// share the endpoints and their target ports; about what it loads now). No packet is sent: the
// Service addresses come from 198.18.0.0/16 and the endpoints from
// 198.19.0.0/16 (RFC 2544 benchmarking range: the documentation ranges hold
// 768 IPv4 addresses, 20,000 Service addresses do not fit), the moved
// endpoint from 198.51.100.0/24.
// Options: --sizes 1000,10000  --runs 3  --frames 30  --callouts service-proxy-nft (only those)  --limit 300 (seconds per run; a
// case past it is reported as stopped). Prints a markdown table with the date
// and machine. Needs root, `ip netns`, nft, jq; exits 0 saying why when not.
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { flag, machine, opt, root, runDate } from './lib.js';

const SIZES = opt('--sizes', '1000,10000').split(',').map(Number);
const RUNS = Number(opt('--runs', '3'));
const LIMIT_S = Number(opt('--limit', '300'));
const FRAMES = Number(opt('--frames', '30'));

const IMPLS = [
  { name: 'service-proxy-nft', path: join(root, 'callouts/service-proxy-nft'), changes: true },
  // the same callout with its full states planned by jq and awk, as without node (the "before")
  { name: 'service-proxy-nft-awk', path: join(root, 'callouts/service-proxy-nft'), changes: false, env: { SERVICE_PROXY_NFT_PLANNER: 'awk' } },
  { name: 'service-proxy-iptables', path: join(root, 'callouts/service-proxy-iptables'), changes: false },
].filter((i) => existsSync(i.path) && (opt('--callouts', '') === '' || opt('--callouts', '').split(',').includes(i.name)));
// the floors are nft's and jq's: measured when the nft callout is
const FLOORS = !flag('--no-floors') && IMPLS.some((i) => i.name === 'service-proxy-nft');

const sh = (cmd, argv, o = {}) => spawnSync(cmd, argv, { encoding: 'utf8', maxBuffer: 512 << 20, ...o });

function skipReason() {
  if (process.platform !== 'linux') return 'network namespaces need Linux';
  if (process.getuid?.() !== 0) return 'network namespaces need root';
  for (const tool of ['ip', 'nft', 'jq']) {
    if (sh('sh', ['-c', 'command -v "$1"', 'sh', tool]).status !== 0) return `${tool} is missing`;
  }
  return undefined;
}

const ip = (second, i) => `198.${second}.${(i >> 8) & 255}.${i & 255}`;

/** Service i's line, as kpng prints it; `moved` moves its first endpoint. */
function line(i, moved) {
  const eps = Array.from({ length: 10 }, (_, j) => ({
    IPs: { V4: [moved && j === 0 ? '198.51.100.77' : ip(19, ((i * 10 + j) % 65534) + 1)] },
    PortOverrides: [
      { Name: 'http', Port: 8080 },
      { Name: 'https', Port: 8443 },
    ],
    Scopes: { Internal: true, External: true },
  }));
  return JSON.stringify({
    Service: {
      Namespace: 'bench',
      Name: `svc-${i}`,
      Type: 'ClusterIP',
      IPs: { ClusterIPs: { V4: [ip(18, i + 1)] }, ExternalIPs: { V4: [ip(18, 32768 + i + 1)] } },
      Ports: [
        { Name: 'http', Protocol: 1, Port: 80, TargetPort: 8080 },
        { Name: 'https', Protocol: 1, Port: 443, TargetPort: 8443 },
      ],
      SessionAffinity: null,
    },
    Endpoints: eps,
  });
}

/** The state in kpng order (by key). */
function state(n, moved) {
  const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => (`svc-${a}` < `svc-${b}` ? -1 : 1));
  return Buffer.from(order.map((i) => line(i, moved && i === 0) + '\n').join(''));
}

/** Seconds of one run of argv (stdin: input, env added), null past --limit; throws when it fails. */
function timed(argv, input, env = {}) {
  const t0 = process.hrtime.bigint();
  const r = sh(argv[0], argv.slice(1), {
    input,
    env: { ...process.env, ...env },
    stdio: ['pipe', 'ignore', 'pipe'],
    timeout: LIMIT_S * 1000,
    killSignal: 'SIGKILL',
  });
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  if (r.error?.code === 'ETIMEDOUT' || r.signal === 'SIGKILL') return null;
  if (r.status !== 0) throw new Error(`${argv.join(' ')} exited ${r.status}: ${r.stderr}`);
  return s;
}

const timeRun = (ns, impl, input, env = {}) => timed(['ip', 'netns', 'exec', ns, impl.path], input, { ...impl.env, ...env });

/** fn(ns) in a network namespace created for it, deleted after. */
async function withNetns(fn) {
  const ns = `kpspn-bench-${process.pid}-${++seq}`;
  if (sh('ip', ['netns', 'add', ns]).status !== 0) throw new Error(`ip netns add ${ns} failed`);
  try {
    return await fn(ns);
  } finally {
    sh('ip', ['netns', 'del', ns]);
  }
}

/**
 * A persistent callout in `ns`: the state `base` as frame 1 (full), then `frames` change
 * frames; resolves the seconds from each change frame's first byte to its "ok".
 */
async function persistentRun(ns, impl, base, changeSets, frames) {
  const child = spawn('ip', ['netns', 'exec', ns, impl.path], {
    stdio: ['pipe', 'ignore', 'pipe', 'pipe'],
    env: { ...process.env, KPNG_CALLOUT_MODE: 'persistent' },
  });
  let stderr = '';
  child.stderr.on('data', (b) => (stderr += b));
  const acks = createInterface({ input: child.stdio[3] })[Symbol.asyncIterator]();
  const frame = async (seq, input, lines) => {
    const t0 = process.hrtime.bigint();
    child.stdin.write(Buffer.concat([Buffer.from(`{"Frame":{"Seq":${seq},"Input":"${input}"}}\n`), lines, Buffer.from('\n')]));
    const { value, done } = await acks.next();
    if (done || value !== 'ok') throw new Error(`frame ${seq}: ${done ? 'no acknowledgement' : value}: ${stderr}`);
    return Number(process.hrtime.bigint() - t0) / 1e9;
  };
  try {
    const full = await frame(1, 'full', base);
    const times = [];
    for (let i = 0; i < frames; i++) times.push(await frame(i + 2, 'changes', changeSets[i % 2]));
    return { full, times };
  } finally {
    child.stdin.end();
    await once(child, 'close');
  }
}

/**
 * The bare-table scripts of the floors for n Services of line()'s shape: only the
 * endpoint elements, in one transaction (see the header).
 */
function floorScripts(n) {
  const ports = [
    [80, 8080],
    [443, 8443],
  ];
  const ep = (i, j) => ip(19, ((i * 10 + j) % 65534) + 1);
  const dests = (i) => [ip(18, i + 1), ip(18, 32768 + i + 1)];
  const table = (decls) => `table inet kpspn_floor {\n${decls.map((d) => `\tmap ${d[0]} {\n\t\ttype ${d[1]}\n\t}\n`).join('')}}\n`;
  const add = (map, els) => `add element inet kpspn_floor ${map} {\n${els.join(',\n')}\n}\n`;
  const perDest = [];
  const destPort = [];
  const destService = [];
  const perPort = [];
  const perService = [];
  const targets = [];
  for (let i = 0; i < n; i++) {
    ports.forEach(([port, target], p) => {
      const id = i * 2 + p + 1;
      for (const d of dests(i)) {
        destPort.push(`\t${d} . tcp . ${port} : ${id}`);
        destService.push(`\t${d} . tcp . ${port} : ${i + 1}`);
        for (let j = 0; j < 10; j++) perDest.push(`\t${d} . tcp . ${port} . ${j} : ${ep(i, j)} . ${target}`);
      }
      for (let j = 0; j < 10; j++) perPort.push(`\t${id} . ${j} : ${ep(i, j)} . ${target}`);
      targets.push(`\t${i + 1} . ${port} : ${target}`);
    });
    for (let j = 0; j < 10; j++) perService.push(`\t${i + 1} . ${j} : ${ep(i, j)}`);
  }
  const dest = 'ipv4_addr . inet_proto . inet_service';
  return {
    'per destination': table([['ep', `${dest} . mark : ipv4_addr . inet_service`]]) + add('ep', perDest),
    'per Service port': table([['dest', `${dest} : mark`], ['ep', 'mark . mark : ipv4_addr . inet_service']]) + add('dest', destPort) + add('ep', perPort),
    // the target port then comes from a map of its own, per Service port
    'per Service': table([['dest', `${dest} : mark`], ['ep', 'mark . mark : ipv4_addr'], ['port', 'mark . inet_service : inet_service']]) +
      add('dest', destService) + add('ep', perService) + add('port', targets),
  };
}

/** The floors for n Services (median of RUNS each), as table cells: jq's read, then nft per layout. */
async function floors(n, state) {
  const dir = mkdtempSync(join(tmpdir(), 'kpspn-floor-'));
  try {
    const jqRead = Array.from({ length: RUNS }, () => timed(['jq', 'empty'], state));
    const cells = [fmt(jqRead)];
    for (const [name, script] of Object.entries(floorScripts(n))) {
      const file = join(dir, 'floor.nft');
      writeFileSync(file, script);
      const times = [];
      for (let run = 0; run < RUNS; run++) {
        process.stderr.write(`floor: nft, ${name}, ${n} services, run ${run + 1}...\n`);
        times.push(await withNetns((ns) => timed(['ip', 'netns', 'exec', ns, 'nft', '-f', file])));
      }
      const elements = (script.match(/\n\t[^\t\n]* : /g) ?? []).length;
      cells.push(`${fmt(times)} (${elements.toLocaleString('en-US')} elements)`);
    }
    return cells;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)];
/** The median of xs as a table cell (seconds, or ms), or why there is none. */
const fmt = (xs, unit) => {
  if (xs.length === 0) return 'n/a';
  if (xs.includes(null)) return `> ${LIMIT_S} s (stopped)`;
  const m = median(xs);
  return unit === 'ms' ? `${(m * 1000).toFixed(0)} ms` : `${m.toFixed(2)} s`;
};

let seq = 0;
const rows = [];
const floorRows = [];
const reason = skipReason();
if (reason) {
  console.log(`bench/service-proxy.js skipped: ${reason}`);
  process.exit(0);
}
for (const n of SIZES) {
  const base = state(n, false);
  const moved = state(n, true);
  const changeSet = Buffer.from(`{"Previous":${line(0, false)}}\n${line(0, true)}\n`);
  const changeBack = Buffer.from(`{"Previous":${line(0, true)}}\n${line(0, false)}\n`);
  if (FLOORS) floorRows.push([n.toLocaleString('en-US'), ...(await floors(n, base))]);
  for (const impl of IMPLS) {
    const cases = { scratch: [], again: [], change: [], changeSet: [], frames: [] };
    for (let run = 0; run < RUNS; run++) {
      await withNetns(async (ns) => {
        process.stderr.write(`${impl.name}, ${n} services, run ${run + 1}...\n`);
        cases.scratch.push(timeRun(ns, impl, base));
        cases.again.push(timeRun(ns, impl, base));
        cases.change.push(timeRun(ns, impl, moved));
        if (impl.changes) {
          // back to the base state, then the change as a change set
          timeRun(ns, impl, base);
          cases.changeSet.push(timeRun(ns, impl, changeSet, { KPNG_CALLOUT_INPUT: 'changes' }));
          sh('ip', ['netns', 'exec', ns, 'nft', 'delete', 'table', 'inet', 'kpng_service_proxy']);
          const p = await persistentRun(ns, impl, base, [changeSet, changeBack], FRAMES);
          cases.frames.push(...p.times);
        }
      });
    }
    const frames = cases.frames.length ? `${fmt(cases.frames, 'ms')} (max ${(Math.max(...cases.frames) * 1000).toFixed(0)} ms)` : 'n/a';
    rows.push([impl.name, n.toLocaleString('en-US'), fmt(cases.scratch), fmt(cases.again), fmt(cases.change), fmt(cases.changeSet, 'ms'), frames]);
  }
}

const nft = (sh('nft', ['--version']).stdout || '').trim();
const jq = (sh('jq', ['--version']).stdout || '').trim();
console.log(`Run on ${runDate()} UTC, ${machine()}; ${nft}, ${jq}. Median of ${RUNS} run(s).\n`);
console.log(`| callout | services | from scratch | identical re-apply | one-Service change (full) | one-Service change (change set) | one-Service change, persistent frame: median of ${FRAMES} × runs |`);
console.log('|---|---:|---:|---:|---:|---:|---:|');
for (const r of rows) console.log(`| ${r.join(' | ')} |`);
if (floorRows.length) {
  console.log('\nFloors, the same run (median of the runs): the least any jq- and nft-based callout pays for this state.\n');
  console.log('| services | jq reading it | nft: endpoints per destination | nft: per Service port | nft: per Service |');
  console.log('|---:|---:|---:|---:|---:|');
  for (const r of floorRows) console.log(`| ${r.join(' | ')} |`);
}
