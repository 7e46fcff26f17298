/**
 * Fixture reading (src/sources/fixture.ts): every input form gives the same
 * canonical state, and bad input gives `file:line:col: reason`, small
 * fixtures and big kubectl dumps alike.
 */
import { readFileSync } from 'node:fs';
import t from 'tap';
import { CalloutError } from '../../src/errors.js';
import { fixtureText, parseFixture, type FixtureOptions } from '../../src/sources/fixture.js';
import { parseYamlSubset } from '../../src/sources/fixture/yaml-subset.js';
import { stateText } from '../../src/state.js';
import { stringify } from 'yaml';
import { blogJsonl, blogView, blogYaml } from '../helpers/fixtures.js';
import type { KObject } from '../helpers/kube-api-server.js';
import { node, service, slice } from '../helpers/kube-objects.js';
import { captureLog } from '../helpers/sink.js';

const parse = (text: string, file: string, opts: Partial<FixtureOptions> = {}) => stateText(parseFixture(text, file, { ...blogView, ...opts }));

function errorOf(text: string, file: string, opts: Partial<FixtureOptions> = {}): string {
  try {
    parseFixture(text, file, { ...blogView, ...opts });
  } catch (err) {
    if (err instanceof CalloutError && err.code === 'input') return err.message;
    throw err;
  }
  return 'no error';
}

const two =
  '{"Service":{"Namespace":"a","Name":"x","Type":"ClusterIP","IPs":{"ClusterIPs":{"V4":["10.0.0.1"]}},"SessionAffinity":null},"Endpoints":null}\n' +
  '{"Service":{"Namespace":"b","Name":"y","Type":"ClusterIP","SessionAffinity":{"ClientIP":{"TimeoutSeconds":5}}},"Endpoints":[{"IPs":{"V4":["10.1.0.1"]},"Local":true,"PortOverrides":[{"Port":80}],"Scopes":{"Internal":true,"External":true}}]}\n';

t.test('NDJSON as kpng-json prints it, blank lines ignored', async (t) => {
  t.equal(parse(blogJsonl, 'x.jsonl'), blogJsonl);
  t.equal(parse('\n' + two.replace('\n', '\n\n  \r\n'), 'x.jsonl'), two);
  t.equal(parse(two, 'x.ndjson'), two);
  t.equal(parse(two, 'no-extension'), two, 'sniffed');
  t.equal(parse(two, 'x.json'), two, 'several lines in a .json file');
  t.equal(parse('', 'x.jsonl'), '', 'empty: the empty state');
});

t.test('kpng-json items keep their order and are printed canonically', async (t) => {
  // Out of path order, keys reordered, zero values spelled out, pretty-printed: printed as kpng-json would.
  const messy = `[
  {"Endpoints": [{"Scopes": {"External": true, "Internal": false}, "IPs": {"V4": ["10.1.0.1"]}, "Local": false}],
   "Service": {"Name": "z", "Namespace": "b", "Ports": [{"Port": 80, "Protocol": 1, "Name": ""}], "MapIP": false}},
  {"Service": {"Namespace": "a", "Name": "a", "IPs": {"ClusterIPs": {}, "Headless": true}, "Labels": {"b": "1", "a": "<&>"}}}
]`;
  t.equal(
    parse(messy, 'items.json'),
    '{"Service":{"Namespace":"b","Name":"z","Ports":[{"Protocol":1,"Port":80}],"SessionAffinity":null},"Endpoints":[{"IPs":{"V4":["10.1.0.1"]},"Scopes":{"External":true}}]}\n' +
      '{"Service":{"Namespace":"a","Name":"a","Labels":{"a":"\\u003c\\u0026\\u003e","b":"1"},"IPs":{"ClusterIPs":{},"Headless":true},"SessionAffinity":null},"Endpoints":null}\n',
  );
  t.equal(parse(JSON.stringify(JSON.parse(blogJsonl)), 'one-item.json'), blogJsonl, 'a single item');
  t.equal(parse('[]', 'empty.json'), '');
  t.equal(parse(`- Service: {Namespace: a, Name: x}\n  Endpoints: null\n`, 'items.yaml'), '{"Service":{"Namespace":"a","Name":"x","SessionAffinity":null},"Endpoints":null}\n', 'items in YAML');
});

