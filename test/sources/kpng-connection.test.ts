/**
 * The kpng source's connection to a real localv1 gRPC server on loopback:
 * TLS, a server that never answers or goes silent (keepalive), which --api
 * may go through a proxy (as grpc-go), a connection with no state yet, and
 * grpc-js's own log lines. The stream itself: kpng.test.ts.
 */
import t from 'tap';
import { CalloutError } from '../../src/errors.js';
import { createKpngSource, mayProxy, type KpngSourceOptions } from '../../src/sources/kpng.js';
import { makeCerts, opensslMissing, type TestCerts } from '../helpers/certs.js';
import { KpngTestServer } from '../helpers/kpng-server.js';
import { setSvc, start, svc, text } from '../helpers/kpng-source.js';
import { recordingSink } from '../helpers/sink.js';
import { pollUntil, within } from '../helpers/wait.js';

const noOpenssl = opensslMissing();
if (noOpenssl) t.comment(`skipping the TLS tests: ${noOpenssl}`);

t.test('TLS', { skip: noOpenssl ?? false }, async (t) => {
  const certs: TestCerts = makeCerts(t);
  const a = svc('default', 'a');

  t.test('server TLS verified with the CA', async (t) => {
    const srv = await new KpngTestServer({ revisions: [[setSvc(a)]], tls: { key: certs.serverKey, cert: certs.serverCert } }).start();
    const h = await start(t, [], { tls: { ca: certs.ca } }, srv);
    await h.sink.waitForStates(1);
    t.same(h.sink.texts(), [text([a, []])]);
  });

  t.test('mutual TLS with a client certificate', async (t) => {
    const tls = { key: certs.serverKey, cert: certs.serverCert, ca: certs.ca, requireClientCert: true };
    const srv = await new KpngTestServer({ revisions: [[setSvc(a)]], tls }).start();
    const h = await start(t, [], { tls: { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey } }, srv);
    await h.sink.waitForStates(1);
    t.same(h.sink.texts(), [text([a, []])]);
  });

  t.test('mutual TLS refused without a client certificate', async (t) => {
    const tls = { key: certs.serverKey, cert: certs.serverCert, ca: certs.ca, requireClientCert: true };
    const srv = await new KpngTestServer({ revisions: [[setSvc(a)]], tls }).start();
    const h = await start(t, [], { tls: { ca: certs.ca } }, srv);
    t.match(await h.log.waitFor(/failed/), /warn: stream to 127\.0\.0\.1:\d+ failed: UNAVAILABLE: /);
    t.equal(h.sink.states.length, 0);
  });

  t.test('a server certificate from another CA is refused', async (t) => {
    const srv = await new KpngTestServer({ revisions: [[setSvc(a)]], tls: { key: certs.serverKey, cert: certs.serverCert } }).start();
    const h = await start(t, [], { tls: { ca: certs.otherCa } }, srv);
    t.match(await h.log.waitFor(/failed/), /failed: UNAVAILABLE: .*(certificate|verify)/i);
    t.equal(h.sink.states.length, 0);
  });

  t.test('unusable TLS material rejects run() at once', async (t) => {
    const bad: Array<[string, NonNullable<KpngSourceOptions['tls']>, RegExp]> = [
      ['CA without a certificate', { ca: Buffer.from('not a pem') }, /CA: no PEM certificate found/],
      ['broken CA certificate', { ca: Buffer.from('-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n') }, /CA: /],
      ['key is not a key', { cert: certs.clientCert, key: Buffer.from('nope') }, /./],
      ['cert without key', { cert: certs.clientCert }, /needs its key/],
      ['key of another certificate', { cert: certs.clientCert, key: certs.serverKey }, /./],
    ];
    for (const [name, tls, re] of bad) {
      const source = createKpngSource({ api: '127.0.0.1:1', nodeName: 'n', tls });
      const err = await within(
        source.run(recordingSink(), new AbortController().signal).then(
          () => undefined,
          (e: unknown) => e,
        ),
        name,
      );
      t.type(err, CalloutError, name);
      t.equal((err as CalloutError).code, 'input', name);
      t.match((err as Error).message, /^TLS files for --api 127\.0\.0\.1:1: /, name);
      t.match((err as Error).message, re, name);
    }
  });
});

