/**
 * The command line of `kpng-callout` and `kpng-json`: parses and validates
 * options, wires one source to the runner (kpng-callout) or the printer
 * (kpng-json), and maps outcomes to exit codes. The only module that exits.
 */
import { readFileSync, statSync } from 'node:fs';
import { constants as osConstants, hostname } from 'node:os';
import { Command, CommanderError, Option } from 'commander';
import { CalloutError, usageError } from './errors.js';
import { createLogger, type Logger } from './log.js';
import { parseDuration, parseHostPort, parseNonEmpty, parseServiceProxyName, parseSize } from './options.js';
import type { Source, StateSink } from './source.js';
import type { State } from './state.js';
import { Runner, type RunResult } from './runner.js';
import type { Metrics, MetricsServer } from './metrics.js';
import { createKpngSource } from './sources/kpng.js';
import { compileGlobs, splitGlobList } from './convert/glob.js';

/** Which program is running: the callout runner or the JSON printer. */
export type Tool = 'kpng-callout' | 'kpng-json';

/** Process-level dependencies, injectable for tests. */
export interface CliIO {
  argv: string[];
  env: NodeJS.ProcessEnv;
  stdout: NodeJS.WriteStream;
  stderr: NodeJS.WriteStream;
  /** The process, for signal handlers. */
  proc: NodeJS.Process;
}

/** Options every command shares, validated. */
export interface CommonOptions {
  nodeName: string;
  once: boolean;
  logger: Logger;
  /** `--metrics-addr`: serve /metrics, /healthz, /readyz there (src/metrics.ts). */
  metricsAddr?: string;
}

/** Runner options, validated (kpng-callout only). */
interface RunnerFlags {
  callout: string;
  debounceMs: number;
  maxWaitMs: number;
  timeoutMs: number;
  resyncPeriodMs: number;
  retryMinMs: number;
  retryMaxMs: number;
}

/** Exit status for a run's result, as a shell would report it. */
export function exitStatus(r: RunResult): number {
  if (r.result === 'ok' || r.result === 'skipped') return 0;
  if (r.exitCode !== undefined && r.exitCode !== null && r.exitCode > 0) return r.exitCode;
  if (r.result === 'timeout') return 124;
  if (r.signal) return 128 + ((osConstants.signals as Record<string, number>)[r.signal] ?? 0);
  if (r.result === 'spawn-error') return r.errorCode === 'EACCES' ? 126 : 127;
  return 1;
}

function addCommonOptions(cmd: Command, tool: Tool): Command {
  cmd
    .option('--node-name <name>', 'node whose view to request/compute (default: $NODE_NAME, else the hostname)')
    .option('--once', 'wait for the first complete state, ' + (tool === 'kpng-json' ? 'print it and exit' : 'run the callout once and exit with its status'), false)
    .addOption(new Option('--log-format <format>', 'log line format on stderr').choices(['text', 'json']).default('text'))
    .option('-v, --verbose', 'more logs (repeat for more)', (_v: string, prev: number) => prev + 1, 0)
    .option('-q, --quiet', 'only warnings and errors', false)
    .option('--metrics-addr <host:port>', 'serve Prometheus /metrics, /healthz and /readyz on this address (off by default)');
  if (tool === 'kpng-callout') {
    cmd
      .option('--callout <prog>', 'program to run with the state on stdin (default: $CALLOUT, else /bin/cat)')
      .option('--debounce <duration>', 'quiet time after the last change before a run (0 = run at once)', '100ms')
      .option('--max-wait <duration>', 'longest delay from the first pending change to its run', '1s')
      .option('--timeout <duration>', 'per-run time limit: SIGTERM to the callout process group, SIGKILL 5s later', '60s')
      .option('--resync-period <duration>', 're-run the callout with the current state this often, even if unchanged (0 = off)', '0')
      .option('--retry-min <duration>', 'first retry delay after a failed run, doubling (with jitter) at each failure', '1s')
      .option('--retry-max <duration>', 'longest retry delay', '30s');
  }
  return cmd;
}

function addKpngOptions(cmd: Command): Command {
  return cmd
    .option('--api <host:port>', 'kpng controller API address', '127.0.0.1:12090')
    .option('--error-delay <duration>', 'wait before reconnecting after a stream error', '1s')
    .option('--max-msg-size <bytes>', 'largest gRPC message accepted (e.g. 4MiB)', '4MiB')
    .option('--tls-ca <file>', 'CA certificate to verify the server (enables TLS)')
    .option('--tls-crt <file>', 'client certificate for mutual TLS (needs --tls-key)')
    .option('--tls-key <file>', 'client key for mutual TLS (needs --tls-crt)');
}

