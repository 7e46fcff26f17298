/**
 * The commander program, in-process (buildProgram over a CliIO stand-in):
 * unknown commands and their suggestions, common options given before the
 * command name, root-only options refused there, each command's action
 * building its source and handing the pipeline over, help and version.
 * Exit codes and the error format are test/cli.test.ts's.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CommanderError } from 'commander';
import t, { type Test } from 'tap';
import { DEFAULTS, formatDuration, formatSize } from '../src/defaults.js';
import type { Tool } from '../src/pipeline.js';
import { buildProgram, readVersion, suggestCommand, type ErrorOutput } from '../src/program.js';
import { fakeIO, type FakeIO } from './helpers/cli-io.js';
import { tempDir } from './helpers/files.js';
import { blogJsonl, blogJsonlPath, blogView, blogYamlPath, repoPath } from './helpers/fixtures.js';
import { serve } from './helpers/kpng-server.js';
import { within } from './helpers/wait.js';

const dir = tempDir(t, 'program-');

interface Parsed {
  io: FakeIO;
  /** What reached the ErrorOutput: `error: …` and `hint: …` lines. */
  out: string[];
  /** The pipeline an action handed over, if any. */
  pipeline: Promise<number> | undefined;
  /** Whatever parseAsync rejected with. */
  error: unknown;
}

/** Parses `args` with the program of `tool`; never rejects. */
async function parse(tool: Tool, args: string[]): Promise<Parsed> {
  const io = fakeIO({ tool, args });
  const out: string[] = [];
  const errorOutput: ErrorOutput = { error: (m) => out.push(`error: ${m}`), hint: (m) => out.push(`hint: ${m}`) };
  const r: Parsed = { io, out, pipeline: undefined, error: undefined };
  const program = buildProgram(tool, io.io, errorOutput, (p) => (r.pipeline = p));
  try {
    await program.parseAsync(io.io.argv);
  } catch (err) {
    r.error = err;
  }
  return r;
}

/** Parses `args` and awaits the pipeline it starts; resolves with its status. */
async function runs(t: Test, tool: Tool, args: string[]): Promise<Parsed & { status: number }> {
  const r = await parse(tool, args);
  t.equal(r.error, undefined, `${args.join(' ')}: parsed`);
  if (!r.pipeline) throw new Error(`${args.join(' ')}: no pipeline (${String(r.error)})`);
  return { ...r, status: await within(r.pipeline, `the pipeline of ${args.join(' ')}`) };
}

t.test('suggestCommand: the closest command within two edits, help as --help', async (t) => {
  t.equal(suggestCommand('reply'), 'replay');
  t.equal(suggestCommand('replya'), 'replay');
  t.equal(suggestCommand('cube'), 'kube');
  t.equal(suggestCommand('KUBE'), 'kube', 'case does not count');
  t.equal(suggestCommand('kubectl'), undefined, 'three edits: no guess');
  t.equal(suggestCommand('fixtures/'), undefined);
  t.equal(suggestCommand('help'), '--help');
});

t.test('readVersion: the package version', async (t) => {
  t.equal(readVersion(), (JSON.parse(readFileSync(repoPath('package.json'), 'utf8')) as { version: string }).version);
});

t.test('a stray word is an unknown command, with a suggestion when one is close', async (t) => {
  const r = await parse('kpng-callout', ['reply', blogJsonlPath]);
  t.match(r.error, { name: 'CalloutError', code: 'usage', message: "unknown command 'reply' (did you mean replay?); commands: kube, replay, or none for a kpng controller" });
  t.equal(r.pipeline, undefined, 'nothing started');
  const far = await parse('kpng-json', ['frobnicate']);
  t.match(far.error, { code: 'usage', message: "unknown command 'frobnicate'; commands: kube, replay, or none for a kpng controller" });
  t.match((await parse('kpng-json', ['help'])).error, { message: /^unknown command 'help' \(did you mean --help\?\)/ });
});

t.test('kube takes no argument: a stray word is a usage error, nothing started', async (t) => {
  for (const tool of ['kpng-callout', 'kpng-json'] as const) {
    const r = await parse(tool, ['kube', '--kubeconfig', '/nonexistent', 'kpng-example']);
    t.type(r.error, CommanderError, `${tool}: refused by commander`);
    t.match(r.out.join('\n'), /too many arguments for 'kube'/, 'says so');
    t.equal(r.pipeline, undefined, 'nothing started');
  }
});

t.test('common options before the command name apply to it; its own given after win', async (t) => {
  const q = await runs(t, 'kpng-json', ['-q', '--node-name', blogView.nodeName, 'replay', blogJsonlPath]);
  t.equal(q.status, 0);
  t.equal(q.io.stdout.text(), blogJsonl);
  t.equal(q.io.stderr.text(), '', '-q before replay: no startup line');

  const n = await runs(t, 'kpng-json', ['--node-name', 'vm-before', 'replay', '--node-name', blogView.nodeName, '--service-proxy-name', blogView.serviceProxyName, blogYamlPath]);
  t.equal(n.status, 0);
  t.match(n.io.stderr.lines()[0], / starting source=replay node=vm-002 /, 'the value after the command name wins');
  t.equal(n.io.stdout.text(), blogJsonl, 'and is the one the source uses');

  const v = await runs(t, 'kpng-json', ['-v', 'replay', '-v', blogJsonlPath]);
  t.match(v.io.stderr.text(), / debug: /, '-v before and after');
  t.match(v.io.stderr.text(), / debug: state received /, 'they add up: -vv logs every state');
  const one = await runs(t, 'kpng-json', ['-v', 'replay', blogJsonlPath]);
  t.notMatch(one.io.stderr.text(), /state received/, '-v alone does not');
});

