/**
 * A persistent callout (`--persistent`): the `Callout` that starts the program
 * once and keeps it running, writing each state to its stdin as a frame and
 * reading the result of each frame from its file descriptor 3.
 *
 * The protocol (README "Persistent callouts"):
 * - a frame is a header line `{"Frame":{"Seq":N,"Input":"full"}}` (or
 *   `"changes"`), the state's lines (or the change set's), then one empty
 *   line; `Seq` counts frames from 1 for the life of our process;
 * - the callout acknowledges each frame, in order, with one line on fd 3:
 *   `ok`, or `error` optionally followed by a space and a message; anything
 *   else counts as `error` (and is logged); an ack with no frame waiting is
 *   logged and ignored, and puts the callout in doubt: the next frame is
 *   full, and after an `error` (or anything not `ok`) the newest state is
 *   sent again (`lost`), since that may have been the last frame's real ack;
 * - the first frame to a (re)started process is full, whatever `--changes`.
 *
 * A frame not acknowledged within the timeout (from its first byte), or a
 * callout that exits or closes fd 3 (and has not exited within
 * FD3_EXIT_WAIT_MS: a program closes its descriptors as it exits, and its
 * exit status is the better report), fails the frame's run: its process
 * group is ended (SIGTERM, SIGKILL after the grace) and the next run starts
 * a new process, fed a full frame (the scheduler retries with its backoff).
 * When the callout goes away (exits, or closes fd 3) between frames, `lost`
 * listeners are told, so that the newest state is sent again (to a new
 * process, as a full frame).
 * Its stderr lines are written as `[frame N] line` (N the Seq of the newest
 * frame written), stdout unchanged. When the program file changed since it
 * was started, the next frame first retires it (EOF) and starts the new one.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import { inputFor } from '../changes.js';
import { DEFAULTS } from '../defaults.js';
import { silentLogger, type Logger } from '../log.js';
import { calloutEnv, type Callout, type InFlight, type RunRequest, type RunResult } from './callout.js';
import { programStamp, spawnErrorMessage } from './callout-check.js';
import type { CalloutProcessOptions } from './callout-process.js';
import { ChildOutput } from './child-output.js';
import { calloutOutlets, type Outlet } from './outlet.js';
import { ProcessGroup } from './process-group.js';
import { jsonLineFormat, StderrLines, textLineFormat } from './stderr-lines.js';

/** Options of a `PersistentCallout`: those of a process per run (`changes` included). */
export type PersistentCalloutOptions = CalloutProcessOptions;

const PIPE_DRAIN_MS = 200;
/** An ack line longer than this is cut (a callout writing garbage to fd 3). */
const MAX_ACK_BYTES = 4096;
/** After fd 3 closes, how long the callout may take to exit before it counts as having closed fd 3. */
const FD3_EXIT_WAIT_MS = 250;

/** How a frame ended, before it becomes a RunResult. */
type FrameEnd = { ack: 'ok' } | { ack: 'error'; message: string } | { gone: 'exit' | 'fd3' | 'stdin' | 'timeout' | 'stop' | 'kill' };

/** The running program. */
interface Live {
  child: ChildProcess;
  group: ProcessGroup;
  output: ChildOutput;
  lines: StderrLines;
  /** Resolves when it has exited (status), pipes drained and group cleared. */
  gone: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  exited: boolean;
  /** No frame acknowledged `ok` yet: the next frame is full. */
  fresh: boolean;
  /** The frame waiting for its ack. */
  waiting: ((end: FrameEnd) => void) | undefined;
  /** We are ending it (our close, a timeout, a failed frame). */
  ending: boolean;
  /** The program file as it was when started (see `programStamp`). */
  program: string | undefined;
  /** A frame waits for its successor: its going away is not told as lost (the frame hands the newest state over). */
  replaced: boolean;
}

/** Runs one long-lived callout process; see the module comment. */
export class PersistentCallout implements Callout {
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly timeoutMs: number;
  private readonly killGraceMs: number;
  private readonly changes: boolean;
  private live: Live | undefined;
  private seq = 0;
  private outlets: { out: Outlet; err: Outlet } | undefined;
  private readonly lostListeners: Array<(why: string) => void> = [];
  private closing = false;

  constructor(private readonly options: PersistentCalloutOptions) {
    this.log = options.logger ?? silentLogger;
    this.now = options.now ?? Date.now;
    this.timeoutMs = Math.max(0, options.timeoutMs ?? DEFAULTS.timeoutMs);
    this.killGraceMs = Math.max(0, options.killGraceMs ?? DEFAULTS.killGraceMs);
    this.changes = options.changes ?? false;
  }

