/**
 * Builders of Kubernetes object JSON for the test API server (as the API
 * server stores them, defaults included), and the blog post's example.
 */
import { parseAllDocuments } from 'yaml';
import { blogYaml } from './fixtures.js';
import type { KObject, Resource } from './kube-api-server.js';

export const PROXY_LABEL = 'service.kubernetes.io/service-proxy-name';

export interface ServiceSpec {
  namespace?: string;
  /** service-proxy-name label value; omitted when undefined. */
  proxyName?: string;
  labels?: Record<string, string>;
  clusterIP?: string;
  externalIPs?: string[];
  externalTrafficPolicy?: 'Cluster' | 'Local';
  internalTrafficPolicy?: 'Cluster' | 'Local';
  port?: number;
  type?: string;
}

/** A Service as the API server returns it (defaults filled in). */
export function service(name: string, s: ServiceSpec = {}): KObject {
  const labels = { ...(s.labels ?? {}), ...(s.proxyName !== undefined ? { [PROXY_LABEL]: s.proxyName } : {}) };
  const clusterIP = s.clusterIP ?? '10.96.0.10';
  const port = s.port ?? 80;
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace: s.namespace ?? 'default', ...(Object.keys(labels).length > 0 ? { labels } : {}) },
    spec: {
      type: s.type ?? 'ClusterIP',
      clusterIP,
      clusterIPs: [clusterIP],
      ...(s.externalIPs ? { externalIPs: s.externalIPs } : {}),
      ports: [{ protocol: 'TCP', port, targetPort: port }],
      sessionAffinity: 'None',
      ipFamilies: ['IPv4'],
      ipFamilyPolicy: 'SingleStack',
      internalTrafficPolicy: s.internalTrafficPolicy ?? 'Cluster',
      ...(s.externalTrafficPolicy ? { externalTrafficPolicy: s.externalTrafficPolicy } : {}),
    },
    status: { loadBalancer: {} },
  };
}

export interface EndpointSpec {
  ip: string;
  node?: string;
  ready?: boolean;
  /** Topology hints: zones this endpoint is for. */
  zones?: string[];
  hostname?: string;
  pod?: string;
}

/** An EndpointSlice of `svc` (its kubernetes.io/service-name label) as the controller writes it. */
export function slice(name: string, svc: string | undefined, endpoints: EndpointSpec[], o: { namespace?: string; port?: number; addressType?: string } = {}): KObject {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {
      name,
      namespace: o.namespace ?? 'default',
      labels: { 'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io', ...(svc !== undefined ? { 'kubernetes.io/service-name': svc } : {}) },
    },
    addressType: o.addressType ?? (endpoints[0]?.ip.includes(':') ? 'IPv6' : 'IPv4'),
    endpoints: endpoints.map((e, i) => ({
      addresses: [e.ip],
      conditions: { ready: e.ready ?? true, serving: e.ready ?? true, terminating: false },
      ...(e.hostname ? { hostname: e.hostname } : {}),
      ...(e.node ? { nodeName: e.node } : {}),
      ...(e.zones ? { hints: { forZones: e.zones.map((z) => ({ name: z })) } } : {}),
      targetRef: { kind: 'Pod', name: e.pod ?? `${name}-pod-${i}`, namespace: o.namespace ?? 'default' },
    })),
    ports: [{ name: '', port: o.port ?? 8080, protocol: 'TCP' }],
  };
}

/** A Node, with its zone label when given. */
export function node(name: string, zone?: string): KObject {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name, labels: { 'kubernetes.io/hostname': name, ...(zone !== undefined ? { 'topology.kubernetes.io/zone': zone } : {}) } },
  };
}

/**
 * The blog post's example: its Service (as the API server stores it after
 * `kubectl apply`, defaults filled in) and the two EndpointSlices of
 * fixtures/kpng-example.yaml. The local pods run on node vm-002.
 */
export function blogObjects(): Array<[Resource, KObject]> {
  const docs = parseAllDocuments(blogYaml).map((d) => d.toJS() as KObject);
  return docs.map((d): [Resource, KObject] => {
    if (d.kind !== 'Service') return ['endpointslices', d];
    const spec = d.spec as Record<string, unknown>;
    return [
      'services',
      {
        ...d,
        metadata: { ...d.metadata, namespace: 'default' },
        spec: {
          ...spec,
          type: 'ClusterIP',
          clusterIPs: ['None'],
          ipFamilies: ['IPv4', 'IPv6'],
          ports: [{ protocol: 'TCP', port: 6000, targetPort: 6000 }],
          sessionAffinity: 'None',
          internalTrafficPolicy: 'Cluster',
        },
        status: { loadBalancer: {} },
      },
    ];
  });
}

