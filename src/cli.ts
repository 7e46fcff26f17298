/**
 * Entry point of `kpng-callout` and `kpng-json`: parses the command line
 * (src/program.ts), runs the pipeline (src/pipeline.ts) and maps outcomes to
 * exit codes. The only module that exits.
 */
import { CommanderError } from 'commander';
import { CalloutError, readerGone } from './errors.js';
import type { CliIO, Tool } from './pipeline.js';
import { buildProgram, type ErrorOutput } from './program.js';
// Handled here before the pipeline runs and while our output drains at the end.
import { STOP_SIGNALS } from './signals.js';

export type { CliIO, Tool } from './pipeline.js';

/**
 * The log format asked for on the command line, read before commander runs,
 * so that even an error about the command line itself comes as a JSON line
 * when `--log-format json` was given.
 */
function logFormatOf(argv: readonly string[]): 'text' | 'json' {
  let format: 'text' | 'json' = 'text';
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--') break;
    const v = a === '--log-format' ? argv[i + 1] : a.startsWith('--log-format=') ? a.slice('--log-format='.length) : undefined;
    if (v === 'json' || v === 'text') format = v;
  }
  return format;
}

/** Fatal messages and hints on stderr: `tool: message`, or one JSON object per line. */
function errorOutput(tool: Tool, format: 'text' | 'json', stderr: NodeJS.WritableStream): ErrorOutput & { warn(message: string): void } {
  const json = (level: string, msg: string): void => void stderr.write(JSON.stringify({ time: new Date().toISOString(), level, msg }) + '\n');
  return format === 'json'
    ? {
        error: (m) => json('error', m),
        hint: (m) => json('info', m),
        warn: (m) => json('warn', m),
      }
    : {
        error: (m) => void stderr.write(`${tool}: ${m}\n`),
        hint: (m) => void stderr.write(`${m}\n`),
        warn: (m) => void stderr.write(`${tool}: warning: ${m}\n`),
      };
}

/**
 * Node's process warnings, through our output: grpc-js sets the TLS server
 * name to the target even when it is an IP address (`--api 127.0.0.1:12090
 * --tls-ca ...`), and Node warns about that (DEP0123) on every start; nothing
 * the user can act on, so that one is dropped. Others are printed in our
 * format (a JSON line with --log-format json).
 */
function routeWarnings(io: CliIO, out: { warn(message: string): void }): void {
  io.proc.removeAllListeners('warning');
  io.proc.on('warning', (w: Error & { code?: string }) => {
    if (w.code === 'DEP0123') return;
    out.warn(`${w.name}${w.code ? ` ${w.code}` : ''}: ${w.message}`);
  });
}

/** After a stop signal, how long the last output may take to drain (a reader that stalls must not hold us). */
const STOPPED_DRAIN_MS = 1000;

/** Entry point of both bins. */
export async function main(tool: Tool, io: CliIO = { argv: process.argv, env: process.env, stdout: process.stdout, stderr: process.stderr, proc: process }): Promise<void> {
  // A log line that cannot be written (stderr's reader gone, a full disk) is dropped: it must not crash us or lose the output.
  io.stderr.on('error', () => {});
  const out = errorOutput(tool, logFormatOf(io.argv.slice(2)), io.stderr);
  routeWarnings(io, out);
  // Installed for our whole life, so that no stop signal is ever lost or fatal: the pipeline handles
  // them while it runs (its handler is removed only as it returns); before it (start-up) a signal
  // stops us at once; after it, it ends the final drain.
  let signalled = false;
  let exit: (() => void) | undefined;
  const onStop = (sig: NodeJS.Signals): void => {
    signalled = true;
    if (exit) return exit();
    if (io.proc.listenerCount(sig) <= 1) io.proc.exit(0);
  };
  for (const s of STOP_SIGNALS) io.proc.on(s, onStop);
  let pipeline: Promise<number> | undefined;
  // The command whose --help tells about a usage error's option.
  let helpOf: string = tool;
  const program = buildProgram(
    tool,
    io,
    out,
    (p) => (pipeline = p),
    (command) => (helpOf = `${tool} ${command}`),
  );
  let code: number;
  try {
    await program.parseAsync(io.argv);
    code = pipeline ? await pipeline : 0;
  } catch (err) {
    if (err instanceof CommanderError) {
      // Help and version exit 0; every usage error exits 2 (commander already said why).
      code = err.exitCode === 0 ? 0 : 2;
    } else if (err instanceof CalloutError) {
      out.error(err.message);
      if (err.code === 'usage') out.hint(`(run ${err.rootHelp ? tool : helpOf} --help for usage)`);
      code = err.exitCode ?? (err.code === 'usage' ? 2 : 1);
    } else {
      out.error(`internal error: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
      code = 70;
    }
  }
  // Output that could not be written (a full disk) is a failure, unlike a reader that went away (EPIPE).
  const failed = (): void => {
    const err = (io.stdout as { errored?: NodeJS.ErrnoException | null }).errored;
    if (!err || code !== 0 || readerGone(err)) return;
    out.error(`stdout: ${err.message}`);
    code = 1;
  };
  exit = () => {
    failed();
    io.proc.exit(code);
  };
  // Let stdout drain (it may be a pipe) before exiting; a closed one cannot. Stopped: not for long.
  if (io.stdout.writableEnded || io.stdout.destroyed) return exit();
  if (signalled) setTimeout(exit, STOPPED_DRAIN_MS).unref();
  io.stdout.write('', exit);
}
