/**
 * The library of callouts/userspace-proxy (callouts/lib/userspace-proxy.mjs),
 * typed for the tests that call it without a network: the parts they use, a
 * state line of Service default/NAME as kpng prints it, and an endpoint.
 */
import { pathToFileURL } from 'node:url';
import { repoPath } from './fixtures.js';

export interface Port {
  name: string;
  proto: string;
  port: number;
  nodePort: number;
  targetPort: number;
}
export interface Service {
  key: string;
  label: string;
  ports: Port[];
  ips: { internal: Record<4 | 6, string[]>; external: Record<4 | 6, string[]> };
  endpoints: Array<{ ip: { 4?: string; 6?: string }; internal: boolean; external: boolean; overrides: Map<string, number> }>;
  affinityMs: number;
}
export interface Planned {
  key: string;
  proto: string;
  family: 4 | 6;
  host: string;
  port: number;
  nodePort: boolean;
  label: string;
  backend: { key: string; affinityKey?: string; endpoints: Array<{ ip: string; port: number; id: string }>; affinityMs: number };
  routes?: Array<{ host: string; label: string; backend: Planned['backend'] }>;
  shared?: boolean;
}
export interface BackendT {
  update(plan: Planned['backend']): void;
  pick(clientIp: string, tried: Set<string>, now: number): { ip: string; port: number; id: string } | undefined;
}
export interface Lib {
  isIPv4Literal(s: unknown): boolean;
  isIPv6Literal(s: unknown): boolean;
  readService(line: unknown, why?: (msg: string) => void): Service | undefined;
  planListeners(services: Service[], why?: (msg: string) => void, localAddresses?: Set<string>): Map<string, Planned>;
  /** Plans frame after frame, keeping what a Service whose line did not change had. */
  Planner: new () => { plan(services: Service[], why?: (msg: string) => void, localAddresses?: Set<string>): Map<string, Planned> };
  canonicalIP(s: string): string;
  readOptions(env: NodeJS.ProcessEnv): Record<string, unknown>;
  ServiceTable: new (why?: (msg: string) => void) => { apply(header: string, lines: string[]): { ok: boolean; why?: string }; ordered(): Service[]; based: boolean };
  FrameReader: new (onFrame: (header: string, lines: string[]) => void) => { push(text: string): void; end(): boolean };
  Backend: new (key: string, affinity?: Map<string, unknown>) => BackendT;
  DEFAULTS: Record<string, number>;
}

/** The library's path (tests that import another of its exports load it again). */
export const libPath = repoPath('callouts/lib/userspace-proxy.mjs');
export const lib = (await import(pathToFileURL(libPath).href)) as Lib;

/** A state line (as kpng prints it) of Service default/NAME. */
export function line(name: string, svc: Record<string, unknown>, endpoints: unknown[] | null = null): string {
  return JSON.stringify({ Service: { Namespace: 'default', Name: name, Type: 'ClusterIP', ...svc }, Endpoints: endpoints });
}
export const ep = (v4: string | undefined, v6: string | undefined, extra: Record<string, unknown> = {}) => ({
  IPs: { ...(v4 ? { V4: [v4] } : {}), ...(v6 ? { V6: [v6] } : {}) },
  ...extra,
});
