#!/usr/bin/env node
// Benchmark of the bundled "all-ip" callouts (npm run bench:callouts).
//
// For N = 100, 1,000 and 10,000 Services (one external IP and one local
// endpoint per family each), in a network namespace created for the run, so
// that the host's rules are never touched:
//   from scratch     the callout on an empty namespace;
//   re-apply         the same state again;
//   one change       the same state with one Service's local endpoints moved.
// For kpng-example-allip-nft also, in a section of its own, the same one-Service
// change given as a change set (issue 12): per run (KPNG_CALLOUT_INPUT=changes,
// after a full run that recorded the state) and through a persistent callout
// (KPNG_CALLOUT_MODE=persistent: from writing the frame to its ack on fd 3;
// the median of CHANGE_FRAMES frames that move the endpoints back and forth).
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
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { flag, machine, opt, recordSection, root, runDate } from './lib.js';

const SECTION = '## Callouts: kpng-example-allip (iptables) and kpng-example-allip-nft (nftables)';
const UPSTREAM_LIMIT_S = 60;
const CHANGE_FRAMES = 20;

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

/** The state, its lines in kpng order (by key, as the runner sends them: change sets rely on it). */
function state(n, change) {
  const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => (`svc-${a}` < `svc-${b}` ? -1 : 1));
  let s = '';
  for (const i of order) s += serviceLine(i, change && i === 0);
  return Buffer.from(s);
}

