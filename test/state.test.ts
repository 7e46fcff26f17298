/**
 * The store: kpng path order, endpoints grouped under their Service, cached
 * per-Service lines.
 */
import t from 'tap';
import { encodeEndpoint, encodeServiceEndpoints } from '../src/gojson.js';
import type { Endpoint, Service } from '../src/model.js';
import { comparePaths, emptyState, sameState, splitEndpointPath, stateFromItems, stateText, Store } from '../src/state.js';

const svc = (name: string, extra: Service = {}): Service => ({ Namespace: 'default', Name: name, ...extra });
const ep = (ip: string): Endpoint => ({ IPs: { V4: [ip] } });
const line = (s: Service, eps: Endpoint[]): string => encodeServiceEndpoints({ Service: s, Endpoints: eps });

t.test('comparePaths: "/" sorts before every other byte', async (t) => {
  const paths = ['default/ab', 'default/a-b/y', 'default/a/x', 'default/a-b', 'default/a', 'default/a/x/z', 'default/a.b', 'default/a\u00e9'];
  t.same([...paths].sort(comparePaths), ['default/a', 'default/a/x', 'default/a/x/z', 'default/a-b', 'default/a-b/y', 'default/a.b', 'default/ab', 'default/a\u00e9']);
  t.same(['b/\uFF21', 'b/\u{1F600}'].sort(comparePaths), ['b/\uFF21', 'b/\u{1F600}'], 'UTF-8 byte order beyond the BMP');
  t.same(splitEndpointPath('ns/svc/pod'), ['ns/svc', 'pod']);
  t.same(splitEndpointPath('ns/svc/a/b'), ['ns/svc', 'a/b']);
  t.equal(splitEndpointPath('ns/svc'), undefined);
});

t.test('a and a-b: endpoints stay under their own Service', async (t) => {
  const store = new Store();
  // Insert in the server's plain byte order, where a-b/... precedes a/...
  store.setService('default/a-b', svc('a-b'));
  store.setEndpoint('default/a-b/q', ep('10.0.0.9'));
  store.setService('default/a', svc('a'));
  store.setEndpoint('default/a/p2', ep('10.0.0.2'));
  store.setEndpoint('default/a/p10', ep('10.0.0.10'));
  store.setEndpoint('default/a/p1', ep('10.0.0.1'));
  store.setService('default/b', svc('b'));
  const s = store.snapshot();
  t.equal(
    stateText(s),
    line(svc('a'), [ep('10.0.0.1'), ep('10.0.0.10'), ep('10.0.0.2')]) + line(svc('a-b'), [ep('10.0.0.9')]) + line(svc('b'), []),
  );
  t.equal(s.services, 3);
  t.equal(s.endpoints, 4);
  t.equal(s.bytes, Buffer.byteLength(stateText(s)));
});

t.test('a revision touching one Service re-encodes only its line', async (t) => {
  // Lines are views of their block (line-blocks.ts): a re-packed block gives new views of the same bytes.
  const bytes = (l: Buffer | undefined) => l?.toString('latin1');
  const store = new Store();
  for (const n of ['a', 'b', 'c', 'd']) {
    store.setService(`default/${n}`, svc(n));
    store.setEndpoint(`default/${n}/p`, ep('10.0.0.1'));
  }
  const s1 = store.snapshot();
  t.equal(store.snapshot(), s1, 'no change: the same state object');

  store.setEndpoint('default/b/p2', ep('10.0.0.2')); // endpoint change
  const s2 = store.snapshot();
  t.not(s2, s1);
  t.equal(bytes(s2.lines[0]), bytes(s1.lines[0]), 'a kept');
  t.not(bytes(s2.lines[1]), bytes(s1.lines[1]), 'b re-encoded');
  t.equal(bytes(s2.lines[2]), bytes(s1.lines[2]), 'c kept');
  t.equal(bytes(s2.lines[3]), bytes(s1.lines[3]), 'd kept');
  t.equal(s2.lines[1]!.toString(), line(svc('b'), [ep('10.0.0.1'), ep('10.0.0.2')]));

  store.setService('default/c', svc('c', { Type: 'NodePort' })); // service change
  const s3 = store.snapshot();
  t.equal(bytes(s3.lines[0]), bytes(s2.lines[0]));
  t.equal(bytes(s3.lines[1]), bytes(s2.lines[1]));
  t.not(bytes(s3.lines[2]), bytes(s2.lines[2]));
  t.equal(bytes(s3.lines[3]), bytes(s2.lines[3]));

  store.setService('default/bb', svc('bb')); // insertion moves lines, keeps buffers
  const s4 = store.snapshot();
  t.equal(s4.lines.length, 5);
  t.equal(bytes(s4.lines[0]), bytes(s3.lines[0]));
  t.equal(bytes(s4.lines[1]), bytes(s3.lines[1]));
  t.equal(bytes(s4.lines[3]), bytes(s3.lines[2]));
  t.equal(bytes(s4.lines[4]), bytes(s3.lines[3]));

  store.deleteService('default/a');
  store.deleteEndpoint('default/a/p');
  const s5 = store.snapshot();
  t.same(s5.lines, s4.lines.slice(1));
  t.equal(bytes(s5.lines[0]), bytes(s4.lines[1]));
  t.ok(sameState(s5, { ...s5, lines: s5.lines.map((l) => Buffer.from(l)) }), 'sameState compares bytes');
  t.notOk(sameState(s5, s4));
});

