/**
 * The bundled service proxiers on edge cases of their input, fed directly:
 * - service-proxy-nft in a network namespace the test creates (root, nft):
 *   change sets for a Service of more than 64 endpoints (its shared chain
 *   is kept, not re-added), a destination another Service holds without
 *   endpoints (the transaction fails; a full state decides), a cluster IP a
 *   Service also lists as an external IP, destinations that share their
 *   endpoints (keyed by one of them: change sets across that, and the key
 *   when another Service holds the cluster IP as an external IP);
 * - DRY_RUN (jq only): names Kubernetes would refuse (served, objects named by
 *   a hash), numbers given as strings or fractions (skipped, logged), ClientIP
 *   affinity refreshed by every new connection of a known client;
 *   service-proxy-iptables: the first Service in the state's order owns a
 *   destination, bad numbers are logged, a line that is not a Service is
 *   invalid input, anything but a full state is refused.
 * Real traffic: service-proxy.test.ts.
 */
import t from 'tap';
import { missingTools, mustRun, runCommand, type CommandResult } from '../../helpers/command.js';
import { repoPath } from '../../helpers/fixtures.js';
import { netnsMissing } from '../../helpers/netns.js';
import { routes } from '../../helpers/nft-routes.js';

const NFT = repoPath('callouts/service-proxy-nft');
const IPT = repoPath('callouts/service-proxy-iptables');

interface SvcOptions {
  eps?: string[] | null;
  ext?: string[];
  affinity?: number;
  ports?: unknown[];
}

/** A Service line: ClusterIP `ip`, TCP 80 -> 8080 unless `ports`, endpoints of both scopes. */
function svc(ns: string, name: string, ip: string, o: SvcOptions = {}): string {
  const IPs: Record<string, unknown> = { ClusterIPs: { V4: [ip] } };
  if (o.ext) IPs.ExternalIPs = { V4: o.ext };
  return JSON.stringify({
    Service: {
      Namespace: ns,
      Name: name,
      Type: 'ClusterIP',
      IPs,
      Ports: o.ports ?? [{ Protocol: 1, Port: 80, TargetPort: 8080 }],
      SessionAffinity: o.affinity === undefined ? null : { ClientIP: { TimeoutSeconds: o.affinity } },
    },
    Endpoints: o.eps === null ? null : (o.eps ?? ['198.51.100.1']).map((e) => ({ IPs: { V4: [e] }, Scopes: { Internal: true, External: true } })),
  });
}
const prev = (line: string): string => `{"Previous":${line}}`;
const lines = (...l: string[]): string => l.map((x) => x + '\n').join('');

function run(cmd: string, input: string, env: NodeJS.ProcessEnv = {}, ns?: string): Promise<CommandResult> {
  const [c, args] = ns ? ['ip', ['netns', 'exec', ns, cmd]] : [cmd, []];
  return runCommand(c as string, args as string[], { input, env: { ...process.env, ...env }, timeoutMs: 60_000 });
}

const NS_PREFIX = 'kpspe-';
const why = await netnsMissing(NS_PREFIX, ['ip', 'nft', 'jq'], 'apt-get install iproute2 nftables jq');

