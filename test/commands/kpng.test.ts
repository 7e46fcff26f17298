/**
 * The default command's source: the kpng options parsed into typed values,
 * the TLS flags checked as a pair and their files read and checked at startup
 * (a missing file, or one without what its flag needs, is a usage error naming
 * the flag and the file), and the source built from them
 * talking to a real localv1 server on loopback, plain and with mutual TLS.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Command } from 'commander';
import t, { type Test } from 'tap';
import { addKpngOptions, kpngSourceFrom, type KpngFlags } from '../../src/commands/kpng.js';
import { DEFAULTS } from '../../src/defaults.js';
import type { Service } from '../../src/model.js';
import { stateFromItems, stateText } from '../../src/state.js';
import { makeCerts, opensslMissing } from '../helpers/certs.js';
import { commonOptions } from '../helpers/cli-io.js';
import { tempDir } from '../helpers/files.js';
import { KpngTestServer, serve, type ServerTls } from '../helpers/kpng-server.js';
import { recordingSink } from '../helpers/sink.js';
import { within } from '../helpers/wait.js';

const dir = tempDir(t, 'commands-kpng-');

/** The kpng options as commander parses `args`. */
function flags(args: string[]): KpngFlags {
  const cmd = addKpngOptions(new Command('kpng-json').exitOverride());
  cmd.parse(args, { from: 'user' });
  return cmd.opts<KpngFlags>();
}

const web: Service = { Namespace: 'default', Name: 'web', Type: 'ClusterIP', IPs: { ClusterIPs: { V4: ['10.96.0.10'] } } };
const webText = stateText(stateFromItems([{ Service: web, Endpoints: [] }]));

/** Runs `kpngSourceFrom(o)` with --once against `server`; resolves with the text of the one state. */
async function firstState(t: Test, o: KpngFlags, server: KpngTestServer): Promise<string> {
  const source = await kpngSourceFrom(o, commonOptions({ nodeName: 'vm-7', once: true }));
  const sink = recordingSink();
  const ac = new AbortController();
  t.teardown(() => ac.abort());
  await within(source.run(sink, ac.signal), 'the --once source to end after its first state');
  t.equal(server.requests[0]?.NodeName, 'vm-7', 'the WatchReq names our node');
  return sink.texts().join('|');
}

t.test('options: defaults from DEFAULTS, values typed by their parsers', async (t) => {
  const d = flags([]);
  t.same(d.api, { text: DEFAULTS.api, host: '127.0.0.1', port: 12090 });
  t.equal(d.errorDelay, DEFAULTS.errorDelayMs);
  t.equal(d.maxMsgSize, DEFAULTS.maxMsgSize);
  t.same(flags(['--api', 'unix:/run/kpng.sock']).api, { text: 'unix:/run/kpng.sock', unix: '/run/kpng.sock' });
  t.equal(flags(['--max-msg-size', '512KiB']).maxMsgSize, 524288);
  t.equal(flags(['--error-delay', '250ms']).errorDelay, 250);
  t.throws(() => flags(['--api', ':12090']), { code: 'usage', message: '--api :12090: missing host, such as 127.0.0.1' });
  t.throws(() => flags(['--max-msg-size', 'big']), { code: 'usage', message: /^--max-msg-size "big": expected a size/ });
});

t.test('--error-delay 0 is refused: it would reconnect in a busy loop', async (t) => {
  await t.rejects(() => kpngSourceFrom(flags(['--error-delay', '0']), commonOptions()), { code: 'usage', message: '--error-delay 0: expected a duration above 0' });
});

t.test('--tls-crt and --tls-key go together', async (t) => {
  const common = commonOptions();
  await t.rejects(() => kpngSourceFrom(flags(['--tls-crt', '/c.pem']), common), { code: 'usage', message: '--tls-crt /c.pem: mutual TLS needs --tls-key too' });
  await t.rejects(() => kpngSourceFrom(flags(['--tls-key', '/k.pem']), common), { code: 'usage', message: '--tls-key /k.pem: mutual TLS needs --tls-crt too' });
  await t.rejects(() => kpngSourceFrom(flags(['--tls-ca', '/ca.pem', '--tls-key', '/k.pem']), common), { code: 'usage', message: /mutual TLS needs --tls-crt too/ }, 'a CA does not stand in for the certificate');
});

