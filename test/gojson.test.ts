/**
 * The Go encoding/json-compatible encoder, checked against expectations
 * written by hand from the rules in kpng-localv1.md.
 */
import t from 'tap';
import { compareUtf8, encodeEndpoint, encodeIPSet, encodeLine, encodeService, encodeServiceEndpoints, goString } from '../src/gojson.js';

t.test('goString escapes as Go before 1.22', async (t) => {
  const cases: Array<[string, string]> = [
    ['', '""'],
    ['plain', '"plain"'],
    ['q"b\\', '"q\\"b\\\\"'],
    ['\n\r\t', '"\\n\\r\\t"'],
    ['\b\f', '"\\u0008\\u000c"'],
    ['\u0000\u0001\u001f', '"\\u0000\\u0001\\u001f"'],
    ['<a href="x">&amp;</a>', '"\\u003ca href=\\"x\\"\\u003e\\u0026amp;\\u003c/a\\u003e"'],
    ['\u2028|\u2029', '"\\u2028|\\u2029"'],
    ['\x7f', '"\x7f"'], // DEL raw
    ['é ü 日本 😀 \uFFFD', '"é ü 日本 😀 \uFFFD"'], // non-ASCII raw
    ['/', '"/"'], // Go does not escape the slash
  ];
  // Test names in plain ASCII: U+2028 in a name would break the TAP stream.
  const name = (s: string): string => s.replace(/[^\x20-\x7e]/gu, (c) => `U+${c.codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}`);
  for (const [input, want] of cases) t.equal(goString(input), want, name(input));
});

t.test('compareUtf8 orders as UTF-8 bytes', async (t) => {
  const keys = ['\u{1F600}', '\uFF21', 'b', 'a', 'A', '\u00e9', '\uE000', '\uD7FF', ''];
  // UTF-8: "" < A < a < b < é (C3 A9) < U+D7FF (ED) < U+E000 (EE) < U+FF21 (EF) < U+1F600 (F0)
  t.same([...keys].sort(compareUtf8), ['', 'A', 'a', 'b', '\u00e9', '\uD7FF', '\uE000', '\uFF21', '\u{1F600}']);
  t.ok(compareUtf8('a', 'ab') < 0);
  t.equal(compareUtf8('same', 'same'), 0);
});

t.test('Service: declaration order, omitempty, oneof always present', async (t) => {
  t.equal(encodeService({}), '{"SessionAffinity":null}');
  t.equal(
    encodeService({
      HealthCheckNodePort: 30000,
      InternalTrafficToLocal: true,
      SessionAffinity: { ClientIP: { TimeoutSeconds: 10 } },
      ExternalTrafficToLocal: true,
      Ports: [{ TargetPortName: 'tp', TargetPort: 5, NodePort: 4, Port: 3, Protocol: 2, Name: 'n' }],
      MapIP: true,
      IPFilters: [{ SourceRanges: ['10.0.0.0/8'], TargetIPs: { V4: ['1.2.3.4'] } }],
      IPs: { Headless: true, LoadBalancerIPs: { V4: ['5.6.7.8'] }, ExternalIPs: {}, ClusterIPs: { V6: ['::1'], V4: ['10.0.0.1'] } },
      Annotations: { b: '2', a: '1' },
      Labels: { z: '', y: 'x' },
      Type: 'T',
      Name: 'N',
      Namespace: 'NS',
    }),
    '{"Namespace":"NS","Name":"N","Type":"T","Labels":{"y":"x","z":""},"Annotations":{"a":"1","b":"2"},' +
      '"IPs":{"ClusterIPs":{"V4":["10.0.0.1"],"V6":["::1"]},"ExternalIPs":{},"LoadBalancerIPs":{"V4":["5.6.7.8"]},"Headless":true},' +
      '"IPFilters":[{"TargetIPs":{"V4":["1.2.3.4"]},"SourceRanges":["10.0.0.0/8"]}],"MapIP":true,' +
      '"Ports":[{"Name":"n","Protocol":2,"Port":3,"NodePort":4,"TargetPort":5,"TargetPortName":"tp"}],' +
      '"ExternalTrafficToLocal":true,"SessionAffinity":{"ClientIP":{"TimeoutSeconds":10}},"InternalTrafficToLocal":true,"HealthCheckNodePort":30000}',
  );
  t.equal(encodeService({ SessionAffinity: { ClientIP: {} } }), '{"SessionAffinity":{"ClientIP":{}}}');
  t.equal(encodeService({ Labels: {}, Ports: [], IPFilters: [], Name: '', MapIP: false }), '{"SessionAffinity":null}', 'empty is omitted');
  t.equal(encodeService({ Ports: [{ Protocol: 9 }] }), '{"Ports":[{"Protocol":9}],"SessionAffinity":null}', 'unknown enum as number');
  t.equal(encodeService({ Labels: { '\u{1F600}': 'a', '\uFF21': 'b' } }), '{"Labels":{"\uFF21":"b","\u{1F600}":"a"},"SessionAffinity":null}');
  t.equal(encodeService({ Labels: { '<k>': 'v&' } }), '{"Labels":{"\\u003ck\\u003e":"v\\u0026"},"SessionAffinity":null}', 'keys are escaped too');
});

t.test('Endpoint and IPSet', async (t) => {
  t.equal(encodeEndpoint({}), '{}');
  t.equal(
    encodeEndpoint({ Scopes: { External: true, Internal: true }, PortOverrides: [{ Port: 80, Name: 'h' }, { Port: 9 }], Local: true, IPs: { V4: ['1.1.1.1'] }, Hostname: 'x' }),
    '{"Hostname":"x","IPs":{"V4":["1.1.1.1"]},"Local":true,"PortOverrides":[{"Name":"h","Port":80},{"Port":9}],"Scopes":{"Internal":true,"External":true}}',
  );
  t.equal(encodeEndpoint({ Scopes: {} }), '{"Scopes":{}}');
  t.equal(encodeIPSet({ V4: [], V6: ['::'] }), '{"V6":["::"]}');
});

t.test('lines', async (t) => {
  t.equal(encodeLine('{"S":1}', []), '{"Service":{"S":1},"Endpoints":null}\n');
  t.equal(encodeLine('{}', ['{"a":1}', '{"b":2}']), '{"Service":{},"Endpoints":[{"a":1},{"b":2}]}\n');
  t.equal(
    encodeServiceEndpoints({ Service: { Name: 'a' }, Endpoints: [{ Local: true }] }),
    '{"Service":{"Name":"a","SessionAffinity":null},"Endpoints":[{"Local":true}]}\n',
  );
});
