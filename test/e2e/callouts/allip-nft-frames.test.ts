/**
 * callouts/kpng-example-allip-nft's dry runs, fed directly (no root, no
 * kernel: only jq):
 *
 * - DRY_RUN of a persistent callout: a full frame, then change sets print
 *   only what changes; no temporary file left;
 * - per run: a change set needs a recorded state; KPNG_CALLOUT_INPUT must be
 *   full or changes; the iptables callout refuses change sets and frames;
 * - the persistent loop: frames in, acks on fd 3, bad frames answered with
 *   `error` while the loop goes on, exit 0 at end of input with no process
 *   or temporary file left.
 *
 * Change sets in the kernel: allip-nft-changes.test.ts; real traffic:
 * allip-nft-traffic.test.ts. Addresses: documentation ranges only.
 */
import t from 'tap';
import { readdirSync } from 'node:fs';
import { missingTools } from '../../helpers/command.js';
import { tempDir } from '../../helpers/files.js';
import { changeSet, full, IPT, NFT, runOnce, svcLine, type Svc } from '../../helpers/allip-nft-states.js';
import { groupMembers } from '../../helpers/procs.js';
import { frame, PersistentCallout } from '../../helpers/persistent-callout.js';
import { pollUntil } from '../../helpers/wait.js';

const noJq = missingTools(['jq']).length > 0;
if (noJq) console.error('# skipping nft change-set tests: jq is missing (apt-get install jq)');

