/**
 * callouts/service-proxy-iptables: the order of its restore input, which is
 * what keeps `iptables-nft-restore --noflush` linear (the plan awk's header:
 * iptables-nft 1.8.9 files every chain name of a batch in a sorted list
 * walked from its smallest name; in the natural order 1,000 Services took
 * ~66 s there). Checked without root on DRY_RUN output, by replaying that
 * list: every name a line mentions is among the first few of it. With root
 * and `ip netns`, in a namespace of its own: chains of the layout before
 * this one (KPNG-SP-S-/X-/E-hash) are all removed by the first run, the
 * chains of a removed endpoint and of a removed Service go, and a foreign
 * rule stays.
 */
import t from 'tap';
import { runCommand, mustRun } from '../../helpers/command.js';
import { repoPath } from '../../helpers/fixtures.js';
import { netnsMissing } from '../../helpers/netns.js';

const CALLOUT = repoPath('callouts/service-proxy-iptables');

/** One Service line: `eps` IPv4 endpoints from 198.51.100.0/24, ports http 80 -> 8080 and dns/UDP 53, one external IP. */
function service(i: number, eps: number): string {
  return JSON.stringify({
    Service: {
      Namespace: 'ns',
      Name: `svc-${String(i).padStart(3, '0')}`,
      Type: 'ClusterIP',
      IPs: { ClusterIPs: { V4: [`192.0.2.${i + 1}`] }, ExternalIPs: { V4: [`203.0.113.${i + 1}`] } },
      Ports: [
        { Name: 'http', Protocol: 1, Port: 80, TargetPort: 8080 },
        { Name: 'dns', Protocol: 2, Port: 53, TargetPort: 53, NodePort: 30000 + i },
      ],
    },
    Endpoints: Array.from({ length: eps }, (_, j) => ({ IPs: { V4: [`198.51.100.${(i * 7 + j) % 250}`] }, Scopes: { Internal: true, External: j % 2 === 0 } })),
  });
}
const state = (n: number, eps: (i: number) => number): string =>
  Array.from({ length: n }, (_, i) => service(i, eps(i)))
    .sort()
    .join('\n') + '\n';

/** A DRY_RUN's IPv4 parts: the chains created first (their names; and per transaction, how many) and the main transaction's nat section. */
async function dryRun(input: string): Promise<{ created: string[]; sections: number[]; nat: string[] }> {
  const r = await runCommand(CALLOUT, [], { input, env: { ...process.env, DRY_RUN: '1' } });
  if (r.code !== 0) throw new Error(`DRY_RUN exited ${r.code}: ${r.stderr}`);
  const lines = r.stdout.split('\n');
  const pre = lines.indexOf('# iptables-restore --noflush (the chains to add, created first)');
  const main = lines.indexOf('# iptables-restore --noflush');
  const from = lines.indexOf('*nat', main);
  return {
    created: lines.slice(pre, main).filter((l) => l.startsWith(':')).map((l) => l.slice(1).split(' ')[0]!),
    sections: lines
      .slice(pre, main)
      .join('\n')
      .split('*nat')
      .slice(1)
      .map((sec) => sec.split('\n').filter((l) => l.startsWith(':')).length),
    nat: lines.slice(from, lines.indexOf('COMMIT', from) + 1),
  };
}

/** The chain names a restore line mentions, as iptables-nft files them (its chain, then a jump target that is not a target extension). */
function mentioned(line: string): string[] {
  const w = line.split(' ');
  if (line.startsWith(':')) return [w[0]!.slice(1)];
  if (w[0] === '-X') return [w[1]!];
  if (w[0] !== '-A' && w[0] !== '-I' && w[0] !== '-D') return [];
  const out = [w[1]!];
  const j = w.indexOf('-j');
  if (j > 0 && /^KPNG-SP-/.test(w[j + 1] ?? '')) out.push(w[j + 1]!);
  return out;
}

t.test('DRY_RUN: each name a line mentions is among the first of the sorted names so far', async (t) => {
  // 120 Services, 1 to 12 endpoints each: 240 Service ports, ~1,600 chains.
  const { nat, created, sections } = await dryRun(state(120, (i) => 1 + (i % 12)));
  const sorted: string[] = [];
  let worst = 0;
  let worstLine = '';
  const declared = new Set<string>();
  for (const line of nat) {
    if (line.startsWith(':')) declared.add(line.slice(1).split(' ')[0]!);
    const j = line.split(' ').indexOf('-j');
    const target = j > 0 ? line.split(' ')[j + 1]! : '';
    if (line.startsWith('-A') && target.startsWith('KPNG-SP-') && !declared.has(target)) t.fail(`jump before the declaration of ${target}: ${line}`);
    for (const name of mentioned(line)) {
      // The walk: names smaller than this one (byte order, as strcmp), passed before it is found or inserted.
      let lo = 0;
      let hi = sorted.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (Buffer.compare(Buffer.from(sorted[mid]!), Buffer.from(name)) < 0) lo = mid + 1;
        else hi = mid;
      }
      if (name.startsWith('KPNG-SP-') && lo > worst) {
        worst = lo;
        worstLine = line;
      }
      if (sorted[lo] !== name) sorted.splice(lo, 0, name);
    }
  }
  t.ok(sorted.length > 1500, `${sorted.length} chain names mentioned`);
  // Before one of our names: at most the shared chains and one Service port's (2 + 12 endpoints). The
  // built-in chains (a few lines) sort after ours and walk the list; the layout before this one walked ~2,000 here.
  t.ok(worst <= 4 + 14, `longest walk to one of our names: ${worst} names (${worstLine})`);
  // Created apart, in an order far from sorted (iptables-nft-save's quicksort takes its first chain as pivot).
  const declaredInMain = nat.filter((l) => l.startsWith(':')).map((l) => l.slice(1).split(' ')[0]!);
  t.same([...created].sort(), [...declaredInMain].sort(), 'every chain of the main transaction is created first');
  let ascents = 0;
  for (let i = 1; i < created.length; i++) if (Buffer.compare(Buffer.from(created[i - 1]!), Buffer.from(created[i]!)) < 0) ascents++;
  const share = ascents / (created.length - 1);
  t.ok(share > 0.25 && share < 0.75, `creation order neither sorted nor reversed (${(share * 100).toFixed(0)}% ascents)`);
  t.ok(sections.length > 1 && sections.every((n) => n <= 1000), `in transactions of at most 1,000 chains (${sections.join(', ')})`);
  const perPort = nat.filter((l) => /^:KPNG-SP-T/.test(l)).map((l) => l.slice(1).split(' ')[0]!);
  t.ok(
    perPort.every((c) => c.length <= 28 && /^KPNG-SP-T[a-z2-7]{11}(S|X|E[a-z2-7]{7})$/.test(c)),
    'per-Service-port chains: KPNG-SP-T + group + S, X or E + endpoint, at most 28 characters',
  );
});

