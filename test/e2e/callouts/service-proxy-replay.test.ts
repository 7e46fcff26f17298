/**
 * End-to-end tests of the service-proxy callouts with real traffic, run as
 * the runner runs them, in the lab of test/helpers/service-lab.ts: through
 * `kpng-callout replay --once` (the ruleset of a direct run), for
 * service-proxy-nft also `replay s1 s2 --changes` (an endpoint move and a
 * removal as change sets, then every Service removed) and `replay s1 s2
 * --changes --persistent` (one callout, two frames; the table a full state
 * leaves); and removal: no Service leaves no trace, foreign rules survive.
 * The traffic checks of a direct run: service-proxy-traffic.test.ts; the
 * states and checks: test/helpers/service-proxy-e2e.ts. Skips as that file.
 */
import t from 'tap';
import { FAMILIES, labMissing, NODE, svcIP, UNTRANSLATED } from '../../helpers/service-lab.js';
import { tableShape } from '../../helpers/nft-table.js';
import {
  ALL_IPS,
  ALL_NODEPORTS,
  answered,
  CALLOUTS,
  foreignKept,
  I,
  NP,
  openLab,
  refused,
  ruleset,
  skipFor,
  STATE1,
  STATE2,
  X,
} from '../../helpers/service-proxy-e2e.js';

const reason = await labMissing();
if (reason) console.error(`# skipping service-proxy replay tests: ${reason}`);

