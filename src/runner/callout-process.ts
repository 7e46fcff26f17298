/**
 * A process per run: the `Callout` that spawns the program for each state,
 * hands it the state on stdin and waits until nothing of it is left.
 *
 * - Each run is its own process group (`ProcessGroup`): a timeout (or stop)
 *   SIGTERMs the whole group, then SIGKILLs it after a grace period.
 * - Nothing of a run outlives it: once the callout has exited and its output
 *   is drained (`ChildOutput`), whatever is left in its group (background
 *   processes) is killed the same way, with a warning naming the pids, before
 *   the run counts as finished; at our exit the in-flight group is SIGKILLed.
 * - Our own output streams may break (`Outlet`): the callout's output meant
 *   for a broken stream is dropped, never waited for.
 *
 * We use node:child_process rather than execa here: execa resolves only once
 * the child's pipes are closed (a grandchild holding stdout open would hold the
 * run forever), and it kills the child rather than its process group. We need
 * both the group kill and a bounded wait for pipes, plus writev-style stdin
 * from cached Buffers and line-prefixed live stderr, which are all simpler on
 * the plain ChildProcess.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { finished, type Writable } from 'node:stream';
import { DEFAULTS } from '../defaults.js';
import { readerGone } from '../errors.js';
import { silentLogger, type Logger } from '../log.js';
import { inputFor, type Input } from '../changes.js';
import type { State } from '../state.js';
import { calloutBaseEnv, type Callout, type InFlight, type RunRequest, type RunResult } from './callout.js';
import { spawnErrorMessage } from './callout-check.js';
import { ChildOutput } from './child-output.js';
import { calloutOutlets, type Outlet } from './outlet.js';
import { ProcessGroup } from './process-group.js';
import { jsonLineFormat, StderrLines, textLineFormat } from './stderr-lines.js';

/** Options of a `CalloutProcess`. Durations are in milliseconds; defaults from `DEFAULTS`. */
export interface CalloutProcessOptions {
  /** Program to run, without a shell: a path or a name looked up in $PATH (e.g. `/bin/cat`, `jq`). */
  file: string;
  /** Extra arguments. */
  args?: string[] | undefined;
  /** Exported to the callout as KPNG_NODE_NAME. */
  nodeName: string;
  /** Base environment of the callout (default process.env); KPNG_CALLOUT_RUN and KPNG_NODE_NAME are added. */
  env?: NodeJS.ProcessEnv | undefined;
  /** Per-run timeout; 0 disables it. */
  timeoutMs?: number | undefined;
  /** SIGTERM -> SIGKILL grace for a run's process group. */
  killGraceMs?: number | undefined;
  /** Where the callout's stdout goes, unchanged (default process.stdout). */
  stdout?: NodeJS.WritableStream | undefined;
  /** Where the callout's stderr goes, line by line in `stderrFormat` (default process.stderr). */
  stderr?: NodeJS.WritableStream | undefined;
  /**
   * How each line of the callout's stderr is written: `text` (default) as
   * `[run N] line`, `json` as one object per line,
   * `{"time":"…","level":"info","run":N,"stream":"stderr","msg":"line"}` (for
   * `--log-format json`: every line on our stderr is then JSON).
   */
  stderrFormat?: 'text' | 'json' | undefined;
  /** Our own log lines (default: silent). */
  logger?: Logger | undefined;
  /** Millisecond clock for durations and stderr JSON times (default Date.now). */
  now?: (() => number) | undefined;
  /**
   * `--changes`: a run whose request names the state last applied gets the
   * change set from it (changes.ts), and every run gets KPNG_CALLOUT_INPUT
   * (`full` or `changes`). Off: always the full state, no such variable.
   */
  changes?: boolean | undefined;
  /**
   * After the callout exited, how long its pipes may stay quiet before we stop
   * reading them (a background grandchild may hold them open). Default 200.
   */
  pipeDrainMs?: number | undefined;
}

const PIPE_DRAIN_MS = 200;

/** How a child ended: its exit, or (without a pid) why it did not start. */
type Exit = { code: number | null; signal: NodeJS.Signals | null } | { error: NodeJS.ErrnoException };

/** Who ended a run: its timeout, our stop (SIGTERM first) or our kill. */
type Ender = 'timeout' | 'stop' | 'kill';

