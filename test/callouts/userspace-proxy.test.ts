/**
 * callouts/userspace-proxy's library without root and without traffic: its
 * checks of the state (literal IPs, one spelling per address, ports,
 * protocols), the listeners a state asks for (scopes, target ports,
 * NodePorts, an address claimed twice, endpoints that loop back into the
 * proxy), frames (full, change sets, and the ones it refuses), the endpoint
 * chooser (round robin, affinity) and its options. The program itself:
 * userspace-proxy-program.test.ts; real traffic, in network namespaces:
 * test/e2e/callouts/userspace-proxy.test.ts.
 */
import t from 'tap';
import { ep, lib, line, type Lib } from '../helpers/userspace-proxy-lib.js';

t.test('literal addresses only', async (t) => {
  for (const ok of ['192.0.2.1', '10.0.0.0', '223.255.0.1', '1.2.3.4']) t.ok(lib.isIPv4Literal(ok), ok);
  for (const bad of ['0.0.0.0', '0.1.2.3', '127.0.0.1', '127.255.255.254', '169.254.169.254', '01.2.3.4', '1.2.3', '1.2.3.4.5', '256.1.1.1', '224.0.0.1', '240.0.0.1', '255.255.255.255', ' 1.2.3.4', '1.2.3.4\n', '1.2.3.4/32', '', 7, null, ['1.2.3.4']]) {
    t.notOk(lib.isIPv4Literal(bad), JSON.stringify(bad));
  }
  for (const ok of ['2001:db8::1', '2001:db8:0:0:0:0:0:1', '64:ff9b::192.0.2.1', 'fec0::1', '::2']) t.ok(lib.isIPv6Literal(ok), ok);
  for (const bad of ['::', '::1', '0:0:0:0:0:0:0:1', 'FE80::1', 'febf::1', '0:0:0:0:0:0:0:0', 'fe80::1%eth0', '2001:db8::1/64', '[2001:db8::1]', 'ff02::1', '::ffff:192.0.2.1', '::ffff:c000:201', '2001:db8::1 ', '2001:db8::01.2.3.4', 'x', '', 1]) {
    t.notOk(lib.isIPv6Literal(bad), JSON.stringify(bad));
  }
});

t.test('readService: what is kept, what is logged and skipped', async (t) => {
  const why: string[] = [];
  const svc = lib.readService(
    JSON.parse(
      line(
        'web',
        {
          IPs: { ClusterIPs: { V4: ['192.0.2.10', '192.0.2.999'], V6: ['2001:db8::10'] }, ExternalIPs: { V4: ['$(id)', '192.0.2.20'], V6: ['192.0.2.21'] }, LoadBalancerIPs: { V4: ['192.0.2.30'] } },
          Ports: [
            { Name: 'http', Protocol: 1, Port: 80, NodePort: 30080, TargetPort: 8080 },
            { Name: 'dns', Protocol: 2, Port: 53, TargetPortName: 'dns' },
            { Name: 'sctp', Protocol: 3, Port: 9 },
            { Name: 'none', Port: 10 },
            { Name: 'big', Protocol: 1, Port: 65536 },
            { Name: 'str', Protocol: 1, Port: '80' },
            { Name: 'dup', Protocol: 1, Port: 80 },
            { Name: 'badnp', Protocol: 2, Port: 54, NodePort: -1, TargetPort: 1e9 },
          ],
          SessionAffinity: { ClientIP: {} },
        },
        [ep('198.51.100.2', undefined, { PortOverrides: [{ Name: 'http', Port: 9090 }, { Name: 'dns', Port: 0 }], Scopes: { Internal: true } }), ep('bad', '2001:db8:1::2'), ep(undefined, undefined), 'junk'],
      ),
    ),
    (m: string) => why.push(m),
  );
  t.ok(svc);
  t.equal(svc!.label, '"default/web"');
  t.same(svc!.ips, { internal: { 4: ['192.0.2.10'], 6: ['2001:db8::10'] }, external: { 4: ['192.0.2.20', '192.0.2.30'], 6: [] } });
  t.same(
    svc!.ports.map((p) => [p.name, p.proto, p.port, p.nodePort, p.targetPort]),
    [
      ['http', 'tcp', 80, 30080, 8080],
      ['dns', 'udp', 53, 0, 0],
      ['badnp', 'udp', 54, 0, 0],
    ],
  );
  t.equal(svc!.affinityMs, 10_800_000, 'ClientIP affinity with no TimeoutSeconds: 10800 s');
  t.same(
    svc!.endpoints.map((e) => [e.ip, e.internal, e.external, [...e.overrides]]),
    [
      [{ 4: '198.51.100.2' }, true, false, [['http', 9090], ['dns', 0]]],
      [{ 6: '2001:db8:1::2' }, true, true, []],
    ],
  );
  const text = why.join('\n');
  for (const m of [
    /ClusterIP "192\.0\.2\.999" is not a usable literal IPv4/,
    /ExternalIP "\$\(id\)" is not a usable literal IPv4/,
    /ExternalIP "192\.0\.2\.21" is not a usable literal IPv6/,
    /port "sctp": SCTP is not proxied/,
    /port "none": protocol "0" is not TCP, UDP or SCTP/,
    /port "big": "65536" is not a port/,
    /port "str": "80" is not a port/,
    /port "dup": 80\/tcp is listed twice/,
    /port "badnp": NodePort "-1" is not a port/,
    /port "badnp": TargetPort "1000000000" is not a port/,
    /endpoint address "bad" is not a usable literal/,
    /port "dns" is "0", not a port/,
  ]) {
    t.match(text, m);
  }
  t.equal(lib.readService({ Service: { Namespace: 'x' } }, () => {}), undefined, 'no name: no Service');
  t.equal(lib.readService([1], () => {}), undefined);
});

