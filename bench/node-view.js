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
const NODES = 100;
const NODE_NAME = 'node-7';

if (typeof global.gc !== 'function') {
  console.error('run with node --expose-gc');
  process.exit(2);
}
const load = (p) => import(pathToFileURL(`${dist}/${p}`).href);
const { NodeView } = await load('sources/kube/node-view.js');
const { compileGlobs } = await load('convert/glob.js');
const { stateText } = await load('state.js');

const CREATED = '2026-11-01T00:00:00Z';
const uid = (kind, i) => `${kind.toString(16).padStart(8, '0')}-0000-4000-8000-${i.toString(16).padStart(12, '0')}`;
const v4 = (base, x) => `10.${base + (x >> 16)}.${(x >> 8) & 255}.${x & 255}`;
const v6 = (prefix, x) => `${prefix}${x >>> 16 ? `${(x >>> 16).toString(16)}:` : ''}${(x & 0xffff).toString(16)}`;
const pad = (x) => x.toString(36).padStart(5, 'x');
const nodeOf = (i, j) => (i * 10 + j * 11) % NODES;
const zoneOf = (n) => `zone-${n % 3}`;

function shape(i) {
  return {
    namespace: `ns-${i % 50}`,
    name: `svc-${i}`,
    selected: i % 100 !== 99,
    hinted: i % 10 === 1,
    ipv6: i % 50 === 25,
    lb: i % 20 === 4, // LoadBalancer, externalTrafficPolicy Local
    internalLocal: i % 25 === 6,
    affinity: i % 30 === 8,
    stateful: i % 40 === 9, // endpoints with hostnames
  };
}

function serviceObject(i, rv) {
  const c = shape(i);
  const ext = i % 10 === 3 ? [`198.51.100.${(i % 254) + 1}`] : i % 10 === 7 ? [`198.51.100.${(i % 254) + 1}`, v6('2001:db8::', i)] : undefined;
  const clusterIP = c.stateful ? 'None' : c.ipv6 ? v6('2001:db8:96::', i) : v4(96, i + 10);
  const ports = [
    { name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, ...(c.lb ? { nodePort: 30000 + (i % 2000) } : {}) },
    { name: 'https', protocol: 'TCP', port: 443, targetPort: 'https', ...(c.lb ? { nodePort: 32000 + (i % 700) } : {}) },
  ];
  const applied = {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { annotations: { 'example.com/owner': `team-${i % 7}` }, labels: { app: c.name, 'app.kubernetes.io/part-of': `team-${i % 7}` }, name: c.name, namespace: c.namespace },
    spec: { ports: ports.map(({ nodePort, ...p }) => p), selector: { app: c.name }, ...(c.lb ? { type: 'LoadBalancer', externalTrafficPolicy: 'Local' } : {}) },
  };
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {
      name: c.name,
      namespace: c.namespace,
      uid: uid(1, i),
      resourceVersion: String(rv),
      creationTimestamp: CREATED,
      labels: { app: c.name, 'app.kubernetes.io/part-of': `team-${i % 7}`, ...(c.selected ? {} : { 'service.kubernetes.io/service-proxy-name': 'other-proxy' }) },
      annotations: {
        'example.com/owner': `team-${i % 7}`,
        'kubectl.kubernetes.io/last-applied-configuration': JSON.stringify(applied) + '\n',
        ...(c.hinted ? { 'service.kubernetes.io/topology-mode': 'Auto' } : {}),
      },
      managedFields: [
        {
          manager: 'kubectl-client-side-apply',
          operation: 'Update',
          apiVersion: 'v1',
          time: CREATED,
          fieldsType: 'FieldsV1',
          fieldsV1: {
            'f:metadata': {
              'f:annotations': { '.': {}, 'f:example.com/owner': {}, 'f:kubectl.kubernetes.io/last-applied-configuration': {} },
              'f:labels': { '.': {}, 'f:app': {}, 'f:app.kubernetes.io/part-of': {} },
            },
            'f:spec': {
              'f:internalTrafficPolicy': {},
              'f:ports': Object.fromEntries(ports.map((p) => [`k:{"port":${p.port},"protocol":"TCP"}`, { '.': {}, 'f:name': {}, 'f:port': {}, 'f:protocol': {}, 'f:targetPort': {} }])),
              'f:selector': {},
              'f:sessionAffinity': {},
              'f:type': {},
            },
          },
        },
        ...(c.lb ? [{ manager: 'cloud-controller-manager', operation: 'Update', apiVersion: 'v1', time: CREATED, fieldsType: 'FieldsV1', fieldsV1: { 'f:status': { 'f:loadBalancer': { 'f:ingress': {} } } }, subresource: 'status' }] : []),
      ],
    },
    spec: {
      ports,
      selector: { app: c.name },
      clusterIP,
      clusterIPs: [clusterIP],
      type: c.lb ? 'LoadBalancer' : 'ClusterIP',
      ...(ext ? { externalIPs: ext } : {}),
      sessionAffinity: c.affinity ? 'ClientIP' : 'None',
      ...(c.affinity ? { sessionAffinityConfig: { clientIP: { timeoutSeconds: 3600 } } } : {}),
      ipFamilies: [c.ipv6 ? 'IPv6' : 'IPv4'],
      ipFamilyPolicy: 'SingleStack',
      internalTrafficPolicy: c.internalLocal ? 'Local' : 'Cluster',
      ...(c.lb ? { externalTrafficPolicy: 'Local', healthCheckNodePort: 31000 + (i % 1000), allocateLoadBalancerNodePorts: true } : {}),
    },
    status: { loadBalancer: c.lb ? { ingress: [{ ip: `203.0.113.${(i % 254) + 1}`, ipMode: 'VIP' }] } : {} },
  };
}

