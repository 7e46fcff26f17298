/**
 * DRY_RUN=1 of the bundled all-ip callouts: the exact ruleset they would apply,
 * without root and without touching the kernel, through `kpng-callout replay`
 * (the README's Quick start) and fed directly, with hostile and malformed
 * states. Needs jq; skips, saying why, without it. The same callouts with real
 * traffic: allip.test.ts.
 */
import t from 'tap';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const IPT = join(root, 'callouts/kpng-example-allip');
const NFT = join(root, 'callouts/kpng-example-allip-nft');

function run(cmd: string, args: string[], input = '', env: NodeJS.ProcessEnv = {}) {
  // env -u NODE_OPTIONS: tap adds its loaders to every child's NODE_OPTIONS, and they cannot load the extensionless ESM bin.
  const r = spawnSync('/usr/bin/env', ['-u', 'NODE_OPTIONS', cmd, ...args], {
    input,
    encoding: 'utf8',
    env: { ...process.env, DRY_RUN: '1', ...env },
    cwd: root,
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

const noJq = spawnSync('sh', ['-c', 'command -v jq']).status !== 0;
if (noJq) console.error('# skipping callout dry-run tests: jq is missing (apt-get install jq)');

const IPT_BLOG = `# iptables-restore --noflush
*nat
:KPNG-ALLIP - [0:0]
-A KPNG-ALLIP -d 10.0.0.55/32 -j DNAT --to-destination 11.0.2.2
-I PREROUTING -j KPNG-ALLIP
-I OUTPUT -j KPNG-ALLIP
COMMIT
# ip6tables-restore --noflush
*nat
:KPNG-ALLIP - [0:0]
-A KPNG-ALLIP -d 1000::55/128 -j DNAT --to-destination 1100::202
-I PREROUTING -j KPNG-ALLIP
-I OUTPUT -j KPNG-ALLIP
COMMIT
`;

/** The nft script for the given map elements and rules. */
function nftScript(elems4: string[], elems6: string[], rules: string[] = []): string {
  const map = (fam: number, type: string, elems: string[]) =>
    `\tmap dnat${fam} {\n\t\ttype ${type} : ${type}\n` +
    (elems.length ? `\t\telements = {\n${elems.map((e) => `\t\t\t${e},\n`).join('')}\t\t}\n` : '') +
    '\t}\n';
  return (
    'table inet kpng_allip {}\ndelete table inet kpng_allip\ntable inet kpng_allip {\n' +
    map(4, 'ipv4_addr', elems4) +
    map(6, 'ipv6_addr', elems6) +
    '\tchain services {\n' +
    rules.map((r) => `\t\t${r}\n`).join('') +
    '\t\tdnat ip to ip daddr map @dnat4\n\t\tdnat ip6 to ip6 daddr map @dnat6\n\t}\n' +
    '\tchain prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}\n' +
    '\tchain output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}\n}\n'
  );
}

const line = (svc: object, endpoints: unknown) => JSON.stringify({ Service: svc, Endpoints: endpoints }) + '\n';

t.test('callout dry runs', { skip: noJq ? 'jq is missing' : false }, async (t) => {
  t.test('the blog state through replay (Quick start)', async (t) => {
    const fixture = 'fixtures/kpng-example.jsonl';
    const ipt = run(process.execPath, ['bin/kpng-callout', 'replay', '-q', fixture, '--once', '--callout', IPT]);
    t.equal(ipt.code, 0);
    t.equal(ipt.stdout, IPT_BLOG);
    const nft = run(process.execPath, ['bin/kpng-callout', 'replay', '-q', fixture, '--once', '--callout', NFT]);
    t.equal(nft.code, 0);
    t.equal(nft.stdout, nftScript(['10.0.0.55 : 11.0.2.2'], ['1000::55 : 1100::202']));
    t.end();
  });

  t.test('several local endpoints, load-balancer IPs, canonical IPv6, first claim wins', async (t) => {
    const state =
      line(
        { Namespace: 'a', Name: 'lb', IPs: { ExternalIPs: { V6: ['2001:DB8:0:0::10'] }, LoadBalancerIPs: { V4: ['192.0.2.20'] } } },
        [
          { IPs: { V4: ['198.51.100.2'] }, Local: true },
          { IPs: { V4: ['198.51.100.3'] }, Local: true },
          { IPs: { V4: ['198.51.100.4'] }, Local: true },
          { IPs: { V6: ['2001:db8:1::0002'] }, Local: true },
          { IPs: { V4: ['198.51.100.9'] } },
        ],
      ) +
      line({ Namespace: 'b', Name: 'dup', IPs: { ExternalIPs: { V4: ['192.0.2.20'], V6: ['2001:db8::10'] } } }, [
        { IPs: { V4: ['198.51.100.5'], V6: ['2001:db8:1::5'] }, Local: true },
      ]) +
      line({ Namespace: 'c', Name: 'none', IPs: { ExternalIPs: { V4: ['192.0.2.30'] } } }, null);
    const ipt = run(IPT, [], state);
    t.equal(ipt.code, 0);
    t.equal(
      ipt.stdout,
      `# iptables-restore --noflush
*nat
:KPNG-ALLIP - [0:0]
-A KPNG-ALLIP -d 192.0.2.20/32 -m statistic --mode nth --every 3 --packet 0 -j DNAT --to-destination 198.51.100.2
-A KPNG-ALLIP -d 192.0.2.20/32 -m statistic --mode nth --every 2 --packet 0 -j DNAT --to-destination 198.51.100.3
-A KPNG-ALLIP -d 192.0.2.20/32 -j DNAT --to-destination 198.51.100.4
-I PREROUTING -j KPNG-ALLIP
-I OUTPUT -j KPNG-ALLIP
COMMIT
# ip6tables-restore --noflush
*nat
:KPNG-ALLIP - [0:0]
-A KPNG-ALLIP -d 2001:db8::10/128 -j DNAT --to-destination 2001:db8:1::2
-I PREROUTING -j KPNG-ALLIP
-I OUTPUT -j KPNG-ALLIP
COMMIT
`,
    );
    t.match(ipt.stderr, /"b\/dup": skipping external IP 192\.0\.2\.20: already used by "a\/lb"/);
    t.match(ipt.stderr, /"b\/dup": skipping external IP 2001:db8::10: already used by "a\/lb"/);
    const nft = run(NFT, [], state);
    t.equal(nft.code, 0);
    t.equal(
      nft.stdout,
      nftScript([], ['2001:db8::10 : 2001:db8:1::2'], [
        'ip daddr 192.0.2.20 dnat ip to numgen inc mod 3 map { 0 : 198.51.100.2, 1 : 198.51.100.3, 2 : 198.51.100.4 }',
      ]),
    );
    const noLb = run(IPT, [], state, { KPNG_ALLIP_LB_IPS: '0' });
    t.match(noLb.stdout, /-d 192\.0\.2\.20\/32 -j DNAT --to-destination 198\.51\.100\.5\n/, 'without LB IPs, b/dup gets 192.0.2.20');
    t.end();
  });

  t.test('hostile and malformed strings give no rule and run nothing', async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'allip-dry-'));
    t.teardown(() => rmSync(dir, { recursive: true, force: true }));
    const marker = join(dir, 'pwned');
    const hostile = [
      `$(touch ${marker})`,
      `\`touch ${marker}\``,
      `192.0.2.1; touch ${marker}`,
      '192.0.2.1 -j ACCEPT',
      '192.0.2.1\n-A PREROUTING -j DROP',
      '192.0.2.1\t198.51.100.66',
      '192.0.2.1/0',
      '-F',
      '2001:db8::1\n}\ntable inet evil {',
      '2001:db8::1 : 2001:db8::66, ::/0',
      'fe80::1%eth0',
      '1:2:3:4:5:6:7:8:9',
      '1::2::3',
      '0x7f.1',
      '192.0.2.010',
      '256.1.1.1',
      '\u001b[2J',
      '',
      12,
      { V4: '192.0.2.1' },
      null,
    ];
    const state =
      line({ Namespace: 'x', Name: 'evil\nname', IPs: { ExternalIPs: { V4: hostile, V6: hostile } } }, [
        { IPs: { V4: ['198.51.100.2'], V6: ['2001:db8:1::2'] }, Local: true },
      ]) +
      line({ Namespace: 'x', Name: 'evil-endpoints', IPs: { ExternalIPs: { V4: ['192.0.2.40'], V6: ['2001:db8::40'] } } }, [
        { IPs: { V4: [`$(touch ${marker})`], V6: ['-j DROP'] }, Local: true },
        { IPs: { V4: '198.51.100.2' }, Local: true },
        { IPs: { V4: ['198.51.100.3'] }, Local: 'true' },
        'x',
        7,
      ]) +
      line({ Namespace: 'x', Name: 'odd-shapes', IPs: 'nope' }, 'nope') +
      '[1,2]\nnull\n"s"\n{"Service":7}\n';
    for (const callout of [IPT, NFT]) {
      const r = run(callout, [], state);
      t.equal(r.code, 0, 'exits 0');
      t.notOk(existsSync(marker), 'no command from the state ran');
      t.equal(r.stdout, callout === IPT ? IPT_BLOG.replace(/^-A .*\n/gm, '') : nftScript([], []), 'no rule at all');
      t.match(r.stderr, /skipping external IP "\$\(touch/, 'hostile strings are logged');
      t.notMatch(r.stderr, /\u001b/, 'logs hold no control characters');
    }
    t.end();
  });

  t.test('input that is not JSON: exit 1, nothing printed', async (t) => {
    for (const callout of [IPT, NFT]) {
      const r = run(callout, [], '{"Service":\n');
      t.equal(r.code, 1);
      t.equal(r.stdout, '');
      t.match(r.stderr, /cannot read the state as JSON lines; nothing changed/);
    }
    t.end();
  });
  t.end();
});
