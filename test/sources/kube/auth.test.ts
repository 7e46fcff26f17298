/**
 * TLS and credentials of each request (src/sources/kube/auth.ts), from real
 * kubeconfig files, against the list/watch server on loopback (over TLS with
 * client certificates where it matters): certificate files and inline data,
 * insecure-skip-tls-verify, exec plugins (a real script) and their refresh,
 * the in-cluster token file, basic auth and impersonation, and the full
 * client library for what is not handled here (auth-provider gcp, proxies).
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { credentialsFor } from '../../../src/sources/kube/auth.js';
import { loadKubeConfig } from '../../../src/sources/kube/config.js';
import { ApiClient, type ApiError } from '../../../src/sources/kube/http.js';
import { makeCerts, opensslMissing, type TestCerts } from '../../helpers/certs.js';
import { shScript, tempDir } from '../../helpers/files.js';
import { KubeApiServer, listBytes } from '../../helpers/kube-api-server.js';
import { service } from '../../helpers/kube-objects.js';

const dir = tempDir(t, 'kube-auth-');
let files = 0;
const list = { signal: new AbortController().signal, stream: false };

/** A kubeconfig file in its own directory (relative paths resolve there): `cluster` and `user` are YAML flow mappings. */
function kubeconfig(cluster: string, user: string, extra: Record<string, string | Buffer> = {}): string {
  const d = join(dir, `k${++files}`);
  mkdirSync(d);
  for (const [name, content] of Object.entries(extra)) writeFileSync(join(d, name), content);
  const f = join(d, 'config');
  writeFileSync(f, `clusters: [{name: c, cluster: ${cluster}}]\nusers: [{name: u, user: ${user}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n`);
  return f;
}

const credentialsOf = (file: string) => credentialsFor(loadKubeConfig({ kubeconfig: file, env: {} }).kubeConfig);

/** Lists services from `srv` through `file`: the names listed, or the error. */
async function listThrough(t: Test, srv: KubeApiServer, file: string): Promise<string[] | Error> {
  const client = new ApiClient({ server: srv.url, credentials: credentialsOf(file) });
  t.teardown(() => client.close());
  try {
    const page = JSON.parse((await listBytes(client, '/api/v1/services', {}, list)).toString()) as { items: Array<{ metadata: { name: string } }> };
    return page.items.map((i) => i.metadata.name);
  } catch (err) {
    return err as Error;
  }
}

const b64 = (b: Buffer): string => b.toString('base64');
const noOpenssl = opensslMissing();
if (noOpenssl) t.comment(`skipping the TLS tests: ${noOpenssl}`);

t.test('TLS: CA and client certificate from files (relative to the kubeconfig) or inline data; a wrong CA fails unless verification is skipped', { skip: noOpenssl ?? false }, async (t) => {
  const certs: TestCerts = makeCerts(t);
  const srv = new KubeApiServer({ tls: { key: certs.serverKey, cert: certs.serverCert, ca: certs.ca } });
  srv.add('services', service('web'));
  await srv.listen();
  t.teardown(() => srv.close());
  const server = `server: "${srv.url}"`;
  const clientFiles = { 'client.crt': certs.clientCert, 'client.key': certs.clientKey };
  const asFiles = kubeconfig(`{${server}, certificate-authority: ca.crt}`, '{client-certificate: client.crt, client-key: client.key}', { 'ca.crt': certs.ca, ...clientFiles });
  t.same(await listThrough(t, srv, asFiles), ['web'], 'files');
  t.equal((await credentialsOf(asFiles)).via, 'built-in');
  const inline = kubeconfig(`{${server}, certificate-authority-data: ${b64(certs.ca)}}`, `{client-certificate-data: ${b64(certs.clientCert)}, client-key-data: ${b64(certs.clientKey)}}`);
  t.same(await listThrough(t, srv, inline), ['web'], 'inline data');

  const wrongCa = kubeconfig(`{${server}, certificate-authority-data: ${b64(certs.otherCa)}}`, `{client-certificate-data: ${b64(certs.clientCert)}, client-key-data: ${b64(certs.clientKey)}}`);
  t.match(await listThrough(t, srv, wrongCa), { code: /CERT|SIGNATURE|SELF_SIGNED|UNABLE/ }, 'the server is not trusted');
  const skip = kubeconfig(`{${server}, insecure-skip-tls-verify: true}`, `{client-certificate-data: ${b64(certs.clientCert)}, client-key-data: ${b64(certs.clientKey)}}`);
  t.same(await listThrough(t, srv, skip), ['web'], 'insecure-skip-tls-verify');
  const noClientCert = kubeconfig(`{${server}, certificate-authority-data: ${b64(certs.ca)}}`, '{}');
  t.type(await listThrough(t, srv, noClientCert), Error, 'the server requires a client certificate');
});

