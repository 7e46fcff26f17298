// Shared by the benchmark scripts (bench/run.js, bench/callouts.js,
// bench/codec.js, bench/kube.js, bench/replay.js): where the repository is,
// the machine line, the RESULTS.md section each one records its table in, a
// child's peak RSS from /usr/bin/time, the floor of an incremental run, and
// the CPU other processes take meanwhile.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
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

/** Whether /usr/bin/time is there: peak RSS from it (see underTime), else scripts poll VmHWM. */
export const haveTime = existsSync('/usr/bin/time');

/** [file, args] that run `cmd argv` under /usr/bin/time when there, which then prints "peak-rss-kib N" on stderr. */
export const underTime = (cmd, argv) => (haveTime ? ['/usr/bin/time', ['-f', 'peak-rss-kib %M', cmd, ...argv]] : [cmd, argv]);

/** The peak RSS (KiB) in the stderr of a command run by underTime, else undefined. */
export function timedPeakKiB(stderr) {
  const m = /peak-rss-kib (\d+)/.exec(stderr);
  return m ? Number(m[1]) : undefined;
}

/**
 * Without /usr/bin/time: polls process `pid`'s VmHWM every `everyMs`;
 * stop() ends the polling and gives the highest seen, KiB (0: none read).
 */
export function pollPeakKiB(pid, everyMs) {
  let hwm = 0;
  const timer = setInterval(() => {
    try {
      const m = /VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
      if (m) hwm = Math.max(hwm, Number(m[1]));
    } catch {
      // exited between two polls
    }
  }, everyMs);
  return {
    stop() {
      clearInterval(timer);
      return hwm;
    },
  };
}

/**
 * Runs `cmd argv` (spawn options `o`: env, cwd; `stdout`: a file descriptor
 * for its stdout, else `onStdout` gets each chunk) and resolves, once it has
 * exited, with its exit code, wall ms, peak RSS KiB (/usr/bin/time's, else
 * VmHWM polled every `pollMs`: a lower bound) and stderr.
 */
export function measured(cmd, argv, { stdout, onStdout, pollMs = 10, ...o } = {}) {
  return new Promise((resolvePromise, reject) => {
    const [file, args] = underTime(cmd, argv);
    let stderr = '';
    const t0 = process.hrtime.bigint();
    const child = spawn(file, args, { ...o, stdio: ['ignore', stdout ?? 'pipe', 'pipe'] });
    if (onStdout) child.stdout?.on('data', onStdout);
    else child.stdout?.resume();
    child.stderr.setEncoding('utf8').on('data', (d) => (stderr += d));
    const poll = haveTime ? undefined : pollPeakKiB(child.pid, pollMs);
    child.on('error', reject);
    child.on('close', (code) => {
      const wallMs = Number(process.hrtime.bigint() - t0) / 1e6;
      const hwm = poll?.stop() ?? 0;
      resolvePromise({ code, wallMs, peakKiB: timedPeakKiB(stderr) ?? hwm, stderr });
    });
  });
}

/** The q-quantile (0..1) of an ascending array (nearest rank). */
export const quantile = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];

/**
 * The floor of an incremental run: spawn `file args` and hand it `lines` on
 * stdin (corked writes, as the runner does), with no source and no runner
 * around, `n` times. Each time is from spawn until stdin is written and
 * closed, or, with `marker`, until the program first writes to stdout (the
 * callout prints a marker at stdin EOF); `gapMs` waits before each spawn.
 * Returns { p50, p99 } in ms.
 */
export async function handOverFloor(lines, n, { file = 'dd', args = ['of=/dev/null', 'bs=1M', 'status=none'], marker = false, gapMs = 0 } = {}) {
  const times = [];
  for (let i = 0; i < n; i++) {
    if (gapMs > 0) await new Promise((r) => setTimeout(r, gapMs));
    const t0 = process.hrtime.bigint();
    const child = spawn(file, args, { stdio: ['pipe', marker ? 'pipe' : 'ignore', 'ignore'], detached: true });
    const written = new Promise((res) => {
      child.stdin.cork();
      for (const l of lines) child.stdin.write(l);
      child.stdin.uncork();
      child.stdin.end(res);
    });
    await (marker ? once(child.stdout, 'data') : written);
    times.push(Number(process.hrtime.bigint() - t0) / 1e6);
    await once(child, 'exit');
  }
  times.sort((a, b) => a - b);
  return { p50: quantile(times, 0.5), p99: quantile(times, 0.99) };
}

/**
 * Watches, once a second, the CPU time other processes use (every process but
 * this one and its descendants), so that a benchmark on a shared machine can
 * say what it ran alongside. `take()` returns what was used since the last
 * take: { total, top } in CPU seconds, `top` as "name 1.2 s" for each
 * command name over 0.5 s. `stop()` ends the sampling.
 */
export function otherProcessesCpu({ intervalMs = 1000, ticksPerSecond = 100 } = {}) {
  /** pid -> CPU ticks at the last sample. */
  let last = new Map();
  const used = new Map();
  const sample = () => {
    const procs = [];
    for (const name of readdirSync('/proc')) {
      if (!/^\d+$/.test(name)) continue;
      try {
        const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
        const close = stat.lastIndexOf(')');
        const f = stat.slice(close + 2).split(' ');
        // After "pid (comm) ": state ppid ... utime is field 14 of the whole line, stime 15.
        procs.push({ pid: Number(name), comm: stat.slice(stat.indexOf('(') + 1, close), ppid: Number(f[1]), ticks: Number(f[11]) + Number(f[12]) });
      } catch {
        // gone meanwhile
      }
    }
    const children = new Map();
    for (const p of procs) children.set(p.ppid, [...(children.get(p.ppid) ?? []), p.pid]);
    const ours = new Set([process.pid]);
    for (const pid of ours) for (const c of children.get(pid) ?? []) ours.add(c);
    const now = new Map();
    for (const p of procs) {
      now.set(p.pid, p.ticks);
      if (ours.has(p.pid) || last.size === 0) continue;
      const delta = p.ticks - (last.get(p.pid) ?? 0);
      if (delta > 0) used.set(p.comm, (used.get(p.comm) ?? 0) + delta / ticksPerSecond);
    }
    last = now;
  };
  sample();
  const timer = setInterval(sample, intervalMs).unref();
  return {
    take() {
      sample();
      const top = [...used].filter(([, s]) => s >= 0.5).sort((a, b) => b[1] - a[1]);
      const total = [...used.values()].reduce((a, b) => a + b, 0);
      used.clear();
      return { total, top: top.map(([name, s]) => `${name} ${s.toFixed(1)} s`) };
    },
    stop: () => clearInterval(timer),
  };
}
