/**
 * `main`, in-process over a CliIO stand-in: how a fatal error is written (our
 * prefix and a --help pointer for usage errors, or JSON lines with
 * --log-format json, command-line errors included), the exit status of each
 * outcome (help and version 0, usage 2, input and io 1, a callout that cannot
 * run 126/127, a bug 70, else the pipeline's), and Node's warnings through
 * our output. The bins as processes are test/e2e/'s.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { main, type Tool } from '../src/cli.js';
import { readVersion } from '../src/program.js';
import { collector, fakeIO, type FakeIO, type FakeIOOptions } from './helpers/cli-io.js';
import { shScript, tempDir } from './helpers/files.js';
import { blogJsonl, blogJsonlPath } from './helpers/fixtures.js';
import { heldPort } from './helpers/ports.js';
import { within } from './helpers/wait.js';

const dir = tempDir(t, 'cli-');

/** Runs `main(tool)` with `args`; resolves with the io and the exit code passed to `proc.exit`. */
async function run(t: Test, tool: Tool, args: string[], o: Omit<FakeIOOptions, 'args' | 'tool'> = {}): Promise<FakeIO & { code: number }> {
  const f = fakeIO({ tool, args, ...o });
  await within(main(tool, f.io), `main(${tool} ${args.join(' ')})`);
  const code = await within(f.proc.exited, `main(${tool} ${args.join(' ')}) to exit`);
  t.equal(f.proc.exits.length, 1, 'exit is called once');
  return { ...f, code };
}

/** The stderr lines as JSON objects. */
const records = (f: FakeIO): Array<Record<string, unknown>> => f.stderr.lines().map((l) => JSON.parse(l) as Record<string, unknown>);

t.test('help and version: exit 0, on stdout', async (t) => {
  const h = await run(t, 'kpng-callout', ['--help']);
  t.equal(h.code, 0);
  t.match(h.stdout.text(), /^Usage: kpng-callout /);
  t.equal(h.stderr.text(), '');
  const v = await run(t, 'kpng-json', ['replay', '--version']);
  t.equal(v.code, 0);
  t.equal(v.stdout.text(), `${readVersion()}\n`);
});

t.test('usage errors: exit 2, `tool: message` and a pointer to --help', async (t) => {
  const cases: Array<[Tool, string[], string, string]> = [
    ['kpng-callout', ['--frobnicate'], "kpng-callout: unknown option '--frobnicate'", '(run kpng-callout --help for usage)'],
    ['kpng-json', ['replay', '--frobnicate', blogJsonlPath], "kpng-json: unknown option '--frobnicate'", '(run kpng-json replay --help for usage)'],
    ['kpng-callout', ['--debounce', 'fast'], 'kpng-callout: --debounce "fast": expected a duration such as 100ms, 1s, 1m30s (or 0)', '(run kpng-callout --help for usage)'],
    ['kpng-callout', ['--once-timeout', '1s'], 'kpng-callout: --once-timeout needs --once', '(run kpng-callout --help for usage)'],
    ['kpng-json', ['replay', '-', '-'], 'kpng-json: - (stdin) can be given only once', '(run kpng-json replay --help for usage)'],
    ['kpng-callout', ['kube', '--debounce', 'fast'], 'kpng-callout: --debounce "fast": expected a duration such as 100ms, 1s, 1m30s (or 0)', '(run kpng-callout kube --help for usage)'],
    ['kpng-callout', ['replay', '--watch-interval', '2s', blogJsonlPath], 'kpng-callout: --watch-interval needs --watch-poll', '(run kpng-callout replay --help for usage)'],
    // A root option given before a subcommand: the root's help lists it.
    ['kpng-callout', ['--api', '127.0.0.1:1', 'replay', blogJsonlPath], 'kpng-callout: --api is an option of the kpng source (no command), not of replay', '(run kpng-callout --help for usage)'],
    ['kpng-json', ['reply'], "kpng-json: unknown command 'reply' (did you mean replay?); commands: kube, replay, or none for a kpng controller", '(run kpng-json --help for usage)'],
  ];
  for (const [tool, args, message, hint] of cases) {
    const r = await run(t, tool, args);
    t.equal(r.code, 2, `${tool} ${args.join(' ')}: exit 2`);
    t.same(r.stderr.lines(), [message, hint], `${tool} ${args.join(' ')}: message`);
    t.equal(r.stdout.text(), '');
  }
});

t.test('--log-format json: fatal errors, command-line ones included, are JSON lines', async (t) => {
  const forms: string[][] = [
    ['--log-format', 'json', '--debounce', 'fast'],
    ['--log-format=json', '--debounce', 'fast'],
    ['replay', '--log-format', 'json', '--debounce', 'fast', blogJsonlPath],
  ];
  for (const args of forms) {
    const r = await run(t, 'kpng-callout', args);
    t.equal(r.code, 2, args.join(' '));
    const recs = records(r);
    t.match(recs, [
      { level: 'error', msg: /^--debounce "fast": expected a duration/ },
      { level: 'info', msg: `(run kpng-callout${args[0] === 'replay' ? ' replay' : ''} --help for usage)` },
    ]);
    t.equal(recs.length, 2);
    for (const rec of recs) t.match(rec.time, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, 'an ISO time');
  }
  const u = await run(t, 'kpng-json', ['--log-format', 'json', '--nope']);
  t.equal(u.code, 2);
  t.match(records(u), [{ level: 'error', msg: "unknown option '--nope'" }, { level: 'info' }], "commander's own messages too");
  const c = await run(t, 'kpng-callout', ['--log-format', 'json', '--callout', join(dir, 'missing')]);
  t.equal(c.code, 127);
  t.match(records(c), [{ level: 'error', msg: /^callout .*missing: not found/ }]);
  const after = await run(t, 'kpng-callout', ['--', '--log-format', 'json']);
  t.equal(after.code, 2);
  t.match(after.stderr.lines()[0], /^kpng-callout: unknown command '--log-format'/, 'after --, it is an argument, not the format');
});

