/**
 * The list/watch supervision (src/sources/kube/supervisor.ts) with fake
 * members that report scripted outcomes: one line per attempt, restarts
 * together after a jittered backoff, status, and the idle watchdog.
 */
import { EventEmitter, once } from 'node:events';
import t, { type Test } from 'tap';
import type { Failure } from '../../../src/sources/kube/failures.js';
import { IdleWatchdog, ListWatchSupervisor, idleLimitMs, type Member } from '../../../src/sources/kube/supervisor.js';
import { captureLog, recordingSink } from '../../helpers/sink.js';
import { within } from '../../helpers/wait.js';

const SERVER = 'http://127.0.0.1:1';
const refused = (op: string): Failure => ({ op, reason: 'connection refused', unreachable: 'ECONNREFUSED', routine: false });
const lost = (op: string): Failure => ({ op, reason: `connection to ${SERVER} lost`, routine: true });

/** What a fake member does when started: list successfully, or fail with the Failure its function words. */
type Outcome = 'ok' | ((op: string) => Failure);

interface Fake extends Member {
  starts: number;
  stops: number;
  /** Outcomes of the next starts, in order; 'ok' when none is left. */
  script: Outcome[];
}

function harness(t: Test, o: { now?: () => number } = {}) {
  const log = captureLog();
  const sink = recordingSink();
  let synced = 0;
  const sup = new ListWatchSupervisor({
    server: SERVER,
    backoff: { minMs: 10, maxMs: 40 },
    logger: log.logger,
    now: o.now,
    onStatus: (s) => sink.status?.(s),
    onSynced: () => synced++,
  });
  const fake = (resource: string, group: string, script: Outcome[] = []): Fake => {
    const m: Fake = {
      resource,
      group,
      starts: 0,
      stops: 0,
      script,
      start() {
        m.starts++;
        const outcome = m.script.shift() ?? 'ok';
        const op = `list ${group ? `${resource}.${group}` : resource}`;
        // As a list/watch loop: outcomes come later, never inside start().
        setImmediate(() => (outcome === 'ok' ? sup.listed(m, 1) : sup.failed(m, outcome(op))));
      },
      stop() {
        m.stops++;
      },
    };
    sup.add(m);
    return m;
  };
  t.teardown(() => sup.stop());
  return { sup, log, sink, fake, synced: () => synced };
}

/** The delay in a "retrying in Nms" line. */
const delayOf = (line: string): number => Number(/retrying in (\d+)ms/.exec(line)?.[1]);

t.test('initial lists: synced once every member listed, reported once', async (t) => {
  const { sup, sink, log, fake, synced } = harness(t);
  fake('services', '');
  fake('endpointslices', 'discovery.k8s.io');
  t.equal(sup.synced, false);
  sup.start();
  t.same(sink.statuses[0], { connected: false, synced: false, reconnects: 0 }, 'the first status at start');
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  t.equal(synced(), 1);
  t.equal(sup.synced, true);
  t.ok(await log.waitFor(/debug: endpointslices\.discovery\.k8s\.io: initial list complete items=1$/));
});

t.test('members failing together: one line per attempt, restarted together after a jittered backoff', async (t) => {
  const { sink, log, fake, sup } = harness(t);
  const members = [fake('services', '', [refused, refused]), fake('endpointslices', 'discovery.k8s.io', [refused, refused]), fake('nodes', '', [refused, refused])];
  sup.start();
  const back = await within(log.waitFor(/connected again/), 'connected again');
  t.equal(back, 'kpng-callout info: services, endpointslices.discovery.k8s.io, nodes: connected again after 2 failed attempt(s)');
  const lines = log.matching(/cannot reach/);
  const what = `cannot reach the Kubernetes API server ${SERVER}: connection refused (ECONNREFUSED; list services, list endpointslices.discovery.k8s.io, list nodes)`;
  t.same(
    lines.map((l) => l.replace(/retrying in \d+ms/, 'retrying in Nms')),
    [`kpng-callout error: ${what}; retrying in Nms waiting="initial list"`, `kpng-callout debug: ${what}; retrying in Nms waiting="initial list"`],
    'the same failure again: at debug level, although its delay differs',
  );
  for (const [i, base] of [10, 20].entries()) {
    const ms = delayOf(lines[i]!);
    t.ok(ms >= base * 0.8 && ms <= base * 1.2, `attempt ${i + 1}: ${ms}ms is ${base}ms ±20%`);
  }
  t.same(
    members.map((m) => m.starts),
    [3, 3, 3],
  );
  const done = await within(sink.waitForStatus((s) => s.connected && s.synced), 'connected');
  t.same(done, { connected: true, synced: true, reconnects: 2 });
  // While failing, the status carries the attempt's line.
  t.ok(sink.statuses.some((s) => !s.connected && s.error === what));
});

