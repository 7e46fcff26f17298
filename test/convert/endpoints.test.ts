/**
 * Endpoint conversion (src/convert/endpoints.ts): EndpointSlices in, the
 * endpoints one node sees out, with kpng's node-local rules and keys.
 */
import t from 'tap';
import { marshalEndpoint } from '../../src/codec.js';
import { compileSlice, convertEndpoints, nodeEndpointJsons, nodeEndpoints, sameSlice } from '../../src/convert/endpoints.js';
import { ConversionError } from '../../src/convert/fields.js';
import { encodeEndpoint } from '../../src/gojson.js';
import type { KubeEndpointSlice, KubeService } from '../../src/convert/kube-objects.js';
import { xxh64 } from '../../src/convert/xxhash.js';
import type { Endpoint } from '../../src/model.js';
import { convert, docs, svcYaml } from '../helpers/convert.js';

/** kpng's endpoint key: the hex XXH64 of the endpoint's protobuf {Hostname, IPs, Local}. */
const endpointKey = (ep: Endpoint) => xxh64(marshalEndpoint(ep)).toString(16);

/** Endpoints of the only Service, as compact strings: `ip,ip host L I E ports`. */
function epsOf(out: string): string[] {
  const line = JSON.parse(out) as { Endpoints: Array<Record<string, any>> | null };
  return (line.Endpoints ?? []).map(
    (e) =>
      [...(e.IPs?.V4 ?? []), ...(e.IPs?.V6 ?? [])].join(',') +
      (e.Hostname ? ` host=${e.Hostname}` : '') +
      (e.Local ? ' L' : '') +
      (e.Scopes?.Internal ? ' I' : '') +
      (e.Scopes?.External ? ' E' : '') +
      ' ' +
      JSON.stringify(e.PortOverrides ?? null),
  );
}

t.test('Endpoints: ready only (missing = ready), families, hostname, Local, PortOverrides', async (t) => {
  const out = convert(
    svcYaml() +
      `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {port: 9090}]
endpoints:
- {addresses: [10.1.0.1], conditions: {ready: true}, nodeName: node-a, hostname: web-0}
- {addresses: [10.1.0.2], nodeName: node-b}
- {addresses: [10.1.0.3], conditions: {}, nodeName: node-b}
- {addresses: [10.1.0.4], conditions: {ready: false, serving: true, terminating: true}, nodeName: node-a}
- {addresses: [10.1.0.5, 10.1.0.05], conditions: {ready: null}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-def, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}, {port: 9090}]
endpoints:
- {addresses: ["fd00::1"], conditions: {ready: true}, nodeName: node-a, hostname: web-0}
- {addresses: ["fe80::1%eth0"], nodeName: node-b}
`,
  );
  const ports = '[{"Name":"http","Port":8080},{"Port":9090}]';
  t.same(epsOf(out).sort(), [
    ` I E ${ports}`, // fe80::1%eth0 is dropped: the IPs set stays, empty (as kpng)
    `10.1.0.1 host=web-0 L I E ${ports}`,
    `10.1.0.2 I E ${ports}`,
    `10.1.0.3 I E ${ports}`,
    `10.1.0.5 I E ${ports}`,
    `fd00::1 host=web-0 L I E ${ports}`,
  ]);
  t.match(out, /"IPs":\{\},"PortOverrides"/, 'an endpoint whose only address is invalid keeps an empty IPs');
  t.equal(JSON.parse(out).Service.Name, 'web');
});