for (const c of CALLOUTS) {
  t.test(`${c.name} through kpng-callout replay, and removal`, { skip: skipFor(c, reason) }, async (t) => {
    const { lab, direct, applyMs } = await openLab(t, c);

    await t.test('the same through kpng-callout replay --once', async (t) => {
      await direct(t, STATE1, 'direct');
      const want = await ruleset(lab, c);
      const r = await lab.replay(c.path, [STATE1], { once: true });
      t.equal(r.code, 0, 'replay --once exits 0', { stderr: r.stderr });
      t.equal(await ruleset(lab, c), want, 'the ruleset of a direct run');
      for (const fam of FAMILIES) {
        answered(t, await lab.udp('client', svcIP(fam, I.udp), 53, { n: 2, srcPort: 40054 }), ['pod1'], 8080, `${fam} UDP from port 40054 -> pod1`);
        answered(t, await lab.tcp('client', svcIP(fam, X.web), 80, { n: 6, parallel: 3 }), ['pod1', 'pod2'], 8080, `${fam} web ExternalIP`);
      }
      const r2 = await lab.replay(c.path, [STATE2], { once: true });
      t.equal(r2.code, 0, 'replay --once of the moved state exits 0', { stderr: r2.stderr });
      for (const fam of FAMILIES) {
        answered(t, await lab.udp('client', svcIP(fam, I.udp), 53, { n: 2, srcPort: 40054 }), ['pod2'], 8080, `${fam} UDP from port 40054 -> pod2 now`);
      }
    });

    if (c.changes) {
      await t.test('change sets: replay s1 s2 --changes', async (t) => {
        await direct(t, STATE1, 'direct, first state');
        for (const fam of FAMILIES) {
          answered(t, await lab.udp('client', svcIP(fam, I.udp), 53, { n: 2, srcPort: 40055 }), ['pod1'], 8080, `${fam} UDP from port 40055 -> pod1`);
        }
        const r = await lab.replay(c.path, [STATE1, STATE2], { changes: true });
        t.equal(r.code, 0, 'replay s1 s2 --changes exits 0', { stderr: r.stderr });
        for (const fam of FAMILIES) {
          answered(t, await lab.udp('client', svcIP(fam, I.udp), 53, { n: 2, srcPort: 40055 }), ['pod2'], 8080, `${fam} after the change set: UDP from 40055 -> pod2`);
          answered(t, await lab.tcp('node', svcIP(fam, I.web), 80, { n: 10, parallel: 5 }), ['pod2'], 8080, `${fam} after the change set: web to pod2 only`);
          refused(t, fam, await lab.tcp('node', svcIP(fam, I.one), 80, { n: 2 }), UNTRANSLATED, `${fam} after the change set: "one" is gone`);
          answered(t, await lab.tcp('client', svcIP(fam, X.local), 80, { n: 4 }), ['pod1'], 8080, `${fam} after the change set: the unchanged Services still work`);
        }
        const r2 = await lab.replay(c.path, [STATE2, ''], { changes: true });
        t.equal(r2.code, 0, 'replay s2 (empty) --changes exits 0', { stderr: r2.stderr });
        for (const fam of FAMILIES) {
          refused(t, fam, await lab.tcp('node', svcIP(fam, I.web), 80, { n: 2 }), UNTRANSLATED, `${fam} all removed by a change set: web not translated`);
        }
        const rules = await ruleset(lab, c);
        t.ok(!ALL_IPS.some((ip) => rules.includes(ip)), 'all removed by a change set: no Service IP in the ruleset', { leftover: ALL_IPS.filter((ip) => rules.includes(ip)) });
      });
    }

    if (c.changes) {
      await t.test('persistent: replay s1 s2 --changes --persistent (one callout, frames)', async (t) => {
        await direct(t, '', 'direct, no Service');
        const r = await lab.replay(c.path, [STATE1, STATE2], { changes: true, persistent: true });
        t.equal(r.code, 0, 'replay s1 s2 --changes --persistent exits 0', { stderr: r.stderr });
        t.match(r.stderr, /frame 1 \(full\) applied/, 'frame 1 applied in full');
        t.match(r.stderr, /frame 2 \(changes\) applied/, 'frame 2 applied as a change set');
        for (const fam of FAMILIES) {
          answered(t, await lab.udp('client', svcIP(fam, I.udp), 53, { n: 2, srcPort: 40056 }), ['pod2'], 8080, `${fam} persistent: UDP -> pod2`);
          answered(t, await lab.tcp('node', svcIP(fam, I.web), 80, { n: 10, parallel: 5 }), ['pod2'], 8080, `${fam} persistent: web to pod2 only`);
          refused(t, fam, await lab.tcp('node', svcIP(fam, I.one), 80, { n: 2 }), UNTRANSLATED, `${fam} persistent: "one" is gone`);
          answered(t, await lab.tcp('client', svcIP(fam, X.local), 80, { n: 4 }), ['pod1'], 8080, `${fam} persistent: the unchanged Services work`);
        }
        // (our table as tables of the same elements and rules compare: a change set adds a shared chain it needs)
        const table = async () => tableShape((await lab.exec('node', 'nft', ['-j', 'list', 'table', 'inet', 'kpng_service_proxy'])).stdout);
        const want = await table();
        await direct(t, STATE2, 'direct, the second state in full');
        t.same(await table(), want, 'the same table as a run of the second state in full');
      });
    }

    await t.test('removal leaves nothing; foreign rules survive', async (t) => {
      await direct(t, STATE1, 'the first state');
      await direct(t, '', 'no Service at all');
      const rules = await ruleset(lab, c);
      const ips = ALL_IPS.filter((ip) => new RegExp(`(^|[^0-9a-f:.])${ip.replace(/\./g, '\\.')}([^0-9a-f:.]|$)`, 'm').test(rules));
      t.same(ips, [], 'no Service IP in the ruleset');
      const ports = ALL_NODEPORTS.filter((p) => rules.includes(String(p)));
      t.same(ports, [], 'no NodePort in the ruleset');
      for (const fam of FAMILIES) {
        refused(t, fam, await lab.tcp('node', svcIP(fam, I.web), 80, { n: 2 }), UNTRANSLATED, `${fam} web ClusterIP from the node`);
        refused(t, fam, await lab.tcp('client', svcIP(fam, X.web), 80, { n: 2 }), UNTRANSLATED, `${fam} web ExternalIP from the client`);
        refused(t, fam, await lab.tcp('client', NODE.client[fam], NP.http, { n: 2 }), ['ECONNREFUSED'], `${fam} web NodePort from the client`);
        refused(t, fam, await lab.tcp('client', svcIP(fam, I.empty), 80, { n: 2 }), UNTRANSLATED, `${fam} the former empty Service: not rejected any more`);
      }
      await foreignKept(t, lab, 'at the end');
      const sorted = [...applyMs].sort((a, b) => a - b);
      t.comment(`${c.name}: ${applyMs.length} direct runs, median ${sorted[Math.floor(sorted.length / 2)]} ms, max ${sorted[sorted.length - 1]} ms`);
    });
  });
}
