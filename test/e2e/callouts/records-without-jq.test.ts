/**
 * service-proxy-nft and kpng-example-allip-nft read a per-run change set
 * without jq when they can (callouts/lib/json-flat.awk and json-records.awk, then
 * service-proxy-nft-records.awk or allip-nft-records.awk): whatever such a
 * reader accepts, it must turn into exactly the records the callout's jq
 * program writes, and whatever it is not sure of it must leave to jq, with
 * the whole input copied for it. Checked here line by line against jq
 * itself on canonical lines, on 600 lines bent at random (types, nulls,
 * missing and duplicate keys, numbers, whitespace, escapes, hostile
 * strings), and end to end through service-proxy-nft with DRY_RUN (the
 * all-ip one needs the state it applied: allip-nft-changes.test.ts applies
 * its change sets for real). Needs jq and awk; skips, saying why, without them.
 */
import t from 'tap';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { missingTools, runCommand } from '../../helpers/command.js';
import { tempDir, shScript } from '../../helpers/files.js';
import { repoPath } from '../../helpers/fixtures.js';
import { prng } from '../../helpers/random.js';
import { stateText, type ServiceSpec } from '../../helpers/service-states.js';

const LIB = repoPath('callouts/lib');
const CALLOUT = repoPath('callouts/service-proxy-nft');

/** The text of the single-quoted shell variable `name` in `file` (a jq program). */
function shellVar(file: string, name: string): string {
  const m = new RegExp(`\\n${name}='([^']*)'\\n`).exec(readFileSync(file, 'utf8'));
  if (!m) throw new Error(`${file}: no ${name}='...'`);
  return m[1]!;
}
const ALLIP_JQ = shellVar(repoPath('callouts/lib/allip-plan.sh'), 'allip_jq_rows') + shellVar(repoPath('callouts/kpng-example-allip-nft'), 'jqprog');

/** A reader without jq, and the jq program whose records it must write. */
interface Reader {
  name: string;
  jqArgs: string[];
  awkFiles: string[];
  awkVars: Record<string, string>;
}

const READERS: Reader[] = [
  {
    name: 'service-proxy-nft',
    jqArgs: ['--argjson', 'fast', 'true', '-f', join(LIB, 'service-proxy-nft.jq')],
    awkFiles: ['json-flat.awk', 'json-records.awk', 'service-proxy-nft-records.awk'],
    awkVars: {},
  },
  ...['true', 'false'].map((lb) => ({
    name: `kpng-example-allip-nft (lb ${lb})`,
    jqArgs: ['--argjson', 'lb', lb, ALLIP_JQ],
    awkFiles: ['json-flat.awk', 'json-records.awk', 'allip-nft-records.awk'],
    awkVars: { lb },
  })),
];

const missing = missingTools(['jq', 'awk']);
if (missing.length) console.error(`# skipping the service-proxy-nft record tests: ${missing.join(', ')} missing (apt-get install jq mawk)`);

const SPECS: ServiceSpec[] = [
  { name: 'web', clusterIPs: { v4: ['192.0.2.10'], v6: ['2001:db8::10'] }, ports: [{ name: 'http', port: 80, targetPort: 8080 }], endpoints: [{ pod: 'pod1' }, { pod: 'pod2', local: true }] },
  {
    namespace: 'telco',
    name: 'sip',
    clusterIPs: { v4: ['192.0.2.11'] },
    externalIPs: { v4: ['203.0.113.5', '203.0.113.6'], v6: ['2001:db8::5'] },
    lbIPs: { v4: ['198.51.100.9'] },
    ports: [
      { name: 'sip', protocol: 'UDP', port: 5060, nodePort: 30060 },
      { name: 'sips', protocol: 'TCP', port: 5061, nodePort: 30061, targetPortName: 'tls' },
      { protocol: 'SCTP', port: 9 },
    ],
    affinity: 600,
    externalTrafficToLocal: true,
    endpoints: [
      { pod: 'pod1', local: true, scopes: { internal: true }, portOverrides: [{ name: 'sips', port: 9443 }, { port: 7 }] },
      { pod: 'pod2', local: true, scopes: { external: true }, families: ['v4'] },
    ],
  },
  { name: 'headless', headless: true, ports: [{ port: 53, protocol: 'UDP' }], endpoints: [{ pod: 'pod1' }] },
  { name: 'empty', clusterIPs: { v4: ['192.0.2.12'] }, ports: [{ port: 443 }] },
  { name: 'aff-default', clusterIPs: { v4: ['192.0.2.13'] }, ports: [{ port: 1 }], affinity: 0, endpoints: [{ pod: 'pod2', scopes: {} }] },
];

