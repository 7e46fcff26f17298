/**
 * service-proxy-nft on edge cases of its input, fed directly, in a network
 * namespace the test creates (root, nft): change sets for a Service of more
 * than 64 endpoints (its shared chain is kept, not re-added), a cluster IP two
 * Services hold, a destination another Service holds without endpoints (the
 * transaction fails; a full state decides), a cluster IP a Service also lists
 * as an external IP, destinations that share their endpoints (keyed per
 * Service or per Service port: change sets across both, equal to full
 * states), the key when another Service holds the cluster IP as an external
 * IP, and a Service without a cluster IP. DRY_RUN on edge cases:
 * service-proxy-dry-run.test.ts; real traffic:
 * service-proxy-traffic.test.ts and service-proxy-replay.test.ts.
 */
import t, { type Test } from 'tap';
import { mustRun, runCommand } from '../../helpers/command.js';
import { repoPath } from '../../helpers/fixtures.js';
import { netnsMissing } from '../../helpers/netns.js';
import { mapElements, tableShape } from '../../helpers/nft-table.js';
import { lines, prev, run, svc } from '../../helpers/service-proxy-lines.js';

const NFT = repoPath('callouts/service-proxy-nft');

const NS_PREFIX = 'kpspe-';
const why = await netnsMissing(NS_PREFIX, ['ip', 'nft', 'jq'], 'apt-get install iproute2 nftables jq');

t.test('service-proxy-nft change sets on edge cases, in a network namespace', { skip: why ?? false }, async (t) => {
  const ns = `${NS_PREFIX}${process.pid}`;
  await mustRun('ip', ['netns', 'add', ns]);
  t.teardown(() => runCommand('ip', ['netns', 'del', ns]).then(() => undefined));
  const nft = (...args: string[]): Promise<string> => mustRun('ip', ['netns', 'exec', ns, 'nft', ...args]);
  const apply = (input: string, kind: 'full' | 'changes' = 'full') => run(NFT, input, { KPNG_CALLOUT_INPUT: kind }, ns);
  /** The elements of a map ('' when it has none, or the table lacks it: a shared chain's map, see tableShape()). */
  const mapEls = async (m: string): Promise<string> => {
    const r = await runCommand('ip', ['netns', 'exec', ns, 'nft', 'list', 'map', 'inet', 'kpng_service_proxy', m]);
    return mapElements(r.code === 0 ? r.stdout : undefined);
  };
  /** The table, as tables of the same elements and rules compare equal (tableShape()). */
  const shape = async (): Promise<string[]> => tableShape(await nft('-j', 'list', 'table', 'inet', 'kpng_service_proxy'));
  /** Each change set FROM -> TO applies, and leaves `listing()` as the full state of TO then does. */
  const changesAsFull = async (t: Test, steps: ReadonlyArray<readonly [string, string]>, listing: () => Promise<unknown>) => {
    for (const [from, to] of steps) {
      const r = await apply(lines(prev(from), to), 'changes');
      t.equal(r.code, 0, 'the change set applies', { stderr: r.stderr });
      const viaChanges = await listing();
      t.equal((await apply(lines(to))).code, 0);
      t.same(viaChanges, await listing(), 'as the full state of the new one');
    }
  };

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

  await t.test('two Services of one change set with the same cluster IP: refused, changing nothing; a full state decides', async (t) => {
    const other = svc('d', 'other', '192.0.2.22');
    t.equal((await apply(lines(other))).code, 0);
    const before = await nft('list', 'table', 'inet', 'kpng_service_proxy');
    const a = svc('d', 'a', '192.0.2.21', { eps: ['198.51.100.21'] });
    const b = svc('d', 'b', '192.0.2.21', { eps: ['198.51.100.21'], ports: [{ Protocol: 1, Port: 81, TargetPort: 8081 }] });
    const r = await apply(lines(a, b), 'changes');
    t.equal(r.code, 1, 'refused', { stderr: r.stderr });
    t.match(r.stderr, /two Services of the change set hold cluster IP 192\.0\.2\.21/);
    t.equal(await nft('list', 'table', 'inet', 'kpng_service_proxy'), before, 'nothing changed');
    t.equal((await apply(lines(a, b, other))).code, 0, 'the full state applies');
    t.match(await nft('list', 'set', 'inet', 'kpng_service_proxy', 'cipdups4'), /192\.0\.2\.21/, 'and records the cluster IP two Services hold');
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
      Promise.all(['svc4', 'key4', 'ep4_1', 'ep4_2', 'epa4_1', 'epa4_2', 'tp4'].map(mapEls));
    t.equal((await apply(lines(a))).code, 0);
    const fullA = await maps();
    const [svcA, keyA, , epA, , epaA, tpA] = fullA;
    t.match(keyA, /192\.0\.2\.41 \. tcp \. 80 : 192\.0\.2\.40/, 'an external IP is keyed by the cluster IP');
    t.match(keyA, /192\.0\.2\.42 \. tcp \. 80 : 192\.0\.2\.40/);
    t.match(svcA, /192\.0\.2\.41 \. tcp \. 80 : goto z4_2/, 'through the chain that marks for masquerade and rewrites');
    t.match(epaA, /192\.0\.2\.40 \. 0 : 198\.51\.100\.40/, 'the endpoints keyed per Service by the cluster IP');
    t.match(tpA, /192\.0\.2\.40 \. tcp \. 80 : 8080/, 'and its target port');
    t.notMatch(`${epA ?? ''}${epaA ?? ''}`, /192\.0\.2\.4[12] /, 'the external IPs have no endpoint elements of their own');
    await changesAsFull(
      t,
      [
        [a, b],
        [b, a],
      ],
      maps,
    );
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
    t.equal((await apply(lines(a))).code, 0);
    const svcA = await nft('list', 'map', 'inet', 'kpng_service_proxy', 'svc4');
    t.match(svcA, /192\.0\.2\.30 \. tcp \. 80 : goto q4_2/, 'a: per Service');
    t.match(svcA, /192\.0\.2\.31 \. udp \. 81 : goto z4_2/);
    await changesAsFull(
      t,
      [
        [a, b],
        [b, c],
        [c, a],
        [a, c],
        [c, b],
        [b, a],
      ],
      shape,
    );
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
    t.match(await nft('list', 'table', 'inet', 'kpng_service_proxy'), /192\.0\.2\.36 \. tcp \. 80 \. 0 : 198\.51\.100\.36 \. 8082/, "b's external IP keys its own elements");
    const viaChanges = await shape();
    t.equal((await apply(lines(a2, b2))).code, 0);
    t.same(await shape(), viaChanges, 'as the full state');
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
