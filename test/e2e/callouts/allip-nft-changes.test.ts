/**
 * callouts/kpng-example-allip-nft with change sets (KPNG_CALLOUT_INPUT=changes)
 * and as a persistent callout (KPNG_CALLOUT_MODE=persistent), fed directly,
 * in bare network namespaces:
 *
 * - the key property: from a full state P, the change set P -> N leaves
 *   exactly the table that N applied in full leaves (`nft -j list table`,
 *   handles dropped, elements and chains sorted), along a chain of states that
 *   adds, modifies and removes Services, moves endpoints, shares external IPs
 *   between Services (kpng order, "/" first), in both families; per run and
 *   persistent; hand-written states out of kpng order;
 * - a change set that cannot be applied (stale, table gone, other settings,
 *   nothing recorded) fails and changes nothing; a full state heals;
 * - persistent: `nft -i` killed, a table holding another mapping, a NUL in a
 *   key, a refused change set told as a bounded excerpt.
 *
 * Dry runs and the frame loop: allip-nft-frames.test.ts; real traffic:
 * allip-nft-traffic.test.ts. Needs jq, root, `ip netns`, nft and socat
 * (netnsMissing) and skips, saying why, without them. Addresses:
 * documentation ranges only.
 */
import t, { type Test as Tap } from 'tap';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { missingTools, mustRun } from '../../helpers/command.js';
import { tempDir } from '../../helpers/files.js';
import { chainOfStates, changeSet, full, keyOf, NFT, netns, runOnce, svcLine, table, type Svc } from '../../helpers/allip-nft-states.js';
import { netnsMissing } from '../../helpers/netns-topology.js';
import { groupMembers } from '../../helpers/procs.js';
import { PersistentCallout } from '../../helpers/persistent-callout.js';
import { pollUntil } from '../../helpers/wait.js';

/** A process's command line, '' once it is gone (a group's short-lived members come and go while it is read). */
function cmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8');
  } catch {
    return '';
  }
}

const noJq = missingTools(['jq']).length > 0;
const reason = noJq ? 'jq is missing' : await netnsMissing();
if (reason) console.error(`# skipping nft change-set tests that need the kernel: ${reason}`);