const CANONICAL = stateText(SPECS).trimEnd().split('\n');
/** The canonical line of the Service named `name`. */
const lineOf = (name: string): string => CANONICAL.find((l) => l.includes(`"Name":"${name}"`))!;

const REPLACEMENTS: unknown[] = [null, false, true, 0, 7, 65535, 123456789012345, '', 'x', '198.51.100.1', [], {}, [null], ['203.0.113.9'], [7], { V4: ['192.0.2.9'] }, { Internal: true }, [{ Name: 'http', Port: 1 }]];

/** Every path (array of keys/indices) inside `v`. */
function paths(v: unknown, at: Array<string | number> = [], out: Array<Array<string | number>> = []): Array<Array<string | number>> {
  if (v && typeof v === 'object') {
    for (const [k, c] of Object.entries(v)) {
      const p = [...at, Array.isArray(v) ? Number(k) : k];
      out.push(p);
      paths(c, p, out);
    }
  }
  return out;
}

/** `obj` with the value at `path` replaced (or deleted when `value` is undefined). */
function bent(obj: unknown, path: Array<string | number>, value: unknown): unknown {
  const copy = structuredClone(obj) as Record<string | number, unknown>;
  let o = copy;
  for (const k of path.slice(0, -1)) o = o[k] as Record<string | number, unknown>;
  const last = path[path.length - 1]!;
  if (value === undefined && !Array.isArray(o)) delete o[last];
  else o[last] = value ?? null;
  return copy;
}

/** The lines of the corpus: canonical, Previous, bent, and written differently. */
function corpus(): string[] {
  const rnd = prng(20261127);
  const lines = [...CANONICAL, ...CANONICAL.map((l) => `{"Previous":${l}}`)];
  const objs = CANONICAL.map((l) => JSON.parse(l) as unknown);
  for (let i = 0; i < 600; i++) {
    let o = objs[Math.floor(rnd() * objs.length)];
    const previous = rnd() < 0.3;
    for (let n = 1 + Math.floor(rnd() * 2); n > 0; n--) {
      const ps = paths(o);
      const p = ps[Math.floor(rnd() * ps.length)]!;
      const r = rnd() < 0.15 ? undefined : REPLACEMENTS[Math.floor(rnd() * REPLACEMENTS.length)];
      o = bent(o, p, r);
    }
    lines.push(JSON.stringify(previous ? { Previous: o } : o));
  }
  // Written other ways: spaces, escapes, other numbers, duplicate keys, not Services.
  const c = lineOf('sip');
  lines.push(
    JSON.stringify(JSON.parse(c), null, 1).replaceAll('\n', ' '),
    ...['5060.0', '5.06e3', '-5060', '05060', '12345678901234567890'].map((n) => c.replace('"Port":5060', `"Port":${n}`)),
    ...['"s\\u0069p"', '"sip\\"; nft flush ruleset; \\""', '"s\\tip"', '"sïp"', '"sip","Name":"other"'].map((v) => c.replace('"Name":"sip"', `"Name":${v}`)),
    c.replace('"Namespace":"telco"', '"Namespace":"$(reboot)"'),
    c.replace('"Namespace":"telco"', '"Namespace":"a b;c|d`e`"'),
    c.replace('"Ports":[', '"Ports":[ '),
    c + ' ',
    ` ${c}`,
    c + '\r',
    c + '\u0000junk',
    c.slice(0, 40) + '\u0000' + c.slice(40),
    c.slice(0, -1),
    c + '}',
    c + ',{}',
    '{}',
    '[]',
    '"text"',
    '7',
    'null',
    '{"Previous":null}',
    '{"Previous":{"Service":{}}}',
    '{"Service":{}}',
    '{"Service":null,"Endpoints":[]}',
    '{"Service":{"Name":"x"},"Endpoints":{"a":{"IPs":{"V4":["192.0.2.1"]}}}}',
    'not json',
    '{"Service":{"Name":"x"}',
    '{"Service":{"Name":"x"}}}',
    '{"Service":{"Name":"x",}}',
    '{"Service":{"Name":tru}}',
    '{"Service":{"Name":"x"} "Endpoints":[]}',
  );
  return lines;
}

/** jq's records for `lines`, one per line (none is blank). */
async function jqRecords(reader: Reader, dir: string, lines: string[]): Promise<string[]> {
  const file = join(dir, 'all.ndjson');
  writeFileSync(file, lines.join('\n') + '\n');
  const r = await runCommand('sh', ['-c', 'f=$1; shift; jq -nrR --argjson framed false "$@" < "$f"', 'sh', file, ...reader.jqArgs]);
  if (r.code !== 0) throw new Error(`jq failed: ${r.stderr}`);
  const recs = r.stdout.split('\n');
  recs.pop();
  if (recs.pop() !== 'Z' || recs.length !== lines.length) throw new Error('jq: not one record per line, then Z');
  return recs;
}

