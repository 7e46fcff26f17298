/**
 * The kpng source against a real localv1 gRPC server on loopback.
 */
import t, { type Test } from 'tap';
import protobuf from 'protobufjs';
import * as grpc from '@grpc/grpc-js';
import { CalloutError } from '../../src/errors.js';
import type { Endpoint, Service } from '../../src/model.js';
import { createKpngSource, mayProxy, type KpngSourceOptions } from '../../src/sources/kpng.js';
import { stateFromItems, stateText } from '../../src/state.js';
import { makeCerts, opensslMissing, type TestCerts } from '../helpers/certs.js';
import { KpngTestServer, type Revision, type ServerOp } from '../helpers/kpng-server.js';
import { captureLog, recordingSink, type CapturedLog, type RecordingSink } from '../helpers/sink.js';
import { pollUntil, within } from '../helpers/wait.js';

const svc = (ns: string, name: string, extra: Service = {}): Service => ({
  Namespace: ns,
  Name: name,
  Type: 'ClusterIP',
  IPs: { ClusterIPs: { V4: ['10.96.0.1'] } },
  ...extra,
});
const ep = (ip: string, extra: Endpoint = {}): Endpoint => ({ IPs: { V4: [ip] }, Scopes: { Internal: true, External: true }, ...extra });
const setSvc = (s: Service): ServerOp => ({ op: 'set', set: 'services', path: `${s.Namespace}/${s.Name}`, value: s });
const setEp = (path: string, e: Endpoint): ServerOp => ({ op: 'set', set: 'endpoints', path, value: e });

/** The text the source must push for these items (grouping done by hand). */
const text = (...items: Array<[Service, Endpoint[]]>): string => stateText(stateFromItems(items.map(([Service, Endpoints]) => ({ Service, Endpoints }))));

interface Harness {
  server: KpngTestServer;
  sink: RecordingSink;
  log: CapturedLog;
  run: Promise<void>;
  stop(): Promise<void>;
}

async function start(
  t: Test,
  revisions: Revision[],
  options: Partial<KpngSourceOptions> = {},
  server?: KpngTestServer,
): Promise<Harness> {
  const srv = server ?? (await new KpngTestServer({ revisions }).start());
  const sink = recordingSink();
  const log = captureLog();
  const ac = new AbortController();
  const source = createKpngSource({ api: srv.address, nodeName: 'node-1', errorDelayMs: 10, logger: log.logger, ...options });
  const run = source.run(sink, ac.signal);
  // Surface an unexpected rejection at the point of failure, not as unhandled.
  run.catch(() => {});
  let stopped = false;
  const stop = async (): Promise<void> => {
    if (stopped) return;
    stopped = true;
    ac.abort();
    await within(run, 'waiting for run() to stop');
    await srv.close();
  };
  t.teardown(stop);
  return { server: srv, sink, log, run, stop };
}

t.test('applies set, delete and reset over revisions, one state per Sync', async (t) => {
  const a = svc('default', 'a');
  const ab = svc('default', 'a-b', { Type: 'NodePort' });
  const c = svc('default', 'c');
  const z = svc('kube-system', 'z');
  const e1 = ep('10.0.0.1');
  const e2 = ep('10.0.0.2', { Local: true });
  const e3 = ep('10.0.0.3');
  const h = await start(t, [
    // The server sends paths in plain byte order; `a-b` comes before `a/...`.
    [{ op: 'reset' }, setSvc(a), setSvc(ab), setEp('default/a-b/p3', e3), setEp('default/a/p1', e1), setEp('default/a/p2', e2)],
    [{ op: 'delete', set: 'endpoints', path: 'default/a/p1' }, setSvc(c), { op: 'delete', set: 'services', path: 'default/a-b' }],
    [{ op: 'reset' }, setSvc(z)],
    [], // an empty diff still gives a (same) state
  ]);
  await h.sink.waitForStates(4);
  t.same(h.sink.texts(), [
    text([a, [e1, e2]], [ab, [e3]]),
    text([a, [e2]], [c, []]),
    text([z, []]),
    text([z, []]),
  ]);
  // Every state's request went out at once although the sink never finished.
  const req = await h.server.waitForRequests(5);
  t.equal(req.NodeName, 'node-1');
  t.same(new Set(h.server.requests.map((r) => r.NodeName)), new Set(['node-1']));
  t.equal(h.server.streams, 1);
  t.ok(h.sink.statuses.some((s) => s.connected && s.synced && s.reconnects === 0));
  t.match(await h.log.waitFor(/synced with/), /info: synced with 127\.0\.0\.1:\d+: 2 services, 3 endpoints/);
  await h.stop();
  await within(h.server.waitForNoCalls(), 'waiting for the stream to close');
});

