/**
 * bin/kpng-callout against a real localv1 server on loopback: --once output
 * and exit statuses, option errors, signals, and a server restart that must
 * never produce a run on a partial or empty state.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t from 'tap';
import { runBin } from './helpers/bin-process.js';
import { shScript, tempDir } from './helpers/files.js';
import { serve, type Revision } from './helpers/kpng-server.js';
import { pidAlive } from './helpers/procs.js';
import { within } from './helpers/sink.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const compat = join(root, 'fixtures', 'compat');
const blog = JSON.parse(readFileSync(join(compat, 'blog-example.ops.json'), 'utf8')) as { revisions: Revision[] };
const blogExpected = readFileSync(join(compat, 'blog-example.expected.jsonl'), 'utf8');

const dir = tempDir(t, 'kpng-cli-callout-');

const script = (name: string, body: string): string => shScript(dir, name, body);

const WAIT = 30_000;


t.test('CALLOUT=cat --once prints the state byte for byte and exits 0', async (t) => {
  const server = await serve(t, blog.revisions);
  const p = runBin(t, 'kpng-callout', ['--api', server.address, '--node-name', 'vm-002', '--once'], { env: { CALLOUT: 'cat' } });
  t.equal(await within(p.done, 'exit', WAIT), 0);
  t.equal(p.stdout.join('\n') + '\n', blogExpected);
  t.equal(server.requests[0]?.NodeName, 'vm-002', 'the node name is sent');
});

t.test('--once exits with the callout status; timeout, ENOENT and EACCES map to 124, 127, 126', async (t) => {
  const server = await serve(t, [blog.revisions[0]!, blog.revisions[0]!, blog.revisions[0]!, blog.revisions[0]!]);
  const cases: Array<[string, string[], number, RegExp]> = [
    ['exit 3', ['--callout', script('fail3', 'cat >/dev/null; echo "boom" >&2; exit 3\n')], 3, /callout run 1 failed: exit status 3/],
    ['timeout', ['--callout', script('hang', 'exec sleep 30\n'), '--timeout', '200ms'], 124, /timed? ?out/i],
    ['ENOENT', ['--callout', join(dir, 'nope')], 127, /not found \(ENOENT\)/],
    ['EACCES', ['--callout', (() => { const p = join(dir, 'noexec'); writeFileSync(p, 'x'); return p; })()], 126, /EACCES/],
  ];
  for (const [name, args, code, log] of cases) {
    const p = runBin(t, 'kpng-callout', ['--api', server.address, '--once', ...args]);
    t.equal(await within(p.done, `exit of ${name}`, WAIT), code, name);
    t.match(p.stderr.join('\n'), log, `${name}: logged`);
    t.notMatch(p.stderr.join('\n'), /\n\s+at /, `${name}: no stack trace`);
  }
});

t.test('option errors name the option, what was given and expected; exit 2', async (t) => {
  const cases: Array<[string[], string]> = [
    [['--api', '127.0.0.1:99999'], 'kpng-callout: --api 127.0.0.1:99999: port out of range 1-65535'],
    [['--api', 'nohost'], 'kpng-callout: --api "nohost": expected HOST:PORT, such as 127.0.0.1:12090 or [::1]:12090'],
    [['--debounce', 'fast'], 'kpng-callout: --debounce "fast": expected a duration such as 100ms, 1s, 1m30s (or 0)'],
    [['--timeout', '0'], 'kpng-callout: --timeout 0: expected a duration above 0'],
    [['--max-msg-size', 'big'], 'kpng-callout: --max-msg-size "big": expected a size in bytes such as 4194304, 4MiB or 512KiB'],
    [['--tls-crt', 'c.pem'], 'kpng-callout: --tls-crt c.pem: mutual TLS needs --tls-key too'],
    [['--tls-ca', join(dir, 'missing.pem')], `kpng-callout: --tls-ca ${join(dir, 'missing.pem')}: cannot read file (ENOENT)`],
  ];
  for (const [args, message] of cases) {
    const p = runBin(t, 'kpng-callout', args);
    t.equal(await within(p.done, args.join(' '), WAIT), 2, args.join(' '));
    t.same(p.stderr, [message, '(run kpng-callout --help for usage)'], args.join(' '));
    t.same(p.stdout, []);
  }
  const u = runBin(t, 'kpng-callout', ['--bogus']);
  t.equal(await within(u.done, 'unknown option', WAIT), 2);
  t.match(u.stderr.join('\n'), /unknown option '--bogus'/);
});

t.test('SIGTERM during a run: the run finishes, exit 0, no process left', async (t) => {
  const server = await serve(t, blog.revisions);
  const flag = join(dir, 'term-go');
  // The callout reports its pid, then waits for the test to let it finish.
  const slow = script('slow', `cat >/dev/null; echo "pid $$" >&2; while [ ! -e '${flag}' ]; do sleep 0.05; done; echo finished\n`);
  const p = runBin(t, 'kpng-callout', ['--api', server.address, '--callout', slow, '--debounce', '0']);
  const pid = Number((await p.line('stderr', /pid \d+/)).replace(/.*pid (\d+).*/, '$1'));
  p.proc.kill('SIGTERM');
  await p.line('stderr', /SIGTERM: stopping/);
  writeFileSync(flag, '');
  t.equal(await within(p.done, 'exit after SIGTERM', WAIT), 0);
  t.ok(p.stdout.includes('finished'), 'the in-flight run completed');
  t.notOk(pidAlive(pid), 'the callout is gone');
});

