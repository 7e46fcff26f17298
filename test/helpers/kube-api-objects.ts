/**
 * What the test Kubernetes API server (kube-api-server.ts) is made of besides
 * its HTTP handling: the resources it serves, its objects and events, the
 * label and field selectors it applies, its error Status, and kubeconfig text
 * that points at it.
 */
import type { ServerResponse } from 'node:http';

/** A Kubernetes object as JSON. */
export type KObject = {
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; resourceVersion?: string; [k: string]: unknown };
  [k: string]: unknown;
};

/** The resources this server serves. */
export type Resource = 'services' | 'endpointslices' | 'nodes';

export interface ResourceInfo {
  path: string;
  namespaced: boolean;
  kind: string;
  apiVersion: string;
  group: string;
}

export const resources: Record<Resource, ResourceInfo> = {
  services: { path: '/api/v1/services', namespaced: true, kind: 'Service', apiVersion: 'v1', group: '' },
  endpointslices: { path: '/apis/discovery.k8s.io/v1/endpointslices', namespaced: true, kind: 'EndpointSlice', apiVersion: 'discovery.k8s.io/v1', group: 'discovery.k8s.io' },
  nodes: { path: '/api/v1/nodes', namespaced: false, kind: 'Node', apiVersion: 'v1', group: '' },
};

export type EventType = 'ADDED' | 'MODIFIED' | 'DELETED';

export interface HistoryEvent {
  rv: number;
  resource: Resource;
  type: EventType;
  /** The object after the change (its last state, for DELETED). */
  obj: KObject;
  /** The object before the change (undefined for ADDED). */
  old: KObject | undefined;
}

/** One request as received, for assertions. */
export interface RequestRecord {
  method: string;
  path: string;
  query: Record<string, string>;
  watch: boolean;
  status: number;
}

export interface Watcher {
  resource: Resource;
  res: ServerResponse;
  selector: Selector;
  bookmarks: boolean;
  timer?: NodeJS.Timeout;
}

export type Selector = (obj: KObject) => boolean;

/** Parses the equality-based label selectors the source uses (`a=b`, `a==b`, `a!=b`, `a`, `!a`). */
export function parseLabelSelector(sel: string | undefined): Selector {
  if (!sel) return () => true;
  const reqs = sel.split(',').map((part): Selector => {
    const p = part.trim();
    let m: RegExpExecArray | null;
    if ((m = /^([^!=]+?)\s*!=\s*(.*)$/.exec(p))) {
      const [, k, v] = m as unknown as [string, string, string];
      return (o) => o.metadata.labels?.[k] !== v;
    }
    if ((m = /^([^!=]+?)\s*==?\s*(.*)$/.exec(p))) {
      const [, k, v] = m as unknown as [string, string, string];
      return (o) => o.metadata.labels?.[k] === v;
    }
    if (p.startsWith('!')) {
      const k = p.slice(1).trim();
      return (o) => !(k in (o.metadata.labels ?? {}));
    }
    return (o) => p in (o.metadata.labels ?? {});
  });
  return (o) => reqs.every((r) => r(o));
}

/** Parses `metadata.name=x,metadata.namespace=y`. */
export function parseFieldSelector(sel: string | undefined): Selector {
  if (!sel) return () => true;
  const reqs = sel.split(',').map((part): Selector => {
    const m = /^([^!=]+?)\s*(!=|==|=)\s*(.*)$/.exec(part.trim());
    if (!m) throw new Error(`bad field selector ${part}`);
    const [, field, op, v] = m as unknown as [string, string, string, string];
    const get = (o: KObject): unknown => (field === 'metadata.name' ? o.metadata.name : field === 'metadata.namespace' ? o.metadata.namespace : undefined);
    return op === '!=' ? (o) => get(o) !== v : (o) => get(o) === v;
  });
  return (o) => reqs.every((r) => r(o));
}

export const keyOf = (o: KObject): string => `${o.metadata.namespace ?? ''}/${o.metadata.name}`;

export function status(code: number, reason: string, message: string, details?: Record<string, unknown>): Record<string, unknown> {
  return { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, ...(details ? { details } : {}), code };
}

/** Kubeconfig text for a plain-HTTP server (which needs insecure-skip-tls-verify). */
export function kubeconfigText(url: string, token?: string): string {
  return [
    'apiVersion: v1',
    'kind: Config',
    'clusters:',
    '- name: test',
    '  cluster:',
    `    server: ${url}`,
    '    insecure-skip-tls-verify: true',
    'users:',
    '- name: test',
    `  user: ${token !== undefined ? `{token: ${token}}` : '{}'}`,
    'contexts:',
    '- name: test',
    '  context: {cluster: test, user: test}',
    'current-context: test',
    '',
  ].join('\n');
}
