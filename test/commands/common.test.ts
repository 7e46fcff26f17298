/**
 * The options every command shares: commander parses them once into typed
 * values (durations in ms, listen addresses, counted -v, collected globs);
 * commonFrom and runnerFrom validate them (conflicting flags, bounds, the
 * callout itself, with a shell's 126/127) into the pipeline's options.
 */
import { hostname } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import t from 'tap';
import { addCommonOptions, addServiceFilterOptions, commonFrom, runnerFrom, serviceFilterFrom, type CommonFlags, type ServiceFilterFlags } from '../../src/commands/common.js';
import { main } from '../../src/cli.js';
import { DEFAULTS } from '../../src/defaults.js';
import type { Tool } from '../../src/pipeline.js';
import { fakeIO } from '../helpers/cli-io.js';
import { blogJsonlPath } from '../helpers/fixtures.js';
import { shScript, tempDir } from '../helpers/files.js';

const dir = tempDir(t, 'commands-common-');

/** The common (and, for kpng-callout, runner) options as commander parses `args`. */
function flags(args: string[], tool: Tool = 'kpng-callout'): CommonFlags {
  const cmd = addCommonOptions(new Command(tool).exitOverride().configureOutput({ writeErr: () => {}, writeOut: () => {} }), tool, '0.0.0-test');
  cmd.parse(args, { from: 'user' });
  return cmd.opts<CommonFlags>();
}

/** The service filter options as commander parses `args`. */
function filterFlags(args: string[]): ServiceFilterFlags {
  const cmd = addServiceFilterOptions(new Command('kube').exitOverride(), 'handle');
  cmd.parse(args, { from: 'user' });
  return cmd.opts<ServiceFilterFlags>();
}

t.test('defaults come from DEFAULTS; values are typed once by their parsers', async (t) => {
  const d = flags([]);
  t.match(d, {
    once: false,
    onceTimeout: DEFAULTS.onceTimeoutMs,
    logFormat: DEFAULTS.logFormat,
    verbose: 0,
    quiet: false,
    debounce: DEFAULTS.debounceMs,
    maxWait: DEFAULTS.maxWaitMs,
    timeout: DEFAULTS.timeoutMs,
    resyncPeriod: DEFAULTS.resyncPeriodMs,
    retryMin: DEFAULTS.retryMinMs,
    retryMax: DEFAULTS.retryMaxMs,
  });
  t.equal(d.callout, undefined, 'no --callout: $CALLOUT or the default decide later');
  t.equal(d.metricsAddr, undefined);

  const f = flags(['-vv', '--debounce', '250ms', '--max-wait', '1m30s', '--metrics-addr', ':9100', '--health-addr', '[::1]:0', '--once', '--once-timeout', '2s', '--log-format', 'json']);
  t.equal(f.verbose, 2, '-vv counts');
  t.equal(f.debounce, 250);
  t.equal(f.maxWait, 90_000);
  t.equal(f.onceTimeout, 2000);
  t.equal(f.logFormat, 'json');
  t.same(f.metricsAddr, { text: ':9100', host: '', port: 9100 }, ':PORT is every interface');
  t.same(f.healthAddr, { text: '[::1]:0', host: '::1', port: 0 }, 'port 0: any free port');
});

t.test('bad values are usage errors naming the option', async (t) => {
  t.throws(() => flags(['--debounce', 'fast']), { code: 'usage', message: /^--debounce "fast": expected a duration/ });
  t.throws(() => flags(['--metrics-addr', '9100']), { code: 'usage', message: /^--metrics-addr "9100": expected HOST:PORT/ });
  t.throws(() => flags(['--node-name', ' ']), { code: 'usage', message: '--node-name "": expected a non-empty value' });
  t.throws(() => flags(['--callout', '']), { code: 'usage', message: '--callout "": expected a non-empty value' });
  t.throws(() => flags(['--log-format', 'yaml']), { code: 'commander.invalidArgument' }, 'commander checks the choices');
});

t.test('kpng-json has no runner options', async (t) => {
  t.throws(() => flags(['--debounce', '1s'], 'kpng-json'), { code: 'commander.unknownOption' });
  t.throws(() => flags(['--callout', '/bin/cat'], 'kpng-json'), { code: 'commander.unknownOption' });
});

t.test('commonFrom: node name, verbosity and a logger on our stderr in the chosen format', async (t) => {
  const { io, stderr } = fakeIO({ env: { NODE_NAME: 'from-env' } });
  const c = commonFrom(flags(['-v', '--log-format', 'json']), io, 'kpng-callout');
  t.match(c, { nodeName: 'from-env', once: false, onceTimeoutMs: 0, verbosity: 1, logFormat: 'json' });
  c.logger.debug('hello', { n: 1 });
  t.match(JSON.parse(stderr.lines()[0]!), { level: 'debug', msg: 'hello', n: 1 });

  t.equal(commonFrom(flags(['--node-name', 'vm-1']), io, 'kpng-json').nodeName, 'vm-1', '--node-name before $NODE_NAME');
  t.equal(commonFrom(flags([]), fakeIO({ env: { NODE_NAME: '' } }).io, 'kpng-json').nodeName, hostname().trim().toLowerCase(), 'else the hostname, lowercased (as the kubelet names its Node)');

  const quiet = fakeIO();
  const q = commonFrom(flags(['-q']), quiet.io, 'kpng-json');
  t.equal(q.verbosity, -1);
  q.logger.info('not shown');
  q.logger.warn('shown');
  t.same(quiet.stderr.lines(), ['kpng-json warn: shown'], '-q: warnings only, with the tool name');
});

