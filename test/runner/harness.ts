/**
 * Test parts for the runner's tests: a manual clock, a fake `Callout` the
 * tests end by hand, a Scheduler on both (makeScheduler), a recorder of
 * runner events, a CalloutProcess writing to Sinks (makeCallout), a Writable
 * that records what a callout printed, Writables that hold their writes or fail like a
 * broken pipe, states from text lines, and callout scripts whose
 * pids are killed at the end whatever happens.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import type { Callout, InFlight, RunRequest, RunResult } from '../../src/runner/callout.js';
import { CalloutProcess, type CalloutProcessOptions } from '../../src/runner/callout-process.js';
import { Scheduler, type RunnerEvent, type SchedulerOptions, type Timers } from '../../src/runner/scheduler.js';
import { stateText, type State } from '../../src/state.js';
import { shScript, tempDir, type Owner } from '../helpers/files.js';
import { captureLog } from '../helpers/sink.js';

/** A state of one line per text. */
export function st(...texts: string[]): State {
  const lines = texts.map((s) => Buffer.from(s + '\n'));
  return { lines, services: lines.length, endpoints: 0, bytes: lines.reduce((n, l) => n + l.length, 0) };
}

/** A manual clock: timers fire only from advance(). */
export class FakeClock {
  t = 0;
  private seq = 0;
  private readonly q = new Map<number, { due: number; fn: () => void }>();
  readonly now = (): number => this.t;
  readonly timers: Timers = {
    setTimeout: (fn, ms) => {
      const id = ++this.seq;
      this.q.set(id, { due: this.t + ms, fn });
      return id;
    },
    clearTimeout: (h) => void this.q.delete(h as number),
  };
  /** Moves time on by `ms`, firing the timers that fall due, in order. */
  advance(ms: number): void {
    const end = this.t + ms;
    for (;;) {
      let next: [number, { due: number; fn: () => void }] | undefined;
      for (const e of this.q) if (e[1].due <= end && (!next || e[1].due < next[1].due)) next = e;
      if (!next) break;
      this.q.delete(next[0]);
      this.t = next[1].due;
      next[1].fn();
    }
    this.t = end;
  }
}

/** How a fake run ends (run and defaults filled in). */
export type Outcome = Partial<RunResult>;

/** Outcomes the tests use most. */
export const ok: Outcome = {};
export function failed(exitCode: number, stderrTail?: string): Outcome {
  const o: Outcome = { result: 'failed', exitCode, message: 'callout failed' };
  if (stderrTail !== undefined) o.stderrTail = stderrTail;
  return o;
}

/**
 * A `Callout` without processes. Each run ends when the test calls `finish`,
 * or at once (next microtask) with what `auto` returns for it. `terminate`
 * and `kill` end the run as a stopped one (SIGTERM, SIGKILL); every call is
 * recorded in `calls`.
 */
export class FakeCallout implements Callout {
  readonly requests: RunRequest[] = [];
  readonly calls: string[] = [];
  private readonly open = new Map<number, (r: RunResult) => void>();
  private readonly waiters: Array<{ n: number; resolve: () => void }> = [];
  private readonly lostListeners: Array<(why: string) => void> = [];

  constructor(private readonly auto?: (req: RunRequest) => Outcome | undefined) {}

  lost(listener: (why: string) => void): void {
    this.lostListeners.push(listener);
  }

  /** The callout went away between runs (as a persistent callout tells it). */
  tellLost(why: string): void {
    for (const f of this.lostListeners) f(why);
  }

