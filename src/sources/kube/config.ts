/**
 * Where the kube source finds its API configuration (`--kubeconfig`,
 * `$KUBECONFIG`, the in-cluster service account, `~/.kube/config`), and the
 * messages that say what is missing when a configuration names no server.
 * The CLI loads it before the source starts, so a bad configuration is a
 * usage or input error at once, not a retry loop.
 */
import { existsSync, readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { delimiter, join } from 'node:path';
import { isIPv6 } from 'node:net';
import { KubeConfig } from '@kubernetes/client-node';
import { CalloutError } from '../../errors.js';

const SA_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/** A loaded kubeconfig and where it came from (for logs). */
export interface KubeConfigChoice {
  kubeConfig: KubeConfig;
  /** `--kubeconfig /path`, `$KUBECONFIG /path`, `in-cluster service account`, `~/.kube/config`. */
  from: string;
}

/** Where to look for a configuration. */
export interface KubeConfigLookup {
  /** `--kubeconfig PATH`, first choice. */
  kubeconfig?: string | undefined;
  /** Environment: KUBECONFIG, KUBERNETES_SERVICE_HOST/PORT, HOME. */
  env: NodeJS.ProcessEnv;
  /** Service account files directory (tests). Default the in-cluster mount. */
  serviceAccountDir?: string | undefined;
}

const COMPLETE_KUBECONFIG =
  'pass a complete kubeconfig: a cluster (server), a user, and a context naming both, selected by current-context (`kubectl config view --minify --flatten` prints one)';

/**
 * Loads one kubeconfig file into `kc`. Returns false for an empty file (no
 * bytes, or only blank lines, comments and `---`), which kubectl reads as an
 * empty configuration; `kc` is then left alone.
 */
function loadFile(kc: KubeConfig, file: string, what: string): boolean {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new CalloutError('usage', `${what} ${file}: cannot read file (${code ?? (err as Error).message})`, { cause: err });
  }
  if (text.split('\n').every((line) => /^(\s*|---\s*|\.\.\.\s*)(#.*)?$/.test(line))) return false;
  try {
    // loadFromFile, not loadFromString: it resolves relative certificate paths against the file's directory.
    kc.loadFromFile(file);
  } catch (err) {
    // The library reads `.clusters` of whatever the YAML is: a null document (`---`, `~`) gives a TypeError.
    const why = err instanceof TypeError ? 'the YAML document is empty or null, not a mapping' : (err as Error).message.split('\n')[0];
    throw new CalloutError('input', `${what} ${file}: not a valid kubeconfig (${why}); ${COMPLETE_KUBECONFIG}`, { cause: err });
  }
  return true;
}

const nameList = (items: Array<{ name: string }>): string => items.map((i) => JSON.stringify(i.name)).join(', ');

/**
 * What keeps `kc` from naming a server, for people: no current context, a
 * current context that is not defined, a context whose cluster is not defined;
 * undefined when it is usable.
 */
function missingInKubeConfig(kc: KubeConfig, files: string): string | undefined {
  const current = kc.getCurrentContext();
  const contexts = kc.getContexts();
  const clusters = kc.getClusters();
  if (!current) {
    if (contexts.length === 0 && clusters.length === 0) return `no current context and no clusters; ${COMPLETE_KUBECONFIG}`;
    if (contexts.length === 0) return `no current context and no contexts (clusters: ${nameList(clusters)}); add a context naming a cluster and a user, and set current-context`;
    const use = `kubectl --kubeconfig ${files} config use-context ${contexts[0]!.name}`;
    return `no current context (contexts: ${nameList(contexts)}); set current-context, e.g. \`${use}\``;
  }
  const ctx = kc.getContextObject(current);
  if (!ctx) return `current context ${JSON.stringify(current)} is not defined (contexts: ${nameList(contexts) || 'none'}); set current-context to a defined context, or ${COMPLETE_KUBECONFIG}`;
  if (!kc.getCluster(ctx.cluster)) {
    return `context ${JSON.stringify(current)} names cluster ${JSON.stringify(ctx.cluster)}, which is not defined (clusters: ${nameList(clusters) || 'none'}); ${COMPLETE_KUBECONFIG}`;
  }
  return undefined;
}

/**
 * Loads the API configuration: `--kubeconfig`, else `$KUBECONFIG` (a list
 * like kubectl's; missing and empty files are skipped), else the in-cluster
 * service account when KUBERNETES_SERVICE_HOST is set, else ~/.kube/config.
 * Throws a CalloutError naming what was tried when none applies, and the file
 * and what is missing when the configuration names no server (code `input`,
 * as for a file that does not parse; `usage` for a file that cannot be read).
 */
export function loadKubeConfig(lookup: KubeConfigLookup): KubeConfigChoice {
  const { env } = lookup;
  const kc = new KubeConfig();
  let from: string;
  /** The files read, for messages (`kubectl --kubeconfig FILES ...`). */
  let files = '';
  /** Every file read was empty. */
  let empty = false;
  if (lookup.kubeconfig !== undefined) {
    empty = !loadFile(kc, lookup.kubeconfig, '--kubeconfig');
    from = `--kubeconfig ${lookup.kubeconfig}`;
    files = lookup.kubeconfig;
  } else if (env.KUBECONFIG) {
    const list = env.KUBECONFIG.split(delimiter).filter((f) => f !== '' && existsSync(f));
    if (list.length === 0) throw new CalloutError('usage', `$KUBECONFIG ${env.KUBECONFIG}: no such file`);
    empty = true;
    for (const f of list) {
      const more = new KubeConfig();
      if (!loadFile(more, f, '$KUBECONFIG')) continue;
      empty = false;
      // As kubectl: the first file that names a cluster, user or context wins
      // (the library's mergeConfig throws on a duplicate name instead).
      for (const c of more.getClusters()) if (!kc.getCluster(c.name)) kc.addCluster(c);
      for (const u of more.getUsers()) if (!kc.getUser(u.name)) kc.addUser(u);
      for (const c of more.getContexts()) if (!kc.getContextObject(c.name)) kc.addContext(c);
      if (!kc.getCurrentContext()) kc.setCurrentContext(more.getCurrentContext());
    }
    files = list.join(delimiter);
    from = `$KUBECONFIG ${files}`;
  } else if (env.KUBERNETES_SERVICE_HOST) {
    const dir = lookup.serviceAccountDir ?? SA_DIR;
    const tokenFile = join(dir, 'token');
    if (!existsSync(tokenFile)) {
      throw new CalloutError('source', `in-cluster configuration: no service account token at ${tokenFile} (is automountServiceAccountToken false?)`);
    }
    const host = env.KUBERNETES_SERVICE_HOST;
    const port = env.KUBERNETES_SERVICE_PORT || '443';
    kc.loadFromClusterAndUser(
      { name: 'in-cluster', server: `https://${isIPv6(host) ? `[${host}]` : host}:${port}`, caFile: join(dir, 'ca.crt'), skipTLSVerify: false },
      { name: 'in-cluster', authProvider: { name: 'tokenFile', config: { tokenFile } } },
    );
    from = 'in-cluster service account';
  } else {
    const home = env.HOME || homedir();
    const file = join(home, '.kube', 'config');
    if (!existsSync(file)) {
      throw new CalloutError(
        'source',
        `no Kubernetes API configuration: no --kubeconfig, $KUBECONFIG unset, not in a cluster (KUBERNETES_SERVICE_HOST unset) and no ${file}`,
      );
    }
    empty = !loadFile(kc, file, 'kubeconfig');
    from = file;
    files = file;
  }
  const missing = missingInKubeConfig(kc, files);
  if (missing !== undefined) throw new CalloutError('input', `${from}: ${empty ? `empty file${files.includes(delimiter) ? 's' : ''}: ` : ''}${missing}`);
  return { kubeConfig: kc, from };
}