t.test('orphans are reported and skipped; reset empties', async (t) => {
  const reported: string[][] = [];
  const store = new Store({ onOrphans: (p) => reported.push(p) });
  store.setEndpoint('default/ghost/p', ep('10.0.0.1'));
  store.setService('default/a', svc('a'));
  store.setEndpoint('default/a/p', ep('10.0.0.2'));
  t.equal(store.setEndpoint('nopath', ep('10.0.0.3')), false);
  t.equal(stateText(store.snapshot()), line(svc('a'), [ep('10.0.0.2')]));
  t.same(reported, [['default/ghost/p']]);

  store.deleteService('default/a');
  t.equal(stateText(store.snapshot()), '');
  t.same(reported[1], ['default/a/p']);
  store.setService('default/a', svc('a')); // its endpoints come back with it
  t.equal(stateText(store.snapshot()), line(svc('a'), [ep('10.0.0.2')]));

  store.reset();
  t.equal(store.snapshot(), emptyState);
  t.equal(store.serviceCount, 0);
  store.setService('default/z', svc('z'));
  t.equal(stateText(store.snapshot()), line(svc('z'), []));
});

t.test("a Service's endpoints set as a whole: in the order given, replaced, dropped", async (t) => {
  const store = new Store();
  const json = (ip: string) => encodeEndpoint(ep(ip));
  store.setService('default/a', svc('a'));
  store.setService('default/b', svc('b'));
  store.setEndpointsJson('default/a', [json('10.0.0.2'), json('10.0.0.1')]);
  const s1 = store.snapshot();
  t.equal(stateText(s1), line(svc('a'), [ep('10.0.0.2'), ep('10.0.0.1')]) + line(svc('b'), []));
  t.equal(s1.endpoints, 2);
  store.setEndpointsJson('default/a', [json('10.0.0.3')]);
  const s2 = store.snapshot();
  t.equal(s2.lines[1]!.toString(), s1.lines[1]!.toString(), 'b kept');
  t.equal(s2.lines[0]!.toString(), line(svc('a'), [ep('10.0.0.3')]));
  store.setService('default/a', svc('a', { Type: 'NodePort' }));
  t.equal(store.snapshot().lines[0]!.toString(), line(svc('a', { Type: 'NodePort' }), [ep('10.0.0.3')]), 'kept across a Service change');
  store.setEndpointsJson('default/a', []);
  store.setEndpointsJson('default/b', []); // none: nothing to do
  const s3 = store.snapshot();
  t.equal(stateText(s3), line(svc('a', { Type: 'NodePort' }), []) + line(svc('b'), []));
  t.equal(s3.endpoints, 0);
  t.equal(store.snapshot(), s3);
  store.setEndpointsJson('default/ghost', [json('10.0.0.9')]);
  t.equal(stateText(store.snapshot()), stateText(s3), 'without its Service: not in the state');
});

t.test('stateFromItems keeps the given order', async (t) => {
  const s = stateFromItems([
    { Service: svc('b'), Endpoints: [] },
    { Service: svc('a'), Endpoints: [ep('1.1.1.1')] },
  ]);
  t.equal(stateText(s), line(svc('b'), []) + line(svc('a'), [ep('1.1.1.1')]));
  t.equal(s.endpoints, 1);
});
