/**
 * The process around the CLI, in-process: a `CliIO` whose stdout and stderr
 * are collecting streams and whose `proc` is a small stand-in (an
 * EventEmitter with `exit`, `exitCode` and `stdin`), so that `main`,
 * `buildProgram` and `runPipeline` run inside the test process; and the
 * validated common options a command hands to its source and the pipeline.
 * The bins as real processes are bin-process.ts's.
 */
import { EventEmitter, once } from 'node:events';
import { Readable, Writable } from 'node:stream';
import { silentLogger } from '../../src/log.js';
import type { CliIO, CommonOptions } from '../../src/pipeline.js';
import { within } from './wait.js';

/** A writable stream that keeps what is written to it. */
export interface Collector extends Writable {
  /** Everything written so far, as UTF-8. */
  text(): string;
  /** The complete lines written so far, without their `\n`. */
  lines(): string[];
  /** Resolves once the text written so far matches `re`. */
  waitFor(re: RegExp): Promise<string>;
}

/**
 * A collecting stream; `fail` makes every write fail with that errno code
 * (`EPIPE`: the reader of our stdout went away).
 */
export function collector(fail?: string): Collector {
  const chunks: Buffer[] = [];
  const ee = new EventEmitter();
  const w = new Writable({
    write(chunk: Buffer, _enc, cb) {
      if (fail !== undefined) return cb(Object.assign(new Error(`write ${fail}`), { code: fail }));
      chunks.push(chunk);
      ee.emit('data');
      cb();
    },
  }) as Collector;
  w.text = () => Buffer.concat(chunks).toString('utf8');
  w.lines = () => w.text().split('\n').slice(0, -1);
  w.waitFor = async (re) => {
    while (!re.test(w.text())) await within(once(ee, 'data'), () => `waiting for ${re} in ${JSON.stringify(w.text())}`);
    return w.text();
  };
  return w;
}

/** The stand-in for `process`: signals are emitted on it by the test; `exit` is recorded. */
export interface FakeProc extends EventEmitter {
  stdin: Readable;
  exitCode: number | undefined;
  /** Codes passed to `exit`, in order. */
  readonly exits: number[];
  /** Resolves with the first code passed to `exit`. */
  readonly exited: Promise<number>;
  exit(code: number): void;
}

/** A process stand-in whose stdin yields `stdin` (default: nothing). */
function fakeProc(stdin: string = ''): FakeProc {
  const proc = new EventEmitter() as FakeProc;
  const exits: number[] = [];
  let resolveExit: (code: number) => void = () => {};
  const exited = new Promise<number>((r) => (resolveExit = r));
  Object.assign(proc, {
    stdin: Readable.from([Buffer.from(stdin)]),
    exitCode: undefined,
    exits,
    exited,
    exit(code: number) {
      exits.push(code);
      resolveExit(code);
    },
  });
  return proc;
}

/** A `CliIO` and its parts, typed as the test uses them. */
export interface FakeIO {
  io: CliIO;
  stdout: Collector;
  stderr: Collector;
  proc: FakeProc;
}

/** What `fakeIO` builds from. */
export interface FakeIOOptions {
  /** The arguments after the program name (argv[2] on). */
  args?: string[] | undefined;
  /** The program name in argv[1] (default kpng-callout). */
  tool?: string | undefined;
  /** The whole environment (default: PATH only). */
  env?: NodeJS.ProcessEnv | undefined;
  /** What `proc.stdin` yields. */
  stdin?: string | undefined;
  /** Our stdout (default a collector). */
  stdout?: Collector | undefined;
}

/** A `CliIO` over collectors and a process stand-in. */
export function fakeIO(o: FakeIOOptions = {}): FakeIO {
  const stdout = o.stdout ?? collector();
  const stderr = collector();
  const proc = fakeProc(o.stdin);
  const io: CliIO = {
    argv: ['node', o.tool ?? 'kpng-callout', ...(o.args ?? [])],
    env: o.env ?? { PATH: process.env.PATH },
    stdout: stdout as unknown as NodeJS.WriteStream,
    stderr: stderr as unknown as NodeJS.WriteStream,
    proc: proc as unknown as NodeJS.Process,
  };
  return { io, stdout, stderr, proc };
}

/** Validated common options (node `node-a`, text logs, no --once, no servers), with `overrides`. */
export function commonOptions(overrides: Partial<CommonOptions> = {}): CommonOptions {
  return { nodeName: 'node-a', once: false, onceTimeoutMs: 0, verbosity: 0, logFormat: 'text', logger: silentLogger, changes: false, ...overrides };
}
