/**
 * The metrics HTTP server on loopback: /metrics, /healthz, /readyz, the
 * health-only address, :PORT on every interface, a port in use.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { lstatSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { tempDir } from '../helpers/files.js';
import { heldPort } from '../helpers/ports.js';
import { within } from '../helpers/wait.js';
import { CalloutError } from '../../src/errors.js';
import { createLogger } from '../../src/log.js';
import { Metrics } from '../../src/metrics/metrics.js';
import { serveMetrics } from '../../src/metrics/server.js';
import { parseHostPort } from '../../src/options.js';
import { stateFromItems } from '../../src/state.js';

const state = stateFromItems([{ Service: { Namespace: 'default', Name: 'a' }, Endpoints: [{ IPs: { V4: ['10.0.0.1'] } }] }]);
const addr = (text: string) => parseHostPort('--metrics-addr', text, { allowPortZero: true, allowEmptyHost: true });

t.test('the HTTP server: /metrics, /healthz, /readyz, 404, 405', async (t) => {
  const m = new Metrics({ runner: true });
  const srv = await serveMetrics(m, addr('127.0.0.1:0'));
  t.teardown(() => srv.close());
  t.match(srv.address, /^127\.0\.0\.1:\d+$/);
  const base = `http://${srv.address}`;
  const metrics = await fetch(`${base}/metrics`);
  t.equal(metrics.status, 200);
  t.match(metrics.headers.get('content-type'), /text\/plain/);
  const body = await metrics.text();
  t.match(body, /kpng_callout_runs_total\{result="ok"\} 0/);
  t.match(body, /process_cpu_user_seconds_total/, "Node's default process metrics");
  t.match(body, /nodejs_heap_size_used_bytes/);
  const health = await fetch(`${base}/healthz`);
  t.equal(health.status, 503);
  t.equal(await health.text(), 'source not synced: no complete state yet\n');
  const ready = await fetch(`${base}/readyz`);
  t.equal(ready.status, 503);
  await ready.text();
  m.onState(state);
  const health2 = await fetch(`${base}/healthz`);
  t.equal(health2.status, 200);
  await health2.text();
  t.equal((await fetch(`${base}/nope`)).status, 404);
  t.equal((await fetch(`${base}/metrics`, { method: 'POST' })).status, 405);
});


t.test('a port in use is an io error (exit 1, no usage hint) naming the flag, the address and the errno', async (t) => {
  const m = new Metrics({ runner: true, processMetrics: false });
  const port = await heldPort(t);
  const err = await serveMetrics(m, addr(`127.0.0.1:${port}`)).then(
    () => undefined,
    (e: unknown) => e,
  );
  t.type(err, CalloutError);
  t.equal((err as CalloutError).code, 'io');
  t.match((err as Error).message, new RegExp(`^--metrics-addr 127\\.0\\.0\\.1:${port}: cannot listen: address already in use \\(EADDRINUSE\\); `));
  await t.rejects(serveMetrics(m, addr(`127.0.0.1:${port}`), undefined, { endpoints: 'health' }), {
    code: 'io',
    message: new RegExp(`^--health-addr 127\\.0\\.0\\.1:${port}: cannot listen: address already in use \\(EADDRINUSE\\)`),
  });
  await t.rejects(serveMetrics(m, addr(`127.0.0.1:${port}`), undefined, { flag: '--other' }), { code: 'io', message: /^--other 127\.0\.0\.1:\d+: cannot listen/ });
  // :PORT (every interface) also collides with a port held on one address.
  await t.rejects(serveMetrics(m, addr(`:${port}`)), { code: 'io', message: new RegExp(`^--metrics-addr :${port}: cannot listen: address already in use`) });
});

t.test('a Unix socket in a directory that does not exist: said so (libuv calls it EACCES)', async (t) => {
  const m = new Metrics({ runner: true, processMetrics: false });
  await t.rejects(serveMetrics(m, addr('unix:/nonexistent-kpng-dir/m.sock')), { code: 'io', message: /^--metrics-addr unix:\/nonexistent-kpng-dir\/m\.sock: cannot listen: no such directory \(ENOENT\)$/ });
});

t.test('a Unix socket file left by a killed process is removed and listened on; one in use, or another file, stays', async (t) => {
  const m = new Metrics({ runner: true, processMetrics: false });
  const dir = tempDir(t, 'kpng-metrics-sock-');
  const path = join(dir, 'm.sock');
  // A process that listens there and is killed (SIGKILL: it cannot remove its socket file).
  const holder = spawn(process.execPath, ['-e', `require('node:net').createServer().listen(${JSON.stringify(path)}, () => console.log('up'))`], { stdio: ['ignore', 'pipe', 'inherit'] });
  t.teardown(() => void holder.kill('SIGKILL'));
  await within(once(holder.stdout!, 'data'), 'the holder to listen');
  // While it lives: in use, kept.
  await t.rejects(serveMetrics(m, addr(`unix:${path}`)), { code: 'io', message: /address already in use \(EADDRINUSE\)/ });
  holder.kill('SIGKILL');
  await once(holder, 'exit');
  t.ok(lstatSync(path).isSocket(), 'the socket file stays behind');
  const lines: string[] = [];
  const log = createLogger({ write: (l) => lines.push(l.replace(/\n$/, '')) });
  const srv = await serveMetrics(m, addr(`unix:${path}`), log);
  t.teardown(() => srv.close());
  t.match(lines[0], /info: --metrics-addr unix:.*m\.sock: removed a stale socket file \(no process listened on it\)$/);
  // A regular file is never removed.
  const file = join(dir, 'plain');
  writeFileSync(file, 'x');
  await t.rejects(serveMetrics(m, addr(`unix:${file}`)), { code: 'io', message: /EADDRINUSE/ });
  t.equal(readFileSync(file, 'utf8'), 'x');
});

t.test(':PORT listens on every interface, IPv4 and IPv6 alike', async (t) => {
  const m = new Metrics({ runner: true, processMetrics: false });
  const lines: string[] = [];
  const log = createLogger({ write: (l) => lines.push(l.replace(/\n$/, '')) });
  const srv = await serveMetrics(m, addr(':0'), log);
  t.teardown(() => srv.close());
  t.match(srv.address, /^(\[::\]|0\.0\.0\.0):\d+$/);
  const port = Number(/:(\d+)$/.exec(srv.address)![1]);
  t.match(lines, [/^kpng-callout info: serving \/metrics, \/healthz and \/readyz on http:\/\/(\[::\]|0\.0\.0\.0):\d+ \(every interface\)$/]);
  const v4 = await fetch(`http://127.0.0.1:${port}/metrics`);
  t.equal(v4.status, 200, 'over IPv4 loopback');
  await v4.text();
  if (srv.address.startsWith('[::]')) {
    const v6 = await fetch(`http://[::1]:${port}/readyz`);
    t.equal(v6.status, 503, 'over IPv6 loopback');
    await v6.text();
  } else {
    t.comment('no IPv6 here: listening on 0.0.0.0');
  }
});

t.test("endpoints: 'health' serves /healthz and /readyz only", async (t) => {
  const m = new Metrics({ runner: false, processMetrics: false });
  const lines: string[] = [];
  const log = createLogger({ write: (l) => lines.push(l.replace(/\n$/, '')) });
  const srv = await serveMetrics(m, addr('127.0.0.1:0'), log, { endpoints: 'health' });
  t.teardown(() => srv.close());
  t.match(lines, [/^kpng-callout info: serving \/healthz and \/readyz on http:\/\/127\.0\.0\.1:\d+$/]);
  const base = `http://${srv.address}`;
  const get = async (path: string): Promise<[number, string]> => {
    const res = await fetch(base + path);
    return [res.status, await res.text()];
  };
  t.same(await get('/healthz'), [503, 'source not synced: no complete state yet\n']);
  t.same(await get('/readyz'), [503, 'not ready: no complete state yet\n']);
  t.same(await get('/metrics'), [404, 'not found: try /healthz or /readyz (this is the health address; /metrics is on --metrics-addr)\n']);
  m.onSourceStatus({ connected: true, synced: true, reconnects: 0 });
  m.onState(state);
  t.same(await get('/healthz'), [200, 'source synced\n']);
  t.same(await get('/readyz'), [200, 'ready: a complete state was printed\n']);
  t.equal((await fetch(`${base}/healthz`, { method: 'HEAD' })).status, 200);
});