function readOptFile(option: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? 'error';
    throw new CalloutError('usage', `${option} ${path}: cannot read file (${code})`, { cause: err });
  }
}

function commonFrom(o: Record<string, unknown>, io: CliIO, tool: Tool): CommonOptions {
  const nodeName = o.nodeName !== undefined ? parseNonEmpty('--node-name', String(o.nodeName)) : io.env.NODE_NAME || hostname();
  const verbosity = o.quiet ? -1 : Number(o.verbose ?? 0);
  const logger = createLogger({ name: tool, format: o.logFormat === 'json' ? 'json' : 'text', verbosity, write: (l) => void io.stderr.write(l) });
  const metricsAddr = o.metricsAddr !== undefined ? parseHostPort('--metrics-addr', String(o.metricsAddr), true) : undefined;
  return { nodeName, once: Boolean(o.once), logger, ...(metricsAddr !== undefined ? { metricsAddr } : {}) };
}

function runnerFrom(o: Record<string, unknown>, io: CliIO): RunnerFlags {
  const callout = o.callout !== undefined ? parseNonEmpty('--callout', String(o.callout)) : io.env.CALLOUT || '/bin/cat';
  const timeoutMs = parseDuration('--timeout', String(o.timeout));
  if (timeoutMs <= 0) throw usageError('--timeout', String(o.timeout), 'expected a duration above 0');
  return {
    callout,
    debounceMs: parseDuration('--debounce', String(o.debounce)),
    maxWaitMs: parseDuration('--max-wait', String(o.maxWait)),
    timeoutMs,
    resyncPeriodMs: parseDuration('--resync-period', String(o.resyncPeriod)),
    ...retryFrom(o),
  };
}

function retryFrom(o: Record<string, unknown>): { retryMinMs: number; retryMaxMs: number } {
  const retryMinMs = parseDuration('--retry-min', String(o.retryMin));
  const retryMaxMs = parseDuration('--retry-max', String(o.retryMax));
  if (retryMinMs <= 0) throw usageError('--retry-min', String(o.retryMin), 'expected a duration above 0');
  if (retryMaxMs < retryMinMs) throw usageError('--retry-max', String(o.retryMax), `expected at least --retry-min (${String(o.retryMin)})`);
  return { retryMinMs, retryMaxMs };
}

/** The options every source command validates before building its source. */
function pipelineOptionsFrom(o: Record<string, unknown>, io: CliIO, tool: Tool): { common: CommonOptions; runner?: RunnerFlags } {
  const common = commonFrom(o, io, tool);
  return tool === 'kpng-callout' ? { common, runner: runnerFrom(o, io) } : { common };
}

/** Builds the kpng gRPC source from validated options. */
function kpngSourceFrom(o: Record<string, unknown>, common: CommonOptions) {
  const api = parseHostPort('--api', String(o.api));
  const errorDelayMs = parseDuration('--error-delay', String(o.errorDelay));
  const maxMsgSize = parseSize('--max-msg-size', String(o.maxMsgSize));
  if ((o.tlsCrt === undefined) !== (o.tlsKey === undefined)) {
    const [given, missing] = o.tlsCrt !== undefined ? ['--tls-crt', '--tls-key'] : ['--tls-key', '--tls-crt'];
    throw usageError(given, String(o.tlsCrt ?? o.tlsKey), `mutual TLS needs ${missing} too`);
  }
  const anyTls = o.tlsCa !== undefined || o.tlsCrt !== undefined;
  const tls = anyTls
    ? {
        ...(o.tlsCa !== undefined ? { ca: readOptFile('--tls-ca', String(o.tlsCa)) } : {}),
        ...(o.tlsCrt !== undefined ? { cert: readOptFile('--tls-crt', String(o.tlsCrt)) } : {}),
        ...(o.tlsKey !== undefined ? { key: readOptFile('--tls-key', String(o.tlsKey)) } : {}),
      }
    : undefined;
  return createKpngSource({
    api,
    nodeName: common.nodeName,
    once: common.once,
    errorDelayMs,
    maxMsgSize,
    ...(tls ? { tls } : {}),
    logger: common.logger,
  });
}

