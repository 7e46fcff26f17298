/**
 * Where the kube source finds its API configuration, and its option checks.
 */
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { CalloutError } from '../../src/errors.js';
import { loadKubeConfig, parseServiceProxyName, serviceLabelSelector } from '../../src/sources/kube.js';
import { kubeconfigText } from '../helpers/kube-api-server.js';

const dir = mkdtempSync(join(tmpdir(), 'kube-config-'));
const write = (name: string, url: string): string => {
  const f = join(dir, name);
  writeFileSync(f, kubeconfigText(url));
  return f;
};
const flag = write('flag', 'http://flag.example:1');
const envA = write('env-a', 'http://env-a.example:1');
const home = join(dir, 'home');
mkdirSync(join(home, '.kube'), { recursive: true });
writeFileSync(join(home, '.kube', 'config'), kubeconfigText('http://home.example:1'));
const sa = join(dir, 'sa');
mkdirSync(sa);
writeFileSync(join(sa, 'token'), 'tok');
const inCluster = { KUBERNETES_SERVICE_HOST: 'fd00::1', KUBERNETES_SERVICE_PORT: '6443' };

const server = (lookup: Parameters<typeof loadKubeConfig>[0]): [string | undefined, string] => {
  const c = loadKubeConfig({ serviceAccountDir: sa, ...lookup });
  return [c.kubeConfig.getCurrentCluster()?.server, c.from];
};

t.test('lookup order: --kubeconfig, $KUBECONFIG, in-cluster, ~/.kube/config', async (t) => {
  const all = { KUBECONFIG: envA, HOME: home, ...inCluster };
  t.equal(server({ kubeconfig: flag, env: all })[0], 'http://flag.example:1');
  t.equal(server({ env: all })[0], 'http://env-a.example:1');
  // A $KUBECONFIG list: missing files skipped, the first file's context wins.
  t.same(server({ env: { KUBECONFIG: `${join(dir, 'missing')}:${envA}:${flag}` } }), ['http://env-a.example:1', `$KUBECONFIG ${envA}:${flag}`]);
  const [url, from] = server({ env: { HOME: home, ...inCluster } });
  t.equal(url, 'https://[fd00::1]:6443');
  t.equal(from, 'in-cluster service account');
  t.equal(server({ env: { HOME: home } })[0], 'http://home.example:1');
});

t.test('clear errors when nothing is found', async (t) => {
  const err = (fn: () => unknown): CalloutError => {
    try {
      fn();
    } catch (e) {
      return e as CalloutError;
    }
    throw new Error('no error');
  };
  const none = err(() => loadKubeConfig({ env: { HOME: join(dir, 'nohome') } }));
  t.equal(none.code, 'source');
  t.match(none.message, /no Kubernetes API configuration: .* and no .*nohome\/\.kube\/config/);
  t.match(err(() => loadKubeConfig({ kubeconfig: join(dir, 'nope'), env: {} })).message, /--kubeconfig .*nope: cannot read file \(ENOENT\)/);
  writeFileSync(join(dir, 'bad'), 'clusters: [');
  t.match(err(() => loadKubeConfig({ kubeconfig: join(dir, 'bad'), env: {} })).message, /--kubeconfig .*bad: not a valid kubeconfig/);
  const noToken = err(() => loadKubeConfig({ env: inCluster, serviceAccountDir: join(dir, 'nosa') }));
  t.match(noToken.message, /in-cluster configuration: no service account token at .*nosa\/token/);
  writeFileSync(join(dir, 'nocontext'), 'apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n');
  t.match(err(() => loadKubeConfig({ kubeconfig: join(dir, 'nocontext'), env: {} })).message, /no current context with a cluster/);
});

t.test('--service-proxy-name must be a label value; the selector kpng used', async (t) => {
  t.equal(parseServiceProxyName('--service-proxy-name', 'kpng-example'), 'kpng-example');
  for (const bad of ['', '-x', 'x-', 'a b', 'a/b', 'x'.repeat(64)]) t.throws(() => parseServiceProxyName('--service-proxy-name', bad), { code: 'usage' }, JSON.stringify(bad));
  t.equal(serviceLabelSelector('kpng-example'), 'service.kubernetes.io/service-proxy-name=kpng-example,!service.kubernetes.io/headless');
  t.equal(serviceLabelSelector(), '!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless');
});
