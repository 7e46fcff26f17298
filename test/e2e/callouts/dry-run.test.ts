/**
 * DRY_RUN=1 of the bundled all-ip callouts: the exact ruleset they would apply,
 * without root and without touching the kernel, through `kpng-callout replay`
 * (the README's Quick start) and fed directly, with hostile and malformed
 * states. Needs jq; skips, saying why, without it. The same callouts with real
 * traffic: allip.test.ts.
 */
import t from 'tap';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { binArgv } from '../../helpers/bin-process.js';
import { missingTools, runCommand, type CommandResult } from '../../helpers/command.js';
import { tempDir } from '../../helpers/files.js';
import { blogJsonlPath, repoPath } from '../../helpers/fixtures.js';

const IPT = repoPath('callouts/kpng-example-allip');
const NFT = repoPath('callouts/kpng-example-allip-nft');

/** Runs `argv` with DRY_RUN=1 (and `env`), `input` on its stdin. */
function dryRun(argv: string[], input = '', env: NodeJS.ProcessEnv = {}): Promise<CommandResult> {
  const [cmd, ...args] = argv;
  return runCommand(cmd!, args, { input, env: { ...process.env, DRY_RUN: '1', ...env } });
}

const noJq = missingTools(['jq']).length > 0;
if (noJq) console.error('# skipping callout dry-run tests: jq is missing (apt-get install jq)');

/** The iptables-restore input (both families) for the given KPNG-ALLIP rules. */
function iptScript(rules4: string[], rules6: string[]): string {
  const family = (restore: string, rules: string[]) =>
    `# ${restore} --noflush\n*nat\n:KPNG-ALLIP - [0:0]\n` + rules.map((r) => `-A KPNG-ALLIP ${r}\n`).join('') + '-I PREROUTING -j KPNG-ALLIP\n-I OUTPUT -j KPNG-ALLIP\nCOMMIT\n';
  return family('iptables-restore', rules4) + family('ip6tables-restore', rules6);
}

/** An external IP with several local endpoints: its own chain in the nft table. */
interface NftMulti {
  fam: 4 | 6;
  ip: string;
  endpoints: string[];
}

/**
 * The nft script for the given map elements (one local endpoint) and external
 * IPs with several; the gen element (a hash of the mapping) as `H` (see `genless`).
 */
function nftScript(elems4: string[], elems6: string[], multis: NftMulti[] = []): string {
  const chain = (m: NftMulti) => `m${m.fam}_${m.fam === 6 ? m.ip.replaceAll(':', '_') : m.ip}`;
  const map = (name: string, type: string, elems: string[]) =>
    `\tmap ${name} {\n\t\ttype ${type}\n` +
    (elems.length ? `\t\telements = {\n${elems.map((e) => `\t\t\t${e},\n`).join('')}\t\t}\n` : '') +
    '\t}\n';
  const multi = (fam: 4 | 6) => multis.filter((m) => m.fam === fam).map((m) => `${m.ip} : goto ${chain(m)}`);
  return (
    'table inet kpng_allip {}\ndelete table inet kpng_allip\ntable inet kpng_allip {\n' +
    '\tset gen {\n\t\ttype mark\n\t\telements = { H }\n\t}\n' +
    map('dnat4', 'ipv4_addr : ipv4_addr', elems4) +
    map('dnat6', 'ipv6_addr : ipv6_addr', elems6) +
    map('multi4', 'ipv4_addr : verdict', multi(4)) +
    map('multi6', 'ipv6_addr : verdict', multi(6)) +
    multis
      .map(
        (m) =>
          `\tchain ${chain(m)} {\n\t\tdnat ${m.fam === 4 ? 'ip' : 'ip6'} to numgen inc mod ${m.endpoints.length} map { ` +
          m.endpoints.map((e, i) => `${i} : ${e}`).join(', ') +
          ' }\n\t}\n',
      )
      .join('') +
    '\tchain services {\n\t\tip daddr vmap @multi4\n\t\tip6 daddr vmap @multi6\n' +
    '\t\tdnat ip to ip daddr map @dnat4\n\t\tdnat ip6 to ip6 daddr map @dnat6\n\t}\n' +
    '\tchain prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}\n' +
    '\tchain output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}\n}\n'
  );
}

