/**
 * End-to-end tests of the service-proxy callouts (kube-proxy semantics) with
 * real TCP and UDP traffic in the lab of test/helpers/service-lab.ts:
 * callouts/service-proxy-nft (table inet kpng_service_proxy) and
 * callouts/service-proxy-iptables (chains KPNG-SP-*), each run directly on
 * a state. One lab per callout, reused by its subtests, both families
 * throughout:
 *
 * - idempotent (same ruleset twice), invalid JSON (exit non-zero, rules kept);
 * - ClusterIP from the node and from a pod; hairpin (a pod through its own
 *   Service, masqueraded); ExternalIP, load-balancer IP and NodePort from the
 *   client; target port by TargetPort, by a named port (PortOverrides), and
 *   the Service port itself;
 * - 200 connections spread over both endpoints; ClientIP affinity;
 *   ExternalTrafficToLocal (External-scope endpoints only, client address
 *   kept) vs not (the node's address); Internal vs External scopes;
 * - a Service without endpoints refused at once (not a timeout);
 * - hostile strings (nothing injected);
 * - UDP from one client source port follows an endpoint move (conntrack), and
 *   reaches a Service created after it first sent.
 *
 * Through `kpng-callout replay`, change sets, persistent, and removal:
 * service-proxy-replay.test.ts. The states and checks:
 * test/helpers/service-proxy-e2e.ts.
 *
 * service-proxy-nft's full states are planned by node here
 * (SERVICE_PROXY_NFT_PLANNER=node), by jq and awk in the replay suite.
 *
 * A callout whose file is not there yet is skipped, saying so; so is all of
 * it without root, `ip netns` or the tools (labMissing). KPSP_TEST_NFT /
 * KPSP_TEST_IPT run it against another implementation of the same contract.
 * "At once" is FAIL_FAST_MS: < 1.5 s, one SYN retransmission (IPv6's TCP
 * connect ends on an ICMPv6 error only then; an IPv4 ICMP error may be held
 * back by the kernel's rate limit under load; a reset ends it at once); a
 * connect timeout is several seconds.
 */
import t from 'tap';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { CLIENT, FAMILIES, labMissing, NODE, NODE_ADDRS, svcIP, UNTRANSLATED } from '../../helpers/service-lab.js';
import { stateText } from '../../helpers/service-states.js';
import {
  answered,
  byPod,
  CALLOUTS,
  ep,
  foreignKept,
  hostile,
  I,
  LB,
  NP,
  openLab,
  refused,
  ruleset,
  S1,
  S2,
  simple,
  skipFor,
  STATE1,
  STATE2,
  STATE2_PORT,
  summary,
  X,
} from '../../helpers/service-proxy-e2e.js';

// service-proxy-nft plans these full states with node (by default a state this
// small goes to jq and awk, as in service-proxy-replay.test.ts and the rest):
// both planners meet real traffic.
process.env.SERVICE_PROXY_NFT_PLANNER = 'node';

const reason = await labMissing();
if (reason) console.error(`# skipping service-proxy callout tests: ${reason}`);

