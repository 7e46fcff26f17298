/**
 * Fault suite, kpng source side: the built bins against a real localv1 server
 * on loopback that is killed and restarted, sends undecodable bytes or
 * messages over --max-msg-size; a callout that fails then recovers, watched
 * through --metrics-addr. Waits on log lines and metrics, never fixed sleeps.
 */
import { join } from 'node:path';
import t from 'tap';
import type { Endpoint, Service } from '../../src/model.js';
import { stateFromItems, stateText } from '../../src/state.js';
import { runBin } from '../helpers/bin-process.js';
import { recordingCallout, shScript, tempDir } from '../helpers/files.js';
import { serve, type ServerOp } from '../helpers/kpng-server.js';
import { check, metricsBase, scrapeUntil } from '../helpers/metrics-http.js';

const dir = tempDir(t, 'kpng-e2e-faults-');


const svc = (name: string): Service => ({ Namespace: 'default', Name: name, Type: 'ClusterIP', IPs: { ClusterIPs: { V4: ['10.96.0.10'] } } });
const ep = (ip: string): Endpoint => ({ IPs: { V4: [ip] }, Scopes: { Internal: true, External: true } });

/** Version `v` of a state: `n` Services with two endpoints each; v changes the addresses. */
function version(n: number, v: number): { ops: ServerOp[]; text: string } {
  const ops: ServerOp[] = [];
  const items = [];
  for (let i = 0; i < n; i++) {
    const name = `s${String(i).padStart(3, '0')}`;
    const eps = [ep(`10.1.${v}.${2 * i}`), ep(`10.1.${v}.${2 * i + 1}`)];
    ops.push({ op: 'set', set: 'services', path: `default/${name}`, value: svc(name) });
    ops.push({ op: 'set', set: 'endpoints', path: `default/${name}/p1`, value: eps[0]! });
    ops.push({ op: 'set', set: 'endpoints', path: `default/${name}/p2`, value: eps[1]! });
    items.push({ Service: svc(name), Endpoints: eps });
  }
  return { ops, text: stateText(stateFromItems(items)) };
}

t.test('the server killed and restarted 20 times in steady state: no run on a partial or empty state, final state exact', async (t) => {
  const server = await serve(t);
  const rec = recordingCallout(dir, 'restarts');
  const complete = new Set<string>();
  let current = version(5, 0);
  complete.add(current.text);
  server.push([{ op: 'reset' }, ...current.ops]);
  const p = runBin(t, 'kpng-callout', ['--api', server.address, '--node-name', 'n', '--callout', rec.path, '--debounce', '0', '--error-delay', '50ms']);
  await p.line('stdout', /^ran 1$/);
  await server.waitForRequests(2); // steady state: the client waits for the next diff
  let runs = 1;
  for (let i = 1; i <= 20; i++) {
    await server.kill();
    if (i % 4 === 0) {
      // The new stream dies mid-diff: half a state, no Sync.
      server.push([{ op: 'reset' }, ...version(3, 99).ops.slice(0, 5), { op: 'stall' }]);
      const before = server.requests.length;
      await server.restart();
      await server.waitForRequests(before + 1);
      await server.kill();
    }
    // Every other restart brings a changed state (a run), the others the same one (no run: skip-identical).
    if (i % 2 === 1) {
      current = version(5 + (i >> 1), i);
      complete.add(current.text);
      runs++;
    }
    server.push([{ op: 'reset' }, ...current.ops]);
    const before = server.requests.length;
    await server.restart();
    await server.waitForRequests(before + 2); // the full state went out and the client asked for more
    if (i % 2 === 1) await p.line('stdout', new RegExp(`^ran ${runs}$`), `run ${runs} after restart ${i}`);
  }
  p.proc.kill('SIGTERM');
  t.equal(await p.exited(), 0);
  const inputs = rec.runs();
  t.equal(inputs.length, runs, 'one run per changed state, none for an identical one');
  t.ok(inputs.every((s) => complete.has(s)), 'every run got a complete state');
  t.equal(inputs.at(-1), current.text, 'the last run got the final state');
  t.ok(server.streams >= 26, `streams: ${server.streams}`);
  t.match(p.stderr.join('\n'), /stream to 127\.0\.0\.1:\d+ failed: .*; reconnecting in \d+ms/);
});