t.test('manifests: YAML documents, kind List, typed lists, JSON', async (t) => {
  t.equal(parse(blogYaml, 'kpng-example.yaml'), blogJsonl, 'YAML documents');
  const objs = blogYaml
    .split(/^---$/m)
    .map((d) => d.trim());
  // kubectl get svc,endpointslices -A -o yaml
  const indent = (s: string) => s.split('\n').filter((l) => !l.startsWith('#')).map((l, i) => (i === 0 ? '- ' : '  ') + l).join('\n');
  const list = `apiVersion: v1\nkind: List\nmetadata:\n  resourceVersion: ""\nitems:\n${objs.map(indent).join('\n')}\n`;
  t.equal(parse(list, 'list.yaml'), blogJsonl, 'kind: List');
  t.equal(parse(list, 'list.yml'), blogJsonl, '.yml');
  // The same List as JSON (kubectl get -o json), pretty-printed; and sniffed without extension.
  const { parse: yparse } = await import('yaml');
  const json = JSON.stringify(yparse(list), null, 2);
  t.equal(parse(json, 'list.json'), blogJsonl, 'JSON List');
  t.equal(parse(json, 'list'), blogJsonl, 'JSON List, sniffed');
  t.equal(parse(JSON.stringify(yparse(list)), 'list.txt'), blogJsonl, 'one-line JSON List');
  // Typed lists (kubectl get --raw) leave kind/apiVersion out of the items.
  const l = yparse(list) as { items: Array<Record<string, unknown>> };
  const strip = (o: Record<string, unknown>) => Object.fromEntries(Object.entries(o).filter(([k]) => k !== 'kind' && k !== 'apiVersion'));
  const svcList = { apiVersion: 'v1', kind: 'ServiceList', items: l.items.filter((o) => o.kind === 'Service').map(strip) };
  const sliceList = { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSliceList', items: l.items.filter((o) => o.kind === 'EndpointSlice').map(strip) };
  t.equal(parse(JSON.stringify([svcList, sliceList]), 'typed.json'), blogJsonl, 'ServiceList + EndpointSliceList');
  t.equal(parse(`${JSON.stringify(svcList)}\n${JSON.stringify(sliceList)}\n`, 'typed.jsonl'), blogJsonl, 'one object per line');
  t.equal(parse('# nothing\n---\n---\n', 'empty.yaml'), '', 'empty documents');
});

t.test('other kinds are logged once each, with their position', async (t) => {
  const log = captureLog();
  const yaml = `${blogYaml}---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kpng-alpine
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: cm, namespace: kube-system}
`;
  t.equal(parse(yaml, 'fixtures/mixed.yaml', { logger: log.logger }), blogJsonl);
  t.same(log.matching(/ignoring/), [
    'kpng-callout info: fixtures/mixed.yaml:117:1: ignoring apps/v1 DaemonSet kpng-alpine: not a v1 Service, discovery.k8s.io/v1 EndpointSlice or v1 Node',
    'kpng-callout info: fixtures/mixed.yaml:125:3: ignoring v1 ConfigMap kube-system/cm: not a v1 Service, discovery.k8s.io/v1 EndpointSlice or v1 Node',
  ]);
});

t.test('bad input: file, line, column and reason', async (t) => {
  t.equal(errorOf('apiVersion: v1\nkind: Service\nmetadata:\n  name: x\n   bad: 1\n', 'fixtures/bad.yaml'), 'fixtures/bad.yaml:4:9: Nested mappings are not allowed in compact mappings');
  t.equal(errorOf('a: 1\na: 2\n', 'dup.yaml'), 'dup.yaml:2:1: Map keys must be unique');
  t.equal(errorOf('kind: Service\nspec: [1, 2\n', 'flow.yaml'), 'flow.yaml:3:1: Flow sequence in block collection must be sufficiently indented and end with a ]');
  t.equal(
    errorOf('apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  ports:\n  - port: http\n', 'fixtures/svc.yaml'),
    'fixtures/svc.yaml:6:11: spec.ports[0].port: expected an integer, got "http"',
  );
  t.equal(errorOf('apiVersion: v1\nkind: Service\nmetadata:\n  namespace: x\n', 'noname.yaml'), 'noname.yaml:4:3: metadata.name: missing name');
  t.equal(
    errorOf(`apiVersion: v1\nkind: List\nitems:\n- apiVersion: discovery.k8s.io/v1\n  kind: EndpointSlice\n  metadata: {name: s, labels: {kubernetes.io/service-name: kpng-example}}\n  endpoints:\n  - addresses: [10.0.0.1]\n    conditions: {ready: "yes"}\n`, 'list.yaml'),
    'list.yaml:9:25: endpoints[0].conditions.ready: expected true or false, got "yes"',
    'an EndpointSlice of a Service that is not in the fixture is checked too',
  );
  // kubectl prints `kind: List` after the items: a dump cut short (kubectl killed, a pipe closed) has none, and
  // read as "not a state" it would be the empty state, whose run deletes every rule.
  const dump = readFileSync('fixtures/dual-stack-cluster.yaml', 'utf8');
  t.equal(errorOf(dump.slice(0, dump.lastIndexOf('kind: List')), 'cut.yaml'), 'cut.yaml:10:1: a document with items but no kind: a List cut short? (kubectl prints kind: List after its items); give the whole dump');
  t.equal(errorOf('{"apiVersion": "v1", "items": []}', 'cut.json'), 'cut.json:1:1: a document with items but no kind: a List cut short? (kubectl prints kind: List after its items); give the whole dump');
  t.equal(errorOf('- 1\n- 2\n', 'scalars.yaml'), 'scalars.yaml:1:3: expected a Kubernetes object, got 1');
  t.equal(errorOf('just text\n', 'text.yaml'), 'text.yaml:1:1: expected a Kubernetes object, got "just text"');
  t.equal(errorOf('a: *nope\n', 'alias.yaml'), 'alias.yaml:1:1: Unresolved alias (the anchor must be set before the alias): nope');
  // NDJSON: the line of the bad item, the column in it.
  const lines = two.split('\n');
  t.equal(errorOf(`${lines[0]}\n\n{"Service":{"Name":"x",}}\n`, 'fixtures/bad.jsonl'), "fixtures/bad.jsonl:3:24: Expected double-quoted property name in JSON");
  t.equal(errorOf(`${lines[0]}\n{"Service":{"Name":"x","Ports":[{"Port":"80"}]}}\n`, 'p.jsonl'), 'p.jsonl:2:41: Service.Ports[0].Port: expected an integer, got "80"');
  t.equal(errorOf('{"Service":{"Name":"x","Lables":{}}}\n', 'typo.jsonl'), 'typo.jsonl:1:33: Service.Lables: unknown field "Lables" (expected one of Namespace, Name, Type, Labels, Annotations, IPs, IPFilters, MapIP, Ports, ExternalTrafficToLocal, SessionAffinity, InternalTrafficToLocal, HealthCheckNodePort)');
  t.equal(errorOf('{"Endpoints":null}\n{"Service":{"Name":"x"}}\n', 'nosvc.jsonl'), 'nosvc.jsonl:1:1: Service: missing Service');
  t.equal(errorOf('{"Service":{"Name":"x"},"Endpoints":[null]}\n', 'null.jsonl'), 'null.jsonl:1:38: Endpoints[0]: expected an endpoint, got null');
  t.equal(errorOf('{"Service":{"Namespace":"a"}}\n', 'n.jsonl'), 'n.jsonl:1:12: Service.Name: missing Service name');
  t.equal(errorOf('not json\n', 'x.jsonl'), "x.jsonl:1:2: Unexpected token 'o' in JSON");
  // A JSON document: line and column in it.
  t.equal(errorOf('[\n  {"Service": {"Name": "a"}},\n  {"Service": {"Name": "b"}\n]\n', 'items.json'), "items.json:4:1: Expected ',' or '}' after property value in JSON");
  t.equal(errorOf('{\n  "kind": "List",\n  "items": [\n    {"kind": "Service", "apiVersion": "v1", "metadata": {"name": 7}}\n  ]\n}\n', 'list.json'), 'list.json:4:66: metadata.name: expected a string, got 7');
  t.equal(errorOf('{"kind": "List", "items": {}}', 'l.json'), 'l.json:1:27: items: expected a list');
  t.equal(errorOf('{"a": "\u0001"}', 'ctl.json'), 'ctl.json:1:8: Bad control character in string literal in JSON');
  t.equal(errorOf('[1, 2', 'eof.json'), "eof.json:1:6: Expected ',' or ']' after array element in JSON");
  t.equal(errorOf('{"a": 01}', 'num.json'), 'num.json:1:8: Unexpected number in JSON');
  t.equal(errorOf('nope', 'word.json'), "word.json:1:2: Unexpected token 'o' in JSON");
  t.equal(errorOf(`${lines[0]}\n- {kind: Service}\n`, 'mixed.json'), "mixed.json:2:2: No number after minus sign in JSON");
  t.equal(errorOf(`${two}{"apiVersion":"v1","kind":"Service","metadata":{"name":"x"}}\n`, 'mix.jsonl'), 'mix.jsonl:1:1: a kpng-json item ({"Service":…}) among Kubernetes objects: a fixture is either kpng-json output or manifests');
});

t.test('fixtureText: UTF-8 text passes; a NUL byte, bytes that are not UTF-8 or UTF-16 are not a text file', async (t) => {
  const textOf = (bytes: Buffer | string) => {
    try {
      return fixtureText(Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes, 'latin1'), 'f.yaml');
    } catch (err) {
      if (err instanceof CalloutError && err.code === 'input') return `error: ${err.message}`;
      throw err;
    }
  };
  const text = 'metadata:\n  annotations: {note: "é ✓ 𝄞 €"}\n';
  t.equal(textOf(Buffer.from(text)), text, 'every UTF-8 length');
  t.equal(textOf(Buffer.from('\ufeff' + text)), '\ufeff' + text, 'a byte order mark is left to parseFixture');
  t.equal(textOf(Buffer.alloc(0)), '');
  const not = (why: string) => `error: f.yaml: not a text file (${why}; fixtures are UTF-8 text)`;
  t.equal(textOf(Buffer.from([0x1f, 0x8b, 0x08, 0x00])), not('not UTF-8 at line 1, column 2'), 'gzip');
  t.equal(textOf(Buffer.concat([Buffer.from('a: 1\nb: "é'), Buffer.from([0x00]), Buffer.from('"\n')])), not('a NUL byte at line 2, column 6'), 'columns count characters');
  t.equal(textOf('a: 1\nname: caf\xe9\n'), not('not UTF-8 at line 2, column 10'), 'Latin-1');
  t.equal(textOf(Buffer.from([0x00, 0x61])), not('a NUL byte at line 1, column 1'));
  t.equal(textOf(Buffer.from('\ufeffa: 1\n', 'utf16le')), not('UTF-16; convert it with iconv -f UTF-16 -t UTF-8'), "PowerShell's >");
  t.equal(textOf(Buffer.from([0xfe, 0xff, 0x00, 0x61])), not('UTF-16; convert it with iconv -f UTF-16 -t UTF-8'), 'UTF-16BE');
  // What a decoder must reject (RFC 3629): overlong forms, surrogates, past U+10FFFF, a cut sequence.
  for (const [bytes, what] of [
    [[0x61, 0xc0, 0xaf], 'overlong /'],
    [[0x61, 0xe0, 0x80, 0xaf], 'overlong 3-byte'],
    [[0x61, 0xed, 0xa0, 0x80], 'a surrogate'],
    [[0x61, 0xf4, 0x90, 0x80, 0x80], 'past U+10FFFF'],
    [[0x61, 0xe2, 0x82], 'cut at the end'],
    [[0x61, 0xe2, 0x28, 0xa1], 'a bad continuation byte'],
    [[0x61, 0x80], 'a lone continuation byte'],
  ] as const) {
    t.equal(textOf(Buffer.from(bytes)), not('not UTF-8 at line 1, column 2'), what);
  }
});

