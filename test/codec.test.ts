/**
 * The protobuf codec: wire numbers as in kpng-localv1.md, presence kept,
 * strict UTF-8, unknown enum values kept.
 */
import t from 'tap';
import protobuf from 'protobufjs';
import {
  marshalEndpoint,
  marshalOpItem,
  marshalService,
  marshalWatchReq,
  unmarshalEndpoint,
  unmarshalOpItem,
  unmarshalService,
  unmarshalWatchReq,
} from '../src/codec.js';
import type { Endpoint, Service } from '../src/model.js';

const W = (): protobuf.Writer => protobuf.Writer.create();
/** Length-delimited field `n` holding `bytes`. */
const ld = (w: protobuf.Writer, n: number, bytes: Uint8Array): protobuf.Writer => w.uint32((n << 3) | 2).bytes(bytes);
const str = (w: protobuf.Writer, n: number, s: string): protobuf.Writer => w.uint32((n << 3) | 2).string(s);
const vint = (w: protobuf.Writer, n: number, v: number): protobuf.Writer => w.uint32(n << 3).int32(v);

const fullService: Service = {
  Namespace: 'default',
  Name: 'web',
  Type: 'LoadBalancer',
  Labels: { app: 'web', 'k8s.io/x': 'y' },
  Annotations: { note: '<&>' },
  IPs: {
    ClusterIPs: { V4: ['10.96.0.10'], V6: ['fd00::10'] },
    ExternalIPs: { V4: ['192.0.2.1'] },
    LoadBalancerIPs: { V6: ['2001:db8::1'] },
    Headless: true,
  },
  IPFilters: [{ TargetIPs: { V4: ['192.0.2.1'] }, SourceRanges: ['10.0.0.0/8', '192.168.0.0/16'] }, {}],
  MapIP: true,
  Ports: [
    { Name: 'http', Protocol: 1, Port: 80, NodePort: 30080, TargetPort: 8080 },
    { Name: 'dns', Protocol: 2, Port: 53, TargetPortName: 'dns' },
    { Protocol: 3, Port: 9 },
  ],
  ExternalTrafficToLocal: true,
  SessionAffinity: { ClientIP: { TimeoutSeconds: 10800 } },
  InternalTrafficToLocal: true,
  HealthCheckNodePort: 32000,
};

const fullEndpoint: Endpoint = {
  Hostname: 'pod-0',
  IPs: { V4: ['10.244.0.5'], V6: ['fd00:244::5'] },
  Local: true,
  PortOverrides: [{ Name: 'http', Port: 8080 }, { Port: 9 }],
  Scopes: { Internal: true, External: true },
};

t.test('round trips every field', async (t) => {
  t.strictSame(unmarshalService(marshalService(fullService)), fullService);
  t.strictSame(unmarshalEndpoint(marshalEndpoint(fullEndpoint)), fullEndpoint);
  t.strictSame(unmarshalService(marshalService({})), {});
  t.strictSame(unmarshalEndpoint(marshalEndpoint({})), {});
});

