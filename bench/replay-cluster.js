// The cluster bench/replay.js replays: --services Services, one EndpointSlice
// per Service with --per-service endpoints spread over --nodes Nodes, and the
// Nodes, as `kubectl get svc,endpointslices,nodes -A` prints them, written in
// three forms (multi-document YAML, `kind: List` YAML, `kind: List` JSON) by
// a kubectl-style YAML emitter that checkEmitter() proves against the yaml
// package.
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { createWriteStream } from 'node:fs';
import { join } from 'node:path';
import { fieldSet, LAST_APPLIED, managedField, serviceFields, SLICE_LABELS, sliceFields } from './cluster.js';
import { root } from './lib.js';

/** The cluster shape of checkEmitter()'s sample slice (writeFixtures() is given its own). */
const SAMPLE_SIZE = { perService: 10, nodes: 100 };

// ------------------------------------------------------------ the cluster

// Its own names, uids and times (not bench/cluster.js's), keys in kubectl's
// (sorted) order; the managedFields pieces are bench/cluster.js's.

const pad = (n, w) => String(n).padStart(w, '0');
/** A stable fake uid for (kind, i). */
const uid = (kind, i) => {
  const h = createHash('sha1').update(`${kind}/${i}`).digest('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
};
const time = (sec) => new Date(Date.UTC(2026, 9, 1) + sec * 1000).toISOString().replace('.000Z', 'Z');
const zoneOf = (node) => `zone-${'abc'[node % 3]}`;
let rv = 4_000_000;

function service(i) {
  const ns = `ns-${pad(i % 100, 2)}`;
  const name = `svc-${pad(i, 5)}`;
  const ip = `10.96.${(i + 1) >> 8}.${(i + 1) & 255}`;
  const selector = { app: name };
  const ports = [
    { name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 },
    { name: 'https', port: 443, protocol: 'TCP', targetPort: 'https' },
  ];
  const applied = { apiVersion: 'v1', kind: 'Service', metadata: { annotations: {}, labels: { app: name, tier: 'backend' }, name, namespace: ns }, spec: { ports, selector } };
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {
      annotations: { [LAST_APPLIED]: JSON.stringify(applied) + '\n' },
      creationTimestamp: time(i),
      labels: { app: name, tier: 'backend' },
      managedFields: [
        managedField({
          manager: 'kubectl-client-side-apply',
          apiVersion: 'v1',
          time: time(i),
          fieldsV1: serviceFields({ annotations: [LAST_APPLIED], labels: ['app', 'tier'], ports, portsSet: true }),
          sorted: true,
        }),
      ],
      name,
      namespace: ns,
      resourceVersion: String(rv++),
      uid: uid('svc', i),
    },
    spec: {
      clusterIP: ip,
      clusterIPs: [ip],
      internalTrafficPolicy: 'Cluster',
      ipFamilies: ['IPv4'],
      ipFamilyPolicy: 'SingleStack',
      ports,
      selector,
      sessionAffinity: 'None',
      type: 'ClusterIP',
    },
    status: { loadBalancer: {} },
  };
}

/** Service i's EndpointSlice: size.perService endpoints, spread over size.nodes Nodes. */
function endpointSlice(i, size) {
  const ns = `ns-${pad(i % 100, 2)}`;
  const svc = `svc-${pad(i, 5)}`;
  const name = `${svc}-${uid('slice', i).slice(0, 5)}`;
  const endpoints = [];
  for (let j = 0; j < size.perService; j++) {
    const node = (i * size.perService + j) % size.nodes;
    const n = i * size.perService + j;
    endpoints.push({
      addresses: [`10.${128 + (n >> 16)}.${(n >> 8) & 255}.${n & 255}`],
      conditions: { ready: true, serving: true, terminating: false },
      nodeName: `node-${node}`,
      targetRef: { kind: 'Pod', name: `${svc}-7d9f8b6c5-${uid('pod', n).slice(0, 5)}`, namespace: ns, uid: uid('pod', n) },
      zone: zoneOf(node),
    });
  }
  return {
    addressType: 'IPv4',
    apiVersion: 'discovery.k8s.io/v1',
    endpoints,
    kind: 'EndpointSlice',
    metadata: {
      annotations: { 'endpoints.kubernetes.io/last-change-trigger-time': time(i + 60) },
      creationTimestamp: time(i),
      generateName: `${svc}-`,
      generation: 3,
      labels: {
        app: svc,
        'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io',
        'kubernetes.io/service-name': svc,
        tier: 'backend',
      },
      managedFields: [
        managedField({ manager: 'kube-controller-manager', apiVersion: 'discovery.k8s.io/v1', time: time(i + 60), fieldsV1: sliceFields(uid('svc', i), [...SLICE_LABELS, 'tier']), sorted: true }),
      ],
      name,
      namespace: ns,
      ownerReferences: [{ apiVersion: 'v1', blockOwnerDeletion: true, controller: true, kind: 'Service', name: svc, uid: uid('svc', i) }],
      resourceVersion: String(rv++),
      uid: uid('slice', i),
    },
    ports: [
      { name: 'http', port: 8080, protocol: 'TCP' },
      { name: 'https', port: 8443, protocol: 'TCP' },
    ],
  };
}

