/**
 * Requests to the API server (src/sources/kube/http.ts) against the
 * list/watch server on loopback: connections kept alive, compressed lists,
 * HTTP errors with the server's Status, a rotated token refreshed once after
 * a 401, silence before an answer; and NDJSON lines read from real streams.
 */
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { PassThrough } from 'node:stream';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import type { Credentials } from '../../../src/sources/kube/auth.js';
import { credentialsFor } from '../../../src/sources/kube/auth.js';
import { loadKubeConfig } from '../../../src/sources/kube/config.js';
import { NO_ANSWER } from '../../../src/sources/kube/failures.js';
import { ApiClient, ApiError, readLines } from '../../../src/sources/kube/http.js';
import { tempDir } from '../../helpers/files.js';
import { KubeApiServer, listBytes } from '../../helpers/kube-api-server.js';
import { service } from '../../helpers/kube-objects.js';
import { within } from '../../helpers/wait.js';

const signal = new AbortController().signal;
const list = { signal, stream: false };

/** A client of `srv` (listening) through the kubeconfig `kubeconfig` (default: the server's, no credentials). */
async function clientOf(t: Test, srv: KubeApiServer, kubeconfig?: string): Promise<ApiClient> {
  const { kubeConfig } = loadKubeConfig({ kubeconfig: kubeconfig ?? srv.writeKubeconfig(), env: {} });
  const client = new ApiClient({ server: srv.url, credentials: credentialsFor(kubeConfig) });
  t.teardown(() => client.close());
  return client;
}

async function served(t: Test, srv = new KubeApiServer()): Promise<KubeApiServer> {
  await srv.listen();
  t.teardown(() => srv.close());
  return srv;
}

t.test('a list page as text; requests share one kept-alive connection', async (t) => {
  const srv = await served(t);
  srv.add('services', service('web'), service('api'));
  const client = await clientOf(t, srv);
  for (let i = 0; i < 3; i++) {
    const page = JSON.parse((await listBytes(client, '/api/v1/services', { limit: 1, labelSelector: 'a!=b', continue: undefined }, list)).toString()) as { items: unknown[] };
    t.equal(page.items.length, 1);
  }
  t.same(srv.requests.at(-1)?.query, { limit: '1', labelSelector: 'a!=b' }, 'undefined values left out');
  t.equal(srv.connections, 1, 'one connection for three requests');
});

t.test('lists are asked for compressed, and read whole when they are', async (t) => {
  const srv = await served(t);
  srv.gzipLists = true;
  srv.add('services', service('web'));
  const client = await clientOf(t, srv);
  const page = JSON.parse((await listBytes(client, '/api/v1/services', {}, list)).toString()) as { items: Array<{ metadata: { name: string } }> };
  t.equal(page.items[0]?.metadata.name, 'web');
});

t.test('a status other than 200: ApiError with the status and the server\'s Status body', async (t) => {
  const srv = await served(t);
  srv.forbid('services', 'list');
  const client = await clientOf(t, srv);
  const err = (await listBytes(client, '/api/v1/services', {}, list).catch((e: unknown) => e)) as ApiError;
  t.type(err, ApiError);
  t.equal(err.statusCode, 403);
  t.match(JSON.parse(err.body), { kind: 'Status', code: 403, message: /cannot list resource "services"/ });
  t.equal(err.message, 'Forbidden');
});