t.test('undecodable bytes: a bad value is skipped and logged; a bad message breaks the stream, logged, and it reconnects', async (t) => {
  const good = version(2, 1);
  const server = await serve(t, [
    // A Value whose bytes do not decode (a truncated string): dropped, logged.
    [{ op: 'reset' }, ...good.ops, { op: 'set', set: 'endpoints', path: 'default/s000/p3', bytes: Uint8Array.of(0x0a, 0x05, 0x61) }],
    // An OpItem that does not decode at all: the stream is unusable.
    [{ op: 'raw', bytes: Uint8Array.of(0x12, 0x7f, 0x01) }],
    [{ op: 'reset' }, ...version(3, 2).ops],
  ]);
  const rec = recordingCallout(dir, 'undecodable');
  const p = runBin(t, 'kpng-callout', ['--api', server.address, '--node-name', 'n', '--callout', rec.path, '--debounce', '0', '--error-delay', '50ms']);
  await p.line('stderr', /cannot decode Endpoint default\/s000\/p3: .*; keeping the value held before/);
  await p.line('stdout', /^ran 1$/);
  await p.line('stderr', /stream to 127\.0\.0\.1:\d+ failed: .*; reconnecting in \d+ms/);
  await p.line('stdout', /^ran 2$/);
  p.proc.kill('SIGTERM');
  t.equal(await p.exited(), 0);
  t.same(rec.runs(), [good.text, version(3, 2).text], 'the bad value skipped, the broken stream never run');
  t.equal(server.streams, 2);
});

t.test('--max-msg-size: a state larger than the limit is fine, a message larger gives a clear error naming the flag', async (t) => {
  // 300 Services: about 45 KB of state, every message well under 16 KiB.
  const big = version(300, 1);
  const huge: ServerOp = { op: 'set', set: 'services', path: 'default/zz', value: { ...svc('zz'), Annotations: { note: 'x'.repeat(20_000) } } };
  const after = version(301, 2);
  const server = await serve(t, [[{ op: 'reset' }, ...big.ops], [huge], [{ op: 'reset' }, ...after.ops]]);
  const rec = recordingCallout(dir, 'msgsize');
  const p = runBin(t, 'kpng-callout', ['--api', server.address, '--node-name', 'n', '--callout', rec.path, '--debounce', '0', '--error-delay', '50ms', '--max-msg-size', '16KiB']);
  await p.line('stdout', /^ran 1$/);
  const err = await p.line('stderr', /RESOURCE_EXHAUSTED/);
  t.match(err, /stream to 127\.0\.0\.1:\d+ failed: RESOURCE_EXHAUSTED: .*a message exceeded --max-msg-size \(16384 bytes\), raise --max-msg-size; reconnecting in \d+ms/);
  await p.line('stdout', /^ran 2$/);
  p.proc.kill('SIGTERM');
  t.equal(await p.exited(), 0);
  const inputs = rec.runs();
  t.ok(Buffer.byteLength(inputs[0]!) > 16384, 'the first state was larger than --max-msg-size');
  t.same(inputs, [big.text, after.text]);
});

