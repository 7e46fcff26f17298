/**
 * End-to-end tests of callouts/kpng-example-allip (iptables) and
 * callouts/kpng-example-allip-nft (nftables) with real traffic, in the
 * network of test/helpers/netns-topology.ts: for each callout, a client, the
 * node and two pods in network namespaces. The callout is run by
 * `kpng-callout replay FILE --once --callout …` inside the node namespace.
 * Needs root, `ip netns`, iptables, nft, jq and socat; skips (saying why)
 * without them.
 */
import t, { type Test as Tap } from 'tap';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { mustRun } from '../../helpers/command.js';
import { netnsMissing, PODS, PORTS, Topology, XIP, type PodName, type ServiceSpec } from '../../helpers/netns-topology.js';

const CALLOUTS = [
  { name: 'kpng-example-allip', path: 'callouts/kpng-example-allip' },
  { name: 'kpng-example-allip-nft', path: 'callouts/kpng-example-allip-nft' },
] as const;

/** The DNAT rules the callout owns, one string per rule (or per external IP's map element). */
function dnatEntries(callout: string, rules: string): string[] {
  if (callout.endsWith('-nft')) {
    // dnat4/dnat6: IP : endpoint; multi4/multi6: IP : goto its numgen chain
    const entries: string[] = [];
    for (const m of rules.matchAll(/map (?:dnat|multi)[46] \{[^}]*?elements = \{([^}]*)\}/g)) {
      entries.push(...m[1]!.split(',').map((e) => e.trim()).filter(Boolean));
    }
    return entries;
  }
  return rules.split('\n').filter((l) => l.startsWith('-A KPNG-ALLIP '));
}

const reason = await netnsMissing();
if (reason) console.error(`# skipping callouts end-to-end tests: ${reason}`);