t.test('a JSON document that is not a state gives the empty state (replay warns about it), as an empty file does', async (t) => {
  const log = captureLog();
  for (const [text, file] of [['', 'e.jsonl'], ['{}', 'o.json'], ['{"a":1}', 'a.json'], ['[]', 'l.json'], ['# nothing\n', 'c.yaml']]) {
    t.equal(parse(text!, file!, { logger: log.logger }), '', `${file}: empty`);
  }
  t.same(log.matching(/ignoring/), [
    'kpng-callout info: o.json:1:1: ignoring (no kind) (no name): not a v1 Service, discovery.k8s.io/v1 EndpointSlice or v1 Node',
    'kpng-callout info: a.json:1:1: ignoring (no kind) (no name): not a v1 Service, discovery.k8s.io/v1 EndpointSlice or v1 Node',
  ]);
});

/** A cluster dump as kubectl prints it: `n` Services, a slice each, a Node; as one List or as documents. */
function clusterDump(n: number, form: 'list' | 'docs' | 'json', edit: (objs: KObject[]) => void = () => {}): string {
  const objs: KObject[] = [];
  for (let i = 0; i < n; i++) objs.push(service(`svc-${i}`, { clusterIP: `10.96.${i >> 8}.${i & 255}` }));
  for (let i = 0; i < n; i++) objs.push(slice(`svc-${i}-x`, `svc-${i}`, [{ ip: `10.1.${i >> 8}.${i & 255}`, node: 'n1' }, { ip: `10.2.${i >> 8}.${i & 255}`, node: 'n2' }]));
  objs.push(node('n1', 'zone-a'));
  edit(objs);
  const list = { apiVersion: 'v1', items: objs, kind: 'List', metadata: { resourceVersion: '' } };
  if (form === 'json') return JSON.stringify(list, null, 4);
  return form === 'list' ? stringify(list, { lineWidth: 0 }) : objs.map((o) => stringify(o, { lineWidth: 0 })).join('---\n');
}

