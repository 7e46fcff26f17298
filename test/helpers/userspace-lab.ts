/**
 * A network for testing callouts/userspace-proxy with real traffic: four
 * network namespaces (a client, the node, two pods) joined by veth links,
 * documentation addresses only:
 *
 *   client 203.0.113.2 2001:db8:c::2 ── node 203.0.113.1 2001:db8:c::1
 *   node 198.51.100.1   2001:db8:1::1 ── pod1 198.51.100.2   2001:db8:1::2
 *   node 198.51.100.129 2001:db8:2::1 ── pod2 198.51.100.130 2001:db8:2::2
 *   Service addresses 192.0.2.0/24 and 2001:db8:e::/64: routed by the client
 *   to the node, where a local route (`ip route add local … dev lo`, and
 *   net.ipv6.ip_nonlocal_bind=1 for IPv6) makes every one of them bindable.
 *
 * Each pod runs a Node server answering, on TCP and UDP ports 8080 and 9090
 * (both families), `<pod>:<port>`: a TCP connection gets that line, then its
 * own bytes echoed (half-close kept: the server ends after the client), a
 * datagram gets `<pod>:<port> <datagram>`. The client and the node each run
 * a Node agent (`Agent`) that makes connections on request, so that hundreds
 * of them cost no process each (both programs: userspace-agents.ts).
 *
 * The proxy runs as the runner runs it: `kpng-callout replay --watch
 * --persistent [--changes] STATEFILE --callout callouts/userspace-proxy` in
 * the node namespace (`startProxy`); `apply` rewrites STATEFILE (temp file,
 * rename) and waits for the runner's line about the frame's result. Needs
 * root and `ip netns`; `labMissing` says why not.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { binArgv } from './bin-process.js';
import { mustRun } from './command.js';
import { LAB_NODE, LAB_PODS, netnsMissing, wireFourNamespaces } from './netns.js';
import { replaceFile, tempDir, untilExit } from './files.js';
import { repoPath } from './fixtures.js';
import { AGENT, Agent, POD_PORTS, POD_SERVER } from './userspace-agents.js';
import { pollUntil, WAIT_MS, within } from './wait.js';

/** Our namespaces are named NS_PREFIX + pid + '-' + tag + '-' + role. */
const NS_PREFIX = 'kpusp-';

/** Why the lab cannot be built here, or undefined when it can. */
export function labMissing(): Promise<string | undefined> {
  return netnsMissing(NS_PREFIX, ['ip', 'sysctl'], 'apt-get install iproute2 procps');
}

/** The pods' addresses. */
export const PODS = LAB_PODS;
export type PodName = keyof typeof PODS;
/** The node's addresses, as the client reaches them (NodePorts). */
export const NODE = LAB_NODE;

/** Topologies not closed yet: closed on exit too, for a run that tap times out or interrupts. */
const opened = new Set<UserspaceLab>();
process.once('exit', () => {
  for (const lab of opened) lab.close();
});

/** A result line of the runner: a frame acknowledged `ok`, or one that failed. */
const RESULT = /callout run finished run=(\d+)|callout frame \d+ \(run (\d+)\) failed/;

/** The runner (kpng-callout replay --watch --persistent) with the proxy, in the node namespace. */
export class ProxyRun {
  readonly lines: string[] = [];
  private readonly waiters = new Set<() => void>();
  readonly exit: Promise<number | null>;

  constructor(
    readonly child: ChildProcess,
    readonly statePath: string,
  ) {
    for (const s of [child.stdout!, child.stderr!]) {
      createInterface(s).on('line', (l) => {
        this.lines.push(l);
        if (process.env.USP_LAB_DEBUG) process.stderr.write(`# ${l}\n`);
        for (const w of this.waiters) w();
      });
    }
    this.exit = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  }

  /** The first line matching `re` at index `from` or later; its index. */
  async line(re: RegExp, from = 0, what = `a line ${re}`, ms = WAIT_MS): Promise<{ line: string; index: number }> {
    const find = (): number => this.lines.findIndex((l, i) => i >= from && re.test(l));
    let i = find();
    if (i < 0) {
      let wake!: () => void;
      const p = new Promise<void>((resolve) => {
        wake = () => {
          if ((i = find()) >= 0) resolve();
        };
        this.waiters.add(wake);
      });
      try {
        await within(p, () => `waiting for ${what}; last lines: ${this.lines.slice(-8).join('\n')}`, ms);
      } finally {
        this.waiters.delete(wake);
      }
    }
    return { line: this.lines[i]!, index: i };
  }

  /** The `n`th line (from 1) matching `re`, once there is one. */
  async nth(re: RegExp, n: number, what = `${n} lines ${re}`, ms = WAIT_MS): Promise<string> {
    const hit = (): string | undefined => this.matching(re)[n - 1];
    if (hit() === undefined) {
      let wake!: () => void;
      const p = new Promise<void>((resolve) => {
        wake = () => {
          if (hit() !== undefined) resolve();
        };
        this.waiters.add(wake);
      });
      try {
        await within(p, () => `waiting for ${what}; last lines: ${this.lines.slice(-8).join('\n')}`, ms);
      } finally {
        this.waiters.delete(wake);
      }
    }
    return hit()!;
  }