t.test('a TLS file that cannot be read is a usage error at startup, naming the flag', async (t) => {
  const common = commonOptions();
  const pem = join(dir, 'some.pem');
  writeFileSync(pem, 'not checked yet');
  const cases: Array<[string[], string]> = [
    [['--tls-ca', join(dir, 'nope.pem')], `--tls-ca ${join(dir, 'nope.pem')}: cannot read file (ENOENT)`],
    [['--tls-ca', dir], `--tls-ca ${dir}: cannot read file (EISDIR)`],
    [['--tls-crt', join(dir, 'nope.crt'), '--tls-key', pem], `--tls-crt ${join(dir, 'nope.crt')}: cannot read file (ENOENT)`],
    [['--tls-crt', pem, '--tls-key', join(dir, 'nope.key')], `--tls-key ${join(dir, 'nope.key')}: cannot read file (ENOENT)`],
  ];
  for (const [args, message] of cases) await t.rejects(() => kpngSourceFrom(flags(args), common), { name: 'CalloutError', code: 'usage', message }, args.join(' '));
  // What is in them is judged at startup too, naming the flag and the file.
  await t.rejects(() => kpngSourceFrom(flags(['--tls-ca', pem]), common), { code: 'usage', message: `--tls-ca ${pem}: no PEM certificate found` });
});

t.test('TLS files that do not hold what their flag needs are usage errors naming the flag and the file', { skip: opensslMissing() ?? false }, async (t) => {
  const certs = makeCerts(t);
  const common = commonOptions();
  const file = (name: string, data: Buffer | string): string => {
    const p = join(dir, name);
    writeFileSync(p, data);
    return p;
  };
  const crt = file('bad-client.crt', certs.clientCert);
  const key = file('bad-client.key', certs.clientKey);
  const text = file('hostname.txt', 'vm-7\n');
  const other = file('bad-server.key', certs.serverKey);
  const cases: Array<[string[], string]> = [
    [['--tls-crt', crt, '--tls-key', text], `--tls-key ${text}: not a PEM private key`],
    [['--tls-crt', key, '--tls-key', key], `--tls-crt ${key}: no PEM certificate found`],
    [['--tls-crt', crt, '--tls-key', other], `--tls-key ${other}: not the key of the certificate in --tls-crt ${crt}`],
    [['--tls-ca', key], `--tls-ca ${key}: no PEM certificate found`],
  ];
  for (const [args, message] of cases) await t.rejects(() => kpngSourceFrom(flags(args), common), { name: 'CalloutError', code: 'usage', message: new RegExp(`^${message.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}`) }, args.join(' '));
  await t.resolves(() => kpngSourceFrom(flags(['--tls-ca', file('bad-ca.crt', certs.ca), '--tls-crt', crt, '--tls-key', key]), common), 'matching files pass');
});

t.test('the source built from the options watches our node on --api, plain', async (t) => {
  const server = await serve(t, [[{ op: 'set', set: 'services', path: 'default/web', value: web }]]);
  t.equal(await firstState(t, flags(['--api', server.address, '--error-delay', '50ms']), server), webText);
});

const noOpenssl = opensslMissing();
if (noOpenssl) t.comment(`skipping the TLS test: ${noOpenssl}`);

t.test('--tls-ca, --tls-crt and --tls-key: mutual TLS with the files read at startup', { skip: noOpenssl ?? false }, async (t) => {
  const certs = makeCerts(t);
  const file = (name: string, data: Buffer): string => {
    const p = join(dir, name);
    writeFileSync(p, data);
    return p;
  };
  const tls: ServerTls = { key: certs.serverKey, cert: certs.serverCert, ca: certs.ca, requireClientCert: true };
  const server = await serve(t, [[{ op: 'set', set: 'services', path: 'default/web', value: web }]], tls);
  const o = flags(['--api', server.address, '--tls-ca', file('ca.crt', certs.ca), '--tls-crt', file('client.crt', certs.clientCert), '--tls-key', file('client.key', certs.clientKey)]);
  t.equal(await firstState(t, o, server), webText);
});
