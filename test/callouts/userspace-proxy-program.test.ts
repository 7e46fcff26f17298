/**
 * callouts/userspace-proxy as a program, without root: persistent only (run
 * per state it exits 1 saying so), acks each frame on fd 3 under the runner,
 * tells a claim once while it holds, stays bounded when listeners cannot be
 * bound, runs as a copy outside this package (no "type":"module" there), and
 * refuses at run time an endpoint that leads back into the proxy. States here
 * ask for no listener (no address to bind in the test's own network), except
 * the last test's hand-written plan on 127.0.0.1. The library's parts:
 * userspace-proxy.test.ts; real traffic: test/e2e/callouts/userspace-proxy.test.ts.
 */
import t from 'tap';
import { spawn } from 'node:child_process';
import { copyFileSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { pathToFileURL } from 'node:url';
import { runBin } from '../helpers/bin-process.js';
import { tempDir } from '../helpers/files.js';
import { repoPath } from '../helpers/fixtures.js';
import { lib, libPath, line, type Planned } from '../helpers/userspace-proxy-lib.js';
import { pollUntil, within, WAIT_MS } from '../helpers/wait.js';


/** Node's environment for the program: no NODE_OPTIONS (tap's loaders cannot load an extensionless file). */
const env = (extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv => ({ PATH: process.env.PATH, ...extra });

/** Runs `file` as the runner does with --persistent: frames on stdin, acks read from fd 3. */
function persistent(file: string, extraEnv: NodeJS.ProcessEnv = {}) {
  const child = spawn(file, [], { stdio: ['pipe', 'pipe', 'pipe', 'pipe'], env: env({ KPNG_CALLOUT_MODE: 'persistent', ...extraEnv }) });
  const acks: string[] = [];
  let stderr = '';
  child.stderr!.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  let wake: (() => void) | undefined;
  createInterface(child.stdio[3] as NodeJS.ReadableStream).on('line', (l) => {
    acks.push(l);
    wake?.();
  });
  const exit = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
  return {
    stderr: () => stderr,
    async frame(text: string): Promise<string> {
      const n = acks.length + 1;
      child.stdin!.write(text);
      await within(
        new Promise<void>((resolve) => {
          wake = () => acks.length >= n && resolve();
          wake();
        }),
        () => `an ack; stderr: ${stderr}`,
        WAIT_MS,
      );
      return acks[n - 1]!;
    },
    end(): Promise<number | null> {
      child.stdin!.end();
      return within(exit, () => `its exit; stderr: ${stderr}`, WAIT_MS);
    },
  };
}

/** A Service with nothing to listen on (no address, an SCTP port): frames need no network. */
const quiet = line('quiet', { Ports: [{ Protocol: 3, Port: 9 }] });

t.test('a persistent callout: acks each frame on fd 3, refuses bad ones, exits 0 at EOF', async (t) => {
  const p = persistent(repoPath('callouts/userspace-proxy'));
  t.equal(await p.frame(`{"Frame":{"Seq":1,"Input":"changes"}}\n${quiet}\n\n`), 'error a change set with no full state applied before it (waiting for a full frame)');
  t.equal(await p.frame(`{"Frame":{"Seq":2,"Input":"full"}}\n${quiet}\n\n`), 'ok');
  t.equal(await p.frame(`{"Frame":{"Seq":3,"Input":"changes"}}\n{"Previous":${quiet}}\n\n`), 'ok');
  t.match(await p.frame(`{"Frame":{"Seq":4,"Input":"full"}}\n{oops\n\n`), /^error line 1 of the frame is not JSON/);
  t.equal(await p.frame(`{"Frame":{"Seq":5,"Input":"full"}}\n\n`), 'ok', 'an empty state');
  t.equal(await p.end(), 0);
  t.match(p.stderr(), /userspace-proxy: started \(pid \d+/);
  t.match(p.stderr(), /SCTP is not proxied/);
  t.match(p.stderr(), /end of input: listeners closed, exiting/);
});

t.test("what the plan says about the state (an address claimed twice) is told once while it holds, not at every frame", async (t) => {
  const on10 = (name: string) => line(name, { IPs: { ClusterIPs: { V4: ['192.0.2.10'] } }, Ports: [{ Protocol: 1, Port: 80 }] });
  const p = persistent(repoPath('callouts/userspace-proxy'));
  const claimed = () => p.stderr().split('\n').filter((l) => / is claimed by /.test(l)).length;
  // The address is not this test's: the binds fail (the acks say so), the plan is made all the same.
  // Its stderr is a pipe of its own: a line may come after the ack on fd 3. Counted as it comes, and in all once it exited.
  for (let seq = 1; seq <= 3; seq++) await p.frame(`{"Frame":{"Seq":${seq},"Input":"full"}}\n${on10('a')}\n${on10('b')}\n\n`);
  await pollUntil(() => claimed() >= 1, 'the claim told');
  await p.frame(`{"Frame":{"Seq":4,"Input":"full"}}\n${on10('a')}\n\n`);
  await p.frame(`{"Frame":{"Seq":5,"Input":"full"}}\n${on10('a')}\n${on10('b')}\n\n`);
  await pollUntil(() => claimed() >= 2, 'gone, then back: told again');
  t.equal(await p.end(), 0);
  t.equal(claimed(), 2, 'one line for the three frames, one more once it was back');
});

t.test('listeners that cannot be bound (past the open-file limit, every one, at every frame): the log and the ack stay bounded', async (t) => {
  // Addresses this test's network does not have: each bind fails at once (EADDRNOTAVAIL), nothing is sent.
  const many = Array.from({ length: 30 }, (_, i) => line(`s${i}`, { IPs: { ClusterIPs: { V4: [`192.0.2.${100 + i}`] } }, Ports: [{ Protocol: 1, Port: 80 }] }));
  const p = persistent(repoPath('callouts/userspace-proxy'));
  const ack = await p.frame(`{"Frame":{"Seq":1,"Input":"full"}}\n${many.join('\n')}\n\n`);
  t.match(ack, /^error cannot listen on 192\.0\.2\.100:80\/tcp: EADDRNOTAVAIL/);
  t.equal(ack.split('; ').length, 11, 'ten named, then how many more');
  t.match(ack, /; and 20 more$/);
  t.equal(await p.end(), 0);
  const told = p.stderr().split('\n').filter((l) => l.includes('cannot listen on'));
  t.equal(told.length, 21, 'twenty named, then one line for the rest');
  t.match(told[0], /^userspace-proxy: cannot listen on 192\.0\.2\.100:80\/tcp for "default\/s0" port 80\/tcp: EADDRNOTAVAIL/);
  t.match(told[20], /^userspace-proxy: cannot listen on 10 more addresses \(30 in all\)$/);
});

t.test('a copy outside this package (CommonJS there) runs the same', async (t) => {
  const dir = tempDir(t, 'kpng-usp-copy-');
  mkdirSync(join(dir, 'lib'));
  copyFileSync(repoPath('callouts/userspace-proxy'), join(dir, 'userspace-proxy'));
  for (const f of readdirSync(repoPath('callouts/lib')).filter((n) => n.startsWith('userspace-proxy'))) copyFileSync(repoPath(`callouts/lib/${f}`), join(dir, 'lib', f));
  const p = persistent(join(dir, 'userspace-proxy'));
  t.equal(await p.frame(`{"Frame":{"Seq":1,"Input":"full"}}\n${quiet}\n\n`), 'ok');
  t.equal(await p.end(), 0);
});

t.test('persistent only: run per state, it exits 1 saying to use --persistent', async (t) => {
  const dir = tempDir(t, 'kpng-usp-state-');
  const state = join(dir, 'state.jsonl');
  writeFileSync(state, quiet + '\n');
  const per = runBin(t, 'kpng-callout', ['replay', '--once', state, '--callout', repoPath('callouts/userspace-proxy')]);
  t.equal(await per.exited(), 1);
  t.match(per.stderr.join('\n'), /a persistent callout: run it with `kpng-callout --persistent/);
  const ok = runBin(t, 'kpng-callout', ['replay', '--once', '--persistent', '--changes', state, '--callout', repoPath('callouts/userspace-proxy')]);
  t.equal(await ok.exited(), 0, 'under --persistent: frame 1 acknowledged ok');
  const bad = runBin(t, 'kpng-callout', ['replay', '--once', '--persistent', state, '--callout', repoPath('callouts/userspace-proxy')], { env: { USERSPACE_PROXY_MAX_CONNECTIONS: 'lots' } });
  t.equal(await bad.exited(), 1, 'a bad option: it exits 1 (the frame fails)');
  t.match(bad.stderr.join('\n'), /USERSPACE_PROXY_MAX_CONNECTIONS must be an integer/);
});

t.test('an endpoint that leads back into the proxy (a node address the planner cannot know, such as one of a local route at a NodePort) is refused at run time: one hop, no storm', async (t) => {
  interface ProxyT {
    reconcile(plan: Map<string, Planned>): Promise<Array<{ where: string; why: string }>>;
    onTcp(l: unknown, c: unknown): void;
    onUdp(l: unknown, m: unknown, r: unknown): void;
    stop(): void;
    tcp: number;
    udp: number;
  }
  const { UserspaceProxy } = (await import(pathToFileURL(libPath).href)) as { UserspaceProxy: new (o: Record<string, unknown>) => ProxyT };
  const { createServer, connect } = await import('node:net');
  const dgram = await import('node:dgram');
  // Free ports on 127.0.0.1 (the planner refuses loopback endpoints: the plan is written by hand here).
  const free = async (): Promise<number> => {
    const s = createServer();
    await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
    const port = (s.address() as { port: number }).port;
    await new Promise<void>((resolve) => s.close(() => resolve()));
    return port;
  };
  const port = await free();
  const loop = (proto: string): Planned => ({
    key: `${proto} 127.0.0.1 ${port}`,
    proto,
    family: 4,
    host: '127.0.0.1',
    port,
    nodePort: false,
    label: `loop ${proto}`,
    backend: { key: `loop ${proto}`, affinityKey: `loop ${proto}`, endpoints: [{ ip: '127.0.0.1', port, id: `127.0.0.1 ${port}` }], affinityMs: 0 },
  });
  const proxy = new UserspaceProxy({ ...lib.readOptions({}), maxConnections: 300 });
  const stderr = process.stderr.write.bind(process.stderr);
  const logged: string[] = [];
  process.stderr.write = ((s: string) => (logged.push(String(s)), true)) as typeof process.stderr.write;
  t.teardown(() => {
    process.stderr.write = stderr;
    proxy.stop();
  });
  t.same(await proxy.reconcile(new Map([[`tcp 127.0.0.1 ${port}`, loop('tcp')], [`udp 127.0.0.1 ${port}`, loop('udp')]])), [], 'both listeners up');
  let accepted = 0;
  let datagrams = 0;
  const onTcp = proxy.onTcp.bind(proxy);
  const onUdp = proxy.onUdp.bind(proxy);
  proxy.onTcp = (l, c) => (accepted++, onTcp(l, c));
  proxy.onUdp = (l, m, r) => (datagrams++, onUdp(l, m, r));

  const client = connect({ host: '127.0.0.1', port });
  client.on('error', () => {});
  await within(new Promise((resolve) => client.on('close', resolve)), () => 'the client is closed', WAIT_MS);
  const u = dgram.createSocket('udp4');
  u.send('x', port, '127.0.0.1');
  await pollUntil(() => datagrams >= 2, 'the looped datagram');
  // A loop not caught would go on: give it time to show.
  await new Promise((resolve) => setTimeout(resolve, 200));
  u.close();
  t.equal(accepted, 2, 'TCP: the client and the one looped connection, refused');
  t.equal(datagrams, 2, "UDP: the client's datagram and the one looped datagram, dropped");
  t.equal(proxy.tcp, 0, 'no TCP connection left');
  t.equal(proxy.udp, 1, "only the client's session");
  t.ok(logged.some((l) => /tcp 127\.0\.0\.1:\d+ -> 127\.0\.0\.1:\d+\/tcp: it comes from this proxy itself/.test(l)), 'the TCP loop is logged', { logged });
  t.notOk(logged.some((l) => /the cap .* is reached/.test(l)), 'the connection cap is never reached', { logged });
});
