/**
 * The commander program of `kpng-callout` and `kpng-json`: one root command
 * (the kpng source) and the `kube` and `replay` subcommands, their help, and
 * the hand-off of each to the pipeline (src/pipeline.ts).
 */
import { readFileSync } from 'node:fs';
import { Command } from 'commander';
import { addCommonOptions, addServiceFilterOptions, commonFrom, runnerFrom, type CommonFlags } from './commands/common.js';
import { addKpngOptions, kpngSourceFrom, type KpngFlags } from './commands/kpng.js';
import { addKubeOptions, kubeSourceFrom, type KubeFlags } from './commands/kube.js';
import { addReplayOptions, replaySourceFrom, type ReplayFlags } from './commands/replay.js';
import { DEFAULTS } from './defaults.js';
import { CalloutError } from './errors.js';
import { runPipeline, type CliIO, type Tool } from './pipeline.js';

const COMMANDS = ['kube', 'replay'] as const;

/** The closest command to a mistyped one (edit distance at most 2), if any. */
export function suggestCommand(word: string): string | undefined {
  if (word === 'help') return '--help';
  let best: string | undefined;
  let bestD = 3;
  for (const c of COMMANDS) {
    const dist = editDistance(word.toLowerCase(), c);
    if (dist < bestD) [best, bestD] = [c, dist];
  }
  return best;
}

/** Levenshtein distance, for command suggestions (commander keeps its own private). */
function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++) {
      cur[j] = Math.min(prev[j]! + 1, cur[j - 1]! + 1, prev[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    prev = cur;
  }
  return prev[b.length]!;
}

/** The help's tail: formats, exit statuses, environment. `sizes`: the command has a size option (the kpng source). */
function helpEpilogue(tool: Tool, sizes: boolean): string {
  const callout = tool === 'kpng-callout';
  const exits = callout
    ? [
        '  0        stopped by SIGINT, SIGTERM or SIGHUP; --once or replay and every run succeeded',
        '  N        --once / replay: the callout\'s exit status (replay: the first failing run\'s)',
        '  124      --once / replay: the callout timed out',
        '  126, 127 the callout cannot be run (not executable, not found), at startup or in a run',
        '  128+N    --once / replay: the callout died of signal N',
        '  1        bad input (a fixture that does not parse, no Kubernetes configuration), a port in use, --once-timeout, stdout not writable',
        '  2        bad command line',
        '  130      a second SIGINT',
      ]
    : [
        '  0        done (--once, replay), stopped by SIGINT/SIGTERM/SIGHUP, or its reader closed stdout',
        '  1        bad input (a fixture that does not parse, no Kubernetes configuration), a port in use, --once-timeout, stdout not writable',
        '  2        bad command line',
      ];
  const env = [
    '  NODE_NAME                 default of --node-name (else the hostname)',
    ...(callout ? [`  CALLOUT                   default of --callout (else ${DEFAULTS.callout})`] : []),
    '  KUBECONFIG                kube: the kubeconfig file, when --kubeconfig is not given',
    '  KUBERNETES_SERVICE_HOST   kube: set in a pod, selects the in-cluster service account',
    ...(callout
      ? [
          '  The callout gets ours plus KPNG_CALLOUT_RUN (the run number) and KPNG_NODE_NAME; with --changes',
          '  KPNG_CALLOUT_INPUT (full or changes); with --persistent KPNG_CALLOUT_MODE=persistent and KPNG_NODE_NAME.',
        ]
      : []),
  ];
  return [
    '',
    `Durations are Go-style: 250ms, 1s, 1m30s, 0.${sizes ? ' Sizes: 4194304, 512KiB, 4MiB.' : ''}`,
    '',
    'Exit status:',
    ...exits,
    '',
    'Environment:',
    ...env,
    '',
    `Documentation: README.md and docs/${callout ? ', callouts/README.md' : ''} in the package.`,
  ].join('\n');
}

/** The package version. */
export function readVersion(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version?: string };
    return pkg.version ?? '0.0.0';
  } catch {
    return '0.0.0';
  }
}

/** How commander's own messages reach stderr (text or JSON lines, with our prefix). */
export interface ErrorOutput {
  /** Writes one fatal message (no prefix) as text `tool: msg` or a JSON line. */
  error(message: string): void;
  /** Writes a hint line (the `--help` pointer). */
  hint(message: string): void;
}

/**
 * A subcommand's options, with those given before its name (`kpng-callout -v
 * replay …`) taken from the root command, where commander leaves them. A
 * root-only option there (`--api` before `replay`) is an error, not ignored.
 */
