#!/usr/bin/env node
// Replay of big dumps (npm run bench:replay, after npm run build). Not tests.
//
// Generates one cluster of --services Services (default 10,000), one
// EndpointSlice per Service with --per-service endpoints (default 10) spread
// over --nodes Nodes (default 100), and the Nodes, as `kubectl get
// svc,endpointslices,nodes -A` prints them (managedFields, resourceVersion,
// uid, last-applied-configuration, ownerReferences, node status and images),
// into a temporary directory, in three forms:
//   multi-doc YAML   one document per object, `---` between them;
//   List YAML        `kubectl get ... -o yaml`: one `kind: List`;
//   List JSON        `kubectl get ... -o json` (4-space indentation).
// Each is replayed by the built bin, as a user would:
//   kpng-json replay --node-name node-7 FILE > /dev/null
// in a child process, --runs times (default 3): wall time (spawn to exit,
// measured here) and peak RSS (/usr/bin/time -v's "Maximum resident set
// size", else VmHWM polled from /proc every 10 ms: a lower bound). One more run
// per form writes stdout to a file: the three outputs must be identical, or
// the benchmark fails.
//
// Prints a markdown table and records it in bench/RESULTS.md under "Replay of
// big dumps (issue 11)", as a block named by --label (default "current"); a
// block with the same label is replaced, others are kept (so "before ..." and
// "after ..." sit side by side, "before" first). Options:
//   --services 10000 --per-service 10 --nodes 100 --runs 3 --label current
//   --bin path/to/kpng-json (another build, e.g. a baseline: `git archive HEAD
//   src bin package.json tsconfig.json | tar -x -C DIR`, node_modules linked, tsc)
//   --keep (leave the fixtures in the temp dir) --no-record
import { createHash } from 'node:crypto';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { checkEmitter, writeFixtures } from './replay-cluster.js';
import { flag, haveTime, machine, measured, opt, recordSection, resultsFile, root, runDate } from './lib.js';

const HEADING = '## Replay of big dumps (issue 11)';
const SERVICES = Number(opt('--services', '10000'));
const PER_SERVICE = Number(opt('--per-service', '10'));
const NODES = Number(opt('--nodes', '100'));
const RUNS = Number(opt('--runs', '3'));
const LABEL = opt('--label', 'current');
const RECORD = !flag('--no-record');
const KEEP = flag('--keep');
const NODE_NAME = 'node-7';

// ------------------------------------------------------------ measuring

const BIN = opt('--bin', join(root, 'bin/kpng-json'));

/** One replay of `file`, stdout to `outPath` (default /dev/null): { wallS, peakMiB }. */
async function runOnce(file, outPath = '/dev/null') {
  const out = openSync(outPath, 'w');
  try {
    const r = await measured(process.execPath, [BIN, 'replay', '--node-name', NODE_NAME, file], { stdout: out });
    if (r.code !== 0) throw new Error(`replay ${file} exited ${r.code}:\n${r.stderr}`);
    return { wallS: r.wallMs / 1000, peakMiB: r.peakKiB / 1024 };
  } finally {
    closeSync(out);
  }
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const sha = (path) => createHash('sha256').update(readFileSync(path)).digest('hex');

// ------------------------------------------------------------ main

await checkEmitter();
const dir = mkdtempSync(join(os.tmpdir(), 'kpng-replay-bench-'));
try {
  console.log(`generating ${SERVICES} Services × ${PER_SERVICE} endpoints, ${NODES} Nodes in ${dir} ...`);
  const files = await writeFixtures(dir, { services: SERVICES, perService: PER_SERVICE, nodes: NODES });
  const forms = [
    ['multi-document YAML', files.multi],
    ['`kind: List` YAML', files.list],
    ['`kind: List` JSON', files.json],
  ];
  // Same state from every form.
  const digests = [];
  for (const [name, file] of forms) {
    const outPath = join(dir, 'out.jsonl');
    await runOnce(file, outPath);
    digests.push(sha(outPath));
    const lines = readFileSync(outPath, 'utf8').split('\n').length - 1;
    console.log(`${name}: ${lines} lines of output, sha256 ${digests.at(-1).slice(0, 16)}`);
  }
  if (new Set(digests).size !== 1) throw new Error('the three forms gave different outputs');

  const rows = [];
  for (const [name, file] of forms) {
    const runs = [];
    for (let r = 0; r < RUNS; r++) {
      runs.push(await runOnce(file));
      console.log(`${name} run ${r + 1}: ${runs.at(-1).wallS.toFixed(2)} s, ${runs.at(-1).peakMiB.toFixed(0)} MiB`);
    }
    const walls = runs.map((x) => x.wallS);
    const peaks = runs.map((x) => x.peakMiB);
    const mib = statSync(file).size / 2 ** 20;
    rows.push(
      `| ${name} | ${mib.toFixed(1)} | ${median(walls).toFixed(2)} | ${Math.min(...walls).toFixed(2)}–${Math.max(...walls).toFixed(2)} | ${median(peaks).toFixed(0)} | ${Math.max(...peaks).toFixed(0)} |`,
    );
  }
  const table = ['| fixture | MiB | wall s (median) | wall s (min–max) | peak RSS MiB (median) | peak RSS MiB (max) |', '|---|---:|---:|---:|---:|---:|', ...rows].join('\n');
  console.log(`\n${table}\n`);

  const block = `### ${LABEL}

Run on ${runDate()} UTC, ${machine()}${BIN === join(root, 'bin/kpng-json') ? '' : ` (\`--bin ${BIN}\`)`}. ${SERVICES.toLocaleString('en')} Services, ${SERVICES.toLocaleString('en')} EndpointSlices × ${PER_SERVICE} endpoints, ${NODES} Nodes; ${RUNS} runs each; peak RSS from ${haveTime ? '/usr/bin/time' : 'VmHWM polling (a lower bound)'}.

${table}
`;
  if (RECORD) recordSection(HEADING, sectionWith(block));
} finally {
  if (KEEP) console.log(`fixtures kept in ${dir}`);
  else rmSync(dir, { recursive: true, force: true });
}

/** The section with `block` in place of the block of the same label (or added), other blocks kept. */
function sectionWith(block) {
  const intro = `${HEADING}

\`npm run bench:replay\` (bench/replay.js): a generated cluster as \`kubectl get svc,endpointslices,nodes -A\`
prints it (with managedFields, resourceVersion, uid, last-applied-configuration, node status and images),
replayed by \`kpng-json replay --node-name ${NODE_NAME} FILE > /dev/null\` in a child process: wall time from
spawn to exit, peak RSS of the process. The three forms must give byte-identical output.
Target (issue 11): ≤ 3 s and ≤ 400 MiB for both YAML forms at 10,000 Services.
`;
  let blocks = [];
  const text = existsSync(resultsFile) ? readFileSync(resultsFile, 'utf8') : '';
  const start = text.indexOf(HEADING);
  if (start >= 0) {
    const next = text.indexOf('\n## ', start + HEADING.length);
    const old = text.slice(start, next >= 0 ? next + 1 : undefined);
    blocks = old.split(/\n(?=### )/).slice(1).map((b) => b.trim() + '\n');
  }
  const label = `### ${LABEL}\n`;
  const i = blocks.findIndex((b) => b.startsWith(label));
  if (i >= 0) blocks[i] = block;
  else blocks.push(block);
  // A "before ..." block (a baseline) first.
  blocks.sort((a, b) => Number(b.startsWith('### before')) - Number(a.startsWith('### before')));
  return [intro, ...blocks].join('\n');
}