/** `line:col` of an offset in `text`. */
function positionAt(text: string, at: number): string {
  const before = text.slice(0, at).split('\n');
  return `${before.length}:${before.at(-1)!.length + 1}`;
}

/** `line:col` of the first `needle` in `text`, `shift` characters on. */
const positionOf = (text: string, needle: string, shift = 0): string => positionAt(text, text.indexOf(needle) + shift);

t.test('a big kubectl dump (the fast YAML reader): the same state as its JSON; conversion errors placed in the item', async (t) => {
  const opts = { nodeName: 'n1', serviceProxyName: undefined };
  const expected = parse(clusterDump(400, 'json'), 'dump.json', opts);
  t.equal(expected.split('\n').length - 1, 400);
  for (const form of ['list', 'docs'] as const) {
    const text = clusterDump(400, form);
    t.equal(parseYamlSubset(text).length, form === 'list' ? 1 : 801, `${form}: read by the fast reader`);
    t.equal(parse(text, 'dump.yaml', opts), expected, `${form}: the JSON form's state`);
    const bad = clusterDump(400, form, (objs) => {
      ((objs[650]!.endpoints as Array<{ conditions: Record<string, unknown> }>)[1]!.conditions).ready = 'yes';
    });
    t.equal(
      errorOf(bad, 'dump.yaml', opts),
      `dump.yaml:${positionOf(bad, 'ready: yes', 'ready: '.length)}: endpoints[1].conditions.ready: expected true or false, got "yes"`,
      `${form}: an EndpointSlice's field`,
    );
    const noName = clusterDump(400, form, (objs) => {
      delete (objs[123]!.metadata as Record<string, unknown>).name;
    });
    // Its metadata (where a missing name is placed) is the last one before its clusterIP.
    const meta = noName.lastIndexOf('namespace: default', noName.indexOf('clusterIP: 10.96.0.123'));
    t.equal(errorOf(noName, 'dump.yaml', opts), `dump.yaml:${positionAt(noName, meta)}: metadata.name: missing name`, `${form}: a missing field`);
  }
});

