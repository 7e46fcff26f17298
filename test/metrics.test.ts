/**
 * Metrics fed with runner events and source status by hand (a manual clock),
 * and the HTTP server on loopback.
 */
import { createServer, type AddressInfo } from 'node:net';
import t, { type Test } from 'tap';
import { CalloutError } from '../src/errors.js';
import { createLogger } from '../src/log.js';
import { Metrics, serveMetrics } from '../src/metrics.js';
import type { RunnerEvent } from '../src/runner.js';
import { stateFromItems } from '../src/state.js';

/** The value of one sample line of the exposition text. */
async function value(m: Metrics, sample: string): Promise<number | undefined> {
  const text = await m.registry.metrics();
  const line = text.split('\n').find((l) => l.startsWith(sample + ' '));
  return line === undefined ? undefined : Number(line.slice(sample.length + 1));
}

const state = stateFromItems([
  { Service: { Namespace: 'default', Name: 'a' }, Endpoints: [{ IPs: { V4: ['10.0.0.1'] } }, { IPs: { V4: ['10.0.0.2'] } }] },
  { Service: { Namespace: 'default', Name: 'b' }, Endpoints: [] },
]);

function harness(runner = true) {
  let now = 1_000_000;
  const m = new Metrics({ runner, processMetrics: false, now: () => now });
  const ev = (e: RunnerEvent): void => m.onRunnerEvent(e);
  return {
    m,
    ev,
    at: (t: number) => (now = t),
  };
}

t.test('runs, durations, pending and programming latency over a failure and its retry', async (t) => {
  const { m, ev, at } = harness();
  t.same(m.health(), { ok: false, reason: 'source not synced: no complete state yet' });
  t.equal(m.readiness().ok, false);

  m.onSourceStatus({ connected: true, synced: false, reconnects: 0 });
  t.match(m.health(), { ok: false, reason: /connected, waiting for the first complete state/ });
  m.onSourceStatus({ connected: true, synced: true, reconnects: 0 });
  m.onState(state);
  t.equal(await value(m, 'kpng_callout_services'), 2);
  t.equal(await value(m, 'kpng_callout_endpoints'), 2);
  t.equal(await value(m, 'kpng_callout_source_connected'), 1);
  t.match(m.health(), { ok: true, reason: /waiting for the first run/ });

  // A change at t=1000; a second one at 1050 coalesces; the run starts at 1150 and fails.
  ev({ type: 'pending-changed', pending: true, pendingSince: 1000, at: 1000 });
  ev({ type: 'pending-changed', pending: true, pendingSince: 1000, at: 1050 });
  t.equal(await value(m, 'kpng_callout_run_pending'), 1);
  ev({ type: 'pending-changed', pending: false, at: 1150 });
  ev({ type: 'run-started', run: 1, reason: 'change', pendingSince: 1000, at: 1150, services: 2, bytes: state.bytes });
  t.equal(await value(m, 'kpng_callout_run_in_progress'), 1);
  t.equal(await value(m, 'kpng_callout_run_pending'), 0);
  ev({ type: 'run-finished', reason: 'change', pendingSince: 1000, at: 1200, run: 1, result: 'failed', exitCode: 3, durationMs: 50, message: 'callout run 1 failed: exit status 3' });
  ev({ type: 'retry-scheduled', run: 1, attempt: 1, delayMs: 1000, at: 1200 });
  at(1500);
  t.equal(await value(m, 'kpng_callout_runs_total{result="failed"}'), 1);
  t.equal(await value(m, 'kpng_callout_retry_backoff_seconds'), 1);
  t.equal(await value(m, 'kpng_callout_run_pending'), 1, 'a scheduled retry is a pending run');
  t.equal(await value(m, 'kpng_callout_consecutive_failures'), 1);
  t.match(m.health(), { ok: true, reason: /retrying after run 1 failed .*retry 1 in 0\.7s/ });
  t.match(m.readiness(), { ok: false, reason: /no successful run yet \(last: run 1 failed\)/ });

  // The retry runs the same state at 2200 and succeeds at 2300: latency counts from 1000.
  ev({ type: 'pending-changed', pending: true, pendingSince: 2200, at: 2200 });
  ev({ type: 'pending-changed', pending: false, at: 2200 });
  ev({ type: 'run-started', run: 2, reason: 'retry', pendingSince: 2200, at: 2200, services: 2, bytes: state.bytes });
  t.match(m.health(), { ok: true, reason: /run 2 in progress after run 1 failed/ });
  ev({ type: 'run-finished', reason: 'retry', pendingSince: 2200, at: 2300, run: 2, result: 'ok', exitCode: 0, durationMs: 100 });
  t.equal(await value(m, 'kpng_callout_programming_latency_seconds_sum'), 1.3);
  t.equal(await value(m, 'kpng_callout_programming_latency_seconds_count'), 1);
  t.ok(Math.abs((await value(m, 'kpng_callout_run_duration_seconds_sum'))! - 0.15) < 1e-9);
  t.equal(await value(m, 'kpng_callout_runs_total{result="ok"}'), 1);
  t.equal(await value(m, 'kpng_callout_last_success_timestamp_seconds'), 2.3);
  t.equal(await value(m, 'kpng_callout_consecutive_failures'), 0);
  t.equal(await value(m, 'kpng_callout_retry_backoff_seconds'), 0);
  t.match(m.health(), { ok: true, reason: 'ok: run 2 succeeded' });
  t.match(m.readiness(), { ok: true, reason: /^ready: first successful run at / });

  // A resync re-runs unchanged input: no latency sample. A skipped run counts as skipped.
  ev({ type: 'pending-changed', pending: true, pendingSince: 5000, at: 5000 });
  ev({ type: 'run-started', run: 3, reason: 'resync', pendingSince: 5000, at: 5000, services: 2, bytes: state.bytes });
  ev({ type: 'run-finished', reason: 'resync', pendingSince: 5000, at: 5100, run: 3, result: 'ok', exitCode: 0, durationMs: 100 });
  t.equal(await value(m, 'kpng_callout_programming_latency_seconds_count'), 1);
  ev({ type: 'pending-changed', pending: true, pendingSince: 6000, at: 6000 });
  ev({ type: 'pending-changed', pending: false, at: 6100 });
  ev({ type: 'run-skipped', reason: 'change', pendingSince: 6000, at: 6100 });
  t.equal(await value(m, 'kpng_callout_runs_total{result="skipped"}'), 1);
  t.equal(await value(m, 'kpng_callout_run_pending'), 0);
});

