/**
 * The states the service-proxy lab (service-lab.ts) applies: Services
 * described by what a test needs (ServiceSpec), as kpng's JSON lines, in
 * kpng's order.
 */
import { FAMILIES, PODS, type Family, type PodName } from './service-lab.js';

export const PROTO = { TCP: 1, UDP: 2, SCTP: 3 } as const;

export interface PortSpec {
  name?: string;
  protocol?: keyof typeof PROTO;
  port: number;
  nodePort?: number;
  targetPort?: number;
  targetPortName?: string;
}

export interface EndpointSpec {
  pod: PodName;
  /** Runs on this node. */
  local?: boolean;
  /** Scopes; absent: the key is left out (which means both). */
  scopes?: { internal?: boolean; external?: boolean };
  portOverrides?: Array<{ name?: string; port: number }>;
  /** Which of the pod's addresses it has (default both, as two endpoints, one per family, as EndpointSlices give). */
  families?: Family[];
}

export interface IPs {
  v4?: string[];
  v6?: string[];
}

export interface ServiceSpec {
  namespace?: string;
  name: string;
  type?: string;
  clusterIPs?: IPs;
  headless?: boolean;
  externalIPs?: IPs;
  lbIPs?: IPs;
  ports: PortSpec[];
  /** SessionAffinity ClientIP with this timeout. */
  affinity?: number;
  externalTrafficToLocal?: boolean;
  internalTrafficToLocal?: boolean;
  /** null or absent: `"Endpoints":null`. */
  endpoints?: EndpointSpec[] | null;
}

const ipSet = (s: IPs | undefined): Record<string, string[]> => ({
  ...(s?.v4?.length ? { V4: s.v4 } : {}),
  ...(s?.v6?.length ? { V6: s.v6 } : {}),
});

/** The object kpng prints for a Service (keys in Go's declaration order, zero values left out). */
export function serviceObject(s: ServiceSpec): { Service: Record<string, unknown>; Endpoints: unknown[] | null } {
  const ips: Record<string, unknown> = { ClusterIPs: ipSet(s.clusterIPs), ExternalIPs: ipSet(s.externalIPs) };
  if (s.lbIPs?.v4?.length || s.lbIPs?.v6?.length) ips.LoadBalancerIPs = ipSet(s.lbIPs);
  if (s.headless) ips.Headless = true;
  const ports = s.ports.map((p) => ({
    ...(p.name ? { Name: p.name } : {}),
    Protocol: PROTO[p.protocol ?? 'TCP'],
    Port: p.port,
    ...(p.nodePort ? { NodePort: p.nodePort } : {}),
    ...(p.targetPort ? { TargetPort: p.targetPort } : {}),
    ...(p.targetPortName ? { TargetPortName: p.targetPortName } : {}),
  }));
  const service: Record<string, unknown> = { Namespace: s.namespace ?? 'default', Name: s.name, Type: s.type ?? 'ClusterIP', IPs: ips, Ports: ports };
  if (s.externalTrafficToLocal) service.ExternalTrafficToLocal = true;
  service.SessionAffinity = s.affinity !== undefined ? { ClientIP: s.affinity ? { TimeoutSeconds: s.affinity } : {} } : null;
  if (s.internalTrafficToLocal) service.InternalTrafficToLocal = true;
  const endpoints: unknown[] = [];
  for (const e of s.endpoints ?? []) {
    for (const fam of e.families ?? FAMILIES) {
      const ep: Record<string, unknown> = { Hostname: e.pod, IPs: { [fam === 'v4' ? 'V4' : 'V6']: [PODS[e.pod][fam]] } };
      if (e.local) ep.Local = true;
      if (e.portOverrides?.length) ep.PortOverrides = e.portOverrides.map((o) => ({ ...(o.name ? { Name: o.name } : {}), Port: o.port }));
      if (e.scopes) ep.Scopes = { ...(e.scopes.internal ? { Internal: true } : {}), ...(e.scopes.external ? { External: true } : {}) };
      endpoints.push(ep);
    }
  }
  return { Service: service, Endpoints: endpoints.length ? endpoints : null };
}

/** kpng's order of Service keys: bytes, "/" before any other byte (ASCII names here). */
export function kpngCompare(a: string, b: string): number {
  const rank = (c: number) => (c === 0x2f ? -1 : c);
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    if (a.charCodeAt(i) !== b.charCodeAt(i)) return rank(a.charCodeAt(i)) - rank(b.charCodeAt(i));
  }
  return a.length - b.length;
}

/** A state (one line per Service, kpng's order): from specs, or from objects a test has bent (hostile input). */
export function stateText(services: Array<ServiceSpec | ReturnType<typeof serviceObject>>): string {
  const objs = services.map((s) => ('Service' in s ? s : serviceObject(s)));
  const key = (o: ReturnType<typeof serviceObject>) => `${String(o.Service.Namespace)}/${String(o.Service.Name)}`;
  return objs
    .sort((a, b) => kpngCompare(key(a), key(b)))
    .map((o) => JSON.stringify(o) + '\n')
    .join('');
}