t.test('dry runs of change sets and of a persistent callout', { skip: noJq ? 'jq is missing' : false }, async (t) => {
  const a: Svc = { name: 'a', x4: ['192.0.2.1'], x6: ['2001:db8:e::1'], l4: ['198.51.100.2'], l6: ['2001:db8:1::2'] };
  const a1: Svc = { ...a, l4: ['198.51.100.3'], l6: ['2001:db8:1::2', '2001:db8:1::3'] };
  const b: Svc = { name: 'b', x4: ['192.0.2.2'], l4: ['198.51.100.4', '198.51.100.5'] };
  const c: Svc = { ns: 'default-x', name: 'c', x4: ['192.0.2.1', '192.0.2.3'], l4: ['198.51.100.9'] };
  const s0 = [a];
  const s1 = [a1, b];
  const s2 = [a1, c];
  const T = 'inet kpng_allip';

  await t.test('persistent: a full frame, then change sets print only what changes', async (t) => {
    const tmp = tempDir(t, 'kpng-nft-dry-');
    const p = new PersistentCallout(NFT, undefined, { DRY_RUN: '1', TMPDIR: tmp });
    t.equal(await p.frame('full', full(s0)), 'ok', 'the full frame is acknowledged');
    t.equal(await p.frame('changes', changeSet(s0, s1)), 'ok', 'a change set is acknowledged');
    t.equal(await p.frame('changes', changeSet(s1, s2)), 'ok', 'a change set with a shared IP is acknowledged');
    t.equal(await p.frame('changes', changeSet(s2, [a1, { ...c, port: 9090 }])), 'ok', 'a change set that changes no mapping');
    t.equal(await p.frame('full', full(s2)), 'ok', 'a full frame again');
    t.same(await p.end(), { code: 0, signal: null }, 'exits 0 at end of input');

    const perRun = await runOnce(undefined, full(s0), { DRY_RUN: '1' });
    t.equal(perRun.code, 0);
    t.ok(p.stdout.startsWith(perRun.stdout), 'the full frame prints what a run with the full state prints');
    const rest = p.stdout.slice(perRun.stdout.length);
    const genless = rest.replace(/gen \{ \d+ \}/g, 'gen { H }').replace(/elements = \{ \d+ \}/g, 'elements = { H }');
    const fullS2 = (await runOnce(undefined, full(s2), { DRY_RUN: '1' })).stdout;
    t.equal(
      genless,
      [
        `delete element ${T} gen { H }`,
        `add element ${T} gen { H }`,
        `delete element ${T} dnat4 { 192.0.2.1 }`,
        `delete element ${T} dnat6 { 2001:db8:e::1 }`,
        `create element ${T} dnat4 { 192.0.2.1 : 198.51.100.3 }`,
        `create chain ${T} m6_2001_db8_e__1`,
        `add rule ${T} m6_2001_db8_e__1 dnat ip6 to numgen inc mod 2 map { 0 : 2001:db8:1::2, 1 : 2001:db8:1::3 }`,
        `create element ${T} multi6 { 2001:db8:e::1 : goto m6_2001_db8_e__1 }`,
        `create chain ${T} m4_192.0.2.2`,
        `add rule ${T} m4_192.0.2.2 dnat ip to numgen inc mod 2 map { 0 : 198.51.100.4, 1 : 198.51.100.5 }`,
        `create element ${T} multi4 { 192.0.2.2 : goto m4_192.0.2.2 }`,
        `delete element ${T} gen { H }`,
        `add element ${T} gen { H }`,
        `delete element ${T} multi4 { 192.0.2.2 }`,
        `delete chain ${T} m4_192.0.2.2`,
        `create element ${T} dnat4 { 192.0.2.3 : 198.51.100.9 }`,
        '',
      ].join('\n') + fullS2.replace(/elements = \{ \d+ \}/, 'elements = { H }'),
      'each change set is the incremental script; a change of no mapping prints nothing',
    );
    // The gen element: each change set swaps the hash the table holds for the new one,
    // and the hash of a state is the same however it was reached.
    const gens = [...p.stdout.matchAll(/(?:gen \{|elements = \{) (\d+) \}/g)].map((m) => m[1]);
    t.equal(gens.length, 6, 'full, two swaps, full');
    t.equal(gens[1], gens[0], 'the first change set starts from the full state hash');
    t.equal(gens[3], gens[2], 'the second starts where the first ended');
    t.equal(gens[5], gens[4], 'the full state reached by change sets has the hash of the same state in full');
    t.not(gens[2], gens[0], 'a change changes the hash');
    t.match(p.stderr, /"default-x\/c": skipping external IP 192\.0\.2\.1: already used by "default\/a"/, 'the first claim in kpng order ("/" first) wins');
    t.same(readdirSync(tmp), [], 'no temporary file left');
    t.end();
  });

  await t.test('per run: a change set needs a recorded state; the iptables callout refuses change sets', async (t) => {
    const dir = tempDir(t, 'kpng-nft-state-');
    const r = await runOnce(undefined, changeSet(s0, s1), { DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'changes', KPNG_ALLIP_NFT_STATE_DIR: dir });
    t.equal(r.code, 1, 'exits 1');
    t.equal(r.stdout, '', 'prints no script');
    t.match(r.stderr, /no applied state to apply a change set to/);
    const bad = await runOnce(undefined, full(s0), { DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'diff' });
    t.equal(bad.code, 1, 'an unknown KPNG_CALLOUT_INPUT: exit 1');
    t.match(bad.stderr, /KPNG_CALLOUT_INPUT must be full or changes/);
    const ipt = await runOnce(undefined, changeSet(s0, s1), { DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'changes' }, IPT);
    t.equal(ipt.code, 1, 'kpng-example-allip: exit 1 on a change set');
    t.equal(ipt.stdout, '', 'kpng-example-allip: prints nothing');
    t.match(ipt.stderr, /kpng-example-allip: a change set \(KPNG_CALLOUT_INPUT=changes\) cannot be applied/);
    const iptBad = await runOnce(undefined, full(s0), { DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'diff' }, IPT);
    t.equal(iptBad.code, 1, 'kpng-example-allip: an unknown KPNG_CALLOUT_INPUT is not taken for full: exit 1');
    t.equal(iptBad.stdout, '', 'kpng-example-allip: prints nothing for it');
    t.match(iptBad.stderr, /kpng-example-allip: KPNG_CALLOUT_INPUT must be full/);
    const iptFull = await runOnce(undefined, full(s0), { DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'full' }, IPT);
    t.equal(iptFull.code, 0, 'kpng-example-allip: a full state with KPNG_CALLOUT_INPUT=full works');
    const iptLoop = await runOnce(undefined, frame(1, 'full', full(s0)), { DRY_RUN: '1', KPNG_CALLOUT_MODE: 'persistent' }, IPT);
    t.equal(iptLoop.code, 1, 'kpng-example-allip: exit 1 as a persistent callout');
    t.match(iptLoop.stderr, /kpng-example-allip: .*persistent/);
    t.end();
  });

  await t.test('persistent: bad frames get an error ack and the loop goes on', async (t) => {
    const tmp = tempDir(t, 'kpng-nft-dry-');
    const p = new PersistentCallout(NFT, undefined, { DRY_RUN: '1', TMPDIR: tmp });
    t.match(await p.send('garbage\n' + full(s0) + '\n'), /^error .*Frame header/, 'no header');
    t.match(await p.send('{"Frame":{"Seq":"x","Input":"full"}}\n\n'), /^error .*header/, 'a header without a numeric Seq');
    t.match(await p.send('{"Frame":{"Seq":3,"Input":"diff"}}\n\n'), /^error .*header/, 'a header with another Input');
    t.match(await p.send(frame(4, 'full', full(s0) + '{"Service":\n')), /^error cannot read the state as JSON lines/, 'a line that is not JSON');
    t.match(await p.send('\n'), /^error /, 'an empty line outside a frame');
    t.match(await p.send(frame(5, 'changes', changeSet(s0, s1))), /^error no applied state/, 'a change set before any full frame');
    t.equal(await p.send(frame(6, 'full', full(s0))), 'ok', 'a full frame');
    t.match(await p.send(frame(7, 'changes', '[1,2]\n')), /^error a change set line that is not a Service/, 'a change set line that is not a Service');
    t.match(await p.send(frame(8, 'changes', changeSet(s0, s1))), /^error no applied state/, 'after an error, only a full frame');
    t.equal(await p.send(frame(9, 'full', full(s0))), 'ok', 'a full frame');
    t.match(await p.send(frame(10, 'changes', changeSet(s1, s2))), /^error the change set does not match the applied state/, 'a change set from another state');
    t.equal(await p.send(frame(11, 'full', full(s0))), 'ok');
    t.match(await p.send(frame(12, 'changes', svcLine(a1) + svcLine(a1))), /^error change set lines repeated/, 'a Service twice');
    t.equal(await p.send(frame(13, 'full', full(s0))), 'ok');
    t.equal(await p.send(frame(14, 'changes', changeSet(s0, s1))), 'ok', 'then a change set applies');
    // End of input in the middle of a frame: the frame is dropped, the exit is clean.
    p.child.stdin!.write('{"Frame":{"Seq":15,"Input":"full"}}\n' + full(s1));
    t.same(await p.end(), { code: 0, signal: null }, 'exits 0 at end of input');
    await pollUntil(() => groupMembers(p.pgid).length === 0, 'the callout process group to be empty');
    t.same(readdirSync(tmp), [], 'no temporary file left');
    t.notMatch(p.stderr, /awk:|jq: error/, 'no tool error');
    t.end();
  });
  t.end();
});