t.test('decodes the field numbers of kpng-localv1.md (bytes built by hand)', async (t) => {
  const ipset = (v4: string, v6: string): Uint8Array => str(str(W(), 1, v4), 2, v6).finish();
  const ips = W();
  ld(ips, 1, ipset('10.0.0.1', 'fd00::1')); // ClusterIPs
  ld(ips, 2, ipset('192.0.2.1', '2001:db8::1')); // ExternalIPs
  vint(ips, 3, 1); // Headless
  ld(ips, 4, ipset('198.51.100.1', '2001:db8::2')); // LoadBalancerIPs
  const port = str(vint(vint(vint(vint(str(W(), 1, 'p'), 2, 2), 3, 53), 4, 30053), 5, 5353), 6, 'dns').finish();
  const filter = str(ld(W(), 1, ipset('1.1.1.1', '::1')), 2, '10.0.0.0/8').finish();
  const mapEntry = (k: string, v: string): Uint8Array => str(str(W(), 1, k), 2, v).finish();
  const w = W();
  str(w, 1, 'ns');
  str(w, 2, 'name');
  str(w, 3, 'NodePort');
  ld(w, 4, ips.finish());
  vint(w, 5, 1); // MapIP
  ld(w, 6, port);
  vint(w, 7, 1); // ExternalTrafficToLocal
  ld(w, 8, mapEntry('l', 'lv'));
  ld(w, 9, mapEntry('a', 'av'));
  ld(w, 10, filter);
  ld(w, 11, vint(W(), 1, 30).finish()); // ClientIP
  vint(w, 12, 1); // InternalTrafficToLocal
  vint(w, 13, 31000); // HealthCheckNodePort
  t.strictSame(unmarshalService(w.finish()), {
    Namespace: 'ns',
    Name: 'name',
    Type: 'NodePort',
    IPs: {
      ClusterIPs: { V4: ['10.0.0.1'], V6: ['fd00::1'] },
      ExternalIPs: { V4: ['192.0.2.1'], V6: ['2001:db8::1'] },
      LoadBalancerIPs: { V4: ['198.51.100.1'], V6: ['2001:db8::2'] },
      Headless: true,
    },
    MapIP: true,
    Ports: [{ Name: 'p', Protocol: 2, Port: 53, NodePort: 30053, TargetPort: 5353, TargetPortName: 'dns' }],
    ExternalTrafficToLocal: true,
    Labels: { l: 'lv' },
    Annotations: { a: 'av' },
    IPFilters: [{ TargetIPs: { V4: ['1.1.1.1'], V6: ['::1'] }, SourceRanges: ['10.0.0.0/8'] }],
    SessionAffinity: { ClientIP: { TimeoutSeconds: 30 } },
    InternalTrafficToLocal: true,
    HealthCheckNodePort: 31000,
  });

  const e = W();
  str(e, 1, 'host');
  ld(e, 2, ipset('10.1.0.1', 'fd01::1'));
  vint(e, 3, 1);
  ld(e, 4, vint(str(W(), 1, 'http'), 2, 8080).finish());
  ld(e, 5, vint(vint(W(), 1, 1), 2, 1).finish());
  t.strictSame(unmarshalEndpoint(e.finish()), {
    Hostname: 'host',
    IPs: { V4: ['10.1.0.1'], V6: ['fd01::1'] },
    Local: true,
    PortOverrides: [{ Name: 'http', Port: 8080 }],
    Scopes: { Internal: true, External: true },
  });

  // OpItem: Sync 1, Set 2 (Value: Ref 1 {Set 1, Path 2}, Bytes 2), Delete 3, Reset 4.
  t.strictSame(unmarshalOpItem(ld(W(), 1, new Uint8Array()).finish()), { Sync: {} });
  t.strictSame(unmarshalOpItem(ld(W(), 4, new Uint8Array()).finish()), { Reset: {} });
  const ref = str(vint(W(), 1, 2), 2, 'ns/svc/pod').finish();
  const value = ld(ld(W(), 1, ref), 2, Uint8Array.of(1, 2, 3)).finish();
  const set = unmarshalOpItem(ld(W(), 2, value).finish());
  t.strictSame(set.Set?.Ref, { Set: 2, Path: 'ns/svc/pod' });
  t.strictSame([...set.Set!.Bytes], [1, 2, 3]);
  t.strictSame(unmarshalOpItem(ld(W(), 3, ref).finish()), { Delete: { Set: 2, Path: 'ns/svc/pod' } });
  t.strictSame(unmarshalWatchReq(str(W(), 1, 'node-a').finish()), { NodeName: 'node-a' });
  t.strictSame([...marshalWatchReq({ NodeName: 'node-a' })], [...str(W(), 1, 'node-a').finish()]);
});

t.test('keeps presence: absent is undefined, present-but-empty is {}', async (t) => {
  const headless = unmarshalService(marshalService({ Name: 'h', IPs: { ClusterIPs: {}, ExternalIPs: {}, Headless: true } }));
  t.strictSame(headless, { Name: 'h', IPs: { ClusterIPs: {}, ExternalIPs: {}, Headless: true } });
  t.notOk('LoadBalancerIPs' in headless.IPs!);

  const noIPs = unmarshalService(marshalService({ Name: 'n' }));
  t.notOk('IPs' in noIPs);
  t.notOk('SessionAffinity' in noIPs, 'unset oneof stays undefined');

  t.strictSame(unmarshalService(marshalService({ IPs: {} })), { IPs: {} });
  t.strictSame(unmarshalService(marshalService({ SessionAffinity: { ClientIP: {} } })), { SessionAffinity: { ClientIP: {} } });
  t.strictSame(unmarshalService(marshalService({ SessionAffinity: { ClientIP: { TimeoutSeconds: 0 } } })), { SessionAffinity: { ClientIP: {} } });
  t.strictSame(unmarshalEndpoint(marshalEndpoint({ Scopes: {} })), { Scopes: {} });
  t.strictSame(unmarshalEndpoint(marshalEndpoint({ Scopes: { Internal: false, External: true } })), { Scopes: { External: true } });

  // Empty lists and maps carry nothing on the wire: they come back absent.
  t.strictSame(unmarshalService(marshalService({ Labels: {}, Annotations: {}, Ports: [], IPFilters: [], IPs: { ClusterIPs: { V4: [], V6: [] } } })), {
    IPs: { ClusterIPs: {} },
  });
  // Zero scalars are absent too, as Go's omitempty prints them.
  t.strictSame(unmarshalService(marshalService({ Name: '', MapIP: false, HealthCheckNodePort: 0, Ports: [{ Port: 0, Name: '' }] })), { Ports: [{}] });
});