const why = await netnsMissing('kpspo', ['ip', 'iptables-restore', 'iptables-save', 'jq'], 'apt-get install iproute2 iptables jq');
if (why) console.error(`# skipping the namespace part: ${why}`);

t.test('in a namespace: the layout before this one, a removed endpoint, a removed Service', { skip: why ?? false }, async (t) => {
  const ns = `kpspo${process.pid}-node`;
  await mustRun('ip', ['netns', 'add', ns]);
  t.teardown(() => runCommand('ip', ['netns', 'del', ns]));
  const inNs = (cmd: string, args: string[], input?: string) => runCommand('ip', ['netns', 'exec', ns, cmd, ...args], input === undefined ? {} : { input });
  const natChains = async () => (await mustRun('ip', ['netns', 'exec', ns, 'iptables-save', '-t', 'nat'])).split('\n').filter((l) => l.startsWith(':KPNG-SP-')).map((l) => l.slice(1).split(' ')[0]!);
  // The previous layout's chains, jumped to as that version did, and a foreign rule.
  const old = [
    '*nat',
    ':KPNG-SP-SERVICES - [0:0]',
    ':KPNG-SP-MARK-MASQ - [0:0]',
    ':KPNG-SP-E-aaaaaaaaaaaaaaaa - [0:0]',
    ':KPNG-SP-S-bbbbbbbbbbbbbbbb - [0:0]',
    ':KPNG-SP-X-bbbbbbbbbbbbbbbb - [0:0]',
    '-A KPNG-SP-E-aaaaaaaaaaaaaaaa -p udp -m udp -j DNAT --to-destination 198.51.100.9:53',
    '-A KPNG-SP-S-bbbbbbbbbbbbbbbb -j KPNG-SP-E-aaaaaaaaaaaaaaaa',
    '-A KPNG-SP-X-bbbbbbbbbbbbbbbb -j KPNG-SP-MARK-MASQ',
    '-A KPNG-SP-X-bbbbbbbbbbbbbbbb -j KPNG-SP-S-bbbbbbbbbbbbbbbb',
    '-A KPNG-SP-SERVICES -d 192.0.2.200/32 -p udp -m udp --dport 53 -j KPNG-SP-S-bbbbbbbbbbbbbbbb',
    '-A KPNG-SP-SERVICES -d 203.0.113.200/32 -p udp -m udp --dport 53 -j KPNG-SP-X-bbbbbbbbbbbbbbbb',
    '-A PREROUTING -j KPNG-SP-SERVICES',
    '-A PREROUTING -d 192.0.2.250/32 -j ACCEPT',
    'COMMIT',
    '',
  ].join('\n');
  const loaded = await inNs('iptables-restore', ['--noflush'], old);
  t.equal(loaded.code, 0, `the old layout loads ${loaded.stderr}`);

  const first = await inNs(CALLOUT, [], state(3, () => 3));
  t.equal(first.code, 0, `first run ${first.stderr}`);
  let chains = await natChains();
  t.same(
    chains.filter((c) => /^KPNG-SP-[SXE]-/.test(c)),
    [],
    'no chain of the old layout is left',
  );
  // 3 Services × 2 ports: S and X each (the UDP port's X: half the endpoints are External), 3 E chains per port.
  t.equal(chains.filter((c) => c.startsWith('KPNG-SP-T')).length, 3 * 2 * (2 + 3), 'the new chains are there');

  // Service 1 loses an endpoint, Service 2 goes.
  const next = [service(0, 3), service(1, 2)].sort().join('\n') + '\n';
  const second = await inNs(CALLOUT, [], next);
  t.equal(second.code, 0, `second run ${second.stderr}`);
  t.match(second.stderr, /IPv4: 4 service ports with endpoints/, 'its log counts the ports it keeps, not the deleted ones');
  chains = await natChains();
  t.equal(chains.filter((c) => c.startsWith('KPNG-SP-T')).length, 2 * (2 + 3) + 2 * (2 + 2), 'the removed endpoint and Service left no chain');
  const saved = await mustRun('ip', ['netns', 'exec', ns, 'iptables-save', '-t', 'nat']);
  t.match(saved, /-A PREROUTING -d 192\.0\.2\.250\/32 -j ACCEPT/, 'the foreign rule is still there');
  t.equal(saved.match(/-A PREROUTING -j KPNG-SP-SERVICES/g)?.length, 1, 'one jump into KPNG-SP-SERVICES');
  t.notMatch(saved, /192\.0\.2\.3\//, 'nothing of the removed Service');
});
