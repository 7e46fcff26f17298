/**
 * The bundled service proxiers with DRY_RUN=1 (jq only, no root) on edge
 * cases of their input: service-proxy-nft with names Kubernetes would refuse
 * (served, objects named by a hash), numbers given as strings or fractions
 * (skipped, logged), ClientIP affinity refreshed by every new connection of a
 * known client; service-proxy-iptables: the first Service in the state's
 * order owns a destination, bad numbers are logged, a line that is not a
 * Service is invalid input, anything but a full state is refused, NodePorts
 * not on loopback; both: PortOverrides that lack a named target port, or a
 * number. Where traffic goes is read from the nft script by its lookups
 * (test/helpers/nft-routes.ts). In a network namespace:
 * service-proxy-edges.test.ts; real traffic:
 * service-proxy-traffic.test.ts and service-proxy-replay.test.ts.
 */
import t from 'tap';
import { missingTools } from '../../helpers/command.js';
import { repoPath } from '../../helpers/fixtures.js';
import { routes } from '../../helpers/nft-routes.js';
import { lines, run, svc } from '../../helpers/service-proxy-lines.js';

const NFT = repoPath('callouts/service-proxy-nft');
const IPT = repoPath('callouts/service-proxy-iptables');

const noJq = missingTools(['jq']).length > 0 ? 'jq is missing (apt-get install jq)' : false;