t.test('a big kubectl dump: other kinds logged at their item; an error only the yaml library finds keeps its position', async (t) => {
  const log = captureLog();
  const withCm = clusterDump(300, 'list', (objs) => objs.splice(420, 0, { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'cm', namespace: 'kube-system' } }));
  parse(withCm, 'dump.yaml', { nodeName: 'n1', logger: log.logger, serviceProxyName: undefined });
  t.same(log.matching(/ignoring v1 ConfigMap/), [`kpng-callout info: dump.yaml:${positionOf(withCm, 'apiVersion: v1\n    kind: ConfigMap')}: ignoring v1 ConfigMap kube-system/cm: not a v1 Service, discovery.k8s.io/v1 EndpointSlice or v1 Node`]);
  const lines = clusterDump(300, 'list').split('\n');
  const at = lines.findIndex((l, i) => i > 2000 && l.trim().startsWith('clusterIP:'));
  const dup = lines.map((l, i) => (i === at ? `${l}\n${l}` : l)).join('\n');
  const col = lines[at]!.length - lines[at]!.trimStart().length + 1;
  t.equal(errorOf(dup, 'dump.yaml'), `dump.yaml:${at + 2}:${col}: Map keys must be unique`);
});

t.test('a Service path (namespace/name) twice among kpng-json items is refused, naming both lines', async (t) => {
  const dup = '{"Service":{"Namespace":"a","Name":"x","Type":"ClusterIP"},"Endpoints":null}\n{"Service":{"Namespace":"a","Name":"x","Type":"NodePort"},"Endpoints":null}\n';
  t.throws(() => parseFixture(dup, 'd.jsonl', blogView), { code: 'input', message: /^d\.jsonl:2:\d+: Service "a\/x" \(namespace\/name\) appears twice: first at line 1/ });
  // Two Services whose paths coincide (names Kubernetes would refuse): a state cannot tell them apart.
  const clash = '{"Service":{"Namespace":"a","Name":"b/c"},"Endpoints":null}\n{"Service":{"Namespace":"a/b","Name":"c"},"Endpoints":null}\n';
  t.throws(() => parseFixture(clash, 'c.jsonl', blogView), { code: 'input', message: /appears twice/ });
});