t.test('planListeners: addresses, NodePorts, scopes, target ports, one owner per address', async (t) => {
  const why: string[] = [];
  const svcs = [
    line(
      'a',
      {
        IPs: { ClusterIPs: { V4: ['192.0.2.10'], V6: ['2001:db8::10'] }, ExternalIPs: { V4: ['192.0.2.20'] } },
        Ports: [
          { Name: 'http', Protocol: 1, Port: 80, NodePort: 30080, TargetPort: 8080 },
          { Protocol: 2, Port: 53 },
        ],
      },
      [
        ep('198.51.100.2', '2001:db8:1::2', { PortOverrides: [{ Name: 'http', Port: 9090 }], Scopes: { Internal: true, External: true } }),
        ep('198.51.100.3', undefined, { Scopes: { Internal: true } }),
        ep('198.51.100.4', undefined, { PortOverrides: [{ Port: 5353 }] }),
        ep('198.51.100.2', undefined, { PortOverrides: [{ Name: 'http', Port: 9090 }] }),
      ],
    ),
    line('b', { IPs: { ExternalIPs: { V4: ['192.0.2.10'] } }, Ports: [{ Protocol: 1, Port: 80 }, { Protocol: 1, Port: 81 }] }),
  ].map((l) => lib.readService(JSON.parse(l))!);
  const plan = lib.planListeners(svcs, (m) => why.push(m));
  t.same([...plan.keys()].sort(), [
    'tcp 0.0.0.0 30080',
    'tcp 192.0.2.10 80',
    'tcp 192.0.2.10 81',
    'tcp 192.0.2.20 80',
    'tcp 2001:db8::10 80',
    'tcp :: 30080',
    'udp 192.0.2.10 53',
    'udp 192.0.2.20 53',
    'udp 2001:db8::10 53',
  ]);
  const eps = (k: string) => plan.get(k)!.backend.endpoints.map((e) => e.id);
  t.same(eps('tcp 192.0.2.10 80'), ['198.51.100.2 9090', '198.51.100.3 8080', '198.51.100.4 8080'], 'ClusterIP: Internal endpoints, override by name, else TargetPort; each once');
  t.same(eps('tcp 192.0.2.20 80'), ['198.51.100.2 9090', '198.51.100.4 8080'], 'ExternalIP: External endpoints (no Scopes counts as both)');
  t.same(eps('tcp 0.0.0.0 30080'), eps('tcp 192.0.2.20 80'), 'NodePort: External too');
  t.same(eps('tcp 2001:db8::10 80'), ['2001:db8:1::2 9090'], 'IPv6: the IPv6 endpoints');
  t.same(eps('tcp :: 30080'), ['2001:db8:1::2 9090']);
  t.same(eps('udp 192.0.2.10 53'), ['198.51.100.2 53', '198.51.100.3 53', '198.51.100.4 5353'], 'an unnamed port: the unnamed override, else Port');
  const named = lib.readService(
    JSON.parse(
      line('n', { IPs: { ClusterIPs: { V4: ['192.0.2.11'] } }, Ports: [{ Name: 'm', Protocol: 1, Port: 80, TargetPortName: 'mtr' }] }, [
        ep('198.51.100.2', undefined, { PortOverrides: [{ Name: 'm', Port: 9090 }] }),
        ep('198.51.100.3', undefined, { PortOverrides: [{ Name: 'other', Port: 7070 }] }),
        ep('198.51.100.4', undefined, {}),
      ]),
    ),
  )!;
  const namedPlan = lib.planListeners([named], () => {});
  t.same(namedPlan.get('tcp 192.0.2.11 80')!.backend.endpoints.map((e) => e.id), ['198.51.100.2 9090', '198.51.100.4 80'], 'a named target port: not an endpoint whose overrides lack it (as kube-proxy); none at all: Port');
  t.equal(plan.get('tcp 0.0.0.0 30080')!.nodePort, true);
  t.equal(plan.get('tcp 192.0.2.10 80')!.label, '"default/a" port 80/tcp ("http")', 'the first Service keeps 192.0.2.10:80');
  t.equal(plan.get('tcp 192.0.2.10 81')!.label, '"default/b" port 81/tcp', 'the second gets what is free');
  t.match(why.join('\n'), /192\.0\.2\.10:80\/tcp is claimed by "default\/a" port 80\/tcp \("http"\) already: not for "default\/b" port 80\/tcp/);
});