  /** Told when the callout goes away between frames (it must be fed the newest state again). */
  lost(listener: (why: string) => void): void {
    this.lostListeners.push(listener);
  }

  start(request: RunRequest): InFlight {
    const live = this.live;
    // Exited, or being ended, and not yet cleared away: the frame goes to its successor (never into a dead pipe).
    if (live && (live.exited || live.ending)) return this.sendAfter(request, live, live.gone);
    // A new version of the program (an edit, a new build under `replay --watch`): the old one is
    // retired first (EOF, as at our stop), and the frame goes to the new one, in full.
    if (live && live.program !== programStamp(this.options.file)) {
      this.log.info('the callout program changed: restarting the persistent callout', { file: this.options.file });
      return this.sendAfter(request, live, this.retire(live));
    }
    return this.send(request);
  }

  /** Sends `request` to a new process once `old` is gone (`going` resolves then); its own going-away is not told as lost. */
  private sendAfter(request: RunRequest, old: Live, going: Promise<unknown>): InFlight {
    old.replaced = true;
    let inner: InFlight | undefined;
    let stopped = false;
    const done = going.then((): RunResult | Promise<RunResult> => {
      if (stopped || this.closing) return { run: request.run, result: 'failed', stopped: true, durationMs: 0, message: `callout run ${request.run} stopped` };
      inner = this.send(request);
      return inner.done;
    });
    return {
      run: request.run,
      done,
      terminate: () => {
        stopped = true;
        if (inner) inner.terminate();
        else old.group.terminate();
      },
      kill: () => {
        stopped = true;
        if (inner) inner.kill();
        else old.group.kill();
      },
    };
  }

  /** Writes the frame of `request` (starting the program first when it is not running) and waits for its ack. */
  private send({ run, state, previous }: RunRequest): InFlight {
    const started = this.now();
    let live = this.live;
    if (!live) {
      const spawned = this.spawn();
      if ('failed' in spawned) {
        const done = spawned.failed.then((err): RunResult => {
          const r: RunResult = { run, result: 'spawn-error', durationMs: Math.max(0, this.now() - started), message: spawnErrorMessage(this.options.file, err, this.env()) };
          if (err.code) r.errorCode = err.code;
          return r;
        });
        return { run, done, terminate() {}, kill() {} };
      }
      live = spawned;
    }
    const l = live;
    const input = inputFor(state, this.changes && !l.fresh ? previous : undefined);
    const seq = ++this.seq;
    let settle!: (end: FrameEnd) => void;
    const ended = new Promise<FrameEnd>((resolve) => (settle = resolve));
    l.waiting = settle;
    const stdin = l.child.stdin!;
    stdin.cork();
    stdin.write(`{"Frame":{"Seq":${seq},"Input":"${input.kind}"}}\n`);
    for (const chunk of input.chunks) stdin.write(chunk);
    stdin.write('\n');
    stdin.uncork();
    // Its stdin failed before (it closed it): a write to it now is dropped without an error.
    if (stdin.destroyed) this.unreachable(l);
    const timer = this.timeoutMs > 0 ? setTimeout(() => l.waiting?.({ gone: 'timeout' }), this.timeoutMs) : undefined;
    const done = (async (): Promise<RunResult> => {
      const end = await ended;
      clearTimeout(timer);
      l.waiting = undefined;
      const durationMs = Math.max(0, this.now() - started);
      if ('ack' in end) {
        if (end.ack === 'ok') return { run, result: 'ok', durationMs };
        return { run, result: 'failed', durationMs, message: `callout frame ${seq} (run ${run}) failed: ${end.message}`, ...tail(l) };
      }
      // Gone (or going): end its group, wait until nothing of it is left.
      if (end.gone === 'kill') l.group.kill();
      else this.end(l);
      const status = await l.gone;
      const r: RunResult = { run, result: 'failed', durationMs: Math.max(0, this.now() - started), ...tail(l) };
      if (status.code !== null) r.exitCode = status.code;
      if (status.signal !== null) r.signal = status.signal;
      const how = status.signal !== null ? `killed by ${status.signal}` : `exit status ${status.code}`;
      if (end.gone === 'stop' || end.gone === 'kill') {
        r.stopped = true;
        r.result = status.signal !== null ? 'signal' : 'failed';
        r.message = `callout frame ${seq} (run ${run}) stopped (${how})`;
      } else if (end.gone === 'timeout') {
        r.result = 'timeout';
        r.message = `callout frame ${seq} (run ${run}) not acknowledged within ${this.timeoutMs}ms: its process group was killed; any next frame goes to a new process`;
      } else {
        // Ended by us for its closed stdin: failed; otherwise its own end tells.
        if (status.signal !== null && end.gone !== 'stdin') r.result = 'signal';
        const what = end.gone === 'fd3' ? `closed fd 3 (${how})` : end.gone === 'stdin' ? 'closed its stdin' : `exited (${how})`;
        r.message = `persistent callout ${what} before acknowledging frame ${seq} (run ${run}); any next frame goes to a new process`;
      }
      return r;
    })();
    return {
      run,
      done,
      terminate: () => l.waiting?.({ gone: 'stop' }),
      kill: () => l.waiting?.({ gone: 'kill' }),
    };
  }

