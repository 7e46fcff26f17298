// The synthetic cluster the benchmarks build, one object per index:
// Services, EndpointSlices and Nodes, as the API server serves them
// (bench/kube-bench-server.js) or, with options, with what a real cluster adds
// (kind/apiVersion, managedFields, a kubectl last-applied annotation; the
// Service variants of bench/node-view.js). The same index always gives the
// same object for the same options: scripts compare outputs across builds.
//
// bench/replay.js prints a cluster of its own (kubectl's names, sorted keys,
// hashed uids) and takes only the managedFields pieces from here.

export const CREATED = '2026-11-01T00:00:00Z';
export const PROXY_LABEL = 'service.kubernetes.io/service-proxy-name';
export const ZONE_LABEL = 'topology.kubernetes.io/zone';
export const LAST_APPLIED = 'kubectl.kubernetes.io/last-applied-configuration';
const TRIGGER_TIME = 'endpoints.kubernetes.io/last-change-trigger-time';
export const SLICE_LABELS = ['app', 'endpointslice.kubernetes.io/managed-by', 'kubernetes.io/service-name'];

// ---------------------------------------------------------------- names and addresses

/** A deterministic UUID-shaped uid. */
export const uid = (kind, i) => `${kind.toString(16).padStart(8, '0')}-0000-4000-8000-${i.toString(16).padStart(12, '0')}`;
export const v4 = (base, x) => `10.${base + (x >> 16)}.${(x >> 8) & 255}.${x & 255}`;
/** An IPv6 address under `prefix` (ending in `::`) numbered x (two 16-bit groups). */
export const v6 = (prefix, x) => `${prefix}${x >>> 16 ? `${(x >>> 16).toString(16)}:` : ''}${(x & 0xffff).toString(16)}`;
export const pad = (x) => x.toString(36).padStart(5, 'x');

/**
 * The shape of Service i; shared by the objects and the expectations. With
 * `variants`, also LoadBalancers, Local traffic policies, ClientIP affinity
 * and headless (stateful) Services; without, all of those are false.
 */
export function shape(i, variants = false) {
  return {
    namespace: `ns-${i % 50}`,
    name: `svc-${i}`,
    /** Selected by the source (no service-proxy-name label). */
    selected: i % 100 !== 99,
    /** Its endpoints carry zone hints. */
    hinted: i % 10 === 1,
    ipv6: i % 50 === 25,
    /** LoadBalancer, externalTrafficPolicy Local. */
    lb: variants && i % 20 === 4,
    internalLocal: variants && i % 25 === 6,
    affinity: variants && i % 30 === 8,
    /** Headless; endpoints with hostnames. */
    stateful: variants && i % 40 === 9,
  };
}

/** Node of endpoint j of Service i. */
export const nodeOf = (i, j) => (i * 10 + j * 11) % 100;
export const zoneOf = (node) => `zone-${node % 3}`;
/** Endpoint j of Service i is ready (endpoint `notReady` of one Service in five is not). */
export const readyOf = (i, j, notReady = 9) => !(j === notReady && i % 5 === 2);

/** Address of endpoint j of Service i at `version`. */
function address(i, j, version, perService, ipv6) {
  const x = (i * perService + j + version * 1_000_003) % 4_000_000;
  return ipv6 ? v6('2001:db8:244::', x) : v4(128, x);
}

// ---------------------------------------------------------------- managedFields

/** A managedFields set: `{ '.': {}, 'f:KEY': {} ... }`. */
export const fieldSet = (keys) => ({ '.': {}, ...Object.fromEntries(keys.map((k) => [`f:${k}`, {}])) });

/** `o` with its own keys in kubectl's (sorted) order; values untouched. */
export const sortedKeys = (o) => Object.fromEntries(Object.entries(o).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));

/** One managedFields entry (operation Update), keys in the API server's order or, with `sorted`, kubectl's. */
export function managedField({ manager, apiVersion, time, fieldsV1, subresource, sorted = false }) {
  const f = { manager, operation: 'Update', apiVersion, time, fieldsType: 'FieldsV1', fieldsV1, ...(subresource ? { subresource } : {}) };
  return sorted ? sortedKeys(f) : f;
}