t.test('service-proxy-nft change sets on edge cases, in a network namespace', { skip: why ?? false }, async (t) => {
  const ns = `${NS_PREFIX}${process.pid}`;
  await mustRun('ip', ['netns', 'add', ns]);
  t.teardown(() => runCommand('ip', ['netns', 'del', ns]).then(() => undefined));
  const nft = (...args: string[]): Promise<string> => mustRun('ip', ['netns', 'exec', ns, 'nft', ...args]);
  const apply = (input: string, kind: 'full' | 'changes' = 'full') => run(NFT, input, { KPNG_CALLOUT_INPUT: kind }, ns);

  await t.test('a cluster IP two Services hold: a change set to either fails, changing nothing; a full state decides', async (t) => {
    const b = svc('d', 'b', '192.0.2.20');
    const c = svc('d', 'c', '192.0.2.20', { ports: [{ Protocol: 1, Port: 81, TargetPort: 8080 }] });
    t.equal((await apply(lines(b, c))).code, 0);
    const r = await apply(lines(prev(c)), 'changes');
    t.equal(r.code, 1, 'refused (deleting the address would leave "b" without its check)', { stderr: r.stderr });
    t.match(r.stderr, /cipdups4/);
    t.match(await nft('list', 'set', 'inet', 'kpng_service_proxy', 'clusterips4'), /192\.0\.2\.20/, 'the cluster IP is still checked');
    t.equal((await apply(lines(b))).code, 0, 'the full state applies');
    t.equal((await apply(lines(prev(b)), 'changes')).code, 0, 'then a change set removing the last holder applies');
    t.notMatch(await nft('list', 'set', 'inet', 'kpng_service_proxy', 'clusterips4'), /192\.0\.2\.20/, 'and the address is gone');
  });

  await t.test('a Service of 70 endpoints: a change set moves one (its shared chain exists, left as it is)', async (t) => {
    const many = Array.from({ length: 70 }, (_, i) => `198.51.100.${i + 1}`);
    const moved = [...many.slice(0, -1), '198.51.100.200'];
    const a = svc('b', 'many', '192.0.2.92', { eps: many });
    const b = svc('b', 'many', '192.0.2.92', { eps: moved });
    t.equal((await apply(lines(a))).code, 0);
    const r = await apply(lines(prev(a), b), 'changes');
    t.equal(r.code, 0, 'applied', { stderr: r.stderr });
    const viaChanges = await nft('list', 'map', 'inet', 'kpng_service_proxy', 'epa4_70');
    t.match(viaChanges, /198\.51\.100\.200/);
    t.notMatch(viaChanges, /198\.51\.100\.70[^0-9]/);
    t.equal((await apply(lines(b))).code, 0);
    t.equal(await nft('list', 'map', 'inet', 'kpng_service_proxy', 'epa4_70'), viaChanges, 'as a full state of the new one leaves it');
    // Twice more: the chain q4_70 is there from the change set's own table too.
    t.equal((await apply(lines(prev(b), a), 'changes')).code, 0);
    t.equal((await apply(lines(prev(a), b), 'changes')).code, 0);
  });

  await t.test('a destination held by a Service without endpoints: a change set adding it for another fails; a full state keeps the first', async (t) => {
    const empty = svc('a', 'aaa', '192.0.2.80', { eps: null });
    const other = svc('c', 'ccc', '192.0.2.80', { eps: ['198.51.100.80'] });
    t.equal((await apply(lines(empty))).code, 0);
    const before = await nft('list', 'table', 'inet', 'kpng_service_proxy');
    const r = await apply(lines(other), 'changes');
    t.equal(r.code, 1, 'refused: the runner then sends the full state');
    t.equal(await nft('list', 'table', 'inet', 'kpng_service_proxy'), before, 'nothing changed');
    const full = await apply(lines(empty, other));
    t.equal(full.code, 0);
    t.match(full.stderr, /"c\/ccc": skipping destination 192\.0\.2\.80 \. tcp \. 80: already used by "a\/aaa"/);
    t.notMatch(await nft('list', 'map', 'inet', 'kpng_service_proxy', 'svc4'), /192\.0\.2\.80/, 'not in svc4');
    t.match(await nft('list', 'map', 'inet', 'kpng_service_proxy', 'noep4'), /192\.0\.2\.80 \. tcp \. 80 : goto reject_new/);
  });

  await t.test('destinations with the same endpoints share their elements; change sets across that, as full states', async (t) => {
    // a ClusterIP and two external IPs; in "b" one endpoint is Internal only, so the external IPs get their own
    const line = (external: boolean) =>
      JSON.stringify({
        Service: { Namespace: 'k', Name: 'shared', Type: 'ClusterIP', IPs: { ClusterIPs: { V4: ['192.0.2.40'] }, ExternalIPs: { V4: ['192.0.2.41', '192.0.2.42'] } }, Ports: [{ Protocol: 1, Port: 80, TargetPort: 8080 }] },
        Endpoints: [
          { IPs: { V4: ['198.51.100.40'] }, Scopes: { Internal: true, External: true } },
          { IPs: { V4: ['198.51.100.41'] }, Scopes: { Internal: true, External: external } },
        ],
      });
    const [a, b] = [line(true), line(false)];
    const maps = async () =>
      Promise.all(['svc4', 'key4', 'ep4_1', 'ep4_2', 'epa4_1', 'epa4_2', 'tp4'].map((m) => nft('list', 'map', 'inet', 'kpng_service_proxy', m)));
    t.equal((await apply(lines(a))).code, 0);
    const fullA = await maps();
    const [svcA, keyA, , epA, , epaA, tpA] = fullA;
    t.match(keyA, /192\.0\.2\.41 \. tcp \. 80 : 192\.0\.2\.40/, 'an external IP is keyed by the cluster IP');
    t.match(keyA, /192\.0\.2\.42 \. tcp \. 80 : 192\.0\.2\.40/);
    t.match(svcA, /192\.0\.2\.41 \. tcp \. 80 : goto z4_2/, 'through the chain that marks for masquerade and rewrites');
    t.match(epaA, /192\.0\.2\.40 \. 0 : 198\.51\.100\.40/, 'the endpoints keyed per Service by the cluster IP');
    t.match(tpA, /192\.0\.2\.40 \. tcp \. 80 : 8080/, 'and its target port');
    t.notMatch(`${epA ?? ''}${epaA ?? ''}`, /192\.0\.2\.4[12] /, 'the external IPs have no endpoint elements of their own');
    for (const [from, to] of [
      [a, b],
      [b, a],
    ] as const) {
      const r = await apply(lines(prev(from), to), 'changes');
      t.equal(r.code, 0, 'the change set applies', { stderr: r.stderr });
      const viaChanges = await maps();
      t.equal((await apply(lines(to))).code, 0);
      t.same(viaChanges, await maps(), 'as the full state of the new one');
    }
    t.equal((await apply(lines(b))).code, 0);
    const [, keyB, epB1] = await maps();
    t.match(keyB, /192\.0\.2\.42 \. tcp \. 80 : 192\.0\.2\.41/, 'b: the second external IP is keyed by the first');
    t.match(epB1, /192\.0\.2\.41 \. tcp \. 80 \. 0 : 198\.51\.100\.40 \. 8080/, 'b: the first external IP has its own (External) endpoint');
    t.equal((await apply(lines(a))).code, 0);
    t.same(await maps(), fullA, 'a again');
  });

  await t.test('the key of shared destinations is a cluster IP the Service alone holds (another holds it as an external IP)', async (t) => {
    const first = svc('a', 'first', '192.0.2.45', { eps: ['198.51.100.45'], ext: ['192.0.2.46'] });
    const second = svc('b', 'second', '192.0.2.46', { eps: ['198.51.100.46'], ext: ['192.0.2.47', '192.0.2.48'] });
    const r = await apply(lines(first, second));
    t.equal(r.code, 0, 'applied', { stderr: r.stderr });
    t.match(r.stderr, /"b\/second": skipping destination 192\.0\.2\.46 \. tcp \. 80: already used by "a\/first"/);
    const key4 = await nft('list', 'map', 'inet', 'kpng_service_proxy', 'key4');
    t.match(key4, /192\.0\.2\.46 \. tcp \. 80 : 192\.0\.2\.45/, "first's external IP is keyed by first's cluster IP");
    t.match(key4, /192\.0\.2\.47 \. tcp \. 80 : 192\.0\.2\.46/, "second's external IPs by second's cluster IP");
    t.match(key4, /192\.0\.2\.48 \. tcp \. 80 : 192\.0\.2\.46/);
    const epa = await nft('list', 'map', 'inet', 'kpng_service_proxy', 'epa4_1');
    t.match(epa, /192\.0\.2\.45 \. 0 : 198\.51\.100\.45/);
    t.match(epa, /192\.0\.2\.46 \. 0 : 198\.51\.100\.46/);
  });

  await t.test('keyed per Service, per Service port, or both: change sets across them, as full states', async (t) => {
    // a: both ports' endpoints share their target ports (per Service); b: port 80's differ (it goes per port);
    // c: ExternalTrafficToLocal with an Internal-only endpoint (the external IP's list differs: per port)
    const line = (web2: number, etp: boolean) =>
      JSON.stringify({
        Service: {
          Namespace: 'k',
          Name: 'kinds',
          Type: 'ClusterIP',
          IPs: { ClusterIPs: { V4: ['192.0.2.30'] }, ExternalIPs: { V4: ['192.0.2.31'] } },
          Ports: [
            { Name: 'http', Protocol: 1, Port: 80, TargetPortName: 'web' },
            { Name: 'alt', Protocol: 2, Port: 81, TargetPort: 8181 },
          ],
          ExternalTrafficToLocal: etp,
        },
        Endpoints: [
          { IPs: { V4: ['198.51.100.30'] }, PortOverrides: [{ Name: 'http', Port: 8080 }], Scopes: { Internal: true, External: true } },
          { IPs: { V4: ['198.51.100.31'] }, PortOverrides: [{ Name: 'http', Port: web2 }], Scopes: { Internal: true, External: !etp } },
        ],
      });
    const [a, b, c] = [line(8080, false), line(8081, false), line(8080, true)];
    const table = () => nft('list', 'table', 'inet', 'kpng_service_proxy');
    t.equal((await apply(lines(a))).code, 0);
    const svcA = await nft('list', 'map', 'inet', 'kpng_service_proxy', 'svc4');
    t.match(svcA, /192\.0\.2\.30 \. tcp \. 80 : goto q4_2/, 'a: per Service');
    t.match(svcA, /192\.0\.2\.31 \. udp \. 81 : goto z4_2/);
    for (const [from, to] of [
      [a, b],
      [b, c],
      [c, a],
      [a, c],
      [c, b],
      [b, a],
    ] as const) {
      const r = await apply(lines(prev(from), to), 'changes');
      t.equal(r.code, 0, 'the change set applies', { stderr: r.stderr });
      const viaChanges = await table();
      t.equal((await apply(lines(to))).code, 0);
      t.equal(viaChanges, await table(), 'as the full state of the new one');
    }
    t.equal((await apply(lines(b))).code, 0);
    const svcB = await nft('list', 'map', 'inet', 'kpng_service_proxy', 'svc4');
    t.match(svcB, /192\.0\.2\.30 \. tcp \. 80 : goto p4_2/, 'b: port 80 per Service port');
    t.match(svcB, /192\.0\.2\.30 \. udp \. 81 : goto q4_2/, 'port 81 still per Service');
    t.equal((await apply(lines(c))).code, 0);
    const svcC = await nft('list', 'map', 'inet', 'kpng_service_proxy', 'svc4');
    t.match(svcC, /192\.0\.2\.30 \. tcp \. 80 : goto q4_2/, 'c: the cluster IP per Service');
    t.match(svcC, /192\.0\.2\.31 \. tcp \. 80 : goto p4_1/, 'its external IP (another list) per Service port, not masqueraded');
  });

  await t.test('a Service without a cluster IP (or headless) is keyed per port, whatever the line before it holds', async (t) => {
    const bare = (name: string, ips: Record<string, unknown>, ep: string, target: number) =>
      JSON.stringify({
        Service: { Namespace: 'k', Name: name, Type: 'ClusterIP', IPs: ips, Ports: [{ Protocol: 1, Port: 80, TargetPort: target }] },
        Endpoints: [{ IPs: { V4: [ep] } }],
      });
    const a = svc('k', 'a', '192.0.2.35', { eps: ['198.51.100.35'] });
    // (target ports change, not endpoints: a change set leaves hairpin elements, see callouts/README.md)
    const a2 = svc('k', 'a', '192.0.2.35', { eps: ['198.51.100.35'], ports: [{ Protocol: 1, Port: 80, TargetPort: 8090 }] });
    const b = bare('b', { ExternalIPs: { V4: ['192.0.2.36'] } }, '198.51.100.36', 8081);
    const b2 = bare('b', { ExternalIPs: { V4: ['192.0.2.36'] } }, '198.51.100.36', 8082);
    t.equal((await apply(lines(a, b))).code, 0);
    const r = await apply(lines(prev(a), a2, prev(b), b2), 'changes');
    t.equal(r.code, 0, 'a change set of both applies', { stderr: r.stderr });
    const viaChanges = await nft('list', 'table', 'inet', 'kpng_service_proxy');
    t.match(viaChanges, /192\.0\.2\.36 \. tcp \. 80 \. 0 : 198\.51\.100\.36 \. 8082/, "b's external IP keys its own elements");
    t.equal((await apply(lines(a2, b2))).code, 0);
    t.equal(await nft('list', 'table', 'inet', 'kpng_service_proxy'), viaChanges, 'as the full state');
    // a headless Service that lists a cluster IP, then two with external IPs only: none takes that address as a key
    const h = bare('h', { ClusterIPs: { V4: ['192.0.2.37'] }, Headless: true }, '198.51.100.37', 8080);
    const e1 = bare('e1', { ExternalIPs: { V4: ['192.0.2.38'] } }, '198.51.100.38', 8080);
    const e2 = bare('e2', { ExternalIPs: { V4: ['192.0.2.39'] } }, '198.51.100.39', 8081);
    const full = await apply(lines(h, e1, e2));
    t.equal(full.code, 0, 'the full state applies', { stderr: full.stderr });
    t.notMatch(await nft('list', 'map', 'inet', 'kpng_service_proxy', 'tp4'), /192\.0\.2\.37/);
  });

  await t.test('a cluster IP also listed as an external IP: change sets apply, as a full state', async (t) => {
    const a = svc('d', 'same', '192.0.2.70', { eps: ['198.51.100.70'], ext: ['192.0.2.70'] });
    const b = svc('d', 'same', '192.0.2.70', { eps: ['198.51.100.71'], ext: ['192.0.2.70'] });
    t.equal((await apply(lines(a))).code, 0);
    const r = await apply(lines(prev(a), b), 'changes');
    t.equal(r.code, 0, 'applied', { stderr: r.stderr });
    const svc4 = await nft('list', 'map', 'inet', 'kpng_service_proxy', 'svc4');
    const ep4 = await nft('list', 'map', 'inet', 'kpng_service_proxy', 'epa4_1');
    t.match(ep4, /198\.51\.100\.71/);
    t.equal((await apply(lines(b))).code, 0);
    t.equal(await nft('list', 'map', 'inet', 'kpng_service_proxy', 'svc4'), svc4);
    t.equal(await nft('list', 'map', 'inet', 'kpng_service_proxy', 'epa4_1'), ep4);
  });
});

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
