#!/usr/bin/env node
// The pipeline benchmarks (npm run bench, after npm run build). Not tests.
// The measurements are in bench/pipeline.js; this file runs them and reports.
//
// A stripped-down kpng server (bench/kpng-bench-server.js, its own process)
// holds 10,000 Services with 10 Endpoints each (a ClusterIP and one port per
// Service; per Endpoint one IPv4 address, one named port override and both
// scopes, one in ten local: what kpng sends for an ordinary cluster).
//
//   (a) ingest       `kpng-json --once` against it: wall time from spawn to
//                    exit and peak RSS (/usr/bin/time, else VmHWM polling);
//                    stdout (a pipe) is checked byte for byte.
//   (b) incremental  the real kpng source and runner in this process
//                    (dist/), --debounce 0; after the initial state, 1,000
//                    revisions, each changing one Endpoint: per revision, the
//                    time from the server writing the Sync to the callout
//                    having read its whole stdin (it prints "x" at EOF). The
//                    callout is `dd of=/dev/null bs=1M; echo x` (reads everything, fast).
//                    Clocks: process.hrtime (CLOCK_MONOTONIC) in both processes.
//   (c) coalescing   the real `kpng-callout` (default --debounce 100ms,
//                    --max-wait 1s) with a callout that saves its stdin and
//                    sleeps 200 ms; 10,000 revisions within one second; counts
//                    the runs after the initial one and checks that the last
//                    run's input equals the final state (`kpng-json --once`).
//
// Prints a table and records it in bench/RESULTS.md, in a section of its own
// (replaced on each run; other benchmarks keep theirs). Options:
//   --only a,b,c,m   --runs 5 (ingest runs)   --revisions 1000   --no-record
//   --modes full,changes,persistent (which of (m) to run; only a run of all three is recorded)
//   --mode-revisions 300
import { flag, machine, opt, recordSection, runDate } from './lib.js';
import { benchCoalescing, benchIncremental, benchIngest, ms, PER_SERVICE, REVISIONS, RUNS, SERVICES } from './pipeline.js';

const SECTION = '## Pipeline: ingest, incremental runs, coalescing';
const ONLY = new Set(opt('--only', 'a,b,c').split(','));
const RECORD = !flag('--no-record');

// ---------------------------------------------------------------- main

const results = {};
if (ONLY.has('a')) {
  process.stderr.write('(a) ingest...\n');
  results.a = await benchIngest();
}
if (ONLY.has('b')) {
  process.stderr.write('(b) incremental...\n');
  results.b = await benchIncremental();
}
if (ONLY.has('m')) {
  // Issue 12: the same one-endpoint revisions through (a) a process per run, full; (b) per run, --changes; (c) --persistent --changes.
  const n = Number(opt('--mode-revisions', '300'));
  const modes = new Set(opt('--modes', 'full,changes,persistent').split(','));
  for (const [key, variant] of [
    ['full', {}],
    ['changes', { changes: true }],
    ['persistent', { changes: true, persistent: true }],
  ]) {
    if (!modes.has(key)) continue;
    process.stderr.write(`(m) incremental, ${key}...\n`);
    results[`m-${key}`] = await benchIncremental({ ...variant, revisions: n });
  }
}
if (ONLY.has('c')) {
  process.stderr.write('(c) coalescing...\n');
  results.c = await benchCoalescing();
}