  start(req: RunRequest): InFlight {
    this.requests.push(req);
    const done = new Promise<RunResult>((resolve) => this.open.set(req.run, resolve));
    const outcome = this.auto?.(req);
    if (outcome) queueMicrotask(() => this.finish(req.run, outcome));
    for (const w of this.waiters.splice(0)) if (this.requests.length >= w.n) w.resolve();
    else this.waiters.push(w);
    return {
      run: req.run,
      done,
      terminate: () => {
        this.calls.push(`terminate ${req.run}`);
        this.finish(req.run, { result: 'signal', signal: 'SIGTERM', stopped: true, message: `callout run ${req.run} stopped (SIGTERM)` });
      },
      kill: () => {
        this.calls.push(`kill ${req.run}`);
        this.finish(req.run, { result: 'signal', signal: 'SIGKILL', stopped: true, message: `callout run ${req.run} stopped (SIGKILL)` });
      },
    };
  }

  close(how: 'graceful' | 'kill'): Promise<void> {
    this.calls.push(`close ${how}`);
    return Promise.resolve();
  }

  /** Ends run `run` (once; later calls do nothing). */
  finish(run: number, outcome: Outcome = ok): void {
    const resolve = this.open.get(run);
    this.open.delete(run);
    resolve?.({ run, result: 'ok', durationMs: 0, ...outcome });
  }

  /** True while run `run` has not ended. */
  running(run: number): boolean {
    return this.open.has(run);
  }

  /** The texts of the states each run got, in order. */
  inputs(): string[] {
    return this.requests.map((r) => stateText(r.state));
  }

  /** Resolves once `n` runs were started. */
  started(n: number): Promise<void> {
    if (this.requests.length >= n) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push({ n, resolve }));
  }
}

/** Records runner events; `until` resolves with the first (past or future) event matching. */
export class Events {
  readonly list: RunnerEvent[] = [];
  private waiters: Array<{ pred: (e: RunnerEvent) => boolean; resolve: (e: RunnerEvent) => void }> = [];
  readonly on = (e: RunnerEvent): void => {
    this.list.push(e);
    this.waiters = this.waiters.filter((w) => (w.pred(e) ? (w.resolve(e), false) : true));
  };
  until<T extends RunnerEvent['type']>(type: T, pred: (e: Extract<RunnerEvent, { type: T }>) => boolean = () => true): Promise<Extract<RunnerEvent, { type: T }>> {
    const p = (e: RunnerEvent): boolean => e.type === type && pred(e as Extract<RunnerEvent, { type: T }>);
    const found = this.list.find(p);
    if (found) return Promise.resolve(found as Extract<RunnerEvent, { type: T }>);
    return new Promise((resolve) => this.waiters.push({ pred: p, resolve: resolve as (e: RunnerEvent) => void }));
  }
  of<T extends RunnerEvent['type']>(type: T): Array<Extract<RunnerEvent, { type: T }>> {
    return this.list.filter((e) => e.type === type) as Array<Extract<RunnerEvent, { type: T }>>;
  }
}

/** A Writable that records everything and lets a test wait for some text. */
export class Sink extends Writable {
  private chunks: Buffer[] = [];
  private waiters: Array<{ text: string; resolve: () => void }> = [];
  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    this.chunks.push(Buffer.from(chunk));
    const s = this.text();
    this.waiters = this.waiters.filter((w) => (s.includes(w.text) ? (w.resolve(), false) : true));
    cb();
  }
  buffer(): Buffer {
    return Buffer.concat(this.chunks);
  }
  text(): string {
    return this.buffer().toString('utf8');
  }
  waitFor(text: string): Promise<void> {
    if (this.text().includes(text)) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push({ text, resolve }));
  }
}

/**
 * A Writable whose writes complete only when the test says so: `complete`
 * finishes every pending write, `fail` fails the oldest with `err`; `got`
 * holds what was written.
 */
export function slowStream(highWaterMark = 4) {
  const pending: Array<(err?: Error | null) => void> = [];
  const got: string[] = [];
  const stream = new Writable({
    highWaterMark,
    write(chunk: Buffer, _enc, cb) {
      got.push(chunk.toString());
      pending.push(cb);
    },
  });
  return { stream, got, complete: () => pending.splice(0).forEach((cb) => cb()), fail: (err: Error) => pending.shift()?.(err) };
}