t.test('Endpoints: identical ones collapse across slices; order is by the kpng endpoint hash', async (t) => {
  const slice = (name: string, addrs: string[]) => `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ${name}, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
${addrs.map((a) => `- {addresses: [${a}], nodeName: node-b, targetRef: {kind: Pod, name: p-${a.replace(/\./g, '-')}}}`).join('\n')}
`;
  const out = convert(svcYaml() + slice('s1', ['10.1.0.1', '10.1.0.2']) + slice('s2', ['10.1.0.2', '10.1.0.3']));
  const got = epsOf(out).map((e) => e.split(' ')[0]);
  t.same([...got].sort(), ['10.1.0.1', '10.1.0.2', '10.1.0.3'], 'the duplicate of 10.1.0.2 collapsed');
  // The path key is the hex XXH64 of the endpoint's protobuf {Hostname, IPs, Local}.
  const keys = got.map((ip) => endpointKey({ IPs: { V4: [ip!] } }));
  t.same(keys, [...keys].sort(), 'endpoints ordered by key');
  // Slice order does not matter.
  t.equal(convert(svcYaml() + slice('s2', ['10.1.0.2', '10.1.0.3']) + slice('s1', ['10.1.0.1', '10.1.0.2'])), out);
});

t.test('Endpoints: same hostname/IPs/locality with different ports keep one endpoint each', async (t) => {
  const svc = docs(svcYaml())[0] as KubeService;
  const mk = (port: number): KubeEndpointSlice => ({ metadata: { name: `s${port}` }, ports: [{ name: 'http', port }], endpoints: [{ addresses: ['10.1.0.1'], nodeName: 'node-b' }] });
  const eps = convertEndpoints(svc, [mk(8080), mk(8081)], { nodeName: 'node-a' });
  const base = endpointKey({ IPs: { V4: ['10.1.0.1'] } });
  t.same(convertEndpoints(svc, [mk(8080)], { nodeName: 'node-a' }).map(([k]) => k), [base], 'alone: the key of its Hostname, IPs and Local only');
  t.same(convertEndpoints(svc, [mk(8080)], { nodeName: 'node-b' }).map(([k]) => k), [endpointKey({ IPs: { V4: ['10.1.0.1'] }, Local: true })], 'Local counts');
  t.equal(eps.length, 2);
  for (const [k] of eps) t.match(k, new RegExp(`^${base}-[0-9a-f]+$`));
  t.not(eps[0]![0], eps[1]![0]);
});

t.test('Endpoints: scopes from traffic policies; both false means not sent', async (t) => {
  const slice = `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.1.0.1], nodeName: node-a}
- {addresses: [10.1.0.2], nodeName: node-b}
`;
  const p = '[{"Name":"http","Port":8080}]';
  t.same(epsOf(convert(svcYaml('  externalTrafficPolicy: Local') + slice)).sort(), [`10.1.0.1 L I E ${p}`, `10.1.0.2 I ${p}`]);
  t.same(epsOf(convert(svcYaml('  internalTrafficPolicy: Local') + slice)).sort(), [`10.1.0.1 L I E ${p}`, `10.1.0.2 E ${p}`]);
  t.same(epsOf(convert(svcYaml('  internalTrafficPolicy: Local\n  externalTrafficPolicy: Local') + slice)), [`10.1.0.1 L I E ${p}`]);
  t.same(epsOf(convert(svcYaml('  internalTrafficPolicy: Local\n  externalTrafficPolicy: Local') + slice, { nodeName: 'node-c' })), [], 'no endpoint on node-c');
  t.match(convert(svcYaml('  internalTrafficPolicy: Local\n  externalTrafficPolicy: Local') + slice, { nodeName: 'node-c' }), /"Endpoints":null/);
});

