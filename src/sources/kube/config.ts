/**
 * Where the kube source finds its API configuration (`--kubeconfig`,
 * `$KUBECONFIG`, the in-cluster service account, `~/.kube/config`), and the
 * messages that say what is missing when a configuration names no server.
 * The CLI loads it before the source starts, so a bad configuration is a
 * usage or input error at once, not a retry loop.
 *
 * Hand-written loading, not @kubernetes/client-node's KubeConfig: importing
 * that class (even `dist/config.js` alone) pulls in the library's generated
 * API models and costs ~0.5 s and ~70 MB RSS before any work (measured, Node
 * 20), on every node of a DaemonSet. We parse the YAML with the `yaml`
 * package and reuse the library's light `config_types.js` (~0.01 s) for the
 * clusters/users/contexts entries, so their validation, defaults and messages
 * ("clusters[0].cluster.server is missing") are the library's. What a request
 * needs from the result (TLS, credentials) is auth.ts's.
 */
import { existsSync, readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { delimiter, dirname, isAbsolute, join, resolve } from 'node:path';
import { isIPv6 } from 'node:net';
import { newClusters, newContexts, newUsers, type Cluster, type Context, type User } from '@kubernetes/client-node/dist/config_types.js';
// js-yaml, as the client library reads kubeconfigs (and it loads in a third of the `yaml` library's time).
import { load as loadYaml } from 'js-yaml';
import { CalloutError } from '../../errors.js';

const SA_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/** A kubeconfig user, and the token file its `token-file` names (re-read as it rotates, see auth.ts). */
export type KubeUser = User & { readonly tokenFile?: string | undefined };

/**
 * A loaded configuration: the library's entry types, looked up by name the
 * way kubectl does. Shaped like the library's KubeConfig (same method names),
 * which auth.ts builds from it when it needs the full library.
 */
export class LoadedKubeConfig {
  readonly clusters: Cluster[] = [];
  readonly users: KubeUser[] = [];
  readonly contexts: Context[] = [];
  currentContext: string | undefined;

  getCurrentContext(): string | undefined {
    return this.currentContext;
  }

  getClusters(): Cluster[] {
    return this.clusters;
  }

  getContexts(): Context[] {
    return this.contexts;
  }

  getCluster(name: string): Cluster | undefined {
    return this.clusters.find((c) => c.name === name);
  }

  getUser(name: string): KubeUser | undefined {
    return this.users.find((u) => u.name === name);
  }

  getContextObject(name: string | undefined): Context | undefined {
    return name === undefined ? undefined : this.contexts.find((c) => c.name === name);
  }

  /** The current context's cluster (null when there is none, as the library). */
  getCurrentCluster(): Cluster | null {
    const ctx = this.getContextObject(this.currentContext);
    return (ctx && this.getCluster(ctx.cluster)) ?? null;
  }

  /** The current context's user (null when there is none, as the library). */
  getCurrentUser(): KubeUser | null {
    const ctx = this.getContextObject(this.currentContext);
    return (ctx && this.getUser(ctx.user)) ?? null;
  }
}

/** A loaded kubeconfig and where it came from (for logs). */
export interface KubeConfigChoice {
  kubeConfig: LoadedKubeConfig;
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

type Raw = Record<string, unknown>;
const isMap = (v: unknown): v is Raw => typeof v === 'object' && v !== null && !Array.isArray(v);
/** `file` relative to `dir` (as kubectl and the library resolve certificate paths). */
const under = (dir: string, file: string): string => (isAbsolute(file) ? file : join(dir, file));

/**
 * The entries of one parsed kubeconfig document, with relative paths made
 * absolute against the file's directory (certificates, keys, token files).
 * Throws what the library throws for an invalid entry.
 */
function entries(doc: Raw, dir: string): LoadedKubeConfig {
  const kc = new LoadedKubeConfig();
  const rawUsers = Array.isArray(doc.users) ? doc.users : undefined;
  // The library reads `token-file` at once, relative to the working directory;
  // kubectl resolves it against the kubeconfig's directory. Ours: that
  // directory, unless only the working directory has the file. kubectl's own
  // key is `tokenFile` (clientcmd's AuthInfo); the library knows only `token-file`.
  const tokenFiles = new Map<string, string>();
  const users = rawUsers?.map((u: unknown) => {
    if (!isMap(u) || !isMap(u.user)) return u;
    const given = typeof u.user['token-file'] === 'string' ? u.user['token-file'] : u.user.tokenFile;
    if (typeof given !== 'string') return u;
    const near = resolve(dir, given);
    const file = existsSync(near) || !existsSync(given) ? near : resolve(given);
    if (!u.user.token && typeof u.name === 'string') tokenFiles.set(u.name, file);
    return { ...u, user: { ...u.user, 'token-file': file } };
  });
  for (const c of newClusters(doc.clusters)) {
    if (c.caFile) c.caFile = under(dir, c.caFile);
    kc.clusters.push(c);
  }
  for (const read of newUsers(users)) {
    const tokenFile = tokenFiles.get(read.name);
    // A token file is re-read (it rotates): not the token read at load.
    const { token, ...rest } = read;
    const u: KubeUser = tokenFile !== undefined ? { ...rest, tokenFile } : read;
    if (u.certFile) u.certFile = under(dir, u.certFile);
    if (u.keyFile) u.keyFile = under(dir, u.keyFile);
    kc.users.push(u);
  }
  kc.contexts.push(...newContexts(doc.contexts));
  const current = doc['current-context'];
  kc.currentContext = typeof current === 'string' && current !== '' ? current : undefined;
  return kc;
}

/**
 * Loads one kubeconfig file. Returns undefined for an empty file (no bytes,
 * or only blank lines, comments and `---`), which kubectl reads as an empty
 * configuration.
 */
function loadFile(file: string, what: string): LoadedKubeConfig | undefined {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new CalloutError('usage', `${what} ${file}: cannot read file (${code ?? (err as Error).message})`, { cause: err });
  }
  if (text.split('\n').every((line) => /^(\s*|---\s*|\.\.\.\s*)(#.*)?$/.test(line))) return undefined;
  try {
    const doc: unknown = loadYaml(text);
    if (doc === null || doc === undefined) throw new TypeError('null document');
    // A scalar or a list names nothing: read as an empty configuration, as the library does.
    return entries(isMap(doc) ? doc : {}, dirname(file));
  } catch (err) {
    const why = err instanceof TypeError ? 'the YAML document is empty or null, not a mapping' : (err as Error).message.split('\n')[0];
    throw new CalloutError('input', `${what} ${file}: not a valid kubeconfig (${why}); ${COMPLETE_KUBECONFIG}`, { cause: err });
  }
}

const nameList = (items: Array<{ name: string }>): string => items.map((i) => JSON.stringify(i.name)).join(', ');

/**
 * What keeps `kc` from naming a server, for people: no current context, a
 * current context that is not defined, a context whose cluster is not defined;
 * undefined when it is usable.
 */
function missingInKubeConfig(kc: LoadedKubeConfig, files: string): string | undefined {
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

/** The in-cluster configuration: the service account's token file (re-read as it rotates) and CA. */
function inCluster(env: NodeJS.ProcessEnv, dir: string): LoadedKubeConfig {
  const tokenFile = join(dir, 'token');
  if (!existsSync(tokenFile)) {
    throw new CalloutError('source', `in-cluster configuration: no service account token at ${tokenFile} (is automountServiceAccountToken false?)`);
  }
  const host = env.KUBERNETES_SERVICE_HOST ?? '';
  const port = env.KUBERNETES_SERVICE_PORT || '443';
  const kc = new LoadedKubeConfig();
  kc.clusters.push({ name: 'in-cluster', server: `https://${isIPv6(host) ? `[${host}]` : host}:${port}`, caFile: join(dir, 'ca.crt'), skipTLSVerify: false });
  // The library's FileAuth form (authProvider tokenFile), as its loadFromCluster.
  kc.users.push({ name: 'in-cluster', authProvider: { name: 'tokenFile', config: { tokenFile } } });
  kc.contexts.push({ name: 'loaded-context', cluster: 'in-cluster', user: 'in-cluster' });
  kc.currentContext = 'loaded-context';
  return kc;
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
  let kc = new LoadedKubeConfig();
  let from: string;
  /** The files read, for messages (`kubectl --kubeconfig FILES ...`). */
  let files = '';
  /** Every file read was empty. */
  let empty = false;
  if (lookup.kubeconfig !== undefined) {
    const loaded = loadFile(lookup.kubeconfig, '--kubeconfig');
    empty = loaded === undefined;
    kc = loaded ?? kc;
    from = `--kubeconfig ${lookup.kubeconfig}`;
    files = lookup.kubeconfig;
  } else if (env.KUBECONFIG) {
    const list = env.KUBECONFIG.split(delimiter).filter((f) => f !== '' && existsSync(f));
    if (list.length === 0) throw new CalloutError('usage', `$KUBECONFIG ${env.KUBECONFIG}: no such file`);
    empty = true;
    for (const f of list) {
      const more = loadFile(f, '$KUBECONFIG');
      if (more === undefined) continue;
      empty = false;
      // As kubectl: the first file that names a cluster, user or context wins.
      for (const c of more.clusters) if (!kc.getCluster(c.name)) kc.clusters.push(c);
      for (const u of more.users) if (!kc.getUser(u.name)) kc.users.push(u);
      for (const c of more.contexts) if (!kc.getContextObject(c.name)) kc.contexts.push(c);
      kc.currentContext ??= more.currentContext;
    }
    files = list.join(delimiter);
    from = `$KUBECONFIG ${files}`;
  } else if (env.KUBERNETES_SERVICE_HOST) {
    kc = inCluster(env, lookup.serviceAccountDir ?? SA_DIR);
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
    const loaded = loadFile(file, 'kubeconfig');
    empty = loaded === undefined;
    kc = loaded ?? kc;
    from = file;
    files = file;
  }
  const missing = missingInKubeConfig(kc, files);
  if (missing !== undefined) throw new CalloutError('input', `${from}: ${empty ? `empty file${files.includes(delimiter) ? 's' : ''}: ` : ''}${missing}`);
  return { kubeConfig: kc, from };
}
