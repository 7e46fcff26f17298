/**
 * A Kubernetes Service -> the model's Service, as kpng's controller
 * (server/jobs/kube2store) builds it, and kube-proxy's rule for which
 * Services a proxy handles.
 *
 * Where kpng relies on the API server's defaults, the same defaults apply
 * here, so hand-written manifests convert like the objects the API server
 * would return for them: namespace `default`, type `ClusterIP`, protocol TCP,
 * targetPort = port (absent, 0 or ""), ClientIP affinity timeout 10800 s.
 */
import type { IPSet, PortMapping, Service } from '../model.js';
import { Fields, type FieldPath } from './fields.js';
import { filterMap, type GlobFilter } from './glob.js';
import { addIP, ipSet } from './ip.js';
import { LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME, labelsOf, metadataOf, objectKey, type KubeService } from './kube-objects.js';

/** Kubernetes' default ClientIP session affinity timeout. */
const DEFAULT_AFFINITY_TIMEOUT = 10800;

const protocols: Record<string, number> = { TCP: 1, UDP: 2, SCTP: 3 };


/**
 * kube-proxy's (and kpng's) rule for which Services a proxy handles: with a
 * proxy name, those labelled `service.kubernetes.io/service-proxy-name: NAME`;
 * without, those without that label. Services labelled
 * `service.kubernetes.io/headless` are never handled.
 */
export function isServiceSelected(svc: KubeService, serviceProxyName?: string): boolean {
  const labels = labelsOf(svc) ?? {};
  if (Object.hasOwn(labels, LABEL_HEADLESS)) return false;
  const proxy = Object.hasOwn(labels, LABEL_SERVICE_PROXY_NAME) ? labels[LABEL_SERVICE_PROXY_NAME] : undefined;
  return serviceProxyName ? proxy === serviceProxyName : proxy === undefined;
}

/** Why `isServiceSelected` leaves a Service out, for the log (with a hint when a proxy name would take it). */
export function notSelectedReason(svc: KubeService, serviceProxyName?: string): string {
  const labels = labelsOf(svc);
  if (labels?.[LABEL_HEADLESS] !== undefined) return `it is labelled ${LABEL_HEADLESS}`;
  const proxy = labels?.[LABEL_SERVICE_PROXY_NAME];
  // An empty value is one no proxy name selects (kpng's selector is `!label` or `label=NAME`, NAME non-empty).
  if (proxy !== undefined) return `it is labelled ${LABEL_SERVICE_PROXY_NAME}=${proxy}` + (serviceProxyName || !proxy ? '' : ` (use --service-proxy-name ${proxy})`);
  return `it is not labelled ${LABEL_SERVICE_PROXY_NAME}=${serviceProxyName}`;
}

/** Options of `convertService`. */
export interface ServiceOptions {
  /** Labels to send (kpng `--with-service-labels`); none when undefined. */
  labels?: GlobFilter | undefined;
  /** Annotations to send (kpng `--with-service-annotations`); none when undefined. */
  annotations?: GlobFilter | undefined;
}

/** A Kubernetes Service as kpng's controller models it. Throws `ConversionError`. */
export function convertService(svc: KubeService, opts: ServiceOptions = {}): Service {
  const { namespace, name } = objectKey(svc);
  const m = metadataOf(svc);
  const spec = Fields.orEmpty(svc.spec, ['spec']);
  const type = spec.string('type') || 'ClusterIP';
  const out: Service = { Namespace: namespace, Name: name, Type: type };

  const labels = filterMap(m.stringMap('labels'), opts.labels);
  if (labels) out.Labels = labels;
  const annotations = filterMap(m.stringMap('annotations'), opts.annotations);
  if (annotations) out.Annotations = annotations;

  // ClusterIPs is always present ({} for headless and ExternalName); clusterIP for pre-dual-stack objects.
  let clusterIPs = spec.strings('clusterIPs');
  if (!clusterIPs || clusterIPs.length === 0) {
    const one = spec.string('clusterIP');
    clusterIPs = one ? [one] : [];
  }
  const cips: IPSet = {};
  let headless = false;
  for (const ip of clusterIPs) {
    if (ip === 'None') headless = true;
    else addIP(cips, ip);
  }
  out.IPs = { ClusterIPs: cips, ExternalIPs: ipSet(spec.strings('externalIPs')) };
  const lb = Fields.read(svc.status, ['status'])?.object('loadBalancer');
  const ingress = lb?.map('ingress', (ing, path) => Fields.orEmpty(ing, path).string('ip'));
  if (ingress && ingress.length > 0) {
    const lbs: IPSet = {};
    for (const ip of ingress) if (ip) addIP(lbs, ip);
    out.IPs.LoadBalancerIPs = lbs;
  }
  if (headless) out.IPs.Headless = true;

  const ranges = spec.strings('loadBalancerSourceRanges');
  if (ranges && ranges.length > 0) out.IPFilters = [{ SourceRanges: [...ranges] }];

  out.Ports = spec.map('ports', servicePort) ?? [];

  if (spec.string('externalTrafficPolicy') === 'Local') out.ExternalTrafficToLocal = true;
  if (spec.string('internalTrafficPolicy') === 'Local') out.InternalTrafficToLocal = true;

  if (spec.string('sessionAffinity') === 'ClientIP') {
    const t = spec.object('sessionAffinityConfig')?.object('clientIP')?.int32('timeoutSeconds');
    out.SessionAffinity = { ClientIP: { TimeoutSeconds: t ?? DEFAULT_AFFINITY_TIMEOUT } };
  }
  const hc = spec.int32('healthCheckNodePort');
  if (hc) out.HealthCheckNodePort = hc;
  return out;
}

/** One of `spec.ports`. */
function servicePort(v: unknown, path: FieldPath): PortMapping {
  const p = Fields.orEmpty(v, path);
  const port = p.int32('port');
  const proto = p.string('protocol') || 'TCP';
  const pm: PortMapping = {};
  const name = p.string('name');
  if (name) pm.Name = name;
  pm.Protocol = Object.hasOwn(protocols, proto) ? protocols[proto]! : 0;
  if (port) pm.Port = port;
  const nodePort = p.int32('nodePort');
  if (nodePort) pm.NodePort = nodePort;
  // IntOrString: a name, a number, or the port itself when absent, 0 or ""
  // (the API server's default: SetDefaults_Service).
  const tp = p.value('targetPort');
  const n = typeof tp === 'string' ? 0 : p.int32('targetPort');
  if (typeof tp === 'string' && tp) pm.TargetPortName = tp;
  else if (n) pm.TargetPort = n;
  else if (port) pm.TargetPort = port;
  return pm;
}