t.test('Endpoints: topology hints keep only endpoints hinted for the node zone', async (t) => {
  const slice = `---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints:
- {addresses: [10.1.0.1], nodeName: node-b, zone: z1, hints: {forZones: [{name: z1}]}}
- {addresses: [10.1.0.2], nodeName: node-c, zone: z2, hints: {forZones: [{name: z2}, {name: z3}]}}
- {addresses: [10.1.0.3], nodeName: node-c, zone: z2}
- {addresses: [10.1.0.4], nodeName: node-c, zone: z2, hints: {forZones: []}}
`;
  const node = (zone: string) => `---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: ${zone}}}
`;
  const ips = (out: string) => epsOf(out).map((e) => e.split(' ')[0]).sort();
  t.same(ips(convert(svcYaml() + slice)), ['10.1.0.3', '10.1.0.4'], 'unknown node: no zone, hinted endpoints dropped');
  t.same(ips(convert(svcYaml() + slice + node('z3'))), ['10.1.0.2', '10.1.0.3', '10.1.0.4'], 'zone from the Node object');
  t.same(ips(convert(svcYaml() + slice + node('z3'), { nodeZone: 'z1' })), ['10.1.0.1', '10.1.0.3', '10.1.0.4'], '--node-zone wins');
  const other = `---
apiVersion: v1
kind: Node
metadata: {name: node-b, labels: {topology.kubernetes.io/zone: z1}}
`;
  t.same(ips(convert(svcYaml() + slice + other)), ['10.1.0.3', '10.1.0.4'], "another node's zone does not count");
});

t.test('compiled slices: each endpoint JSON is what gojson prints for the endpoint, whatever its fields', async (t) => {
  const mk = (ports: unknown, endpoints: unknown[]): KubeEndpointSlice => ({ metadata: { name: 's' }, ports, endpoints } as KubeEndpointSlice);
  const endpoints = [
    { addresses: ['10.1.0.1'], nodeName: 'node-a' },
    { addresses: ['10.1.0.2', '10.1.0.1'], hostname: 'web-0', nodeName: 'node-b' },
    { addresses: ['fd00::2', '10.1.0.3'], hostname: 'wéb<&>"\\1' },
    { addresses: ['not-an-ip'] },
    { addresses: [] },
    {},
  ];
  for (const ports of [undefined, [], [{ name: 'http', port: 8080 }, { port: 9090 }, {}]]) {
    for (const [internalLocal, externalLocal] of [[false, false], [true, false], [false, true], [true, true]] as const) {
      const got = nodeEndpoints([compileSlice(mk(ports, endpoints), 'node-a')], { internalLocal, externalLocal }, undefined, () => t.fail('no error'));
      // The same endpoints built as the model and printed by gojson.
      const want = endpoints.flatMap((e: { addresses?: string[]; hostname?: string; nodeName?: string }) => {
        const local = e.nodeName === 'node-a';
        const internal = local || !internalLocal;
        const external = local || !externalLocal;
        if (!internal && !external) return [];
        const ips: Record<string, string[]> = {};
        for (const a of [...(e.addresses ?? [])].sort()) if (a !== 'not-an-ip') (a.includes(':') ? (ips.V6 ??= []) : (ips.V4 ??= [])).push(a);
        const pos = (ports as Array<{ name?: string; port?: number }> | undefined)?.map((p) => ({ ...(p.name ? { Name: p.name } : {}), ...(p.port ? { Port: p.port } : {}) }));
        return [
          encodeEndpoint({
            ...(e.hostname ? { Hostname: e.hostname } : {}),
            ...(e.addresses && e.addresses.length > 0 ? { IPs: ips } : {}),
            ...(local ? { Local: true } : {}),
            ...(pos && pos.length > 0 ? { PortOverrides: pos } : {}),
            Scopes: { ...(internal ? { Internal: true } : {}), ...(external ? { External: true } : {}) },
          }),
        ];
      });
      // Identical ones collapse (the last two).
      t.same(got.map((e) => e.head + e.tail).sort(), [...new Set(want)].sort(), JSON.stringify([ports, internalLocal, externalLocal]));
    }
  }
});