/** Runs the callout in the namespace (with `env` added); seconds, or null past the limit. */
function timeRun(ns, impl, input, env) {
  const t0 = process.hrtime.bigint();
  const r = sh('ip', ['netns', 'exec', ns, impl.path], {
    input,
    ...(env ? { env: { ...process.env, ...env } } : {}),
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

/** The change set from state(n, false) to state(n, true), or back (`back`): Service 0's lines only. */
function changeSetInput(back) {
  const [from, to] = back ? [serviceLine(0, true), serviceLine(0, false)] : [serviceLine(0, false), serviceLine(0, true)];
  return Buffer.from(`{"Previous":${from.slice(0, -1)}}\n${to}`);
}

/** A persistent callout in `ns`: `frame(input, body)` resolves with [ack, ms from write to ack]; `end()` with the exit code. */
function persistent(ns, impl, env) {
  const child = spawn('ip', ['netns', 'exec', ns, impl.path], { stdio: ['pipe', 'ignore', 'pipe', 'pipe'], env: { ...process.env, ...env, KPNG_CALLOUT_MODE: 'persistent' } });
  let stderr = '';
  child.stderr.setEncoding('utf8').on('data', (d) => (stderr = (stderr + d).slice(-4000)));
  const acks = [];
  let waiting;
  let partial = '';
  child.stdio[3].setEncoding('utf8').on('data', (d) => {
    const parts = (partial + d).split('\n');
    partial = parts.pop();
    for (const a of parts) acks.push([a, process.hrtime.bigint()]);
    waiting?.();
  });
  const exited = new Promise((resolve) => child.on('exit', (code) => (waiting?.(), resolve(code))));
  let seq = 0;
  return {
    async frame(input, body) {
      const t0 = process.hrtime.bigint();
      child.stdin.write(Buffer.concat([Buffer.from(`{"Frame":{"Seq":${++seq},"Input":"${input}"}}\n`), body, Buffer.from('\n')]));
      while (acks.length === 0) {
        if (child.exitCode !== null) throw new Error(`${impl.name} (persistent) exited: ${stderr}`);
        await new Promise((resolve) => (waiting = resolve));
      }
      const [ack, t1] = acks.shift();
      if (ack !== 'ok') throw new Error(`${impl.name} (persistent) answered ${ack}: ${stderr}`);
      return Number(t1 - t0) / 1e6;
    },
    async end() {
      child.stdin.end();
      return exited;
    },
  };
}

/**
 * kpng-example-allip-nft with change sets, per run and persistent, for n
 * Services; times in ms. Each run from a fresh namespace; every step checked
 * as in `measure`.
 */
async function measureChanges(impl, n, base, changed) {
  const out = { recordFull: [], perRun: [], frameFull: [], frames: [] };
  // Every step: one entry per external IP, and Service 0's IPv4 one where the state says.
  const check = (ns, what, moved) => {
    const got = entries(ns, impl);
    if (got[0] !== n || got[1] !== n) throw new Error(`${impl.name}, ${n} services, ${what}: the kernel holds ${got} entries, not ${n} per family`);
    const want = moved ? '198.19.255.254' : v4(19, 1);
    const elem = sh('ip', ['netns', 'exec', ns, 'nft', 'get', 'element', 'inet', 'kpng_allip', 'dnat4', `{ ${v4(18, 1)} }`]).stdout;
    if (!elem.includes(`${v4(18, 1)} : ${want} `)) throw new Error(`${impl.name}, ${n} services, ${what}: ${v4(18, 1)} is not mapped to ${want}: ${elem}`);
  };
  for (let run = 0; run < impl.runs; run++) {
    const ns = `kpngbench-${process.pid}-${++seq}`;
    const stateDir = mkdtempSync(join(tmpdir(), 'kpngbench-state-'));
    if (sh('ip', ['netns', 'add', ns]).status !== 0) throw new Error(`ip netns add ${ns} failed`);
    try {
      const env = (input) => ({ KPNG_CALLOUT_INPUT: input, KPNG_ALLIP_NFT_STATE_DIR: stateDir });
      out.recordFull.push(timeRun(ns, impl, base, env('full')) * 1000);
      check(ns, 'full, recording the state', false);
      for (const back of [false, true]) {
        out.perRun.push(timeRun(ns, impl, changeSetInput(back), env('changes')) * 1000);
        check(ns, 'change set, per run', !back);
      }
      const p = persistent(ns, impl, {});
      try {
        out.frameFull.push(await p.frame('full', changed));
        check(ns, 'full frame', true);
        for (let i = 0; i < CHANGE_FRAMES; i++) out.frames.push(await p.frame('changes', changeSetInput(i % 2 === 0)));
        check(ns, 'change-set frames', CHANGE_FRAMES % 2 === 0);
      } finally {
        const code = await p.end();
        if (code !== 0) throw new Error(`${impl.name} (persistent) exited ${code} at end of input`);
      }
    } finally {
      sh('ip', ['netns', 'del', ns]);
      rmSync(stateDir, { recursive: true, force: true });
    }
  }
  return out;
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
const changeRows = [];
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
    if (impl.kind === 'nft') {
      process.stderr.write(`${impl.name}, ${n} services, change sets...\n`);
      const c = await measureChanges(impl, n, base, changed);
      const ms = (xs) => `${median(xs).toFixed(1)} ms`;
      changeRows.push([n, ms(c.recordFull), ms(c.perRun), ms(c.frameFull), `${ms(c.frames)} (max ${Math.max(...c.frames).toFixed(1)} ms)`]);
    }
  }
}

const header = ['callout', 'services', 'from scratch', 'identical re-apply', 'one-service change'];
const table = [
  `| ${header.join(' | ')} |`,
  '|---|---:|---:|---:|---:|',
  ...rows.map((r) => `| ${r[0]} | ${r[1].toLocaleString('en-US')} | ${r[2]} | ${r[3]} | ${r[4]} |`),
].join('\n');

const changeTable = [
  '| services | full state, recording it (per run) | one-service change, change set (per run) | full frame (persistent) | one-service change, change-set frame (persistent) |',
  '|---:|---:|---:|---:|---:|',
  ...changeRows.map((r) => `| ${r[0].toLocaleString('en-US')} | ${r[1]} | ${r[2]} | ${r[3]} | ${r[4]} |`),
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

kpng-example-allip-nft with change sets (issue 12), milliseconds: a full run with
\`KPNG_CALLOUT_INPUT=full\` (which records the applied mapping), then the same one-Service change as a
change set per run (\`KPNG_CALLOUT_INPUT=changes\`, the median of ${RUNS * 2}: there and back), then a
persistent callout: its first, full frame, and ${CHANGE_FRAMES} change-set frames moving the endpoints back
and forth, from writing the frame to reading its ack on fd 3 (median of all runs' frames).
Target: a one-Service change from a change set at 10,000 Services in at most 20 ms.

${changeTable}
`;

console.log(table);
console.log();
console.log(changeTable);
if (RECORD) {
  recordSection(SECTION, section);
}