t.test('sends the configured NodeName', async (t) => {
  const h = await start(t, [[setSvc(svc('ns', 'x'))]], { nodeName: 'worker-7.example' });
  await h.sink.waitForStates(1);
  t.equal((await h.server.waitForRequests(1)).NodeName, 'worker-7.example');
});

t.test('reconnects after a server restart with an empty store and no partial state', async (t) => {
  const a = svc('default', 'a');
  const b = svc('default', 'b');
  const d = svc('default', 'd');
  const h = await start(t, [
    [setSvc(a), setEp('default/a/p', ep('10.0.0.1'))],
    // Part of a diff, then the server hangs: must never become a state.
    [setSvc(b), { op: 'delete', set: 'services', path: 'default/a' }, { op: 'stall' }],
  ]);
  await h.sink.waitForStates(1);
  await h.server.waitForRequests(2);
  await h.server.kill();
  // Fails, retries against a closed port (logged once), then reconnects.
  await h.log.waitFor(/warn: stream to 127\.0\.0\.1:\d+ failed: UNAVAILABLE: .*; reconnecting in \d+ms/);
  await h.sink.waitForStatus((s) => !s.connected && s.error !== undefined);
  t.equal(h.sink.states.length, 1, 'nothing pushed from the broken stream');
  // The new stream's full state has no Reset and no `a`: it must not inherit.
  h.server.push([setSvc(d)]);
  await h.server.restart();
  await h.sink.waitForStates(2);
  t.same(h.sink.texts(), [text([a, [ep('10.0.0.1')]]), text([d, []])]);
  t.equal(h.server.streams, 2);
  t.equal(h.server.requests[2]?.stream, 2);
  const st = await h.sink.waitForStatus((s) => s.synced && s.reconnects > 0);
  t.ok(st.connected);
  t.equal(h.log.matching(/^kpng-callout warn: stream to .* ECONNREFUSED/).length <= 1, true, 'repeated identical failures are not warned again');
});

t.test('a server that stays down: warned once, again a minute later with the count, debug in between', async (t) => {
  let clock = 0;
  const a = svc('default', 'a');
  const srv = await new KpngTestServer({ revisions: [[setSvc(a)]] }).start();
  await srv.kill();
  const h = await start(t, [], { now: () => clock }, srv);
  const failures = (): string[] => h.log.matching(/stream to 127\.0\.0\.1:\d+ failed: UNAVAILABLE: .*; reconnecting in \d+ms/);
  await pollUntil(() => failures().length >= 3, () => `three failed attempts; log: ${h.log.lines.slice(-5).join(' | ')}`, 8000, 5);
  t.match(failures().slice(0, 3), [/^kpng-callout warn: /, /^kpng-callout debug: /, /^kpng-callout debug: /]);
  clock += 60_000;
  const again = await within(h.log.waitFor(/warn: stream .* repeated=\d+$/), 'the repeat a minute later');
  const quiet = h.log.lines.slice(0, h.log.lines.indexOf(again)).filter((l) => /^kpng-callout debug: stream .* failed/.test(l)).length;
  t.ok(quiet >= 2);
  t.match(again, new RegExp(`; reconnecting in \\d+ms repeated=${quiet}$`));
});

t.test('after a sync the same failure is warned about again at once', async (t) => {
  const a = svc('default', 'a');
  const boom: ServerOp = { op: 'fail', code: grpc.status.INTERNAL, details: 'boom' };
  // Each stream syncs, then fails the same way; the clock stands still.
  const h = await start(t, [[setSvc(a)], [boom], [setSvc(a)], [boom], [setSvc(a)]], { now: () => 0 });
  await h.sink.waitForStates(3);
  t.equal(h.log.matching(/^kpng-callout warn: stream to .* failed: INTERNAL: boom; reconnecting in \d+ms$/).length, 2);
});

