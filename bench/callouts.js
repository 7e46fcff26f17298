#!/usr/bin/env node
// Benchmark of the bundled "all-ip" callouts (npm run bench:callouts).
//
// For N = 100, 1,000 and 10,000 Services (one external IP and one local
// endpoint per family each), in a network namespace created for the run, so
// that the host's rules are never touched:
//   from scratch     the callout on an empty namespace;
//   re-apply         the same state again;
//   one change       the same state with one Service's local endpoints moved.
// For callouts/kpng-example-allip (iptables-restore), callouts/kpng-example-allip-nft
// (nft -f) and bench/upstream-allip.sh, a re-creation of the retired upstream
// script's one-command-per-rule approach (run only up to the N where a phase
// stays under a minute). Times are wall-clock seconds of one callout run, its
// stdin fed from memory; the median of several runs, each from a fresh namespace.
// Every run is checked: the kernel must hold one DNAT entry per external IP.
//
// No packet is sent. The rules name addresses that are never assigned anywhere:
// IPv4 external IPs from 198.18.0.0/16 and endpoints from 198.19.0.0/16 (the
// RFC 2544 benchmarking range: the IPv4 documentation ranges hold only 768
// addresses), IPv6 from 2001:db8::/32.
//
// Prints a table and records it in bench/RESULTS.md, in a section of its own
// (replaced on each run; other benchmarks keep theirs). Options:
//   --sizes 100,1000   other sizes      --runs 3   runs per measure
//   --no-record        do not write bench/RESULTS.md
// Needs root, `ip netns`, iptables, nft and jq; exits 0 saying why when not.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { flag, machine, opt, recordSection, root, runDate } from './lib.js';

const SECTION = '## Callouts: kpng-example-allip (iptables) and kpng-example-allip-nft (nftables)';
const UPSTREAM_LIMIT_S = 60;

const SIZES = opt('--sizes', '100,1000,10000').split(',').map(Number);
const RUNS = Number(opt('--runs', '3'));
const RECORD = !flag('--no-record');

const IMPLS = [
  { name: 'kpng-example-allip', path: join(root, 'callouts/kpng-example-allip'), kind: 'iptables', runs: RUNS },
  { name: 'kpng-example-allip-nft', path: join(root, 'callouts/kpng-example-allip-nft'), kind: 'nft', runs: RUNS },
  { name: 'upstream approach', path: join(root, 'bench/upstream-allip.sh'), kind: 'upstream', runs: 1, limitS: UPSTREAM_LIMIT_S },
];

function sh(cmd, argv, opts = {}) {
  return spawnSync(cmd, argv, { encoding: 'utf8', maxBuffer: 256 << 20, ...opts });
}

function skipReason() {
  if (process.platform !== 'linux') return 'network namespaces need Linux';
  if (process.getuid?.() !== 0) return 'network namespaces need root';
  for (const tool of ['ip', 'iptables', 'ip6tables', 'iptables-restore', 'ip6tables-restore', 'iptables-save', 'nft', 'jq']) {
    if (sh('sh', ['-c', 'command -v "$1"', 'sh', tool]).status !== 0) return `${tool} is missing (apt-get install iptables nftables iproute2 jq)`;
  }
  const probe = `kpngbench-${process.pid}-probe`;
  const r = sh('ip', ['netns', 'add', probe]);
  if (r.status !== 0) return `cannot create a network namespace: ${r.stderr.trim()}`;
  sh('ip', ['netns', 'del', probe]);
  return undefined;
}

const v4 = (second, i) => `198.${second}.${(i >> 8) & 255}.${i & 255}`;
const v6 = (prefix, i) => `2001:db8:${prefix}::${i.toString(16)}`;

/** One state line shaped as kpng prints it; `moved` gives Service 0 other local endpoints. */
function serviceLine(i, moved) {
  const ep = (ips, local) => ({ IPs: ips, ...(local ? { Local: true } : {}), Scopes: { Internal: true, External: true } });
  const [l4, l6] = moved ? ['198.19.255.254', '2001:db8:2::1'] : [v4(19, i + 1), v6(1, i + 1)];
  return JSON.stringify({
    Service: {
      Namespace: 'bench',
      Name: `svc-${i}`,
      Type: 'ClusterIP',
      IPs: { ClusterIPs: {}, ExternalIPs: { V4: [v4(18, i + 1)], V6: [v6('e', i + 1)] }, Headless: true },
      Ports: [{ Protocol: 1, Port: 80, TargetPort: 8080 }],
      SessionAffinity: null,
    },
    Endpoints: [ep({ V4: [l4] }, true), ep({ V6: [l6] }, true), ep({ V4: ['198.19.255.1'] }, false), ep({ V6: ['2001:db8:3::1'] }, false)],
  }) + '\n';
}

function state(n, change) {
  let s = '';
  for (let i = 0; i < n; i++) s += serviceLine(i, change && i === 0);
  return Buffer.from(s);
}