  stopping(): void {
    this.closing = true;
    // EOF now, the frame in flight still waiting for its ack: the callout may answer it, then exit.
    const l = this.live;
    if (l && !l.exited) l.child.stdin!.end();
  }

  async close(how: 'graceful' | 'kill'): Promise<void> {
    this.closing = true;
    const l = this.live;
    if (!l) return;
    if (how === 'graceful') return this.retire(l);
    l.ending = true;
    l.group.kill();
    await l.gone;
  }

  /** EOF: the callout exits by itself within the kill grace, or its group is ended. Resolves once nothing of it is left. */
  private async retire(l: Live): Promise<void> {
    l.ending = true;
    l.child.stdin!.end();
    const t = setTimeout(() => {
      this.log.info('persistent callout still running after its stdin was closed: terminating it');
      l.group.terminate();
    }, this.killGraceMs);
    await l.gone;
    clearTimeout(t);
  }

  /** SIGTERM its group (SIGKILL after the grace), once. */
  private end(l: Live): void {
    if (l.exited && l.ending) return;
    l.ending = true;
    l.group.terminate();
  }

  private env(): NodeJS.ProcessEnv {
    return calloutEnv(this.options.env ?? process.env, { KPNG_CALLOUT_MODE: 'persistent', KPNG_NODE_NAME: this.options.nodeName });
  }

  /** Starts the program; its stdin, stdout, stderr and fd 3 are pipes. */
  private spawn(): Live | { failed: Promise<NodeJS.ErrnoException> } {
    let child: ChildProcess;
    try {
      child = spawn(this.options.file, this.options.args ?? [], { detached: true, env: this.env(), stdio: ['pipe', 'pipe', 'pipe', 'pipe'] });
    } catch (err) {
      // Invalid arguments and unusual errnos throw synchronously.
      return { failed: Promise.resolve(err as NodeJS.ErrnoException) };
    }
    if (child.pid === undefined) {
      // ENOENT, EACCES...: told by the 'error' event that follows.
      const c = child;
      return { failed: new Promise((resolve) => c.once('error', (err: NodeJS.ErrnoException) => resolve(err))) };
    }
    const pgid = child.pid;
    const fields = { pid: pgid };
    const group = new ProcessGroup(pgid, { killGraceMs: this.killGraceMs, logger: this.log, name: 'persistent callout', fields });
    const lines = new StderrLines(this.options.stderrFormat === 'json' ? jsonLineFormat(() => ({ frame: this.seq }), this.now) : textLineFormat(() => `frame ${this.seq}`));
    const output = new ChildOutput(child, { ...this.getOutlets(), stderrLines: lines, pipeDrainMs: this.options.pipeDrainMs ?? PIPE_DRAIN_MS, logger: this.log, fields });
    const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
    child.on('error', (err) => this.log.debug(`persistent callout process error: ${err.message}`, fields));
    const stdin = child.stdin as Writable;
    const l: Live = { child, group, output, lines, exited: false, fresh: true, waiting: undefined, ending: false, gone: exit, program: programStamp(this.options.file), replaced: false };
    stdin.on('error', (err: NodeJS.ErrnoException) => {
      this.log.debug(`writing to the persistent callout: ${err.message}`, { ...fields, code: err.code });
      this.unreachable(l);
    });
    l.gone = (async () => {
      const status = await exit;
      l.exited = true;
      output.noteExit();
      await output.drain(() => l.ending);
      stdin.destroy();
      (child.stdio[3] as Readable | null)?.destroy();
      // Nothing it started may outlive it.
      if (group.members().length > 0) await group.clear();
      group.release();
      if (this.live === l) this.live = undefined;
      return status;
    })();
    this.live = l;
    this.readAcks(l, child.stdio[3] as Readable | null);
    void exit.then((status) => {
      // Exiting on the EOF of our stop, its last frame unanswered: stopped, not failed.
      if (l.waiting) l.waiting({ gone: this.closing ? 'stop' : 'exit' });
      else if (!l.ending && !this.closing) {
        const how = status.signal !== null ? `killed by ${status.signal}` : `exit status ${status.code}`;
        this.log.warn(`persistent callout exited between frames (${how}): restarting it with the newest state`, { ...fields, stderr: tail(l).stderrTail });
        void l.gone.then(() => l.replaced || this.tellLost(`exited (${how})`));
      }
    });
    this.log.info('persistent callout started', { pid: pgid, file: this.options.file });
    return l;
  }