/** What `kubectl apply` owns of a Service: these annotations and labels, the ports (with a `.` entry if `portsSet`). */
export function serviceFields({ annotations, labels, ports, portsSet = false }) {
  return {
    'f:metadata': { 'f:annotations': fieldSet(annotations), 'f:labels': fieldSet(labels) },
    'f:spec': {
      'f:internalTrafficPolicy': {},
      'f:ports': {
        ...(portsSet ? { '.': {} } : {}),
        ...Object.fromEntries(ports.map((p) => [`k:{"port":${p.port},"protocol":"${p.protocol}"}`, { '.': {}, 'f:name': {}, 'f:port': {}, 'f:protocol': {}, 'f:targetPort': {} }])),
      },
      'f:selector': {},
      'f:sessionAffinity': {},
      'f:type': {},
    },
  };
}

/** What the endpointslice controller owns of a slice with these labels, owned by the Service `ownerUid`. */
export function sliceFields(ownerUid, labels = SLICE_LABELS) {
  return {
    'f:addressType': {},
    'f:endpoints': {},
    'f:metadata': {
      'f:annotations': fieldSet([TRIGGER_TIME]),
      'f:generateName': {},
      'f:labels': fieldSet(labels),
      'f:ownerReferences': { '.': {}, [`k:{"uid":"${ownerUid}"}`]: {} },
    },
    'f:ports': {},
  };
}

// ---------------------------------------------------------------- objects

/**
 * Service i at resourceVersion rv. By default as the API server lists it (no
 * kind/apiVersion, as list items). Options: `typed` (kind/apiVersion),
 * `applied` (created with `kubectl apply`: an owner annotation, the
 * last-applied annotation, managedFields), `variants` (see shape),
 * `namedTargetPort` (https targets the port named https rather than 8443).
 */