t.test('a stream failing mid-diff pushes nothing and starts over', async (t) => {
  const a = svc('default', 'a');
  const b = svc('default', 'b');
  const h = await start(t, [
    [setSvc(a)],
    [setSvc(b), { op: 'fail', code: grpc.status.INTERNAL, details: 'boom' }],
    [setSvc(b)],
    [{ op: 'fail', code: grpc.status.OK }],
    [setSvc(a)],
  ]);
  await h.sink.waitForStates(3);
  t.same(h.sink.texts(), [text([a, []]), text([b, []]), text([a, []])]);
  t.match(h.log.matching(/failed/), [/stream to 127\.0\.0\.1:\d+ failed: INTERNAL: boom; reconnecting in \d+ms/, /failed: the server ended the stream; reconnecting/]);
  t.equal(h.server.streams, 3);
});

t.test('an undecodable OpItem breaks the stream, which is reopened', async (t) => {
  const a = svc('default', 'a');
  const h = await start(t, [[{ op: 'raw', bytes: Uint8Array.of(0x12, 0x05, 0x0a) }], [setSvc(a)]]);
  await h.sink.waitForStates(1);
  t.same(h.sink.texts(), [text([a, []])]);
  t.match(await h.log.waitFor(/failed/), /failed: INTERNAL: Response message parsing error/);
});

t.test('undecodable values and invalid UTF-8 are skipped, keeping the value held before', async (t) => {
  const a = svc('default', 'a', { Labels: { app: 'a' } });
  const e = ep('10.0.0.1', { Hostname: 'h' });
  // Endpoint{Hostname: FF FE}: invalid UTF-8 in a string field.
  const badHostname = protobuf.Writer.create().uint32((1 << 3) | 2).bytes(Uint8Array.of(0xff, 0xfe)).finish();
  // Service{Labels: {"app": C3 28}}: invalid UTF-8 in a map value.
  const entry = protobuf.Writer.create().uint32((1 << 3) | 2).string('app').uint32((2 << 3) | 2).bytes(Uint8Array.of(0xc3, 0x28)).finish();
  const badLabel = protobuf.Writer.create().uint32((1 << 3) | 2).string('default').uint32((8 << 3) | 2).bytes(entry).finish();
  const h = await start(t, [
    [setSvc(a), setEp('default/a/p', e)],
    [
      { op: 'set', set: 'services', path: 'default/a', bytes: Uint8Array.of(0x0a, 0x09, 0x61) }, // truncated
      { op: 'set', set: 'endpoints', path: 'default/a/p', bytes: badHostname },
      { op: 'set', set: 'services', path: 'default/b', bytes: badLabel },
    ],
  ]);
  await h.sink.waitForStates(2);
  const [first, second] = h.sink.texts();
  t.equal(second, first);
  t.equal(second, text([a, [e]]));
  t.match(h.log.matching(/cannot decode/), [
    /^kpng-callout warn: cannot decode Service default\/a: .*; keeping the value held before$/,
    /^kpng-callout warn: cannot decode Endpoint default\/a\/p: .*utf-8.*; keeping the value held before$/i,
    /^kpng-callout warn: cannot decode Service default\/b: .*utf-8.*; keeping the value held before$/i,
  ]);
  t.equal(h.server.streams, 1, 'a bad value does not break the stream');
});

t.test('ops on other sets are ignored (logged once per kind)', async (t) => {
  const a = svc('default', 'a');
  const other: ServerOp[] = [
    { op: 'set', set: 10, path: 'default/a', value: svc('x', 'y') },
    { op: 'set', set: 0, path: 'default/q', value: svc('x', 'q') },
    { op: 'delete', set: 12, path: 'default/a' },
  ];
  const h = await start(t, [[setSvc(a), ...other], [...other], [{ op: 'raw', bytes: new Uint8Array() }]]);
  await h.sink.waitForStates(3);
  t.same(h.sink.texts(), [text([a, []]), text([a, []]), text([a, []])]);
  t.equal(h.log.matching(/ignoring Set ops on set 10/).length, 1);
  t.equal(h.log.matching(/ignoring Set ops on set 0 /).length, 1);
  t.equal(h.log.matching(/ignoring Delete ops on set 12/).length, 1);
  t.equal(h.log.matching(/^kpng-callout debug: ignoring an OpItem of a kind/).length, 1);
  t.equal(h.log.matching(/warn/).length, 0);
});

