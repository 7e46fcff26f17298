/**
 * `kpng-json kube` and `kpng-callout kube`: the built bins as child processes
 * against a list/watch server on loopback.
 */
import { writeFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { convertObjects } from '../../src/convert/kubernetes.js';
import { stateText } from '../../src/state.js';
import { binArgv, runBin, type BinProcess } from '../helpers/bin-process.js';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { recordingCallout, tempDir } from '../helpers/files.js';
import { blogJsonl } from '../helpers/fixtures.js';
import { KubeApiServer } from '../helpers/kube-api-server.js';
import { blogObjects, node, service, slice } from '../helpers/kube-objects.js';

/** Runs a bin with a clean environment: no KUBECONFIG, no in-cluster variables, an empty HOME. */
function run(t: Test, tool: string, args: string[], env: NodeJS.ProcessEnv = {}): BinProcess {
  return runBin(t, tool, args, { env: { HOME: tempDir(t, 'kpng-e2e-home-'), ...env } });
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
  t.equal(await a.exited(), 0, a.stderr.join('\n'));
  t.equal(a.bytes('stdout').toString(), blogJsonl);
  // $KUBECONFIG, --node-name; the other node sees the other pod as Local.
  // --with-service-labels as kpng's.
  const b = run(t, 'kpng-json', ['kube', '--once', '--node-name', 'vm-001', '--service-proxy-name', 'kpng-example', '--with-service-labels', 'service.kubernetes.io/*'], {
    KUBECONFIG: kubeconfig,
  });
  t.equal(await b.exited(), 0);
  const line = JSON.parse(b.stdout[0]!) as { Service: { Labels?: unknown }; Endpoints: Array<{ IPs: { V4?: string[]; V6?: string[] }; Local?: boolean }> };
  t.same(line.Service.Labels, { 'service.kubernetes.io/service-proxy-name': 'kpng-example' });
  const eps = line.Endpoints;
  t.same(eps.filter((e) => e.Local).map((e) => [...(e.IPs.V4 ?? []), ...(e.IPs.V6 ?? [])][0]).sort(), ['11.0.1.2', '1100::102']);
  // Without --service-proxy-name the example Service is not ours: an empty state.
  const c = run(t, 'kpng-json', ['kube', '--once', '--node-name', 'vm-002', '--kubeconfig', kubeconfig]);
  t.equal(await c.exited(), 0);
  t.same(c.stdout, []);
});

t.test('a plain-HTTP server without insecure-skip-tls-verify (kubectl proxy) is used as kubectl uses it', async (t) => {
  const srv = new KubeApiServer();
  for (const [r, o] of blogObjects()) srv.add(r, o);
  srv.add('nodes', node('vm-002'));
  await srv.listen();
  t.teardown(() => srv.close());
  const dir = tempDir(t, 'kpng-e2e-kube-http-');
  const kubeconfig = join(dir, 'config');
  writeFileSync(kubeconfig, `apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: ${srv.url}\ncontexts:\n- name: proxy\n  context: {cluster: proxy}\ncurrent-context: proxy\n`);
  const a = run(t, 'kpng-json', ['kube', '--once', '--once-timeout', '20s', '--kubeconfig', kubeconfig, '--service-proxy-name', 'kpng-example', '--node-name', 'vm-002']);
  t.equal(await a.exited(), 0, a.stderr.join('\n'));
  t.equal(a.bytes('stdout').toString(), blogJsonl);
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
  const rec = recordingCallout(tempDir(t, 'kpng-e2e-runs-'), 'record');
  const c = run(t, 'kpng-callout', ['kube', '--kubeconfig', srv.writeKubeconfig(), '--node-name', 'node-a', '--service-proxy-name', 'churn', '--callout', rec.path]);
  await c.line('stdout', /^ran 1$/, 'first run');

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
    await sleep(50); // the stimulus: spread the load over ~1 s, not a wait for a result
  }
  t.equal(events, 1000);
  t.comment(`churn sent in ${Date.now() - started} ms`);
  const expected = stateText(convertObjects(srv.all(), { nodeName: 'node-a', serviceProxyName: 'churn' }));

  // Wait for the run with the final state...
  let final = 0;
  for (let n = 2; final === 0; n++) {
    await c.line('stdout', new RegExp(`^ran ${n}$`), `run ${n}`);
    if (rec.run(n) === expected) final = n;
  }
  // ...then one more change: the very next run must be it (nothing ran in between).
  srv.add('services', service('marker', { proxyName: 'churn' }));
  await c.line('stdout', new RegExp(`^ran ${final + 1}$`), 'marker run');
  t.match(rec.run(final + 1), /"Name":"marker"/);
  t.equal(rec.runs().length, final + 1, 'no other run');
  t.ok(final - 1 <= 6, `a handful of runs for 1,000 events (${final - 1})`);
  t.equal(rec.run(final), expected, 'the last churn run has exactly the final state');
});