/** An nft script with the value of its gen element (a hash of the mapping) as `H`. */
const genless = (script: string) => script.replace(/(\tset gen \{\n\t\ttype mark\n\t\telements = \{ )\d+( \})/, '$1H$2');

const line = (svc: object, endpoints: unknown) => JSON.stringify({ Service: svc, Endpoints: endpoints }) + '\n';

t.test('callout dry runs', { skip: noJq ? 'jq is missing' : false }, async (t) => {
  t.test('the blog state through replay (Quick start)', async (t) => {
    const ipt = await dryRun(binArgv('kpng-callout', ['replay', '-q', blogJsonlPath, '--once', '--callout', IPT]));
    t.equal(ipt.code, 0);
    t.equal(ipt.stdout, iptScript(['-d 10.0.0.55/32 -j DNAT --to-destination 11.0.2.2'], ['-d 1000::55/128 -j DNAT --to-destination 1100::202']));
    const nft = await dryRun(binArgv('kpng-callout', ['replay', '-q', blogJsonlPath, '--once', '--callout', NFT]));
    t.equal(nft.code, 0);
    t.equal(genless(nft.stdout), nftScript(['10.0.0.55 : 11.0.2.2'], ['1000::55 : 1100::202']));
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
    const ipt = await dryRun([IPT], state);
    t.equal(ipt.code, 0);
    t.equal(
      ipt.stdout,
      iptScript(
        [
          '-d 192.0.2.20/32 -m statistic --mode nth --every 3 --packet 0 -j DNAT --to-destination 198.51.100.2',
          '-d 192.0.2.20/32 -m statistic --mode nth --every 2 --packet 0 -j DNAT --to-destination 198.51.100.3',
          '-d 192.0.2.20/32 -j DNAT --to-destination 198.51.100.4',
        ],
        ['-d 2001:db8::10/128 -j DNAT --to-destination 2001:db8:1::2'],
      ),
    );
    t.match(ipt.stderr, /"b\/dup": skipping external IP 192\.0\.2\.20: already used by "a\/lb"/);
    t.match(ipt.stderr, /"b\/dup": skipping external IP 2001:db8::10: already used by "a\/lb"/);
    const nft = await dryRun([NFT], state);
    t.equal(nft.code, 0);
    t.equal(
      genless(nft.stdout),
      nftScript([], ['2001:db8::10 : 2001:db8:1::2'], [{ fam: 4, ip: '192.0.2.20', endpoints: ['198.51.100.2', '198.51.100.3', '198.51.100.4'] }]),
    );
    const noLb = await dryRun([IPT], state, { KPNG_ALLIP_LB_IPS: '0' });
    t.match(noLb.stdout, /-d 192\.0\.2\.20\/32 -j DNAT --to-destination 198\.51\.100\.5\n/, 'without LB IPs, b/dup gets 192.0.2.20');
    t.end();
  });

  t.test('hostile and malformed strings give no rule and run nothing', async (t) => {
    const dir = tempDir(t, 'kpng-allip-dry-');
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
      const r = await dryRun([callout], state);
      t.equal(r.code, 0, 'exits 0');
      t.notOk(existsSync(marker), 'no command from the state ran');
      t.equal(callout === IPT ? r.stdout : genless(r.stdout), callout === IPT ? iptScript([], []) : nftScript([], []), 'no rule at all');
      t.match(r.stderr, /skipping external IP "\$\(touch/, 'hostile strings are logged');
      t.notMatch(r.stderr, /\u001b/, 'logs hold no control characters');
    }
    t.end();
  });

  t.test('external IPs Kubernetes refuses (loopback, unspecified, link-local) give no rule', async (t) => {
    const special = {
      V4: ['127.0.0.1', '127.255.255.254', '0.0.0.0', '169.254.169.254', '224.0.0.251', '192.0.2.90'],
      V6: ['::1', '::', 'fe80::1', 'FEBF::1', 'ff02::fb', '::ffff:127.0.0.1', '2001:db8::90'],
    };
    const state = line({ Namespace: 'x', Name: 'special', IPs: { ExternalIPs: special } }, [
      { IPs: { V4: ['198.51.100.2'], V6: ['2001:db8:1::2'] }, Local: true },
    ]);
    for (const callout of [IPT, NFT]) {
      const r = await dryRun([callout], state);
      t.equal(r.code, 0, 'exits 0');
      t.equal(
        callout === IPT ? r.stdout : genless(r.stdout),
        callout === IPT
          ? iptScript(['-d 192.0.2.90/32 -j DNAT --to-destination 198.51.100.2'], ['-d 2001:db8::90/128 -j DNAT --to-destination 2001:db8:1::2'])
          : nftScript(['192.0.2.90 : 198.51.100.2'], ['2001:db8::90 : 2001:db8:1::2']),
        'only the ordinary addresses are mapped',
      );
      t.match(r.stderr, /skipping external IP "127\.0\.0\.1": unspecified, loopback or link-local/, 'logged');
      t.match(r.stderr, /skipping external IP "::ffff:127\.0\.0\.1": unspecified, loopback or link-local/, 'IPv4-mapped too');
    }
    t.end();
  });

  t.test('input that is not JSON: exit 1, nothing printed', async (t) => {
    for (const callout of [IPT, NFT]) {
      const r = await dryRun([callout], '{"Service":\n');
      t.equal(r.code, 1);
      t.equal(r.stdout, '');
      t.match(r.stderr, /cannot read the state as JSON lines; nothing changed/);
    }
    t.end();
  });
  t.end();
});
