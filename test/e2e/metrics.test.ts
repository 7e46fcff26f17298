/**
 * The bins' metrics and health options: option errors, a port in use (exit 1,
 * no usage hint), --metrics-addr on loopback with --health-addr on every
 * interface, as the DaemonSet runs.
 */
import { createServer, type AddressInfo } from 'node:net';
import t from 'tap';
import { heldPort } from '../helpers/ports.js';
import { runBin } from '../helpers/bin-process.js';


t.test('option errors: --metrics-addr, --health-addr, --retry-min, --retry-max', async (t) => {
  const cases: Array<[string, string[], string]> = [
    ['kpng-callout', ['--metrics-addr', 'localhost'], 'kpng-callout: --metrics-addr "localhost": expected HOST:PORT, such as 127.0.0.1:9100, [::1]:9100 or :9100 (every interface)'],
    ['kpng-json', ['--metrics-addr', '127.0.0.1:70000'], 'kpng-json: --metrics-addr 127.0.0.1:70000: port out of range 0-65535'],
    ['kpng-json', ['--health-addr', ':'], 'kpng-json: --health-addr ":": expected HOST:PORT, such as 127.0.0.1:9100, [::1]:9100 or :9100 (every interface)'],
    ['kpng-callout', ['--retry-min', '0'], 'kpng-callout: --retry-min 0: expected a duration above 0'],
    ['kpng-callout', ['--retry-min', '2s', '--retry-max', '1s'], 'kpng-callout: --retry-max 1s: expected at least --retry-min (2s)'],
  ];
  for (const [tool, args, message] of cases) {
    const p = runBin(t, tool, args);
    t.equal(await p.done, 2, `${args.join(' ')}: exit 2`);
    t.equal(p.stderr[0], message);
  }
});

t.test('bins: a port in use exits 1 without a usage hint; :PORT and --health-addr serve', async (t) => {
  const port = await heldPort(t);
  for (const flag of ['--metrics-addr', '--health-addr']) {
    const p = runBin(t, 'kpng-json', ['replay', flag, `127.0.0.1:${port}`, 'fixtures/kpng-example.jsonl']);
    t.equal(await p.done, 1, `${flag}: exit 1`);
    const errors = p.stderr.filter((l) => !/^kpng-json info:/.test(l));
    t.match(errors, [new RegExp(`^kpng-json: ${flag} 127\\.0\\.0\\.1:${port}: cannot listen: address already in use \\(EADDRINUSE\\)`)], flag);
    t.notOk(p.stderr.some((l) => /--help/.test(l)), 'no usage hint');
    t.same(p.stdout, [], 'nothing printed');
  }
  // Our own --metrics-addr on the port that --health-addr asks for (another spelling of an overlapping address):
  // said so, not "another process".
  const free = await new Promise<number>((resolve) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const fp = (s.address() as AddressInfo).port;
      s.close(() => resolve(fp));
    });
  });
  const both = runBin(t, 'kpng-json', ['replay', '--metrics-addr', `127.0.0.1:${free}`, '--health-addr', `:${free}`, 'fixtures/kpng-example.jsonl']);
  t.equal(await both.done, 1);
  t.match(both.stderr.filter((l) => !/^kpng-json info:/.test(l)), [`kpng-json: --health-addr :${free}: cannot listen: --metrics-addr 127.0.0.1:${free} holds that port already (it serves /healthz and /readyz too): drop one or pick another port`]);
  // --metrics-addr on loopback and --health-addr on every interface, as the DaemonSet runs.
  const p = runBin(t, 'kpng-json', ['replay', '--watch', '--metrics-addr', '127.0.0.1:0', '--health-addr', ':0', 'fixtures/kpng-example.jsonl']);
  const healthLine = await p.line('stderr', /serving \/healthz and \/readyz on http:\/\/\S+:\d+ \(every interface\)/);
  const metricsLine = await p.line('stderr', /serving \/metrics, \/healthz and \/readyz on http:\/\/127\.0\.0\.1:\d+$/);
  const healthPort = /:(\d+) \(every interface\)/.exec(healthLine)![1];
  const metricsPort = /:(\d+)$/.exec(metricsLine)![1];
  await p.line('stdout', /"Name"/, 'the state printed');
  const ready = await fetch(`http://127.0.0.1:${healthPort}/readyz`);
  t.equal(ready.status, 200);
  t.equal(await ready.text(), 'ready: a complete state was printed\n');
  t.equal((await fetch(`http://127.0.0.1:${healthPort}/metrics`)).status, 404, 'no metrics on the health address');
  t.equal((await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).status, 200);
});
