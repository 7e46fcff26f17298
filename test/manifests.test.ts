/**
 * manifests/ and the Dockerfile: every manifest parses; the ClusterRole grants
 * exactly what the kube source uses; the DaemonSet passes NODE_NAME from the
 * downward API, points CALLOUT at an executable file the image contains, and
 * splits metrics (loopback) from health (every interface, probed).
 */
import { accessSync, constants, existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { posix } from 'node:path';
import t from 'tap';
import { parseAllDocuments } from 'yaml';
import { convertObjects } from '../src/convert/kubernetes.js';
import { parseHostPort } from '../src/options.js';
import { stateText } from '../src/state.js';
import { repoPath } from './helpers/fixtures.js';

type Obj = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string; labels?: Record<string, string> }; [k: string]: any };

const files = readdirSync(repoPath('manifests')).filter((f) => /\.ya?ml$/.test(f));
const objects: Array<Obj & { file: string }> = [];
for (const f of files) {
  const docs = parseAllDocuments(readFileSync(repoPath('manifests', f), 'utf8'));
  for (const d of docs) {
    if (d.errors.length > 0) throw new Error(`${f}: ${d.errors[0]!.message}`);
    const o = d.toJS() as Obj | null;
    if (o) objects.push({ ...o, file: f });
  }
}
const find = (kind: string): Array<Obj & { file: string }> => objects.filter((o) => o.kind === kind);

t.test('every manifest parses into objects with apiVersion, kind and name', async (t) => {
  t.ok(files.length >= 3, files.join(', '));
  for (const o of objects) {
    t.ok(o.apiVersion && o.kind && o.metadata?.name, `${o.file}: ${o.kind} ${o.metadata?.name}`);
  }
});

t.test('the ClusterRole grants exactly get/list/watch on services, endpointslices and nodes', async (t) => {
  const roles = find('ClusterRole');
  t.equal(roles.length, 1);
  const grants = new Set<string>();
  for (const rule of roles[0]!.rules as Array<{ apiGroups: string[]; resources: string[]; verbs: string[]; resourceNames?: string[]; nonResourceURLs?: string[] }>) {
    t.notOk(rule.resourceNames ?? rule.nonResourceURLs, 'no other kind of rule');
    for (const g of rule.apiGroups) for (const r of rule.resources) for (const v of rule.verbs) grants.add(`${g}/${r}:${v}`);
  }
  const expected = ['/services', 'discovery.k8s.io/endpointslices', '/nodes'].flatMap((r) => ['get', 'list', 'watch'].map((v) => `${r}:${v}`));
  t.same([...grants].sort(), expected.sort());
  t.equal(find('Role').length, 0, 'no namespaced Role');

  // Bound to the DaemonSet's ServiceAccount.
  const ds = find('DaemonSet').find((d) => d.metadata.name === 'kpng-callout')!;
  const sa = { name: ds.spec.template.spec.serviceAccountName, namespace: ds.metadata.namespace };
  t.ok(find('ServiceAccount').some((s) => s.metadata.name === sa.name && s.metadata.namespace === sa.namespace), 'the ServiceAccount exists');
  const binding = find('ClusterRoleBinding')[0]!;
  t.same(binding.roleRef, { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: roles[0]!.metadata.name });
  t.same(binding.subjects, [{ kind: 'ServiceAccount', ...sa }]);
});

/** Where each repository path lands in the image, from the Dockerfile's WORKDIR and COPY lines. */
function imageCopies(): Array<{ src: string; dest: string }> {
  const lines = readFileSync(repoPath('Dockerfile'), 'utf8').replace(/\\\n/g, ' ').split('\n');
  let workdir = '/';
  const copies: Array<{ src: string; dest: string }> = [];
  for (const line of lines) {
    const [cmd, ...args] = line.trim().split(/\s+/);
    if (cmd === 'FROM') copies.length = 0;
    if (cmd === 'WORKDIR') workdir = posix.resolve(workdir, args[0]!);
    if (cmd === 'COPY' && !args.some((a) => a.startsWith('--from'))) {
      const dest = posix.resolve(workdir, args[args.length - 1]!);
      for (const src of args.slice(0, -1).filter((a) => !a.startsWith('--'))) copies.push({ src: posix.normalize(src), dest });
    }
  }
  return copies;
}

/** The repository file that becomes `imagePath`, if a COPY puts one there. */
function repoFileFor(imagePath: string): string | undefined {
  for (const { src, dest } of imageCopies()) {
    const isDir = existsSync(repoPath(src)) && statSync(repoPath(src)).isDirectory();
    const base = isDir ? dest : posix.join(dest, posix.basename(src));
    if (isDir && imagePath.startsWith(dest + '/')) {
      const rel = posix.join(src, imagePath.slice(dest.length + 1));
      if (existsSync(repoPath(rel))) return rel;
    } else if (!isDir && imagePath === base) return src;
  }
  return undefined;
}