t.test('kpng-example-allip-nft change sets in the kernel', { skip: reason ?? false }, async (t) => {
  const steps = chainOfStates();

  /**
   * Three namespaces named after `tag`: `inc` (change sets per run, recorded in a state directory of its own:
   * `env`), `ref` (full states) and `per`, where `p` runs persistent (with `perEnv`).
   */
  const threeWays = async (t: Tap, tag: string, perEnv: NodeJS.ProcessEnv = {}) => {
    const env = { KPNG_ALLIP_NFT_STATE_DIR: tempDir(t, 'kpng-nft-state-') };
    const inc = await netns(t, tag);
    const ref = await netns(t, `${tag}ref`);
    const per = await netns(t, `${tag}per`);
    const p = new PersistentCallout(NFT, per, perEnv);
    t.teardown(() => void p.child.stdin!.end());
    return { env, inc, ref, per, p };
  };

  await t.test('a change set P -> N leaves exactly the table of N in full (per run and persistent)', async (t) => {
    const tmp = tempDir(t, 'kpng-nft-tmp-');
    const { env, inc, ref, per, p } = await threeWays(t, 'inc', { TMPDIR: tmp });
    let prev: Svc[] | undefined;
    for (const { what, state } of steps) {
      const input = prev ? changeSet(prev, state) : full(state);
      const kind = prev ? 'changes' : 'full';
      const r = await runOnce(inc, input, { ...env, KPNG_CALLOUT_INPUT: kind });
      t.equal(r.code, 0, `${what}: the ${kind} run exits 0`, { stderr: r.stderr });
      t.equal(await p.frame(kind, input), 'ok', `${what}: the persistent callout acks ok`);
      const want = await runOnce(ref, full(state), { ...env, KPNG_CALLOUT_INPUT: 'full' });
      t.equal(want.code, 0, `${what}: the full run exits 0`, { stderr: want.stderr });
      const expected = await table(ref);
      t.equal(await table(inc), expected, `${what}: per run, the same table as the state in full`);
      t.equal(await table(per), expected, `${what}: persistent, the same table as the state in full`);
      prev = state;
    }
    t.match(await table(ref), /"dnat4"/, 'tables were compared');

    // A change set the kernel refuses: the table was deleted by hand.
    const [s0, s1, s2] = steps.map((s) => s.state);
    t.equal(await p.frame('full', full(s0!)), 'ok');
    await mustRun('ip', ['netns', 'exec', per, 'nft', 'delete', 'table', 'inet', 'kpng_allip']);
    t.match(await p.frame('changes', changeSet(s0!, s1!)), /^error nft failed/, 'a change set onto a deleted table: error');
    t.match(await table(per), /^\(no table/, 'nothing created');
    t.match(await p.frame('changes', changeSet(s1!, s2!)), /^error a full state is needed/, 'then only a full frame');
    t.equal(await p.frame('full', full(s1!)), 'ok', 'a full frame applies');
    t.equal(await p.frame('changes', changeSet(s1!, s2!)), 'ok', 'and change sets again');
    t.equal((await runOnce(ref, full(s2!), {})).code, 0);
    t.equal(await table(per), await table(ref), 'the same table as the state in full');

    t.same(await p.end(), { code: 0, signal: null }, 'the persistent callout exits 0 at end of input');
    await pollUntil(() => groupMembers(p.pgid).length === 0, 'the callout process group (nft -i included) to be empty');
    t.same(readdirSync(tmp), [], 'no temporary file left');
    t.end();
  });

  await t.test('hand-written states out of kpng order: shared IPs go to the first in kpng order; change sets in their order apply', async (t) => {
    const { env, inc, ref, per, p } = await threeWays(t, 'uo');
    const zeta = (l4: string, x4: string[]): Svc => ({ ns: 'zeta', name: 'b', x4, l4: [l4] });
    const alpha = (x4: string[]): Svc => ({ ns: 'alpha', name: 'a', x4, l4: ['198.51.100.3'] });
    // In the fixture's order, not kpng's: zeta first.
    const s1 = [zeta('198.51.100.2', ['192.0.2.71', '192.0.2.72']), alpha(['192.0.2.70', '192.0.2.72'])];
    const s2 = [zeta('198.51.100.4', ['192.0.2.71', '192.0.2.72']), alpha(['192.0.2.70'])];
    const text = (svcs: Svc[]) => svcs.map(svcLine).join('');
    const set = (svcs: Svc[]) => svcs.map((s) => keyOf(s));
    const changes = (prev: Svc[], next: Svc[]) =>
      set(next)
        .map((k, i) => `{"Previous":${svcLine(prev[i]!).slice(0, -1)}}\n${svcLine(next[i]!)}`)
        .filter((_, i) => svcLine(prev[i]!) !== svcLine(next[i]!))
        .join('');
    let r = await runOnce(inc, text(s1), { ...env, KPNG_CALLOUT_INPUT: 'full' });
    t.equal(r.code, 0, 'the full state applies', { stderr: r.stderr });
    t.match(r.stderr, /"zeta\/b": skipping external IP 192\.0\.2\.72: already used by "alpha\/a"/, 'the first in kpng order keeps it, and the log says so');
    t.equal(await p.frame('full', text(s1)), 'ok');
    t.equal((await runOnce(ref, full(s1), env)).code, 0);
    t.equal(await table(inc), await table(ref), 'the same table as the state in kpng order');
    r = await runOnce(inc, changes(s1, s2), { ...env, KPNG_CALLOUT_INPUT: 'changes' });
    t.equal(r.code, 0, 'a change set in the fixture order applies', { stderr: r.stderr });
    t.equal(await p.frame('changes', changes(s1, s2)), 'ok', 'persistent too');
    t.equal((await runOnce(ref, full(s2), env)).code, 0);
    t.equal(await table(inc), await table(ref), 'per run: the table of the next state');
    t.equal(await table(per), await table(ref), 'persistent: the table of the next state');
    t.same(await p.end(), { code: 0, signal: null });
  });

  await t.test('a change set that cannot be applied fails and changes nothing; a full state heals', async (t) => {
    const stateDir = tempDir(t, 'kpng-nft-state-');
    const ns = await netns(t, 'fail');
    const [s0, s1, s2] = steps.map((s) => s.state);
    const run = (input: string, kind: string, env: NodeJS.ProcessEnv = {}) =>
      runOnce(ns, input, { KPNG_ALLIP_NFT_STATE_DIR: stateDir, KPNG_CALLOUT_INPUT: kind, ...env });

    t.equal((await run(full(s0!), 'full')).code, 0);
    const before = await table(ns);
    const [stateFile] = readdirSync(stateDir);
    const recorded = readFileSync(join(stateDir, stateFile!), 'utf8');

    const dry = await run(changeSet(s0!, s1!), 'changes', { DRY_RUN: '1' });
    t.equal(dry.code, 0, 'DRY_RUN=1 with a change set exits 0');
    t.match(dry.stdout, /^delete element inet kpng_allip gen \{ \d+ \}\nadd element inet kpng_allip gen \{ \d+ \}\ncreate element inet kpng_allip dnat4 \{ 192\.0\.2\.3 : 198\.51\.100\.6 \}\n/, 'it prints the incremental script');
    t.notMatch(dry.stdout, /table|192\.0\.2\.1\b/, 'only what changes');
    t.equal(await table(ns), before, 'the dry run changed no rule');
    t.equal(readFileSync(join(stateDir, stateFile!), 'utf8'), recorded, 'nor the recorded state');

    t.equal((await run(changeSet(s0!, s1!), 'changes')).code, 0, 'the change set applies');
    const after = await table(ns);
    const again = await run(changeSet(s0!, s1!), 'changes');
    t.equal(again.code, 1, 'the same change set again (a stale one): exit 1');
    t.match(again.stderr, /does not match the applied state/);
    t.equal(await table(ns), after, 'nothing changed');

    await mustRun('ip', ['netns', 'exec', ns, 'nft', 'delete', 'table', 'inet', 'kpng_allip']);
    const gone = await run(changeSet(s1!, s2!), 'changes');
    t.equal(gone.code, 1, 'a change set when the table was deleted by hand: exit 1');
    t.match(gone.stderr, /nft -f failed; rules unchanged/);
    t.match(await table(ns), /^\(no table/, 'nothing created');

    t.equal((await run(full(s2!), 'full')).code, 0, 'a full state applies');
    await mustRun('ip', ['netns', 'exec', ns, 'nft', 'flush', 'set', 'inet', 'kpng_allip', 'gen']);
    const flushed = await run(changeSet(s2!, s1!), 'changes');
    t.equal(flushed.code, 1, 'a change set onto a table whose gen element is gone: exit 1');

    t.equal((await run(full(s2!), 'full')).code, 0);
    const lbOff = await run(changeSet(s2!, s1!), 'changes', { KPNG_ALLIP_LB_IPS: '0' });
    t.equal(lbOff.code, 1, 'a change set under another KPNG_ALLIP_LB_IPS than the recorded state: exit 1');
    t.match(lbOff.stderr, /no applied state/);

    t.equal((await run(full(s1!), 'full')).code, 0, 'a full state heals');
    const ref = await netns(t, 'failref');
    t.equal((await runOnce(ref, full(s1!), {})).code, 0);
    t.equal(await table(ns), await table(ref), 'exactly the state');
    t.end();
  });

  await t.test('persistent: nft -i killed, a table holding another mapping, a NUL in a key', async (t) => {
    const ns = await netns(t, 'odd');
    const ref = await netns(t, 'oddref');
    const p = new PersistentCallout(NFT, ns, {});
    t.teardown(() => void p.child.stdin!.end());
    const a: Svc = { name: 'a', x4: ['192.0.2.10'], l4: ['198.51.100.2'] };
    const b: Svc = { name: 'b', x4: ['192.0.2.11'], l4: ['198.51.100.130'] };
    const a2: Svc = { ...a, l4: ['198.51.100.3'] };
    t.equal(await p.frame('full', full([a, b])), 'ok');

    // nft -i ends (killed): the session goes on through nft -f.
    const nfti = groupMembers(p.pgid).filter((pid) => cmdline(pid) === 'nft\0-i\0');
    t.equal(nfti.length, 1, 'one nft -i');
    process.kill(nfti[0]!, 'SIGKILL');
    t.equal(await p.frame('changes', changeSet([a, b], [a2, b])), 'ok', 'a change set after nft -i was killed');
    t.match(p.stderr, /nft -i ended; applying with nft -f from now on/);
    t.equal(await p.frame('changes', changeSet([a2, b], [a, b])), 'ok', 'and the next one');
    t.equal((await runOnce(ref, full([a, b]), {})).code, 0);
    t.equal(await table(ns), await table(ref), 'the table of the state in full');

    // Someone applied the same Services with their endpoints swapped: the gen differs, a change set fails.
    const swapped: Svc[] = [{ ...a, l4: b.l4! }, { ...b, l4: a.l4! }];
    t.equal((await runOnce(ns, full(swapped), {})).code, 0);
    const c: Svc = { name: 'c', x4: ['192.0.2.12'], l4: ['198.51.100.4'] };
    t.match(await p.frame('changes', changeSet([a, b], [a, b, c])), /^error nft failed/, 'a change set onto a table of another mapping');
    t.equal(await p.frame('full', full([a, b, c])), 'ok', 'a full frame heals');

    // A key with a NUL sorts before "a!" (kpng: bytes, "/" first): it owns the shared IP.
    const x: Svc = { ns: 'h', name: 'a\u0000', x4: ['192.0.2.20'], l4: ['198.51.100.5'] };
    const y: Svc = { ns: 'h', name: 'a!', x4: ['192.0.2.20'], l4: ['198.51.100.6'] };
    t.equal(await p.frame('full', full([x])), 'ok');
    t.equal(await p.frame('changes', changeSet([x], [x, y])), 'ok');
    t.equal((await runOnce(ref, full([x, y]), {})).code, 0);
    t.equal(await table(ns), await table(ref), 'the table of the state in full: the NUL key owns 192.0.2.20');
    t.match(await table(ns), /198\.51\.100\.5/);
    t.same(await p.end(), { code: 0, signal: null });
    t.end();
  });

  await t.test('persistent: a change set nft -i refuses is told as a bounded excerpt', async (t) => {
    const ns = await netns(t, 'long');
    const tmp = tempDir(t, 'kpng-allip-nft-err-');
    const p = new PersistentCallout(NFT, ns, { TMPDIR: tmp });
    t.teardown(() => void p.child.stdin!.end());
    // 200 Services all moving their endpoint: a change set of ~13 KB on one nft -i line.
    const at = (i: number, net: string) => `${net}.${i + 1}`;
    const before: Svc[] = Array.from({ length: 200 }, (_, i) => ({ name: `s${i}`, x4: [at(i, '192.0.2')], l4: [at(i, '198.51.100')] }));
    const after: Svc[] = before.map((s, i) => ({ ...s, l4: [at(i, '203.0.113')] }));
    // Someone else's mapping (the endpoints rotated by one): the change set's guard fails.
    const other: Svc[] = before.map((s, i) => ({ ...s, l4: before[(i + 1) % before.length]!.l4! }));
    for (let i = 1; i <= 2; i++) {
      t.equal(await p.frame('full', full(before)), 'ok');
      t.equal((await runOnce(ns, full(other), {})).code, 0);
      const said = p.stderr.length;
      t.match(await p.frame('changes', changeSet(before, after)), /^error nft failed/, `refused (${i})`);
      const told = p.stderr.slice(said);
      t.match(told, /Error: /, "nft's error is told");
      t.ok(told.split('\n').every((l) => l.length <= 300), 'in lines of at most 300 characters', { longest: Math.max(...told.split('\n').map((l) => l.length)) });
      t.ok(told.length < 12_000, 'not the whole transaction', { length: told.length });
      const errs = readdirSync(tmp, { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('nft.err'));
      t.same(errs.map((f) => readFileSync(join(tmp, f), 'utf8')), [''], "nft's error file emptied");
    }
    t.equal(await p.frame('full', full(before)), 'ok', 'a full frame heals');
    t.equal(await p.frame('changes', changeSet(before, after)), 'ok', 'and the change set applies through nft -i');
    t.equal(p.stderr.match(/Error: /g)?.length, 2, 'no other error told');
    t.same(await p.end(), { code: 0, signal: null });
    t.end();
  });
  t.end();
});
