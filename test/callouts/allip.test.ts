/**
 * End-to-end tests of callouts/kpng-example-allip (iptables) and
 * callouts/kpng-example-allip-nft (nftables) with real traffic.
 *
 * For each callout the test builds four network namespaces joined by veth
 * links: a client, the node, and two pods, each pod running a small TCP server
 * that answers with its name. Only documentation addresses are used, all of
 * them assigned inside those namespaces:
 *
 *   client 203.0.113.2 2001:db8:c::2 ── node 203.0.113.1 2001:db8:c::1
 *   node 198.51.100.1   2001:db8:1::1 ── pod1 198.51.100.2   2001:db8:1::2
 *   node 198.51.100.129 2001:db8:2::1 ── pod2 198.51.100.130 2001:db8:2::2
 *   external IPs 192.0.2.10, 192.0.2.11, 2001:db8:e::10, 2001:db8:e::11:
 *   routed by the client to the node, and held by the node's loopback
 *   interface, so that a connection the callout does not DNAT is refused at once
 *   by the node instead of timing out.
 *
 * The callout is run by `kpng-callout replay FILE --once --callout …` inside
 * the node namespace. Needs root, `ip netns`, iptables, nft, jq and socat;
 * skips (saying why) without them.
 */
import t, { type Test as Tap } from 'tap';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, rmSync } from 'node:fs';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const cli = join(root, 'bin/kpng-callout');

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a command without a shell; never throws on a non-zero exit. */
function run(cmd: string, args: string[], opts: { input?: string; timeoutMs?: number; env?: NodeJS.ProcessEnv } = {}): Promise<Result> {
  return new Promise((resolvePromise) => {
    const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'], env: opts.env ?? process.env });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 30_000);
    child.on('error', (err) => {
      clearTimeout(timer);
      resolvePromise({ code: -1, stdout, stderr: stderr + String(err) });
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolvePromise({ code, stdout, stderr });
    });
    child.stdin.on('error', () => {});
    child.stdin.end(opts.input ?? '');
  });
}