  /**
   * Its stdin is closed while a frame waits for its ack, which can then never
   * come (it waited for --timeout): unless it is exiting (its exit reports
   * it), the frame fails and the callout is ended.
   */
  private unreachable(l: Live): void {
    if (!l.waiting) return;
    const t = setTimeout(() => {
      if (!l.exited && !l.ending && !this.closing) l.waiting?.({ gone: 'stdin' });
    }, FD3_EXIT_WAIT_MS);
    void l.gone.then(() => clearTimeout(t));
  }

  /** Reads ack lines from fd 3; each settles the frame waiting (or is logged when none is). */
  private readAcks(l: Live, fd3: Readable | null): void {
    if (!fd3) return;
    let pending = '';
    fd3.setEncoding('utf8');
    fd3.on('data', (text: string) => {
      pending += text;
      for (let nl = pending.indexOf('\n'); nl >= 0; nl = pending.indexOf('\n')) {
        this.ack(l, pending.slice(0, nl));
        pending = pending.slice(nl + 1);
      }
      if (pending.length > MAX_ACK_BYTES) {
        this.ack(l, pending.slice(0, MAX_ACK_BYTES));
        pending = '';
      }
    });
    fd3.on('error', () => {});
    fd3.on('end', () => {
      // The callout can no longer answer: unless it is exiting (then its exit reports it), end it.
      const t = setTimeout(() => {
        if (l.exited || l.ending) return;
        if (l.waiting) return l.waiting({ gone: 'fd3' });
        if (this.closing) return;
        this.log.warn('persistent callout closed fd 3 between frames: restarting it with the newest state', { pid: l.group.pgid, stderr: tail(l).stderrTail });
        this.end(l);
        void l.gone.then(() => l.replaced || this.tellLost('closed fd 3'));
      }, FD3_EXIT_WAIT_MS);
      void l.gone.then(() => clearTimeout(t));
    });
  }

  private tellLost(why: string): void {
    for (const f of this.lostListeners) f(why);
  }

  private ack(l: Live, raw: string): void {
    const line = raw.endsWith('\r') ? raw.slice(0, -1) : raw;
    const waiting = l.waiting;
    if (!waiting) {
      // Acks and frames no longer pair up for sure: the next frame is full, and an `error` may be the last frame's own.
      l.fresh = true;
      if (line === 'ok') {
        this.log.warn(`persistent callout acknowledged with no frame waiting: ${JSON.stringify(line)} ignored; the next frame is full`, { frame: this.seq });
        return;
      }
      this.log.warn(`persistent callout acknowledged with no frame waiting: ${JSON.stringify(line)}; its last frame counts as failed, the next frame is full`, { frame: this.seq });
      if (!l.ending && !this.closing) this.tellLost(`acknowledged ${JSON.stringify(line.slice(0, 200))} with no frame waiting`);
      return;
    }
    l.waiting = undefined;
    if (line === 'ok') {
      // Here, not when the run ends: a second ack in the same read must put the callout in doubt again.
      l.fresh = false;
      return waiting({ ack: 'ok' });
    }
    if (line === 'error' || line.startsWith('error ')) return waiting({ ack: 'error', message: line.slice(6) || 'error' });
    this.log.warn(`persistent callout wrote ${JSON.stringify(line)} on fd 3 for frame ${this.seq}, not "ok" or "error ...": taken as an error`, { frame: this.seq });
    waiting({ ack: 'error', message: `not an ack: ${JSON.stringify(line)}` });
  }


  private getOutlets(): { out: Outlet; err: Outlet } {
    return (this.outlets ??= calloutOutlets(this.options.stdout ?? process.stdout, this.options.stderr ?? process.stderr, this.log));
  }
}

/** The stderr tail of a result, when there is one. */
function tail(l: Live): { stderrTail?: string } {
  const t = l.lines.tail();
  return t === undefined ? {} : { stderrTail: t };
}
