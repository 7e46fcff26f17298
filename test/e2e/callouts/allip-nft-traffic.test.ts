/**
 * callouts/kpng-example-allip-nft with real traffic after incremental changes
 * (change sets per run, then persistent frames), in netns-topology.ts's lab:
 * endpoints that move (and the UDP flows of a client that keeps its source
 * port follow them), two external IPs per family, an IP shared by two
 * Services (the first in kpng order wins), several local endpoints, removal.
 * Needs jq, root, `ip netns`, nft and socat (netnsMissing) and skips, saying
 * why, without them. The tables change sets leave:
 * allip-nft-changes.test.ts. Addresses: documentation ranges only.
 */
import t, { type Test as Tap } from 'tap';
import { existsSync, mkdirSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { missingTools, runCommand } from '../../helpers/command.js';
import { changeSet, full, NFT, runOnce, type Svc } from '../../helpers/allip-nft-states.js';
import { netnsMissing, PODS, Topology, XIP, type PodName } from '../../helpers/netns-topology.js';
import { PersistentCallout } from '../../helpers/persistent-callout.js';

const noJq = missingTools(['jq']).length > 0;
const reason = noJq ? 'jq is missing' : await netnsMissing();
if (reason) console.error(`# skipping kpng-example-allip-nft traffic after change sets: ${reason}`);

t.test('kpng-example-allip-nft: real traffic after incremental changes', { skip: reason ?? false }, async (t) => {
  const topo = new Topology('nftc');
  t.teardown(() => topo.close());
  await topo.open();
  const stateDir = join(topo.dirPath, 'nft-state');
  mkdirSync(stateDir);
  const pod = (p: PodName) => ({ l4: [PODS[p].v4], l6: [PODS[p].v6] });
  const pods = (...ps: PodName[]) => ({ l4: ps.map((p) => PODS[p].v4), l6: ps.map((p) => PODS[p].v6) });
  let prev: Svc[] | undefined;
  const apply = async (t: Tap, state: Svc[]) => {
    const input = prev ? changeSet(prev, state) : full(state);
    const r = await runOnce(topo.ns.node, input, { KPNG_ALLIP_NFT_STATE_DIR: stateDir, KPNG_CALLOUT_INPUT: prev ? 'changes' : 'full' });
    t.equal(r.code, 0, `the ${prev ? 'change set' : 'full state'} applies`, { stderr: r.stderr });
    prev = state;
  };
  const expectAt = async (t: Tap, addr: string, want: PodName | '', msg: string) => {
    for (const from of ['client', 'node'] as const) {
      const got = want ? await topo.poll(from, addr, 8080, want) : await topo.connect(from, addr, 8080);
      t.equal(got, want, `${msg}: ${from} -> ${addr}`);
    }
  };
  const [v4, v4b] = XIP.v4;
  const [v6, v6b] = XIP.v6;

  await apply(t, [{ name: 'web', x4: [v4], x6: [v6], ...pod('pod1'), r4: [PODS.pod2.v4] }]);
  for (const addr of [v4, v6]) await expectAt(t, addr, 'pod1', 'full state: to pod1');
  // A UDP client that keeps its source port (its conntrack entry lives on).
  const udpPort = (addr: string) => (addr.includes(':') ? 40106 : 40104);
  for (const addr of [v4, v6]) t.equal(await topo.udp('client', addr, 8080, udpPort(addr)), 'pod1', `UDP from one source port: ${addr} -> pod1`);

  await apply(t, [{ name: 'web', x4: [v4], x6: [v6], ...pod('pod2'), r4: [PODS.pod1.v4] }]);
  for (const addr of [v4, v6]) await expectAt(t, addr, 'pod2', 'endpoint moved: to pod2');
  // Its flow to the endpoint that went was deleted (as kube-proxy): the same source port reaches the new one.
  for (const addr of [v4, v6]) t.equal(await topo.udp('client', addr, 8080, udpPort(addr)), 'pod2', `UDP from the same source port after the move: ${addr} -> pod2`);
  const rules = (await runCommand('ip', ['netns', 'exec', topo.ns.node, 'nft', 'list', 'table', 'inet', 'kpng_allip'])).stdout;
  t.notMatch(rules, PODS.pod1.v4, 'no rule for the old IPv4 endpoint');
  t.notMatch(rules, PODS.pod1.v6, 'no rule for the old IPv6 endpoint');

  const web2: Svc = { name: 'web', x4: [v4, v4b], x6: [v6, v6b], ...pod('pod2') };
  await apply(t, [web2]);
  for (const addr of [v4, v4b, v6, v6b]) await expectAt(t, addr, 'pod2', 'two external IPs per family');

  // "db" sorts before "web": the second IP of each family goes to it.
  const db: Svc = { name: 'db', x4: [v4b], x6: [v6b], ...pod('pod1') };
  await apply(t, [db, web2]);
  for (const addr of [v4b, v6b]) await expectAt(t, addr, 'pod1', 'shared external IP: to the first Service');
  for (const addr of [v4, v6]) await expectAt(t, addr, 'pod2', 'the other IPs stay');

  await apply(t, [db, { ...web2, ...pods('pod1', 'pod2') }]);
  for (const addr of [v4, v6]) {
    const seen = new Set<string>();
    for (let i = 0; i < 4; i++) seen.add(await topo.connect(i % 2 ? 'node' : 'client', addr));
    t.same([...seen].sort(), ['pod1', 'pod2'], `several local endpoints: connections to ${addr} reach both pods`);
  }

  await apply(t, [{ ...web2, ...pods('pod1', 'pod2') }]);
  for (const addr of [v4b, v6b]) {
    const seen = new Set<string>();
    for (let i = 0; i < 4; i++) seen.add(await topo.connect(i % 2 ? 'node' : 'client', addr));
    t.same([...seen].sort(), ['pod1', 'pod2'], `the shared IP's first Service removed: ${addr} goes to the other`);
  }

  await apply(t, []);
  for (const addr of [v4, v4b, v6, v6b]) await expectAt(t, addr, '', 'all Services removed: refused by the node');
  t.ok(existsSync(stateDir) && readdirSync(stateDir).length === 1, 'one recorded state for the node namespace');

  // Persistent: a change frame and a full frame that move the endpoint clear its UDP flows too.
  const p = new PersistentCallout(NFT, topo.ns.node, {});
  t.teardown(() => void p.child.stdin!.end());
  const at1: Svc[] = [{ name: 'web', x4: [v4], x6: [v6], ...pod('pod1') }];
  const at2: Svc[] = [{ name: 'web', x4: [v4], x6: [v6], ...pod('pod2') }];
  t.equal(await p.frame('full', full(at1)), 'ok');
  for (const addr of [v4, v6]) t.equal(await topo.udp('client', addr, 9090, udpPort(addr)), 'pod1', `persistent: UDP ${addr} -> pod1`);
  t.equal(await p.frame('changes', changeSet(at1, at2)), 'ok');
  for (const addr of [v4, v6]) t.equal(await topo.udp('client', addr, 9090, udpPort(addr)), 'pod2', `persistent change frame: the same source port -> pod2`);
  t.equal(await p.frame('full', full(at1)), 'ok');
  for (const addr of [v4, v6]) t.equal(await topo.udp('client', addr, 9090, udpPort(addr)), 'pod1', `persistent full frame: the same source port -> pod1`);
  t.same(await p.end(), { code: 0, signal: null });
  t.end();
});
