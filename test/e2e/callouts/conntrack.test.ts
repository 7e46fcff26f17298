/**
 * callouts/lib/conntrack.sh (the UDP flow cleanup of the nft and iptables
 * callouts), sourced by sh in a network namespace the test creates, against
 * real conntrack entries: UDP datagrams sent inside the namespace (loopback,
 * documentation addresses) while an nft rule keeps connection tracking on.
 * - a few lines: deleted one by one, only the flows they describe;
 * - many lines (a big change set): one listing, only the matching flows
 *   deleted, wildcards (`any` destination or port, `-` reply source) and
 *   both families; a line that fails the checks is skipped;
 * - many flows that one line describes (a busy UDP endpoint that went): one
 *   deletion for the line, not one per flow (each walks the whole table);
 * - a namespace without flows starts no conntrack process at all.
 * What the callouts write into the file is tested with real traffic in
 * service-proxy-traffic.test.ts and allip-nft-traffic.test.ts.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { mustRun, runCommand } from '../../helpers/command.js';
import { repoPath } from '../../helpers/fixtures.js';
import { tempDir } from '../../helpers/files.js';
import { netnsMissing } from '../../helpers/netns.js';

const LIB = repoPath('callouts/lib/conntrack.sh');
const NS_PREFIX = 'kpct-';
const why = await netnsMissing(NS_PREFIX, ['ip', 'nft', 'conntrack', 'socat'], 'apt-get install iproute2 nftables conntrack socat');
const dir = tempDir(t, 'kpng-conntrack-');

t.test('udp_flows_clear against real conntrack entries', { skip: why ?? false }, async (t) => {
  const ns = `${NS_PREFIX}${process.pid}-lab`;
  await mustRun('ip', ['netns', 'add', ns]);
  t.teardown(() => runCommand('ip', ['netns', 'del', ns]).then(() => undefined));
  const exec = (cmd: string, args: string[], env: NodeJS.ProcessEnv = {}, input = '') =>
    runCommand('ip', ['netns', 'exec', ns, cmd, ...args], { env: { ...process.env, ...env }, input, timeoutMs: 30_000 });
  await mustRun('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
  for (const a of ['192.0.2.5/32', '192.0.2.6/32']) await mustRun('ip', ['-n', ns, 'addr', 'add', a, 'dev', 'lo']);
  await mustRun('ip', ['-n', ns, 'addr', 'add', '2001:db8::5/128', 'dev', 'lo', 'nodad']);

  /** One UDP datagram from `sport` to `dest` (`ADDR:PORT`, IPv6 in brackets): one conntrack entry. */
  const send = async (dest: string, sport: number): Promise<void> => {
    const r = await exec('socat', ['-u', '-', `${dest.startsWith('[') ? 'UDP6' : 'UDP4'}:${dest},sourceport=${sport}`], {}, 'x\n');
    t.equal(r.code, 0, `sent to ${dest} from ${sport}`, { stderr: r.stderr });
  };
  /** The flows left, as "DST:DPORT<-SPORT". */
  const flows = async (): Promise<string[]> => {
    const out: string[] = [];
    for (const f of ['ipv4', 'ipv6']) {
      const r = await exec('conntrack', ['-L', '-f', f, '-p', 'udp']);
      for (const l of r.stdout.split('\n')) {
        const m = /src=\S+ dst=(\S+) sport=(\d+) dport=(\d+)/.exec(l);
        if (m) out.push(`${m[1]}:${m[3]}<-${m[2]}`);
      }
    }
    return out.sort();
  };
  const clear = async (name: string, lines: string[], env: NodeJS.ProcessEnv = {}) => {
    const file = join(dir, name);
    writeFileSync(file, lines.map((l) => `${l}\n`).join(''));
    const r = await exec('sh', ['-c', `. '${LIB}' && udp_flows_clear test-callout '${file}'`], env);
    t.equal(r.code, 0, `${name}: status 0`, { stderr: r.stderr });
    return r;
  };
  const make = async (): Promise<void> => {
    await exec('conntrack', ['-F']);
    await send('192.0.2.5:53', 40001);
    await send('192.0.2.6:53', 40002);
    await send('192.0.2.5:54', 40003);
    await send('[2001:db8::5]:53', 40004);
  };
  const all = ['192.0.2.5:53<-40001', '192.0.2.5:54<-40003', '192.0.2.6:53<-40002', '2001:db8::5:53<-40004'];

  await t.test('a namespace without flows: no conntrack process', async (t) => {
    const fake = tempDir(t, 'kpng-conntrack-fake-');
    const log = join(fake, 'calls');
    writeFileSync(join(fake, 'conntrack'), `#!/bin/sh\necho "$*" >>'${log}'\n`, { mode: 0o755 });
    writeFileSync(log, '');
    await clear('idle', ['4 192.0.2.5 53 -'], { PATH: `${fake}:${process.env.PATH}` });
    t.equal(readFileSync(log, 'utf8'), '', 'conntrack was not run');
  });

  // Connection tracking on in the namespace (a rule that uses it).
  const rules = join(dir, 'ct.nft');
  writeFileSync(rules, 'table inet kpct {\n\tchain out {\n\t\ttype filter hook output priority 0;\n\t\tct state new counter\n\t}\n}\n');
  await mustRun('ip', ['netns', 'exec', ns, 'nft', '-f', rules]);

  await t.test('a few lines: only the flows they describe go', async (t) => {
    await make();
    t.same(await flows(), all, 'four flows to start with');
    await clear('few', ['4 192.0.2.5 53 192.0.2.5', '4 192.0.2.6 53 198.51.100.9', '4 any 99 -']);
    t.same(await flows(), all.filter((f) => f !== '192.0.2.5:53<-40001'), 'the untranslated flow to 192.0.2.5:53 is gone, nothing else');
  });

  await t.test('many lines: one listing, the matching flows deleted, wildcards and both families', async (t) => {
    await make();
    const filler = Array.from({ length: 12 }, (_, i) => `4 198.51.100.${i + 1} 80 192.0.2.${i + 100}`);
    await clear('many', [...filler, '4 192.0.2.5 53 -', '4 any 54 192.0.2.5', '6 2001:db8::5 any 2001:db8::5', '4 192.0.2.6;touch 53 -', '5 192.0.2.6 53 -']);
    t.same(await flows(), ['192.0.2.6:53<-40002'], 'all but the flow no line describes (the bad lines are skipped)');
  });

  await t.test('many lines and many flows of one line: one deletion per line, not per flow; the reply source is matched', async (t) => {
    await exec('conntrack', ['-F']);
    // 40 translated flows to 198.51.100.1:53 answered by the endpoint that went (192.0.2.7),
    // and one answered by an endpoint that stays (192.0.2.8)
    const entry = (sport: number, ep: string) =>
      `-I -p udp -s 192.0.2.5 -d 198.51.100.1 --sport ${sport} --dport 53 -t 300 -r ${ep} -q 192.0.2.5 --reply-port-src 53 --reply-port-dst ${sport}\n`;
    const load = join(dir, 'load');
    writeFileSync(load, Array.from({ length: 40 }, (_, i) => entry(41000 + i, '192.0.2.7')).join('') + entry(42000, '192.0.2.8'));
    t.equal((await exec('conntrack', ['-R', load])).code, 0, 'entries loaded');
    t.equal((await flows()).length, 41, '41 flows to start with');
    // a conntrack that logs its -D calls
    const real = (await exec('sh', ['-c', 'command -v conntrack'])).stdout.trim();
    const wrap = tempDir(t, 'kpng-conntrack-wrap-');
    const log = join(wrap, 'calls');
    writeFileSync(join(wrap, 'conntrack'), `#!/bin/sh\ncase $1 in -D) echo "$*" >>'${log}' ;; esac\nexec '${real}' "$@"\n`, { mode: 0o755 });
    writeFileSync(log, '');
    const filler = Array.from({ length: 12 }, (_, i) => `4 203.0.113.${i + 1} 80 192.0.2.${i + 100}`);
    await clear('busy', [...filler, '4 198.51.100.1 53 192.0.2.7'], { PATH: `${wrap}:${process.env.PATH}` });
    t.same(await flows(), ['198.51.100.1:53<-42000'], 'the flows of the endpoint that went are gone, the other stays');
    const calls = readFileSync(log, 'utf8').split('\n').filter(Boolean);
    t.equal(calls.length, 1, `one conntrack -D (${calls.length}: ${calls.slice(0, 3).join('; ')})`);
  });
});
