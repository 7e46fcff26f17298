/**
 * `kube`'s source from its options: the kubeconfig from --kubeconfig or
 * $KUBECONFIG (a broken one is a clear error at startup, not a retry loop),
 * the service filter and the node passed on, shown by running the built
 * source against a list/watch server on loopback.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Command } from 'commander';
import t, { type Test } from 'tap';
import { addServiceFilterOptions } from '../../src/commands/common.js';
import { addKubeOptions, kubeSourceFrom, type KubeFlags } from '../../src/commands/kube.js';
import { commonOptions } from '../helpers/cli-io.js';
import { tempDir } from '../helpers/files.js';
import { blogJsonl, blogView } from '../helpers/fixtures.js';
import { KubeApiServer, kubeconfigText } from '../helpers/kube-api-server.js';
import { blogObjects, node, service } from '../helpers/kube-objects.js';
import { recordingSink } from '../helpers/sink.js';
import { within } from '../helpers/wait.js';

const dir = tempDir(t, 'commands-kube-');

/** kube's options (its own and the service filter) as commander parses `args`. */
function flags(args: string[]): KubeFlags {
  const cmd = addKubeOptions(addServiceFilterOptions(new Command('kube').exitOverride(), 'handle'));
  cmd.parse(args, { from: 'user' });
  return cmd.opts<KubeFlags>();
}

/** A server with the blog example's objects and `extra`, closed at teardown. */
async function blogServer(t: Test, ...extra: Parameters<KubeApiServer['add']>[]): Promise<KubeApiServer> {
  const srv = new KubeApiServer();
  for (const [r, o] of [...blogObjects(), ['nodes', node(blogView.nodeName)] as const, ...extra]) srv.add(r, o);
  await srv.listen();
  t.teardown(() => srv.close());
  return srv;
}

/** Builds the source from `args` and `env`, runs it with --once; resolves with the one state's text. */
async function firstState(t: Test, args: string[], env: NodeJS.ProcessEnv = {}): Promise<string> {
  const source = await kubeSourceFrom(flags(args), commonOptions({ nodeName: blogView.nodeName, once: true }), env);
  const sink = recordingSink();
  const ac = new AbortController();
  t.teardown(() => ac.abort());
  await within(source.run(sink, ac.signal), 'the --once source to end after its first state');
  return sink.texts().join('|');
}

t.test('--kubeconfig: the source computes our node\'s view with the service filter given', async (t) => {
  const srv = await blogServer(t, ['services', service('unlabelled')]);
  const text = await firstState(t, ['--kubeconfig', srv.writeKubeconfig(), '--service-proxy-name', blogView.serviceProxyName]);
  t.equal(text, blogJsonl, 'only the Services of our service-proxy-name, from our node');
  t.equal(srv.requests.find((r) => r.path === '/api/v1/nodes' && !r.watch)?.query.fieldSelector, `metadata.name=${blogView.nodeName}`, 'the node from the common options');
});

t.test('$KUBECONFIG when --kubeconfig is not given; --kubeconfig wins over it', async (t) => {
  const srv = await blogServer(t);
  const good = srv.writeKubeconfig();
  t.equal(await firstState(t, ['--service-proxy-name', blogView.serviceProxyName], { KUBECONFIG: good }), blogJsonl, '$KUBECONFIG');
  const other = join(dir, 'unreachable');
  writeFileSync(other, kubeconfigText('http://127.0.0.1:1'));
  t.equal(await firstState(t, ['--kubeconfig', good, '--service-proxy-name', blogView.serviceProxyName], { KUBECONFIG: other }), blogJsonl, '--kubeconfig first');
});

t.test('a kubeconfig that cannot be used is a clear error before anything starts', async (t) => {
  const common = commonOptions();
  const missing = join(dir, 'nope');
  await t.rejects(kubeSourceFrom(flags(['--kubeconfig', missing]), common, {}), { name: 'CalloutError', code: 'usage', message: `--kubeconfig ${missing}: cannot read file (ENOENT)` });

  const broken = join(dir, 'broken');
  writeFileSync(broken, 'clusters: [oops\n');
  await t.rejects(kubeSourceFrom(flags(['--kubeconfig', broken]), common, {}), { code: 'input', message: new RegExp(`^--kubeconfig ${broken}: not a valid kubeconfig`) });

  const incomplete = join(dir, 'incomplete');
  writeFileSync(incomplete, 'apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n');
  await t.rejects(kubeSourceFrom(flags(['--kubeconfig', incomplete]), common, {}), { code: 'input', message: /no current context and no clusters/ });

  await t.rejects(kubeSourceFrom(flags([]), common, { KUBECONFIG: missing }), { code: 'usage', message: `$KUBECONFIG ${missing}: no such file` }, '$KUBECONFIG is named as such');
});

t.test('options: --kubeconfig must not be empty; a bad glob fails before the kubeconfig is read', async (t) => {
  t.throws(() => flags(['--kubeconfig', '']), { code: 'usage', message: '--kubeconfig "": expected a non-empty value' });
  await t.rejects(kubeSourceFrom(flags(['--kubeconfig', join(dir, 'nope'), '--with-service-labels', '[x']), commonOptions(), {}), { code: 'usage', message: /^--with-service-labels "\[x": invalid glob/ });
});