/** How the pipeline treats pushed states. */
export type PipelineMode =
  /** Live source: debounced, coalesced runs; `--once` runs the first state. */
  | 'live'
  /** Replay without --watch: every state runs once, in order, awaited. */
  | 'sequential';

/** Everything a subcommand hands to the shared pipeline. */
export interface PipelineSpec {
  tool: Tool;
  source: Source;
  common: CommonOptions;
  runner?: RunnerFlags;
  mode: PipelineMode;
}

/** Writes one state to a stream without building one big buffer. */
function writeState(out: NodeJS.WritableStream, state: State): void {
  const s = out as NodeJS.WriteStream;
  s.cork?.();
  for (const line of state.lines) out.write(line);
  s.uncork?.();
}

/** Runs source -> (printer | runner) until done; resolves with the exit status. */
async function runPipeline(spec: PipelineSpec, io: CliIO): Promise<number> {
  const { tool, source, common, mode } = spec;
  const log = common.logger;
  const ac = new AbortController();
  let status = 0;
  let runner: Runner | undefined;
  let stopping = false;
  // Runs are serialized, so the newest one settles last: awaiting it awaits them all.
  let lastRun: Promise<void> = Promise.resolve();

  // --metrics-addr (src/metrics.ts), loaded only when asked: prom-client costs startup time.
  let metrics: Metrics | undefined;
  let metricsServer: MetricsServer | undefined;
  if (common.metricsAddr !== undefined) {
    const m = await import('./metrics.js');
    metrics = new m.Metrics({ runner: tool === 'kpng-callout' });
    metricsServer = await m.serveMetrics(metrics, common.metricsAddr, log);
  }

  const onSignal = (sig: NodeJS.Signals): void => {
    if (stopping) {
      if (sig === 'SIGINT') {
        log.warn('second SIGINT: killing the callout now');
        runner?.kill();
        io.proc.exit(130);
      }
      return;
    }
    stopping = true;
    log.info(`${sig}: stopping`);
    ac.abort();
  };
  io.proc.on('SIGINT', onSignal);
  io.proc.on('SIGTERM', onSignal);

  // Where each state goes: the printer, or the runner (now or debounced).
  let deliver: (state: State) => void | Promise<void>;
  if (tool === 'kpng-json') {
    deliver = (state) => writeState(io.stdout, state);
  } else {
    const r = spec.runner!;
    runner = new Runner({
      file: r.callout,
      debounceMs: r.debounceMs,
      maxWaitMs: r.maxWaitMs,
      timeoutMs: r.timeoutMs,
      resyncPeriodMs: r.resyncPeriodMs,
      retryMinMs: r.retryMinMs,
      retryMaxMs: r.retryMaxMs,
      nodeName: common.nodeName,
      env: io.env,
      stdout: io.stdout,
      stderr: io.stderr,
      logger: log,
      ...(metrics ? { onEvent: metrics.onRunnerEvent.bind(metrics) } : {}),
    });
    const rn = runner;
    if (mode === 'sequential' || common.once) {
      let failed = false;
      deliver = (state) => {
        if (stopping) return;
        // Kept so the exit status is known even when the source does not await.
        const p = rn.runNow(state).then((res) => {
          if (!failed && exitStatus(res) !== 0) {
            failed = true;
            status = exitStatus(res);
          }
        });
        lastRun = p;
        return p;
      };
    } else {
      deliver = (state) => rn.submit(state);
    }
  }
  const mt = metrics;
  const sink: StateSink = mt
    ? {
        push: (state) => {
          mt.onState(state);
          return deliver(state);
        },
        status: (st) => mt.onSourceStatus(st),
      }
    : { push: (state) => deliver(state) };

  try {
    await source.run(sink, ac.signal);
  } catch (err) {
    if (err instanceof CalloutError) {
      log.error(err.message);
      status = status || 1;
    } else throw err;
  } finally {
    if (runner) {
      if (stopping) await runner.stop();
      else {
        await lastRun;
        await runner.idle();
        await runner.stop();
      }
    }
    io.proc.off('SIGINT', onSignal);
    io.proc.off('SIGTERM', onSignal);
    await metricsServer?.close();
  }
  return stopping ? 0 : status;
}

