/**
 * The kpng source end to end: bin/kpng-json and bin/kpng-callout against a
 * real localv1 server on loopback. kpng-json: the golden fixtures byte for
 * byte, --once, --node-name, --max-msg-size, mutual TLS from files.
 * kpng-callout: --once output and exit statuses, option errors, signals, and a
 * server restart that must never produce a run on a partial or empty state.
 * Runs the built CLI (dist/), as `npm test` builds first.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { runBin } from '../helpers/bin-process.js';
import { makeCerts, opensslMissing } from '../helpers/certs.js';
import { shScript, tempDir } from '../helpers/files.js';
import { compatCase, compatCases } from '../helpers/fixtures.js';
import { serve, type Revision } from '../helpers/kpng-server.js';
import { pidAlive, waitGone } from '../helpers/procs.js';

const { revisions: blog, expected: blogExpected } = compatCase('blog-example');

const dir = tempDir(t, 'kpng-e2e-');
const script = (name: string, body: string): string => shScript(dir, name, body);

t.test('kpng-json prints every golden case byte for byte', async (t) => {
  // Three cases at a time, each its own server and process.
  const run = async (name: string): Promise<void> => {
    const { revisions, expected } = compatCase(name);
    const server = await serve(t, revisions);
    const cli = runBin(t, 'kpng-json', ['--api', server.address, '--node-name', 'node-1', '--error-delay', '10ms']);
    await cli.lines('stdout', expected.toString().split('\n').length - 1, `${name}: every state`);
    await server.waitForRequests(revisions.length + 1); // asked for more
    cli.proc.kill('SIGTERM');
    t.equal(await cli.exited(), 0, `${name}: exit 0 on SIGTERM`);
    t.ok(cli.bytes('stdout').equals(expected), `${name}: byte-identical stdout`);
    t.notMatch(cli.stderr.join('\n'), /warn|error/, `${name}: no warnings`);
    t.ok(server.requests.every((r) => r.NodeName === 'node-1'), `${name}: NodeName sent`);
  };
  const cases = compatCases();
  for (let i = 0; i < cases.length; i += 3) await Promise.all(cases.slice(i, i + 3).map(run));
});

t.test('kpng-json --once prints the first state and exits 0; --node-name is sent', async (t) => {
  const { revisions, expected } = compatCase('revisions');
  const first = expected.toString().split('\n').slice(0, 2).join('\n') + '\n';
  const server = await serve(t, revisions);
  const cli = runBin(t, 'kpng-json', ['--api', server.address, '--node-name', 'worker-3', '--once']);
  t.equal(await cli.exited(), 0);
  t.equal(cli.bytes('stdout').toString(), first);
  t.equal(server.requests[0]?.NodeName, 'worker-3');
  t.equal(server.requests.length, 1);
});

t.test('kpng-json --max-msg-size: a clear error, then reconnects', async (t) => {
  const big: Revision = [{ op: 'set', set: 'services', path: 'default/big', value: { Namespace: 'default', Name: 'big', Annotations: { a: 'x'.repeat(4096) } } }];
  const server = await serve(t, [big, big]);
  const cli = runBin(t, 'kpng-json', ['--api', server.address, '--node-name', 'n', '--max-msg-size', '1KiB', '--error-delay', '10ms']);
  const err = await cli.line('stderr', /reconnecting/);
  t.match(err, /kpng-json warn: stream to 127\.0\.0\.1:\d+ failed: RESOURCE_EXHAUSTED: .*a message exceeded --max-msg-size \(1024 bytes\), raise --max-msg-size; reconnecting in \d+ms/);
  await server.waitForStreams(2);
  cli.proc.kill('SIGTERM');
  t.equal(await cli.exited(), 0);
  t.equal(cli.bytes('stdout').length, 0, 'nothing printed');
});

const noOpenssl = opensslMissing();
if (noOpenssl) t.comment(`skipping the TLS test: ${noOpenssl}`);

t.test('kpng-json: mutual TLS from --tls-ca, --tls-crt, --tls-key', { skip: noOpenssl ?? false }, async (t) => {
  const certs = makeCerts(t);
  const rev: Revision = [{ op: 'set', set: 'services', path: 'default/a', value: { Namespace: 'default', Name: 'a' } }];
  const server = await serve(t, [rev], { key: certs.serverKey, cert: certs.serverCert, ca: certs.ca, requireClientCert: true });
  const f = (n: string): string => join(certs.dir, n);
  const cli = runBin(t, 'kpng-json', ['--api', server.address, '--node-name', 'n', '--once', '--tls-ca', f('ca.crt'), '--tls-crt', f('client.crt'), '--tls-key', f('client.key')]);
  t.equal(await cli.exited(), 0);
  t.equal(cli.bytes('stdout').toString(), '{"Service":{"Namespace":"default","Name":"a","SessionAffinity":null},"Endpoints":null}\n');
});

t.test('kpng-callout: CALLOUT=cat --once prints the state byte for byte and exits 0', async (t) => {
  const server = await serve(t, blog);
  const p = runBin(t, 'kpng-callout', ['--api', server.address, '--node-name', 'vm-002', '--once'], { env: { CALLOUT: 'cat' } });
  t.equal(await p.exited(), 0);
  t.equal(p.bytes('stdout').toString(), blogExpected.toString());
  t.equal(server.requests[0]?.NodeName, 'vm-002', 'the node name is sent');
});

t.test('kpng-callout --once exits with the callout status; timeout, ENOENT and EACCES map to 124, 127, 126', async (t) => {
  const server = await serve(t, [blog[0]!, blog[0]!, blog[0]!, blog[0]!]);
  writeFileSync(join(dir, 'noexec'), 'x');
  const cases: Array<[string, string[], number, RegExp]> = [
    ['exit 3', ['--callout', script('fail3', 'cat >/dev/null; echo "boom" >&2; exit 3\n')], 3, /callout run 1 failed: exit status 3/],
    ['timeout', ['--callout', script('hang', 'exec sleep 30\n'), '--timeout', '200ms'], 124, /timed? ?out/i],
    ['ENOENT', ['--callout', join(dir, 'nope')], 127, /not found \(ENOENT\)/],
    ['EACCES', ['--callout', join(dir, 'noexec')], 126, /EACCES/],
  ];
  for (const [name, args, code, log] of cases) {
    const p = runBin(t, 'kpng-callout', ['--api', server.address, '--once', ...args]);
    t.equal(await p.exited(`exit of ${name}`), code, name);
    t.match(p.stderr.join('\n'), log, `${name}: logged`);
    t.notMatch(p.stderr.join('\n'), /\n\s+at /, `${name}: no stack trace`);
  }
});

t.test('kpng-callout option errors name the option, what was given and expected; exit 2', async (t) => {
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
    t.equal(await p.exited(args.join(' ')), 2, args.join(' '));
    t.same(p.stderr, [message, '(run kpng-callout --help for usage)'], args.join(' '));
    t.same(p.stdout, []);
  }
  const u = runBin(t, 'kpng-callout', ['--bogus']);
  t.equal(await u.exited(), 2);
  t.match(u.stderr.join('\n'), /unknown option '--bogus'/);
});

t.test('kpng-callout: SIGTERM during a run: the run finishes, exit 0, no process left', async (t) => {
  const server = await serve(t, blog);
  const flag = join(dir, 'term-go');
  // The callout reports its pid, then waits for the test to let it finish.
  const slow = script('slow', `cat >/dev/null; echo "pid $$" >&2; while [ ! -e '${flag}' ]; do sleep 0.05; done; echo finished\n`);
  const p = runBin(t, 'kpng-callout', ['--api', server.address, '--callout', slow, '--debounce', '0']);
  const pid = Number((await p.line('stderr', /pid \d+/)).replace(/.*pid (\d+).*/, '$1'));
  p.proc.kill('SIGTERM');
  await p.line('stderr', /SIGTERM: stopping/);
  writeFileSync(flag, '');
  t.equal(await p.exited('exit after SIGTERM'), 0);
  t.ok(p.stdout.includes('finished'), 'the in-flight run completed');
  t.notOk(pidAlive(pid), 'the callout is gone');
});