function optionsOf<T>(cmd: Command): T {
  const own = cmd.opts();
  const parent = cmd.parent;
  if (!parent) return own as T;
  for (const [key, value] of Object.entries(parent.opts())) {
    if (parent.getOptionValueSource(key) !== 'cli') continue;
    const flag = parent.options.find((o) => o.attributeName() === key)?.long ?? key;
    if (!cmd.options.some((o) => o.attributeName() === key)) throw new CalloutError('usage', `${flag} is an option of the kpng source (no command), not of ${cmd.name()}`, { rootHelp: true });
    if (cmd.getOptionValueSource(key) !== 'cli') own[key] = value;
    // -v counts wherever it is given: `-v replay -v` is -vv.
    else if (key === 'verbose') own[key] = (own[key] as number) + (value as number);
  }
  return own as T;
}

/**
 * Builds the commander program for one tool. `done` receives the pipeline's
 * exit status; `entered`, the name of a subcommand as its parsing begins
 * (whose --help then tells about the options of a usage error).
 */
export function buildProgram(tool: Tool, io: CliIO, out: ErrorOutput, done: (p: Promise<number>) => void, entered?: (command: string) => void): Command {
  const version = readVersion();
  const what =
    tool === 'kpng-json'
      ? 'Print the node-local Services/Endpoints state as NDJSON at every sync, byte for byte as kpng-json did.'
      : 'Run a program (the callout) with the node-local Services/Endpoints state as NDJSON on stdin, debounced and serialized.';
  const configure = (cmd: Command, sizes = false): Command =>
    cmd
      .showHelpAfterError(false)
      .configureOutput({
        writeOut: (s) => void io.stdout.write(s),
        writeErr: (s) => void io.stderr.write(s),
        outputError: (s) => {
          out.error(s.replace(/^error: /, '').trimEnd());
          out.hint(`(run ${tool}${cmd.name() === tool ? '' : ` ${cmd.name()}`} --help for usage)`);
        },
      })
      .addHelpText('after', helpEpilogue(tool, sizes))
      .exitOverride();

  const program = configure(new Command(tool), true)
    .description(`${what}\nSource: a kpng controller's node-local gRPC API (default), fixture files (replay) or the Kubernetes API (kube).`)
    .usage('[options] | kube [options] | replay [options] <path...>')
    // Options after a subcommand's name are the subcommand's, not the program's.
    .enablePositionalOptions()
    // A stray word is most likely a mistyped command: say so rather than "too many arguments".
    .allowExcessArguments(true)
    .hook('preSubcommand', (_root, sub) => entered?.(sub.name()));
  addKpngOptions(addCommonOptions(program, tool, version));
  program.action(async (o: CommonFlags & KpngFlags, cmd: Command) => {
    const word = cmd.args[0];
    if (word !== undefined) {
      const hint = suggestCommand(word);
      throw new CalloutError('usage', `unknown command '${word}'${hint ? ` (did you mean ${hint}?)` : ''}; commands: kube, replay, or none for a kpng controller`);
    }
    const common = commonFrom(o, io, tool);
    const runner = tool === 'kpng-callout' ? runnerFrom(o, io) : undefined;
    const source = await kpngSourceFrom(o, common);
    done(runPipeline({ tool, sourceName: 'kpng', source, common, runner, mode: 'live', version }, io));
  });

  // kube takes no argument: a stray word (`kube kpng-example`, a value whose flag is missing) is an
  // error, not ignored (subcommands inherit the root's allowExcessArguments(true)).
  const kube = configure(addKubeOptions(addServiceFilterOptions(addCommonOptions(program.command('kube'), tool, version), 'handle'))).allowExcessArguments(false);
  kube.action(async (_o: unknown, cmd: Command) => {
    const o = optionsOf<CommonFlags & KubeFlags>(cmd);
    const common = commonFrom(o, io, tool);
    const runner = tool === 'kpng-callout' ? runnerFrom(o, io) : undefined;
    const source = await kubeSourceFrom(o, common, io.env);
    done(runPipeline({ tool, sourceName: 'kube', source, common, runner, mode: 'live', version }, io));
  });

  const replay = configure(addReplayOptions(addServiceFilterOptions(addCommonOptions(program.command('replay'), tool, version), 'keep'), tool));
  replay.action(async (paths: string[], _o: unknown, cmd: Command) => {
    const o = optionsOf<CommonFlags & ReplayFlags>(cmd);
    if (cmd.getOptionValueSource('watchInterval') === 'cli' && !o.watchPoll) throw new CalloutError('usage', '--watch-interval needs --watch-poll');
    const common = commonFrom(o, io, tool);
    const runner = tool === 'kpng-callout' ? runnerFrom(o, io) : undefined;
    const source = await replaySourceFrom(paths, o, common, runner, io);
    // Every state runs once, in order, awaited (the replay source debounces file events itself);
    // under --watch a failed run is retried, as a daemon's.
    done(runPipeline({ tool, sourceName: 'replay', source, common, runner, mode: o.watch ? 'watch' : 'sequential', version }, io));
  });
  return program;
}
