/**
 * End-to-end tests of callouts/userspace-proxy with real traffic, in the
 * network of test/helpers/userspace-lab.ts (a client, the node, two pods in
 * network namespaces). The proxy runs as the runner runs it, `kpng-callout
 * replay --watch --persistent --changes STATEFILE --callout
 * callouts/userspace-proxy` in the node namespace; each state is a rewrite of
 * STATEFILE, and each step waits for the runner's line about that frame.
 * The subtests run in order on one proxy: later states build on earlier
 * ones. Needs root and `ip netns`; skips (saying why) without them. The
 * library on loopback (loops, resets, re-binds): userspace-proxy-loopback.test.ts.
 */
import t from 'tap';
import type { Answer } from '../../helpers/userspace-agents.js';
import { labMissing, NODE, stateOf, UserspaceLab, type Svc } from '../../helpers/userspace-lab.js';
import { pollUntil } from '../../helpers/wait.js';

const reason = await labMissing();
if (reason) console.error(`# skipping userspace-proxy end-to-end tests: ${reason}`);

const web: Svc = {
  name: 'web',
  cluster: ['192.0.2.10', '2001:db8:e::10'],
  external: ['192.0.2.20', '2001:db8:e::20'],
  ports: [
    { name: 'http', proto: 'tcp', port: 80, nodePort: 30080, targetPort: 8080 },
    { name: 'dns', proto: 'udp', port: 5353, nodePort: 30053, targetPort: 8080 },
  ],
  endpoints: [{ pod: 'pod1' }, { pod: 'pod2' }],
};
/** Port overrides (pod1: 9090 for port "alt"; pod2 has none: TargetPort) and scopes (pod2 Internal only). */
const alt: Svc = {
  name: 'alt',
  cluster: ['192.0.2.11', '2001:db8:e::11'],
  external: ['192.0.2.21'],
  lb: ['192.0.2.31'],
  ports: [{ name: 'alt', port: 81, targetPort: 8080 }],
  endpoints: [
    { pod: 'pod1', overrides: { alt: 9090 } },
    { pod: 'pod2', external: false },
  ],
};
const sticky: Svc = { name: 'sticky', cluster: ['192.0.2.12'], ports: [{ port: 80, targetPort: 8080 }], affinity: 0, endpoints: [{ pod: 'pod1' }, { pod: 'pod2' }] };
/** pod1's unnamed port override is 7070, where nothing listens: refused. */
const refuse: Svc = { name: 'refuse', cluster: ['192.0.2.13'], ports: [{ port: 80, targetPort: 8080 }], endpoints: [{ pod: 'pod1', overrides: { '': 7070 } }, { pod: 'pod2' }] };
const empty: Svc = { name: 'empty', cluster: ['192.0.2.14'], ports: [{ port: 80, targetPort: 8080 }] };
const hostile: Svc = {
  name: 'hostile',
  cluster: ['192.0.2.300', '192.0.2.16', '1.2.3.4; touch /tmp/kpusp-pwned', '01.2.3.4'],
  external: ['2001:db8:e::16/64', 'fe80::1%lo'],
  ports: [
    { port: 70000, targetPort: 8080 },
    { port: 83, proto: 'sctp' },
    { port: 84, proto: 9 },
    { port: 82, targetPort: 8080 },
  ],
  endpoints: [{ pod: 'pod2' }],
  rawEndpoints: [{ IPs: { V4: ['$(reboot)'] } }, { IPs: { V4: ['198.51.100.2'] }, PortOverrides: [{ Port: 99999 }] }],
};

const answers = (as: Answer[]): string[] => as.map((a) => a.r);
const tally = (as: Answer[]): Record<string, number> => {
  const out: Record<string, number> = {};
  for (const a of as) out[a.r] = (out[a.r] ?? 0) + 1;
  return out;
};
const POD_TCP = /^pod[12]:8080$/;

/** Each address of the Service under test (ClusterIP, ExternalIP, then the node's for the NodePort), both families, with its port. */
const destinations = (port: number, nodePort: number): Array<readonly [string, number]> => [
  ['192.0.2.10', port],
  ['2001:db8:e::10', port],
  ['192.0.2.20', port],
  ['2001:db8:e::20', port],
  [NODE.v4, nodePort],
  [NODE.v6, nodePort],
];