t.test('ServiceTable: full frames, change sets, and the frames it refuses', async (t) => {
  const a1 = line('a', { Ports: [{ Protocol: 1, Port: 80 }] });
  const a2 = line('a', { Ports: [{ Protocol: 1, Port: 81 }] });
  const b1 = line('b', { Ports: [{ Protocol: 1, Port: 82 }] });
  const c1 = line('c', { Ports: [{ Protocol: 1, Port: 83 }] });
  const full = '{"Frame":{"Seq":1,"Input":"full"}}';
  const changes = '{"Frame":{"Seq":2,"Input":"changes"}}';
  const names = (tb: InstanceType<Lib['ServiceTable']>) => tb.ordered().map((s) => `${s.label}:${s.ports.map((p) => p.port).join()}`);
  const tb = new lib.ServiceTable();
  t.same(tb.apply(changes, [a1]), { ok: false, why: 'a change set with no full state applied before it (waiting for a full frame)' });
  t.same(tb.apply(full, [b1, a1]), { ok: true });
  t.same(names(tb), ['"default/a":80', '"default/b":82'], 'kpng order, whatever the input order');
  t.same(tb.apply(changes, [`{"Previous":${a1}}`, a2, c1, `{"Previous":${b1}}`]), { ok: true });
  t.same(names(tb), ['"default/a":81', '"default/c":83'], 'modified, added, removed');
  t.same(tb.apply(changes, []), { ok: true }, 'an empty change set');
  t.same(names(tb), ['"default/a":81', '"default/c":83']);
  t.match(tb.apply(changes, [`{"Previous":${a1}}`, a2]), { ok: false, why: /not the Service as last applied/ }, 'a Previous line that does not match');
  t.equal(tb.based, false, 'then only a full frame is taken');
  t.match(tb.apply(changes, [c1]), { ok: false, why: /no full state/ });
  t.same(tb.apply(full, [a1]), { ok: true });
  t.match(tb.apply(changes, [a1]), { ok: false, why: /added twice/ });
  t.same(tb.apply(full, [a1]), { ok: true });
  t.match(tb.apply(changes, ['{"Previous":{"Service":{"Name":"zz"}}}']), { ok: false, why: /not the Service as last applied/ }, 'a Previous line of an unknown Service');
  t.same(tb.apply(full, [a1]), { ok: true });
  t.match(tb.apply(changes, ['not json']), { ok: false, why: /line 1 of the frame is not JSON/ });
  t.same(names(tb), ['"default/a":80'], 'a refused frame changes nothing');
  t.match(tb.apply('garbage', []), { ok: false, why: /not a frame header/ });
  t.match(tb.apply('{"Frame":{"Seq":1,"Input":"other"}}', []), { ok: false, why: /not a frame header/ });
  const why: string[] = [];
  const tw = new lib.ServiceTable((m) => why.push(m));
  t.same(tw.apply(full, ['{"x":1}', a1, a1]), { ok: true }, 'a full frame skips what is no Service, and duplicates');
  t.same(names(tw), ['"default/a":80']);
  t.same(why, ['line 1: no Service (namespace and name): skipped', 'line 3: the same Service twice: the first one is used']);
});

t.test('FrameReader: frames across chunk boundaries, CRLF, stray empty lines, a cut frame', async (t) => {
  const frames: Array<[string, string[]]> = [];
  const r = new lib.FrameReader((h, ls) => frames.push([h, ls]));
  const text = 'H1\nl1\nl2\n\nH2\r\n\r\nH3\nx';
  for (const ch of text) r.push(ch);
  t.same(frames, [
    ['H1', ['l1', 'l2']],
    ['H2', []],
  ]);
  t.equal(r.end(), true, 'the input ended inside a frame');
  t.equal(new lib.FrameReader(() => {}).end(), false);
});