/** A run that is over before it began (spawn error). */
function settled(run: number, done: Promise<RunResult>): InFlight {
  return { run, done, terminate() {}, kill() {} };
}

/** Runs the callout as one process (group) per run. */
export class CalloutProcess implements Callout {
  private readonly file: string;
  private readonly args: string[];
  private readonly nodeName: string;
  /** The callout's base environment, copied once (see calloutBaseEnv). */
  private readonly baseEnv: NodeJS.ProcessEnv;
  private readonly timeoutMs: number;
  private readonly killGraceMs: number;
  private readonly pipeDrainMs: number;
  private readonly outStream: NodeJS.WritableStream;
  private readonly errStream: NodeJS.WritableStream;
  private readonly stderrFormat: 'text' | 'json';
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly changes: boolean;
  /** Our stdout and stderr as outlets, made at the first run (their listeners stay for our life). */
  private outlets: { out: Outlet; err: Outlet } | undefined;

  constructor(options: CalloutProcessOptions) {
    this.file = options.file;
    this.args = options.args ?? [];
    this.nodeName = options.nodeName;
    this.baseEnv = calloutBaseEnv(options.env ?? process.env);
    this.timeoutMs = Math.max(0, options.timeoutMs ?? DEFAULTS.timeoutMs);
    this.killGraceMs = Math.max(0, options.killGraceMs ?? DEFAULTS.killGraceMs);
    this.pipeDrainMs = Math.max(1, options.pipeDrainMs ?? PIPE_DRAIN_MS);
    this.outStream = options.stdout ?? process.stdout;
    this.errStream = options.stderr ?? process.stderr;
    this.stderrFormat = options.stderrFormat ?? 'text';
    this.log = options.logger ?? silentLogger;
    this.now = options.now ?? Date.now;
    this.changes = options.changes ?? false;
  }

  /** Spawns the callout with `state` on its stdin. */
  start({ run, state, previous }: RunRequest): InFlight {
    const started = this.now();
    const input = inputFor(state, this.changes ? previous : undefined);
    const env: NodeJS.ProcessEnv = { ...this.baseEnv, KPNG_CALLOUT_RUN: String(run), KPNG_NODE_NAME: this.nodeName, ...(this.changes ? { KPNG_CALLOUT_INPUT: input.kind } : {}) };
    const spawnFailed = (err: NodeJS.ErrnoException): RunResult => {
      const r: RunResult = { run, result: 'spawn-error', durationMs: Math.max(0, this.now() - started), message: spawnErrorMessage(this.file, err, env) };
      if (err.code) r.errorCode = err.code;
      return r;
    };

    let child: ChildProcess;
    try {
      // detached: setsid(), so the callout leads its own process group and a
      // kill of -pid reaches everything it started.
      child = spawn(this.file, this.args, { detached: true, env, stdio: ['pipe', 'pipe', 'pipe'] });
    } catch (err) {
      // Invalid arguments and unusual errnos throw synchronously.
      return settled(run, Promise.resolve(spawnFailed(err as NodeJS.ErrnoException)));
    }
    const pgid = child.pid;
    const exit = new Promise<Exit>((resolve) => {
      child.on('error', (err: NodeJS.ErrnoException) => {
        // Without a pid the spawn failed (ENOENT, EACCES...); later errors are informational.
        if (pgid === undefined) resolve({ error: err });
        else this.log.debug(`callout process error: ${err.message}`, { run });
      });
      child.once('exit', (code, signal) => resolve({ code, signal }));
    });
    if (pgid === undefined) {
      const noPid = Object.assign(new Error('no pid'), { code: 'EUNKNOWN' });
      return settled(run, exit.then((o) => spawnFailed('error' in o ? o.error : noPid)));
    }
    return this.supervise(run, state, input, child, pgid, exit, started);
  }

  /** A process per run leaves nothing behind its runs. */
  close(): Promise<void> {
    return Promise.resolve();
  }