t.test('userspace-proxy with real traffic', { skip: reason ?? false }, async (t) => {
  const lab = new UserspaceLab('e2e');
  t.teardown(() => lab.close());
  await lab.open();
  const { client, node } = lab;
  let state: Svc[] = [web, alt, sticky, refuse, empty, hostile];

  const first = await lab.startProxy(stateOf(state), { changes: true, env: { USERSPACE_PROXY_UDP_IDLE_TIMEOUT_MS: '2500' } });
  const proxy = lab.proxy!;

  await t.test('the first frame: every listener up, acknowledged ok; hostile values logged and skipped', async (t) => {
    t.ok(first.ok, 'frame 1 acknowledged ok', { line: first.line });
    const listening = proxy.matching(/userspace-proxy: listening on /);
    // web: 4 addresses x 2 ports + 2 NodePorts x 2 families; alt: 4; sticky, refuse, empty: 1 each; hostile: 1.
    t.equal(listening.length, 8 + 4 + 4 + 3 + 1, 'one bind line per listener', { listening });
    for (const l of ['192.0.2.10:80/tcp', '[2001:db8:e::10]:5353/udp', '0.0.0.0:30080/tcp', '[::]:30053/udp', '192.0.2.31:81/tcp', '192.0.2.16:82/tcp']) {
      t.ok(listening.some((x) => x.includes(`listening on ${l} `)), `listening on ${l}`);
    }
    const log = proxy.lines.join('\n');
    for (const bad of ['"192.0.2.300"', '"1.2.3.4; touch /tmp/kpusp-pwned"', '"01.2.3.4"', '"2001:db8:e::16/64"', '"fe80::1%lo"', '"$(reboot)"']) {
      t.match(log, `${bad} is not a usable literal`, `${bad} logged and skipped`);
    }
    t.match(log, /"70000" is not a port/);
    t.match(log, /SCTP is not proxied/);
    t.match(log, /protocol "9" is not TCP, UDP or SCTP/);
    t.match(log, /port "" is "99999", not a port/);
  });

  await t.test('TCP through ClusterIP, ExternalIP and NodePort, both families, from the client and from the node', async (t) => {
    for (const [from, agent] of [['client', client], ['node', node]] as const) {
      for (const [addr, port] of destinations(80, 30080)) {
        const got = answers(await agent.tcp(addr, port, 2));
        t.ok(got.every((r) => POD_TCP.test(r)), `${from} -> ${addr}:${port}`, { got });
      }
    }
  });

  await t.test('UDP through ClusterIP, ExternalIP and NodePort, both families; replies come from the Service address', async (t) => {
    for (const [from, agent] of [['client', client], ['node', node]] as const) {
      for (const [addr, port] of destinations(5353, 30053)) {
        const [a] = await agent.udp(addr, port, 1, false, `hi-${from}`);
        t.match(a?.r, new RegExp(`^pod[12]:8080 hi-${from}$`), `${from} -> ${addr}:${port}/udp`);
        t.equal(a?.from, `${addr} ${port}`, 'the reply is from the address and port the client sent to');
      }
    }
  });

  await t.test('UDP: one client socket keeps its endpoint; new client ports take the endpoints in turn', async (t) => {
    const same = answers(await client.udp('192.0.2.10', 5353, 6));
    t.equal(new Set(same).size, 1, 'one session, one pod', { same });
    const fresh = tally(await client.udp('192.0.2.10', 5353, 10, true));
    t.same(Object.keys(fresh).sort(), ['pod1:8080 ping', 'pod2:8080 ping'], 'both pods', { fresh });
  });

  await t.test('target ports (PortOverrides by name, else TargetPort) and scopes (ClusterIP: Internal, others: External)', async (t) => {
    const inside = tally(await client.tcp('192.0.2.11', 81, 10));
    t.same(inside, { 'pod1:9090': 5, 'pod2:8080': 5 }, 'ClusterIP: pod1 at its override, pod2 (Internal) at TargetPort');
    t.same(tally(await client.tcp('2001:db8:e::11', 81, 4)), { 'pod1:9090': 2, 'pod2:8080': 2 }, 'IPv6 ClusterIP alike');
    t.same(tally(await client.tcp('192.0.2.21', 81, 6)), { 'pod1:9090': 6 }, 'ExternalIP: only the External endpoint');
    t.same(tally(await client.tcp('192.0.2.31', 81, 6)), { 'pod1:9090': 6 }, 'LoadBalancerIP: only the External endpoint');
  });

  await t.test('round robin: 100 connections share the two pods fairly', async (t) => {
    const got = tally(await client.tcp('192.0.2.10', 80, 100, 10));
    t.same(Object.keys(got).sort(), ['pod1:8080', 'pod2:8080'], 'only pod answers', { got });
    for (const [pod, n] of Object.entries(got)) t.ok(n >= 40 && n <= 60, `${pod}: ${n} of 100`);
  });

  await t.test('SessionAffinity ClientIP: a client keeps its endpoint', async (t) => {
    const fromClient = answers(await client.tcp('192.0.2.12', 80, 20, 4));
    t.equal(new Set(fromClient).size, 1, 'the client always reaches the same pod', { fromClient });
    t.match(fromClient[0], POD_TCP);
    const fromNode = answers(await node.tcp('192.0.2.12', 80, 20, 4));
    t.equal(new Set(fromNode).size, 1, 'the node (another client IP) too', { fromNode });
  });

  await t.test('an endpoint that refuses is skipped: every connection reaches the other one', async (t) => {
    t.same(tally(await client.tcp('192.0.2.13', 80, 20, 4)), { 'pod2:8080': 20 });
  });

  await t.test('no usable endpoint: the client is closed at once', async (t) => {
    for (const addr of ['192.0.2.14']) {
      const [a] = await client.tcp(addr, 80, 1, 1, 10_000);
      t.match(a?.r, /^(ERR:ECONNRESET|CLOSED)$/, `${addr}: reset`);
      t.ok(a!.ms < 2000, `within ${a!.ms} ms (no connect timeout)`);
    }
    t.equal(answers(await client.tcp('192.0.2.16', 82, 4)).join(), 'pod2:8080,pod2:8080,pod2:8080,pod2:8080', 'the hostile Service keeps its valid parts');
  });

  await t.test('half-close: the client ends its side, the answer still comes back', async (t) => {
    const h = await client.call<{ id: number; first: string }>('hold', { host: '192.0.2.10', port: 80 });
    t.match(h.first, POD_TCP);
    const end = await client.call<{ rest: string; err: string }>('halfclose', { hid: h.id, text: 'bye' });
    t.same(end, { rest: 'bye\n', err: '' }, 'echoed after our FIN, then closed cleanly');
  });

  await t.test('an endpoint change keeps listeners and open connections; new connections use the new endpoints', async (t) => {
    const held = await client.call<{ id: number; first: string }>('hold', { host: '192.0.2.10', port: 80 });
    t.match(held.first, POD_TCP);
    const before = proxy.lines.length;
    for (const only of ['pod1', 'pod2'] as const) {
      state = state.map((s) => (s.name === 'web' ? { ...web, endpoints: [{ pod: only }] } : s));
      const r = await lab.apply(stateOf(state));
      t.ok(r.ok, `endpoints -> ${only}: acknowledged ok`, { line: r.line });
      t.same(tally(await client.tcp('192.0.2.10', 80, 6)), { [`${only}:8080`]: 6 }, `new connections go to ${only}`);
      t.same(tally(await client.udp('192.0.2.10', 5353, 4, true)), { [`${only}:8080 ping`]: 4 }, `new UDP sessions go to ${only}`);
      t.equal(await client.call('echo', { hid: held.id, text: `still-${only}` }), `still-${only}`, 'the open connection still works');
    }
    t.same(proxy.matching(/userspace-proxy: (listening on|closed) /, before), [], 'no listener closed or opened');
    await client.call('release', { hid: held.id });
  });

  await t.test('a removed Service: its listeners close, the others keep serving', async (t) => {
    const before = proxy.lines.length;
    state = state.filter((s) => s.name !== 'alt');
    const r = await lab.apply(stateOf(state));
    t.ok(r.ok, 'acknowledged ok', { line: r.line });
    t.equal(proxy.matching(/userspace-proxy: closed .*"default\/alt"/, before).length, 4, 'its four listeners closed');
    for (const [addr, port] of [
      ['192.0.2.11', 81],
      ['2001:db8:e::11', 81],
      ['192.0.2.21', 81],
    ] as const) {
      t.same(answers(await client.tcp(addr, port)), ['ERR:ECONNREFUSED'], `${addr}:${port} refused`);
    }
    t.match(answers(await client.tcp('192.0.2.10', 80))[0], POD_TCP, 'web still answers');
  });

  await t.test('a bind that fails: acknowledged error naming it, the rest serves, the bind is retried on later frames', async (t) => {
    t.equal(await node.call('listen', { host: '192.0.2.15', port: 80 }), 'ok', 'someone else holds 192.0.2.15:80');
    state = [...state, { name: 'blocked', cluster: ['192.0.2.15'], ports: [{ port: 80, targetPort: 8080 }], endpoints: [{ pod: 'pod1' }] }, { name: 'fresh', cluster: ['192.0.2.17'], ports: [{ port: 80, targetPort: 8080 }], endpoints: [{ pod: 'pod2' }] }];
    const r = await lab.apply(stateOf(state));
    t.notOk(r.ok, 'the frame failed');
    t.match(r.line, /cannot listen on 192\.0\.2\.15:80\/tcp: EADDRINUSE/, 'the ack names the address, port and errno');
    t.same(answers(await client.tcp('192.0.2.17', 80)), ['pod2:8080'], 'the other new Service of the frame serves');
    t.match(answers(await client.tcp('192.0.2.10', 80))[0], POD_TCP, 'the older ones too');
    t.equal(await node.call('unlisten', { host: '192.0.2.15', port: 80 }), 'ok');
    // The next frame (full, after a failed one) binds it again.
    state = [...state, { name: 'later', cluster: ['192.0.2.18'], ports: [{ port: 80, targetPort: 8080 }], endpoints: [{ pod: 'pod1' }] }];
    const next = await lab.apply(stateOf(state));
    t.ok(next.ok, 'the next frame is acknowledged ok', { line: next.line });
    t.same(answers(await client.tcp('192.0.2.15', 80)), ['pod1:8080'], '192.0.2.15:80 serves');
    t.same(answers(await client.tcp('192.0.2.18', 80)), ['pod1:8080'], 'so does the new Service');
  });

  await t.test("a Service port that is another Service's NodePort: both served; endpoints that loop back or reach the node's loopback skipped; one affinity per Service port", async (t) => {
    const before = proxy.lines.length;
    const clash: Svc = { name: 'clash', cluster: ['192.0.2.19'], ports: [{ name: 't', port: 30080, targetPort: 8080 }, { name: 'u', proto: 'udp', port: 30053, targetPort: 8080 }], endpoints: [{ pod: 'pod1' }] };
    const loop: Svc = {
      name: 'loop',
      cluster: ['192.0.2.22'],
      ports: [{ port: 80, targetPort: 8080 }],
      endpoints: [{ pod: 'pod1' }],
      rawEndpoints: [{ IPs: { V4: ['192.0.2.22'] }, PortOverrides: [{ Port: 80 }] }, { IPs: { V4: ['127.0.0.1'] } }, { IPs: { V4: ['169.254.169.254'] } }],
    };
    const sticky2: Svc = { name: 'sticky2', cluster: ['192.0.2.23'], external: ['192.0.2.24'], ports: [{ port: 80, targetPort: 8080 }], affinity: 0, endpoints: [{ pod: 'pod1' }, { pod: 'pod2' }] };
    state = [...state, clash, loop, sticky2];
    const r = await lab.apply(stateOf(state));
    t.ok(r.ok, 'acknowledged ok (no EADDRINUSE)', { line: r.line });
    t.same(tally(await client.tcp('192.0.2.19', 30080, 4)), { 'pod1:8080': 4 }, "clash's ClusterIP at 30080/tcp: its own endpoint");
    t.same(tally(await client.tcp(NODE.v4, 30080, 4)), { 'pod2:8080': 4 }, "the node's address at 30080/tcp: web's NodePort (web's endpoint is pod2)");
    t.match((await client.udp('192.0.2.19', 30053, 1, false, 'c'))[0]?.r, /^pod1:8080 c$/, "clash's ClusterIP at 30053/udp");
    t.match((await client.udp(NODE.v4, 30053, 1, false, 'w'))[0]?.r, /^pod2:8080 w$/, "web's NodePort at 30053/udp");
    t.same(tally(await client.tcp('192.0.2.22', 80, 10, 5)), { 'pod1:8080': 10 }, 'the loop and the loopback endpoints are never used');
    const log = proxy.lines.slice(before).join('\n');
    t.match(log, /endpoint 192\.0\.2\.22:80 is an address this proxy listens on \(a loop\): skipped/);
    t.match(log, /"127\.0\.0\.1" is not a usable literal/);
    t.match(log, /"169\.254\.169\.254" is not a usable literal/);
    // The node first takes the ExternalIP's first endpoint: were the affinities apart, the client's
    // connections there would go to the next one, away from the pod it has through the ClusterIP.
    const nodeFirst = answers(await node.tcp('192.0.2.24', 80));
    const got: string[] = [];
    for (let i = 0; i < 6; i++) got.push(...answers(await client.tcp(i % 2 ? '192.0.2.24' : '192.0.2.23', 80)));
    t.equal(new Set(got).size, 1, 'ClusterIP and ExternalIP: the same pod for one client', { got, nodeFirst });
  });

  await t.test('no leak: thousands of connections and UDP sessions, then back to the baseline', async (t) => {
    // The baseline: earlier UDP sessions idle out first (USERSPACE_PROXY_UDP_IDLE_TIMEOUT_MS=2500), and the
    // handles of those just closed are released (two reads alike: on a loaded machine a closing socket's handle
    // can outlive its session's count by a moment).
    let base = await proxy.stats();
    let before = '';
    await pollUntil(
      async () => {
        base = await proxy.stats();
        const same = JSON.stringify(base.handles) === before;
        before = JSON.stringify(base.handles);
        return base.udp === 0 && base.tcp === 0 && same;
      },
      () => `no session left: ${JSON.stringify(base)}`,
      10_000,
      200,
    );
    t.equal(base.tcp, 0, 'no connection open', { base });
    const tcp = await client.call<Record<string, number>>('churn', { host: '192.0.2.10', port: 80, n: 2500, conc: 50 }, 60_000);
    t.same(tcp, { 'pod2:8080': 2500 }, 'all 2,500 answered (by pod2, the endpoint left)');
    const v6 = await client.call<Record<string, number>>('churn', { host: NODE.v6, port: 30080, n: 500, conc: 50 }, 60_000);
    t.same(v6, { 'pod2:8080': 500 }, '500 more over IPv6 NodePort');
    const empties = await client.call<Record<string, number>>('churn', { host: '192.0.2.14', port: 80, n: 300, conc: 30 }, 60_000);
    t.notOk(Object.keys(empties).some((k) => /pod/.test(k)), 'no-endpoint connections all closed', { empties });
    const udp = tally(await client.udp('192.0.2.10', 5353, 200, true));
    t.same(udp, { 'pod2:8080 ping': 200 }, '200 UDP sessions');
    let last = base;
    await pollUntil(
      async () => {
        last = await proxy.stats();
        return last.tcp === 0 && last.tcpSockets === 0 && last.udp === 0 && last.handles.TCPSocketWrap === base.handles.TCPSocketWrap && last.handles.UDPWrap === base.handles.UDPWrap;
      },
      () => `the baseline ${JSON.stringify(base)}; last ${JSON.stringify(last)}`,
      15_000,
      200,
    );
    t.same(last.handles, base.handles, 'the same handles as before', { base, last });
  });

  await t.test('SIGTERM to the runner: the proxy closes its listeners and exits, the runner exits 0', async (t) => {
    lab.proxy!.child.kill('SIGTERM');
    t.equal(await lab.proxy!.exit, 0);
    t.ok(proxy.matching(/userspace-proxy: end of input: listeners closed, exiting/).length === 1, 'the proxy saw the end of its input');
    t.same(answers(await client.tcp('192.0.2.10', 80)), ['ERR:ECONNREFUSED'], 'nothing listens any more');
  });
});
