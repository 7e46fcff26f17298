/**
 * `replay`'s source from its options: the usage checks made before anything
 * is read (--watch with --once, --watch-poll without --watch, stdin twice or
 * watched), and what the options hand the source, shown by running it: our
 * stdin for `-`, the node and service filter, the callout file watched with
 * --watch, polling with --watch-poll.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Command } from 'commander';
import t, { type Test } from 'tap';
import { addServiceFilterOptions } from '../../src/commands/common.js';
import { addReplayOptions, replaySourceFrom, type ReplayFlags } from '../../src/commands/replay.js';
import { DEFAULTS } from '../../src/defaults.js';
import type { CommonOptions, RunnerFlags, Tool } from '../../src/pipeline.js';
import type { Source } from '../../src/source.js';
import { commonOptions, fakeIO } from '../helpers/cli-io.js';
import { replaceFile, shScript, tempDir } from '../helpers/files.js';
import { blogJsonl, blogJsonlPath, blogView, blogYamlPath, stateLine } from '../helpers/fixtures.js';
import { gatedSink } from '../helpers/gated-sink.js';
import { captureLog } from '../helpers/sink.js';
import { within } from '../helpers/wait.js';

const dir = tempDir(t, 'commands-replay-');

/** replay's paths and options as commander parses `args`. */
function parse(args: string[], tool: Tool = 'kpng-callout'): { paths: string[]; o: ReplayFlags } {
  const cmd = addReplayOptions(addServiceFilterOptions(new Command('replay').exitOverride().configureOutput({ writeErr: () => {} }), 'keep'), tool).action(() => {});
  cmd.parse(args, { from: 'user' });
  return { paths: cmd.processedArgs[0] as string[], o: cmd.opts<ReplayFlags>() };
}

/** Runner options as runnerFrom would give them, with `callout`. */
const runnerFlags = (callout: string): RunnerFlags => ({
  callout,
  debounceMs: 20,
  maxWaitMs: 200,
  timeoutMs: DEFAULTS.timeoutMs,
  resyncPeriodMs: 0,
  retryMinMs: DEFAULTS.retryMinMs,
  retryMaxMs: DEFAULTS.retryMaxMs,
  persistent: false,
});

/** `replaySourceFrom` for `args` (its paths included). */
function sourceFrom(args: string[], common: CommonOptions = commonOptions(), runner?: RunnerFlags, stdin?: string): Promise<Source> {
  const { paths, o } = parse(args);
  return replaySourceFrom(paths, o, common, runner, fakeIO({ stdin }).io);
}

/** Runs `source` into a sink whose pushes settle at once, stopped at `t`'s teardown. */
function run(t: Test, source: Source) {
  const sink = gatedSink(true);
  const ac = new AbortController();
  const done = source.run(sink.sink, ac.signal);
  t.teardown(async () => {
    ac.abort();
    await done.catch(() => {});
  });
  return { sink, done };
}

t.test('usage checks, before any file is read', async (t) => {
  const once = commonOptions({ once: true });
  const cases: Array<[string[], CommonOptions, string]> = [
    [['--watch', blogJsonlPath], once, '--watch and --once exclude each other'],
    [['--watch-poll', blogJsonlPath], commonOptions(), '--watch-poll needs --watch'],
    [['--watch', '--watch-poll', '--watch-interval', '0', blogJsonlPath], commonOptions(), '--watch-interval 0: expected a duration above 0'],
    [['-', '-'], commonOptions(), '- (stdin) can be given only once'],
    [['--watch', '-'], commonOptions(), '--watch cannot watch - (stdin)'],
  ];
  for (const [args, common, message] of cases) {
    await t.rejects(sourceFrom(args, common), { name: 'CalloutError', code: 'usage', message }, args.join(' '));
  }
  await t.rejects(sourceFrom([join(dir, 'nope.jsonl')]).then((s) => s.run(gatedSink(true).sink, new AbortController().signal)), { code: 'input' }, 'a missing file fails when the source runs');
});

t.test('options: typed values, defaults from DEFAULTS, kpng-json words --watch without a callout', async (t) => {
  const { paths, o } = parse(['a.jsonl', 'dir/', '--watch', '--watch-poll', '--watch-interval', '250ms', '--node-zone', 'z1']);
  t.same(paths, ['a.jsonl', 'dir/']);
  t.match(o, { watch: true, watchPoll: true, watchInterval: 250, nodeZone: 'z1' });
  t.match(parse(['a.jsonl']).o, { watch: false, watchPoll: false, watchInterval: DEFAULTS.watchIntervalMs, nodeZone: undefined });
  t.throws(() => parse([]), { code: 'commander.missingArgument' }, 'a path is required');
  const watchHelp = (tool: Tool) => addReplayOptions(new Command('replay'), tool).options.find((x) => x.long === '--watch')?.description;
  t.equal(watchHelp('kpng-callout'), 'keep running: re-run when a fixture (or the callout, when it is a file) changes');
  t.equal(watchHelp('kpng-json'), 'keep running: print again when a fixture changes');
});

t.test('- reads our stdin (the io stand-in), not the process', async (t) => {
  const { sink, done } = run(t, await sourceFrom(['-'], commonOptions(), undefined, blogJsonl));
  await within(done, 'the replay of stdin to end');
  t.same(sink.texts, [blogJsonl]);
});

t.test('the node and the service filter reach the manifests conversion; --once keeps the first fixture', async (t) => {
  const common = commonOptions({ nodeName: blogView.nodeName, once: true });
  const { sink, done } = run(t, await sourceFrom(['--service-proxy-name', blogView.serviceProxyName, blogYamlPath, blogJsonlPath], common));
  await within(done, 'the replay to end');
  t.same(sink.texts, [blogJsonl], 'the blog manifests as vm-002 sees them, and nothing after them');
  const all = run(t, await sourceFrom([blogYamlPath], commonOptions({ nodeName: blogView.nodeName })));
  await within(all.done, 'the replay to end');
  t.notSame(all.sink.texts, [blogJsonl], 'without --service-proxy-name the labelled Services are left out');
});

t.test('--watch watches the callout when it is a file, and re-runs the last state when it changes', async (t) => {
  const fx = join(dir, 'watched.jsonl');
  writeFileSync(fx, stateLine('w1'));
  const callout = shScript(dir, 'watched-callout.sh', 'cat\n');
  const log = captureLog();
  const { sink } = run(t, await sourceFrom(['--watch', fx], commonOptions({ logger: log.logger }), runnerFlags(callout)));
  t.equal(await sink.waitFor(1), stateLine('w1'));
  await log.waitFor(new RegExp(`watching ${fx}, ${callout} for changes$`));
  replaceFile(callout, '#!/bin/sh\ncat >/dev/null\n', 0o755);
  t.equal(await sink.waitFor(2), stateLine('w1'), 'the callout changed: the last state again');
});

t.test('--watch: a callout named without a slash (looked up in $PATH) is not watched; --watch-poll polls', async (t) => {
  const fx = join(dir, 'polled.jsonl');
  writeFileSync(fx, stateLine('p1'));
  const log = captureLog();
  const { sink } = run(t, await sourceFrom(['--watch', '--watch-poll', '--watch-interval', '50ms', fx], commonOptions({ logger: log.logger }), runnerFlags('cat')));
  t.equal(await sink.waitFor(1), stateLine('p1'));
  t.equal(await log.waitFor(/watching /), `kpng-callout info: watching ${fx} for changes (polling every 50 ms)`);
});