function node(k) {
  const name = `node-${k}`;
  const cond = (type, status, reason, message) => ({ lastHeartbeatTime: time(9000), lastTransitionTime: time(100), message, reason, status, type });
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: {
      annotations: { 'node.alpha.kubernetes.io/ttl': '0', 'volumes.kubernetes.io/controller-managed-attach-detach': 'true' },
      creationTimestamp: time(k),
      labels: {
        'beta.kubernetes.io/arch': 'amd64',
        'beta.kubernetes.io/os': 'linux',
        'kubernetes.io/arch': 'amd64',
        'kubernetes.io/hostname': name,
        'kubernetes.io/os': 'linux',
        'topology.kubernetes.io/region': 'region-1',
        'topology.kubernetes.io/zone': zoneOf(k),
      },
      managedFields: [
        managedField({
          manager: 'kubelet',
          apiVersion: 'v1',
          time: time(k),
          fieldsV1: { 'f:metadata': { 'f:annotations': fieldSet(['volumes.kubernetes.io/controller-managed-attach-detach']), 'f:labels': fieldSet(['kubernetes.io/hostname']) } },
          sorted: true,
        }),
        managedField({
          manager: 'kubelet',
          apiVersion: 'v1',
          time: time(9000),
          fieldsV1: { 'f:status': { 'f:conditions': { 'k:{"type":"Ready"}': { 'f:lastHeartbeatTime': {}, 'f:status': {} } }, 'f:images': {}, 'f:nodeInfo': { 'f:bootID': {} } } },
          subresource: 'status',
          sorted: true,
        }),
      ],
      name,
      resourceVersion: String(rv++),
      uid: uid('node', k),
    },
    spec: { podCIDR: `10.244.${k}.0/24`, podCIDRs: [`10.244.${k}.0/24`], providerID: `kind://docker/cluster/${name}` },
    status: {
      addresses: [
        { address: `172.18.${k >> 8}.${(k & 255) + 2}`, type: 'InternalIP' },
        { address: name, type: 'Hostname' },
      ],
      allocatable: { cpu: '8', 'ephemeral-storage': '102626232Ki', 'hugepages-2Mi': '0', memory: '32803836Ki', pods: '110' },
      capacity: { cpu: '8', 'ephemeral-storage': '102626232Ki', 'hugepages-2Mi': '0', memory: '32803836Ki', pods: '110' },
      conditions: [
        cond('MemoryPressure', 'False', 'KubeletHasSufficientMemory', 'kubelet has sufficient memory available'),
        cond('DiskPressure', 'False', 'KubeletHasNoDiskPressure', 'kubelet has no disk pressure'),
        cond('PIDPressure', 'False', 'KubeletHasSufficientPID', 'kubelet has sufficient PID available'),
        cond('Ready', 'True', 'KubeletReady', 'kubelet is posting ready status'),
      ],
      daemonEndpoints: { kubeletEndpoint: { Port: 10250 } },
      images: Array.from({ length: 8 }, (_, m) => ({
        names: [`registry.k8s.io/image-${m}@sha256:${createHash('sha256').update(String(m)).digest('hex')}`, `registry.k8s.io/image-${m}:v1.${m}.0`],
        sizeBytes: 10_000_000 + m * 1_234_567,
      })),
      nodeInfo: {
        architecture: 'amd64',
        bootID: uid('boot', k),
        containerRuntimeVersion: 'containerd://1.7.18',
        kernelVersion: '6.8.0-45-generic',
        kubeProxyVersion: 'v1.31.0',
        kubeletVersion: 'v1.31.0',
        machineID: uid('machine', k).replaceAll('-', ''),
        operatingSystem: 'linux',
        osImage: 'Debian GNU/Linux 12 (bookworm)',
        systemUUID: uid('system', k),
      },
    },
  };
}

// ------------------------------------------------------ a kubectl-style YAML emitter

