/**
 * A lab for service-proxy callouts (kube-proxy semantics: ClusterIPs,
 * external and load-balancer IPs, NodePorts, endpoints chosen per
 * connection) with real TCP and UDP traffic. Five network namespaces joined
 * by veth links; only documentation addresses, all assigned inside them:
 *
 *   client 203.0.113.2   2001:db8:c::2 ── node 203.0.113.1   2001:db8:c::1   (tocl)
 *   pod1   198.51.100.2  2001:db8:1::2 ── node 198.51.100.1  2001:db8:1::1   (top1)
 *   pod2   198.51.100.130 2001:db8:2::2 ── node 198.51.100.129 2001:db8:2::1 (top2)
 *   sink   203.0.113.130 2001:db8:f::2 ── node 203.0.113.129 2001:db8:f::1   (tosk)
 *
 * Service addresses: ClusterIPs from 192.0.2.0/25 and 2001:db8:5::/64,
 * external and load-balancer IPs from 192.0.2.128/25 and 2001:db8:e::/64.
 * The client routes them to the node, the node routes them to the sink
 * (as a node routes them to its default gateway), and the sink answers every
 * packet it would have to forward there with an ICMP error (host unreachable,
 * administratively prohibited): a connection that no rule of the callout
 * translates fails at once with EHOSTUNREACH / EACCES (never a timeout;
 * `UNTRANSLATED`, `FAIL_FAST_MS`), which tells it apart from a
 * connection the callout rejects (ECONNREFUSED). NodePorts are on the node's
 * own addresses (203.0.113.1, 2001:db8:c::1 from the client); where nothing
 * translates them the node's stack resets them (ECONNREFUSED). ICMP error
 * rate limits are off in the node and the sink, so that many rejected
 * connections in a row all fail at once.
 *
 * Each pod serves TCP and UDP on 8080, 9090 and 8443 and answers each
 * connection / datagram with `<pod> <source address it sees> <its port>`.
 * Long-lived agents (in the client, the node and pod1, for hairpin traffic)
 * make connections on request, many in parallel, and report for each the
 * answer or the error and how long it took (both programs: service-agents.ts).
 *
 * A state is a list of `ServiceSpec`s, written as kpng prints it (Go's JSON,
 * zero values left out, kpng's order; service-states.ts). `direct` runs a callout on it in the
 * node namespace (stdin = the state), `replay` runs it through
 * `kpng-callout replay`. Needs root, `ip netns`, nft, iptables, conntrack, jq.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { binArgv } from './bin-process.js';
import { mustRun, runCommand, type CommandResult } from './command.js';
import { netnsMissing } from './netns.js';
import { tempDir, untilExit } from './files.js';
import { Agent, SERVER, type Conn, type ConnOptions } from './service-agents.js';
import { pollUntil } from './wait.js';

const TOOLS = ['ip', 'nft', 'iptables', 'ip6tables', 'iptables-save', 'ip6tables-save', 'iptables-restore', 'ip6tables-restore', 'conntrack', 'jq', 'sysctl'];

/** Our namespaces are named NS_PREFIX + pid + '-' + tag + '-' + role. */
const NS_PREFIX = 'kpsplab-';

/** Why the lab cannot be built here, or undefined when it can. */
export function labMissing(): Promise<string | undefined> {
  return netnsMissing(NS_PREFIX, TOOLS, 'apt-get install iproute2 nftables iptables conntrack jq procps', async (ns) => {
    const ct = await runCommand('ip', ['netns', 'exec', ns, 'conntrack', '-L']);
    return ct.code === 0 ? undefined : `conntrack cannot list connections: ${ct.stderr.trim()}`;
  });
}

// ---------------------------------------------------------------- addresses

export const PODS = {
  pod1: { v4: '198.51.100.2', v6: '2001:db8:1::2' },
  pod2: { v4: '198.51.100.130', v6: '2001:db8:2::2' },
} as const;
export type PodName = keyof typeof PODS;
export type Family = 'v4' | 'v6';
export const FAMILIES: readonly Family[] = ['v4', 'v6'];