t.test('a second SIGINT kills the callout group at once', async (t) => {
  const server = await serve(t, blog.revisions);
  const stubborn = script('stubborn', `trap '' TERM INT; cat >/dev/null; sleep 30 & echo "pid $$ child $!" >&2; wait\n`);
  const p = runBin(t, 'kpng-callout', ['--api', server.address, '--callout', stubborn, '--debounce', '0']);
  const m = /pid (\d+) child (\d+)/.exec(await p.line('stderr', /pid \d+ child \d+/))!;
  p.proc.kill('SIGINT');
  await p.line('stderr', /SIGINT: stopping/);
  p.proc.kill('SIGINT');
  t.equal(await within(p.done, 'exit after the second SIGINT', WAIT), 130);
  // The kill is SIGKILL to the whole group: poll briefly for the kernel to reap.
  const gone = async (pid: number) => {
    for (let i = 0; i < 100 && pidAlive(pid); i++) await new Promise((r) => setTimeout(r, 20));
    return !pidAlive(pid);
  };
  t.ok(await gone(Number(m[1])), 'the callout is gone');
  t.ok(await gone(Number(m[2])), 'its child is gone');
});

t.test('a server restart never gives a run on a partial or empty state', async (t) => {
  const svc = (n: string): Revision[number] => ({ op: 'set', set: 'services', path: `default/${n}`, value: { Namespace: 'default', Name: n, Type: 'ClusterIP' } });
  const full: Revision = [svc('a'), svc('b'), svc('c')];
  const server = await serve(t, [full]);
  const log = join(dir, 'restart.log');
  const counter = script('count', `n=$(wc -l); echo "lines=$n" >> '${log}'; echo "ran lines=$n"\n`);
  const p = runBin(t, 'kpng-callout', ['--api', server.address, '--callout', counter, '--debounce', '0', '--error-delay', '20ms', '-v']);
  t.teardown(() => { if (t.passing()) return; console.error(p.stderr.join('\n')); });
  await p.line('stdout', /ran lines=3/);
  // The server dies; the new stream first sends part of the state and stalls
  // mid-diff (no Sync), then dies again, then finally sends everything.
  await server.kill();
  server.push([svc('a'), { op: 'stall' }]);
  await server.restart();
  await server.waitForRequests(3); // stream 1 asked twice; stream 2 got the stalled half
  await server.kill();
  server.push([...full, { op: 'set', set: 'services', path: 'default/d', value: { Namespace: 'default', Name: 'd' } }]);
  await server.restart();
  await p.line('stdout', /ran lines=4/);
  p.proc.kill('SIGTERM');
  t.equal(await within(p.done, 'exit', WAIT), 0);
  const runs = readFileSync(log, 'utf8').trim().split('\n');
  t.same(runs, ['lines=3', 'lines=4'], 'only complete states were run');
  t.match(p.stderr.join('\n'), /stream to 127\.0\.0\.1:\d+ failed/);
});
