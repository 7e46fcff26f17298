/**
 * service-proxy-nft's two planners of a full state, applied for real in a
 * network namespace the test creates (root, nft, node): node (the callout's
 * choice for a state of 2 MiB or more when there is one, or with
 * SERVICE_PROXY_NFT_PLANNER=node; its script streamed into `nft -f /dev/fd/0`) and
 * jq with awk (SERVICE_PROXY_NFT_PLANNER=awk, and the fallback) leave the same
 * table; a state node is not sure of is applied by jq and awk, with their log;
 * without node on PATH the callout still applies; nft refusing the node
 * planner's script (a table of its name another process owns) sends the
 * state to jq and awk, whose nft -f fails too: exit 1, nothing changed. The scripts compared
 * without root: test/callouts/service-proxy-nft-full.test.ts.
 */
import t from 'tap';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdirSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { mustRun, runCommand } from '../../helpers/command.js';
import { tempDir } from '../../helpers/files.js';
import { repoPath } from '../../helpers/fixtures.js';
import { netnsMissing } from '../../helpers/netns.js';
import { tableShape } from '../../helpers/nft-table.js';
import { lines, prev, run, svc } from '../../helpers/service-proxy-lines.js';
import { stateText } from '../../helpers/service-states.js';
import { VARIED, randomState } from '../../helpers/service-proxy-varied.js';
import { pollUntil } from '../../helpers/wait.js';

const NFT = repoPath('callouts/service-proxy-nft');

/** An IPv6 Service line: ClusterIP `ip`, TCP 80 -> 8080 and 443 -> 8443 on endpoints `eps`. */
const svc6 = (name: string, ip: string, eps: string[]): string =>
  JSON.stringify({
    Service: { Namespace: 'big', Name: name, Type: 'ClusterIP', IPs: { ClusterIPs: { V6: [ip] } }, Ports: [{ Name: 'http', Protocol: 1, Port: 80, TargetPort: 8080 }, { Name: 'https', Protocol: 1, Port: 443, TargetPort: 8443 }] },
    Endpoints: eps.map((e) => ({ IPs: { V6: [e] }, PortOverrides: [{ Name: 'http', Port: 8080 }, { Name: 'https', Port: 8443 }], Scopes: { Internal: true, External: true } })),
  });
const NS_PREFIX = 'kpspp-';
const why = await netnsMissing(NS_PREFIX, ['ip', 'nft', 'jq', 'node'], 'apt-get install iproute2 nftables jq');

