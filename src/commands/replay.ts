/**
 * `replay`: fixture files as successive states (src/sources/replay.ts, docs/replay.md).
 */
import { statSync } from 'node:fs';
import { Option, type Command } from 'commander';
import { DEFAULTS, formatDuration } from '../defaults.js';
import { CalloutError } from '../errors.js';
import type { CliIO, CommonOptions, RunnerFlags, Tool } from '../pipeline.js';
import type { Source } from '../source.js';
import { duration, serviceFilterFrom, type ServiceFilterFlags } from './common.js';

/** Raw values of replay's own options. */
export interface ReplayFlags extends ServiceFilterFlags {
  watch: boolean;
  watchPoll: boolean;
  watchInterval: number;
  nodeZone?: string;
}

/** Adds replay's arguments and options. */
export function addReplayOptions(cmd: Command, tool: Tool): Command {
  return cmd
    .description(
      'Run each fixture as one complete state, in order: kpng-json NDJSON, a JSON array of {Service, Endpoints} items, or Kubernetes manifests ' +
        '(YAML/JSON, several documents or a List: Services, discovery.k8s.io/v1 EndpointSlices, Nodes). A directory stands for its fixture files in name order; - reads stdin.',
    )
    .argument('<path...>', 'fixture files, directories, or - for stdin')
    .option('--watch', tool === 'kpng-json' ? 'keep running: print again when a fixture changes' : 'keep running: re-run when a fixture (or the callout, when it is a file) changes', false)
    .option('--watch-poll', 'with --watch: poll the files instead of using file system events (network file systems)', false)
    .addOption(new Option('--watch-interval <duration>', 'with --watch-poll: how often to poll').argParser(duration('--watch-interval')).default(DEFAULTS.watchIntervalMs, formatDuration(DEFAULTS.watchIntervalMs)))
    .option('--node-zone <zone>', "the node's zone, for topology hints (default: the topology.kubernetes.io/zone label of the node's Node object in the fixture, else none)");
}

/** Builds the replay source from validated options. chokidar and yaml are loaded only for replay. */
export async function replaySourceFrom(paths: string[], o: ReplayFlags, common: CommonOptions, runner: RunnerFlags | undefined, io: CliIO): Promise<Source> {
  const { checkReplayPaths, createReplaySource } = await import('../sources/replay.js');
  if (o.watch && common.once) throw new CalloutError('usage', '--watch and --once exclude each other');
  if (o.watchPoll && !o.watch) throw new CalloutError('usage', '--watch-poll needs --watch');
  if (o.watchInterval <= 0) throw new CalloutError('usage', `--watch-interval ${formatDuration(o.watchInterval)}: expected a duration above 0`);
  const bad = checkReplayPaths(paths, o.watch);
  if (bad) throw new CalloutError('usage', bad);
  const filter = serviceFilterFrom(o);
  // Watch the callout too when it names a file (a bare name is looked up in $PATH).
  let watchExtra: string[] = [];
  if (o.watch && runner && runner.callout.includes('/')) {
    try {
      if (statSync(runner.callout).isFile()) watchExtra = [runner.callout];
    } catch {
      // Checked at startup; gone since: nothing to watch.
    }
  }
  return createReplaySource({
    paths,
    watch: o.watch,
    once: common.once,
    nodeName: common.nodeName,
    nodeZone: o.nodeZone,
    ...filter,
    watchExtra,
    usePolling: o.watchPoll,
    pollIntervalMs: o.watchInterval,
    debounceMs: runner?.debounceMs,
    maxWaitMs: runner?.maxWaitMs,
    stdin: io.proc.stdin,
    logger: common.logger,
  });
}
