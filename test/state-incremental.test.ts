/**
 * The Store's incremental snapshots (patched lines, cached group, JSON values)
 * against states built from scratch, over random op sequences.
 */
import t from 'tap';
import { encodeEndpoint } from '../src/gojson.js';
import type { Endpoint, Service } from '../src/model.js';
import { comparePaths, stateFromItems, stateText, Store } from '../src/state.js';

let seed = 4242;
const rnd = (): number => {
  seed = (seed * 1103515245 + 12345) & 0x7fffffff;
  return seed / 0x80000000;
};
const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)]!;

const services = ['default/a', 'default/a-b', 'default/b', 'kube-system/dns', 'x/y'];
const keys = ['p1', 'p2', 'p10', 'q/r', 'z'];
const svc = (path: string, v: number): Service => ({ Namespace: path.split('/')[0]!, Name: path.split('/')[1]!, Type: v % 2 ? 'ClusterIP' : 'NodePort' });
const ep = (v: number): Endpoint => ({ IPs: { V4: [`10.0.0.${v}`] }, ...(v % 3 === 0 ? { Local: true } : {}) });

/** The expected text from a plain model of the content. */
function expected(model: { svcs: Map<string, Service>; eps: Map<string, Endpoint> }): { text: string; endpoints: number } {
  const items = [...model.svcs.keys()].sort(comparePaths).map((path) => {
    const mine = [...model.eps.keys()].filter((p) => p.startsWith(path + '/')).sort(comparePaths);
    return { Service: model.svcs.get(path)!, Endpoints: mine.map((p) => model.eps.get(p)!) };
  });
  return { text: stateText(stateFromItems(items)), endpoints: items.reduce((n, it) => n + it.Endpoints.length, 0) };
}

t.test('random ops with snapshots in between equal a state built from scratch', async (t) => {
  for (let round = 0; round < 40; round++) {
    const store = new Store({ onOrphans: () => {} });
    const model = { svcs: new Map<string, Service>(), eps: new Map<string, Endpoint>() };
    for (let step = 0; step < 200; step++) {
      const r = rnd();
      const s = pick(services);
      const v = Math.floor(rnd() * 50);
      if (r < 0.15) {
        store.setService(s, svc(s, v));
        model.svcs.set(s, svc(s, v));
      } else if (r < 0.22) {
        store.deleteService(s);
        model.svcs.delete(s);
      } else if (r < 0.7) {
        const path = `${s}/${pick(keys)}`;
        // Both APIs: model values and pre-encoded JSON.
        if (rnd() < 0.5) store.setEndpoint(path, ep(v));
        else store.setEndpointJson(path, encodeEndpoint(ep(v)));
        model.eps.set(path, ep(v));
      } else if (r < 0.9) {
        const path = `${s}/${pick(keys)}`;
        store.deleteEndpoint(path);
        model.eps.delete(path);
      } else if (r < 0.92) {
        store.reset();
        model.svcs.clear();
        model.eps.clear();
      }
      if (rnd() < 0.3) {
        const st = store.snapshot();
        const want = expected(model);
        if (stateText(st) !== want.text || st.endpoints !== want.endpoints || st.services !== model.svcs.size || st.bytes !== Buffer.byteLength(want.text)) {
          t.same({ text: stateText(st), endpoints: st.endpoints, services: st.services, bytes: st.bytes }, { ...want, services: model.svcs.size, bytes: Buffer.byteLength(want.text) }, `round ${round} step ${step}`);
          return;
        }
      }
    }
  }
  t.pass('all snapshots matched');
});

t.test('an endpoint change patches one line, keeps the others and the counts', async (t) => {
  const store = new Store();
  for (const s of ['default/a', 'default/b', 'default/c']) {
    store.setService(s, svc(s, 1));
    store.setEndpointJson(`${s}/p1`, encodeEndpoint(ep(1)));
  }
  const s1 = store.snapshot();
  store.setEndpointJson('default/b/p2', encodeEndpoint(ep(2)));
  const s2 = store.snapshot();
  t.equal(s2.lines[0]!.toString(), s1.lines[0]!.toString());
  t.not(s2.lines[1], s1.lines[1]);
  t.equal(s2.lines[2]!.toString(), s1.lines[2]!.toString());
  t.equal(s1.lines.length, 3, 'the earlier state is untouched');
  t.equal(s2.endpoints, 4);
  t.equal(s2.bytes, s2.lines.reduce((n, l) => n + l.length, 0));
  store.deleteEndpoint('default/b/p1');
  store.deleteEndpoint('default/b/p2');
  const s3 = store.snapshot();
  t.equal(s3.endpoints, 2);
  t.match(s3.lines[1]!.toString(), /"Endpoints":null/);
});