t.test('Backend: round robin, skipping endpoints tried, ClientIP affinity', async (t) => {
  const eps = ['a', 'b', 'c'].map((x) => ({ ip: x, port: 1, id: `${x} 1` }));
  const b = new lib.Backend('k');
  b.update({ key: 'k', endpoints: eps, affinityMs: 0 });
  const picks = Array.from({ length: 6 }, () => b.pick('ip', new Set(), 0)!.ip);
  t.same(picks, ['a', 'b', 'c', 'a', 'b', 'c']);
  t.equal(b.pick('ip', new Set(['a 1', 'b 1']), 0)!.ip, 'c', 'the endpoints tried are skipped');
  t.equal(b.pick('ip', new Set(['a 1', 'b 1', 'c 1']), 0), undefined, 'none left');
  // A retry does not use up the next connection's turn: with [down, up], a connection that tried `a` (down) and
  // got `b` leaves the next one to start at `b`, so `a` is tried by its share of connections, not by every one.
  const two = new lib.Backend('two');
  two.update({ key: 'two', endpoints: eps.slice(0, 2), affinityMs: 0 });
  t.equal(two.pick('ip', new Set(), 0)!.ip, 'a');
  t.equal(two.pick('ip', new Set(['a 1']), 0)!.ip, 'b', 'the retry');
  t.same([two.pick('ip', new Set(), 0)!.ip, two.pick('ip', new Set(), 0)!.ip], ['b', 'a'], 'the turns go on from where the first pick left them');
  b.update({ key: 'k', endpoints: eps, affinityMs: 1000 });
  const first = b.pick('client', new Set(), 0)!.ip;
  t.same(Array.from({ length: 5 }, (_, i) => b.pick('client', new Set(), 500 * i)!.ip), Array(5).fill(first), 'sticks while used within the timeout');
  t.not(b.pick('other', new Set(), 2000)!.ip, first, 'another client takes the next one');
  t.not(b.pick('client', new Set(), 5000)!.ip, undefined);
  b.update({ key: 'k', endpoints: eps.filter((e) => e.ip !== first), affinityMs: 1000 });
  t.not(b.pick('client', new Set(), 5100)!.ip, first, 'an endpoint gone: another one');
  b.update({ key: 'k', endpoints: [], affinityMs: 0 });
  t.equal(b.pick('client', new Set(), 0), undefined);
});

t.test('options: defaults, overrides, bad values refused', async (t) => {
  const d = lib.DEFAULTS;
  t.same(
    lib.readOptions({}),
    { maxConnections: d.maxConnections, udpIdleTimeoutMs: d.udpIdleTimeoutMs, connectTimeoutMs: d.connectTimeoutMs, connectAttempts: d.connectAttempts, bufferBytes: d.bufferBytes, logConnections: false },
    'the defaults',
  );
  t.match(lib.readOptions({ USERSPACE_PROXY_MAX_CONNECTIONS: '5', USERSPACE_PROXY_UDP_IDLE_TIMEOUT_MS: '250', USERSPACE_PROXY_LOG: 'connections' }), { maxConnections: 5, udpIdleTimeoutMs: 250, logConnections: true });
  t.throws(() => lib.readOptions({ USERSPACE_PROXY_MAX_CONNECTIONS: '0' }), /USERSPACE_PROXY_MAX_CONNECTIONS must be an integer from 1/);
  t.throws(() => lib.readOptions({ USERSPACE_PROXY_UDP_IDLE_TIMEOUT_MS: '1e3' }), /USERSPACE_PROXY_UDP_IDLE_TIMEOUT_MS/);
  t.throws(() => lib.readOptions({ USERSPACE_PROXY_LOG: 'all' }), /USERSPACE_PROXY_LOG must be "connections"/);
});

t.test('canonicalIP: one spelling per IPv6 address', async (t) => {
  t.equal(lib.canonicalIP('2001:DB8:E:0::150'), '2001:db8:e::150');
  t.equal(lib.canonicalIP('2001:db8:0:0:1:0:0:1'), '2001:db8::1:0:0:1');
  t.equal(lib.canonicalIP('2001:db8::1.2.3.4'), '2001:db8::102:304');
  t.equal(lib.canonicalIP('192.0.2.1'), '192.0.2.1');
});

