#!/usr/bin/env node
// The node view alone (src/sources/kube/node-view.ts), no server, no
// informer: how much heap it retains and how long it takes at N Services ×
// M endpoints, with objects shaped like the API server's (managedFields, a
// kubectl last-applied annotation, controller labels and annotations), each
// handed over as freshly parsed JSON, one at a time, as a list/watch does.
//
//   node --expose-gc bench/node-view.js [--dist DIR] [--services 10000]
//        [--per-service 10] [--updates 200] [--with-labels] [--digest] [--forms]
//
// Prints: the time of the set* calls and of the first state(), the heap and
// external memory retained by the view and its last state (after gc, minus
// what was retained before), p50/p99 of one EndpointSlice update + state()
// over --updates updates, one Service update + state(), and the zone change
// of the Node + state(). --digest prints a sha256 of the states, to compare
// the output of two builds (--dist). --forms prints instead the heap that
// keeping the objects in other forms would take (the choice node-view.ts
// explains).
import { createHash } from 'node:crypto';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { endpointSlice, node as nodeAt, service } from './cluster.js';

const args = process.argv.slice(2);
const opt = (name, def) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : def;
};
const flag = (name) => args.includes(name);
const dist = resolve(opt('--dist', new URL('../dist', import.meta.url).pathname));
const N = Number(opt('--services', '10000'));
const PER = Number(opt('--per-service', '10'));
const UPDATES = Number(opt('--updates', '200'));
const NODE_NAME = 'node-7';

if (typeof global.gc !== 'function') {
  console.error('run with node --expose-gc');
  process.exit(2);
}
const load = (p) => import(pathToFileURL(`${dist}/${p}`).href);
const { NodeView } = await load('sources/kube/node-view.js');
const { compileGlobs } = await load('convert/glob.js');
const { stateText } = await load('state.js');

// Objects from bench/cluster.js as the API server holds them after `kubectl
// apply`: kind/apiVersion, managedFields, last-applied, the Service variants;
// one endpoint per version moves.
const serviceObject = (i, rv) => service(i, rv, { typed: true, applied: true, variants: true, namedTargetPort: true });
const sliceObject = (i, version, rv) => endpointSlice(i, version, rv, { perService: PER, notReady: PER - 1, churn: 'one', typed: true, managed: true, variants: true });
const nodeObject = (n, zone) => nodeAt(n, { zone, typed: true, minimal: true });

/** As a list/watch hands it over: parsed from its JSON. */
const parsed = (o) => JSON.parse(JSON.stringify(o));

const mem = () => {
  global.gc();
  global.gc();
  const m = process.memoryUsage();
  return { heap: m.heapUsed, external: m.external, rss: m.rss };
};
const MiB = (b) => (b / 1048576).toFixed(1);
const ms = (ns) => Number(ns) / 1e6;
const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const digest = (s) => createHash('sha256').update(stateText(s)).digest('hex').slice(0, 16);

if (flag('--forms')) {
  // What keeping each object in another form would retain (heap, the store aside).
  const { compileSlice, policiesOf } = await load('convert/endpoints.js');
  const pick = (o, keys) => {
    const r = {};
    for (const k of keys) if (o?.[k] != null) r[k] = o[k];
    return r;
  };
  const strip = (o) =>
    o.kind === 'Service'
      ? {
          metadata: { name: o.metadata.name, namespace: o.metadata.namespace },
          spec: pick(o.spec, ['type', 'clusterIP', 'clusterIPs', 'externalIPs', 'loadBalancerSourceRanges', 'ports', 'externalTrafficPolicy', 'internalTrafficPolicy', 'sessionAffinity', 'sessionAffinityConfig', 'healthCheckNodePort']),
          ...(o.status?.loadBalancer?.ingress ? { status: { loadBalancer: { ingress: o.status.loadBalancer.ingress.map((x) => pick(x, ['ip'])) } } } : {}),
        }
      : {
          metadata: { name: o.metadata.name, namespace: o.metadata.namespace, labels: { 'kubernetes.io/service-name': o.metadata.labels['kubernetes.io/service-name'] } },
          endpoints: o.endpoints.map((e) => {
            const r = pick(e, ['addresses', 'hostname', 'nodeName', 'hints']);
            if (e.conditions) r.conditions = pick(e.conditions, ['ready']);
            return r;
          }),
          ports: o.ports.map((x) => pick(x, ['name', 'port'])),
        };
  const forms = {
    'parsed objects': (o) => o,
    'stripped, plain objects': strip,
    'stripped, JSON text': (o) => JSON.stringify(strip(o)),
    'compiled (this view)': (o) => (o.kind === 'Service' ? policiesOf(o) : compileSlice(o, NODE_NAME)),
  };
  for (const [name, form] of Object.entries(forms)) {
    const b = mem();
    let keep = [];
    for (let i = 0; i < N; i++) keep.push(form(parsed(serviceObject(i, 1))), form(parsed(sliceObject(i, 0, 1))));
    const a = mem();
    let extra = '';
    if (typeof keep[0] === 'string') {
      const t0 = process.hrtime.bigint();
      for (const x of keep) JSON.parse(x);
      extra = ` (parsing them all again: ${ms(process.hrtime.bigint() - t0).toFixed(0)} ms)`;
    }
    keep = undefined;
    console.log(`  ${name}: ${MiB(a.heap - b.heap)} MiB${extra}`);
  }
  process.exit(0);
}

