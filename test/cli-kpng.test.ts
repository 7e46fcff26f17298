/**
 * bin/kpng-json against a real localv1 server: the golden fixtures byte for
 * byte, --once, --node-name, --max-msg-size and mutual TLS from files.
 * Runs the built CLI (dist/), as `npm test` builds first.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';
import { makeCerts, opensslMissing } from './helpers/certs.js';
import { serve, type Revision } from './helpers/kpng-server.js';
import { within } from './helpers/sink.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const bin = join(root, 'bin', 'kpng-json');
const compat = join(root, 'fixtures', 'compat');

interface Cli {
  child: ChildProcess;
  stdout(): Buffer;
  stderr(): string;
  /** Resolves when stdout holds at least `n` bytes. */
  waitForStdout(n: number): Promise<Buffer>;
  waitForStderr(re: RegExp): Promise<string>;
  exit: Promise<number | null>;
}

// Every child dies with the test, even when a failure cuts it short: an
// orphaned kpng-json would retry a dead server forever.
const children = new Set<ChildProcess>();
process.on('exit', () => {
  for (const c of children) c.kill('SIGKILL');
});

function kpngJson(t: Test, args: string[]): Cli {
  // tap adds its process-info hooks to the NODE_OPTIONS of every child it
  // sees spawned, and they break the extensionless ESM bin: `env -u` drops
  // them for the real process.
  const env = { ...process.env, NODE_NAME: '' };
  const child = spawn('env', ['-u', 'NODE_OPTIONS', process.execPath, bin, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env });
  const out: Buffer[] = [];
  let err = '';
  child.stdout!.on('data', (b: Buffer) => {
    out.push(b);
    child.emit('out');
  });
  child.stderr!.on('data', (b: Buffer) => {
    err += b.toString();
    child.emit('err');
  });
  children.add(child);
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  let exited = false;
  const exit = once(child, 'exit').then(([code]) => {
    exited = true;
    children.delete(child);
    return code as number | null;
  });
  // Waits for one more event, failing (not spinning) once the process is gone.
  const next = async (event: string, what: string): Promise<void> => {
    if (exited) throw new Error(`kpng-json exited while ${what}; stderr: ${err}`);
    await within(Promise.race([once(child, event), exit]), `${what}; stderr: ${err}`, WAIT_MS);
  };
  return {
    child,
    stdout: () => Buffer.concat(out),
    stderr: () => err,
    exit,
    async waitForStdout(n) {
      while (Buffer.concat(out).length < n) await next('out', `waiting for ${n} bytes on stdout`);
      return Buffer.concat(out);
    },
    async waitForStderr(re) {
      while (!re.test(err)) await next('err', `waiting for ${re} on stderr`);
      return err;
    },
  };
}

// Generous: a guard against a hang, not a timing assertion (node startup on
// a loaded 2-CPU machine can take seconds).
const WAIT_MS = 30_000;
const exited = (cli: Cli): Promise<number | null> => within(cli.exit, 'waiting for exit', WAIT_MS);

const cases = readdirSync(compat)
  .filter((f) => f.endsWith('.ops.json'))
  .map((f) => f.slice(0, -'.ops.json'.length))
  .sort();

t.test('prints every golden case byte for byte', async (t) => {
  // Three cases at a time, each its own server and process.
  const run = async (name: string): Promise<void> => {
    const ops = JSON.parse(readFileSync(join(compat, `${name}.ops.json`), 'utf8')) as { revisions: Revision[] };
    const expected = readFileSync(join(compat, `${name}.expected.jsonl`));
    const server = await serve(t, ops.revisions);
    const cli = kpngJson(t, ['--api', server.address, '--node-name', 'node-1', '--error-delay', '10ms']);
    const got = await cli.waitForStdout(expected.length);
    await server.waitForRequests(ops.revisions.length + 1); // asked for more
    cli.child.kill('SIGTERM');
    t.equal(await exited(cli), 0, `${name}: exit 0 on SIGTERM`);
    t.ok(got.equals(expected) && cli.stdout().equals(expected), `${name}: byte-identical stdout`);
    t.notMatch(cli.stderr(), /warn|error/, `${name}: no warnings`);
    t.ok(server.requests.every((r) => r.NodeName === 'node-1'), `${name}: NodeName sent`);
  };
  for (let i = 0; i < cases.length; i += 3) await Promise.all(cases.slice(i, i + 3).map(run));
});

t.test('--once prints the first state and exits 0; --node-name is sent', async (t) => {
  const ops = JSON.parse(readFileSync(join(compat, 'revisions.ops.json'), 'utf8')) as { revisions: Revision[] };
  const first = readFileSync(join(compat, 'revisions.expected.jsonl'), 'utf8').split('\n').slice(0, 2).join('\n') + '\n';
  const server = await serve(t, ops.revisions);
  const cli = kpngJson(t, ['--api', server.address, '--node-name', 'worker-3', '--once']);
  t.equal(await exited(cli), 0);
  t.equal(cli.stdout().toString(), first);
  t.equal(server.requests[0]?.NodeName, 'worker-3');
  t.equal(server.requests.length, 1);
});

t.test('--max-msg-size: a clear error, then reconnects', async (t) => {
  const big: Revision = [{ op: 'set', set: 'services', path: 'default/big', value: { Namespace: 'default', Name: 'big', Annotations: { a: 'x'.repeat(4096) } } }];
  const server = await serve(t, [big, big]);
  const cli = kpngJson(t, ['--api', server.address, '--node-name', 'n', '--max-msg-size', '1KiB', '--error-delay', '10ms']);
  const err = await cli.waitForStderr(/reconnecting/);
  t.match(err, /kpng-json warn: stream to 127\.0\.0\.1:\d+ failed: RESOURCE_EXHAUSTED: .*a message exceeded --max-msg-size \(1024 bytes\), raise --max-msg-size; reconnecting in 10ms/);
  await server.waitForStreams(2);
  cli.child.kill('SIGTERM');
  t.equal(await exited(cli), 0);
  t.equal(cli.stdout().length, 0, 'nothing printed');
});

const noOpenssl = opensslMissing();
if (noOpenssl) t.comment(`skipping the TLS test: ${noOpenssl}`);

t.test('mutual TLS from --tls-ca, --tls-crt, --tls-key', { skip: noOpenssl ?? false }, async (t) => {
  const certs = makeCerts();
  t.teardown(() => certs.cleanup());
  const rev: Revision = [{ op: 'set', set: 'services', path: 'default/a', value: { Namespace: 'default', Name: 'a' } }];
  const server = await serve(t, [rev], { key: certs.serverKey, cert: certs.serverCert, ca: certs.ca, requireClientCert: true });
  const f = (n: string): string => join(certs.dir, n);
  const cli = kpngJson(t, ['--api', server.address, '--node-name', 'n', '--once', '--tls-ca', f('ca.crt'), '--tls-crt', f('client.crt'), '--tls-key', f('client.key')]);
  t.equal(await exited(cli), 0);
  t.equal(cli.stdout().toString(), '{"Service":{"Namespace":"default","Name":"a","SessionAffinity":null},"Endpoints":null}\n');
});