t.test('a 401: the credentials are refreshed and the request made once more', async (t) => {
  const srv = await served(t, new KubeApiServer({ token: 'old' }));
  let refreshes = 0;
  let token = 'old';
  const credentials: Credentials = {
    via: 'built-in',
    forRequest: async () => ({ headers: { Authorization: `Bearer ${token}` }, tls: {} }),
    refresh: () => {
      refreshes++;
      token = 'new';
      return true;
    },
  };
  const client = new ApiClient({ server: srv.url, credentials: Promise.resolve(credentials) });
  t.teardown(() => client.close());
  await listBytes(client, '/api/v1/services', {}, list);
  t.equal(refreshes, 0);
  srv.setToken('new');
  await listBytes(client, '/api/v1/services', {}, list);
  t.equal(refreshes, 1, 'refreshed once, and the retry went through');
  srv.setToken('newer');
  const err = (await listBytes(client, '/api/v1/services', {}, list).catch((e: unknown) => e)) as ApiError;
  t.equal(err.statusCode, 401, 'still 401 after the retry: the error');
  t.equal(refreshes, 2, 'one refresh per request');
});

/** A kubeconfig in a new directory whose user reads the token file `token` there (written with `token`), under `key`. */
function tokenFileConfig(t: Test, url: string, key: 'token-file' | 'tokenFile', token: string): { dir: string; kubeconfig: string } {
  const dir = tempDir(t, 'kube-http-');
  writeFileSync(join(dir, 'token'), token);
  const kubeconfig = join(dir, 'config');
  writeFileSync(
    kubeconfig,
    `clusters: [{name: c, cluster: {server: "${url}", insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {${key}: token}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n`,
  );
  return { dir, kubeconfig };
}

t.test('a rotated token file: the 401 makes it read again at once', async (t) => {
  const srv = await served(t, new KubeApiServer({ token: 'one' }));
  const { dir, kubeconfig } = tokenFileConfig(t, srv.url, 'token-file', 'one');
  const client = await clientOf(t, srv, kubeconfig);
  await listBytes(client, '/api/v1/services', {}, list);
  // The token is cached for a minute; a rotation shows as a 401 first.
  writeFileSync(join(dir, 'token'), 'two');
  srv.setToken('two');
  await listBytes(client, '/api/v1/services', {}, list);
  t.same(
    srv.requests.map((r) => r.status),
    [200, 401, 200],
  );
});

t.test("kubectl's tokenFile key, and a token file ending with a newline (trimmed, as client-go does)", async (t) => {
  const srv = await served(t, new KubeApiServer({ token: 'sekret' }));
  const { kubeconfig } = tokenFileConfig(t, srv.url, 'tokenFile', 'sekret\n');
  const client = await clientOf(t, srv, kubeconfig);
  await listBytes(client, '/api/v1/services', {}, list);
  t.same(
    srv.requests.map((r) => r.status),
    [200],
  );
});

t.test('connected, no answer within the request timeout: NO_ANSWER (not a network error)', async (t) => {
  const silent: Server = createServer(() => {});
  silent.listen(0, '127.0.0.1');
  await once(silent, 'listening');
  t.teardown(() => {
    silent.closeAllConnections();
    silent.close();
  });
  const url = `http://127.0.0.1:${(silent.address() as AddressInfo).port}`;
  const credentials: Credentials = { via: 'built-in', forRequest: async () => ({ headers: {}, tls: {} }), refresh: () => false };
  const client = new ApiClient({ server: url, credentials: Promise.resolve(credentials), requestTimeoutMs: 200 });
  t.teardown(() => client.close());
  const err = (await within(listBytes(client, '/api/v1/services', {}, list).catch((e: unknown) => e), 'the timeout')) as NodeJS.ErrnoException;
  t.equal(err.code, NO_ANSWER);
  t.match(err.message, /accepted the connection but sent no answer in 0\.2 s/);
});

