/**
 * What every network-namespace lab needs: a check that namespaces can be made
 * here (with the reason when not, for the skip message), and the removal of
 * namespaces that an earlier, killed run of the same lab left behind. A lab
 * names its namespaces `prefix + pid + '-' + role`.
 */
import { spawnSync } from 'node:child_process';
import { missingTools, mustRun, runCommand } from './command.js';

/**
 * Why namespaces of `prefix` cannot be made here, or undefined when they can.
 * `probe` runs inside a fresh namespace for a lab's own extra check (its message, or undefined).
 */
export async function netnsMissing(prefix: string, tools: readonly string[], installHint: string, probe?: (ns: string) => Promise<string | undefined>): Promise<string | undefined> {
  if (process.platform !== 'linux') return 'network namespaces need Linux';
  if (process.getuid?.() !== 0) return 'network namespaces need root';
  const missing = missingTools([...tools]);
  if (missing.length) return `missing tools: ${missing.join(', ')} (${installHint})`;
  const ns = `${prefix}${process.pid}-probe`;
  const r = await runCommand('ip', ['netns', 'add', ns]);
  if (r.code !== 0) return `cannot create a network namespace: ${r.stderr.trim()}`;
  const why = await probe?.(ns);
  await runCommand('ip', ['netns', 'del', ns]);
  if (why) return why;
  removeStaleNamespaces(prefix);
  return undefined;
}

/** Removes namespaces of `prefix` whose run (its pid) is gone. */
export function removeStaleNamespaces(prefix: string): void {
  const list = spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' }).stdout ?? '';
  for (const line of list.split('\n')) {
    const m = new RegExp(`^(${prefix}(\\d+)-[a-z0-9-]+)\\b`).exec(line);
    if (!m || Number(m[2]) === process.pid) continue;
    try {
      process.kill(Number(m[2]), 0);
      continue; // that run is still going
    } catch {
      spawnSync('ip', ['netns', 'del', m[1]!], { stdio: 'ignore' });
    }
  }
}

/** The namespaces of a four-host lab: a client, the node, two pods. */
export interface FourNamespaces {
  client: string;
  node: string;
  pod1: string;
  pod2: string;
}

/** The pods' addresses in a four-host lab. */
export const LAB_PODS = {
  pod1: { v4: '198.51.100.2', v6: '2001:db8:1::2' },
  pod2: { v4: '198.51.100.130', v6: '2001:db8:2::2' },
} as const;
/** The node's address toward the client (what the client routes Service ranges through). */
export const LAB_NODE = { v4: '203.0.113.1', v6: '2001:db8:c::1' } as const;

/**
 * Makes the four namespaces and wires them, all links up:
 *
 *   client 203.0.113.2 2001:db8:c::2 ── node 203.0.113.1 2001:db8:c::1
 *   node 198.51.100.1   2001:db8:1::1 ── pod1 198.51.100.2   2001:db8:1::2
 *   node 198.51.100.129 2001:db8:2::1 ── pod2 198.51.100.130 2001:db8:2::2
 *
 * The client routes 192.0.2.0/24 and 2001:db8:e::/64 through the node; the
 * pods' default routes go through it. `nodeLo` are addresses for the node's lo.
 */
export async function wireFourNamespaces(ns: FourNamespaces, nodeLo: readonly string[] = []): Promise<void> {
  const { client, node, pod1, pod2 } = ns;
  for (const n of [client, node, pod1, pod2]) await mustRun('ip', ['netns', 'add', n]);
  const ipn = (n: string, ...args: string[]) => mustRun('ip', ['-n', n, ...args]);
  await ipn(node, 'link', 'add', 'tocl', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', client);
  await ipn(node, 'link', 'add', 'top1', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod1);
  await ipn(node, 'link', 'add', 'top2', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod2);
  const addrs: Array<[string, string, string]> = [
    [client, 'eth0', '203.0.113.2/24'],
    [client, 'eth0', '2001:db8:c::2/64'],
    [node, 'tocl', `${LAB_NODE.v4}/24`],
    [node, 'tocl', `${LAB_NODE.v6}/64`],
    [node, 'top1', '198.51.100.1/25'],
    [node, 'top1', '2001:db8:1::1/64'],
    [node, 'top2', '198.51.100.129/25'],
    [node, 'top2', '2001:db8:2::1/64'],
    [pod1, 'eth0', `${LAB_PODS.pod1.v4}/25`],
    [pod1, 'eth0', `${LAB_PODS.pod1.v6}/64`],
    [pod2, 'eth0', `${LAB_PODS.pod2.v4}/25`],
    [pod2, 'eth0', `${LAB_PODS.pod2.v6}/64`],
    ...nodeLo.map((a): [string, string, string] => [node, 'lo', a]),
  ];
  for (const [n, dev, addr] of addrs) await ipn(n, 'addr', 'add', addr, 'dev', dev, ...(addr.includes(':') ? ['nodad'] : []));
  for (const [n, devs] of [
    [client, ['lo', 'eth0']],
    [node, ['lo', 'tocl', 'top1', 'top2']],
    [pod1, ['lo', 'eth0']],
    [pod2, ['lo', 'eth0']],
  ] as const) {
    for (const dev of devs) await ipn(n, 'link', 'set', dev, 'up');
  }
  await ipn(client, 'route', 'add', '192.0.2.0/24', 'via', LAB_NODE.v4);
  await ipn(client, '-6', 'route', 'add', '2001:db8:e::/64', 'via', LAB_NODE.v6);
  await ipn(pod1, 'route', 'add', 'default', 'via', '198.51.100.1');
  await ipn(pod1, '-6', 'route', 'add', 'default', 'via', '2001:db8:1::1');
  await ipn(pod2, 'route', 'add', 'default', 'via', '198.51.100.129');
  await ipn(pod2, '-6', 'route', 'add', 'default', 'via', '2001:db8:2::1');
}