t.test('a server that accepts but never answers: reported after noAnswerMs (grpc-js has no connect timeout), not left silent', async (t) => {
  const { createServer } = await import('node:net');
  const held: import('node:net').Socket[] = [];
  const mute = createServer((socket) => void held.push(socket));
  await new Promise<void>((r) => mute.listen(0, '127.0.0.1', r));
  t.teardown(() => {
    for (const s of held) s.destroy();
    return new Promise<void>((r) => mute.close(() => r()));
  });
  const port = (mute.address() as { port: number }).port;
  const srv = new KpngTestServer({ port });
  const h = await start(t, [], { api: `127.0.0.1:${port}`, noAnswerMs: 200 }, srv);
  await pollUntil(() => h.log.matching(/no answer/).length > 0, () => `a warning; log: ${h.log.lines.slice(-5).join(' | ')}`, 8000, 10);
  t.match(h.log.matching(/no answer/)[0], new RegExp(`^kpng-callout warn: no answer from 127\\.0\\.0\\.1:${port} within 200ms \\(channel \\w+\\); still waiting$`));
});

t.test('a stream whose peer goes silent (controller host down, network lost) fails by keepalive and reconnects', async (t) => {
  const { createServer, connect } = await import('node:net');
  const a = svc('default', 'a');
  const srv = await new KpngTestServer({ revisions: [[{ op: 'reset' }, setSvc(a)]] }).start();
  // A TCP relay that can black-hole every open connection (packets dropped, nothing closed).
  let frozen = false;
  const pairs: Array<[import('node:net').Socket, import('node:net').Socket]> = [];
  const relay = createServer((down) => {
    const up = connect(srv.port, '127.0.0.1');
    pairs.push([down, up]);
    down.on('data', (d) => void (frozen || up.write(d)));
    up.on('data', (d) => void (frozen || down.write(d)));
    down.on('error', () => up.destroy());
    up.on('error', () => down.destroy());
    down.on('close', () => up.destroy());
    up.on('close', () => down.destroy());
  });
  await new Promise<void>((r) => relay.listen(0, '127.0.0.1', r));
  t.teardown(() => {
    for (const [x, y] of pairs) (x.destroy(), y.destroy());
    return new Promise<void>((r) => relay.close(() => r()));
  });
  const port = (relay.address() as { port: number }).port;
  const h = await start(t, [], { api: `127.0.0.1:${port}`, keepaliveMs: 300, keepaliveTimeoutMs: 300 }, srv);
  await h.sink.waitForStates(1);
  frozen = true;
  await pollUntil(() => h.log.matching(/failed/).length > 0, () => `a stream failure; log: ${h.log.lines.slice(-5).join(' | ')}`, 8000, 20);
  // The peer is reachable again: the new stream gets the full state.
  for (const [x, y] of pairs.splice(0)) (x.destroy(), y.destroy());
  frozen = false;
  srv.push([{ op: 'reset' }, setSvc(a)]);
  await h.sink.waitForStates(2);
  t.same(h.sink.texts().at(-1), text([a, []]));
});

t.test('$http_proxy is not used for a loopback --api (as grpc-go: Go never proxies loopback)', async (t) => {
  const saved = process.env.http_proxy;
  process.env.http_proxy = 'http://127.0.0.1:9';
  t.teardown(() => {
    if (saved === undefined) delete process.env.http_proxy;
    else process.env.http_proxy = saved;
  });
  const a = svc('default', 'a');
  const h = await start(t, [[setSvc(a)]]);
  await h.sink.waitForStates(1);
  t.same(h.sink.texts(), [text([a, []])]);
});