t.test('a watch stream: events line by line as they arrive; a cut stream is ERR_STREAM_PREMATURE_CLOSE', async (t) => {
  const srv = await served(t);
  const client = await clientOf(t, srv);
  const ac = new AbortController();
  const { body } = await client.get('/api/v1/services', { watch: 1, resourceVersion: srv.resourceVersion, allowWatchBookmarks: 'true' }, { signal: ac.signal, stream: true });
  const lines: string[] = [];
  let chunks = 0;
  let arrived: () => void = () => {};
  const done = readLines(
    body,
    (l) => {
      lines.push((JSON.parse(l) as { type: string }).type);
      arrived();
    },
    () => chunks++,
  );
  const next = (): Promise<void> => new Promise((r) => (arrived = r));
  let got = next();
  srv.add('services', service('web'));
  await within(got, 'ADDED');
  got = next();
  srv.bookmark();
  await within(got, 'BOOKMARK');
  t.same(lines, ['ADDED', 'BOOKMARK']);
  t.ok(chunks >= 2);
  srv.dropWatches();
  t.match(await within(done.catch((e: unknown) => e), 'the cut'), { code: 'ERR_STREAM_PREMATURE_CLOSE' });
});

t.test('readLines: lines split across chunks (and inside a UTF-8 character), a last line without newline, blank lines', async (t) => {
  const body = new PassThrough();
  const lines: string[] = [];
  const done = readLines(body, (l) => lines.push(l));
  const text = Buffer.from('{"a":"é"}\n\n{"b":1}\r\n{"c":2}');
  const cut = text.indexOf(0xa9); // the second byte of é
  body.write(text.subarray(0, cut));
  body.write(text.subarray(cut, cut + 5));
  body.end(text.subarray(cut + 5));
  await done;
  t.same(lines, ['{"a":"é"}', '{"b":1}\r', '{"c":2}']);

  // What the line handler throws ends the reading, with that error.
  const bad = new PassThrough();
  const failed = readLines(bad, () => {
    throw new Error('not an event');
  });
  bad.write('x\n');
  await t.rejects(failed, { message: 'not an event' });
  t.ok(bad.destroyed);
});

t.test('the server URL: a path prefix is kept; one that is no http(s) URL fails each request, in words', async (t) => {
  const srv = await served(t);
  const credentials: Credentials = { via: 'built-in', forRequest: async () => ({ headers: {}, tls: {} }), refresh: () => false };
  const prefixed = new ApiClient({ server: `${srv.url}/k8s/clusters/c-1`, credentials: Promise.resolve(credentials) });
  t.teardown(() => prefixed.close());
  t.match(await listBytes(prefixed, '/api/v1/services', {}, list).catch((e: unknown) => e), { statusCode: 404 });
  t.equal(srv.requests.at(-1)?.path, '/k8s/clusters/c-1/api/v1/services');
  const bad: Array<[string, string]> = [
    ['ftp://192.0.2.1', 'the server ftp://192.0.2.1 is not an http:// or https:// URL'],
    ['http://[bad', 'the server http://[bad is not a URL'],
  ];
  for (const [server, why] of bad) {
    const client = new ApiClient({ server, credentials: Promise.resolve(credentials) });
    await t.rejects(listBytes(client, '/api/v1/services', {}, list), { message: why });
    client.close();
  }
});

t.test('a kept-alive connection the server closed after its answer (no Connection: close): the request is made again on a new one', async (t) => {
  // As a naive server does: a 200 with a complete body, then the socket closed at once.
  const { createServer: createNetServer } = await import('node:net');
  let connections = 0;
  const srv = createNetServer((sock) => {
    connections++;
    sock.once('data', () => {
      sock.end('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{"items":[]}');
    });
  });
  srv.listen(0, '127.0.0.1');
  await once(srv, 'listening');
  t.teardown(() => srv.close());
  const { port } = srv.address() as AddressInfo;
  const credentials: Promise<Credentials> = Promise.resolve({ via: 'none', forRequest: async () => ({ headers: {} }), refresh: () => false } as unknown as Credentials);
  const client = new ApiClient({ server: `http://127.0.0.1:${port}`, credentials });
  t.teardown(() => client.close());
  for (let i = 0; i < 4; i++) {
    const body = await listBytes(client, '/api/v1/services', {}, { signal });
    t.equal(body.toString(), '{"items":[]}', `request ${i + 1}`);
  }
  t.equal(connections, 4, 'one connection per request');
});