t.test('service-proxy-nft DRY_RUN: names, numbers, affinity', { skip: noJq }, async (t) => {
  const hostile = svc('ns;x', 'we"b;$(touch /nonexistent)\nx', '192.0.2.60', { eps: ['198.51.100.60'], affinity: 10 });
  const r = await run(NFT, lines(hostile), { DRY_RUN: '1' });
  t.equal(r.code, 0, 'served', { stderr: r.stderr });
  t.match(r.stdout, /192\.0\.2\.60 \. tcp \. 80 : goto a4c-h\d+-\d+-tcp80/, 'its affinity chain named by a hash');
  t.notMatch(r.stdout, /touch|we"b|ns;x/, 'no text of its names in the script');
  t.match(r.stdout, /ip saddr @a4-h\d+-\d+-tcp80-1 goto e4-h\d+-\d+-tcp80-1/, 'a known client goes through the endpoint chain');
  t.match(r.stdout, /chain e4-h\d+-\d+-tcp80-1 \{\n\t\tupdate @a4-h\d+-\d+-tcp80-1 \{ ip saddr \}/, 'which restarts its timeout');

  const numbers = svc('e', 's', '192.0.2.90', {
    ports: [
      { Protocol: '2', Port: '83' },
      { Protocol: 1, Port: 80.5 },
      { Protocol: 1, Port: 84, TargetPort: '8084' },
      { Protocol: 1, Port: 85 },
    ],
  });
  const n = await run(NFT, lines(numbers), { DRY_RUN: '1' });
  t.equal(n.code, 0);
  t.match(n.stderr, /skipping port ""83"": protocol ""2"" is not TCP, UDP or SCTP/);
  t.match(n.stderr, /skipping port "80\.5": not a port number/);
  t.match(n.stderr, /ignoring target port ""8084"": not a port number/);
  t.same(routes(n.stdout).get('192.0.2.90 . tcp . 84'), ['198.51.100.1:84'], 'a target port given as a string: the port itself');
  t.same(routes(n.stdout).get('192.0.2.90 . tcp . 85'), ['198.51.100.1:85']);
  t.notMatch(n.stdout, /\. (83|80) [:.]/, 'nothing of the skipped ports');
});

t.test('service-proxy-iptables DRY_RUN: who owns a destination, bad numbers, a line that is not a Service', { skip: noJq }, async (t) => {
  // kpng order: a/cc before a/dd (whatever their chain names hash to)
  const r = await run(IPT, lines(svc('a', 'cc', '192.0.2.50', { eps: ['198.51.100.1'] }), svc('a', 'dd', '192.0.2.50', { eps: ['198.51.100.2'] })), { DRY_RUN: '1' });
  t.equal(r.code, 0, 'applied', { stderr: r.stderr });
  t.equal(r.stdout.match(/-d 192\.0\.2\.50\/32/g)?.length, 1, 'one rule for the destination');
  t.match(r.stdout, /198\.51\.100\.1:8080/, 'the first Service\'s endpoint');
  t.notMatch(r.stdout, /198\.51\.100\.2:/);
  t.match(r.stderr, /"a\/dd": skipping destination 192\.0\.2\.50 tcp 80: already used by "a\/cc"/);

  const bad = svc('e', 's', '192.0.2.90', {
    ports: [
      { Protocol: 1, Port: 80.5 },
      { Protocol: 1.2, Port: 81 },
      { Protocol: 1, Port: '82' },
      { Protocol: 1, Port: 84, TargetPort: 70000 },
    ],
    affinity: 99999,
  });
  const b = await run(IPT, lines(bad), { DRY_RUN: '1' });
  t.equal(b.code, 0);
  t.match(b.stderr, /port "80\.5" is not an integer 1-65535/);
  t.match(b.stderr, /protocol "1\.2" is not TCP, UDP or SCTP/);
  t.match(b.stderr, /port ""82"" is not an integer 1-65535/);
  t.match(b.stderr, /target port "70000" is not an integer 1-65535; using the port/);
  t.match(b.stderr, /session affinity timeout "99999" is not 1\.\.86400; using 10800/);
  t.match(b.stdout, /--dport 84 /);
  t.match(b.stdout, /DNAT --to-destination 198\.51\.100\.1:84/);
  t.notMatch(b.stdout, /--dport (80|81|82) /);

  for (const line of ['[]', '{}', '42', '{"Service":"x"}', '{"Service":null}']) {
    const x = await run(IPT, `${line}\n`, { DRY_RUN: '1' });
    t.equal(x.code, 1, `${line}: invalid input, exit 1`);
    t.match(x.stderr, /cannot read the state/);
    // Anywhere, not only last (jq 1.6 run once per line reports only the last line's error).
    const first = await run(IPT, `${line}\n${lines(svc('a', 'cc', '192.0.2.50', { eps: ['198.51.100.1'] }))}`, { DRY_RUN: '1' });
    t.equal(first.code, 1, `${line} before a Service: invalid input, exit 1`);
    t.equal(first.stdout, '', 'nothing printed');
  }
});

t.test('service-proxy-iptables takes full states only: a change set, a persistent session or an unknown input kind is refused, nothing printed', { skip: noJq }, async (t) => {
  const line = svc('n', 'q', '192.0.2.61');
  for (const [env, re] of [
    [{ KPNG_CALLOUT_INPUT: 'changes' }, /a change set \(KPNG_CALLOUT_INPUT=changes\) cannot be applied/],
    [{ KPNG_CALLOUT_MODE: 'persistent' }, /cannot run as a persistent callout/],
    [{ KPNG_CALLOUT_INPUT: 'diff' }, /KPNG_CALLOUT_INPUT must be full/],
  ] as Array<[NodeJS.ProcessEnv, RegExp]>) {
    const r = await run(IPT, lines(line), { DRY_RUN: '1', ...env });
    t.equal(r.code, 1, JSON.stringify(env));
    t.equal(r.stdout, '', 'nothing printed');
    t.match(r.stderr, re);
  }
  const ok = await run(IPT, lines(line), { DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'full' });
  t.equal(ok.code, 0, 'KPNG_CALLOUT_INPUT=full', { stderr: ok.stderr });
});

t.test('service-proxy-iptables DRY_RUN: NodePorts are not taken on loopback (as kube-proxy)', { skip: noJq }, async (t) => {
  // DNATed from 127.0.0.1 / ::1 without route_localnet, a connection leaves with a loopback source and hangs.
  const line = svc('n', 'p', '192.0.2.60', { ports: [{ Protocol: 1, Port: 80, NodePort: 30080, TargetPort: 8080 }] });
  const r = await run(IPT, lines(line), { DRY_RUN: '1' });
  t.equal(r.code, 0, 'applied', { stderr: r.stderr });
  const jumps = r.stdout.split('\n').filter((l) => l.includes('-j KPNG-SP-NODEPORTS') && l.startsWith('-A KPNG-SP-SERVICES'));
  t.same(jumps, [
    '-A KPNG-SP-SERVICES ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j KPNG-SP-NODEPORTS',
    '-A KPNG-SP-SERVICES ! -d ::1/128 -m addrtype --dst-type LOCAL -j KPNG-SP-NODEPORTS',
  ], 'one jump per family, loopback left out');
});

t.test('DRY_RUN: an endpoint whose PortOverrides lack a named target port is not used for it (as kube-proxy), a numeric one or none falls back', { skip: noJq }, async (t) => {
  // pod2's slice lacks "metrics" (its pod does not serve "mtr"); "num" (a numeric TargetPort) and "raw" (none: Port)
  // keep the fallbacks.
  const ep = (ip: string, overrides: unknown[]) => ({ IPs: { V4: [ip] }, PortOverrides: overrides, Scopes: { Internal: true, External: true } });
  const line = JSON.stringify({
    Service: {
      Namespace: 'default',
      Name: 'named',
      Type: 'ClusterIP',
      IPs: { ClusterIPs: { V4: ['192.0.2.60'] } },
      Ports: [
        { Name: 'http', Protocol: 1, Port: 80, TargetPortName: 'web' },
        { Name: 'metrics', Protocol: 1, Port: 8443, TargetPortName: 'mtr' },
        { Name: 'num', Protocol: 1, Port: 81, TargetPort: 8181 },
        { Name: 'raw', Protocol: 1, Port: 82 },
      ],
      SessionAffinity: null,
    },
    Endpoints: [ep('198.51.100.2', [{ Name: 'http', Port: 8080 }, { Name: 'metrics', Port: 9090 }]), ep('198.51.100.130', [{ Name: 'http', Port: 8080 }])],
  });
  const nft = await run(NFT, lines(line), { DRY_RUN: '1' });
  t.equal(nft.code, 0, 'nft: planned', { stderr: nft.stderr });
  t.same(Object.fromEntries(routes(nft.stdout)), {
    '192.0.2.60 . tcp . 80': ['198.51.100.2:8080', '198.51.100.130:8080'],
    '192.0.2.60 . tcp . 81': ['198.51.100.2:8181', '198.51.100.130:8181'],
    '192.0.2.60 . tcp . 82': ['198.51.100.2:82', '198.51.100.130:82'],
    '192.0.2.60 . tcp . 8443': ['198.51.100.2:9090'],
  });
  const ipt = await run(IPT, lines(line), { DRY_RUN: '1' });
  t.equal(ipt.code, 0, 'iptables: planned', { stderr: ipt.stderr });
  const dnat = ipt.stdout.split('\n').flatMap((l) => /--to-destination (\S+)/.exec(l)?.[1] ?? []).sort();
  t.same(dnat, ['198.51.100.130:8080', '198.51.100.130:8181', '198.51.100.130:82', '198.51.100.2:8080', '198.51.100.2:8181', '198.51.100.2:82', '198.51.100.2:9090']);
});

t.test('service-proxy-nft DRY_RUN: the same endpoint address with another target port in each scope: each destination its own port', { skip: noJq }, async (t) => {
  const line = JSON.stringify({
    Service: { Namespace: 'k', Name: 'scopes', Type: 'ClusterIP', IPs: { ClusterIPs: { V4: ['192.0.2.62'] }, ExternalIPs: { V4: ['192.0.2.63'] } }, Ports: [{ Name: 'http', Protocol: 1, Port: 80, TargetPort: 8080 }] },
    Endpoints: [
      { IPs: { V4: ['198.51.100.62'] }, Scopes: { Internal: true, External: false }, PortOverrides: [{ Name: 'http', Port: 8080 }] },
      { IPs: { V4: ['198.51.100.62'] }, Scopes: { Internal: false, External: true }, PortOverrides: [{ Name: 'http', Port: 9090 }] },
    ],
  });
  const r = await run(NFT, lines(line), { DRY_RUN: '1' });
  t.equal(r.code, 0, 'planned', { stderr: r.stderr });
  t.same(Object.fromEntries(routes(r.stdout)), { '192.0.2.62 . tcp . 80': ['198.51.100.62:8080'], '192.0.2.63 . tcp . 80': ['198.51.100.62:9090'] });
});

t.test('DRY_RUN: an endpoint whose PortOverrides entry for the port has no number (an EndpointSlice port without one) is not used for it, as kube-proxy', { skip: noJq }, async (t) => {
  const line = JSON.stringify({
    Service: { Namespace: 'default', Name: 'nilport', Type: 'ClusterIP', IPs: { ClusterIPs: { V4: ['192.0.2.61'] } }, Ports: [{ Name: 'http', Protocol: 1, Port: 80, TargetPort: 8080 }], SessionAffinity: null },
    Endpoints: [
      { IPs: { V4: ['198.51.100.2'] }, PortOverrides: [{ Name: 'http' }] },
      { IPs: { V4: ['198.51.100.3'] }, PortOverrides: [{ Name: 'http', Port: 9090 }] },
    ],
  });
  const nft = await run(NFT, lines(line), { DRY_RUN: '1' });
  t.equal(nft.code, 0, 'nft: planned', { stderr: nft.stderr });
  t.same(Object.fromEntries(routes(nft.stdout)), { '192.0.2.61 . tcp . 80': ['198.51.100.3:9090'] });
  t.match(nft.stderr, /endpoint "198\.51\.100\.2": its port "http" is "0", not a port number: not used for port 80/);
  const ipt = await run(IPT, lines(line), { DRY_RUN: '1' });
  t.equal(ipt.code, 0, 'iptables: planned', { stderr: ipt.stderr });
  t.same(ipt.stdout.split('\n').flatMap((l) => /--to-destination (\S+)/.exec(l)?.[1] ?? []), ['198.51.100.3:9090']);
  t.match(ipt.stderr, /endpoint 198\.51\.100\.2: its port override has no port number: not used for this port/);
});