t.test('readService: protocol names that are not kpng numbers are skipped; addresses in one spelling', async (t) => {
  const why: string[] = [];
  const svc = lib.readService(
    JSON.parse(
      line('a', {
        IPs: { ClusterIPs: { V6: ['2001:DB8:E:0::150'] }, ExternalIPs: { V6: ['2001:db8:e::150'] } },
        Ports: [
          { Protocol: 'constructor', Port: 80 },
          { Protocol: '__proto__', Port: 81 },
          { Protocol: '1', Port: 82 },
          { Protocol: 1, Port: 83 },
        ],
      }, [ep(undefined, '2001:DB8:1::2')]),
    ),
    (m) => why.push(m),
  )!;
  t.same(svc.ports.map((p) => p.port), [83]);
  t.equal(why.filter((w) => /is not TCP, UDP or SCTP/.test(w)).length, 3);
  t.same(svc.ips.internal[6], ['2001:db8:e::150']);
  t.same(svc.ips.external[6], ['2001:db8:e::150']);
  t.same(svc.endpoints[0]!.ip, { 6: '2001:db8:1::2' });
});

t.test('planListeners: endpoints that loop back into the proxy; a Service port that is also a NodePort; shared affinity', async (t) => {
  const why: string[] = [];
  const svcs = [
    // Its endpoint is its own address (a loop), and the address of b's NodePort on this node.
    line('a', { IPs: { ClusterIPs: { V4: ['192.0.2.41'] } }, Ports: [{ Protocol: 1, Port: 80 }, { Protocol: 2, Port: 30100 }], SessionAffinity: { ClientIP: { TimeoutSeconds: 60 } } }, [
      ep('192.0.2.41', undefined),
      ep('198.51.100.9', undefined, { PortOverrides: [{ Port: 30100 }] }),
      ep('198.51.100.2', undefined),
    ]),
    line('b', { IPs: { ClusterIPs: { V4: ['192.0.2.42'] } }, Ports: [{ Protocol: 1, Port: 81, NodePort: 80 }, { Protocol: 2, Port: 82, NodePort: 30100 }] }, [ep('198.51.100.3', undefined)]),
  ].map((l) => lib.readService(JSON.parse(l))!);
  const plan = lib.planListeners(svcs, (m) => why.push(m), new Set(['198.51.100.9']));
  t.same([...plan.keys()].sort(), ['tcp 0.0.0.0 80', 'tcp 192.0.2.42 81', 'tcp :: 80', 'udp 0.0.0.0 30100', 'udp 192.0.2.41 30100', 'udp 192.0.2.42 82', 'udp :: 30100']);
  const any = plan.get('tcp 0.0.0.0 80')!;
  t.same(any.routes!.map((r) => [r.host, r.backend.endpoints.map((e) => e.id)]), [['192.0.2.41', ['198.51.100.9 30100', '198.51.100.2 80']]], 'a:80 served by the NodePort socket, by address; its own address left out (a loop), 30100/tcp is no listener');
  t.same(any.backend.endpoints.map((e) => e.id), ['198.51.100.3 81']);
  t.equal(plan.get('udp 192.0.2.41 30100')!.shared, true);
  t.equal(plan.get('udp 0.0.0.0 30100')!.shared, true);
  t.equal(plan.get('udp 192.0.2.42 82')!.shared, undefined);
  t.same(plan.get('udp 192.0.2.41 30100')!.backend.endpoints.map((e) => e.id), ['198.51.100.2 30100'], 'a NodePort on a node address is a loop too');
  t.match(why.join('\n'), /endpoint 192\.0\.2\.41:80 is an address this proxy listens on \(a loop\): skipped/);
  t.match(why.join('\n'), /endpoint 198\.51\.100\.9:30100 is an address this proxy listens on/);
});

t.test('Backend: one affinity for a Service port, whichever address the client comes through', async (t) => {
  const eps = ['a', 'b', 'c'].map((x) => ({ ip: x, port: 1, id: `${x} 1` }));
  const shared = new Map();
  const internal = new lib.Backend('i', shared);
  const external = new lib.Backend('e', shared);
  internal.update({ key: 'i', endpoints: eps, affinityMs: 1000 });
  external.update({ key: 'e', endpoints: eps, affinityMs: 1000 });
  const first = internal.pick('client', new Set(), 0)!.ip;
  t.equal(external.pick('client', new Set(), 10)!.ip, first);
  external.update({ key: 'e', endpoints: eps.filter((e) => e.ip !== first), affinityMs: 1000 });
  const other = external.pick('client', new Set(), 20)!.ip;
  t.not(other, first, 'not in this scope: another, which the client keeps from then on');
  t.equal(internal.pick('client', new Set(), 30)!.ip, other);
});