/** The awk reader on `input`: its exit code, its records (when 0) and its copy of the input. */
async function awkRead(reader: Reader, dir: string, name: string, input: string, max = 131072): Promise<{ code: number | null; records: string; copy: string }> {
  const copy = join(dir, `${name}.copy`);
  const out = join(dir, `${name}.rec`);
  const vars = Object.entries({ ...reader.awkVars, copy, out, max: String(max) }).flatMap(([k, v]) => ['-v', `${k}=${v}`]);
  const r = await runCommand('awk', [...vars, ...reader.awkFiles.flatMap((f) => ['-f', join(LIB, f)])], {
    input,
    env: { ...process.env, LC_ALL: 'C' },
  });
  return { code: r.code, records: r.code === 0 ? readFileSync(out, 'utf8') : '', copy: readFileSync(copy, 'utf8') };
}

for (const reader of READERS) t.test(`${reader.name}: the awk reader writes exactly what jq writes, or leaves the input to jq`, { skip: missing.length > 0 && `${missing.join(', ')} missing` }, async (t) => {
  const dir = tempDir(t, 'kpsp-records-');
  const lines = corpus();
  const want = await jqRecords(reader, dir, lines);
  let accepted = 0;
  let acceptedBent = 0;
  const wrong: string[] = [];
  const badExit: string[] = [];
  const badCopy: string[] = [];
  const batch = 8;
  for (let i = 0; i < lines.length; i += batch) {
    const results = await Promise.all(lines.slice(i, i + batch).map((l, j) => awkRead(reader, dir, `l${i + j}`, l + '\n')));
    results.forEach((r, j) => {
      const n = i + j;
      if (r.copy !== lines[n] + '\n') badCopy.push(lines[n]!);
      if (r.code === 3) return;
      if (r.code !== 0) return void badExit.push(`${r.code}: ${lines[n]}`);
      accepted++;
      if (n >= CANONICAL.length * 2) acceptedBent++;
      if (r.records !== `${want[n]}\nZ\n`) wrong.push(`line ${lines[n]}\n awk ${r.records}\n jq  ${want[n]}`);
    });
  }
  t.same(wrong, [], 'every line the awk reader accepts has jq’s record, byte for byte');
  t.same(badExit, [], 'the awk reader exits 0 or 3, nothing else');
  t.same(badCopy, [], 'the copy always holds the whole input');
  t.ok(
    lines.slice(0, CANONICAL.length * 2).every((l) => !l.includes('\\')),
    'the canonical lines hold no escape',
  );
  const canon = await Promise.all(lines.slice(0, CANONICAL.length * 2).map((l, j) => awkRead(reader, dir, `c${j}`, l + '\n')));
  t.ok(
    canon.every((r) => r.code === 0),
    'every canonical line and its Previous form is read without jq',
  );
  t.ok(acceptedBent > 50, `many bent lines are read without jq too (${acceptedBent} of ${lines.length - CANONICAL.length * 2})`);
  t.ok(accepted < lines.length, 'and some are left to jq');
  // Escapes, non-ASCII text and duplicate keys are jq's; shell-looking text is plain text.
  const hostile: Array<[string, boolean]> = [
    ['nft flush ruleset', true],
    ['s\\tip', true],
    ['sïp', true],
    ['"Name":"other"', true],
    ['$(reboot)', false],
    ['a b;c|d', false],
  ];
  for (const [needle, toJq] of hostile) {
    const n = lines.findIndex((l) => l.includes(needle));
    const r = await awkRead(reader, dir, `h${n}`, lines[n]! + '\n');
    if (toJq) t.equal(r.code, 3, `left to jq: a line with ${needle}`);
    else t.equal(r.records, `${want[n]}\nZ\n`, `read as jq reads it: a line with ${needle}`);
  }
});

