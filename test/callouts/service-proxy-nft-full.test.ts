/**
 * callouts/lib/service-proxy-nft-full.mjs, the node planner of a full state,
 * against jq and awk (the callout's DRY_RUN, and its awk planner as a run
 * calls it): for varied states, 240 random Services and 40 randomly bent
 * states, its script makes the same table (test/helpers/nft-script-model.ts),
 * with the same conntrack deletions and the same log lines (destinations two
 * Services claim, second lines); a state it is not sure of, it leaves to them
 * (exit 3) and writes nothing nft would apply. No root: nothing is applied
 * here (test/e2e/callouts/service-proxy-planners.test.ts applies both; the
 * real-traffic suite plans with node). Needs jq.
 */
import t, { type Test } from 'tap';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { missingTools, runCommand } from '../helpers/command.js';
import { tempDir } from '../helpers/files.js';
import { repoPath } from '../helpers/fixtures.js';
import { scriptModel } from '../helpers/nft-script-model.js';
import { below, prng } from '../helpers/random.js';
import { run } from '../helpers/service-proxy-lines.js';
import { serviceObject, stateText } from '../helpers/service-states.js';
import { VARIED, randomState } from '../helpers/service-proxy-varied.js';

const NFT = repoPath('callouts/service-proxy-nft');
const FULL = repoPath('callouts/lib/service-proxy-nft-full.mjs');
const noJq = missingTools(['jq']).length > 0 ? 'jq is missing (apt-get install jq)' : false;

/** The node planner on `state`: exit code, script, conntrack lines, stderr. */
async function nodePlan(dir: string, state: string, oldudp = '') {
  writeFileSync(join(dir, 'state'), state);
  writeFileSync(join(dir, 'ct'), '');
  if (oldudp) writeFileSync(join(dir, 'old'), oldudp);
  // its script on fd 4, as the callout runs it
  const r = await runCommand('sh', ['-c', 'exec node "$@" 4>&1', 'sh', FULL, join(dir, 'state'), oldudp ? join(dir, 'old') : '', join(dir, 'ct')]);
  return { ...r, ct: readFileSync(join(dir, 'ct'), 'utf8') };
}

/** jq and awk on `state`, as the callout runs them per run (not dry: with the kernel's UDP sets `oldudp`). */
async function awkPlan(dir: string, state: string, oldudp: string) {
  writeFileSync(join(dir, 'state'), state);
  writeFileSync(join(dir, 'old'), oldudp);
  const sh = `here=$1; d=$2; . "$here/lib/allip-plan.sh"; rm -rf "$d/el"; mkdir "$d/el"; : >"$d/awk-ct"
jq -nrR --argjson fast true --argjson framed false -f "$here/lib/service-proxy-nft.jq" <"$d/state" |
LC_ALL=C awk -v prog=service-proxy-nft -v table=kpng_service_proxy -v framed=0 -v input=full -v dry=0 \\
  -v script="$d/awk-script" -v ctfile="$d/awk-ct" -v oldudp="$d/old" -v eldir="$d/el" \\
  -v tablefile="$here/lib/service-proxy-nft-table.nft" \\
  "$allip_awk_lib$(cat "$here/lib/service-proxy-nft.awk" "$here/lib/service-proxy-nft-chains.awk" "$here/lib/service-proxy-nft-changes.awk" "$here/lib/service-proxy-nft-input.awk")"`;
  const r = await runCommand('sh', ['-c', sh, 'sh', repoPath('callouts'), dir]);
  return { ...r, ct: readFileSync(join(dir, 'awk-ct'), 'utf8') };
}

const sorted = (s: string) => s.split('\n').filter(Boolean).sort();

/** Asserts that the node planner plans `state` as jq and awk do. */
async function samePlan(t: Test, dir: string, state: string, what: string) {
  const a = await run(NFT, state, { DRY_RUN: '1' });
  t.equal(a.code, 0, `${what}: jq and awk plan it`, { stderr: a.stderr });
  const n = await nodePlan(dir, state);
  t.equal(n.code, 0, `${what}: the node planner plans it`, { stderr: n.stderr });
  t.match(n.stderr, /full state: \d+ Services planned \(node\)/);
  t.ok(n.stdout.endsWith('\n}\n'), 'its script closes the table last');
  t.same(scriptModel(n.stdout), scriptModel(a.stdout), `${what}: the same table`);
}