t.test('a root-only option is refused before a command name, unknown after it', async (t) => {
  const before = await parse('kpng-callout', ['--api', '127.0.0.1:1', 'replay', blogJsonlPath]);
  t.match(before.error, { name: 'CalloutError', code: 'usage', message: '--api is an option of the kpng source (no command), not of replay' });
  t.equal(before.pipeline, undefined);
  const tls = await parse('kpng-json', ['--tls-ca', '/ca.pem', 'kube']);
  t.match(tls.error, { code: 'usage', message: '--tls-ca is an option of the kpng source (no command), not of kube' });

  const after = await parse('kpng-callout', ['replay', '--api', '127.0.0.1:1', blogJsonlPath]);
  t.ok(after.error instanceof CommanderError);
  t.match(after.error, { code: 'commander.unknownOption', exitCode: 1 });
  t.same(after.out, ["error: unknown option '--api'", 'hint: (run kpng-callout replay --help for usage)'], 'said once, with the help of the subcommand');
});

t.test('kpng-json has no runner options; kpng-callout checks its callout before the source starts', async (t) => {
  const r = await parse('kpng-json', ['kube', '--callout', '/bin/cat']);
  t.match(r.error, { code: 'commander.unknownOption' });
  t.same(r.out, ["error: unknown option '--callout'", 'hint: (run kpng-json kube --help for usage)']);
  const c = await parse('kpng-callout', ['--api', '127.0.0.1:1', '--callout', join(dir, 'missing')]);
  t.match(c.error, { name: 'CalloutError', code: 'callout', exitCode: 127, message: /not found/ });
  t.equal(c.pipeline, undefined, 'no source was started');
});

t.test('the root command runs the kpng source on --api', async (t) => {
  const server = await serve(t, [[{ op: 'set', set: 'services', path: 'default/web', value: { Namespace: 'default', Name: 'web', Type: 'ClusterIP' } }]]);
  const r = await runs(t, 'kpng-json', ['--api', server.address, '--once', '--node-name', 'vm-9']);
  t.equal(r.status, 0);
  t.match(r.io.stdout.text(), /^\{"Service":\{"Namespace":"default","Name":"web"/);
  t.equal(server.requests[0]?.NodeName, 'vm-9');
  const bad = await parse('kpng-json', ['--tls-crt', '/c.pem']);
  t.match(bad.error, { code: 'usage', message: '--tls-crt /c.pem: mutual TLS needs --tls-key too' });
});

t.test('kube and replay check their own options in their actions', async (t) => {
  const k = await parse('kpng-json', ['kube', '--kubeconfig', join(dir, 'nope')]);
  t.match(k.error, { code: 'usage', message: /^--kubeconfig .*nope: cannot read file \(ENOENT\)$/ });
  const w = await parse('kpng-json', ['replay', '--watch', '--watch-interval', '2s', blogJsonlPath]);
  t.match(w.error, { code: 'usage', message: '--watch-interval needs --watch-poll' });
  const o = await parse('kpng-json', ['replay', '--watch', '--once', blogJsonlPath]);
  t.match(o.error, { code: 'usage', message: '--watch and --once exclude each other' });
  const bad = join(dir, 'bad.jsonl');
  writeFileSync(bad, '{"Service":\n');
  const f = await parse('kpng-json', ['replay', bad]);
  await t.rejects(within(f.pipeline!, 'the replay of a bad fixture'), { code: 'input', message: new RegExp(`^${bad}:`) }, 'a bad fixture fails the pipeline, not the parse');
});

t.test('help shows the defaults of src/defaults.ts; --version prints the version', async (t) => {
  const flat = (s: string): string => s.replace(/\s+/g, ' ');
  const h = await parse('kpng-callout', ['--help']);
  t.match(h.error, { code: 'commander.helpDisplayed', exitCode: 0 });
  const help = flat(h.io.stdout.text());
  t.match(help, `--debounce <duration> quiet time after the last change before a run (0 = run at once) (default: ${formatDuration(DEFAULTS.debounceMs)})`);
  t.match(help, `(default: ${DEFAULTS.api})`);
  t.match(help, `(default: ${formatSize(DEFAULTS.maxMsgSize)})`);
  t.match(help, `SIGKILL ${formatDuration(DEFAULTS.killGraceMs)} later`);
  t.match(help, `else ${DEFAULTS.callout})`);
  t.match(help, 'Exit status:');
  const j = await parse('kpng-json', ['replay', '--help']);
  t.match(flat(j.io.stdout.text()), `with --watch-poll: how often to poll (default: ${formatDuration(DEFAULTS.watchIntervalMs)})`);
  t.notMatch(j.io.stdout.text(), /callout/i, 'kpng-json help never mentions a callout');

  for (const args of [['--version'], ['kube', '-V']]) {
    const v = await parse('kpng-json', args);
    t.match(v.error, { code: 'commander.version', exitCode: 0 });
    t.equal(v.io.stdout.text(), `${readVersion()}\n`, args.join(' '));
  }
});