/** Options that choose which Services a Kubernetes-object source keeps and what it sends (replay manifests, kube). */
function addServiceFilterOptions(cmd: Command, verb: string): Command {
  const collect = (v: string, prev: string[]): string[] => [...prev, ...splitGlobList(v)];
  return cmd
    .option('--service-proxy-name <name>', `${verb} the Services labelled service.kubernetes.io/service-proxy-name=NAME (default: those without that label, as kube-proxy)`)
    .addOption(new Option('--with-service-labels <globs>', 'send the Service labels whose keys match these globs (comma-separated, repeatable; `*` for all), as kpng').argParser(collect).default([], 'none'))
    .addOption(new Option('--with-service-annotations <globs>', 'send the Service annotations whose keys match these globs (comma-separated, repeatable; `*` for all), as kpng').argParser(collect).default([], 'none'));
}

/** Validated values of addServiceFilterOptions. */
function serviceFilterFrom(o: Record<string, unknown>) {
  const serviceProxyName = o.serviceProxyName !== undefined ? parseServiceProxyName('--service-proxy-name', String(o.serviceProxyName)) : undefined;
  const globs = (option: string, v: unknown) => {
    try {
      return compileGlobs(v as string[]);
    } catch (err) {
      throw usageError(option, JSON.stringify((v as string[]).join(',')), (err as Error).message);
    }
  };
  const labels = globs('--with-service-labels', o.withServiceLabels);
  const annotations = globs('--with-service-annotations', o.withServiceAnnotations);
  return {
    ...(serviceProxyName !== undefined ? { serviceProxyName } : {}),
    ...(labels ? { labels } : {}),
    ...(annotations ? { annotations } : {}),
  };
}

/** Builds the commander program for one tool. `run` receives the finished pipeline. */
export function buildProgram(tool: Tool, io: CliIO, done: (p: Promise<number>) => void): Command {
  const program = new Command(tool);
  const what =
    tool === 'kpng-json'
      ? 'Print the node-local Services/Endpoints state as NDJSON at every sync, byte for byte as kpng-json did.'
      : 'Run a program (the callout) with the node-local Services/Endpoints state as NDJSON on stdin, debounced and serialized.';
  program
    .description(`${what}\nSource: a kpng controller's node-local gRPC API (default), fixture files (replay) or the Kubernetes API (kube).`)
    .version(readVersion(), '-V, --version')
    .showHelpAfterError('(run with --help for usage)')
    .configureOutput({ writeOut: (s) => void io.stdout.write(s), writeErr: (s) => void io.stderr.write(s) })
    .exitOverride();
  addKpngOptions(addCommonOptions(program, tool));
  // Subcommands (sources): replay and kube register below the default kpng source.
  program.action((o: Record<string, unknown>) => {
    const opts = pipelineOptionsFrom(o, io, tool);
    done(runPipeline({ tool, source: kpngSourceFrom(o, opts.common), ...opts, mode: 'live' }, io));
  });

  // --- kube: the Kubernetes API as the source (src/sources/kube.ts, docs/kube.md).
  // Options after a subcommand's name must be the subcommand's, not the program's.
  program.enablePositionalOptions();
  const kube = addServiceFilterOptions(addCommonOptions(program.command('kube'), tool), 'handle')
    .description("Watch the Kubernetes API (Services, EndpointSlices, this node's Node) and compute this node's state as kpng did.")
    .option('--kubeconfig <path>', 'kubeconfig file (default: $KUBECONFIG, else the in-cluster service account when $KUBERNETES_SERVICE_HOST is set, else ~/.kube/config)');
  kube.action(async (o: Record<string, unknown>) => {
    const opts = pipelineOptionsFrom(o, io, tool);
    const { common } = opts;
    const filter = serviceFilterFrom(o);
    const kubeconfig = o.kubeconfig !== undefined ? parseNonEmpty('--kubeconfig', String(o.kubeconfig)) : undefined;
    // Loaded on demand: the Kubernetes client costs ~0.6 s of start-up the other sources don't need.
    const { createKubeSource, loadKubeConfig } = await import('./sources/kube.js');
    const { kubeConfig, from } = loadKubeConfig({ ...(kubeconfig !== undefined ? { kubeconfig } : {}), env: io.env });
    const source = createKubeSource({
      kubeConfig,
      configFrom: from,
      nodeName: common.nodeName,
      ...filter,
      once: common.once,
      logger: common.logger,
    });
    done(runPipeline({ tool, source, ...opts, mode: 'live' }, io));
  });
  // --- end kube

  // --- replay: fixture files as successive states (src/sources/replay.ts).
  const replay = addServiceFilterOptions(addCommonOptions(program.command('replay'), tool), 'keep')
    .description(
      'Run each fixture as one complete state, in order: kpng-json NDJSON, a JSON array of {Service, Endpoints} items, or Kubernetes manifests ' +
        '(YAML/JSON, several documents or a List: Services, discovery.k8s.io/v1 EndpointSlices, Nodes). A directory stands for its fixture files in name order; - reads stdin.',
    )
    .argument('<path...>', 'fixture files, directories, or - for stdin')
    .option('--watch', 'keep running: re-run when a fixture (or the callout, when it is a file) changes', false)
    .option('--node-zone <zone>', "the node's zone, for topology hints (default: the topology.kubernetes.io/zone label of the node's Node object in the fixture, else none)");
  replay.action(async (paths: string[], o: Record<string, unknown>) => {
    // Loaded only for replay (chokidar, yaml): startup time matters to the kpng source.
    const { checkReplayPaths, createReplaySource } = await import('./sources/replay.js');
    const opts = pipelineOptionsFrom(o, io, tool);
    const { common, runner } = opts;
    const watchMode = Boolean(o.watch);
    if (watchMode && common.once) throw new CalloutError('usage', '--watch and --once exclude each other');
    const bad = checkReplayPaths(paths, watchMode);
    if (bad) throw new CalloutError('usage', bad);
    const filter = serviceFilterFrom(o);
    const nodeZone = o.nodeZone !== undefined ? String(o.nodeZone) : undefined;
    // Watch the callout too when it names a file (a bare name is looked up in $PATH).
    let watchExtra: string[] = [];
    if (watchMode && runner && runner.callout.includes('/')) {
      try {
        if (statSync(runner.callout).isFile()) watchExtra = [runner.callout];
      } catch {
        // Not there: the runner reports it at the first run.
      }
    }
    const source = createReplaySource({
      paths,
      watch: watchMode,
      once: common.once,
      nodeName: common.nodeName,
      ...(nodeZone !== undefined ? { nodeZone } : {}),
      ...filter,
      watchExtra,
      ...(runner ? { debounceMs: runner.debounceMs, maxWaitMs: runner.maxWaitMs } : {}),
      stdin: io.proc.stdin,
      logger: common.logger,
    });
    // Every state runs once, in order, awaited (the replay source debounces file events itself).
    done(runPipeline({ tool, source, ...opts, mode: 'sequential' }, io));
  });
  // --- end replay
  return program;
}