t.test('commonFrom rejects conflicting flags', async (t) => {
  const { io } = fakeIO();
  t.throws(() => commonFrom(flags(['-q', '-v']), io, 'kpng-callout'), { code: 'usage', message: '-q (--quiet) and -v (--verbose) exclude each other: pick one' });
  t.throws(() => commonFrom(flags(['--once-timeout', '1s']), io, 'kpng-callout'), { code: 'usage', message: '--once-timeout needs --once' });
  t.doesNotThrow(() => commonFrom(flags(['--once-timeout', '0']), io, 'kpng-callout'), '--once-timeout 0 is the default: fine alone');
  t.throws(() => commonFrom(flags(['--metrics-addr', '127.0.0.1:9100', '--health-addr', '127.0.0.1:9100']), io, 'kpng-callout'), {
    code: 'usage',
    message: /^--health-addr 127\.0\.0\.1:9100: the same address as --metrics-addr/,
  });
  const both = commonFrom(flags(['--metrics-addr', '127.0.0.1:9100', '--health-addr', '127.0.0.1:9101']), io, 'kpng-callout');
  t.match(both, { metricsAddr: { port: 9100 }, healthAddr: { port: 9101 } }, 'two ports are fine');
});

t.test('runnerFrom: the callout from --callout, $CALLOUT or the default; durations in ms', async (t) => {
  const { io } = fakeIO();
  t.same(runnerFrom(flags(['--debounce', '0', '--timeout', '5s', '--retry-min', '2s', '--retry-max', '2s']), io), {
    callout: DEFAULTS.callout,
    debounceMs: 0,
    maxWaitMs: DEFAULTS.maxWaitMs,
    timeoutMs: 5000,
    resyncPeriodMs: DEFAULTS.resyncPeriodMs,
    retryMinMs: 2000,
    retryMaxMs: 2000,
    persistent: false,
  });
  t.equal(runnerFrom(flags(['--persistent']), io).persistent, true, '--persistent');
  const script = shScript(dir, 'ok.sh', 'cat\n');
  t.equal(runnerFrom(flags([]), fakeIO({ env: { PATH: process.env.PATH, CALLOUT: script } }).io).callout, script, '$CALLOUT');
  t.equal(runnerFrom(flags(['--callout', '/bin/cat']), fakeIO({ env: { PATH: process.env.PATH, CALLOUT: script } }).io).callout, '/bin/cat', '--callout before $CALLOUT');
  t.equal(runnerFrom(flags(['--callout', 'cat']), io).callout, 'cat', 'a name in $PATH is kept as given');
});

t.test('runnerFrom: timeout and retry bounds', async (t) => {
  const { io } = fakeIO();
  t.throws(() => runnerFrom(flags(['--timeout', '0']), io), { code: 'usage', message: '--timeout 0: expected a duration above 0' });
  t.throws(() => runnerFrom(flags(['--retry-min', '0']), io), { code: 'usage', message: '--retry-min 0: expected a duration above 0' });
  t.throws(() => runnerFrom(flags(['--retry-min', '5s', '--retry-max', '1s']), io), { code: 'usage', message: '--retry-max 1s: expected at least --retry-min (5s)' });
});

t.test('runnerFrom: a callout that cannot run fails now, with the status a shell would give', async (t) => {
  const { io } = fakeIO();
  const cases: Array<[string, string, 126 | 127, RegExp]> = [
    ['missing file', join(dir, 'nope'), 127, /not found/],
    ['not in $PATH', 'no-such-callout-here', 127, /not found in \$PATH/],
    ['a directory', dir, 126, /is a directory/],
    ['not executable', shScript(dir, 'noexec.sh', 'cat\n', 0o644), 126, /not executable/],
  ];
  for (const [name, callout, exitCode, re] of cases) {
    t.throws(() => runnerFrom(flags(['--callout', callout]), io), { name: 'CalloutError', code: 'callout', exitCode, message: re }, name);
  }
  t.throws(() => runnerFrom(flags([]), fakeIO({ env: { CALLOUT: 'jq -c .' } }).io), { code: 'callout', exitCode: 127, message: /wrapper script/ }, 'arguments in $CALLOUT');
});

t.test('service filter: globs collected over repeats and commas, compiled once; a bad one is a usage error', async (t) => {
  const o = filterFlags(['--service-proxy-name', 'kpng-example', '--with-service-labels', 'app,tier', '--with-service-labels', 'x/{a,b}']);
  t.same(o.withServiceLabels, ['app', 'tier', 'x/{a,b}']);
  t.same(o.withServiceAnnotations, []);
  const f = serviceFilterFrom(o);
  t.equal(f.serviceProxyName, 'kpng-example');
  t.equal(f.annotations, undefined, 'none asked: none sent');
  t.ok(f.labels?.matches('tier'));
  t.ok(f.labels?.matches('x/b'));
  t.notOk(f.labels?.matches('x/c'));
  t.throws(() => serviceFilterFrom(filterFlags(['--with-service-annotations', '[abc'])), { code: 'usage', message: '--with-service-annotations "[abc": invalid glob "[abc": unclosed [' });
  t.throws(() => filterFlags(['--service-proxy-name', '-bad']), { code: 'usage', message: /^--service-proxy-name "-bad": expected a label value/ });
});

t.test('--metrics-addr and --health-addr with port 0 each get a free port: not the same address', async (t) => {
  const f = fakeIO({ tool: 'kpng-json', args: ['replay', '--metrics-addr', '127.0.0.1:0', '--health-addr', '127.0.0.1:0', blogJsonlPath] });
  await main('kpng-json', f.io);
  t.equal(await f.proc.exited, 0);
});
