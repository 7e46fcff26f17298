/**
 * Metrics fed with runner events and source status by hand (a manual clock):
 * counters, histograms, health and readiness rules.
 */
import t from 'tap';
import { Metrics } from '../../src/metrics/metrics.js';
import type { RunnerEvent } from '../../src/runner/scheduler.js';
import { stateFromItems } from '../../src/state.js';
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