  /** Feeds, watches and ends one spawned callout. */
  private supervise(run: number, state: State, input: Input, child: ChildProcess, pgid: number, exit: Promise<Exit>, started: number): InFlight {
    const fields = { run };
    const group = new ProcessGroup(pgid, { killGraceMs: this.killGraceMs, logger: this.log, name: `callout run ${run}`, fields });
    let endedBy: Ender | undefined;
    const terminate = (why: Ender): void => {
      endedBy ??= why;
      group.terminate();
    };
    const kill = (): void => {
      endedBy ??= 'kill';
      group.kill();
    };

    const written = this.writeInput(child.stdin!, input, run);
    const outlets = this.getOutlets();
    const lines = new StderrLines(this.stderrFormat === 'json' ? jsonLineFormat(run, this.now) : textLineFormat(run));
    const output = new ChildOutput(child, { ...outlets, stderrLines: lines, pipeDrainMs: this.pipeDrainMs, logger: this.log, fields });

    let exited = false;
    const timer =
      this.timeoutMs > 0
        ? setTimeout(() => {
            if (exited) return;
            this.log.debug(`callout run ${run} timed out: SIGTERM its group`, { run, timeoutMs: this.timeoutMs });
            terminate('timeout');
          }, this.timeoutMs)
        : undefined;

    const done = (async (): Promise<RunResult> => {
      const o = await exit;
      exited = true;
      output.noteExit();
      clearTimeout(timer);
      const endedAtExit = endedBy;
      try {
        // We ended it: make sure the rest of its group goes too.
        if (endedBy !== undefined) await group.waitGone();
        await output.drain(() => endedBy !== undefined);
        child.stdin!.destroy();
        // Whatever is still alive in the group was started by the callout and
        // left behind: it must not outlive the run (nor overlap the next one).
        const left = group.members();
        const leftover = endedAtExit === undefined && left.length > 0 ? left : undefined;
        if (leftover) {
          this.log.warn(`callout run ${run} exited but left processes running (pids ${left.join(', ')}): terminating them; a callout must not leave background processes behind`, {
            run,
            pids: left.join(','),
            input: state.origin,
          });
        }
        if (left.length > 0) await group.clear();
        return this.result(run, 'error' in o ? undefined : o, endedBy, lines.tail(), leftover, Math.max(0, this.now() - started));
      } finally {
        group.release();
      }
    })();

    return { run, done, written, terminate: () => terminate('stop'), kill };
  }

  /** Writes the input's Buffers (cached lines), corked so that they go out as one writev; resolves once stdin is done with. */
  private writeInput(stdin: Writable, input: Input, run: number): Promise<void> {
    // A callout that does not read its stdin (e.g. `true`) gives EPIPE: fine.
    stdin.on('error', (err: NodeJS.ErrnoException) => {
      if (readerGone(err)) {
        this.log.debug('callout did not read all of its input', { run, code: err.code });
      } else this.log.warn(`writing to the callout's stdin: ${err.message}`, { run });
    });
    stdin.cork();
    for (const chunk of input.chunks) stdin.write(chunk);
    stdin.uncork();
    stdin.end();
    return new Promise((resolve) => finished(stdin, () => resolve()));
  }

  /** The outcome of a run whose callout exited (`status`) and whose group is gone. */
  private result(
    run: number,
    status: { code: number | null; signal: NodeJS.Signals | null } | undefined,
    endedBy: Ender | undefined,
    stderrTail: string | undefined,
    leftoverPids: number[] | undefined,
    durationMs: number,
  ): RunResult {
    const r: RunResult = { run, result: 'ok', durationMs };
    if (status?.code != null) r.exitCode = status.code;
    if (status?.signal != null) r.signal = status.signal;
    if (endedBy === 'timeout') r.result = 'timeout';
    else if (status?.signal != null) r.result = 'signal';
    else if (status?.code !== 0) r.result = 'failed';
    if (stderrTail !== undefined) r.stderrTail = stderrTail;
    if (leftoverPids) r.leftoverPids = leftoverPids;
    const stopped = endedBy === 'stop' || endedBy === 'kill';
    if (stopped) r.stopped = true;
    if (r.result === 'ok') return r;
    if (stopped) r.message = `callout run ${run} stopped (${r.signal ?? `exit status ${r.exitCode}`})`;
    else if (r.result === 'timeout') r.message = `callout run ${run} timed out after ${this.timeoutMs}ms; its process group was killed`;
    else if (r.result === 'signal') r.message = `callout run ${run} killed by ${r.signal}`;
    else r.message = `callout run ${run} failed: exit status ${r.exitCode}`;
    return r;
  }

  /** Our stdout and stderr as outlets (created once: their listeners must not pile up per run). */
  private getOutlets(): { out: Outlet; err: Outlet } {
    return (this.outlets ??= calloutOutlets(this.outStream, this.errStream, this.log));
  }
}