function readVersion(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version?: string };
    return pkg.version ?? '0.0.0';
  } catch {
    return '0.0.0';
  }
}

/**
 * grpc-js sets the TLS server name to the target even when it is an IP
 * address (`--api 127.0.0.1:12090 --tls-ca ...`), and Node warns about that
 * (DEP0123) on every start. Nothing the user can act on: drop that one warning,
 * print every other as Node would.
 */
function quietTlsIpWarning(io: CliIO): void {
  const proc = io.proc;
  const others = proc.listeners('warning');
  proc.removeAllListeners('warning');
  proc.on('warning', (w: Error & { code?: string }) => {
    if (w.code === 'DEP0123') return;
    for (const l of others) (l as (w: Error) => void)(w);
  });
}

/** Entry point of both bins. */
export async function main(tool: Tool, io: CliIO = { argv: process.argv, env: process.env, stdout: process.stdout, stderr: process.stderr, proc: process }): Promise<void> {
  quietTlsIpWarning(io);
  let pipeline: Promise<number> | undefined;
  const program = buildProgram(tool, io, (p) => (pipeline = p));
  let code: number;
  try {
    await program.parseAsync(io.argv);
    code = pipeline ? await pipeline : 0;
  } catch (err) {
    if (err instanceof CommanderError) {
      // Help and version exit 0; every usage error exits 2.
      code = err.exitCode === 0 ? 0 : 2;
    } else if (err instanceof CalloutError) {
      io.stderr.write(`${tool}: ${err.message}\n`);
      if (err.code === 'usage') io.stderr.write(`(run ${tool} --help for usage)\n`);
      code = err.code === 'usage' ? 2 : 1;
    } else {
      io.stderr.write(`${tool}: internal error: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
      code = 70;
    }
  }
  // Let stdout drain (it may be a pipe) before exiting.
  io.stdout.write('', () => io.proc.exit(code));
}