t.test('the node planner makes the table jq and awk make', { skip: noJq }, async (t) => {
  const dir = tempDir(t, 'kpng-spn-full-');
  await samePlan(t, dir, stateText(VARIED), 'varied Services');
  // addresses in other spellings than inet_ntop's, the IPv4 notation it keeps
  const odd = serviceObject({ name: 'odd', clusterIPs: { v6: ['2001:DB8:0:0:0:0:0:5'] }, externalIPs: { v6: ['::ffff:192.0.2.9', '2001:db8:0:0:1::'] }, ports: [{ port: 80 }] });
  odd.Endpoints = [{ IPs: { V6: ['2001:0db8:0001:0000:0000:0000:0000:0002'] } }, { IPs: { V4: ['198.51.100.2'], V6: ['::'] }, Scopes: null }];
  await samePlan(t, dir, stateText([odd]), 'IPv6 spellings, endpoints without Scopes');
  await samePlan(t, dir, '', 'an empty state');
  await samePlan(t, dir, '\n  \n' + stateText(VARIED.slice(0, 2)) + '\r\n', 'blank lines');
});

t.test('300 random Services: the same table, and the same conntrack deletions', { skip: noJq }, async (t) => {
  const dir = tempDir(t, 'kpng-spn-full-');
  // distinct cluster IPs and NodePorts (two Services claiming one: the next test)
  const state = randomState(240, 7);
  await samePlan(t, dir, state, '240 random Services');
  // the kernel's UDP sets as `nft list set` prints them: what the last state had
  const old = [
    'table inet kpng_service_proxy {',
    '\tset udp4 {',
    '\t\ttype ipv4_addr . inet_service . ipv4_addr . inet_service',
    '\t\telements = { 192.0.2.1 . 80 . 198.51.100.9 . 8080, 192.0.2.1 . 81 . 0.0.0.0 . 0,',
    '\t\t\t     0.0.0.0 . 30004 . 198.51.100.2 . 8000, 192.0.2.2 . 80 . 198.51.100.2 . 80 }',
    '\t}',
    '}',
    'table inet kpng_service_proxy {',
    '\tset udp6 {',
    '\t\ttype ipv6_addr . inet_service . ipv6_addr . inet_service',
    '\t\telements = { 2001:db8:1::1 . 80 . 2001:db8:1::2 . 80 }',
    '\t}',
    '}',
    '',
  ].join('\n');
  for (const [what, s] of [
    ['random', state],
    ['varied', stateText(VARIED)],
  ] as const) {
    const a = await awkPlan(dir, s, old);
    t.equal(a.code, 0, `${what}: awk plans it`, { stderr: a.stderr });
    const n = await nodePlan(dir, s, old);
    t.equal(n.code, 0, `${what}: node plans it`, { stderr: n.stderr });
    t.same(sorted(n.ct), sorted(a.ct), `${what}: the same conntrack deletions`);
    t.ok(sorted(a.ct).length > 0, `${what}: some`);
  }
  const first = await nodePlan(dir, stateText(VARIED), '');
  const firstAwk = await awkPlan(dir, stateText(VARIED), '');
  t.same(sorted(first.ct), sorted(firstAwk.ct), 'no table before: the same (none for new destinations)');
});

t.test('a state the node planner is not sure of goes to jq and awk (exit 3, no table)', async (t) => {
  const dir = tempDir(t, 'kpng-spn-full-');
  const good = JSON.stringify(serviceObject(VARIED[0]!));
  const bent = (f: (o: ReturnType<typeof serviceObject>) => void) => {
    const o = serviceObject(VARIED[0]!);
    f(o);
    return JSON.stringify(o);
  };
  const deep = `{"Service":{"Namespace":"a","Name":"b","X":${'['.repeat(300)}${']'.repeat(300)}},"Endpoints":null}`;
  const cases: Array<[string, string]> = [
    ['a name Kubernetes refuses', bent((o) => (o.Service.Name = 'web;$(x)'))],
    ['an address that is not one', bent((o) => ((o.Service.IPs as { ClusterIPs: { V4: string[] } }).ClusterIPs.V4 = ['192.0.2.300']))],
    ['a port given as a string', bent((o) => ((o.Service.Ports as Array<Record<string, unknown>>)[0]!.Port = '80'))],
    ['a fraction', bent((o) => ((o.Service.Ports as Array<Record<string, unknown>>)[0]!.Port = 80.5))],
    ['a port listed twice', bent((o) => (o.Service.Ports as unknown[]).push({ Protocol: 1, Port: 80 }))],
    ['an affinity timeout out of range', bent((o) => (o.Service.SessionAffinity = { ClientIP: { TimeoutSeconds: 90000 } }))],
    ['a Previous line', `{"Previous":${good}}`],
    ['a line that is not JSON', '{"Service":'],
    ['a line that is not a Service', '[1,2]'],
    ['nesting jq does not read', deep],
  ];
  for (const [what, line] of cases) {
    const r = await nodePlan(dir, `${good}\n${line}\n`);
    t.equal(r.code, 3, what, { stderr: r.stderr });
    t.notOk(r.stdout.endsWith('\n}\n'), `${what}: the table not closed (nft applies nothing)`);
  }
});

