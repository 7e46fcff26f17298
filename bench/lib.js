// Shared by the benchmark scripts (bench/run.js, bench/callouts.js,
// bench/codec.js): where the repository is, the machine line and the
// RESULTS.md section each one records its table in.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const resultsFile = join(root, 'bench/RESULTS.md');

/** `--name value` from argv, else dflt (a string: callers convert). */
export function opt(name, dflt) {
  const args = process.argv.slice(2);
  const i = args.indexOf(name);
  return i >= 0 && args[i + 1] ? args[i + 1] : dflt;
}

/** Whether `--name` stands in argv (e.g. --no-record). */
export function flag(name) {
  return process.argv.slice(2).includes(name);
}

/** "CPU model × count[, N GiB], Linux release[, node vX]": the scripts differ in what they list. */
export function machine({ memory = true, node = true } = {}) {
  const cpus = os.cpus();
  return [
    `${cpus[0]?.model.trim() ?? '?'} × ${cpus.length}`,
    ...(memory ? [`${(os.totalmem() / 2 ** 30).toFixed(1)} GiB`] : []),
    `Linux ${os.release()}`,
    ...(node ? [`node ${process.version}`] : []),
  ].join(', ');
}

/** Now as "YYYY-MM-DD HH:MM" (UTC), for the "Run on" line. */
export function runDate() {
  return new Date().toISOString().slice(0, 16).replace('T', ' ');
}

/**
 * Writes section (starting with its heading line) into bench/RESULTS.md,
 * replacing the previous section under the same heading (up to the next
 * "## "), else appending it; other benchmarks' sections are kept.
 */
export function recordSection(heading, section) {
  let text = existsSync(resultsFile) ? readFileSync(resultsFile, 'utf8') : '# Benchmark results\n';
  const start = text.indexOf(heading);
  if (start >= 0) {
    const next = text.indexOf('\n## ', start + heading.length);
    text = text.slice(0, start) + section + (next >= 0 ? '\n' + text.slice(next + 1) : '');
  } else {
    text = text.replace(/\n*$/, '\n\n') + section;
  }
  writeFileSync(resultsFile, text);
  console.log(`recorded in ${resultsFile}`);
}