t.test('API down at start, then 403: a clear line each, no run before every list completed', async (t) => {
  const srv = new KubeApiServer();
  const { port, kubeconfig } = await srv.startDown();
  srv.add('services', service('web'));
  srv.add('endpointslices', slice('web-a', 'web', [{ ip: '10.30.0.1', node: 'node-a' }]));
  srv.forbid('endpointslices', 'list');
  const c = run(t, 'kpng-callout', ['kube', '--kubeconfig', kubeconfig, '--node-name', 'node-a', '--callout', 'cat']);
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

t.test('an unreachable API server: one line per attempt, not one per resource; repeats at debug level', async (t) => {
  const { kubeconfig } = await new KubeApiServer().startDown();
  const c = run(t, 'kpng-json', ['kube', '-v', '--kubeconfig', kubeconfig, '--node-name', 'node-a']);
  // Backoff 500 ms, 1 s, 2 s, each ±20% (jitter): the third attempt's line comes after about 1.5 s.
  const attempts = await c.matching('stderr', /cannot reach/, 3, 'three attempts');
  const what = 'cannot reach the Kubernetes API server http://HOST: connection refused (ECONNREFUSED; list services, list endpointslices.discovery.k8s.io, list nodes)';
  t.same(
    attempts.map((l) => l.replace(/127\.0\.0\.1:\d+/, 'HOST').replace(/retrying in \d+ms/, 'retrying in Nms')),
    [
      `kpng-json error: ${what}; retrying in Nms waiting="initial list"`,
      `kpng-json debug: ${what}; retrying in Nms waiting="initial list"`,
      `kpng-json debug: ${what}; retrying in Nms waiting="initial list"`,
    ],
  );
  for (const [i, base] of [500, 1000, 2000].entries()) {
    const ms = Number(/retrying in (\d+)ms/.exec(attempts[i]!)?.[1]);
    t.ok(ms >= base * 0.8 && ms <= base * 1.2, `attempt ${i + 1}: ${ms}ms is ${base}ms ±20%`);
  }
});

t.test('configuration errors', async (t) => {
  const dir = tempDir(t, 'kpng-e2e-kubeconfig-');
  const emptyFile = join(dir, 'empty');
  writeFileSync(emptyFile, '');
  const braces = join(dir, 'braces');
  writeFileSync(braces, '{}\n');
  // [args, env, exit status, stderr]; run side by side.
  const cases: Array<[string[], NodeJS.ProcessEnv, number, RegExp]> = [
    [['--kubeconfig', emptyFile], {}, 1, /^kpng-json: --kubeconfig \S+\/empty: empty file: no current context and no clusters; pass a complete kubeconfig: .*`kubectl config view --minify --flatten` prints one\)$/],
    [[], { KUBECONFIG: braces }, 1, /^kpng-json: \$KUBECONFIG \S+\/braces: no current context and no clusters; pass a complete kubeconfig/],
    [[], {}, 1, /no Kubernetes API configuration: no --kubeconfig, \$KUBECONFIG unset, not in a cluster \(KUBERNETES_SERVICE_HOST unset\) and no .*\.kube\/config/],
    [['--kubeconfig', '/nonexistent/config'], {}, 2, /--kubeconfig \/nonexistent\/config: cannot read file \(ENOENT\)/],
    [[], { KUBECONFIG: '/nonexistent/a:/nonexistent/b' }, 2, /\$KUBECONFIG \/nonexistent\/a:\/nonexistent\/b: no such file/],
    [['--service-proxy-name', 'not a label!'], {}, 2, /--service-proxy-name "not a label!": expected a label value/],
    [['--with-service-labels', '[oops'], {}, 2, /--with-service-labels "\[oops": invalid glob/],
  ];
  const procs = cases.map(([args, env]) => run(t, 'kpng-json', ['kube', '--once', ...args], env));
  for (const [i, [args, , status, re]] of cases.entries()) {
    const p = procs[i]!;
    t.equal(await p.exited(args.join(' ')), status, args.join(' '));
    // Past the startup line, if any, the error.
    const errors = p.stderr.filter((l) => !/^kpng-json info:/.test(l)).join('\n');
    t.match(errors, re);
    t.notMatch(errors, /Cannot read properties|\n\s+at /, 'no JavaScript error text or stack');
    if (status === 1) t.notOk(p.stderr.some((l) => /--help/.test(l)), 'no usage hint');
  }
});

t.test('the default node name is the hostname lowercased, as the kubelet names its Node', { skip: process.getuid?.() === 0 ? false : 'needs root (unshare --uts)' }, async (t) => {
  const srv = new KubeApiServer();
  srv.add('nodes', node('worker-7', 'z1'));
  await srv.listen();
  t.teardown(() => srv.close());
  const argv = binArgv('kpng-json', ['kube', '--once', '--once-timeout', '20s', '--kubeconfig', srv.writeKubeconfig()]);
  // A UTS namespace of its own, the hostname spelled as some machines do; asynchronously: the API server answers from this process.
  const r = await promisify(execFile)('unshare', ['--uts', 'sh', '-c', 'hostname Worker-7 && exec "$@"', 'sh', ...argv], { env: { PATH: process.env.PATH, HOME: '/nonexistent' }, encoding: 'utf8' });
  t.match(r.stderr, /node=worker-7/);
  t.match(r.stderr, /zone=z1/);
});