t.test('a callout failing 5 times then succeeding: backoff and recovery in /metrics, /healthz, /readyz; the source too', async (t) => {
  const state = version(3, 1);
  const server = await serve(t, [[{ op: 'reset' }, ...state.ops]]);
  const count = join(dir, 'flaky.count');
  const flaky = shScript(dir, 'flaky', `cat >/dev/null; n=$(cat '${count}' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '${count}'; if [ $n -le 5 ]; then echo "failing $n" >&2; exit 1; fi; echo "ok $n"\n`);
  const p = runBin(t, 'kpng-callout', [
    '--api', server.address, '--node-name', 'n', '--callout', flaky, '--debounce', '0', '--error-delay', '50ms',
    '--retry-min', '100ms', '--retry-max', '2s', '--metrics-addr', '127.0.0.1:0', '-v',
  ]);
  const base = await metricsBase(p);

  // Failing: retries scheduled with a growing delay; alive, not ready.
  const failing = await scrapeUntil(base, (m) => (m.get('kpng_callout_retries_total') ?? 0) >= 2 && (m.get('kpng_callout_retry_backoff_seconds') ?? 0) > 0, 'a second retry');
  t.ok(failing.get('kpng_callout_runs_total{result="failed"}')! >= 2, 'failed runs counted');
  t.equal(failing.get('kpng_callout_runs_total{result="ok"}'), 0);
  t.ok(failing.get('kpng_callout_consecutive_failures')! >= 2);
  t.equal(failing.get('kpng_callout_last_run_success'), 0);
  t.equal(failing.get('kpng_callout_services'), 3);
  t.equal(failing.get('kpng_callout_endpoints'), 6);
  t.equal(failing.get('kpng_callout_source_connected'), 1);
  const h = await check(base, '/healthz');
  t.ok(h.status === 200 && /retrying after run \d+ failed|run \d+ in progress after|pending after/.test(h.body), `healthz while retrying: ${h.status} ${h.body}`);
  t.match(await check(base, '/readyz'), { status: 503, body: /not ready: no successful run yet/ });
  const delays = p.stderr.filter((l) => /retrying the callout in \d+ms/.test(l)).map((l) => Number(/in (\d+)ms/.exec(l)![1]));
  t.ok(delays.length >= 2 && delays[1]! > delays[0]!, `the backoff grows: ${delays.join(', ')} ms`);

  // Recovery.
  await p.line('stdout', /^ok 6$/);
  const ok = await scrapeUntil(base, (m) => m.get('kpng_callout_runs_total{result="ok"}') === 1, 'the successful run');
  t.equal(ok.get('kpng_callout_runs_total{result="failed"}'), 5);
  t.equal(ok.get('kpng_callout_retries_total'), 5);
  t.equal(ok.get('kpng_callout_consecutive_failures'), 0);
  t.equal(ok.get('kpng_callout_retry_backoff_seconds'), 0);
  t.equal(ok.get('kpng_callout_run_pending'), 0);
  t.ok(ok.get('kpng_callout_last_success_timestamp_seconds')! > Date.now() / 1000 - 60, 'last success is recent');
  t.equal(ok.get('kpng_callout_programming_latency_seconds_count'), 1);
  // 100 + 200 + 400 + 800 + 1600 ms of backoff, each -20% at worst.
  t.ok(ok.get('kpng_callout_programming_latency_seconds_sum')! >= 2.4, `latency includes the backoff: ${ok.get('kpng_callout_programming_latency_seconds_sum')} s`);
  t.equal(ok.get('kpng_callout_run_duration_seconds_count'), 6);
  t.match(await check(base, '/healthz'), { status: 200, body: /ok: run 6 succeeded/ });
  t.match(await check(base, '/readyz'), { status: 200, body: /^ready: first successful run at / });

  // The source goes away: not healthy (still ready); back: a reconnect counted.
  await server.kill();
  await scrapeUntil(base, (m) => m.get('kpng_callout_source_connected') === 0, 'the source to be disconnected');
  t.match(await check(base, '/healthz'), { status: 503, body: /^source not synced: / });
  t.equal((await check(base, '/readyz')).status, 200);
  server.push([{ op: 'reset' }, ...state.ops]);
  await server.restart();
  const back = await scrapeUntil(base, (m) => m.get('kpng_callout_source_synced') === 1, 'the source to be synced again');
  t.ok(back.get('kpng_callout_source_reconnects_total')! >= 1);
  t.equal(back.get('kpng_callout_states_total'), 2);
  t.equal((await check(base, '/healthz')).status, 200);
  p.proc.kill('SIGTERM');
  t.equal(await p.exited(), 0);
});

t.test('kpng-json --metrics-addr: source metrics only, health from the source', async (t) => {
  const state = version(2, 1);
  const server = await serve(t, [[{ op: 'reset' }, ...state.ops]]);
  const p = runBin(t, 'kpng-json', ['--api', server.address, '--node-name', 'n', '--metrics-addr', '127.0.0.1:0', '--error-delay', '50ms']);
  const base = await metricsBase(p);
  const m = await scrapeUntil(base, (m) => m.get('kpng_callout_states_total') === 1, 'the first state');
  t.equal(m.get('kpng_callout_services'), 2);
  t.notOk([...m.keys()].some((k) => k.startsWith('kpng_callout_runs_total')), 'no runner metrics');
  t.match(await check(base, '/healthz'), { status: 200, body: 'source synced\n' });
  t.match(await check(base, '/readyz'), { status: 200, body: 'ready: a complete state was printed\n' });
  await server.kill();
  await scrapeUntil(base, (m) => m.get('kpng_callout_source_connected') === 0, 'the source to be disconnected');
  t.equal((await check(base, '/healthz')).status, 503);
  p.proc.kill('SIGTERM');
  t.equal(await p.exited(), 0);
  t.equal(p.stdout.join('\n') + '\n', state.text);
});