t.test('the DaemonSet: host network, capabilities, NODE_NAME from the downward API, CALLOUT in the image', async (t) => {
  const ds = find('DaemonSet').find((d) => d.metadata.name === 'kpng-callout')!;
  t.ok(ds, 'kpng-callout DaemonSet');
  const pod = ds.spec.template.spec;
  t.equal(pod.hostNetwork, true);
  const c = pod.containers[0];
  t.equal(c.args[0], 'kube', 'runs the kube source');
  const env = Object.fromEntries((c.env as Array<{ name: string; value?: string }>).map((e) => [e.name, e]));
  t.same(env.NODE_NAME, { name: 'NODE_NAME', valueFrom: { fieldRef: { fieldPath: 'spec.nodeName' } } });
  t.not(c.securityContext.privileged, true, 'not privileged');
  t.same([...c.securityContext.capabilities.add].sort(), ['NET_ADMIN', 'NET_RAW']);

  const callout = env.CALLOUT?.value as string;
  t.match(callout, /^\//, 'CALLOUT is an absolute path');
  const rel = repoFileFor(callout);
  t.ok(rel, `the Dockerfile copies a file to ${callout}`);
  if (!rel) return;
  t.equal(rel, 'callouts/kpng-example-allip', 'the bundled all-IP callout');
  accessSync(repoPath(rel), constants.X_OK);
  const ignored = existsSync(repoPath('.dockerignore')) ? readFileSync(repoPath('.dockerignore'), 'utf8').split('\n').map((l) => l.trim()).filter(Boolean) : [];
  t.notOk(ignored.some((p) => rel === p || rel.startsWith(p.replace(/\/$/, '') + '/')), '.dockerignore keeps it');

  // The image runs the tool, with what the callouts need installed.
  const dockerfile = readFileSync(repoPath('Dockerfile'), 'utf8');
  t.match(dockerfile, /^FROM node:20[\w.-]*slim/m);
  for (const pkg of ['iptables', 'nftables', 'jq']) t.match(dockerfile, new RegExp(`apt-get install[^\\n]*\\b${pkg}\\b`), pkg);
  t.match(dockerfile, /npm ci/);
  t.match(dockerfile, /npm run build/);
  t.match(dockerfile, /npm prune --omit=dev/);
  t.match(dockerfile, /ENTRYPOINT \["\/usr\/bin\/tini", "--", "kpng-callout"\]/);
  for (const p of ['bin', 'src', 'proto', 'callouts']) t.ok(imageCopies().some((cp) => cp.src === p), `copies ${p}/`);
});

t.test('the DaemonSet: metrics on loopback, health on every interface, the readiness probe on the health port', async (t) => {
  const ds = find('DaemonSet').find((d) => d.metadata.name === 'kpng-callout')!;
  const c = ds.spec.template.spec.containers[0];
  const args = c.args as string[];
  const arg = (flag: string): { text: string; port: number } => {
    const i = args.indexOf(flag);
    t.ok(i > 0 && i + 1 < args.length, `passes ${flag}`);
    const a = parseHostPort(flag, args[i + 1]!, { allowPortZero: false, allowEmptyHost: true });
    if (!('port' in a)) throw new Error(`${flag} ${a.text}: expected HOST:PORT, not a Unix socket`);
    return a;
  };
  const metrics = arg('--metrics-addr');
  const health = arg('--health-addr');
  // With hostNetwork, 0.0.0.0 would publish the metrics on the node's addresses.
  t.match(metrics.text, /^(127\.0\.0\.1|\[::1\]):\d+$/, 'metrics on loopback only');
  // The kubelet probes the pod IP, which with hostNetwork is the node IP: loopback would not do.
  t.match(health.text, /^(|0\.0\.0\.0|\[::\]):\d+$/, 'health on every interface');
  t.not(metrics.port, health.port, 'two ports');

  const ports = new Map((c.ports as Array<{ name: string; containerPort: number }>).map((p) => [p.name, p.containerPort]));
  t.equal(ports.get('metrics'), metrics.port, 'the metrics port is declared');
  t.equal(ports.get('health'), health.port, 'the health port is declared');

  const probe = c.readinessProbe?.httpGet as { path: string; port: number | string; host?: string } | undefined;
  t.ok(probe, 'a readinessProbe');
  t.equal(probe?.path, '/readyz');
  t.equal(typeof probe?.port === 'string' ? ports.get(probe.port) : probe?.port, health.port, 'probes the health port');
  t.notOk(probe?.host, 'at the pod (node) IP, no host override');
  // No probe of any kind points at the loopback-only metrics port.
  for (const kind of ['livenessProbe', 'readinessProbe', 'startupProbe']) {
    const p = c[kind]?.httpGet as { port: number | string } | undefined;
    if (p) t.not(typeof p.port === 'string' ? ports.get(p.port) : p.port, metrics.port, `${kind} not on the metrics port`);
  }
});

t.test('the example Service: documentation-range addresses, handed to the DaemonSet proxy name', async (t) => {
  const svc = find('Service').find((s) => s.metadata.name === 'kpng-example')!;
  const ds = find('DaemonSet').find((d) => d.metadata.name === 'kpng-callout')!;
  const args = ds.spec.template.spec.containers[0].args as string[];
  const proxyName = args[args.indexOf('--service-proxy-name') + 1];
  t.equal(svc.metadata.labels?.['service.kubernetes.io/service-proxy-name'], proxyName);
  const doc = /^(192\.0\.2\.|198\.51\.100\.|203\.0\.113\.|2001:db8:)/i;
  for (const ip of svc.spec.externalIPs as string[]) t.match(ip, doc, `${ip} is a documentation address`);
  // It converts as the blog's example does: headless, both external IPs.
  const line = JSON.parse(stateText(convertObjects([svc], { nodeName: 'n', serviceProxyName: proxyName }))) as { Service: { IPs: unknown } };
  t.same(line.Service.IPs, { ClusterIPs: {}, ExternalIPs: { V4: ['192.0.2.55'], V6: ['2001:db8::55'] }, Headless: true });
});
