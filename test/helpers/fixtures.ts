/**
 * Where the repository is, and the fixture data tests share: the blog post's
 * example (fixtures/kpng-example.*), the golden cases (fixtures/compat) and
 * the smallest state line.
 */
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Revision } from './kpng-server.js';

/** The repository's root directory. */
export const repoRoot = fileURLToPath(new URL('../..', import.meta.url));

/** A path inside the repository. */
export const repoPath = (...parts: string[]): string => join(repoRoot, ...parts);

/** The blog's example as Kubernetes YAML (its Service and two EndpointSlices). */
export const blogYamlPath = repoPath('fixtures', 'kpng-example.yaml');
export const blogYaml = readFileSync(blogYamlPath, 'utf8');

/** Where the blog's state is seen from: its node (which hosts the local pods) and its service-proxy-name. */
export const blogView = { nodeName: 'vm-002', serviceProxyName: 'kpng-example' };

/** The blog's example state (seen as `blogView` says), as today's kpng prints it: one line. */
export const blogJsonlPath = repoPath('fixtures', 'kpng-example.jsonl');
export const blogJsonl = readFileSync(blogJsonlPath, 'utf8');

/** The state line of one ClusterIP Service `default/<name>` with no endpoints, as kpng prints it. */
export const stateLine = (name: string): string =>
  `{"Service":{"Namespace":"default","Name":"${name}","Type":"ClusterIP","SessionAffinity":null},"Endpoints":null}\n`;

const compatDir = repoPath('fixtures', 'compat');

/** The names of the golden cases in fixtures/compat, sorted. */
export function compatCases(): string[] {
  return readdirSync(compatDir)
    .filter((f) => f.endsWith('.ops.json'))
    .map((f) => f.slice(0, -'.ops.json'.length))
    .sort();
}

/** A golden case: the revisions a kpng server sends, and the bytes kpng-json prints for them. */
export function compatCase(name: string): { revisions: Revision[]; expected: Buffer } {
  const ops = JSON.parse(readFileSync(join(compatDir, `${name}.ops.json`), 'utf8')) as { revisions: Revision[] };
  return { revisions: ops.revisions, expected: readFileSync(join(compatDir, `${name}.expected.jsonl`)) };
}

/** Writes `dir/big-N.jsonl`: the blog Service `n` times under names svc-00000... (about 700 bytes each); its path. */
export function bigBlogFixture(dir: string, n: number): string {
  const p = join(dir, `big-${n}.jsonl`);
  let s = '';
  for (let i = 0; i < n; i++) s += blogJsonl.replaceAll('kpng-example', `svc-${String(i).padStart(5, '0')}`);
  writeFileSync(p, s);
  return p;
}