function address(i, j, version, ipv6) {
  const x = (i * PER + j + version * 1_000_003) % 4_000_000;
  return ipv6 ? v6('2001:db8:244::', x) : v4(128, x);
}

function sliceObject(i, version, rv) {
  const c = shape(i);
  const endpoints = [];
  for (let j = 0; j < PER; j++) {
    const node = nodeOf(i, j);
    const ready = !(j === PER - 1 && i % 5 === 2);
    const pod = c.stateful ? `${c.name}-${j}` : `${c.name}-7d9f8b6c5-${pad(i * PER + j)}`;
    endpoints.push({
      addresses: [address(i, j, j === version % PER ? version : 0, c.ipv6)],
      conditions: { ready, serving: ready, terminating: false },
      ...(c.stateful ? { hostname: pod } : {}),
      ...(c.hinted ? { hints: { forZones: [{ name: zoneOf(node) }] } } : {}),
      nodeName: `node-${node}`,
      targetRef: { kind: 'Pod', namespace: c.namespace, name: pod, uid: uid(3, i * PER + j) },
      zone: zoneOf(node),
    });
  }
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {
      name: `${c.name}-${pad(i)}`,
      generateName: `${c.name}-`,
      namespace: c.namespace,
      uid: uid(2, i),
      resourceVersion: String(rv),
      generation: version + 1,
      creationTimestamp: CREATED,
      labels: { app: c.name, 'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io', 'kubernetes.io/service-name': c.name },
      annotations: { 'endpoints.kubernetes.io/last-change-trigger-time': CREATED },
      ownerReferences: [{ apiVersion: 'v1', kind: 'Service', name: c.name, uid: uid(1, i), controller: true, blockOwnerDeletion: true }],
      managedFields: [
        {
          manager: 'kube-controller-manager',
          operation: 'Update',
          apiVersion: 'discovery.k8s.io/v1',
          time: CREATED,
          fieldsType: 'FieldsV1',
          fieldsV1: {
            'f:addressType': {},
            'f:endpoints': {},
            'f:metadata': {
              'f:annotations': { '.': {}, 'f:endpoints.kubernetes.io/last-change-trigger-time': {} },
              'f:generateName': {},
              'f:labels': { '.': {}, 'f:app': {}, 'f:endpointslice.kubernetes.io/managed-by': {}, 'f:kubernetes.io/service-name': {} },
              'f:ownerReferences': { '.': {}, [`k:{"uid":"${uid(1, i)}"}`]: {} },
            },
            'f:ports': {},
          },
        },
      ],
    },
    addressType: c.ipv6 ? 'IPv6' : 'IPv4',
    endpoints,
    ports: [
      { name: 'http', protocol: 'TCP', port: 8080 },
      { name: 'https', protocol: 'TCP', port: 8443 },
    ],
  };
}

const nodeObject = (n, zone) => ({
  apiVersion: 'v1',
  kind: 'Node',
  metadata: {
    name: `node-${n}`,
    uid: uid(4, n),
    labels: { 'kubernetes.io/hostname': `node-${n}`, 'kubernetes.io/os': 'linux', 'topology.kubernetes.io/zone': zone },
  },
  spec: { podCIDR: `10.244.${n}.0/24` },
});

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