t.test('a callout that cannot run: its CalloutError asks for 127 or 126, without a --help pointer', async (t) => {
  const api = ['--api', '127.0.0.1:1'];
  const missing = await run(t, 'kpng-callout', [...api, '--callout', join(dir, 'missing')]);
  t.equal(missing.code, 127);
  t.match(missing.stderr.lines(), [/^kpng-callout: callout .*missing: not found/]);
  t.notMatch(missing.stderr.text(), /--help/);
  const notExec = await run(t, 'kpng-callout', [...api, '--callout', shScript(dir, 'noexec.sh', 'cat\n', 0o644)]);
  t.equal(notExec.code, 126);
  const isDir = await run(t, 'kpng-callout', [...api], { env: { PATH: process.env.PATH, CALLOUT: dir } });
  t.equal(isDir.code, 126);
  t.match(isDir.stderr.text(), /is a directory/);
});

t.test('input and io errors: exit 1, said without a --help pointer', async (t) => {
  const bad = join(dir, 'bad.jsonl');
  writeFileSync(bad, '{"Service":\n');
  const i = await run(t, 'kpng-json', ['replay', bad]);
  t.equal(i.code, 1);
  t.match(i.stderr.text(), new RegExp(`\\nkpng-json: ${bad}:`));
  t.notMatch(i.stderr.text(), /--help/);

  const port = await heldPort(t);
  const io = await run(t, 'kpng-json', ['replay', '--metrics-addr', `127.0.0.1:${port}`, blogJsonlPath]);
  t.equal(io.code, 1);
  t.match(io.stderr.text(), new RegExp(`kpng-json: --metrics-addr 127\\.0\\.0\\.1:${port}: cannot listen: .*EADDRINUSE`));
  t.notMatch(io.stderr.text(), /--help/);
  t.equal(io.stdout.text(), '', 'nothing ran');
});

t.test("the pipeline's status is the exit code", async (t) => {
  const ok = await run(t, 'kpng-json', ['-q', 'replay', blogJsonlPath]);
  t.equal(ok.code, 0);
  t.equal(ok.stdout.text(), blogJsonl);
  t.equal(ok.stderr.text(), '');
  const fails = shScript(dir, 'fails.sh', 'cat >/dev/null; exit 3\n');
  const f = await run(t, 'kpng-callout', ['-q', 'replay', '--callout', fails, blogJsonlPath]);
  t.equal(f.code, 3, "the callout's status");
  const stdin = await run(t, 'kpng-callout', ['-q', 'replay', '--callout', '/bin/cat', '-'], { stdin: blogJsonl });
  t.equal(stdin.code, 0);
  t.equal(stdin.stdout.text(), blogJsonl, "replay - reads the stand-in's stdin");
});

t.test('a stdout already closed: the pipeline stops quietly and main still exits 0', async (t) => {
  const stdout = collector();
  stdout.destroy();
  const r = await run(t, 'kpng-json', ['replay', blogJsonlPath], { stdout });
  t.equal(r.code, 0);
  t.notMatch(r.stderr.text(), /error|warn/);
});

t.test('anything else is an internal error: its stack, exit 70', async (t) => {
  const env = new Proxy<NodeJS.ProcessEnv>(
    { PATH: process.env.PATH },
    {
      get(target, prop) {
        if (prop === 'NODE_NAME') throw new Error('boom in the environment');
        return target[prop as string];
      },
    },
  );
  const r = await run(t, 'kpng-json', ['replay', blogJsonlPath], { env });
  t.equal(r.code, 70);
  t.match(r.stderr.lines()[0], /^kpng-json: internal error: Error: boom in the environment$/);
  t.match(r.stderr.lines()[1], /^\s+at /, 'with its stack');
});

t.test("Node's warnings come through our output; the TLS ServerName one (DEP0123) is dropped", async (t) => {
  const warning = (name: string, code: string, message: string): Error => Object.assign(new Error(message), { name, code });
  for (const format of ['text', 'json'] as const) {
    const f = fakeIO({ tool: 'kpng-json', args: ['--log-format', format, '--version'] });
    f.proc.on('warning', () => t.fail("Node's own printer must be replaced"));
    await main('kpng-json', f.io);
    await f.proc.exited;
    t.equal(f.proc.listenerCount('warning'), 1, 'ours only');
    f.proc.emit('warning', warning('DeprecationWarning', 'DEP0123', 'Setting the TLS ServerName to an IP address is not permitted'));
    f.proc.emit('warning', warning('DeprecationWarning', 'DEP0999', 'old thing'));
    t.equal(f.stdout.text(), `${readVersion()}\n`);
    if (format === 'text') t.same(f.stderr.lines(), ['kpng-json: warning: DeprecationWarning DEP0999: old thing']);
    else t.match(records(f), [{ level: 'warn', msg: 'DeprecationWarning DEP0999: old thing' }]);
    t.equal(f.stderr.lines().length, 1, `${format}: DEP0123 dropped`);
  }
});

t.test('a stop signal during start-up, before the pipeline handles signals: exit 0 at once, never lost', async (t) => {
  const f = fakeIO({ tool: 'kpng-json', args: ['replay', blogJsonlPath] });
  const done = main('kpng-json', f.io);
  // main has installed its own handler and is parsing the command line: no pipeline yet.
  f.proc.emit('SIGTERM', 'SIGTERM');
  t.equal(await within(f.proc.exited, 'exit on the early SIGTERM'), 0);
  await within(done, 'main to return');
});
