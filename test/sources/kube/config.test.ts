/**
 * Where the kube source finds its API configuration (src/sources/kube/config.ts).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { CalloutError } from '../../../src/errors.js';
import { loadKubeConfig } from '../../../src/sources/kube/config.js';
import { tempDir } from '../../helpers/files.js';
import { kubeconfigText } from '../../helpers/kube-api-server.js';

const dir = tempDir(t, 'kube-config-');
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
});

t.test('an empty or incomplete kubeconfig: the file, what is missing and the fix (input error, exit 1)', async (t) => {
  const err = (lookup: Parameters<typeof loadKubeConfig>[0]): CalloutError => {
    try {
      loadKubeConfig(lookup);
    } catch (e) {
      t.type(e, CalloutError);
      return e as CalloutError;
    }
    throw new Error('no error');
  };
  const file = (name: string, text: string): string => {
    const f = join(dir, name);
    writeFileSync(f, text);
    return f;
  };
  const complete = /; pass a complete kubeconfig: a cluster \(server\), a user, and a context naming both, selected by current-context/;
  const cases: Array<[string, string, RegExp]> = [
    // The library throws "Cannot read properties of undefined (reading 'clusters')" on these.
    ['empty', '', /^--kubeconfig \S+\/empty: empty file: no current context and no clusters; pass a complete kubeconfig/],
    ['blank', '\n  \n# only a comment\n---\n', /^--kubeconfig \S+\/blank: empty file: no current context and no clusters/],
    ['null', '~\n', /^--kubeconfig \S+\/null: not a valid kubeconfig \(the YAML document is empty or null, not a mapping\)/],
    ['braces', '{}\n', /^--kubeconfig \S+\/braces: no current context and no clusters; pass a complete kubeconfig/],
    ['nocontext', 'apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n', /^--kubeconfig \S+\/nocontext: no current context and no clusters/],
    [
      'clusteronly',
      'clusters:\n- name: prod\n  cluster:\n    server: https://192.0.2.1:6443\n',
      /^--kubeconfig \S+\/clusteronly: no current context and no contexts \(clusters: "prod"\); add a context naming a cluster and a user, and set current-context$/,
    ],
    [
      'unselected',
      'clusters:\n- name: prod\n  cluster:\n    server: https://192.0.2.1:6443\ncontexts:\n- name: admin@prod\n  context:\n    cluster: prod\n    user: admin\n',
      /^--kubeconfig (\S+)\/unselected: no current context \(contexts: "admin@prod"\); set current-context, e.g. `kubectl --kubeconfig \1\/unselected config use-context admin@prod`$/,
    ],
    ['undefined-context', 'current-context: gone\ncontexts: []\n', /^--kubeconfig \S+: current context "gone" is not defined \(contexts: none\); set current-context to a defined context, or pass a complete kubeconfig/],
    [
      'undefined-cluster',
      'current-context: c\ncontexts:\n- name: c\n  context:\n    cluster: missing\n    user: u\n',
      /^--kubeconfig \S+: context "c" names cluster "missing", which is not defined \(clusters: none\); pass a complete kubeconfig/,
    ],
    ['noserver', 'clusters:\n- name: c\n  cluster: {}\n', /^--kubeconfig \S+: not a valid kubeconfig \(clusters\[0\]\.cluster\.server is missing\); pass a complete kubeconfig/],
  ];
  for (const [name, text, re] of cases) {
    const e = err({ kubeconfig: file(name, text), env: {} });
    t.equal(e.code, 'input', name);
    t.match(e.message, re, name);
    t.notMatch(e.message, /Cannot read properties/, name);
  }
  t.match(err({ kubeconfig: join(dir, 'braces'), env: {} }).message, complete);

  // $KUBECONFIG: empty files are skipped (as kubectl); only empty ones is an error naming them.
  const empty = join(dir, 'empty');
  t.equal(loadKubeConfig({ env: { KUBECONFIG: `${empty}:${envA}` } }).kubeConfig.getCurrentCluster()?.server, 'http://env-a.example:1');
  const both = err({ env: { KUBECONFIG: `${empty}:${join(dir, 'blank')}` } });
  t.equal(both.code, 'input');
  t.match(both.message, /^\$KUBECONFIG \S+\/empty:\S+\/blank: empty files: no current context and no clusters; pass a complete kubeconfig/);
  // ~/.kube/config, empty.
  const home2 = join(dir, 'home2');
  mkdirSync(join(home2, '.kube'), { recursive: true });
  writeFileSync(join(home2, '.kube', 'config'), '');
  t.match(err({ env: { HOME: home2 } }).message, /^\S+\/home2\/\.kube\/config: empty file: no current context and no clusters/);
});

t.test('entries as the client library reads them; relative paths resolved against the kubeconfig', async (t) => {
  const d = join(dir, 'paths');
  mkdirSync(d);
  writeFileSync(join(d, 'token'), 'from-file\n');
  const f = join(d, 'config');
  writeFileSync(
    f,
    [
      'defaults: &cluster {certificate-authority: ca.crt, tls-server-name: api.example}',
      'clusters:',
      '- name: c',
      '  cluster:',
      '    <<: *cluster',
      '    server: https://192.0.2.1:6443/',
      'users:',
      '- name: u',
      '  user: {client-certificate: certs/c.crt, client-key: /abs/c.key, token-file: token}',
      '- name: e',
      '  user: {exec: {command: my-plugin, args: [get-token], apiVersion: client.authentication.k8s.io/v1}}',
      'contexts:',
      '- name: x',
      '  context: {cluster: c, user: u, namespace: ns}',
      'current-context: x',
      '',
    ].join('\n'),
  );
  const { kubeConfig } = loadKubeConfig({ kubeconfig: f, env: {} });
  t.match(kubeConfig.getCurrentCluster(), { name: 'c', server: 'https://192.0.2.1:6443', caFile: join(d, 'ca.crt'), tlsServerName: 'api.example', skipTLSVerify: false }, 'merge keys; the trailing slash dropped');
  const u = kubeConfig.getCurrentUser();
  t.match(u, { name: 'u', certFile: join(d, 'certs/c.crt'), keyFile: '/abs/c.key', tokenFile: join(d, 'token') });
  t.equal(u?.token, undefined, 'a token file is read when used (it rotates), not at load');
  t.match(kubeConfig.getUser('e')?.exec, { command: 'my-plugin', args: ['get-token'] });
  t.same(kubeConfig.getContextObject('x'), { name: 'x', cluster: 'c', user: 'u', namespace: 'ns' });
  // A token file that does not exist is an error at once, as with the library.
  writeFileSync(f, 'clusters: [{name: c, cluster: {server: "https://192.0.2.1"}}]\nusers: [{name: u, user: {token-file: missing}}]\n');
  t.throws(() => loadKubeConfig({ kubeconfig: f, env: {} }), { code: 'input', message: /not a valid kubeconfig \(ENOENT: no such file or directory/ });
});

t.test('$KUBECONFIG: the first file naming a cluster, user, context or current context wins', async (t) => {
  const a = join(dir, 'merge-a');
  const b = join(dir, 'merge-b');
  writeFileSync(a, 'clusters: [{name: c, cluster: {server: "https://a.example"}}]\nusers: [{name: u, user: {token: a}}]\n');
  writeFileSync(b, 'clusters: [{name: c, cluster: {server: "https://b.example"}}, {name: d, cluster: {server: "https://d.example"}}]\nusers: [{name: u, user: {token: b}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n');
  const { kubeConfig } = loadKubeConfig({ env: { KUBECONFIG: `${a}:${b}` } });
  t.equal(kubeConfig.getCurrentCluster()?.server, 'https://a.example');
  t.equal(kubeConfig.getCurrentUser()?.token, 'a');
  t.same(kubeConfig.getClusters().map((c) => c.name), ['c', 'd']);
});