t.test('keeps enum values it does not know as numbers', async (t) => {
  t.strictSame(unmarshalService(marshalService({ Ports: [{ Protocol: 7, Port: 1 }] })).Ports, [{ Protocol: 7, Port: 1 }]);
  t.strictSame(unmarshalService(vint(W(), 6, 0).finish()), {}, 'a field of the wrong wire type is skipped');
  const op = unmarshalOpItem(marshalOpItem({ Delete: { Set: 42, Path: 'x' } }));
  t.strictSame(op, { Delete: { Set: 42, Path: 'x' } });
  const neg = unmarshalService(ld(W(), 6, vint(W(), 2, -1).finish()).finish());
  t.strictSame(neg.Ports, [{ Protocol: -1 }]);
});

t.test('skips unknown fields, ops and members', async (t) => {
  const w = str(W(), 2, 'x');
  vint(w, 99, 5);
  str(w, 100, 'future');
  t.strictSame(unmarshalService(w.finish()), { Name: 'x' });
  t.strictSame(unmarshalOpItem(ld(W(), 9, Uint8Array.of()).finish()), {}, 'an op of a future kind');
  t.strictSame(unmarshalOpItem(new Uint8Array()), {});
  const noRef = unmarshalOpItem(ld(W(), 2, ld(W(), 2, Uint8Array.of(7)).finish()).finish());
  t.notOk('Ref' in noRef.Set!);
});

t.test('round trips text that needs care', async (t) => {
  const s: Service = {
    Name: 'héllo wörld 😀 \u2028\u2029 \x7f \b\f <>&',
    Labels: { '\u{1F600}': 'astral', '\uFF21': 'fullwidth', '': 'empty key' },
  };
  t.strictSame(unmarshalService(marshalService(s)), s);
});

t.test('rejects invalid UTF-8 in every kind of string field', async (t) => {
  const bad = Uint8Array.of(0x61, 0xc3, 0x28);
  const entry = (k: Uint8Array, v: Uint8Array): Uint8Array => ld(ld(W(), 1, k), 2, v).finish();
  const ascii = new TextEncoder().encode('ok');
  const cases: Array<[string, () => unknown]> = [
    ['Service.Name', () => unmarshalService(ld(W(), 2, bad).finish())],
    ['Service.Labels key', () => unmarshalService(ld(W(), 8, entry(bad, ascii)).finish())],
    ['Service.Annotations value', () => unmarshalService(ld(W(), 9, entry(ascii, bad)).finish())],
    ['ClusterIPs.V4', () => unmarshalService(ld(W(), 4, ld(W(), 1, ld(W(), 1, bad).finish()).finish()).finish())],
    ['PortMapping.TargetPortName', () => unmarshalService(ld(W(), 6, ld(W(), 6, bad).finish()).finish())],
    ['IPFilter.SourceRanges', () => unmarshalService(ld(W(), 10, ld(W(), 2, bad).finish()).finish())],
    ['Endpoint.Hostname', () => unmarshalEndpoint(ld(W(), 1, bad).finish())],
    ['PortName.Name', () => unmarshalEndpoint(ld(W(), 4, ld(W(), 1, bad).finish()).finish())],
    ['long string', () => unmarshalEndpoint(ld(W(), 1, Uint8Array.of(...new Array(100).fill(0x61), 0xff)).finish())],
    ['surrogate', () => unmarshalEndpoint(ld(W(), 1, Uint8Array.of(0xed, 0xa0, 0x80)).finish())],
    ['overlong', () => unmarshalEndpoint(ld(W(), 1, Uint8Array.of(0xc0, 0xaf)).finish())],
    ['Ref.Path', () => unmarshalOpItem(ld(W(), 3, ld(W(), 2, bad).finish()).finish())],
    ['WatchReq.NodeName', () => unmarshalWatchReq(ld(W(), 1, bad).finish())],
  ];
  for (const [name, f] of cases) t.throws(f, name);
  t.throws(() => unmarshalService(Uint8Array.of(0x0a, 0x09, 0x61)), 'truncated');
});