/** A destination that fails like a pipe whose reader went away, after `limit` bytes. */
export class BrokenPipe extends Writable {
  got = 0;
  constructor(private readonly limit: number) {
    super({ highWaterMark: 1024 });
  }
  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    this.got += chunk.length;
    if (this.got > this.limit) cb(Object.assign(new Error('write EPIPE'), { code: 'EPIPE', errno: -32, syscall: 'write' }));
    else setImmediate(cb); // slow enough to exert backpressure
  }
}

/**
 * Callout scripts for one test file, and the pids they report: every pid read
 * through `pid` is SIGKILLed when `owner` tears down, and `orphans` lists
 * those still alive.
 */
export class Scripts {
  private readonly pids = new Set<number>();
  constructor(private readonly owner: Owner) {
    owner.teardown(() => {
      for (const pid of this.pids) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          /* gone */
        }
      }
    });
  }

  /** An executable sh script; `$DIR` in it is a fresh directory of its own. */
  script(body: string): { file: string; dir: string } {
    const dir = tempDir(this.owner, 'runner-callout-');
    return { file: shScript(dir, 'callout.sh', `DIR='${dir}'\n${body}\n`), dir };
  }

  /**
   * A callout that starts a long-running grandchild in its process group, saves
   * both pids (see `groupPids`), prints `ready` and waits; with `ignoreTerm` it
   * ignores SIGTERM (the second `wait` resumes the one the signal interrupts).
   */
  groupScript(ignoreTerm: boolean): { file: string; dir: string } {
    return this.script(`${ignoreTerm ? "trap '' TERM\n" : ''}sleep 1000 &
echo $! > "$DIR/gpid"
echo $$ > "$DIR/pid"
echo ready
wait${ignoreTerm ? '\nwait' : ''}`);
  }

  /** The pids a groupScript callout saved: its own and its grandchild's. */
  groupPids(s: { dir: string }): { pid: number; gpid: number } {
    return { pid: this.pid(join(s.dir, 'pid')), gpid: this.pid(join(s.dir, 'gpid')) };
  }

  /** The pid a script wrote to `file`, remembered for the teardown. */
  pid(file: string): number {
    return this.track(Number(readFileSync(file, 'utf8').trim()));
  }

  /** Remembers `pid` for the teardown. */
  track(pid: number): number {
    this.pids.add(pid);
    return pid;
  }

  /** Every pid seen so far. */
  all(): number[] {
    return [...this.pids];
  }
}

/**
 * A Scheduler on a FakeClock with a FakeCallout (`auto`: how it ends each run
 * by itself, else by hand), no debounce or max-wait unless given, events
 * recorded, its log captured, a fixed jitter.
 */
export function makeScheduler(extra: Partial<SchedulerOptions> & { auto?: (req: RunRequest) => Outcome | undefined } = {}) {
  const clock = new FakeClock();
  const ev = new Events();
  const log = captureLog();
  const { auto, ...rest } = extra;
  const callout = new FakeCallout(auto);
  const s = new Scheduler({
    callout,
    debounceMs: 0,
    maxWaitMs: 0,
    now: clock.now,
    timers: clock.timers,
    logger: log.logger,
    onEvent: ev.on,
    random: () => 0.5,
    ...rest,
  });
  return { s, clock, ev, log, callout };
}

/**
 * A CalloutProcess running `file` for node-a (timeout 10 s unless given),
 * its stdout and stderr into Sinks, its log captured; start() and run()
 * number the runs.
 */
export function makeCallout(extra: Partial<CalloutProcessOptions> & { file: string }) {
  const out = new Sink();
  const err = new Sink();
  const log = captureLog();
  const callout = new CalloutProcess({ timeoutMs: 10_000, nodeName: 'node-a', stdout: out, stderr: err, logger: log.logger, ...extra });
  let runs = 0;
  const start = (state: State) => callout.start({ run: ++runs, state, reason: 'now' });
  const run = (state: State): Promise<RunResult> => start(state).done;
  return { callout, start, run, out, err, log };
}
