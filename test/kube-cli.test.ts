/**
 * `kpng-json kube` and `kpng-callout kube`: the built bins as child processes
 * against a list/watch server on loopback.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';
import { convertObjects } from '../src/convert/kubernetes.js';
import { stateText } from '../src/state.js';
import { KubeApiServer } from './helpers/kube-api-server.js';
import { blogObjects, blogState, node, service, slice } from './helpers/kube-objects.js';
import { within } from './helpers/sink.js';

const bin = (tool: string): string => fileURLToPath(new URL(`../bin/${tool}`, import.meta.url));

interface Child {
  proc: ChildProcess;
  stdout: string[];
  stderr: string[];
  /** Resolves with the first line (past or future) of `stream` matching `re`. */
  line(stream: 'stdout' | 'stderr', re: RegExp, what?: string, ms?: number): Promise<string>;
  exit: Promise<number | null>;
}

/**
 * Runs a bin with a clean environment (no KUBECONFIG, no in-cluster variables,
 * an empty HOME). `env -u NODE_OPTIONS`: tap injects its loaders into every
 * child's NODE_OPTIONS, and they cannot load an extensionless ESM bin.
 */
function run(t: Test, tool: string, args: string[], env: NodeJS.ProcessEnv = {}): Child {
  const home = mkdtempSync(join(tmpdir(), 'home-'));
  const proc = spawn('/usr/bin/env', ['-u', 'NODE_OPTIONS', process.execPath, bin(tool), ...args], {
    env: { PATH: process.env.PATH, HOME: home, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const out: Record<'stdout' | 'stderr', string[]> = { stdout: [], stderr: [] };
  const waiters: Array<{ stream: 'stdout' | 'stderr'; re: RegExp; resolve: (l: string) => void }> = [];
  for (const stream of ['stdout', 'stderr'] as const) {
    createInterface(proc[stream]!).on('line', (l) => {
      out[stream].push(l);
      for (const w of [...waiters]) {
        if (w.stream === stream && w.re.test(l)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(l);
        }
      }
    });
  }
  const exit = new Promise<number | null>((resolve) => proc.on('exit', (code) => resolve(code)));
  t.teardown(async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGTERM');
      await exit;
    }
  });
  return {
    proc,
    ...out,
    exit,
    line(stream, re, what = String(re), ms = 30_000) {
      const hit = out[stream].find((l) => re.test(l));
      if (hit !== undefined) return Promise.resolve(hit);
      return within(new Promise<string>((resolve) => waiters.push({ stream, re, resolve })), `${what} on ${stream} (${out.stderr.slice(-3).join(' | ')})`, ms);
    },
  };
}

t.test('kpng-json kube --once prints the blog state for the node hosting the local pods', async (t) => {
  const srv = new KubeApiServer();
  for (const [r, o] of blogObjects()) srv.add(r, o);
  srv.add('nodes', node('vm-001'), node('vm-002'));
  await srv.listen();
  t.teardown(() => srv.close());
  const kubeconfig = srv.writeKubeconfig();
  // --kubeconfig, and NODE_NAME from the environment (as the DaemonSet sets it).
  const a = run(t, 'kpng-json', ['kube', '--once', '--kubeconfig', kubeconfig, '--service-proxy-name', 'kpng-example'], { NODE_NAME: 'vm-002' });
  t.equal(await a.exit, 0, a.stderr.join('\n'));
  t.equal(a.stdout.join('\n') + '\n', blogState());
  // $KUBECONFIG, --node-name; the other node sees the other pod as Local.
  // --with-service-labels as kpng's.
  const b = run(t, 'kpng-json', ['kube', '--once', '--node-name', 'vm-001', '--service-proxy-name', 'kpng-example', '--with-service-labels', 'service.kubernetes.io/*'], {
    KUBECONFIG: kubeconfig,
  });
  t.equal(await b.exit, 0);
  const line = JSON.parse(b.stdout[0]!) as { Service: { Labels?: unknown }; Endpoints: Array<{ IPs: { V4?: string[]; V6?: string[] }; Local?: boolean }> };
  t.same(line.Service.Labels, { 'service.kubernetes.io/service-proxy-name': 'kpng-example' });
  const eps = line.Endpoints;
  t.same(eps.filter((e) => e.Local).map((e) => [...(e.IPs.V4 ?? []), ...(e.IPs.V6 ?? [])][0]).sort(), ['11.0.1.2', '1100::102']);
  // Without --service-proxy-name the example Service is not ours: an empty state.
  const c = run(t, 'kpng-json', ['kube', '--once', '--node-name', 'vm-002', '--kubeconfig', kubeconfig]);
  t.equal(await c.exit, 0);
  t.same(c.stdout, []);
});

t.test('kpng-callout kube: 1,000 events in a second make a handful of runs, the last with the final state', async (t) => {
  const srv = new KubeApiServer();
  const N = 40;
  for (let i = 0; i < N; i++) {
    srv.add('services', service(`s${i}`, { proxyName: 'churn' }));
    srv.add('endpointslices', slice(`s${i}-a`, `s${i}`, [{ ip: `10.20.${i}.1`, node: 'node-a' }]));
  }
  await srv.listen();
  t.teardown(() => srv.close());
  const dir = mkdtempSync(join(tmpdir(), 'runs-'));
  const callout = join(dir, 'record');
  writeFileSync(callout, '#!/bin/sh\ncat > "$RUNS_DIR/run-$KPNG_CALLOUT_RUN"\necho "callout-run $KPNG_CALLOUT_RUN"\n');
  chmodSync(callout, 0o755);
  const c = run(t, 'kpng-callout', ['kube', '--kubeconfig', srv.writeKubeconfig(), '--node-name', 'node-a', '--service-proxy-name', 'churn', '--callout', callout], { RUNS_DIR: dir });
  await c.line('stdout', /^callout-run 1$/, 'first run');

  // 1,000 events over about a second: slice updates, Service updates, deletions and additions.
  let events = 0;
  const started = Date.now();
  for (let batch = 0; batch < 20; batch++) {
    for (let k = 0; k < 50; k++, events++) {
      const i = events % N;
      if (events % 10 === 3) {
        if (!srv.remove('services', 'default', `s${i}`)) srv.add('services', service(`s${i}`, { proxyName: 'churn' }));
      } else if (events % 10 === 7) {
        srv.update('services', service(`s${i}`, { proxyName: 'churn', externalIPs: [`192.0.2.${events % 250}`] }));
      } else {
        srv.update('endpointslices', slice(`s${i}-a`, `s${i}`, [{ ip: `10.20.${i}.${(events % 200) + 2}`, node: events % 3 ? 'node-a' : 'node-b' }]));
      }
    }
    await new Promise((r) => setTimeout(r, 50)); // spread the load over ~1 s
  }
  t.equal(events, 1000);
  t.comment(`churn sent in ${Date.now() - started} ms`);
  const expected = stateText(convertObjects(srv.all(), { nodeName: 'node-a', serviceProxyName: 'churn' }));
  const runText = (n: number): string => readFileSync(join(dir, `run-${n}`), 'utf8');

  // Wait for the run with the final state...
  let final = 0;
  for (let n = 2; final === 0; n++) {
    await c.line('stdout', new RegExp(`^callout-run ${n}$`), `run ${n}`);
    if (runText(n) === expected) final = n;
  }
  // ...then one more change: the very next run must be it (nothing ran in between).
  srv.add('services', service('marker', { proxyName: 'churn' }));
  await c.line('stdout', new RegExp(`^callout-run ${final + 1}$`), 'marker run');
  t.match(runText(final + 1), /"Name":"marker"/);
  const runs = readdirSync(dir).filter((f) => f.startsWith('run-')).length;
  t.equal(runs, final + 1, 'no other run');
  t.ok(final - 1 <= 6, `a handful of runs for 1,000 events (${final - 1})`);
  t.equal(runText(final), expected, 'the last churn run has exactly the final state');
});

t.test('API down at start, then 403: a clear line each, no run before every list completed', async (t) => {
  const srv = new KubeApiServer();
  await srv.listen();
  const port = srv.port;
  const kubeconfig = srv.writeKubeconfig();
  await srv.close();
  srv.add('services', service('web'));
  srv.add('endpointslices', slice('web-a', 'web', [{ ip: '10.30.0.1', node: 'node-a' }]));
  srv.forbid('endpointslices', 'list');
  const dir = mkdtempSync(join(tmpdir(), 'runs-'));
  const c = run(t, 'kpng-callout', ['kube', '--kubeconfig', kubeconfig, '--node-name', 'node-a', '--callout', 'cat'], { RUNS_DIR: dir });
  await c.line('stderr', /error: cannot reach the Kubernetes API server http:\/\/127\.0\.0\.1:\d+: connection refused .*retrying in/, 'unreachable');
  await srv.listen(port);
  t.teardown(() => srv.close());
  const forbidden = await c.line('stderr', /list endpointslices\.discovery\.k8s\.io: 403 Forbidden/, '403');
  t.match(forbidden, /RBAC does not allow verb "list" on resource "endpointslices" in API group "discovery\.k8s\.io"/);
  t.same(c.stdout, [], 'no run yet');
  srv.allow('endpointslices', 'list');
  const out = await c.line('stdout', /"Name":"web"/, 'the first run');
  t.match(out, /"V4":\["10\.30\.0\.1"\]\},"Local":true/, 'with its endpoints');
});

t.test('configuration errors', async (t) => {
  const none = run(t, 'kpng-json', ['kube', '--once']);
  t.equal(await none.exit, 1);
  t.match(none.stderr.join('\n'), /no Kubernetes API configuration: no --kubeconfig, \$KUBECONFIG unset, not in a cluster \(KUBERNETES_SERVICE_HOST unset\) and no .*\.kube\/config/);
  const missing = run(t, 'kpng-json', ['kube', '--once', '--kubeconfig', '/nonexistent/config']);
  t.equal(await missing.exit, 2);
  t.match(missing.stderr.join('\n'), /--kubeconfig \/nonexistent\/config: cannot read file \(ENOENT\)/);
  const env = run(t, 'kpng-json', ['kube', '--once'], { KUBECONFIG: '/nonexistent/a:/nonexistent/b' });
  t.equal(await env.exit, 2);
  t.match(env.stderr.join('\n'), /\$KUBECONFIG \/nonexistent\/a:\/nonexistent\/b: no such file/);
  const name = run(t, 'kpng-json', ['kube', '--once', '--service-proxy-name', 'not a label!']);
  t.equal(await name.exit, 2);
  t.match(name.stderr.join('\n'), /--service-proxy-name "not a label!": expected a label value/);
});
