/**
 * callouts/lib/userspace-proxy-plan.mjs: a Planner, fed frame after frame
 * through a ServiceTable, plans each frame exactly as planning it from
 * scratch would (planListeners), over random frames that add, change and
 * remove Services, claim addresses twice, share ports with NodePorts and
 * make endpoints loop into the proxy and stop; and a Service whose line did
 * not change keeps its planned listener and backend objects (what makes a
 * frame cheap at 10,000 Services). No listener is bound: see
 * userspace-proxy-program.test.ts and the e2e suite for the proxy itself.
 */
import t from 'tap';
import { lib, type Planned } from '../helpers/userspace-proxy-lib.js';

type Plan = Map<string, Planned>;

/** A plan as plain data: what the proxy binds and where each listener sends. */
function data(plan: Plan): unknown {
  const b = (x: Planned['backend']) => [x.key, x.affinityMs, x.endpoints.map((e) => e.id)];
  return [...plan].map(([k, l]) => [k, l.host, l.label, l.shared === true, b(l.backend), (l.routes ?? []).map((r) => [r.host, r.label, b(r.backend)])]);
}

/** A small deterministic generator (the failing seed is in the message). */
function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s ^ (s >>> 15), 0x2c1b3c6d) + 0x6d2b79f5) >>> 0;
    return s / 2 ** 32;
  };
}

// Few addresses and ports, so that claims collide, endpoints are listeners and ports are NodePorts.
const ADDRS = ['192.0.2.1', '192.0.2.2', '192.0.2.3', '198.51.100.1', '198.51.100.2'];
const V6 = ['2001:db8::1', '2001:db8::2'];
const PORTS = [80, 81, 30080];
const LOCAL = new Set(['198.51.100.1', '2001:db8::2']);

function randomLine(r: () => number, name: string): string {
  const pick = <T>(xs: T[]): T => xs[Math.floor(r() * xs.length)]!;
  const some = <T>(xs: T[], p: number): T[] => xs.filter(() => r() < p);
  const ports = some([0, 1, 2], 0.6).map((i) => ({
    Name: i === 0 ? '' : `p${i}`,
    Protocol: r() < 0.7 ? 1 : 2,
    Port: pick(PORTS),
    ...(r() < 0.3 ? { NodePort: pick(PORTS) } : {}),
    ...(r() < 0.5 ? { TargetPort: pick(PORTS) } : {}),
  }));
  const endpoints = some([0, 1, 2, 3], 0.6).map(() => ({
    IPs: { ...(r() < 0.8 ? { V4: [pick(ADDRS)] } : {}), ...(r() < 0.3 ? { V6: [pick(V6)] } : {}) },
    ...(r() < 0.3 ? { Scopes: { Internal: r() < 0.5, External: r() < 0.5 } } : {}),
    ...(r() < 0.3 ? { PortOverrides: [{ Name: pick(['', 'p1', 'p2']), Port: pick(PORTS) }] } : {}),
  }));
  const ips = {
    ClusterIPs: { V4: some(ADDRS, 0.2), V6: some(V6, 0.1) },
    ...(r() < 0.3 ? { ExternalIPs: { V4: some(ADDRS, 0.3) } } : {}),
  };
  return JSON.stringify({ Service: { Namespace: 'default', Name: name, Type: 'ClusterIP', IPs: ips, Ports: ports, ...(r() < 0.2 ? { SessionAffinity: { ClientIP: { TimeoutSeconds: 60 } } } : {}) }, Endpoints: endpoints });
}