t.test('compiled slices: an update that changes nothing a node sees is the same slice', async (t) => {
  type Ep = { addresses?: string[]; conditions?: { ready?: boolean }; nodeName?: string; hints?: unknown; targetRef?: unknown };
  const mk = (eps: Ep[], port = 8080): KubeEndpointSlice => ({ metadata: { name: 's' }, ports: [{ name: 'http', port }], endpoints: eps } as KubeEndpointSlice);
  const base: Ep[] = [
    { addresses: ['10.1.0.1'], nodeName: 'node-a', targetRef: { name: 'p1' } },
    { addresses: ['10.1.0.2'], conditions: { ready: false } },
    { addresses: ['10.1.0.3'], hints: { forZones: [{ name: 'z1' }] } },
  ];
  const a = compileSlice(mk(base), 'node-a');
  t.equal(a.zoned, true);
  t.ok(sameSlice(a, compileSlice(mk(base), 'node-a', a)), 'identical');
  t.ok(sameSlice(a, compileSlice(mk([{ ...base[0]!, targetRef: { name: 'p9' } }, { ...base[1]!, addresses: ['10.9.9.9'] }, base[2]!]), 'node-a', a)), 'only what no node reads, and a not-ready endpoint');
  t.notOk(sameSlice(a, compileSlice(mk([{ ...base[0]!, addresses: ['10.1.0.9'] }, base[1]!, base[2]!]), 'node-a', a)), 'an address');
  t.notOk(sameSlice(a, compileSlice(mk(base, 8081), 'node-a', a)), 'the ports');
  t.notOk(sameSlice(a, compileSlice(mk([base[0]!, base[1]!, { ...base[2]!, hints: { forZones: [{ name: 'z2' }] } }]), 'node-a', a)), 'a hint');
  t.notOk(sameSlice(a, compileSlice(mk([base[0]!, base[1]!]), 'node-a', a)), 'an endpoint gone');
  t.ok(sameSlice(a, compileSlice(mk([base[0]!, base[2]!]), 'node-a', a)), 'a not-ready one gone');
  t.notOk(sameSlice(a, compileSlice(mk([{ ...base[0]!, addresses: 'x' } as unknown as Ep, base[2]!]), 'node-a', a)), 'one that does not read');
  t.equal(compileSlice(mk([base[0]!]), 'node-a').zoned, false);
  // Keys lent by `previous` are the keys.
  const upd = compileSlice(mk([base[0]!, { addresses: ['10.1.0.4'] }]), 'node-a', a);
  const fresh = compileSlice(mk([base[0]!, { addresses: ['10.1.0.4'] }]), 'node-a');
  const keys = (s: typeof a) => nodeEndpoints([s], { internalLocal: false, externalLocal: false }, 'z1', () => {}).map((e) => e.key);
  t.same(keys(upd), keys(fresh));
});

