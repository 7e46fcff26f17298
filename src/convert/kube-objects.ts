/**
 * Kubernetes objects as the conversion reads them: the fields it reads of a
 * Service, a discovery.k8s.io/v1 EndpointSlice and a Node (as the API serves
 * them, or as @kubernetes/client-node hands them over: every field optional,
 * `null` allowed where the API may send it), the labels with a meaning for a
 * proxy, and an object's namespace/name and labels, type-checked.
 */
import { ConversionError, Fields } from './fields.js';

/** Label naming the proxy that handles a Service (kube-proxy and kpng skip others). */
export const LABEL_SERVICE_PROXY_NAME = 'service.kubernetes.io/service-proxy-name';
/** Label that kube-proxy and kpng also exclude (`v1.IsHeadlessService`). */
export const LABEL_HEADLESS = 'service.kubernetes.io/headless';
/** Label tying an EndpointSlice to its Service. */
export const LABEL_SERVICE_NAME = 'kubernetes.io/service-name';
/** Node label giving the node's zone (topology hints). */
export const LABEL_ZONE = 'topology.kubernetes.io/zone';

/** The metadata fields read here. */
export interface KubeMeta {
  name?: string | null;
  namespace?: string | null;
  labels?: Record<string, string> | null;
  annotations?: Record<string, string> | null;
}

/** One entry of a Service's `spec.ports`. */
interface KubeServicePort {
  name?: string | null;
  protocol?: string | null;
  port?: number | null;
  nodePort?: number | null;
  /** IntOrString: a number is a port, a string a container port name. */
  targetPort?: number | string | null;
}

/** A core/v1 Service (the fields read here). */
export interface KubeService {
  apiVersion?: string;
  kind?: string;
  metadata?: KubeMeta | null;
  spec?: {
    type?: string | null;
    clusterIP?: string | null;
    clusterIPs?: string[] | null;
    externalIPs?: string[] | null;
    loadBalancerSourceRanges?: string[] | null;
    ports?: KubeServicePort[] | null;
    externalTrafficPolicy?: string | null;
    internalTrafficPolicy?: string | null;
    sessionAffinity?: string | null;
    sessionAffinityConfig?: { clientIP?: { timeoutSeconds?: number | null } | null } | null;
    healthCheckNodePort?: number | null;
  } | null;
  status?: { loadBalancer?: { ingress?: Array<{ ip?: string | null; hostname?: string | null }> | null } | null } | null;
}

/** One endpoint of a discovery.k8s.io/v1 EndpointSlice (the fields read here). */
interface KubeSliceEndpoint {
  addresses?: string[] | null;
  conditions?: { ready?: boolean | null; serving?: boolean | null; terminating?: boolean | null } | null;
  hostname?: string | null;
  nodeName?: string | null;
  zone?: string | null;
  hints?: { forZones?: Array<{ name?: string | null }> | null } | null;
  targetRef?: { kind?: string | null; name?: string | null; namespace?: string | null } | null;
}

/** A discovery.k8s.io/v1 EndpointSlice (the fields read here). */
export interface KubeEndpointSlice {
  apiVersion?: string;
  kind?: string;
  metadata?: KubeMeta | null;
  addressType?: string | null;
  endpoints?: KubeSliceEndpoint[] | null;
  ports?: Array<{ name?: string | null; port?: number | null; protocol?: string | null }> | null;
}

/** A core/v1 Node (only its name and zone label are read). */
export interface KubeNode {
  apiVersion?: string;
  kind?: string;
  metadata?: KubeMeta | null;
}

/** An object's `metadata`, type-checked (absent: no fields). */
export function metadataOf(o: { metadata?: unknown }): Fields {
  return Fields.orEmpty(o.metadata, ['metadata']);
}

/** An object's labels (`metadata.labels`), or undefined when it has none. Throws `ConversionError`. */
export function labelsOf(o: { metadata?: unknown }): Record<string, string> | undefined {
  return metadataOf(o).stringMap('labels');
}

/**
 * `metadata.namespace` (default `default`, as `kubectl apply` in the default
 * context) and `metadata.name` (required). Throws `ConversionError`.
 */
export function objectKey(o: { metadata?: unknown }): { namespace: string; name: string } {
  const m = metadataOf(o);
  const name = m.string('name');
  if (!name) throw new ConversionError(m.at('name'), 'missing name');
  const namespace = m.string('namespace') || 'default';
  return { namespace, name };
}