t.test('a failure out of the blue waits for its companions; the healthy member is left alone', async (t) => {
  const { sup, sink, log, fake } = harness(t);
  const svc = fake('services', '');
  const slices = fake('endpointslices', 'discovery.k8s.io');
  const nodes = fake('nodes', '');
  sup.start();
  await within(sink.waitForStatus((s) => s.connected && s.synced), 'synced');
  // The API server restarted: watches cut one after the other.
  sup.failed(svc, lost('watch services'));
  setImmediate(() => sup.failed(nodes, lost('watch nodes')));
  const line = await within(log.waitFor(/lost; retrying in/), 'the attempt line');
  t.match(line, new RegExp(`^kpng-callout warn: watch services, watch nodes: connection to ${SERVER.replace(/\./g, '\\.')} lost; retrying in \\d+ms$`), 'one warning, no waiting field after the initial lists');
  t.ok(await within(log.waitFor(/services, nodes: connected again after 1 failed attempt\(s\)/), 'back'));
  t.same([svc.starts, slices.starts, nodes.starts], [2, 1, 2]);
  // A second failure of a member already failed: one failure, one restart.
  sup.failed(slices, lost('watch endpointslices.discovery.k8s.io'));
  sup.failed(slices, refused('watch endpointslices.discovery.k8s.io'));
  await within(log.waitFor(/endpointslices\.discovery\.k8s\.io: connected again/), 'slices back');
  t.equal(slices.starts, 2);
  t.equal(log.matching(/refused/).length, 0);
});

t.test('connected again, the next failure is news: logged at its level at once', async (t) => {
  let clock = 0;
  const { sup, log, fake } = harness(t, { now: () => clock });
  const svc = fake('services', '', [refused, refused]);
  sup.start();
  await within(log.waitFor(/connected again after 2 /), 'back');
  sup.failed(svc, refused('list services'));
  await within(log.waitFor(/connected again after 1 /), 'back again');
  t.same(
    log.matching(/cannot reach/).map((l) => l.split(':')[0]),
    ['kpng-callout error', 'kpng-callout debug', 'kpng-callout error'],
  );
  t.equal(clock, 0, 'the clock did not move: the repeat filter was cleared');
});

t.test('stop: members stopped, nothing reported after', async (t) => {
  const { sup, sink, log, fake } = harness(t);
  const svc = fake('services', '');
  sup.start();
  await within(sink.waitForStatus((s) => s.synced), 'synced');
  sup.stop();
  sup.stop();
  t.equal(svc.stops, 1);
  t.equal(sup.isStopped, true);
  const before = [log.lines.length, sink.statuses.length];
  sup.failed(svc, refused('watch services'));
  sup.listed(svc, 1);
  t.same([log.lines.length, sink.statuses.length], before);
});

t.test('the idle limit: the watch timeout plus a minute, or twice it when shorter', async (t) => {
  t.equal(idleLimitMs(300), 360_000);
  t.equal(idleLimitMs(60), 120_000);
  t.equal(idleLimitMs(1), 2000);
});

t.test('the idle watchdog fires after silence; an event restarts the silence; disarmed, it is quiet', async (t) => {
  const ee = new EventEmitter();
  const fired: string[] = [];
  const dog = (): IdleWatchdog => {
    const d = new IdleWatchdog();
    t.teardown(() => d.disarm());
    return d;
  };
  const onIdle = (name: string) => () => {
    fired.push(name);
    ee.emit(name);
  };
  // Timers fire in the order they are due: a marker due later than a
  // watchdog tells whether that watchdog fired.
  const quiet = dog();
  quiet.arm(10, onIdle('quiet'));
  quiet.disarm();
  const poked = dog();
  poked.arm(40, onIdle('poked'));
  setTimeout(() => poked.poke(), 20);
  const marker = dog();
  marker.arm(50, onIdle('marker'));
  await within(once(ee, 'marker'), 'the marker');
  t.same(fired, ['marker'], 'neither the disarmed nor the poked one fired before the marker');
  await within(once(ee, 'poked'), 'the poked watchdog');
  t.same(fired, ['marker', 'poked']);
  // Re-arming replaces the timer.
  const re = dog();
  re.arm(1000, onIdle('re'));
  re.arm(5, onIdle('re'));
  await within(once(ee, 're'), 're-armed');
});
