/**
 * Conversion tests' common ground: manifests (YAML) through
 * `convertObjects` to kpng-json text, the expected lines written as objects,
 * and the Service most endpoint cases hang their slices on.
 */
import { parseAllDocuments } from 'yaml';
import { convertObjects, type ConvertOptions } from '../../src/convert/kubernetes.js';
import { stateText } from '../../src/state.js';

/** The documents of a YAML text, as plain objects. */
export const docs = (yaml: string): unknown[] => parseAllDocuments(yaml).map((d) => d.toJS() as unknown);

/** The state of `yaml` seen from node-a (or as `opts` say), as kpng-json prints it; skip messages go to `skipped` as `index: message`. */
export function convert(yaml: string, opts: Partial<ConvertOptions> = {}, skipped: string[] = []): string {
  return stateText(convertObjects(docs(yaml), { nodeName: 'node-a', onSkip: (i, m) => skipped.push(`${i}: ${m}`), ...opts }));
}

/** One line per Service, as kpng-json prints them. */
export const nd = (...lines: unknown[]): string => lines.map((l) => JSON.stringify(l) + '\n').join('');

/** The first fields of a converted Service `default/<name>` of type ClusterIP. */
export const svcHead = (name: string, extra: Record<string, unknown> = {}) => ({ Namespace: 'default', Name: name, Type: 'ClusterIP', ...extra });

/** The Service `default/web` (10.96.5.5, port http 80 -> http), `extra` lines added to its spec. */
export const svcYaml = (extra = '') => `
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIPs: [10.96.5.5]
  ports: [{name: http, port: 80, targetPort: http}]
${extra ? extra + '\n' : ''}`;

/** `svcYaml()` converted, `extra` fields added. */
export const webSvc = (extra: Record<string, unknown> = {}) => ({
  ...svcHead('web'),
  IPs: { ClusterIPs: { V4: ['10.96.5.5'] }, ExternalIPs: {} },
  Ports: [{ Name: 'http', Protocol: 1, Port: 80, TargetPortName: 'http' }],
  SessionAffinity: null,
  ...extra,
});