/** The node's addresses: toward the client (its NodePort address), and toward each pod (a masqueraded source). */
export const NODE = {
  client: { v4: '203.0.113.1', v6: '2001:db8:c::1' },
  pod1: { v4: '198.51.100.1', v6: '2001:db8:1::1' },
  pod2: { v4: '198.51.100.129', v6: '2001:db8:2::1' },
} as const;
export const CLIENT = { v4: '203.0.113.2', v6: '2001:db8:c::2' } as const;

/** Every address of the node (what a masqueraded connection may come from). */
export const NODE_ADDRS: readonly string[] = Object.values(NODE).flatMap((a) => [a.v4, a.v6]);

/** A ClusterIP (0 < i < 128) or an external / load-balancer IP (128 <= i < 255), of each family (192.0.2.i, 2001:db8:5::i or 2001:db8:e::i). */
export const svcIP = (fam: Family, i: number): string => (fam === 'v4' ? `192.0.2.${i}` : i < 128 ? `2001:db8:5::${i}` : `2001:db8:e::${i}`);

/**
 * How long a failed TCP connect may take and still count as failing at once.
 * IPv4: an ICMP error or a reset ends it at once (a few ms), unless the
 * kernel's ICMP rate limit (icmp_ratelimit) held back the error to the first
 * SYN, under load: then at its retransmission, one second later (seen once at
 * 1008 ms in a full `npm test`). IPv6: a reset ends it at once, but an ICMPv6
 * error (port unreachable included) to a SYN ends it only when the SYN is
 * retransmitted, one second later (seen on Linux 6.18; the initial RTO).
 * Either is far from a connect timeout, which the agents report as `timeout`.
 */
export const FAIL_FAST_MS: Readonly<Record<Family, number>> = { v4: 1500, v6: 1500 };

/** How a connection that nothing translates fails (the sink's ICMP errors). */
export const UNTRANSLATED: readonly string[] = ['EHOSTUNREACH', 'ENETUNREACH', 'EACCES'];

/** The ports every pod serves, TCP and UDP. */
export const POD_PORTS = [8080, 9090, 8443] as const;

// ---------------------------------------------------------------- the lab

/** Labs not closed yet: closed on exit too, for a run that tap times out or interrupts. */
const opened = new Set<ServiceLab>();
process.once('exit', () => {
  for (const lab of opened) lab.close();
});

export type From = 'client' | 'node' | 'pod1';

export class ServiceLab {
  readonly ns: { client: string; node: string; pod1: string; pod2: string; sink: string };
  private readonly procs: ChildProcess[] = [];
  private readonly agents = new Map<From, Agent>();
  readonly dir = tempDir(untilExit, 'kpng-splab-');
  private seq = 0;

  constructor(tag: string) {
    const base = `${NS_PREFIX}${process.pid}-${tag}`;
    this.ns = { client: `${base}-cl`, node: `${base}-nd`, pod1: `${base}-p1`, pod2: `${base}-p2`, sink: `${base}-sk` };
    opened.add(this);
  }