t.test('health: a failure without retry, an overdue retry, a lost source', async (t) => {
  const { m, ev, at } = harness();
  m.onState(state); // a source without status (replay): synced by its state
  t.equal(await value(m, 'kpng_callout_source_synced'), 1);
  ev({ type: 'run-started', run: 1, reason: 'now', pendingSince: 100, at: 100, services: 2, bytes: 1 });
  t.match(m.health(), { ok: true, reason: 'ok: first run in progress' });
  ev({ type: 'run-finished', reason: 'now', pendingSince: 100, at: 200, run: 1, result: 'timeout', signal: 'SIGTERM', durationMs: 100, message: 'callout run 1 timed out after 100ms; its process group was killed' });
  t.same(m.health(), { ok: false, reason: 'run 1 timeout (callout run 1 timed out after 100ms; its process group was killed); no retry scheduled' });
  ev({ type: 'retry-scheduled', run: 1, attempt: 1, delayMs: 1000, at: 200 });
  at(7000);
  t.match(m.health(), { ok: false, reason: /its retry is overdue by 5\.8s/ });

  const k = harness();
  k.m.onSourceStatus({ connected: false, synced: false, reconnects: 0 });
  k.m.onSourceStatus({ connected: true, synced: true, reconnects: 0 });
  k.m.onSourceStatus({ connected: false, synced: false, reconnects: 0, error: 'UNAVAILABLE: connection refused' });
  k.m.onSourceStatus({ connected: true, synced: true, reconnects: 1 });
  k.m.onSourceStatus({ connected: false, synced: false, reconnects: 1, error: 'UNAVAILABLE: connection refused' });
  t.equal(await value(k.m, 'kpng_callout_source_reconnects_total'), 1);
  t.equal(await value(k.m, 'kpng_callout_source_connected'), 0);
  t.same(k.m.health(), { ok: false, reason: 'source not synced: UNAVAILABLE: connection refused' });
});

t.test('kpng-json: source metrics only; ready once a state was printed', async (t) => {
  const { m } = harness(false);
  t.equal(m.readiness().ok, false);
  m.onSourceStatus({ connected: true, synced: true, reconnects: 0 });
  t.same(m.health(), { ok: true, reason: 'source synced' });
  m.onState(state);
  t.same(m.readiness(), { ok: true, reason: 'ready: a complete state was printed' });
  const text = await m.registry.metrics();
  t.notMatch(text, /kpng_callout_runs_total/);
  t.match(text, /kpng_callout_states_total 1/);
});

