/**
 * The kpng source against a real localv1 gRPC server on loopback: the
 * stream (set, delete and reset over revisions, one state per Sync), the
 * NodeName it sends, reconnects and what they warn, streams that fail
 * mid-diff, undecodable values, ops it ignores, message sizes, --once and
 * abort. Connections (TLS, silent peers, proxies, grpc-js's log):
 * kpng-connection.test.ts.
 */
import t from 'tap';
import protobuf from 'protobufjs';
import * as grpc from '@grpc/grpc-js';
import { KpngTestServer, type ServerOp } from '../helpers/kpng-server.js';
import { ep, setEp, setSvc, start, svc, text } from '../helpers/kpng-source.js';
import { pollUntil, within } from '../helpers/wait.js';

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