t.test('connected but no state (kpng sends none before it has synced with Kubernetes, or while no Service is for this node): said once, at info', async (t) => {
  const h = await start(t, [[{ op: 'reset' }, { op: 'stall' }]], { noAnswerMs: 200 });
  await pollUntil(() => h.log.matching(/no state within/).length > 0, () => `an info line; log: ${h.log.lines.slice(-5).join(' | ')}`, 8000, 10);
  t.match(h.log.matching(/no state within/), [/^kpng-callout info: connected to 127\.0\.0\.1:\d+, no state within 200ms: kpng sends one once it has synced with the Kubernetes API and has a Service for this node; still waiting$/]);
  t.same(h.log.matching(/warn|no answer/), [], 'not told as a server that does not answer');
  t.equal(h.sink.states.length, 0);
});

t.test('connected, nothing sent at all (a grpc-go server sends no headers before its first message, as kpng before it has synced): said at info, not as no answer', async (t) => {
  const h = await start(t, [[{ op: 'stall' }]], { noAnswerMs: 200 });
  await pollUntil(() => h.log.lines.some((l) => /no state within|no answer/.test(l)), () => `a line; log: ${h.log.lines.slice(-5).join(' | ')}`, 8000, 10);
  t.match(h.log.matching(/no state within|no answer/), [/^kpng-callout info: connected to 127\.0\.0\.1:\d+, no state within 200ms: /]);
  t.same(h.log.matching(/warn/), []);
});

t.test("grpc-js's own log lines are ours, at debug, one line each (not raw 'E ...' lines on stderr: --log-format json stays JSON)", async (t) => {
  // A proxy that refuses (loopback port 9), for a target that is not loopback: grpc-js logs its failure to
  // reach it. No other proxy variable may send it elsewhere (nothing goes to 192.0.2.1 itself; with
  // http_proxy alone it would, as grpc-go: see the next test).
  const keys = ['http_proxy', 'https_proxy', 'grpc_proxy', 'no_proxy', 'no_grpc_proxy', 'HTTP_PROXY', 'HTTPS_PROXY', 'NO_PROXY'];
  const saved = keys.map((k) => [k, process.env[k]] as const);
  for (const k of keys) delete process.env[k];
  process.env.https_proxy = 'http://127.0.0.1:9';
  t.teardown(() => {
    for (const [k, v] of saved) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });
  const h = await start(t, [], { api: '192.0.2.1:12090' });
  await pollUntil(() => h.log.matching(/grpc: /).length > 0, () => `a grpc line; log: ${h.log.lines.slice(-5).join(' | ')}`, 8000, 20);
  t.match(h.log.matching(/grpc: /)[0], /^kpng-callout debug: grpc: [^\n]*proxy/);
});

t.test('which --api grpc-js may send through a proxy: as grpc-go (https_proxy, never loopback or unix:)', async (t) => {
  const remote = '192.0.2.1:12090';
  t.equal(mayProxy(remote, { http_proxy: 'http://p:3128' }), false, 'http_proxy alone: no (grpc-go looks a proxy up for an https URL)');
  t.equal(mayProxy(remote, { https_proxy: 'http://p:3128' }), true);
  t.equal(mayProxy(remote, { HTTPS_PROXY: 'http://p:3128' }), false, 'grpc-js reads lower-case names only: no proxy for it, so none');
  t.equal(mayProxy(remote, { grpc_proxy: 'http://p:3128' }), true, "grpc-js's own variable, set on purpose");
  t.equal(mayProxy(remote, {}), false);
  t.equal(mayProxy(`dns:///${remote}`, { https_proxy: 'http://p:3128' }), true);
  for (const local of ['127.0.0.1:1', 'localhost:1', 'kpng.localhost:1', '[::1]:1', 'unix:///run/kpng.sock', 'unix:/run/kpng.sock', 'unix-abstract:kpng', 'dns:///127.0.0.1:1', 'dns:///localhost:1', 'ipv4:127.0.0.1:1', 'ipv6:[::1]:1']) {
    t.equal(mayProxy(local, { https_proxy: 'http://p:3128' }), false, local);
  }
});