t.test('an exec plugin: its token used and cached until it expires; run again after a 401; its client certificate used', { skip: noOpenssl ?? false }, async (t) => {
  const certs: TestCerts = makeCerts(t);
  const srv = new KubeApiServer({ token: 'exec-1', tls: { key: certs.serverKey, cert: certs.serverCert, ca: certs.ca } });
  srv.add('services', service('web'));
  await srv.listen();
  t.teardown(() => srv.close());
  const d = tempDir(t, 'kube-exec-');
  writeFileSync(join(d, 'token'), 'exec-1');
  const pem = (b: Buffer): string => JSON.stringify(b.toString());
  // Prints an ExecCredential with the token of the file next to it and a client certificate; counts its runs.
  const plugin = shScript(
    d,
    'plugin',
    `echo run >> "${join(d, 'runs')}"\n` +
      `printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s","expirationTimestamp":"2999-01-01T00:00:00Z","clientCertificateData":%s,"clientKeyData":%s}}' "$(cat "${join(d, 'token')}")" '${pem(certs.clientCert)}' '${pem(certs.clientKey)}'\n`,
  );
  const file = kubeconfig(
    `{server: "${srv.url}", certificate-authority-data: ${b64(certs.ca)}}`,
    `{exec: {apiVersion: client.authentication.k8s.io/v1, command: "${plugin}", args: [], interactiveMode: Never}}`,
  );
  const runs = (): number => readFileSync(join(d, 'runs'), 'utf8').split('\n').filter(Boolean).length;
  const client = new ApiClient({ server: srv.url, credentials: credentialsOf(file) });
  t.teardown(() => client.close());
  await listBytes(client, '/api/v1/services', {}, list);
  await listBytes(client, '/api/v1/services', {}, list);
  t.equal(runs(), 1, 'cached until its expirationTimestamp');
  writeFileSync(join(d, 'token'), 'exec-2');
  srv.setToken('exec-2');
  await listBytes(client, '/api/v1/services', {}, list);
  t.equal(runs(), 2, 'run again after the 401');
  t.same(
    srv.requests.map((r) => r.status),
    [200, 200, 401, 200],
  );
});

t.test('the in-cluster service account: its token file and CA', async (t) => {
  const sa = tempDir(t, 'kube-sa-');
  writeFileSync(join(sa, 'token'), 'sa-token');
  writeFileSync(join(sa, 'ca.crt'), 'not really a certificate');
  const { kubeConfig } = loadKubeConfig({ env: { KUBERNETES_SERVICE_HOST: '10.96.0.1', KUBERNETES_SERVICE_PORT: '443' }, serviceAccountDir: sa });
  const c = await credentialsFor(kubeConfig);
  t.equal(c.via, 'built-in');
  const r = await c.forRequest();
  t.same(r.headers, { Authorization: 'Bearer sa-token' });
  t.equal(r.tls.ca?.toString(), 'not really a certificate');
  t.equal(c.refresh(), true, 'a 401 re-reads the token file');
});

t.test('static token, basic auth, impersonation; plain HTTP as kubectl takes it (kubectl proxy)', async (t) => {
  const token = await (await credentialsOf(kubeconfig('{server: "https://192.0.2.1:6443"}', '{token: abc, as: jane}'))).forRequest();
  t.same(token.headers, { Authorization: 'Bearer abc', 'Impersonate-User': 'jane' });
  const basicCreds = await credentialsOf(kubeconfig('{server: "https://192.0.2.1:6443", tls-server-name: api.example}', '{username: u, password: p}'));
  const basic = await basicCreds.forRequest();
  t.same(basic.headers, { Authorization: `Basic ${b64(Buffer.from('u:p'))}` });
  t.equal(basic.tls.servername, 'api.example');
  t.equal(basicCreds.refresh(), false, 'nothing to refresh');
  const plain = await credentialsOf(kubeconfig('{server: "http://192.0.2.1:8080"}', '{}'));
  const p = await plain.forRequest();
  t.same(p.headers, {}, 'no credentials');
  t.equal(p.tls.rejectUnauthorized, undefined);
});

t.test('an auth-provider (gcp) or a proxy: through the full client library', async (t) => {
  const srv = new KubeApiServer({ token: 'gcp-token' });
  srv.add('services', service('web'));
  await srv.listen();
  t.teardown(() => srv.close());
  const gcp = kubeconfig(
    `{server: "${srv.url}", insecure-skip-tls-verify: true}`,
    `{auth-provider: {name: gcp, config: {access-token: gcp-token, expiry: "2999-01-01T00:00:00Z"}}}`,
  );
  t.equal((await credentialsOf(gcp)).via, 'client library');
  t.same(await listThrough(t, srv, gcp), ['web']);
  const proxied = kubeconfig('{server: "https://192.0.2.1:6443", proxy-url: "http://127.0.0.1:3128"}', '{token: abc}');
  t.equal((await credentialsOf(proxied)).via, 'client library');
});

t.test('a 401 from a rejected static token is the error (nothing to refresh)', async (t) => {
  const srv = new KubeApiServer({ token: 'right' });
  await srv.listen();
  t.teardown(() => srv.close());
  const wrong = kubeconfig(`{server: "${srv.url}", insecure-skip-tls-verify: true}`, '{token: wrong}');
  t.equal(((await listThrough(t, srv, wrong)) as ApiError).statusCode, 401);
  t.equal(srv.requests.length, 1, 'no retry');
});