t.test('the HTTP server: /metrics, /healthz, /readyz, 404, 405', async (t) => {
  const m = new Metrics({ runner: true });
  const srv = await serveMetrics(m, '127.0.0.1:0');
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

/** A port held by a plain TCP server of this process, as another program would hold it. */
async function heldPort(t: Test, host = '127.0.0.1'): Promise<number> {
  const holder = createServer();
  await new Promise<void>((resolve) => holder.listen(0, host, resolve));
  t.teardown(() => new Promise<void>((resolve) => holder.close(() => resolve())));
  return (holder.address() as AddressInfo).port;
}

t.test('a port in use is an io error (exit 1, no usage hint) naming the flag, the address and the errno', async (t) => {
  const m = new Metrics({ runner: true, processMetrics: false });
  const port = await heldPort(t);
  const err = await serveMetrics(m, `127.0.0.1:${port}`).then(
    () => undefined,
    (e: unknown) => e,
  );
  t.type(err, CalloutError);
  t.equal((err as CalloutError).code, 'io');
  t.match((err as Error).message, new RegExp(`^--metrics-addr 127\\.0\\.0\\.1:${port}: cannot listen: address already in use \\(EADDRINUSE\\); `));
  await t.rejects(serveMetrics(m, `127.0.0.1:${port}`, undefined, { endpoints: 'health' }), {
    code: 'io',
    message: new RegExp(`^--health-addr 127\\.0\\.0\\.1:${port}: cannot listen: address already in use \\(EADDRINUSE\\)`),
  });
  await t.rejects(serveMetrics(m, `127.0.0.1:${port}`, undefined, { flag: '--other' }), { code: 'io', message: /^--other 127\.0\.0\.1:\d+: cannot listen/ });
  // :PORT (every interface) also collides with a port held on one address.
  await t.rejects(serveMetrics(m, `:${port}`), { code: 'io', message: new RegExp(`^--metrics-addr :${port}: cannot listen: address already in use`) });
});

t.test(':PORT listens on every interface, IPv4 and IPv6 alike', async (t) => {
  const m = new Metrics({ runner: true, processMetrics: false });
  const lines: string[] = [];
  const log = createLogger({ write: (l) => lines.push(l.replace(/\n$/, '')) });
  const srv = await serveMetrics(m, ':0', log);
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
  const srv = await serveMetrics(m, '127.0.0.1:0', log, { endpoints: 'health' });
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

t.test('option errors: --metrics-addr, --health-addr, --retry-min, --retry-max', async (t) => {
  const { runBin } = await import('./helpers/bin-process.js');
  const cases: Array<[string, string[], string]> = [
    ['kpng-callout', ['--metrics-addr', 'localhost'], 'kpng-callout: --metrics-addr "localhost": expected HOST:PORT, such as 127.0.0.1:9100, [::1]:9100 or :9100 (every interface)'],
    ['kpng-json', ['--metrics-addr', '127.0.0.1:70000'], 'kpng-json: --metrics-addr 127.0.0.1:70000: port out of range 0-65535'],
    ['kpng-json', ['--health-addr', ':'], 'kpng-json: --health-addr ":": expected HOST:PORT, such as 127.0.0.1:9100, [::1]:9100 or :9100 (every interface)'],
    ['kpng-callout', ['--retry-min', '0'], 'kpng-callout: --retry-min 0: expected a duration above 0'],
    ['kpng-callout', ['--retry-min', '2s', '--retry-max', '1s'], 'kpng-callout: --retry-max 1s: expected at least --retry-min (2s)'],
  ];
  for (const [tool, args, message] of cases) {
    const p = runBin(t, tool, args);
    t.equal(await p.done, 2, `${args.join(' ')}: exit 2`);
    t.equal(p.stderr[0], message);
  }
});

t.test('bins: a port in use exits 1 without a usage hint; :PORT and --health-addr serve', async (t) => {
  const { runBin } = await import('./helpers/bin-process.js');
  const port = await heldPort(t);
  for (const flag of ['--metrics-addr', '--health-addr']) {
    const p = runBin(t, 'kpng-json', ['replay', flag, `127.0.0.1:${port}`, 'fixtures/kpng-example.jsonl']);
    t.equal(await p.done, 1, `${flag}: exit 1`);
    const errors = p.stderr.filter((l) => !/^kpng-json info:/.test(l));
    t.match(errors, [new RegExp(`^kpng-json: ${flag} 127\\.0\\.0\\.1:${port}: cannot listen: address already in use \\(EADDRINUSE\\)`)], flag);
    t.notOk(p.stderr.some((l) => /--help/.test(l)), 'no usage hint');
    t.same(p.stdout, [], 'nothing printed');
  }
  // --metrics-addr on loopback and --health-addr on every interface, as the DaemonSet runs.
  const p = runBin(t, 'kpng-json', ['replay', '--watch', '--metrics-addr', '127.0.0.1:0', '--health-addr', ':0', 'fixtures/kpng-example.jsonl']);
  const healthLine = await p.line('stderr', /serving \/healthz and \/readyz on http:\/\/\S+:\d+ \(every interface\)/);
  const metricsLine = await p.line('stderr', /serving \/metrics, \/healthz and \/readyz on http:\/\/127\.0\.0\.1:\d+$/);
  const healthPort = /:(\d+) \(every interface\)/.exec(healthLine)![1];
  const metricsPort = /:(\d+)$/.exec(metricsLine)![1];
  await p.line('stdout', /"Name"/, 'the state printed');
  const ready = await fetch(`http://127.0.0.1:${healthPort}/readyz`);
  t.equal(ready.status, 200);
  t.equal(await ready.text(), 'ready: a complete state was printed\n');
  t.equal((await fetch(`http://127.0.0.1:${healthPort}/metrics`)).status, 404, 'no metrics on the health address');
  t.equal((await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).status, 200);
});
