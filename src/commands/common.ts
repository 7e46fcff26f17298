/**
 * The options every command shares (common, runner, service filter): their
 * commander definitions, parsed once into typed values by `argParser`, and
 * their validation into the pipeline's option types.
 */
import { hostname } from 'node:os';
import { Option, type Command } from 'commander';
import { checkCallout } from '../runner/callout-check.js';
import { compileGlobs, splitGlobList } from '../convert/glob.js';
import { DEFAULTS, formatDuration } from '../defaults.js';
import { CalloutError, usageError } from '../errors.js';
import { createLogger } from '../log.js';
import { parseDuration, parseHostPort, parseNodeName, parseNonEmpty, parseServiceProxyName, type Address } from '../options.js';
import type { CliIO, CommonOptions, RunnerFlags, Tool } from '../pipeline.js';

/** Raw values commander collects for the common and runner options (already typed by argParser). */
export interface CommonFlags {
  nodeName?: string;
  once: boolean;
  onceTimeout: number;
  logFormat: 'text' | 'json';
  verbose: number;
  quiet: boolean;
  metricsAddr?: Address;
  healthAddr?: Address;
  changes: boolean;
  persistent?: boolean;
  callout?: string;
  debounce: number;
  maxWait: number;
  timeout: number;
  resyncPeriod: number;
  retryMin: number;
  retryMax: number;
}

/** An argParser for a duration option. */
export const duration =
  (option: string) =>
  (v: string): number =>
    parseDuration(option, v);

/** An argParser for a listen address; `:PORT` means every interface. */
const listenAddr =
  (option: string) =>
  (v: string): Address =>
    parseHostPort(option, v, { allowPortZero: true, allowEmptyHost: true });

const d = formatDuration;

/** Adds the options every command has; the runner's with kpng-callout. */
export function addCommonOptions(cmd: Command, tool: Tool, version: string): Command {
  cmd
    .version(version, '-V, --version', 'print the version and exit')
    .option('--node-name <name>', 'node whose view to request/compute (default: $NODE_NAME, else the hostname)', (v: string) => parseNodeName('--node-name', v))
    .option('--once', 'wait for the first complete state, ' + (tool === 'kpng-json' ? 'print it and exit' : 'run the callout once and exit with its status'), false)
    .addOption(new Option('--once-timeout <duration>', 'with --once: give up (exit 1) when no complete state arrived within this time').argParser(duration('--once-timeout')).default(DEFAULTS.onceTimeoutMs, 'wait for ever'))
    .addOption(new Option('--log-format <format>', 'log line format on stderr').choices(['text', 'json']).default(DEFAULTS.logFormat))
    .option('-v, --verbose', 'debug logs; -vv also logs every state the source delivers', (_v: string, prev: number) => prev + 1, 0)
    .option('-q, --quiet', 'only warnings and errors', false)
    .option('--metrics-addr <host:port>', 'serve Prometheus /metrics, /healthz and /readyz here; :PORT is every interface (off by default)', listenAddr('--metrics-addr'))
    .option('--health-addr <host:port>', 'serve only /healthz and /readyz here (for the kubelet\'s probes; off by default)', listenAddr('--health-addr'))
    .option(
      '--changes',
      tool === 'kpng-json'
        ? 'after the first state, print only what changed since the last print (a change set: {"Previous":…} and new lines; see README)'
        : 'hand the callout only what changed since the state it last applied (a change set; KPNG_CALLOUT_INPUT=full|changes tells which; see README)',
      false,
    );
  if (tool === 'kpng-callout') {
    cmd
      .option('--persistent', 'start the callout once and keep it running: one frame per state on its stdin, one ack per frame on its fd 3 (see README)', false)
      .option('--callout <prog>', `program to run with the state on stdin, without a shell (default: $CALLOUT, else ${DEFAULTS.callout})`, (v: string) => parseNonEmpty('--callout', v))
      .addOption(new Option('--debounce <duration>', 'quiet time after the last change before a run (0 = run at once)').argParser(duration('--debounce')).default(DEFAULTS.debounceMs, d(DEFAULTS.debounceMs)))
      .addOption(new Option('--max-wait <duration>', 'longest delay from the first pending change to its run').argParser(duration('--max-wait')).default(DEFAULTS.maxWaitMs, d(DEFAULTS.maxWaitMs)))
      .addOption(
        new Option('--timeout <duration>', `per-run time limit: SIGTERM to the callout's process group, SIGKILL ${d(DEFAULTS.killGraceMs)} later`)
          .argParser(duration('--timeout'))
          .default(DEFAULTS.timeoutMs, d(DEFAULTS.timeoutMs)),
      )
      .addOption(new Option('--resync-period <duration>', 're-run the callout with the current state this often, even if unchanged (0 = off)').argParser(duration('--resync-period')).default(DEFAULTS.resyncPeriodMs, d(DEFAULTS.resyncPeriodMs)))
      .addOption(new Option('--retry-min <duration>', 'first retry delay after a failed run, doubling (with jitter) at each failure').argParser(duration('--retry-min')).default(DEFAULTS.retryMinMs, d(DEFAULTS.retryMinMs)))
      .addOption(new Option('--retry-max <duration>', 'longest retry delay').argParser(duration('--retry-max')).default(DEFAULTS.retryMaxMs, d(DEFAULTS.retryMaxMs)));
  }
  return cmd;
}