// Strings kubectl (go-yaml) quotes: what would read as another type, or is empty.
const NEEDS_QUOTES = /^(?:|~|null|Null|NULL|true|True|TRUE|false|False|FALSE|y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF|[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)|0x[0-9a-fA-F]+|0o[0-7]+|\d{4}-\d\d-\d\d.*)$/;
const PLAIN = /^[A-Za-z0-9_./][A-Za-z0-9_./:{}",@=+ -]*$/;

function scalar(v) {
  if (typeof v !== 'string') return String(v);
  if (NEEDS_QUOTES.test(v) || !PLAIN.test(v) || v.includes(': ') || v.endsWith(':') || v.endsWith(' ') || v.includes(' #')) return JSON.stringify(v);
  return v;
}

/** `o` as block YAML lines at `indent`, pushed onto `out` (go-yaml v2 layout: list items at the parent key's indentation). */
function emit(o, indent, out) {
  const sp = ' '.repeat(indent);
  for (const [k, v] of Object.entries(o)) {
    const key = `${sp}${scalar(k)}:`;
    if (Array.isArray(v)) {
      if (v.length === 0) out.push(`${key} []`);
      else {
        out.push(key);
        emitList(v, indent, out);
      }
    } else if (v && typeof v === 'object') {
      if (Object.keys(v).length === 0) out.push(`${key} {}`);
      else {
        out.push(key);
        emit(v, indent + 2, out);
      }
    } else if (typeof v === 'string' && v.includes('\n')) {
      const body = v.endsWith('\n') ? v.slice(0, -1) : v;
      out.push(`${key} |${v.endsWith('\n') ? '' : '-'}`);
      for (const l of body.split('\n')) out.push(`${sp}  ${l}`);
    } else out.push(`${key} ${scalar(v)}`);
  }
}

function emitList(list, indent, out) {
  const sp = ' '.repeat(indent);
  for (const item of list) {
    if (item && typeof item === 'object' && !Array.isArray(item) && Object.keys(item).length > 0) {
      const lines = [];
      emit(item, indent + 2, lines);
      lines[0] = `${sp}- ${lines[0].slice(indent + 2)}`;
      out.push(...lines);
    } else out.push(`${sp}- ${scalar(item)}`);
  }
}

const yamlOf = (o, indent = 0) => {
  const out = [];
  emit(o, indent, out);
  return out.join('\n') + '\n';
};

/** Writes the three forms of a cluster of this size into dir; returns their paths. */
export async function writeFixtures(dir, size) {
  const files = { multi: join(dir, 'cluster-docs.yaml'), list: join(dir, 'cluster-list.yaml'), json: join(dir, 'cluster-list.json') };
  const multi = createWriteStream(files.multi);
  const list = createWriteStream(files.list);
  const json = createWriteStream(files.json);
  const write = async (s, text) => {
    if (!s.write(text)) await once(s, 'drain');
  };
  await write(list, 'apiVersion: v1\nitems:\n');
  await write(json, '{\n    "apiVersion": "v1",\n    "items": [\n');
  let first = true;
  const add = async (o) => {
    await write(multi, (first ? '' : '---\n') + yamlOf(o));
    const lines = [];
    emitList([o], 0, lines);
    await write(list, lines.join('\n') + '\n');
    const j = JSON.stringify(o, null, 4).replace(/^/gm, '        ');
    await write(json, (first ? '' : ',\n') + j);
    first = false;
  };
  for (let i = 0; i < size.services; i++) await add(service(i));
  for (let i = 0; i < size.services; i++) await add(endpointSlice(i, size));
  for (let k = 0; k < size.nodes; k++) await add(node(k));
  await write(list, 'kind: List\nmetadata:\n  resourceVersion: ""\n');
  await write(json, '\n    ],\n    "kind": "List",\n    "metadata": {\n        "resourceVersion": ""\n    }\n}\n');
  await Promise.all([multi, list, json].map((s) => new Promise((res) => s.end(res))));
  return files;
}

/** The emitter must print what a YAML reader reads back as the same object. */
export async function checkEmitter() {
  const { parse, parseAllDocuments } = await import(join(root, 'node_modules/yaml/dist/index.js'));
  const samples = [service(0), service(12345), endpointSlice(7, SAMPLE_SIZE), node(3)];
  for (const o of samples) {
    const back = parse(yamlOf(o));
    if (JSON.stringify(back) !== JSON.stringify(o)) throw new Error(`emitter: ${o.kind} does not read back as itself`);
  }
  const lines = [];
  emitList(samples, 0, lines);
  const docs = parseAllDocuments(`items:\n${lines.join('\n')}\n`);
  if (JSON.stringify(docs[0].toJS().items) !== JSON.stringify(samples)) throw new Error('emitter: list items do not read back');
}