/** Runs the callout in the namespace; seconds, or null past the limit. */
function timeRun(ns, impl, input) {
  const t0 = process.hrtime.bigint();
  const r = sh('ip', ['netns', 'exec', ns, impl.path], {
    input,
    stdio: ['pipe', 'ignore', 'pipe'],
    timeout: impl.limitS ? impl.limitS * 1000 : 0,
    killSignal: 'SIGKILL',
  });
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  if (r.error?.code === 'ETIMEDOUT' || r.signal === 'SIGKILL') return null;
  if (r.status !== 0) throw new Error(`${impl.name} exited ${r.status}: ${r.stderr}`);
  return s;
}

/** Number of DNAT entries per family in the namespace (an entry = one external IP mapped). */
function entries(ns, impl) {
  if (impl.kind === 'nft') {
    return [4, 6].map((fam) => {
      const r = sh('ip', ['netns', 'exec', ns, 'nft', '-j', 'list', 'map', 'inet', 'kpng_allip', `dnat${fam}`]);
      const map = JSON.parse(r.stdout).nftables.find((o) => o.map)?.map;
      return map?.elem?.length ?? 0;
    });
  }
  const re = impl.kind === 'iptables' ? /^-A KPNG-ALLIP -d /gm : /^-A PREROUTING -d /gm;
  return ['iptables-save', 'ip6tables-save'].map((save) => (sh('ip', ['netns', 'exec', ns, save, '-t', 'nat']).stdout.match(re) ?? []).length);
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor((s.length - 1) / 2)];
}

let seq = 0;
function measure(impl, n, base, changed) {
  const phases = { scratch: [], again: [], change: [] };
  for (let run = 0; run < impl.runs; run++) {
    const ns = `kpngbench-${process.pid}-${++seq}`;
    if (sh('ip', ['netns', 'add', ns]).status !== 0) throw new Error(`ip netns add ${ns} failed`);
    try {
      for (const [phase, input] of [['scratch', base], ['again', base], ['change', changed]]) {
        const s = timeRun(ns, impl, input);
        if (s === null) {
          phases[phase].push(null);
          return { ...phases, timedOut: phase };
        }
        const got = entries(ns, impl);
        if (got[0] !== n || got[1] !== n) throw new Error(`${impl.name}, ${n} services, ${phase}: the kernel holds ${got} entries, not ${n} per family`);
        phases[phase].push(s);
      }
    } finally {
      sh('ip', ['netns', 'del', ns]);
    }
  }
  return phases;
}

function version(cmd, argv) {
  const r = sh(cmd, argv);
  return (r.stdout || r.stderr || '').split('\n')[0].trim() || '?';
}

const reason = skipReason();
if (reason) {
  console.log(`bench:callouts skipped: ${reason}`);
  process.exit(0);
}

const rows = [];
const fmt = (xs) => {
  if (!xs || xs.length === 0) return 'not run';
  if (xs.includes(null)) return `> ${UPSTREAM_LIMIT_S} s (stopped)`;
  return `${median(xs).toFixed(3)} s`;
};
for (const n of SIZES) {
  const base = state(n, false);
  const changed = state(n, true);
  for (const impl of IMPLS) {
    if (impl.stopped) {
      rows.push([impl.name, n, 'not run', 'not run', 'not run']);
      continue;
    }
    process.stderr.write(`${impl.name}, ${n} services...\n`);
    const m = measure(impl, n, base, changed);
    if (m.timedOut) impl.stopped = true;
    rows.push([impl.name, n, fmt(m.scratch), fmt(m.again), fmt(m.change)]);
  }
}

const header = ['callout', 'services', 'from scratch', 'identical re-apply', 'one-service change'];
const table = [
  `| ${header.join(' | ')} |`,
  '|---|---:|---:|---:|---:|',
  ...rows.map((r) => `| ${r[0]} | ${r[1].toLocaleString('en-US')} | ${r[2]} | ${r[3]} | ${r[4]} |`),
].join('\n');

const tools = [version('iptables', ['--version']), version('nft', ['--version']), version('jq', ['--version']), `node ${process.version}`].join(', ');
const section = `${SECTION}

Run on ${runDate()} UTC, ${machine({ node: false })}; ${tools}.
\`npm run bench:callouts\` (bench/callouts.js): wall-clock seconds of one callout run, inside a
network namespace the benchmark creates, N Services with one external IP and one local endpoint per
family each. Median of ${RUNS} runs, each from a fresh namespace (the upstream approach: one run; it
stops at the first size where a phase takes over ${UPSTREAM_LIMIT_S} s). "One-service change" moves one
Service's local endpoints; the upstream approach then changes nothing (a rule for that external IP
exists), so its traffic keeps going to the old endpoint.
Targets: 10,000 Services from scratch under 2 s, an identical re-apply under 1 s.

${table}
`;

console.log(table);
if (RECORD) {
  recordSection(SECTION, section);
}