t.test('a destination two Services claim, a second line for a Service: the same table, the same log', { skip: noJq }, async (t) => {
  const dir = tempDir(t, 'kpng-spn-full-');
  const web = serviceObject(VARIED[0]!);
  const twin = serviceObject({ ...VARIED[0]!, name: 'web-other', lbIPs: { v4: ['203.0.113.99'] } });
  // a long name: awk's log cuts names at 100 bytes
  const long = serviceObject({ ...VARIED[1]!, namespace: 'n'.repeat(63), name: 'x'.repeat(63) });
  const longTwin = serviceObject({ ...VARIED[1]!, name: 'sticky-other' });
  const state = stateText([web, twin, long, longTwin]) + JSON.stringify(web) + '\n';
  const a = await run(NFT, state, { DRY_RUN: '1' });
  const n = await nodePlan(dir, state);
  t.equal(n.code, 0, { stderr: n.stderr });
  t.same(scriptModel(n.stdout), scriptModel(a.stdout), 'the same table (dups4, dupsnp4 included)');
  const logged = (e: string) => e.split('\n').filter((l) => l.includes('skipping'));
  t.ok(logged(a.stderr).length >= 4, 'awk logs them');
  t.same(logged(n.stderr), logged(a.stderr), 'node logs the same lines');
  t.match(n.stdout, /dupsnp4/);
});

t.test('SERVICE_PROXY_NFT_PLANNER other than auto, awk or node: exit 1, named', async (t) => {
  const r = await run(NFT, '', { DRY_RUN: '1', SERVICE_PROXY_NFT_PLANNER: 'fast' });
  t.equal(r.code, 1);
  t.match(r.stderr, /SERVICE_PROXY_NFT_PLANNER must be auto, awk or node, not "fast"; nothing changed/);
  t.equal(r.stdout, '');
});

t.test('40 bent states: node plans each as jq and awk do, or leaves it to them', { skip: noJq }, async (t) => {
  const dir = tempDir(t, 'kpng-spn-full-');
  const r = prng(11);
  const rnd = (k: number): number => below(r, k);
  // mostly values of the type the state gives (what node plans), now and then another
  const like = (v: unknown): unknown => {
    const pick = <T>(l: T[]): T => l[rnd(l.length)]!;
    if (rnd(8) === 0) return pick<unknown>([null, false, 80.5, '80', [], {}, 'x\ty', '192.0.2.300']);
    if (typeof v === 'number') return pick([0, 1, 2, 3, 80, 8080, 30080, 65535]);
    if (typeof v === 'boolean') return rnd(2) === 0;
    if (typeof v === 'string' && /^[0-9.]+$/.test(v)) return pick(['192.0.2.5', '192.0.2.10', '198.51.100.9', '203.0.113.7']);
    if (typeof v === 'string' && v.includes(':')) return pick(['2001:db8::5', '2001:DB8:0::a', '2001:db8:1::2', '::ffff:192.0.2.1']);
    if (typeof v === 'string') return pick(['', 'http', 'dns', 'a', 'metrics']);
    return null;
  };
  /** Every [parent, key] of a JSON value. */
  const slots = (v: unknown, out: Array<[Record<string, unknown>, string]> = []) => {
    if (v && typeof v === 'object') {
      for (const k of Object.keys(v)) {
        out.push([v as Record<string, unknown>, k]);
        slots((v as Record<string, unknown>)[k], out);
      }
    }
    return out;
  };
  let planned = 0;
  for (let i = 0; i < 40; i++) {
    // (a copy: serviceObject() shares the specs' arrays)
    const objs = VARIED.map((s) => JSON.parse(JSON.stringify(serviceObject(s))) as ReturnType<typeof serviceObject>);
    for (let b = 0; b <= rnd(3); b++) {
      const all = slots(objs[rnd(objs.length)]).filter(([p, k]) => k !== 'Namespace' && k !== 'Name' || !('Type' in p));
      const [parent, key] = all[rnd(all.length)]!;
      if (rnd(5) === 0 && !Array.isArray(parent)) delete parent[key];
      else parent[key] = like(parent[key]);
    }
    const state = objs.map((o) => JSON.stringify(o) + '\n').join('');
    const n = await nodePlan(dir, state);
    if (n.code === 3) continue;
    const a = await run(NFT, state, { DRY_RUN: '1' });
    t.equal(n.code, 0, `state ${i}: node plans it or leaves it`, { stderr: n.stderr });
    t.equal(a.code, 0, `state ${i}: so do jq and awk`, { stderr: a.stderr });
    t.same(scriptModel(n.stdout), scriptModel(a.stdout), `state ${i}: the same table`, { state });
    t.same(n.stderr.split('\n').filter((l) => l.includes('skipping')), a.stderr.split('\n').filter((l) => l.includes('skipping')), `state ${i}: the same log`);
    planned++;
  }
  t.ok(planned >= 12, `node planned ${planned} of the 40`);
});