const verdict = (ok) => (ok ? 'met' : '**missed**');
const rows = [];
const { a, b, c } = results;
if (a) {
  rows.push([`(a) ingest: \`kpng-json --once\`, wall (median of ${RUNS}; max)`, `${(a.wallMedian / 1000).toFixed(3)} s; ${(a.wallMax / 1000).toFixed(3)} s`, '< 0.6 s', verdict(a.wallMedian < 600)]);
  rows.push([`(a) ingest: peak RSS (median; max; ${a.rssHow})`, `${a.rssMedian.toFixed(0)} MB; ${a.rssMax.toFixed(0)} MB`, '< 150 MB', verdict(a.rssMax < 150)]);
  rows.push([`(a) floor: a bare grpc-js client receiving the same stream, nothing decoded (median)`, `${(a.grpcFloor / 1000).toFixed(3)} s`, '', '']);
  rows.push([`(a) floor: the same over node:http2 directly (median)`, `${(a.h2Floor / 1000).toFixed(3)} s`, '', '']);
}
if (b) {
  rows.push([`(b) incremental: Sync → callout stdin written, p50`, ms(b.p50), '', '']);
  rows.push([`(b) incremental: Sync → callout stdin written, p99 (max ${ms(b.max, 1)})`, ms(b.p99), '< 5 ms', verdict(b.p99 < 5)]);
  rows.push([`(b) of which Sync → state pushed to the runner, p50; p99`, `${ms(b.pushedP50)}; ${ms(b.pushedP99)}`, '', '']);
  rows.push([`(b) of which Sync → callout spawned, p50; p99`, `${ms(b.startedP50)}; ${ms(b.startedP99)}`, '', '']);
  rows.push([`(b) floor: spawn \`dd\` and hand it the same ${(b.bytes / 1e6).toFixed(1)} MB, no source or runner, p50; p99`, `${ms(b.floorP50)}; ${ms(b.floorP99)}`, '', '']);
}
if (c) {
  rows.push([`(c) coalescing: runs for 10,000 revisions in ${(c.burstMs / 1000).toFixed(2)} s (200 ms callout)`, String(c.runs), '≤ 12', verdict(c.runs <= 12)]);
  rows.push([`(c) coalescing: last run's input = final state`, c.exact ? 'exact' : 'DIFFERS', 'exact', verdict(c.exact)]);
}
const table = ['| benchmark | measured | target | |', '|---|---:|---:|---|', ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');
console.log(table);

// Why the missed targets are missed (profiles of 2026-11-22, node --cpu-prof; see the floors above).
const NOTES = `
Where the time goes (profiled with \`node --cpu-prof\` on this machine, 2026-11-22; before
this work the same runs gave (a) 1.5 s and 318 MB, (b) 18.8 ms at p50 and 43.8 ms at p99):

- (a) \`kpng-json --once\`, 0.8–0.9 s: loading modules ~0.1 s; receiving the stream ~0.6 s,
  of which grpc-js's own per-message pipeline (stream decoder, an async compression filter
  and a promise per message, an object-mode stream) is most: compare the two floor rows,
  the same stream with nothing decoded through grpc-js and over node:http2 directly. Our
  decoding and store take ~0.15 s (OpItems and Endpoints go from wire bytes straight to
  JSON, src/wirejson.ts), GC ~0.1 s, the first snapshot (10,000 lines encoded) ~0.1 s,
  writing 14.7 MB ~0.05 s. Under 0.6 s needs a transport without grpc-js's per-message
  cost (a minimal gRPC client on node:http2: the difference of the floor rows) and a little
  more off our side. Peak RSS went down by keeping values only as flat JSON strings: the
  model objects and the cons-string trees of cached encodings were most of the heap.
- (b) the pipeline's own part (Sync → state → runner → spawn) is well under 1 ms (it was
  ~5 ms while a snapshot walked all 10,000 Services). The rest is handing 14.7 MB to
  another process, which the floor row measures alone; spawning also costs more as our
  heap grows (fork copies page tables), and the p99 carries our GC pauses (scavenges of
  ~2 ms, an occasional mark-compact of ~20 ms). A p99 under 5 ms is out of reach for a
  state of this size here: writing 14.7 MB once, to a pipe or to tmpfs, takes ~7 ms at the
  median by itself.
`;

const stateBytes = a?.bytes ?? b?.bytes ?? c?.bytes;
const section = `${SECTION}

Run on ${runDate()} UTC, ${machine()}.
\`npm run bench\` (bench/run.js): a stripped-down kpng server (bench/kpng-bench-server.js, its own
process, on loopback) holds ${SERVICES.toLocaleString('en-US')} Services with ${PER_SERVICE} Endpoints each (per Endpoint one IPv4
address, one named port override and both scopes), ${stateBytes ? `${(stateBytes / 1e6).toFixed(1)} MB of NDJSON` : ''}.
(a) \`kpng-json --once\` from spawn to exit, stdout a pipe checked byte for byte. (b) the kpng source and
the runner (dist/) in one process, \`--debounce 0\`, ${REVISIONS.toLocaleString('en-US')} revisions changing one Endpoint each, one at a
time: from the server writing the Sync to the callout (\`dd of=/dev/null\`) having been handed the whole
state on stdin. (c) \`kpng-callout\` with its defaults (\`--debounce 100ms --max-wait 1s\`), a callout that
saves its stdin and sleeps 200 ms, 10,000 revisions within one second; runs counted after the initial one.

${table}
${NOTES}`;
if (RECORD && rows.length > 0) {
  recordSection(SECTION, section);
}

// ---------------------------------------------------------------- (m): issue 12
if (results['m-full'] || results['m-changes'] || results['m-persistent']) {
  const M_SECTION = '## Change sets and persistent callouts: one-endpoint changes at 10,000 Services (issue 12)';
  const f = (x) => (Number.isFinite(x) ? `${x.toFixed(2)} ms` : '—');
  const mrows = [
    ['(a) a process per run, full state (today)', results['m-full'], 'the same program, the same whole state'],
    ['(b) a process per run, `--changes`', results['m-changes'], 'the same program, an input of the change set\'s size, until its "x"'],
    ['(c) `--persistent --changes`', results['m-persistent'], 'none (no process is started)'],
  ];
  const mtable = [
    '| mode | Sync → callout has the whole input: p50 | p99 | max | of which Sync → state pushed; → run started (p50 / p99) | floor: spawn … (p50; p99) | GC pauses in our process (count; longest) |',
    '|---|---:|---:|---:|---:|---|---:|',
    ...mrows.filter(([, r]) => r).map(([name, r, floorWhat]) => `| ${name} | ${f(r.p50)} | ${f(r.p99)} | ${f(r.max)} | ${f(r.pushedP50)}; ${f(r.startedP50)} / ${f(r.pushedP99)}; ${f(r.startedP99)} | ${floorWhat}: ${f(r.floorP50)}; ${f(r.floorP99)} | ${r.gcPauses}; ${f(r.gcMaxMs)} |`),
  ].join('\n');
  console.log(mtable);
  const n = Number(opt('--mode-revisions', '300'));
  const msection = `${M_SECTION}

Run on ${runDate()} UTC, ${machine()}.
\`node bench/run.js --only m\`: the kpng bench server (10,000 Services × 10 Endpoints) and the kpng source and
runner (dist/) in one process, \`--debounce 0\`, ${n} revisions changing one Endpoint each, one at a time; per
revision, from the server writing the Sync to the callout having its whole input: (a), (b) \`sh -c 'dd of=/dev/null; echo x'\`
says "x" at stdin EOF (timed when the "x" reaches us); (c) a python3 frame reader says "x" and its own
CLOCK_MONOTONIC time (the clock of the server's Sync times) once it has read the frame's empty line, then acks on
fd 3: the time at the callout, without the way back of its "x".
Targets (issue 12): (c) p50 ≤ 1 ms and p99 ≤ 3 ms; (b) within 1 ms of its floor.

${mtable}
`;
  // Only a run of all three modes is recorded.
  if (RECORD && mrows.every(([, r]) => r)) recordSection(M_SECTION, msection);
}