t.test('malformed endpoints count only where kpng reads them: after ready, after the zone, once in scope', async (t) => {
  const svc = { spec: {} } as KubeService;
  const mk = (eps: unknown[], ports: unknown = [{ port: 80 }]): KubeEndpointSlice => ({ metadata: { name: 's' }, ports, endpoints: eps } as KubeEndpointSlice);
  const err = (slices: KubeEndpointSlice[], o: { svc?: KubeService; zone?: string } = {}): string => {
    try {
      convertEndpoints(o.svc ?? svc, slices, { nodeName: 'node-a', nodeZone: o.zone });
      return 'ok';
    } catch (e) {
      if (!(e instanceof ConversionError)) throw e;
      return `${e.index}: ${e.message}`;
    }
  };
  const ok = { addresses: ['10.1.0.1'] };
  t.equal(err([mk([ok, { conditions: 'yes' }])]), '0: endpoints[1].conditions: expected an object, got "yes"');
  t.equal(err([mk([ok, 'x'])]), '0: endpoints[1]: expected an object, got "x"');
  t.equal(err([mk([{ conditions: { ready: false }, hints: 'x', addresses: 7 }])]), 'ok', 'not ready: read no further');
  t.equal(err([mk([{ hints: { forZones: [{ name: 3 }] } }])]), '0: endpoints[0].hints.forZones[0].name: expected a string, got 3');
  t.equal(err([mk([{ hints: { forZones: [{ name: 'z2' }] }, nodeName: 5, addresses: 'x' }])], { zone: 'z1' }), 'ok', 'out of the zone: read no further');
  t.equal(err([mk([{ hints: { forZones: [{ name: 'z2' }] }, nodeName: 5 }])], { zone: 'z2' }), '0: endpoints[0].nodeName: expected a string, got 5');
  t.equal(err([mk([{ hints: { forZones: [{ name: 'z2' }] }, addresses: 'x' }])], { zone: 'z2' }), '0: endpoints[0].addresses: expected a list, got "x"');
  const localOnly = { spec: { internalTrafficPolicy: 'Local', externalTrafficPolicy: 'Local' } } as KubeService;
  t.equal(err([mk([{ nodeName: 'node-b', addresses: 'x', hostname: 1 }])], { svc: localOnly }), 'ok', 'no scope: read no further');
  t.equal(err([mk([{ nodeName: 'node-a', hostname: 1 }])], { svc: localOnly }), '0: endpoints[0].hostname: expected a string, got 1');
  t.equal(err([mk([], 'bad')]), 'ok', 'no endpoints: the ports are not read');
  t.equal(err([mk([{ conditions: { ready: false } }], 'bad')]), '0: ports: expected a list, got "bad"');
  t.equal(err([mk([ok]), mk([ok, { addresses: 'x' }]), mk([{ addresses: 'y' }])]), '1: endpoints[1].addresses: expected a list, got "x"', 'the first slice that fails');
  t.equal(err([mk([{ addresses: 'x' }, { conditions: 'c' }])]), '0: endpoints[0].addresses: expected a list, got "x"', 'the first endpoint that fails');
  t.equal(
    err([mk([{ hints: { forZones: [{ name: 'z2' }] }, addresses: 'x' }, { conditions: 'c' }])], { zone: 'z1' }),
    '0: endpoints[1].conditions: expected an object, got "c"',
    'one that does not count leaves the next',
  );
});

t.test('nodeEndpointJsons: the JSON of nodeEndpoints, in its order, with the same slices told bad', async (t) => {
  const mk = (name: string, eps: unknown[], ports: unknown = [{ name: 'http', port: 8080 }]): KubeEndpointSlice => ({ metadata: { name }, ports, endpoints: eps } as KubeEndpointSlice);
  const many = Array.from({ length: 40 }, (_, i) => ({ addresses: [`10.2.${i >> 3}.${i}`], nodeName: i % 3 ? 'node-b' : 'node-a', ...(i % 5 === 0 ? { hostname: `h${i}` } : {}) }));
  const sets: KubeEndpointSlice[][] = [
    [mk('s1', many)],
    [mk('s1', many.slice(0, 20)), mk('s2', many.slice(10))],
    // One key for two different endpoints (ports differ): renamed; and identical ones collapsed.
    [mk('a', [{ addresses: ['10.1.0.1'] }, { addresses: ['10.1.0.2'] }]), mk('b', [{ addresses: ['10.1.0.1'] }], [{ port: 9090 }]), mk('c', [{ addresses: ['10.1.0.2'] }])],
    [mk('bad', [{ addresses: 7 }]), mk('ok', many.slice(0, 5)), mk('zoned', [{ addresses: ['10.3.0.1'], hints: { forZones: [{ name: 'z1' }] } }, { addresses: ['10.3.0.2'], hints: { forZones: [{ name: 'z2' }] } }])],
    [],
  ];
  for (const slices of sets) {
    for (const [internalLocal, externalLocal] of [[false, false], [true, false], [false, true], [true, true]] as const) {
      for (const zone of [undefined, 'z1']) {
        const compiled = slices.map((s) => compileSlice(s, 'node-a'));
        const badA: number[] = [];
        const badB: number[] = [];
        const want = nodeEndpoints(compiled, { internalLocal, externalLocal }, zone, (i) => badA.push(i)).map((e) => e.head + e.tail);
        t.same(nodeEndpointJsons(compiled, { internalLocal, externalLocal }, zone, (i) => badB.push(i)), want);
        t.same(badB, badA);
      }
    }
  }
});