  async open(): Promise<void> {
    const { client, node, pod1, pod2, sink } = this.ns;
    for (const n of Object.values(this.ns)) await mustRun('ip', ['netns', 'add', n]);
    const ipn = (n: string, ...args: string[]) => mustRun('ip', ['-n', n, ...args]);
    const sysctl = (n: string, ...kv: string[]) => mustRun('ip', ['netns', 'exec', n, 'sysctl', '-qw', ...kv]);
    for (const [peer, dev] of [[client, 'tocl'], [pod1, 'top1'], [pod2, 'top2'], [sink, 'tosk']] as const) {
      await ipn(node, 'link', 'add', dev, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', peer);
    }
    const addrs: Array<[string, string, string]> = [
      [client, 'eth0', `${CLIENT.v4}/25`],
      [client, 'eth0', `${CLIENT.v6}/64`],
      [node, 'tocl', `${NODE.client.v4}/25`],
      [node, 'tocl', `${NODE.client.v6}/64`],
      [node, 'top1', `${NODE.pod1.v4}/25`],
      [node, 'top1', `${NODE.pod1.v6}/64`],
      [node, 'top2', `${NODE.pod2.v4}/25`],
      [node, 'top2', `${NODE.pod2.v6}/64`],
      [node, 'tosk', '203.0.113.129/25'],
      [node, 'tosk', '2001:db8:f::1/64'],
      [pod1, 'eth0', `${PODS.pod1.v4}/25`],
      [pod1, 'eth0', `${PODS.pod1.v6}/64`],
      [pod2, 'eth0', `${PODS.pod2.v4}/25`],
      [pod2, 'eth0', `${PODS.pod2.v6}/64`],
      [sink, 'eth0', '203.0.113.130/25'],
      [sink, 'eth0', '2001:db8:f::2/64'],
    ];
    for (const [n, dev, addr] of addrs) await ipn(n, 'addr', 'add', addr, 'dev', dev, ...(addr.includes(':') ? ['nodad'] : []));
    for (const [n, devs] of [
      [client, ['lo', 'eth0']],
      [node, ['lo', 'tocl', 'top1', 'top2', 'tosk']],
      [pod1, ['lo', 'eth0']],
      [pod2, ['lo', 'eth0']],
      [sink, ['lo', 'eth0']],
    ] as const) {
      for (const dev of devs) await ipn(n, 'link', 'set', dev, 'up');
    }
    for (const r of ['192.0.2.0/24']) await ipn(client, 'route', 'add', r, 'via', NODE.client.v4);
    for (const r of ['2001:db8:5::/64', '2001:db8:e::/64']) await ipn(client, '-6', 'route', 'add', r, 'via', NODE.client.v6);
    await ipn(node, 'route', 'add', '192.0.2.0/24', 'via', '203.0.113.130');
    for (const r of ['2001:db8:5::/64', '2001:db8:e::/64']) await ipn(node, '-6', 'route', 'add', r, 'via', '2001:db8:f::2');
    for (const [pod, gw] of [[pod1, NODE.pod1], [pod2, NODE.pod2], [sink, { v4: '203.0.113.129', v6: '2001:db8:f::1' }]] as const) {
      await ipn(pod, 'route', 'add', 'default', 'via', gw.v4);
      await ipn(pod, '-6', 'route', 'add', 'default', 'via', gw.v6);
    }
    await ipn(sink, 'route', 'add', 'unreachable', '192.0.2.0/24');
    for (const r of ['2001:db8:5::/64', '2001:db8:e::/64']) await ipn(sink, '-6', 'route', 'add', 'prohibit', r);
    for (const n of [node, sink]) {
      await sysctl(n, 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1', 'net.ipv4.icmp_ratelimit=0', 'net.ipv6.icmp.ratelimit=0');
    }

    for (const pod of ['pod1', 'pod2'] as const) {
      const child = spawn('ip', ['netns', 'exec', this.ns[pod], process.execPath, '-e', SERVER, pod, JSON.stringify(POD_PORTS)], {
        stdio: 'ignore',
        env: { PATH: process.env.PATH },
      });
      this.procs.push(child);
    }
    for (const from of ['client', 'node', 'pod1'] as const) this.agents.set(from, new Agent(this.ns[from]));
    // Both servers answer, from the node, on both families, both protocols, every port.
    for (const pod of ['pod1', 'pod2'] as const) {
      for (const fam of FAMILIES) {
        for (const port of POD_PORTS) {
          for (const op of ['tcp', 'udp'] as const) {
            await pollUntil(
              async () => (await this.conn(op, 'node', PODS[pod][fam], port, { timeoutMs: 300 }))[0]?.pod === pod,
              `${op} server ${pod} at ${PODS[pod][fam]}:${port}`,
              15_000,
              50,
            );
          }
        }
      }
    }
    // Untranslated traffic fails at once from the client and the node (neighbours resolved).
    for (const from of ['client', 'node', 'pod1'] as const) {
      for (const fam of FAMILIES) {
        await pollUntil(
          async () => {
            const [c] = await this.tcp(from, svcIP(fam, 127), 1, { timeoutMs: 2000 });
            return c?.err !== undefined && UNTRANSLATED.includes(c.err) && c.ms < FAIL_FAST_MS[fam];
          },
          `${from} -> ${svcIP(fam, 127)} to fail at once`,
          15_000,
          20,
        );
      }
    }
  }

  /** Synchronous, so that it completes even when tap times the test out. */
  close(): void {
    opened.delete(this);
    for (const a of this.agents.values()) a.kill();
    for (const child of this.procs) child.kill('SIGKILL');
    for (const n of Object.values(this.ns)) spawnSync('ip', ['netns', 'del', n], { stdio: 'ignore' });
  }

  /** Connections (TCP) or exchanges (UDP) from a namespace's agent. */
  conn(op: 'tcp' | 'udp', from: From, addr: string, port: number, o: ConnOptions = {}): Promise<Conn[]> {
    const agent = this.agents.get(from);
    if (!agent) throw new Error('the lab is not open');
    return agent.run(op, addr, port, o);
  }

  tcp(from: From, addr: string, port: number, o: ConnOptions = {}): Promise<Conn[]> {
    return this.conn('tcp', from, addr, port, o);
  }

  udp(from: From, addr: string, port: number, o: ConnOptions = {}): Promise<Conn[]> {
    return this.conn('udp', from, addr, port, o);
  }

  /** Writes a state file; returns its path. */
  writeState(state: string, name = `state-${++this.seq}.jsonl`): string {
    const file = join(this.dir, name);
    writeFileSync(file, state);
    return file;
  }

  /** Runs `callout` once in the node namespace with `state` on its stdin. */
  direct(callout: string, state: string, env: NodeJS.ProcessEnv = {}): Promise<CommandResult> {
    return runCommand('ip', ['netns', 'exec', this.ns.node, callout], { input: state, env: { ...process.env, ...env }, timeoutMs: 60_000 });
  }

  /**
   * Runs `kpng-callout replay FILES… --callout callout` in the node namespace:
   * with one state and `once`, one run; with several, one run per state
   * (`--changes`: the first in full, the others as change sets).
   */
  replay(callout: string, states: string[], o: { once?: boolean; changes?: boolean; persistent?: boolean; env?: NodeJS.ProcessEnv } = {}): Promise<CommandResult> {
    const files = states.map((s) => this.writeState(s));
    const args = ['replay', ...files, '--debounce', '0', '--callout', callout];
    if (o.once) args.push('--once');
    if (o.changes) args.push('--changes');
    if (o.persistent) args.push('--persistent');
    return runCommand('ip', ['netns', 'exec', this.ns.node, ...binArgv('kpng-callout', args)], {
      env: { ...process.env, ...o.env },
      timeoutMs: 60_000,
    });
  }

  /** Runs a command in a namespace (never rejects). */
  exec(where: keyof ServiceLab['ns'], cmd: string, args: string[], input?: string): Promise<CommandResult> {
    return runCommand('ip', ['netns', 'exec', this.ns[where], cmd, ...args], { input });
  }

  /** The node's whole nftables ruleset (`nft list ruleset`). */
  async nftRuleset(): Promise<string> {
    return (await this.exec('node', 'nft', ['list', 'ruleset'])).stdout;
  }

  /** The node's iptables and ip6tables rules, every table, comments dropped and counters zeroed. */
  async iptRuleset(): Promise<string> {
    let out = '';
    for (const save of ['iptables-save', 'ip6tables-save']) {
      const r = await this.exec('node', save, []);
      out += `# ${save}\n`;
      out += r.stdout
        .split('\n')
        .filter((l) => l && !l.startsWith('#'))
        .map((l) => l.replace(/\[\d+:\d+\]/g, '[0:0]'))
        .join('\n');
      out += '\n';
    }
    return out;
  }

  /** The node's conntrack entries (both families). */
  async conntrack(): Promise<string> {
    let out = '';
    for (const fam of ['ipv4', 'ipv6']) out += (await this.exec('node', 'conntrack', ['-L', '-f', fam])).stdout;
    return out;
  }
}