t.test('endpoints whose Service is absent are skipped with a log line', async (t) => {
  const a = svc('default', 'a');
  const e = ep('10.0.0.1');
  const h = await start(t, [
    [setEp('default/ghost/p1', e), setSvc(a), setEp('default/a/p', e), setEp('nopath', e)],
    [{ op: 'delete', set: 'services', path: 'default/a' }],
  ]);
  await h.sink.waitForStates(2);
  t.same(h.sink.texts(), [text([a, [e]]), '']);
  t.match(h.log.matching(/skipping/), [
    /warn: skipping Endpoint nopath: its path has no namespace\/service part/,
    /warn: skipping 1 endpoint\(s\) whose Service is absent: default\/ghost\/p1$/,
    /warn: skipping 1 endpoint\(s\) whose Service is absent: default\/a\/p$/,
  ]);
});

t.test('a message over --max-msg-size gives a clear error and a reconnect', async (t) => {
  const big = svc('default', 'big', { Annotations: { note: 'x'.repeat(2000) } });
  const small = svc('default', 'small');
  const h = await start(t, [[setSvc(big)], [setSvc(small)]], { maxMsgSize: 1024 });
  await h.sink.waitForStates(1);
  t.same(h.sink.texts(), [text([small, []])]);
  const line = await h.log.waitFor(/RESOURCE_EXHAUSTED/);
  t.match(line, /^kpng-callout warn: stream to 127\.0\.0\.1:\d+ failed: RESOURCE_EXHAUSTED: .*larger than max.*; a message exceeded --max-msg-size \(1024 bytes\), raise --max-msg-size; reconnecting in \d+ms$/);
});

t.test('a RESOURCE_EXHAUSTED the server sends is not blamed on --max-msg-size', async (t) => {
  const a = svc('default', 'a');
  const quota: ServerOp = { op: 'fail', code: grpc.status.RESOURCE_EXHAUSTED, details: 'quota exceeded' };
  const h = await start(t, [[quota], [setSvc(a)]]);
  await h.sink.waitForStates(1);
  t.match(h.log.matching(/RESOURCE_EXHAUSTED/), [/^kpng-callout warn: stream to 127\.0\.0\.1:\d+ failed: RESOURCE_EXHAUSTED: quota exceeded; reconnecting in \d+ms$/]);
});

t.test('a server that accepts and hangs up at once: one warning, the repeats at debug (no timestamp in the failure)', async (t) => {
  const { createServer } = await import('node:net');
  const hangUp = createServer((socket) => socket.destroy());
  await new Promise<void>((r) => hangUp.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => hangUp.close(() => r())));
  const port = (hangUp.address() as { port: number }).port;
  const srv = new KpngTestServer({ port });
  const h = await start(t, [], { api: `127.0.0.1:${port}`, now: () => 0 }, srv);
  const failures = (): string[] => h.log.matching(/stream to 127\.0\.0\.1:\d+ failed: /);
  await pollUntil(() => failures().length >= 3, () => `three failed attempts; log: ${h.log.lines.slice(-5).join(' | ')}`, 8000, 5);
  t.match(failures().slice(0, 3), [/^kpng-callout warn: /, /^kpng-callout debug: /, /^kpng-callout debug: /]);
  t.notMatch(failures()[0], /\(\d{4}-\d\d-\d\dT/, 'no timestamp in the message');
});

t.test('once: resolves after the first state and closes the stream', async (t) => {
  const a = svc('default', 'a');
  const h = await start(t, [[setSvc(a)], [setSvc(svc('default', 'b'))]], { once: true });
  await within(h.run, 'waiting for run() to resolve');
  t.same(h.sink.texts(), [text([a, []])]);
  await within(h.server.waitForNoCalls(), 'waiting for the stream to close');
  t.equal(h.server.requests.length, 1, 'no second request');
});

t.test('abort stops cleanly: connected, and while waiting to reconnect', async (t) => {
  const h = await start(t, [[setSvc(svc('default', 'a'))]]);
  await h.sink.waitForStates(1);
  await h.server.waitForRequests(2); // parked: no revision queued
  await h.stop();
  t.equal(h.server.streams, 1);

  const srv = await new KpngTestServer().start();
  await srv.kill(); // a port with nothing listening
  const h2 = await start(t, [], { errorDelayMs: 60_000 }, srv);
  await h2.log.waitFor(/reconnecting in [\d.]+s/);
  await h2.stop(); // must not wait out the delay
  t.equal(h2.sink.states.length, 0);
  t.ok(h2.sink.statuses.every((s) => !s.synced));
});

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