export function service(i, rv, { typed = false, applied = false, variants = false, namedTargetPort = false } = {}) {
  const c = shape(i, variants);
  const ext = i % 10 === 3 ? [`198.51.100.${(i % 254) + 1}`] : i % 10 === 7 ? [`198.51.100.${(i % 254) + 1}`, v6('2001:db8::', i)] : undefined;
  const clusterIP = c.stateful ? 'None' : c.ipv6 ? v6('2001:db8:96::', i) : v4(96, i + 10);
  const ports = [
    { name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, ...(c.lb ? { nodePort: 30000 + (i % 2000) } : {}) },
    { name: 'https', protocol: 'TCP', port: 443, targetPort: namedTargetPort ? 'https' : 8443, ...(c.lb ? { nodePort: 32000 + (i % 700) } : {}) },
  ];
  const owner = `team-${i % 7}`;
  const topology = c.hinted ? { 'service.kubernetes.io/topology-mode': 'Auto' } : {};
  let annotations = c.hinted ? topology : undefined;
  let managedFields;
  if (applied) {
    const last = {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { annotations: { 'example.com/owner': owner }, labels: { app: c.name, 'app.kubernetes.io/part-of': owner }, name: c.name, namespace: c.namespace },
      spec: { ports: ports.map(({ nodePort, ...p }) => p), selector: { app: c.name }, ...(c.lb ? { type: 'LoadBalancer', externalTrafficPolicy: 'Local' } : {}) },
    };
    annotations = { 'example.com/owner': owner, [LAST_APPLIED]: JSON.stringify(last) + '\n', ...topology };
    managedFields = [
      managedField({
        manager: 'kubectl-client-side-apply',
        apiVersion: 'v1',
        time: CREATED,
        fieldsV1: serviceFields({ annotations: ['example.com/owner', LAST_APPLIED], labels: ['app', 'app.kubernetes.io/part-of'], ports }),
      }),
      ...(c.lb ? [managedField({ manager: 'cloud-controller-manager', apiVersion: 'v1', time: CREATED, fieldsV1: { 'f:status': { 'f:loadBalancer': { 'f:ingress': {} } } }, subresource: 'status' })] : []),
    ];
  }
  return {
    ...(typed ? { apiVersion: 'v1', kind: 'Service' } : {}),
    metadata: {
      name: c.name,
      namespace: c.namespace,
      uid: uid(1, i),
      resourceVersion: String(rv),
      creationTimestamp: CREATED,
      labels: { app: c.name, 'app.kubernetes.io/part-of': owner, ...(c.selected ? {} : { [PROXY_LABEL]: 'other-proxy' }) },
      ...(annotations ? { annotations } : {}),
      ...(managedFields ? { managedFields } : {}),
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

/**
 * The EndpointSlice of Service i at `version` and resourceVersion rv, with
 * `perService` endpoints over node-0..node-99. Which addresses a version
 * moves (`churn`): 'turns' (default) moves one more endpoint per version, in
 * turn over all but the last, so that every change is one each node sees;
 * 'one' gives endpoint version % perService the address of `version`, the
 * others that of version 0. Options as for service: `typed`, `managed`
 * (managedFields), `variants` (hostnames for stateful Services); `notReady`
 * as for readyOf.
 */
export function endpointSlice(i, version, rv, { perService = 10, notReady = 9, churn = 'turns', typed = false, managed = false, variants = false } = {}) {
  const c = shape(i, variants);
  const turn = Math.max(1, perService - 1);
  /** The version of endpoint j's address. */
  const moved = churn === 'turns' ? (j) => (j < turn ? Math.floor((version + turn - 1 - j) / turn) : 0) : (j) => (j === version % perService ? version : 0);
  const endpoints = [];
  for (let j = 0; j < perService; j++) {
    const node = nodeOf(i, j);
    const ready = readyOf(i, j, notReady);
    const pod = c.stateful ? `${c.name}-${j}` : `${c.name}-7d9f8b6c5-${pad(i * perService + j)}`;
    endpoints.push({
      addresses: [address(i, j, moved(j), perService, c.ipv6)],
      conditions: { ready, serving: ready, terminating: false },
      ...(c.stateful ? { hostname: pod } : {}),
      ...(c.hinted ? { hints: { forZones: [{ name: zoneOf(node) }] } } : {}),
      nodeName: `node-${node}`,
      targetRef: { kind: 'Pod', namespace: c.namespace, name: pod, uid: uid(3, i * perService + j) },
      zone: zoneOf(node),
    });
  }
  return {
    ...(typed ? { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice' } : {}),
    metadata: {
      name: `${c.name}-${pad(i)}`,
      generateName: `${c.name}-`,
      namespace: c.namespace,
      uid: uid(2, i),
      resourceVersion: String(rv),
      generation: version + 1,
      creationTimestamp: CREATED,
      labels: { app: c.name, 'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io', 'kubernetes.io/service-name': c.name },
      annotations: { [TRIGGER_TIME]: CREATED },
      ownerReferences: [{ apiVersion: 'v1', kind: 'Service', name: c.name, uid: uid(1, i), controller: true, blockOwnerDeletion: true }],
      ...(managed ? { managedFields: [managedField({ manager: 'kube-controller-manager', apiVersion: 'discovery.k8s.io/v1', time: CREATED, fieldsV1: sliceFields(uid(1, i)) })] } : {}),
    },
    addressType: c.ipv6 ? 'IPv6' : 'IPv4',
    endpoints,
    ports: [
      { name: 'http', protocol: 'TCP', port: 8080 },
      { name: 'https', protocol: 'TCP', port: 8443 },
    ],
  };
}

/**
 * Node n (in `zone`, by default zoneOf(n)). By default as the API server
 * lists it, at resourceVersion `rv`, with status; `minimal`: only name, uid,
 * the hostname/os/zone labels and podCIDR (no resourceVersion, no status).
 * `typed`: with kind/apiVersion.
 */
export function node(n, { rv, zone = zoneOf(n), typed = false, minimal = false } = {}) {
  const name = `node-${n}`;
  const cidr = `10.244.${n}.0/24`;
  const kind = typed ? { apiVersion: 'v1', kind: 'Node' } : {};
  if (minimal) {
    return { ...kind, metadata: { name, uid: uid(4, n), labels: { 'kubernetes.io/hostname': name, 'kubernetes.io/os': 'linux', [ZONE_LABEL]: zone } }, spec: { podCIDR: cidr } };
  }
  return {
    ...kind,
    metadata: {
      name,
      uid: uid(4, n),
      resourceVersion: String(rv),
      creationTimestamp: CREATED,
      labels: {
        'kubernetes.io/arch': 'amd64',
        'kubernetes.io/hostname': name,
        'kubernetes.io/os': 'linux',
        'topology.kubernetes.io/region': 'region-0',
        [ZONE_LABEL]: zone,
      },
    },
    spec: { podCIDR: cidr, podCIDRs: [cidr] },
    status: {
      addresses: [
        { type: 'InternalIP', address: `10.0.${n >> 8}.${n & 255}` },
        { type: 'Hostname', address: name },
      ],
      conditions: [{ type: 'Ready', status: 'True', reason: 'KubeletReady', lastHeartbeatTime: CREATED, lastTransitionTime: CREATED }],
      nodeInfo: { kubeletVersion: 'v1.31.0', containerRuntimeVersion: 'containerd://1.7.0', osImage: 'Linux', architecture: 'amd64', operatingSystem: 'linux' },
    },
  };
}