  /** Lines matching `re` so far (from index `from`). */
  matching(re: RegExp, from = 0): string[] {
    return this.lines.slice(from).filter((l) => re.test(l));
  }

  /** The proxy's pid (from its "started" line). */
  async pid(): Promise<number> {
    const { line } = await this.line(/userspace-proxy: started \(pid (\d+)/);
    return Number(/started \(pid (\d+)/.exec(line)![1]);
  }

  /** The proxy's stats line (SIGUSR2), as numbers: listeners, tcp, tcp-sockets, udp-sessions, and handles by type. */
  async stats(): Promise<{ listeners: number; tcp: number; tcpSockets: number; udp: number; handles: Record<string, number> }> {
    const from = this.lines.length;
    process.kill(await this.pid(), 'SIGUSR2');
    const { line } = await this.line(/userspace-proxy: stats /, from);
    const num = (k: string): number => Number(new RegExp(` ${k}=(\\d+)`).exec(line)?.[1] ?? NaN);
    const handles: Record<string, number> = {};
    for (const kv of (/ handles=(\S*)/.exec(line)?.[1] ?? '').split(',').filter(Boolean)) {
      const [k, v] = kv.split(':');
      handles[k!] = Number(v);
    }
    return { listeners: num('listeners'), tcp: num('tcp'), tcpSockets: num('tcp-sockets'), udp: num('udp-sessions'), handles };
  }

  /** Kills the runner and the proxy (SIGKILL), if still running. */
  kill(): void {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
  }
}

/** The outcome of a frame, as the runner logged it. */
export interface FrameResult {
  ok: boolean;
  line: string;
}

/** Four namespaces, two pod servers, two agents; `close` removes everything, whatever happened. */
export class UserspaceLab {
  readonly ns: { client: string; node: string; pod1: string; pod2: string };
  private readonly procs: ChildProcess[] = [];
  private readonly dir = tempDir(untilExit, 'kpng-usp-');
  client!: Agent;
  node!: Agent;
  proxy: ProxyRun | undefined;
  private results = 0;

  constructor(tag: string) {
    const base = `${NS_PREFIX}${process.pid}-${tag}`;
    this.ns = { client: `${base}-cl`, node: `${base}-nd`, pod1: `${base}-p1`, pod2: `${base}-p2` };
    opened.add(this);
  }

  async open(): Promise<void> {
    const { client, node } = this.ns;
    await wireFourNamespaces(this.ns);
    const ipn = (n: string, ...args: string[]) => mustRun('ip', ['-n', n, ...args]);
    // Every Service address is the node's: a local route delivers them, and any one can be bound
    // (IPv6 binds need ip_nonlocal_bind: its bind checks addresses, not routes).
    await ipn(node, 'route', 'add', 'local', '192.0.2.0/24', 'dev', 'lo');
    await ipn(node, '-6', 'route', 'add', 'local', '2001:db8:e::/64', 'dev', 'lo');
    await mustRun('ip', ['netns', 'exec', node, 'sysctl', '-qw', 'net.ipv6.ip_nonlocal_bind=1']);
    for (const n of [client, node]) await mustRun('ip', ['netns', 'exec', n, 'sysctl', '-qw', 'net.ipv4.tcp_tw_reuse=1', 'net.ipv4.ip_local_port_range=1024 65535']);

    for (const pod of ['pod1', 'pod2'] as const) this.spawnIn(this.ns[pod], ['-e', POD_SERVER, pod]);
    this.client = new Agent(this.spawnIn(client, ['-e', AGENT]));
    this.node = new Agent(this.spawnIn(node, ['-e', AGENT]));
    await within(Promise.all([this.client.ready, this.node.ready]), 'the agents to start', WAIT_MS);
    // Both pod servers answer, from the node, on both families and both protocols.
    for (const pod of ['pod1', 'pod2'] as const) {
      for (const addr of [PODS[pod].v4, PODS[pod].v6]) {
        for (const port of POD_PORTS) {
          await pollUntil(async () => (await this.node.tcp(addr, port))[0]?.r === `${pod}:${port}`, `${pod} at ${addr}:${port}/tcp`, 10_000, 50);
          await pollUntil(async () => (await this.node.udp(addr, port))[0]?.r === `${pod}:${port} ping`, `${pod} at ${addr}:${port}/udp`, 10_000, 50);
        }
      }
    }
  }

  /** `node args` in namespace `ns` (no NODE_OPTIONS: tap's loaders would slow it down). */
  private spawnIn(ns: string, args: string[]): ChildProcess {
    const child = spawn('ip', ['netns', 'exec', ns, process.execPath, ...args], { stdio: ['pipe', 'pipe', 'inherit'], env: { PATH: process.env.PATH } });
    this.procs.push(child);
    return child;
  }

  /** Starts the runner with the proxy on `state` (lines), waits for the first frame's result. */
  async startProxy(state: string[], o: { changes?: boolean; env?: NodeJS.ProcessEnv } = {}): Promise<FrameResult> {
    const statePath = join(this.dir, 'state.jsonl');
    replaceFile(statePath, linesText(state));
    const args = ['replay', '--watch', '--persistent', ...(o.changes ? ['--changes'] : []), statePath, '--callout', repoPath('callouts/userspace-proxy')];
    const child = spawn('ip', ['netns', 'exec', this.ns.node, ...binArgv('kpng-callout', args)], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { PATH: process.env.PATH, ...o.env },
    });
    this.procs.push(child);
    this.proxy = new ProxyRun(child, statePath);
    this.results = 0;
    return this.nextResult();
  }

  /** The result of the next frame (the runner's line about it). */
  async nextResult(): Promise<FrameResult> {
    const line = await this.proxy!.nth(RESULT, ++this.results, `the result of frame ${this.results}`);
    return { ok: /callout run finished/.test(line), line };
  }

  /** Rewrites the state file (an editor's save) and waits for the frame's result. */
  async apply(state: string[]): Promise<FrameResult> {
    replaceFile(this.proxy!.statePath, linesText(state));
    return this.nextResult();
  }

  /** Synchronous, so that it completes even when tap times the test out. */
  close(): void {
    opened.delete(this);
    this.proxy?.kill();
    for (const child of this.procs) child.kill('SIGKILL');
    for (const n of Object.values(this.ns)) spawnSync('ip', ['netns', 'del', n], { stdio: 'ignore' });
  }
}

const linesText = (lines: string[]): string => lines.map((l) => l + '\n').join('');

/** A Service of a test state. */
export interface Svc {
  name: string;
  cluster?: string[];
  external?: string[];
  lb?: string[];
  ports: Array<{ name?: string; proto?: 'tcp' | 'udp' | 'sctp' | number; port: number; nodePort?: number; targetPort?: number }>;
  /** Endpoints: a pod (both families), its scopes, its port overrides by port name. */
  endpoints?: Array<{ pod: PodName; internal?: boolean; external?: boolean; overrides?: Record<string, number> }>;
  /** Raw endpoints, appended (hostile input). */
  rawEndpoints?: unknown[];
  /** SessionAffinity ClientIP with these TimeoutSeconds (0: the key is left out, as Go does). */
  affinity?: number;
}

const PROTO = { tcp: 1, udp: 2, sctp: 3 } as const;

/** One state line, shaped as kpng prints it (zero values left out). */
export function svcLine(s: Svc): string {
  const fam = (ips: string[] | undefined): Record<string, string[]> | undefined => {
    if (!ips?.length) return undefined;
    const v4 = ips.filter((a) => !a.includes(':'));
    const v6 = ips.filter((a) => a.includes(':'));
    return { ...(v4.length ? { V4: v4 } : {}), ...(v6.length ? { V6: v6 } : {}) };
  };
  const ips: Record<string, unknown> = {};
  if (fam(s.cluster)) ips.ClusterIPs = fam(s.cluster);
  if (fam(s.external)) ips.ExternalIPs = fam(s.external);
  if (fam(s.lb)) ips.LoadBalancerIPs = fam(s.lb);
  const ports = s.ports.map((p) => ({
    ...(p.name ? { Name: p.name } : {}),
    Protocol: typeof p.proto === 'number' ? p.proto : PROTO[p.proto ?? 'tcp'],
    Port: p.port,
    ...(p.nodePort ? { NodePort: p.nodePort } : {}),
    ...(p.targetPort ? { TargetPort: p.targetPort } : {}),
  }));
  const endpoints: unknown[] = [];
  for (const e of s.endpoints ?? []) {
    for (const f of ['V4', 'V6'] as const) {
      const overrides = Object.entries(e.overrides ?? {}).map(([Name, Port]) => ({ ...(Name ? { Name } : {}), Port }));
      endpoints.push({
        Hostname: e.pod,
        IPs: { [f]: [f === 'V4' ? PODS[e.pod].v4 : PODS[e.pod].v6] },
        Local: true,
        ...(overrides.length ? { PortOverrides: overrides } : {}),
        Scopes: { ...((e.internal ?? true) ? { Internal: true } : {}), ...((e.external ?? true) ? { External: true } : {}) },
      });
    }
  }
  endpoints.push(...(s.rawEndpoints ?? []));
  return JSON.stringify({
    Service: {
      Namespace: 'default',
      Name: s.name,
      Type: s.ports.some((p) => p.nodePort) ? 'NodePort' : 'ClusterIP',
      IPs: ips,
      Ports: ports,
      SessionAffinity: s.affinity === undefined ? null : { ClientIP: s.affinity ? { TimeoutSeconds: s.affinity } : {} },
    },
    Endpoints: endpoints.length ? endpoints : null,
  });
}

/** A state: the Services' lines in kpng order (by name: one namespace). */
export const stateOf = (svcs: Svc[]): string[] => [...svcs].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0)).map(svcLine);