const before = mem();
// As a list hands them over: all parsed first (not timed), then fed one by one.
let rv = 1;
let objects = [];
for (let i = 0; i < N; i++) objects.push(['setService', parsed(serviceObject(i, rv++))], ['setSlice', parsed(sliceObject(i, 0, rv++))]);
const view = new NodeView({
  nodeName: NODE_NAME,
  ...(flag('--with-labels') ? { labels: compileGlobs(['app', 'app.kubernetes.io/*']), annotations: compileGlobs(['example.com/*']) } : {}),
});
const cpuMs = (c) => (c.user + c.system) / 1000;
let c0 = process.cpuUsage();
let t = process.hrtime.bigint();
view.setNode(parsed(nodeObject(7, 'zone-1')));
for (const [method, o] of objects) view[method](o);
const setNs = process.hrtime.bigint() - t;
const setCpu = cpuMs(process.cpuUsage(c0));
objects = undefined;
c0 = process.cpuUsage();
t = process.hrtime.bigint();
let state = view.state();
const firstNs = process.hrtime.bigint() - t;
const firstCpu = cpuMs(process.cpuUsage(c0));
const firstDigest = flag('--digest') ? digest(state) : '';
const after = mem();
console.log(`node view at ${N} Services × ${PER} endpoints (${dist})`);
console.log(`  set* calls ${ms(setNs).toFixed(0)} ms, first state() ${ms(firstNs).toFixed(0)} ms, total ${ms(setNs + firstNs).toFixed(0)} ms: ${state.services} services, ${state.endpoints} endpoints, ${MiB(state.bytes)} MiB`);
console.log(`  CPU time (all threads, GC included): set* calls ${setCpu.toFixed(0)} ms, first state() ${firstCpu.toFixed(0)} ms, total ${(setCpu + firstCpu).toFixed(0)} ms`);
console.log(`  retained: heap ${MiB(after.heap - before.heap)} MiB, external ${MiB(after.external - before.external)} MiB (rss ${MiB(after.rss)} MiB)`);

const versions = new Map();
const sliceTimes = [];
for (let u = 0; u < UPDATES; u++) {
  const i = (u * 7919) % N;
  const version = (versions.get(i) ?? 0) + 1;
  versions.set(i, version);
  const o = parsed(sliceObject(i, version, rv++));
  t = process.hrtime.bigint();
  view.setSlice(o);
  state = view.state();
  sliceTimes.push(ms(process.hrtime.bigint() - t));
}
console.log(`  one slice update + state(): p50 ${pct(sliceTimes, 50).toFixed(2)} ms, p99 ${pct(sliceTimes, 99).toFixed(2)} ms (${UPDATES} updates)`);

const svcTimes = [];
for (let u = 0; u < Math.min(UPDATES, 50); u++) {
  const o = parsed(serviceObject((u * 104729) % N, rv++));
  o.spec.internalTrafficPolicy = o.spec.internalTrafficPolicy === 'Local' ? 'Cluster' : 'Local';
  t = process.hrtime.bigint();
  view.setService(o);
  state = view.state();
  svcTimes.push(ms(process.hrtime.bigint() - t));
}
console.log(`  one Service policy change + state(): p50 ${pct(svcTimes, 50).toFixed(2)} ms, p99 ${pct(svcTimes, 99).toFixed(2)} ms`);

const node = parsed(nodeObject(7, 'zone-2'));
t = process.hrtime.bigint();
view.setNode(node);
state = view.state();
console.log(`  zone change + state(): ${ms(process.hrtime.bigint() - t).toFixed(0)} ms`);
const end = mem();
console.log(`  retained at the end: heap ${MiB(end.heap - before.heap)} MiB, external ${MiB(end.external - before.external)} MiB`);
if (flag('--digest')) console.log(`  digest first ${firstDigest}, last ${digest(state)}`);