t.test('kpng-callout: a second SIGINT kills the callout group at once', async (t) => {
  const server = await serve(t, blog);
  const stubborn = script('stubborn', `trap '' TERM INT; cat >/dev/null; sleep 30 & echo "pid $$ child $!" >&2; wait\n`);
  const p = runBin(t, 'kpng-callout', ['--api', server.address, '--callout', stubborn, '--debounce', '0']);
  const m = /pid (\d+) child (\d+)/.exec(await p.line('stderr', /pid \d+ child \d+/))!;
  p.proc.kill('SIGINT');
  await p.line('stderr', /SIGINT: stopping/);
  p.proc.kill('SIGINT');
  t.equal(await p.exited('exit after the second SIGINT'), 130);
  // The kill is SIGKILL to the whole group: the kernel reaps it shortly after.
  await waitGone(Number(m[1]), 2000);
  await waitGone(Number(m[2]), 2000);
  t.pass('the callout and its child are gone');
});

t.test('kpng-callout: a server restart never gives a run on a partial or empty state', async (t) => {
  const svc = (n: string): Revision[number] => ({ op: 'set', set: 'services', path: `default/${n}`, value: { Namespace: 'default', Name: n, Type: 'ClusterIP' } });
  const full: Revision = [svc('a'), svc('b'), svc('c')];
  const server = await serve(t, [full]);
  const log = join(dir, 'restart.log');
  const counter = script('count', `n=$(wc -l); echo "lines=$n" >> '${log}'; echo "ran lines=$n"\n`);
  const p = runBin(t, 'kpng-callout', ['--api', server.address, '--callout', counter, '--debounce', '0', '--error-delay', '20ms', '-v']);
  t.teardown(() => {
    if (!t.passing()) console.error(p.stderr.join('\n'));
  });
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
  t.equal(await p.exited(), 0);
  const runs = readFileSync(log, 'utf8').trim().split('\n');
  t.same(runs, ['lines=3', 'lines=4'], 'only complete states were run');
  t.match(p.stderr.join('\n'), /stream to 127\.0\.0\.1:\d+ failed/);
});