t.test('service-proxy-nft.jq: its fast records are those of its checked path, byte for byte', { skip: missing.length > 0 && `${missing.join(', ')} missing` }, async (t) => {
  const dir = tempDir(t, 'kpsp-records-');
  // and numbers arithmetic would rewrite (-0 as 0), and none as false
  const zero = '{"Service":{"Namespace":"a","Name":"z","Ports":[{"Protocol":1,"Port":80,"TargetPort":-0}],"SessionAffinity":{"ClientIP":{"TimeoutSeconds":-0}}},"Endpoints":[{"IPs":{"V4":["192.0.2.1"]},"PortOverrides":[{"Name":"","Port":-0}]}]}';
  const lines = [...corpus(), zero, `{"Previous":${zero}}`, zero.replace('"TargetPort":-0', '"NodePort":false')];
  const withFast = (f: string) => jqRecords({ ...READERS[0]!, jqArgs: ['--argjson', 'fast', f, '-f', join(LIB, 'service-proxy-nft.jq')] }, dir, lines);
  const fast = await withFast('true');
  const checked = await withFast('false');
  const wrong = lines.flatMap((l, i) => (fast[i] === checked[i] ? [] : [`line ${l}\n fast    ${fast[i]}\n checked ${checked[i]}`]));
  t.same(wrong, [], `every line of the corpus (${lines.length})`);
});

for (const reader of READERS.slice(0, 2)) t.test(`${reader.name}: the awk reader takes a whole input or none of it`, { skip: missing.length > 0 && `${missing.join(', ')} missing` }, async (t) => {
  const dir = tempDir(t, 'kpsp-records-');
  const two = `${CANONICAL[0]}\n\n${CANONICAL[1]}\n`;
  const r = await awkRead(reader, dir, 'two', two);
  t.equal(r.code, 0, 'two lines and a blank one: read');
  t.equal(r.records, `${(await jqRecords(reader, dir, [CANONICAL[0]!, CANONICAL[1]!])).join('\n')}\nZ\n`, 'their records, the blank line skipped as jq skips it');
  const mixed = await awkRead(reader, dir, 'mixed', `${CANONICAL[0]}\n${lineOf('sip').replace('"sip"', '"s\\u0069p"')}\n${CANONICAL[2]}\n`);
  t.equal(mixed.code, 3, 'one line it is not sure of: the whole input is left to jq');
  t.equal(mixed.copy.split('\n').length, 4, 'with every line in the copy');
  const big = CANONICAL.join('\n') + '\n';
  const over = await awkRead(reader, dir, 'over', big, big.length - 1);
  t.equal(over.code, 3, 'an input over the size limit is left to jq');
  t.equal(over.copy, big, 'copied whole');
  const noEnd = await awkRead(reader, dir, 'noeol', CANONICAL[0]!);
  t.equal(noEnd.code, 0, 'a last line without a newline is read');
  t.equal(noEnd.copy, `${CANONICAL[0]}\n`, 'and copied as a line');
});

t.test('service-proxy-nft: a change set read without jq gives the script jq’s reading gives', { skip: missing.length > 0 && `${missing.join(', ')} missing` }, async (t) => {
  const dir = tempDir(t, 'kpsp-records-');
  // jq that fails: a run that needs it fails, one that does not succeeds.
  const bin = join(dir, 'bin');
  await runCommand('mkdir', ['-p', bin]);
  shScript(bin, 'jq', 'echo "jq must not run" >&2; exit 1');
  const withoutJq = { ...process.env, PATH: `${bin}:${process.env.PATH ?? ''}` };
  const web = lineOf('web');
  const moved = web.replace(/"Hostname":"pod1","IPs":\{"V4":\["[^"]*"\]\}/, '"Hostname":"pod1","IPs":{"V4":["192.0.2.200"]}');
  t.not(moved, web, 'the change moves an endpoint');
  const plain = `{"Previous":${web}}\n${moved}\n{"Previous":${lineOf('empty')}}\n`;
  // The same change set with a member nothing reads that holds an escape: only jq reads it.
  const escaped = plain.replace('"Type":"ClusterIP"', '"Type":"ClusterIP","Note":"a\\"b"');
  const run = (input: string, env: NodeJS.ProcessEnv) => runCommand(CALLOUT, [], { input, env: { ...env, DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'changes' } });
  const fast = await run(plain, withoutJq);
  t.equal(fast.code, 0, 'a plain change set applies without running jq', { stderr: fast.stderr });
  t.notMatch(fast.stderr, /jq must not run/);
  const slow = await run(escaped, process.env);
  t.equal(slow.code, 0, 'the same change set with an escape applies through jq', { stderr: slow.stderr });
  t.ok(fast.stdout.length > 0, 'a script was written');
  t.equal(fast.stdout, slow.stdout, 'the two scripts are the same');
  const refused = await run(escaped, withoutJq);
  t.not(refused.code, 0, 'with the escape and a failing jq, the run fails (jq was needed)');
  const invalid = await run(`${plain}{"Service":\n`, process.env);
  t.equal(invalid.code, 1, 'invalid JSON in a change set: exit 1');
  t.match(invalid.stderr, /nothing changed/);
  t.equal(invalid.stdout, '', 'and no script');
});