for (const c of CALLOUTS) {
  t.test(`${c.name} with real traffic`, { skip: skipFor(c, reason) }, async (t) => {
    const { lab, direct } = await openLab(t, c);

    let R1 = '';
    let applied = false;
    await t.test('a full state applies; the same state again changes nothing', async (t) => {
      applied = (await direct(t, STATE1, 'the first state')).code === 0;
      R1 = await ruleset(lab, c);
      await direct(t, STATE1, 'the same state again');
      t.equal(await ruleset(lab, c), R1, 'the same ruleset text twice');
      await foreignKept(t, lab, 'after two runs');
    });
    if (!applied) return; // the rest needs the first state in place

    await t.test('invalid JSON: exit non-zero, rules untouched', async (t) => {
      for (const bad of ['{"Service":\n', STATE1 + 'not json\n', '{"Service":null}\n' + STATE1, '[1,2,3]\n' + STATE1]) {
        const r = await lab.direct(c.path, bad);
        t.not(r.code, 0, `exits non-zero on ${JSON.stringify(bad.slice(-12))}`);
        t.equal(await ruleset(lab, c), R1, 'the ruleset is unchanged');
      }
    });

    await t.test('ClusterIP from the node and from a pod; hairpin', async (t) => {
      for (const fam of FAMILIES) {
        answered(t, await lab.tcp('node', svcIP(fam, I.web), 80, { n: 10, parallel: 5 }), ['pod1', 'pod2'], 8080, `${fam} node -> web ClusterIP:80`);
        answered(t, await lab.tcp('node', svcIP(fam, I.two), 80, { n: 3 }), ['pod2'], 8080, `${fam} node -> two ClusterIP:80`);
        answered(t, await lab.tcp('pod1', svcIP(fam, I.two), 80, { n: 3 }), ['pod2'], 8080, `${fam} pod1 -> two ClusterIP:80`);
        const hair = await lab.tcp('pod1', svcIP(fam, I.one), 80, { n: 3 });
        answered(t, hair, ['pod1'], 8080, `${fam} hairpin pod1 -> one ClusterIP:80 (its own Service)`);
        t.ok(
          hair.every((h) => h.src === NODE.pod1[fam]),
          `${fam} hairpin: pod1 sees the node's address ${NODE.pod1[fam]}, masqueraded`,
          { got: summary(hair) },
        );
      }
    });

    await t.test('ExternalIP, load-balancer IP and NodePort from the client', async (t) => {
      for (const fam of FAMILIES) {
        answered(t, await lab.tcp('client', svcIP(fam, X.web), 80, { n: 6, parallel: 3 }), ['pod1', 'pod2'], 8080, `${fam} client -> web ExternalIP:80`);
        answered(t, await lab.tcp('client', svcIP(fam, LB.web), 80, { n: 6, parallel: 3 }), ['pod1', 'pod2'], 8080, `${fam} client -> web LB IP:80`);
        answered(t, await lab.tcp('client', NODE.client[fam], NP.http, { n: 6, parallel: 3 }), ['pod1', 'pod2'], 8080, `${fam} client -> node:${NP.http} (NodePort)`);
        answered(t, await lab.tcp('client', svcIP(fam, I.web), 80, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 8080, `${fam} client -> web ClusterIP:80`);
        const u = await lab.udp('client', NODE.client[fam], NP.dns, { n: 4 });
        answered(t, u, ['pod1', 'pod2'], 8080, `${fam} UDP client -> node:${NP.dns} (NodePort)`);
        // web's ExternalIP and LB IP share its ClusterIP's endpoints (nft: keyed by the ClusterIP, the
        // destination rewritten first): UDP too, whose checksum the rewrite must keep
        answered(t, await lab.udp('client', svcIP(fam, X.web), 53, { n: 4 }), ['pod1', 'pod2'], 8080, `${fam} UDP client -> web ExternalIP:53`);
        answered(t, await lab.udp('client', svcIP(fam, LB.web), 53, { n: 4 }), ['pod1', 'pod2'], 8080, `${fam} UDP client -> web LB IP:53`);
      }
    });

    await t.test('target ports: TargetPort, a named port (PortOverrides), the port itself', async (t) => {
      for (const fam of FAMILIES) {
        answered(t, await lab.tcp('node', svcIP(fam, I.web), 81, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 9090, `${fam} web:81 -> TargetPort 9090`);
        answered(t, await lab.tcp('node', svcIP(fam, I.web), 443, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 8443, `${fam} web:443 -> the override of "tls", 8443 (not TargetPort 9999)`);
        answered(t, await lab.tcp('client', NODE.client[fam], NP.tls, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 8443, `${fam} NodePort ${NP.tls} -> 8443`);
        answered(t, await lab.tcp('node', svcIP(fam, I.web), 9090, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 9090, `${fam} web:9090 (no TargetPort) -> 9090`);
        answered(t, await lab.udp('node', svcIP(fam, I.web), 53, { n: 4 }), ['pod1', 'pod2'], 8080, `${fam} UDP web:53 -> 8080`);
      }
    });

    await t.test('200 connections are spread over both endpoints', async (t) => {
      for (const fam of FAMILIES) {
        const cs = await lab.tcp('node', svcIP(fam, I.web), 80, { n: 200, parallel: 20 });
        answered(t, cs, ['pod1', 'pod2'], 8080, `${fam} 200 connections`);
        const n = byPod(cs);
        t.ok((n.pod1 ?? 0) >= 50 && (n.pod2 ?? 0) >= 50, `${fam}: each pod gets >= 25% (${JSON.stringify(n)})`);
      }
    });

    await t.test('ClientIP affinity: one client, one pod', async (t) => {
      for (const fam of FAMILIES) {
        for (const from of ['client', 'node'] as const) {
          const cs = await lab.tcp(from, svcIP(fam, I.sticky), 80, { n: 20, parallel: 1 });
          answered(t, cs, ['pod1', 'pod2'], 8080, `${fam} ${from} -> sticky`);
          t.equal(Object.keys(byPod(cs)).length, 1, `${fam} ${from}: all 20 connections to one pod (${JSON.stringify(byPod(cs))})`);
          if (from !== 'client') continue;
          // The affinity is the Service port's, whichever of its addresses the client uses (as kube-proxy).
          const np = await lab.tcp('client', NODE.client[fam], NP.sticky, { n: 10, parallel: 1 });
          t.same(byPod(np), { [cs[0]!.pod!]: 10 }, `${fam} client: its NodePort connections go to the same pod as its ClusterIP ones`);
        }
      }
    });

    await t.test('ExternalTrafficToLocal keeps the client address and uses External endpoints only', async (t) => {
      for (const fam of FAMILIES) {
        for (const [what, addr, port] of [
          ['ExternalIP', svcIP(fam, X.local), 80],
          ['NodePort', NODE.client[fam], NP.local],
        ] as const) {
          const cs = await lab.tcp('client', addr, port, { n: 20, parallel: 4 });
          answered(t, cs, ['pod1'], 8080, `${fam} local ${what}: the External endpoint only`);
          t.ok(cs.every((x) => x.src === CLIENT[fam]), `${fam} local ${what}: the pod sees the client ${CLIENT[fam]}`, { got: summary(cs) });
        }
        const inside = await lab.tcp('node', svcIP(fam, I.local), 80, { n: 20, parallel: 4 });
        answered(t, inside, ['pod1', 'pod2'], 8080, `${fam} local ClusterIP: Internal endpoints`);
        t.equal(Object.keys(byPod(inside)).length, 2, `${fam} local ClusterIP: both Internal endpoints used (${JSON.stringify(byPod(inside))})`);
        const cs = await lab.tcp('client', svcIP(fam, X.web), 80, { n: 10, parallel: 5 });
        answered(t, cs, ['pod1', 'pod2'], 8080, `${fam} web ExternalIP`);
        t.ok(cs.every((x) => x.src !== undefined && NODE_ADDRS.includes(x.src)), `${fam} web (Cluster policy) ExternalIP: the pod sees a node address`, { got: summary(cs) });
        const np = await lab.tcp('client', NODE.client[fam], NP.http, { n: 10, parallel: 5 });
        t.ok(np.every((x) => x.src !== undefined && NODE_ADDRS.includes(x.src)), `${fam} web NodePort: the pod sees a node address`, { got: summary(np) });
      }
    });

    await t.test('Scopes: Internal endpoints for the ClusterIP, External ones for the ExternalIP', async (t) => {
      for (const fam of FAMILIES) {
        answered(t, await lab.tcp('node', svcIP(fam, I.scoped), 80, { n: 12, parallel: 4 }), ['pod1'], 8080, `${fam} scoped ClusterIP -> the Internal endpoint`);
        answered(t, await lab.tcp('client', svcIP(fam, X.scoped), 80, { n: 12, parallel: 4 }), ['pod2'], 8080, `${fam} scoped ExternalIP -> the External endpoint`);
      }
    });

    await t.test('a Service without endpoints is refused at once (TCP)', async (t) => {
      for (const fam of FAMILIES) {
        refused(t, fam, await lab.tcp('node', svcIP(fam, I.empty), 80, { n: 2 }), ['ECONNREFUSED', 'ECONNRESET'], `${fam} node -> empty ClusterIP`);
        refused(t, fam, await lab.tcp('client', svcIP(fam, I.empty), 80, { n: 2 }), ['ECONNREFUSED', 'ECONNRESET'], `${fam} client -> empty ClusterIP`);
        refused(t, fam, await lab.tcp('client', svcIP(fam, X.empty), 80, { n: 2 }), ['ECONNREFUSED', 'ECONNRESET'], `${fam} client -> empty ExternalIP`);
        refused(t, fam, await lab.tcp('client', NODE.client[fam], NP.empty, { n: 2 }), ['ECONNREFUSED', 'ECONNRESET'], `${fam} client -> empty NodePort`);
        // The lab itself: an address of no Service is not translated and the sink answers "unreachable".
        refused(t, fam, await lab.tcp('client', svcIP(fam, 99), 81, { n: 2 }), UNTRANSLATED, `${fam} (lab) an address of no Service`);
        // A port a ClusterIP does not serve: nft rejects it (as kube-proxy's nftables mode); iptables leaves it (as its iptables mode).
        for (const from of ['client', 'node'] as const) {
          const cs = await lab.tcp(from, svcIP(fam, I.empty), 81, { n: 2 });
          if (c.kind === 'nft') refused(t, fam, cs, ['ECONNREFUSED', 'ECONNRESET'], `${fam} ${from} -> a ClusterIP port no Service serves`);
          else refused(t, fam, cs, UNTRANSLATED, `${fam} ${from} -> a ClusterIP port no Service serves: not translated`);
        }
      }
    });

    await t.test('hostile strings inject nothing', async (t) => {
      const marker = join(lab.dir, 'pwned');
      const r = await lab.direct(c.path, stateText([...S1, hostile(marker)]));
      t.equal(r.code, 0, 'exits 0: bad values are skipped, not fatal', { stderr: r.stderr });
      t.notOk(existsSync(marker), 'the marker file was not created');
      const rules = await ruleset(lab, c);
      for (const s of ['touch', 'pwned', '192.0.2.31', '192.0.2.232', '192.0.2.233', '2001:db8:5::31', '70000']) {
        t.notOk(rules.includes(s), `no rule holds ${JSON.stringify(s)}`);
      }
      t.match(r.stderr, /skip/i, 'stderr logs what was skipped');
      for (const fam of FAMILIES) {
        // pod2 (198.51.100.130, v4) has a hostile PortOverride: skipping the override (TargetPort) or the endpoint are both fine
        answered(t, await lab.tcp('node', svcIP(fam, I.hostile), 80, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 8080, `${fam} the valid ClusterIP of the hostile Service still works`);
      }
      answered(t, await lab.tcp('node', svcIP('v4', I.web), 80, { n: 4, parallel: 2 }), ['pod1', 'pod2'], 8080, 'the other Services still work');
      await direct(t, STATE1, 'back to the first state');
      t.equal(await ruleset(lab, c), R1, 'the hostile Service leaves no trace');
    });

    await t.test('UDP from one source port follows an endpoint move', async (t) => {
      for (const fam of FAMILIES) {
        const before = await lab.udp('client', svcIP(fam, I.udp), 53, { n: 3, srcPort: 40053 });
        answered(t, before, ['pod1'], 8080, `${fam} UDP from port 40053 -> pod1`);
      }
      await direct(t, STATE2, 'the endpoint moved');
      for (const fam of FAMILIES) {
        const after = await lab.udp('client', svcIP(fam, I.udp), 53, { n: 3, srcPort: 40053 });
        answered(t, after, ['pod2'], 8080, `${fam} UDP from the same port 40053 -> pod2 now`);
        answered(t, await lab.tcp('node', svcIP(fam, I.web), 80, { n: 10, parallel: 5 }), ['pod2'], 8080, `${fam} web: pod2 only`);
        refused(t, fam, await lab.tcp('node', svcIP(fam, I.one), 80, { n: 2 }), UNTRANSLATED, `${fam} a removed Service: not translated any more`);
      }
      t.notMatch(await lab.conntrack(), /dport=53 .*src=198\.51\.100\.2 |dport=53 .*src=2001:db8:1::2 /, 'no UDP conntrack entry to the old endpoint left');
      // The same endpoint at another port (as kube-proxy, a flow is stale when the endpoint's IP:port went away).
      await direct(t, STATE2_PORT, 'the TargetPort changed');
      for (const fam of FAMILIES) {
        answered(t, await lab.udp('client', svcIP(fam, I.udp), 53, { n: 3, srcPort: 40053 }), ['pod2'], 9090, `${fam} UDP from the same port 40053 -> pod2:9090 now`);
      }
    });

    await t.test('UDP sent to a Service address before the Service existed reaches it once it does (same source port)', async (t) => {
      // As kube-proxy (a newly active UDP Service): the flows the client made while nothing
      // translated that address (untranslated, so never to an endpoint) are deleted.
      const s2p = S2.map((s) => (s.name === 'udp' ? { ...s, ports: [{ protocol: 'UDP' as const, port: 53, targetPort: 9090 }] } : s));
      const fresh = simple('fresh', I.fresh, [ep('pod2')], { type: 'NodePort', ports: [{ protocol: 'UDP', port: 53, nodePort: NP.fresh, targetPort: 8080 }] });
      for (const fam of FAMILIES) {
        await lab.udp('client', svcIP(fam, I.fresh), 53, { n: 1, srcPort: 40054 });
        await lab.udp('client', NODE.client[fam], NP.fresh, { n: 1, srcPort: 40055 });
      }
      await direct(t, stateText([...s2p, fresh]), 'a new UDP Service');
      for (const fam of FAMILIES) {
        answered(t, await lab.udp('client', svcIP(fam, I.fresh), 53, { n: 2, srcPort: 40054 }), ['pod2'], 8080, `${fam} ClusterIP from the same port 40054 -> pod2`);
        answered(t, await lab.udp('client', NODE.client[fam], NP.fresh, { n: 2, srcPort: 40055 }), ['pod2'], 8080, `${fam} NodePort from the same port 40055 -> pod2`);
      }
      await direct(t, stateText(s2p), 'the new Service removed');
    });
  });
}
