/**
 * Option value parsers: Go durations, byte sizes, addresses (what a connect
 * address, --api, and a listen address, --metrics-addr / --health-addr,
 * accept), names.
 */
import t from 'tap';
import { parseDuration, parseHostPort, parseNodeName, parseNonEmpty, parseServiceProxyName, parseSize } from '../src/options.js';

t.test("durations as Go's time.ParseDuration reads them, in milliseconds", async (t) => {
  const cases: Array<[string, number]> = [
    ['0', 0],
    ['100ms', 100],
    ['1s', 1000],
    ['1m30s', 90_000],
    ['1h', 3_600_000],
    ['1.5s', 1500],
    ['.5s', 500],
    ['250us', 0.25],
    ['250µs', 0.25],
    ['1000000ns', 1],
    ['2h45m', 9_900_000],
  ];
  for (const [v, ms] of cases) t.equal(parseDuration('--x', v), ms, v);
  for (const bad of ['', '5', '1 s', '1sec', 's', '-1s', '1s2', 'fast']) {
    t.throws(() => parseDuration('--debounce', bad), { code: 'usage', message: `--debounce ${JSON.stringify(bad)}: expected a duration such as 100ms, 1s, 1m30s (or 0)` }, bad);
  }
});

t.test('parseDuration: nothing longer than the longest timer (2^31-1 ms)', async (t) => {
  t.equal(parseDuration('--timeout', '596h'), 596 * 3600 * 1000);
  t.equal(parseDuration('--timeout', '2147483647ms'), 2 ** 31 - 1);
  for (const long of ['597h', '1000h', '2147483648ms', '10000000h']) {
    t.throws(() => parseDuration('--resync-period', long), { code: 'usage', message: `--resync-period ${JSON.stringify(long)}: expected a duration of at most 596h (2147483647ms, the longest timer)` }, long);
  }
});

t.test('sizes in bytes, SI and binary units', async (t) => {
  const cases: Array<[string, number]> = [
    ['4194304', 4194304],
    ['4MiB', 4194304],
    ['512KiB', 524288],
    ['10MB', 10_000_000],
    ['1k', 1000],
    ['1Gi', 1073741824],
  ];
  for (const [v, n] of cases) t.equal(parseSize('--max-msg-size', v), n, v);
  t.throws(() => parseSize('--max-msg-size', 'big'), { code: 'usage', message: /expected a size in bytes/ });
  t.throws(() => parseSize('--max-msg-size', '0'), { code: 'usage', message: /out of range/ });
  t.throws(() => parseSize('--max-msg-size', '4GiB'), { code: 'usage', message: /out of range/ });
});

t.test('names: non-empty values and service-proxy-name label values', async (t) => {
  t.equal(parseNonEmpty('--node-name', 'vm-1'), 'vm-1');
  t.throws(() => parseNonEmpty('--node-name', ' '), { code: 'usage', message: '--node-name "": expected a non-empty value' });
  // `--node-name --once`: the value was left out, the next option is not a node name.
  t.equal(parseNodeName('--node-name', 'vm-1'), 'vm-1');
  t.throws(() => parseNodeName('--node-name', '--once'), { code: 'usage', message: /--node-name "--once": expected a node name/ });
  t.throws(() => parseNodeName('--node-name', ''), { code: 'usage' });
  for (const ok of ['kpng-example', 'a', 'A.b_c-9']) t.equal(parseServiceProxyName('--service-proxy-name', ok), ok);
  for (const bad of ['', '-a', 'a-', 'a b', 'x'.repeat(64)]) t.throws(() => parseServiceProxyName('--service-proxy-name', bad), { code: 'usage' }, bad);
});

t.test('HOST:PORT, [v6]:PORT and unix:PATH are parsed once, the text kept as given', async (t) => {
  t.same(parseHostPort('--api', '127.0.0.1:12090'), { text: '127.0.0.1:12090', host: '127.0.0.1', port: 12090 });
  t.same(parseHostPort('--api', 'localhost:1'), { text: 'localhost:1', host: 'localhost', port: 1 });
  t.same(parseHostPort('--api', '[::1]:65535'), { text: '[::1]:65535', host: '::1', port: 65535 });
  t.same(parseHostPort('--api', '[2001:db8::1]:80'), { text: '[2001:db8::1]:80', host: '2001:db8::1', port: 80 });
  t.same(parseHostPort('--api', 'unix:/run/kpng.sock'), { text: 'unix:/run/kpng.sock', unix: '/run/kpng.sock' });
});

t.test('a connect address needs a host and a port in 1-65535', async (t) => {
  t.throws(() => parseHostPort('--api', ':12090'), { code: 'usage', message: '--api :12090: missing host, such as 127.0.0.1' });
  t.throws(() => parseHostPort('--api', '127.0.0.1:0'), { code: 'usage', message: '--api 127.0.0.1:0: port out of range 1-65535' });
  t.throws(() => parseHostPort('--api', 'nohost'), { code: 'usage', message: '--api "nohost": expected HOST:PORT, such as 127.0.0.1:12090 or [::1]:12090' });
  t.throws(() => parseHostPort('--api', 'unix:'), { code: 'usage', message: '--api unix:: expected unix:PATH' });
});

t.test('a listen address: :PORT (every interface, as Go) and port 0 when allowed', async (t) => {
  const listen = { allowPortZero: true, allowEmptyHost: true };
  t.same(parseHostPort('--metrics-addr', ':9100', listen), { text: ':9100', host: '', port: 9100 });
  t.same(parseHostPort('--metrics-addr', ':0', listen), { text: ':0', host: '', port: 0 });
  t.same(parseHostPort('--metrics-addr', '127.0.0.1:0', listen), { text: '127.0.0.1:0', host: '127.0.0.1', port: 0 });
  t.same(parseHostPort('--health-addr', '[::]:19479', listen), { text: '[::]:19479', host: '::', port: 19479 });
  t.throws(() => parseHostPort('--metrics-addr', ':70000', listen), { code: 'usage', message: '--metrics-addr :70000: port out of range 0-65535' });
  t.throws(() => parseHostPort('--metrics-addr', '9100', listen), {
    code: 'usage',
    message: '--metrics-addr "9100": expected HOST:PORT, such as 127.0.0.1:9100, [::1]:9100 or :9100 (every interface)',
  });
  // Each allowance on its own.
  t.throws(() => parseHostPort('--x', ':9100', { allowPortZero: true }), { message: /missing host/ });
  t.equal(parseHostPort('--x', ':9100', { allowEmptyHost: true }).text, ':9100');
  t.throws(() => parseHostPort('--x', ':0', { allowEmptyHost: true }), { message: /port out of range 1-65535/ });
});
