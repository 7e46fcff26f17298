/**
 * parseHostPort: what a connect address (--api) and a listen address
 * (--metrics-addr, --health-addr) accept.
 */
import t from 'tap';
import { parseHostPort } from '../src/options.js';

t.test('HOST:PORT, [v6]:PORT and unix:PATH are returned as given', async (t) => {
  for (const v of ['127.0.0.1:12090', 'localhost:1', '[::1]:65535', '[2001:db8::1]:80', 'unix:/run/kpng.sock']) t.equal(parseHostPort('--api', v), v);
});

t.test('a connect address needs a host and a port in 1-65535', async (t) => {
  t.throws(() => parseHostPort('--api', ':12090'), { code: 'usage', message: '--api :12090: missing host, such as 127.0.0.1' });
  t.throws(() => parseHostPort('--api', '127.0.0.1:0'), { code: 'usage', message: '--api 127.0.0.1:0: port out of range 1-65535' });
  t.throws(() => parseHostPort('--api', 'nohost'), { code: 'usage', message: '--api "nohost": expected HOST:PORT, such as 127.0.0.1:12090 or [::1]:12090' });
  t.throws(() => parseHostPort('--api', 'unix:'), { code: 'usage', message: '--api unix:: expected unix:PATH' });
});

t.test('a listen address: :PORT (every interface, as Go) and port 0 when allowed', async (t) => {
  const listen = { allowPortZero: true, allowEmptyHost: true };
  t.equal(parseHostPort('--metrics-addr', ':9100', listen), ':9100');
  t.equal(parseHostPort('--metrics-addr', ':0', listen), ':0');
  t.equal(parseHostPort('--metrics-addr', '127.0.0.1:0', listen), '127.0.0.1:0');
  t.equal(parseHostPort('--health-addr', '[::]:19479', listen), '[::]:19479');
  t.throws(() => parseHostPort('--metrics-addr', ':70000', listen), { code: 'usage', message: '--metrics-addr :70000: port out of range 0-65535' });
  t.throws(() => parseHostPort('--metrics-addr', '9100', listen), {
    code: 'usage',
    message: '--metrics-addr "9100": expected HOST:PORT, such as 127.0.0.1:9100, [::1]:9100 or :9100 (every interface)',
  });
  // Each allowance on its own.
  t.throws(() => parseHostPort('--x', ':9100', { allowPortZero: true }), { message: /missing host/ });
  t.equal(parseHostPort('--x', ':9100', { allowEmptyHost: true }), ':9100');
  t.throws(() => parseHostPort('--x', ':0', { allowEmptyHost: true }), { message: /port out of range 1-65535/ });
});