t.test('service-proxy-nft: node and jq with awk apply the same table', { skip: why ?? false }, async (t) => {
  const ns = `${NS_PREFIX}${process.pid}`;
  await mustRun('ip', ['netns', 'add', ns]);
  t.teardown(() => runCommand('ip', ['netns', 'del', ns]).then(() => undefined));
  const nft = (...args: string[]): Promise<string> => mustRun('ip', ['netns', 'exec', ns, 'nft', ...args]);
  const apply = (input: string, env: NodeJS.ProcessEnv = {}) => run(NFT, input, env, ns);
  /** The table: its sets with sorted elements, its chains and rules, and the names of all chains. */
  const table = async () => {
    const json = await nft('-j', 'list', 'table', 'inet', 'kpng_service_proxy');
    const chains = (JSON.parse(json) as { nftables: Array<{ chain?: { name: string } }> }).nftables.flatMap((o) => (o.chain ? [o.chain.name] : []));
    return { shape: tableShape(json), chains: chains.sort() };
  };

  for (const [what, state] of [
    ['varied Services', stateText(VARIED)],
    ['240 random Services', randomState(240, 7)],
  ] as const) {
    const byAwk = await apply(state, { SERVICE_PROXY_NFT_PLANNER: 'awk' });
    t.equal(byAwk.code, 0, `${what}: jq and awk apply it`, { stderr: byAwk.stderr });
    t.notMatch(byAwk.stderr, /\(node\)/);
    const expected = await table();
    const byNode = await apply(state, { SERVICE_PROXY_NFT_PLANNER: 'node' });
    t.equal(byNode.code, 0, `${what}: node applies it`, { stderr: byNode.stderr });
    t.match(byNode.stderr, /full state: \d+ Services planned \(node\)/, 'planned by node');
    t.same(await table(), expected, `${what}: the same table`);
    t.equal((await apply(state, { SERVICE_PROXY_NFT_PLANNER: 'node' })).code, 0, 'again');
    t.same(await table(), expected, 'idempotent');
    // on node's table, awk's change sets apply (their guards check node's gen elements):
    // each Service in turn without its endpoints, then back
    for (const line of state.split('\n').filter(Boolean).slice(0, 12)) {
      const o = JSON.parse(line) as { Endpoints: unknown };
      const bare = JSON.stringify({ ...o, Endpoints: null });
      const there = await apply(lines(prev(line), bare), { KPNG_CALLOUT_INPUT: 'changes' });
      // (a cluster IP two Services hold: a change set to either is refused, as documented)
      if (there.code !== 0 && /cipdups/.test(there.stderr)) continue;
      const back = await apply(lines(prev(bare), line), { KPNG_CALLOUT_INPUT: 'changes' });
      if (there.code !== 0 || back.code !== 0) t.fail(`${what}: a change set on node's table`, { line, stderr: there.stderr + back.stderr });
    }
    t.same(await table(), expected, `${what}: change sets on node's table apply, and back to it`);
  }

  await t.test('by default, node plans a state of 2 MiB or more, jq and awk a smaller one', async (t) => {
    const small = await apply(lines(svc('d', 'a', '192.0.2.45')));
    t.equal(small.code, 0, { stderr: small.stderr });
    t.notMatch(small.stderr, /\(node\)/, 'a small state: jq and awk');
    // 1,200 Services of 10 endpoints (IPv6: the documentation range has room)
    const eps = Array.from({ length: 10 }, (_, j) => `2001:db8:200::${j + 1}`);
    const big = Array.from({ length: 1200 }, (_, i) => svc6(`svc-${String(i).padStart(4, '0')}`, `2001:db8:100::${(i + 1).toString(16)}`, eps)).join('\n') + '\n';
    t.ok(big.length >= 2 * 1024 * 1024, `${big.length} bytes`);
    const r = await apply(big);
    t.equal(r.code, 0, { stderr: r.stderr });
    t.match(r.stderr, /full state: 1200 Services planned \(node\)/, 'a state of 2 MiB: node');
    t.match(await nft('list', 'set', 'inet', 'kpng_service_proxy', 'clusterips6'), /2001:db8:100::4b0/, 'applied');
  });

  await t.test('a state node is not sure of: applied by jq and awk, which log what they skip', async (t) => {
    const good = svc('d', 'ok', '192.0.2.40');
    const bad = svc('d', 'bad', '192.0.2.41', { eps: ['198.51.100.300', '198.51.100.41'] });
    const r = await apply(lines(good, bad), { SERVICE_PROXY_NFT_PLANNER: 'node' });
    t.equal(r.code, 0, { stderr: r.stderr });
    t.match(r.stderr, /skipping endpoint address "198\.51\.100\.300"/, "awk's log");
    t.notMatch(r.stderr, /\(node\)|syntax error/, 'nothing of the node planner or of the script it left unfinished');
    const svc4 = await nft('list', 'map', 'inet', 'kpng_service_proxy', 'svc4');
    t.match(svc4, /192\.0\.2\.40 \. tcp \. 80/);
    t.match(svc4, /192\.0\.2\.41 \. tcp \. 80/);
  });

  await t.test('without node on PATH: jq and awk', async (t) => {
    const dir = tempDir(t, 'kpng-spp-');
    const bin = join(dir, 'bin');
    mkdirSync(bin);
    // the tools the callout needs, and no node
    for (const tool of ['ip', 'sh', 'jq', 'awk', 'mawk', 'nft', 'cat', 'mktemp', 'rm', 'mkdir', 'sort', 'wc', 'grep', 'tr', 'conntrack']) {
      const p = (await runCommand('sh', ['-c', 'command -v "$1"', 'sh', tool])).stdout.trim();
      if (p) symlinkSync(p, join(bin, tool));
    }
    const r = await apply(lines(svc('d', 'a', '192.0.2.42')), { PATH: bin, SERVICE_PROXY_NFT_PLANNER: 'node' });
    t.equal(r.code, 0, { stderr: r.stderr });
    t.notMatch(r.stderr, /\(node\)/);
    t.match(await nft('list', 'map', 'inet', 'kpng_service_proxy', 'svc4'), /192\.0\.2\.42 \. tcp \. 80/);
  });

  await t.test('nft refusing the streamed script: the run fails, changing nothing', async (t) => {
    // a table of its name that another process owns (flags owner): the kernel
    // refuses every change to it while that process lives
    await nft('delete', 'table', 'inet', 'kpng_service_proxy');
    const owner = spawn('ip', ['netns', 'exec', ns, 'nft', '-i'], { stdio: ['pipe', 'ignore', 'ignore'] });
    t.teardown(() => void owner.kill());
    owner.stdin.write('add table inet kpng_service_proxy { flags owner; }\n');
    await pollUntil(async () => /kpng_service_proxy/.test(await nft('list', 'tables')), 'the owned table');
    const r = await apply(lines(svc('d', 'b', '192.0.2.44')), { SERVICE_PROXY_NFT_PLANNER: 'node' });
    t.equal(r.code, 1, 'exit 1', { stderr: r.stderr });
    t.match(r.stderr, /Operation not permitted/, "nft's error");
    t.match(r.stderr, /nft refused the node planner's script; planning with jq and awk/, 'then jq and awk try');
    t.match(r.stderr, /nft -f failed; rules unchanged/, 'and fail too');
    t.match(await nft('list', 'table', 'inet', 'kpng_service_proxy'), /^table inet kpng_service_proxy \{[^\n]*\n\s*flags owner\s*\}\s*$/, 'the table as it was');
    owner.stdin.end();
    await once(owner, 'exit');
    const again = await apply(lines(svc('d', 'b', '192.0.2.44')), { SERVICE_PROXY_NFT_PLANNER: 'node' });
    t.equal(again.code, 0, 'once its owner is gone, the state applies', { stderr: again.stderr });
  });
});
