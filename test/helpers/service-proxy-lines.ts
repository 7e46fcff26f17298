/**
 * Service lines for the service proxier callouts' edge-case tests, and a run
 * of a callout on them (directly, or in a network namespace).
 */
import { runCommand, type CommandResult } from './command.js';

export interface SvcOptions {
  eps?: string[] | null;
  ext?: string[];
  affinity?: number;
  ports?: unknown[];
}

/** A Service line: ClusterIP `ip`, TCP 80 -> 8080 unless `ports`, endpoints of both scopes. */
export function svc(ns: string, name: string, ip: string, o: SvcOptions = {}): string {
  const IPs: Record<string, unknown> = { ClusterIPs: { V4: [ip] } };
  if (o.ext) IPs.ExternalIPs = { V4: o.ext };
  return JSON.stringify({
    Service: {
      Namespace: ns,
      Name: name,
      Type: 'ClusterIP',
      IPs,
      Ports: o.ports ?? [{ Protocol: 1, Port: 80, TargetPort: 8080 }],
      SessionAffinity: o.affinity === undefined ? null : { ClientIP: { TimeoutSeconds: o.affinity } },
    },
    Endpoints: o.eps === null ? null : (o.eps ?? ['198.51.100.1']).map((e) => ({ IPs: { V4: [e] }, Scopes: { Internal: true, External: true } })),
  });
}
export const prev = (line: string): string => `{"Previous":${line}}`;
export const lines = (...l: string[]): string => l.map((x) => x + '\n').join('');

/** Runs callout `cmd` on `input` (env added), in network namespace `ns` when given. */
export function run(cmd: string, input: string, env: NodeJS.ProcessEnv = {}, ns?: string): Promise<CommandResult> {
  const [c, args] = ns ? ['ip', ['netns', 'exec', ns, cmd]] : [cmd, []];
  return runCommand(c as string, args as string[], { input, env: { ...process.env, ...env }, timeoutMs: 60_000 });
}
