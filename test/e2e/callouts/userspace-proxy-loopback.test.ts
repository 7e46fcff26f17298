/**
 * callouts/userspace-proxy's library on loopback, each test a Node script
 * of its own: a client sharing its local port with one of the proxy's
 * upstream sockets is not taken for a loop (in a network namespace with 20
 * ephemeral ports; needs root and `ip netns`, skips saying why), a reset is
 * passed on as a reset, and a UDP listener re-bound for a NodePort keeps its
 * sessions. The proxy under the runner with real traffic: userspace-proxy.test.ts.
 */
import t from 'tap';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { mustRun, runCommand } from '../../helpers/command.js';
import { tempDir } from '../../helpers/files.js';
import { repoPath } from '../../helpers/fixtures.js';
import { labMissing } from '../../helpers/userspace-lab.js';

const reason = await labMissing();
if (reason) console.error(`# skipping userspace-proxy loopback tests in a network namespace: ${reason}`);

t.test('userspace-proxy: a client that shares its local port with one of the proxy upstream sockets is not taken for a loop', { skip: reason ?? false }, async (t) => {
  // Linux lets sockets bound by connect() share a local port when their destinations differ: with 20 ephemeral ports,
  // 8 clients and their 8 upstream sockets, all from 127.0.0.1, share ports. Only a connection whose both ends are an
  // upstream socket's is a loop.
  const ns = `kpusp-${process.pid}-ports`;
  await mustRun('ip', ['netns', 'add', ns]);
  t.teardown(() => runCommand('ip', ['netns', 'del', ns]).then(() => undefined));
  await mustRun('ip', ['netns', 'exec', ns, 'ip', 'link', 'set', 'lo', 'up']);
  await mustRun('ip', ['netns', 'exec', ns, 'sysctl', '-q', '-w', 'net.ipv4.ip_local_port_range=40000 40019']);
  const dir = tempDir(t, 'kpusp-ports-');
  const script = join(dir, 'clients.mjs');
  writeFileSync(
    script,
    `import net from 'node:net';
import { UserspaceProxy, readOptions } from ${JSON.stringify(pathToFileURL(repoPath('callouts/lib/userspace-proxy.mjs')).href)};
const echo = net.createServer((s) => s.pipe(s));
await new Promise((r) => echo.listen(0, '127.0.0.1', r));
const E = echo.address().port;
const L = E === 65535 ? E - 1 : E + 1;
// A plan by hand: the planner refuses loopback endpoints.
const plan = new Map([[\`tcp 127.0.0.1 \${L}\`, { key: \`tcp 127.0.0.1 \${L}\`, proto: 'tcp', family: 4, host: '127.0.0.1', port: L, nodePort: false, label: 'svc',
  backend: { key: 'b', affinityKey: 'b', endpoints: [{ ip: '127.0.0.1', port: E, id: \`127.0.0.1 \${E}\` }], affinityMs: 0 } }]]);
const proxy = new UserspaceProxy({ ...readOptions({}), maxConnections: 1000 });
const failed = await proxy.reconcile(plan);
const held = [];
const results = [];
for (let i = 0; i < 8; i++) {
  results.push(await new Promise((resolve) => {
    const c = net.connect({ host: '127.0.0.1', port: L }, () => c.write('ping'));
    held.push(c);
    c.on('error', () => resolve('error'));
    c.on('close', () => resolve('closed'));
    c.once('data', () => resolve('ok'));
  }));
}
const ports = new Set(held.map((c) => c.localPort));
console.log(JSON.stringify({ failed, results, clientPorts: ports.size }));
proxy.stop();
echo.close();
for (const c of held) c.destroy();
`,
  );
  const r = await runCommand('ip', ['netns', 'exec', ns, process.execPath, script], { env: { ...process.env, NODE_OPTIONS: '' } });
  t.equal(r.code, 0, 'the script ran', { stderr: r.stderr });
  const out = JSON.parse(r.stdout.trim().split('\n').at(-1) ?? '{}') as { failed: unknown[]; results: string[] };
  t.same(out.failed, [], 'the listener is up');
  t.same(out.results, Array(8).fill('ok'), 'every client is answered through the proxy', { stderr: r.stderr });
  t.notMatch(r.stderr, /comes from this proxy itself/, 'none taken for a loop');
});