t.test('a list inside a list, or nested deeply, is bad input (file:line:col), not a crash', async (t) => {
  t.equal(errorOf('[[{"Service":{"Namespace":"a","Name":"b"}}]]', 'n.json'), 'n.json:1:2: expected a Kubernetes object, got a list');
  const deep = '['.repeat(20000) + ']'.repeat(20000);
  t.match(errorOf(deep, 'deep.json'), /^deep\.json:1:2: expected a Kubernetes object, got a list$/);
});

t.test('a long string where an object was expected is cut in the message', async (t) => {
  const text = 'not yaml at all '.repeat(10000);
  const msg = errorOf(text, 'big.txt');
  t.ok(msg.length < 300, `short message (${msg.length} characters)`);
  t.match(msg, /^big\.txt:1:1: expected a Kubernetes object, got "not yaml at all .*…" \(\d+ characters\)$/);
});

t.test('YAML nested too deeply for the readers is bad input with its place, not an internal error', async (t) => {
  t.match(errorOf('['.repeat(3000) + ']'.repeat(3000), 'deep.yaml'), /^deep\.yaml:1:\d+: nested too deeply$/);
  t.match(errorOf('{a: '.repeat(3000) + '1' + '}'.repeat(3000), 'deep.yaml'), /^deep\.yaml:1:\d+: nested too deeply$/);
  // block style: the subset reader recurses too
  const blockMap = Array.from({ length: 20000 }, (_, i) => `${' '.repeat(i)}a:`).join('\n') + ' 1\n';
  t.match(errorOf(blockMap, 'deep.yaml'), /^deep\.yaml:\d+:\d+: nested too deeply$/);
  t.match(errorOf('- '.repeat(20000) + '1\n', 'deep.yaml'), /^deep\.yaml:1:\d+: nested too deeply$/);
});