for (const callout of CALLOUTS) {
  t.test(`${callout.name} with real traffic`, { skip: reason ?? false }, async (t) => {
    const topo = new Topology(callout.name.endsWith('-nft') ? 'nft' : 'ipt');
    t.teardown(() => topo.close());
    await topo.open();

    const v4 = XIP.v4[0];
    const v6 = XIP.v6[0];
    // Where the nft callout keeps the applied mapping when the runner sets KPNG_CALLOUT_INPUT.
    const stateDir = join(topo.dirPath, 'nft-state');
    const apply = async (t: Tap, services: ServiceSpec[], env?: NodeJS.ProcessEnv) => {
      const r = await topo.apply(callout.path, services, { KPNG_ALLIP_NFT_STATE_DIR: stateDir, ...env });
      t.equal(r.code, 0, `${callout.name} exits 0`, { stderr: r.stderr });
      return r;
    };
    /** Asserts where a connection to addr ends, from the client and from the node. */
    const expectAt = async (t: Tap, addr: string, want: PodName | '', msg: string, port = 8080) => {
      for (const from of ['client', 'node'] as const) {
        const got = want ? await topo.poll(from, addr, port, want) : await topo.connect(from, addr, port);
        t.equal(got, want, `${msg}: ${from} -> ${addr}:${port}`);
      }
    };

    await t.test('each external IP reaches the local pod, both families, all ports', async (t) => {
      await apply(t, [{ name: 'web', xips4: [v4], xips6: [v6], local: ['pod1'], remote: ['pod2'] }]);
      for (const addr of [v4, v6]) for (const port of PORTS) await expectAt(t, addr, 'pod1', 'to pod1', port);
      t.end();
    });

    await t.test('the same state applied twice leaves one copy of each rule; hand edits are undone', async (t) => {
      const state: ServiceSpec[] = [{ name: 'web', xips4: [v4], xips6: [v6], local: ['pod1'], remote: ['pod2'] }];
      await apply(t, state);
      const once = await topo.rules(callout.path);
      await apply(t, state);
      const twice = await topo.rules(callout.path);
      t.equal(twice, once, 'the ruleset is unchanged by a second run');
      const entries = dnatEntries(callout.path, twice);
      t.equal(entries.length, 2, 'one DNAT entry per external IP', { entries });
      t.equal(new Set(entries).size, entries.length, 'no entry twice');
      if (!callout.path.endsWith('-nft')) {
        for (const hook of ['PREROUTING', 'OUTPUT']) {
          const jumps = twice.split('\n').filter((l) => l === `-A ${hook} -j KPNG-ALLIP`);
          t.equal(jumps.length, 2, `one jump from ${hook} per family`);
        }
      } else {
        t.equal(twice.match(/^table /gm)?.length, 1, 'one table');
      }

      // Hand edits inside what the callout owns are undone by the next run.
      const inNode = (...cmd: string[]) => mustRun('ip', ['netns', 'exec', topo.ns.node, ...cmd]);
      if (!callout.path.endsWith('-nft')) {
        await inNode('iptables', '-t', 'nat', '-A', 'KPNG-ALLIP', '-d', '192.0.2.99/32', '-j', 'DNAT', '--to-destination', PODS.pod2.v4);
        await inNode('iptables', '-t', 'nat', '-A', 'PREROUTING', '-j', 'KPNG-ALLIP');
        await inNode('ip6tables', '-t', 'nat', '-D', 'OUTPUT', '-j', 'KPNG-ALLIP');
      } else {
        await inNode('nft', 'add', 'element', 'inet', 'kpng_allip', 'dnat4', `{ 192.0.2.99 : ${PODS.pod2.v4} }`);
        await inNode('nft', 'flush', 'chain', 'inet', 'kpng_allip', 'output');
      }
      t.not(await topo.rules(callout.path), once, 'the ruleset was edited by hand');
      await apply(t, state);
      t.equal(await topo.rules(callout.path), once, 'the next run restores exactly the state');
      t.end();
    });

    await t.test('when the local endpoint moves, traffic follows and no stale rule remains', async (t) => {
      await apply(t, [{ name: 'web', xips4: [v4], xips6: [v6], local: ['pod2'], remote: ['pod1'] }]);
      for (const addr of [v4, v6]) await expectAt(t, addr, 'pod2', 'to pod2');
      const rules = await topo.rules(callout.path);
      t.notMatch(rules, PODS.pod1.v4, 'no rule for the old IPv4 endpoint');
      t.notMatch(rules, PODS.pod1.v6, 'no rule for the old IPv6 endpoint');
      t.equal(dnatEntries(callout.path, rules).length, 2, 'one DNAT entry per external IP');
      t.end();
    });

    await t.test('two external IPs per family both work', async (t) => {
      await apply(t, [{ name: 'web', xips4: [...XIP.v4], xips6: [...XIP.v6], local: ['pod1'] }]);
      for (const addr of [...XIP.v4, ...XIP.v6]) await expectAt(t, addr, 'pod1', 'to pod1');
      t.end();
    });

    await t.test('several local endpoints share new connections', async (t) => {
      await apply(t, [{ name: 'web', xips4: [v4], xips6: [v6], local: ['pod1', 'pod2'] }]);
      for (const addr of [v4, v6]) {
        const seen = new Set<string>();
        for (let i = 0; i < 4; i++) seen.add(await topo.connect(i % 2 ? 'node' : 'client', addr));
        t.same([...seen].sort(), ['pod1', 'pod2'], `connections to ${addr} reach both pods`);
      }
      t.end();
    });

    await t.test('load-balancer IPs are mapped too, unless KPNG_ALLIP_LB_IPS=0', async (t) => {
      await apply(t, [{ name: 'lb', lbips4: [XIP.v4[1]], local: ['pod2'] }]);
      await expectAt(t, XIP.v4[1], 'pod2', 'LoadBalancer IP to pod2');
      await apply(t, [{ name: 'lb', lbips4: [XIP.v4[1]], local: ['pod2'] }], { KPNG_ALLIP_LB_IPS: '0' });
      await expectAt(t, XIP.v4[1], '', 'LoadBalancer IP left alone');
      t.end();
    });

    await t.test('after the service is removed, nothing is DNATed', async (t) => {
      await apply(t, [{ name: 'web', xips4: [...XIP.v4], xips6: [...XIP.v6], local: ['pod1'] }]);
      await expectAt(t, v4, 'pod1', 'before removal');
      await apply(t, []);
      for (const addr of [...XIP.v4, ...XIP.v6]) await expectAt(t, addr, '', 'refused by the node');
      t.same(dnatEntries(callout.path, await topo.rules(callout.path)), [], 'no DNAT rule left');
      t.end();
    });

    await t.test('no local endpoint gives no rule and no error', async (t) => {
      const r = await apply(t, [{ name: 'web', xips4: [v4], xips6: [v6], remote: ['pod1', 'pod2'] }]);
      t.notMatch(r.stderr, /error|fail/i, 'nothing reported');
      t.same(dnatEntries(callout.path, await topo.rules(callout.path)), [], 'no DNAT rule');
      for (const addr of [v4, v6]) await expectAt(t, addr, '', 'refused by the node');
      t.end();
    });

    await t.test('a hostile external IP string gives no rule and runs nothing', async (t) => {
      const marker = join(topo.dirPath, 'pwned');
      const hostile = [
        `$(touch ${marker})`,
        `\`touch ${marker}\``,
        `${v4}; touch ${marker}`,
        `${v4} -j ACCEPT`,
        `${v4}\n-A PREROUTING -j DROP`,
        `${v4}/0`,
        '-F',
        `${v6}\n}\ntable inet evil {`,
        `${v6} : ${PODS.pod2.v6}, ::/0`,
        `fe80::1%eth0`,
        '0x7f.1',
        '192.0.2.010',
      ];
      const r = await apply(t, [
        {
          name: 'evil',
          xips4: hostile,
          xips6: hostile,
          endpoints: [{ IPs: { V4: [`${PODS.pod1.v4} $(touch ${marker})`], V6: [`-j DROP`] }, Local: true }],
          local: ['pod1'],
        },
        {
          name: 'evil-endpoint',
          xips4: [XIP.v4[1]],
          endpoints: [{ IPs: { V4: [`$(touch ${marker})`] }, Local: true }],
        },
      ]);
      t.notOk(existsSync(marker), 'no command from the state ran');
      t.match(r.stderr, /skipping external IP/, 'the hostile strings are logged');
      t.same(dnatEntries(callout.path, await topo.rules(callout.path)), [], 'no DNAT rule');
      for (const addr of [...XIP.v4, ...XIP.v6]) await expectAt(t, addr, '', 'refused by the node');
      t.end();
    });
  });
}