t.test('userspace-proxy on loopback: a reset is passed on as a reset; a UDP listener re-bound for a NodePort keeps its sessions', async (t) => {
  const dir = tempDir(t, 'kpusp-lo-');
  const script = join(dir, 'lo.mjs');
  writeFileSync(
    script,
    `import net from 'node:net';
import dgram from 'node:dgram';
import { once } from 'node:events';
import { UserspaceProxy, readOptions } from ${JSON.stringify(pathToFileURL(repoPath('callouts/lib/userspace-proxy.mjs')).href)};
const out = {};
const freePort = async (type) => {
  const s = type === 'tcp' ? net.createServer() : dgram.createSocket('udp4');
  await new Promise((r) => (type === 'tcp' ? s.listen(0, '127.0.0.1', r) : s.bind(0, '127.0.0.1', r)));
  const p = s.address().port;
  await new Promise((r) => s.close(r));
  return p;
};
const ep = (port) => ({ ip: '127.0.0.1', port, id: '127.0.0.1 ' + port });
const listener = (proto, port, endpoints, shared) => ({ key: proto + ' 127.0.0.1 ' + port, proto, family: 4, host: '127.0.0.1', port, nodePort: false, label: 'svc', shared,
  backend: { key: proto + 'b', affinityKey: proto + 'b', endpoints, affinityMs: 0 } });
const proxy = new UserspaceProxy({ ...readOptions({}), maxConnections: 1000 });

// TCP: the upstream says hello, and resets on "RST"; what does the client see, and the other way round?
let upstreamSaw;
const up = net.createServer((c) => {
  c.write('hello\\n');
  c.on('data', (d) => String(d).startsWith('RST') && c.resetAndDestroy());
  c.on('error', (e) => (upstreamSaw = e.code));
  c.on('end', () => (upstreamSaw ??= 'end'));
});
await new Promise((r) => up.listen(0, '127.0.0.1', r));
const LT = await freePort('tcp');
const tcpPlan = new Map([[\`tcp 127.0.0.1 \${LT}\`, listener('tcp', LT, [ep(up.address().port)])]]);
out.tcpFailed = await proxy.reconcile(tcpPlan);
const clientSees = await new Promise((resolve) => {
  const c = net.connect({ host: '127.0.0.1', port: LT });
  c.once('data', () => c.write('RST'));
  c.on('error', (e) => resolve(e.code));
  c.on('end', () => resolve('end'));
});
out.clientSaw = clientSees;
await new Promise((resolve) => {
  const c = net.connect({ host: '127.0.0.1', port: LT });
  c.once('data', () => {
    c.resetAndDestroy();
    setTimeout(resolve, 300);
  });
  c.on('error', () => {});
});
out.upstreamSaw = upstreamSaw;
// The address and port go to another Service: the listener stays, the log says whose it is now.
out.tcpFailed.push(...(await proxy.reconcile(new Map([[\`tcp 127.0.0.1 \${LT}\`, { ...listener('tcp', LT, [ep(up.address().port)]), label: 'other' }]]))));

// UDP: two endpoints answering with their name; a client keeps its socket while the listener is re-bound
// (shared with a NodePort, then no longer).
const names = {};
for (const n of ['A', 'B']) {
  const u = dgram.createSocket('udp4');
  u.on('message', (m, r) => u.send(n, r.port, r.address));
  await new Promise((r) => u.bind(0, '127.0.0.1', r));
  names[n] = u;
}
const LU = await freePort('udp');
const udpPlan = (shared) => new Map([[\`udp 127.0.0.1 \${LU}\`, listener('udp', LU, [ep(names.A.address().port), ep(names.B.address().port)], shared)]]);
const c = dgram.createSocket('udp4');
await new Promise((r) => c.bind(0, '127.0.0.1', r));
const ask = async () => {
  c.send('x', LU, '127.0.0.1');
  const [m, r] = await once(c, 'message');
  return String(m) + '@' + r.port;
};
out.udpFailed = [...(await proxy.reconcile(udpPlan(false))), ...(await proxy.reconcile(udpPlan(false)))];
out.replies = [await ask()];
out.udpFailed.push(...(await proxy.reconcile(udpPlan(true))));
out.replies.push(await ask());
out.udpFailed.push(...(await proxy.reconcile(udpPlan(false))));
out.replies.push(await ask());
out.LU = LU;
console.log(JSON.stringify(out));
proxy.stop();
up.close();
c.close();
for (const u of Object.values(names)) u.close();
`,
  );
  const r = await runCommand(process.execPath, [script], { env: { ...process.env, NODE_OPTIONS: '' } });
  t.equal(r.code, 0, 'the script ran', { stderr: r.stderr });
  const out = JSON.parse(r.stdout.trim().split('\n').at(-1) ?? '{}') as { tcpFailed: unknown[]; udpFailed: unknown[]; clientSaw: string; upstreamSaw: string; replies: string[]; LU: number };
  t.same([out.tcpFailed, out.udpFailed], [[], []], 'the listeners are up');
  t.equal(out.clientSaw, 'ECONNRESET', "the endpoint's reset reaches the client as a reset (a FIN would pass a cut stream off as complete)");
  t.equal(out.upstreamSaw, 'ECONNRESET', "the client's reset reaches the endpoint as a reset");
  t.same(out.replies, Array(3).fill(`A@${out.LU}`), 'the session keeps its endpoint across the re-binds; replies come from the listening port');
  t.match(r.stderr, /userspace-proxy: 127\.0\.0\.1:\d+\/tcp now for other \(was svc\)/, 'a listener that changes hands says so');
});