/** Runs a command and throws with its output when it fails. */
async function must(cmd: string, args: string[]): Promise<string> {
  const r = await run(cmd, args);
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.code}: ${r.stderr}`);
  return r.stdout;
}

const tools = ['ip', 'iptables', 'ip6tables', 'iptables-save', 'ip6tables-save', 'iptables-restore', 'ip6tables-restore', 'nft', 'jq', 'socat'];

/** Why the suite cannot run here, or undefined. */
async function skipReason(): Promise<string | undefined> {
  if (process.platform !== 'linux') return 'network namespaces need Linux';
  if (process.getuid?.() !== 0) return 'network namespaces need root';
  const missing: string[] = [];
  for (const tool of tools) {
    const r = await run('sh', ['-c', 'command -v "$1"', 'sh', tool]);
    if (r.code !== 0) missing.push(tool);
  }
  if (missing.length) return `missing tools: ${missing.join(', ')} (apt-get install iptables nftables iproute2 jq socat)`;
  const probe = `${NS_PREFIX}${process.pid}-probe`;
  const r = await run('ip', ['netns', 'add', probe]);
  if (r.code !== 0) return `cannot create a network namespace: ${r.stderr.trim()}`;
  await run('ip', ['netns', 'del', probe]);
  removeStaleNamespaces();
  return undefined;
}

/** Our namespaces are named NS_PREFIX + pid + '-' + role. */
const NS_PREFIX = 'kpngallip-';

/** Removes namespaces that an earlier run of this suite left behind when it was killed. */
function removeStaleNamespaces(): void {
  const list = spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' }).stdout ?? '';
  for (const line of list.split('\n')) {
    const m = new RegExp(`^(${NS_PREFIX}(\\d+)-[a-z0-9]+)\\b`).exec(line);
    if (!m || Number(m[2]) === process.pid) continue;
    try {
      process.kill(Number(m[2]), 0);
      continue; // that run is still going
    } catch {
      spawnSync('ip', ['netns', 'del', m[1]!], { stdio: 'ignore' });
    }
  }
}

const PODS = {
  pod1: { v4: '198.51.100.2', v6: '2001:db8:1::2' },
  pod2: { v4: '198.51.100.130', v6: '2001:db8:2::2' },
} as const;
type PodName = keyof typeof PODS;
const XIP = { v4: ['192.0.2.10', '192.0.2.11'], v6: ['2001:db8:e::10', '2001:db8:e::11'] } as const;
const PORTS = [8080, 9090];

interface ServiceSpec {
  name: string;
  xips4?: string[];
  xips6?: string[];
  lbips4?: string[];
  /** Pods whose endpoints are local to the node. */
  local?: PodName[];
  /** Pods whose endpoints are elsewhere. */
  remote?: PodName[];
  /** Raw endpoints, for hostile input. */
  endpoints?: unknown[];
}

/** One state line, shaped as kpng prints it. */
function serviceLine(s: ServiceSpec): string {
  const ips: Record<string, unknown> = { ClusterIPs: {}, ExternalIPs: {} };
  const ext: Record<string, string[]> = {};
  if (s.xips4?.length) ext.V4 = s.xips4;
  if (s.xips6?.length) ext.V6 = s.xips6;
  ips.ExternalIPs = ext;
  if (s.lbips4?.length) ips.LoadBalancerIPs = { V4: s.lbips4 };
  ips.Headless = true;
  const endpoints: unknown[] = [];
  for (const [pods, local] of [[s.local ?? [], true], [s.remote ?? [], false]] as const) {
    for (const p of pods) {
      for (const fam of ['V4', 'V6'] as const) {
        const ep: Record<string, unknown> = { Hostname: p, IPs: { [fam]: [fam === 'V4' ? PODS[p].v4 : PODS[p].v6] } };
        if (local) ep.Local = true;
        ep.Scopes = { Internal: true, External: true };
        endpoints.push(ep);
      }
    }
  }
  endpoints.push(...(s.endpoints ?? []));
  return JSON.stringify({
    Service: {
      Namespace: 'default',
      Name: s.name,
      Type: 'ClusterIP',
      IPs: ips,
      Ports: [{ Protocol: 1, Port: 8080, TargetPort: 8080 }],
      SessionAffinity: null,
    },
    Endpoints: endpoints.length ? endpoints : null,
  });
}

const CALLOUTS = [
  { name: 'kpng-example-allip', path: 'callouts/kpng-example-allip' },
  { name: 'kpng-example-allip-nft', path: 'callouts/kpng-example-allip-nft' },
] as const;

/** Topologies not closed yet: closed on exit too, for a run that tap times out or interrupts. */
const opened = new Set<Topology>();
process.once('exit', () => {
  for (const topo of opened) topo.close();
});

/** Four namespaces and two pod servers; `close` removes everything, whatever happened. */
class Topology {
  readonly ns: { client: string; node: string; pod1: string; pod2: string };
  private readonly servers: ChildProcess[] = [];
  private dir = '';
  private seq = 0;

  constructor(tag: string) {
    const base = `${NS_PREFIX}${process.pid}-${tag}`;
    this.ns = { client: `${base}-cl`, node: `${base}-nd`, pod1: `${base}-p1`, pod2: `${base}-p2` };
    opened.add(this);
  }

  async open(): Promise<void> {
    this.dir = await mkdtemp(join(tmpdir(), 'kpng-allip-'));
    const { client, node, pod1, pod2 } = this.ns;
    for (const n of [client, node, pod1, pod2]) await must('ip', ['netns', 'add', n]);
    const ipn = (n: string, ...args: string[]) => must('ip', ['-n', n, ...args]);
    await ipn(node, 'link', 'add', 'tocl', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', client);
    await ipn(node, 'link', 'add', 'top1', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod1);
    await ipn(node, 'link', 'add', 'top2', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod2);
    const addrs: Array<[string, string, string]> = [
      [client, 'eth0', '203.0.113.2/24'],
      [client, 'eth0', '2001:db8:c::2/64'],
      [node, 'tocl', '203.0.113.1/24'],
      [node, 'tocl', '2001:db8:c::1/64'],
      [node, 'top1', '198.51.100.1/25'],
      [node, 'top1', '2001:db8:1::1/64'],
      [node, 'top2', '198.51.100.129/25'],
      [node, 'top2', '2001:db8:2::1/64'],
      [pod1, 'eth0', `${PODS.pod1.v4}/25`],
      [pod1, 'eth0', `${PODS.pod1.v6}/64`],
      [pod2, 'eth0', `${PODS.pod2.v4}/25`],
      [pod2, 'eth0', `${PODS.pod2.v6}/64`],
      ...[...XIP.v4.map((a) => `${a}/32`), ...XIP.v6.map((a) => `${a}/128`)].map((a): [string, string, string] => [node, 'lo', a]),
    ];
    for (const [n, dev, addr] of addrs) {
      await ipn(n, 'addr', 'add', addr, 'dev', dev, ...(addr.includes(':') ? ['nodad'] : []));
    }
    for (const [n, devs] of [
      [client, ['lo', 'eth0']],
      [node, ['lo', 'tocl', 'top1', 'top2']],
      [pod1, ['lo', 'eth0']],
      [pod2, ['lo', 'eth0']],
    ] as const) {
      for (const dev of devs) await ipn(n, 'link', 'set', dev, 'up');
    }
    await ipn(client, 'route', 'add', '192.0.2.0/24', 'via', '203.0.113.1');
    await ipn(client, '-6', 'route', 'add', '2001:db8:e::/64', 'via', '2001:db8:c::1');
    await ipn(pod1, 'route', 'add', 'default', 'via', '198.51.100.1');
    await ipn(pod1, '-6', 'route', 'add', 'default', 'via', '2001:db8:1::1');
    await ipn(pod2, 'route', 'add', 'default', 'via', '198.51.100.129');
    await ipn(pod2, '-6', 'route', 'add', 'default', 'via', '2001:db8:2::1');
    await must('ip', ['netns', 'exec', node, 'sysctl', '-qw', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1']);

    const server = `const net = require('node:net');
      for (const port of ${JSON.stringify(PORTS)}) net.createServer((s) => s.end(process.argv[1] + '\\n')).listen(port, '::');`;
    for (const pod of ['pod1', 'pod2'] as const) {
      const child = spawn('ip', ['netns', 'exec', this.ns[pod], process.execPath, '-e', server, pod], { stdio: 'ignore' });
      this.servers.push(child);
    }
    // Wait until both servers answer, from the node, on both families.
    for (const pod of ['pod1', 'pod2'] as const) {
      for (const addr of [PODS[pod].v4, PODS[pod].v6]) {
        for (const port of PORTS) {
          const got = await this.poll('node', addr, port, pod, 10_000);
          if (got !== pod) throw new Error(`server ${pod} at ${addr}:${port} never answered`);
        }
      }
    }
  }

  /** Synchronous, so that it completes even when tap times the test out. */
  close(): void {
    opened.delete(this);
    for (const child of this.servers) child.kill('SIGKILL');
    for (const n of Object.values(this.ns)) spawnSync('ip', ['netns', 'del', n], { stdio: 'ignore' });
    if (this.dir) rmSync(this.dir, { recursive: true, force: true });
  }

  /** One TCP connection from a namespace; the server's answer, or '' when it fails. */
  async connect(from: 'client' | 'node', addr: string, port = 8080): Promise<string> {
    const target = addr.includes(':') ? `TCP6:[${addr}]:${port}` : `TCP4:${addr}:${port}`;
    const r = await run('ip', ['netns', 'exec', this.ns[from], 'socat', '-T', '3', 'STDIO', `${target},connect-timeout=3`], { timeoutMs: 10_000 });
    return r.code === 0 ? r.stdout.trim() : '';
  }

  /** Connects until the answer is `want` or `withinMs` have passed; returns the last answer. */
  async poll(from: 'client' | 'node', addr: string, port: number, want: string, withinMs = 2_000): Promise<string> {
    const deadline = Date.now() + withinMs;
    for (;;) {
      const got = await this.connect(from, addr, port);
      if (got === want || Date.now() >= deadline) return got;
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** Writes the state and runs the callout on it once, with replay, in the node namespace. */
  async apply(callout: string, services: ServiceSpec[], env: NodeJS.ProcessEnv = {}): Promise<Result> {
    const file = join(this.dir, `state-${++this.seq}.jsonl`);
    await writeFile(file, services.map((s) => serviceLine(s) + '\n').join(''));
    return run(
      'ip',
      // env -u NODE_OPTIONS: tap adds its loaders to every child's NODE_OPTIONS, and they cannot load the extensionless ESM bin.
      ['netns', 'exec', this.ns.node, 'env', '-u', 'NODE_OPTIONS', process.execPath, cli, 'replay', file, '--once', '--callout', join(root, callout)],
      { env: { ...process.env, ...env }, timeoutMs: 60_000 },
    );
  }

  /** The nat rules of both families (iptables) or the callout's table (nft), without volatile parts. */
  async rules(callout: string): Promise<string> {
    if (callout.endsWith('-nft')) {
      const r = await run('ip', ['netns', 'exec', this.ns.node, 'nft', 'list', 'ruleset']);
      return r.stdout;
    }
    let out = '';
    for (const save of ['iptables-save', 'ip6tables-save']) {
      const r = await run('ip', ['netns', 'exec', this.ns.node, save, '-t', 'nat']);
      out += r.stdout
        .split('\n')
        .filter((l) => !l.startsWith('#'))
        .map((l) => l.replace(/\[\d+:\d+\]/, '[0:0]'))
        .join('\n');
    }
    return out;
  }

  get dirPath(): string {
    return this.dir;
  }
}

/** The DNAT rules the callout owns, one string per rule (or per map element). */
function dnatEntries(callout: string, rules: string): string[] {
  if (callout.endsWith('-nft')) {
    const entries: string[] = [];
    for (const m of rules.matchAll(/elements = \{([^}]*)\}/g)) {
      entries.push(...m[1]!.split(',').map((e) => e.trim()).filter(Boolean));
    }
    entries.push(...rules.split('\n').filter((l) => /\bdnat\b.*numgen/.test(l)).map((l) => l.trim()));
    return entries;
  }
  return rules.split('\n').filter((l) => l.startsWith('-A KPNG-ALLIP '));
}

const reason = await skipReason();
if (reason) console.error(`# skipping callouts end-to-end tests: ${reason}`);

for (const callout of CALLOUTS) {
  t.test(`${callout.name} with real traffic`, { skip: reason ?? false }, async (t) => {
    const topo = new Topology(callout.name.endsWith('-nft') ? 'nft' : 'ipt');
    t.teardown(() => topo.close());
    await topo.open();

    const v4 = XIP.v4[0];
    const v6 = XIP.v6[0];
    const apply = async (t: Tap, services: ServiceSpec[], env?: NodeJS.ProcessEnv) => {
      const r = await topo.apply(callout.path, services, env);
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
      const inNode = (...cmd: string[]) => must('ip', ['netns', 'exec', topo.ns.node, ...cmd]);
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
