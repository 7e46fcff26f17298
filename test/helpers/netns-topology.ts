/**
 * A small network for testing data-plane callouts with real traffic: four
 * network namespaces joined by veth links, a client, the node, and two pods,
 * each pod running a small TCP server that answers with its name. Only
 * documentation addresses are used, all of them assigned inside those
 * namespaces:
 *
 *   client 203.0.113.2 2001:db8:c::2 ── node 203.0.113.1 2001:db8:c::1
 *   node 198.51.100.1   2001:db8:1::1 ── pod1 198.51.100.2   2001:db8:1::2
 *   node 198.51.100.129 2001:db8:2::1 ── pod2 198.51.100.130 2001:db8:2::2
 *   external IPs 192.0.2.10, 192.0.2.11, 2001:db8:e::10, 2001:db8:e::11:
 *   routed by the client to the node, and held by the node's loopback
 *   interface, so that a connection the callout does not DNAT is refused at once
 *   by the node instead of timing out.
 *
 * A callout is run by `kpng-callout replay FILE --once --callout …` inside
 * the node namespace (`apply`). Needs root, `ip netns`, iptables, nft, jq and
 * socat (`netnsMissing` says which is missing).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { binArgv } from './bin-process.js';
import { mustRun, runCommand, type CommandResult } from './command.js';
import { netnsMissing as labMissing, LAB_PODS, wireFourNamespaces } from './netns.js';
import { tempDir, untilExit } from './files.js';
import { repoPath } from './fixtures.js';
import { pollUntil } from './wait.js';

const tools = ['ip', 'iptables', 'ip6tables', 'iptables-save', 'ip6tables-save', 'iptables-restore', 'ip6tables-restore', 'nft', 'jq', 'socat'];

/** Our namespaces are named NS_PREFIX + pid + '-' + role. */
const NS_PREFIX = 'kpngallip-';

/** Why a topology cannot be built here, or undefined when it can. */
export function netnsMissing(): Promise<string | undefined> {
  return labMissing(NS_PREFIX, tools, 'apt-get install iptables nftables iproute2 jq socat');
}

/** The two pods' addresses. */
export const PODS = LAB_PODS;
export type PodName = keyof typeof PODS;
/** External IPs, routed to the node and held by its loopback interface. */
export const XIP = { v4: ['192.0.2.10', '192.0.2.11'], v6: ['2001:db8:e::10', '2001:db8:e::11'] } as const;
/** The ports each pod server listens on. */
export const PORTS = [8080, 9090];

/** A Service of the state a test applies. */
export interface ServiceSpec {
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

/** Topologies not closed yet: closed on exit too, for a run that tap times out or interrupts. */
const opened = new Set<Topology>();
process.once('exit', () => {
  for (const topo of opened) topo.close();
});

/** Four namespaces and two pod servers; `close` removes everything, whatever happened. */
export class Topology {
  readonly ns: { client: string; node: string; pod1: string; pod2: string };
  private readonly servers: ChildProcess[] = [];
  private readonly dir = tempDir(untilExit, 'kpng-allip-');
  private seq = 0;

  constructor(tag: string) {
    const base = `${NS_PREFIX}${process.pid}-${tag}`;
    this.ns = { client: `${base}-cl`, node: `${base}-nd`, pod1: `${base}-p1`, pod2: `${base}-p2` };
    opened.add(this);
  }

  async open(): Promise<void> {
    const { node } = this.ns;
    await wireFourNamespaces(this.ns, [...XIP.v4.map((a) => `${a}/32`), ...XIP.v6.map((a) => `${a}/128`)]);
    await mustRun('ip', ['netns', 'exec', node, 'sysctl', '-qw', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1']);

    // TCP and UDP (a datagram answered with the pod's name), both families.
    const server = `const net = require('node:net'); const dgram = require('node:dgram');
      for (const port of ${JSON.stringify(PORTS)}) {
        net.createServer((s) => s.end(process.argv[1] + '\\n')).listen(port, '::');
        const u = dgram.createSocket('udp6'); u.on('message', (m, r) => u.send(process.argv[1] + '\\n', r.port, r.address)); u.bind(port, '::');
      }`;
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
  }

  /** One TCP connection from a namespace; the server's answer, or '' when it fails. */
  async connect(from: 'client' | 'node', addr: string, port = 8080): Promise<string> {
    const target = addr.includes(':') ? `TCP6:[${addr}]:${port}` : `TCP4:${addr}:${port}`;
    const r = await runCommand('ip', ['netns', 'exec', this.ns[from], 'socat', '-T', '3', 'STDIO', `${target},connect-timeout=3`], { timeoutMs: 10_000 });
    return r.code === 0 ? r.stdout.trim() : '';
  }

  /** One UDP datagram from `from`'s source port `sport`; the answer, or '' when none came. */
  async udp(from: 'client' | 'node', addr: string, port: number, sport: number): Promise<string> {
    const target = addr.includes(':') ? `UDP6:[${addr}]:${port}` : `UDP4:${addr}:${port}`;
    const r = await runCommand('ip', ['netns', 'exec', this.ns[from], 'socat', '-t', '2', '-T', '2', 'STDIO', `${target},sourceport=${sport},reuseaddr`], { input: 'x\n', timeoutMs: 10_000 });
    return r.code === 0 ? r.stdout.trim() : '';
  }

  /** Connects until the answer is `want` or `withinMs` have passed; returns the last answer. */
  async poll(from: 'client' | 'node', addr: string, port: number, want: string, withinMs = 2_000): Promise<string> {
    let got = '';
    try {
      await pollUntil(async () => (got = await this.connect(from, addr, port)) === want, `${want} at ${addr}:${port}`, withinMs, 50);
    } catch {
      // The caller asserts on the last answer, which says more than a timeout.
    }
    return got;
  }

  /** Writes the state and runs the callout on it once, with replay, in the node namespace. */
  async apply(callout: string, services: ServiceSpec[], env: NodeJS.ProcessEnv = {}): Promise<CommandResult> {
    const file = join(this.dir, `state-${++this.seq}.jsonl`);
    writeFileSync(file, services.map((s) => serviceLine(s) + '\n').join(''));
    return runCommand('ip', ['netns', 'exec', this.ns.node, ...binArgv('kpng-callout', ['replay', file, '--once', '--callout', repoPath(callout)])], {
      env: { ...process.env, ...env },
      timeoutMs: 60_000,
    });
  }

  /** The nat rules of both families (iptables) or the callout's table (nft), without volatile parts. */
  async rules(callout: string): Promise<string> {
    if (callout.endsWith('-nft')) {
      const r = await runCommand('ip', ['netns', 'exec', this.ns.node, 'nft', 'list', 'ruleset']);
      return r.stdout;
    }
    let out = '';
    for (const save of ['iptables-save', 'ip6tables-save']) {
      const r = await runCommand('ip', ['netns', 'exec', this.ns.node, save, '-t', 'nat']);
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