t.test('a Planner plans every frame as planListeners does from scratch', async (t) => {
  for (let seed = 1; seed <= 60; seed++) {
    const r = rng(seed);
    const table = new lib.ServiceTable();
    const planner = new lib.Planner();
    let lines = new Map<string, string>();
    for (let frame = 0; frame < 12; frame++) {
      const next = new Map(lines);
      for (const name of ['a', 'b', 'c', 'd', 'e', 'f']) {
        const x = r();
        if (x < 0.2) next.delete(name);
        else if (x < 0.5 || !next.has(name)) next.set(name, randomLine(r, name));
      }
      const full = frame === 0 || r() < 0.3;
      const body = full
        ? [...next.values()]
        : [...new Set([...lines.keys(), ...next.keys()])].flatMap((k) => (lines.get(k) === next.get(k) ? [] : [...(lines.has(k) ? [`{"Previous":${lines.get(k)}}`] : []), ...(next.has(k) ? [next.get(k)!] : [])]));
      const applied = table.apply(`{"Frame":{"Seq":${frame + 1},"Input":"${full ? 'full' : 'changes'}"}}`, body);
      t.ok(applied.ok, `seed ${seed} frame ${frame}: applied`);
      lines = next;
      const local = r() < 0.5 ? LOCAL : new Set<string>();
      const whyA: string[] = [];
      const whyB: string[] = [];
      const incremental = planner.plan(table.ordered(), (m) => whyA.push(m), local);
      const scratch = lib.planListeners(table.ordered(), (m) => whyB.push(m), local);
      const same = JSON.stringify(data(incremental)) === JSON.stringify(data(scratch)) && whyA.join('\n') === whyB.join('\n');
      if (!same) {
        t.same({ plan: data(incremental), why: whyA }, { plan: data(scratch), why: whyB }, `seed ${seed} frame ${frame}`);
        return;
      }
    }
  }
  t.pass('60 runs of 12 frames: every plan and every message the same');
});

t.test("a Service whose line did not change keeps its planned objects; a frame changes nothing it did not plan", async (t) => {
  const svc = (name: string, ip: string, ep: string) =>
    JSON.stringify({ Service: { Namespace: 'default', Name: name, Type: 'ClusterIP', IPs: { ClusterIPs: { V4: [ip] } }, Ports: [{ Protocol: 1, Port: 80 }] }, Endpoints: [{ IPs: { V4: [ep] } }] });
  const a = svc('a', '192.0.2.1', '198.51.100.10');
  const b = svc('b', '192.0.2.2', '198.51.100.20');
  const table = new lib.ServiceTable();
  const planner = new lib.Planner();
  table.apply('{"Frame":{"Seq":1,"Input":"full"}}', [a, b]);
  const one = planner.plan(table.ordered());
  const b2 = svc('b', '192.0.2.2', '198.51.100.21');
  table.apply('{"Frame":{"Seq":2,"Input":"changes"}}', [`{"Previous":${b}}`, b2]);
  const two = planner.plan(table.ordered());
  t.equal(two.get('tcp 192.0.2.1 80'), one.get('tcp 192.0.2.1 80'), 'a: the same listener object');
  t.equal(two.get('tcp 192.0.2.1 80')!.backend.endpoints, one.get('tcp 192.0.2.1 80')!.backend.endpoints, 'a: the same endpoint list (the proxy keeps its chooser as it is)');
  t.not(two.get('tcp 192.0.2.2 80'), one.get('tcp 192.0.2.2 80'), 'b: planned again');
  t.same(two.get('tcp 192.0.2.2 80')!.backend.endpoints.map((e) => e.id), ['198.51.100.21 80']);
  table.apply('{"Frame":{"Seq":3,"Input":"full"}}', [a, b2]);
  const three = planner.plan(table.ordered());
  t.equal(three.get('tcp 192.0.2.1 80'), one.get('tcp 192.0.2.1 80'), 'a full frame with the same lines keeps them too');
  t.equal(three.get('tcp 192.0.2.2 80'), two.get('tcp 192.0.2.2 80'));
  // b's endpoint becomes a's address: a loop, left out of b's copy only; a's planned objects are untouched.
  const b3 = svc('b', '192.0.2.2', '192.0.2.1');
  table.apply('{"Frame":{"Seq":4,"Input":"changes"}}', [`{"Previous":${b2}}`, b3]);
  const why: string[] = [];
  const four = planner.plan(table.ordered(), (m) => why.push(m));
  t.same(four.get('tcp 192.0.2.2 80')!.backend.endpoints, [], 'the loop is left out');
  t.match(why.join('\n'), /endpoint 192\.0\.2\.1:80 is an address this proxy listens on/);
  t.equal(four.get('tcp 192.0.2.1 80'), one.get('tcp 192.0.2.1 80'));
  // a goes: b's endpoint is no loop any more.
  table.apply('{"Frame":{"Seq":5,"Input":"changes"}}', [`{"Previous":${a}}`]);
  const five = planner.plan(table.ordered());
  t.same(five.get('tcp 192.0.2.2 80')!.backend.endpoints.map((e) => e.id), ['192.0.2.1 80'], 'no longer a loop once a is gone');
});
