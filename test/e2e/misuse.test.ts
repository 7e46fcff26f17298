/**
 * The bins under misuse, as a new user meets them (issue: mature Unix tool):
 * a closed stdout, JSON logs, signals, a callout that cannot run, mistyped
 * commands, conflicting flags, --once-timeout, help. Real processes, waits on
 * output markers and exits, never on fixed sleeps.
 */
import { mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { runBin } from '../helpers/bin-process.js';
import { shScript, tempDir } from '../helpers/files.js';
import { bigBlogFixture, blogJsonlPath, repoPath } from '../helpers/fixtures.js';
import { heldPort } from '../helpers/ports.js';
import { pidAlive, waitGone } from '../helpers/procs.js';

const dir = tempDir(t, 'kpng-e2e-misuse-');

/** Runs a bin with its stdout read by a consumer that takes one line and closes the pipe, as `| head -1` does. */
async function headOne(t: Test, tool: string, args: string[]): Promise<{ code: number | null; stderr: string; first: string }> {
  const p = runBin(t, tool, args);
  const first = await p.line('stdout', /^/, 'the first line');
  p.proc.stdout!.destroy();
  const code = await p.exited(`${tool} to exit after its reader left`);
  return { code, stderr: p.stderr.join('\n'), first };
}

t.test('a closed stdout ends the run quietly and stops the callout (| head -1)', async (t) => {
  const big = bigBlogFixture(dir, 3000);
  const r = await headOne(t, 'kpng-callout', ['replay', '--callout', '/bin/cat', big]);
  t.match(r.first, /^\{"Service"/);
  t.equal(r.code, 0, 'exit 0');
  t.notMatch(r.stderr, /EPIPE|Unhandled|\n\s+at /, 'no crash, no stack trace');

  // A callout that would write for ever: it must be stopped, not left running.
  const pidFile = join(dir, 'yes.pid');
  const yes = shScript(dir, 'yes-callout', `echo $$ > ${pidFile}\nexec yes\n`);
  const r2 = await headOne(t, 'kpng-callout', ['replay', '--callout', yes, blogJsonlPath]);
  t.equal(r2.code, 0);
  const pid = Number(readFileSync(pidFile, 'utf8'));
  await waitGone(pid);
  t.pass('the callout was stopped');

  const r3 = await headOne(t, 'kpng-json', ['replay', big]);
  t.equal(r3.code, 0, 'kpng-json too');
  t.notMatch(r3.stderr, /EPIPE|\n\s+at /);
});

t.test('--log-format json: every stderr line is JSON, callout lines and startup errors included', async (t) => {
  const cb = shScript(dir, 'chatty', 'cat >/dev/null; echo "to stderr <&> \\"quoted\\""  >&2; echo second >&2\n');
  const p = runBin(t, 'kpng-callout', ['replay', '--log-format', 'json', '--callout', cb, blogJsonlPath]);
  t.equal(await p.exited(), 0);
  const recs = p.stderr.map((l) => JSON.parse(l) as Record<string, unknown>);
  t.ok(recs.length >= 3);
  const lines = recs.filter((r) => r.stream === 'stderr');
  t.same(
    lines.map((r) => [r.run, r.msg]),
    [
      [1, 'to stderr <&> "quoted"'],
      [1, 'second'],
    ],
  );

  // No Kubernetes configuration at all: a startup error, as JSON.
  const home = join(dir, 'empty-home');
  mkdirSync(home, { recursive: true });
  const k = runBin(t, 'kpng-json', ['kube', '--log-format', 'json'], { env: { HOME: home } });
  t.equal(await k.exited(), 1);
  t.ok(k.stderr.length > 0);
  for (const l of k.stderr) t.doesNotThrow(() => JSON.parse(l), `JSON: ${l}`);

  // A command-line error too.
  const u = runBin(t, 'kpng-callout', ['--log-format', 'json', '--debounce', 'fast']);
  t.equal(await u.exited(), 2);
  for (const l of u.stderr) t.doesNotThrow(() => JSON.parse(l), `JSON: ${l}`);
  t.match(JSON.parse(u.stderr[0]!), { level: 'error', msg: /--debounce "fast"/ });
});

t.test('SIGHUP is a stop like SIGTERM: exit 0, the callout and its children gone', async (t) => {
  const pidFile = join(dir, 'hup.pids');
  const cb = shScript(dir, 'hup-callout', `cat >/dev/null; sleep 1000 & echo "$$ $!" > ${pidFile}; echo started >&2; wait\n`);
  const p = runBin(t, 'kpng-callout', ['replay', '--watch', '--callout', cb, blogJsonlPath]);
  await p.line('stderr', /\[run 1\] started/);
  const pids = readFileSync(pidFile, 'utf8').trim().split(' ').map(Number);
  p.proc.kill('SIGHUP');
  t.equal(await p.exited(), 0);
  for (const pid of pids) t.notOk(pidAlive(pid), `pid ${pid} gone`);
});

t.test('a callout that cannot run is reported at startup with 127/126 and a helpful message', async (t) => {
  // An unreachable kpng API: without the startup check this would wait for ever.
  const api = ['--api', '127.0.0.1:1'];
  const cases: Array<[string, string[], NodeJS.ProcessEnv, number, RegExp]> = [
    ['missing path', ['--callout', join(dir, 'nope')], {}, 127, /not found/],
    ['arguments in $CALLOUT', [], { CALLOUT: 'jq -c .' }, 127, /wrapper script/],
    ['a directory', ['--callout', dir], {}, 126, /is a directory/],
  ];
  shScript(dir, 'summary.sh', 'cat\n');
  cases.push(['bare name in cwd', ['--callout', 'summary.sh'], {}, 127, /\.\/summary\.sh/]);
  shScript(dir, 'noexec', '', 0o644);
  cases.push(['not executable', ['--callout', join(dir, 'noexec')], {}, 126, /chmod \+x|not executable/]);
  for (const [name, args, env, code, re] of cases) {
    const p = runBin(t, 'kpng-callout', [...api, ...args], { env, cwd: dir });
    t.equal(await p.exited(`exit of ${name}`), code, `${name}: exit ${code}`);
    t.match(p.stderr.join('\n'), re, `${name}: message`);
    t.match(p.stderr[0], /^kpng-callout: /, `${name}: our prefix`);
  }
});

t.test('a mistyped command says unknown command and suggests the right one', async (t) => {
  const r = runBin(t, 'kpng-callout', ['reply', 'fixtures/']);
  t.equal(await r.exited(), 2);
  t.match(r.stderr.join('\n'), /unknown command 'reply' \(did you mean replay\?\)/);
  t.notMatch(r.stderr.join('\n'), /too many arguments/);
  const h = runBin(t, 'kpng-json', ['help']);
  t.equal(await h.exited(), 2);
  t.match(h.stderr.join('\n'), /unknown command 'help' \(did you mean --help\?\)/);
});

t.test('flags: -v with -q, --once-timeout without --once, an unknown option: exit 2 with our prefix', async (t) => {
  const cases: Array<[string[], RegExp]> = [
    [['-v', '-q', 'replay', blogJsonlPath], /^kpng-callout: -q \(--quiet\) and -v \(--verbose\) exclude each other/],
    [['--once-timeout', '1s'], /^kpng-callout: --once-timeout needs --once/],
    [['--frobnicate'], /^kpng-callout: unknown option '--frobnicate'/],
    [['replay', '--watch-poll', blogJsonlPath], /^kpng-callout: --watch-poll needs --watch/],
    [['replay', '--watch', '--watch-interval', '2s', blogJsonlPath], /^kpng-callout: --watch-interval needs --watch-poll/],
    [['--api', '127.0.0.1:1', 'replay', blogJsonlPath], /^kpng-callout: --api is an option of the kpng source \(no command\), not of replay/],
  ];
  for (const [args, re] of cases) {
    const p = runBin(t, 'kpng-callout', args);
    t.equal(await p.exited(), 2, args.join(' '));
    t.match(p.stderr[0], re);
  }
});

t.test('common options given before the command name apply to it', async (t) => {
  const p = runBin(t, 'kpng-json', ['--node-name', 'vm-002', '-q', 'replay', blogJsonlPath]);
  t.equal(await p.exited(), 0);
  t.same(p.stderr, [], '-q before replay applies');
  const v = runBin(t, 'kpng-json', ['--node-name', 'vm-002', 'replay', blogJsonlPath]);
  t.equal(await v.exited(), 0);
  t.match(v.stderr[0], /node=vm-002/, '--node-name before replay applies');
});

t.test('--version on every command; a startup line names version, source, node and callout', async (t) => {
  const version = (JSON.parse(readFileSync(repoPath('package.json'), 'utf8')) as { version: string }).version;
  for (const args of [['--version'], ['replay', '--version'], ['kube', '-V']]) {
    const p = runBin(t, 'kpng-json', args);
    t.equal(await p.exited(), 0);
    t.same(p.stdout, [version], args.join(' '));
  }
  const p = runBin(t, 'kpng-callout', ['replay', '--node-name', 'vm-002', '--callout', '/bin/true', blogJsonlPath]);
  t.equal(await p.exited(), 0);
  const first = p.stderr[0] ?? '';
  t.match(first, new RegExp(`kpng-callout ${version.replaceAll('.', '\\.')} starting`));
  t.match(first, /source=replay/);
  t.match(first, /node=vm-002/);
  t.match(first, /callout=\/bin\/true/);
  t.match(first, new RegExp(`nodejs=${process.version}`));
});

t.test('-vv logs every delivered state; -v does not', async (t) => {
  const vv = runBin(t, 'kpng-json', ['replay', '-vv', blogJsonlPath]);
  t.equal(await vv.exited(), 0);
  t.match(vv.stderr.join('\n'), /state received services=1/);
  const v = runBin(t, 'kpng-json', ['replay', '-v', blogJsonlPath]);
  t.equal(await v.exited(), 0);
  t.notMatch(v.stderr.join('\n'), /state received/);
});

t.test('--once-timeout ends a wait on an unreachable source with exit 1', async (t) => {
  const p = runBin(t, 'kpng-json', ['--api', '127.0.0.1:1', '--once', '--once-timeout', '300ms', '--error-delay', '50ms']);
  t.equal(await p.exited(), 1);
  t.match(p.stderr.join('\n'), /kpng-json: --once-timeout: no complete state from the kpng source within 300ms/);
});

t.test('a port in use on --metrics-addr is not a usage error: exit 1, no --help hint', async (t) => {
  const port = await heldPort(t);
  const p = runBin(t, 'kpng-json', ['replay', '--metrics-addr', `127.0.0.1:${port}`, blogJsonlPath]);
  t.equal(await p.exited(), 1);
  const err = p.stderr.join('\n');
  t.match(err, new RegExp(`kpng-json: --metrics-addr 127\\.0\\.0\\.1:${port}: cannot listen`));
  t.match(err, /EADDRINUSE/);
  t.notMatch(err, /--help/);
});

t.test('--help lists exit codes, environment and durations; kpng-json never mentions a callout', async (t) => {
  for (const tool of ['kpng-callout', 'kpng-json']) {
    for (const args of [['--help'], ['replay', '--help'], ['kube', '--help']]) {
      const p = runBin(t, tool, args);
      t.equal(await p.exited(), 0);
      const help = p.stdout.join('\n');
      t.match(help, /Exit status:/, `${tool} ${args.join(' ')}`);
      t.match(help, /Environment:/);
      t.match(help, /Durations are Go-style/);
      if (tool === 'kpng-json') t.notMatch(help, /callout/i, 'kpng-json help: no callout');
      else t.match(help, /CALLOUT/);
    }
  }
});