/** Validates the common options and builds the logger. */
export function commonFrom(o: CommonFlags, io: CliIO, tool: Tool): CommonOptions {
  if (o.quiet && o.verbose > 0) throw new CalloutError('usage', '-q (--quiet) and -v (--verbose) exclude each other: pick one');
  if (!o.once && o.onceTimeout > 0) throw new CalloutError('usage', '--once-timeout needs --once');
  // Port 0 asks for a free port each: never the same.
  if (o.metricsAddr !== undefined && o.metricsAddr.text === o.healthAddr?.text && !o.metricsAddr.text.endsWith(':0')) {
    throw new CalloutError('usage', `--health-addr ${o.metricsAddr.text}: the same address as --metrics-addr, which serves /healthz and /readyz already: drop one or pick another port`);
  }
  const verbosity = o.quiet ? -1 : o.verbose;
  const logger = createLogger({ name: tool, format: o.logFormat, verbosity, write: (l) => void io.stderr.write(l) });
  return {
    // As the kubelet names its Node (k8s.io/component-helpers GetHostname): the hostname trimmed and lowercased.
    nodeName: o.nodeName ?? (io.env.NODE_NAME || hostname().trim().toLowerCase()),
    once: o.once,
    onceTimeoutMs: o.onceTimeout,
    verbosity,
    logFormat: o.logFormat,
    logger,
    metricsAddr: o.metricsAddr,
    healthAddr: o.healthAddr,
    changes: o.changes,
  };
}

/**
 * Validates the runner options, and the callout itself: a callout that
 * cannot run is reported now, with the status a shell would give (127, 126),
 * not when the first state arrives minutes later.
 */
export function runnerFrom(o: CommonFlags, io: CliIO): RunnerFlags {
  const callout = o.callout ?? (io.env.CALLOUT || DEFAULTS.callout);
  if (o.timeout <= 0) throw usageError('--timeout', formatDuration(o.timeout), 'expected a duration above 0');
  if (o.retryMin <= 0) throw usageError('--retry-min', formatDuration(o.retryMin), 'expected a duration above 0');
  if (o.retryMax < o.retryMin) throw usageError('--retry-max', formatDuration(o.retryMax), `expected at least --retry-min (${formatDuration(o.retryMin)})`);
  const check = checkCallout(callout, io.env);
  if (!check.ok) throw new CalloutError('callout', check.message, { exitCode: check.exitCode });
  return {
    callout,
    debounceMs: o.debounce,
    maxWaitMs: o.maxWait,
    timeoutMs: o.timeout,
    resyncPeriodMs: o.resyncPeriod,
    retryMinMs: o.retryMin,
    retryMaxMs: o.retryMax,
    persistent: o.persistent ?? false,
  };
}

/** Raw values of the service filter options. */
export interface ServiceFilterFlags {
  serviceProxyName?: string;
  withServiceLabels: string[];
  withServiceAnnotations: string[];
}

/** Options that choose which Services a Kubernetes-object source keeps and what it sends (replay manifests, kube). */
export function addServiceFilterOptions(cmd: Command, verb: string): Command {
  const collect = (v: string, prev: string[]): string[] => [...prev, ...splitGlobList(v)];
  return cmd
    .option(
      '--service-proxy-name <name>',
      `${verb} the Services labelled service.kubernetes.io/service-proxy-name=NAME (default: those without that label, as kube-proxy)`,
      (v: string) => parseServiceProxyName('--service-proxy-name', v),
    )
    .addOption(new Option('--with-service-labels <globs>', 'send the Service labels whose keys match these globs (comma-separated, repeatable; `*` for all), as kpng').argParser(collect).default([], 'none'))
    .addOption(new Option('--with-service-annotations <globs>', 'send the Service annotations whose keys match these globs (comma-separated, repeatable; `*` for all), as kpng').argParser(collect).default([], 'none'));
}

/** Validated values of addServiceFilterOptions. */
export function serviceFilterFrom(o: ServiceFilterFlags) {
  const globs = (option: string, v: string[]) => {
    try {
      return compileGlobs(v);
    } catch (err) {
      throw usageError(option, JSON.stringify(v.join(',')), (err as Error).message);
    }
  };
  const labels = globs('--with-service-labels', o.withServiceLabels);
  const annotations = globs('--with-service-annotations', o.withServiceAnnotations);
  return {
    serviceProxyName: o.serviceProxyName,
    labels,
    annotations,
  };
}
