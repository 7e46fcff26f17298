/**
 * The Kubernetes API source: watches Services (selected by the
 * service-proxy-name label, as kpng and kube-proxy do), discovery.k8s.io/v1
 * EndpointSlices and this node's Node object through @kubernetes/client-node
 * informers, and publishes the node-local state kpng's server would have sent
 * to this node (see shared/kpng-localv1.md; conversion in convert/kubernetes).
 *
 * Behaviour that matters to callers:
 * - nothing is pushed before every informer's initial list completed, so the
 *   first state is never partial;
 * - a failed list or watch stops an informer (the library does not retry): it
 *   is restarted with exponential backoff and resumes from its last
 *   resourceVersion; the objects already known stay, so a failure never turns
 *   into an empty state;
 * - 410 Gone makes the library re-list; the re-list's callbacks all fire in one
 *   tick, and the state is rebuilt a tick later (setImmediate), so it is never
 *   seen half-applied;
 * - a state is pushed only when it differs from the last one pushed (kpng's
 *   server sent a Sync only for a non-empty diff);
 * - informers that fail together (the API server is down) give one log line
 *   per attempt and are restarted together; the same failure is logged at
 *   most once a minute (createRepeatFilter), at debug level in between.
 */
export { parseServiceProxyName } from '../options.js';
import { existsSync, readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { delimiter, join } from 'node:path';
import { isIPv6 } from 'node:net';
import {
  CoreV1Api,
  DiscoveryV1Api,
  KubeConfig,
  ListWatch,
  Watch,
  type KubernetesListObject,
  type KubernetesObject,
  type V1EndpointSlice,
  type V1Node,
  type V1Service,
} from '@kubernetes/client-node';
import {
  ConversionError,
  LABEL_HEADLESS,
  LABEL_SERVICE_PROXY_NAME,
  LABEL_ZONE,
  convertEndpoints,
  convertService,
  isServiceSelected,
  sliceServiceName,
  type KubeEndpointSlice,
} from '../convert/kubernetes.js';
import type { GlobFilter } from '../convert/glob.js';
import { CalloutError } from '../errors.js';
import { createRepeatFilter, silentLogger, type Logger } from '../log.js';
import type { Endpoint } from '../model.js';
import type { Source, SourceStatus, StateSink } from '../source.js';
import { sameState, Store, type State } from '../state.js';

const SA_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/**
 * The Services label selector kpng used: `service-proxy-name=NAME` with a
 * name, else "the label does not exist" (what kube-proxy handles), and in both
 * cases `!service.kubernetes.io/headless`.
 */
export function serviceLabelSelector(serviceProxyName?: string): string {
  const proxy = serviceProxyName ? `${LABEL_SERVICE_PROXY_NAME}=${serviceProxyName}` : `!${LABEL_SERVICE_PROXY_NAME}`;
  return `${proxy},!${LABEL_HEADLESS}`;
}

/** A loaded kubeconfig and where it came from (for logs). */
export interface KubeConfigChoice {
  kubeConfig: KubeConfig;
  /** `--kubeconfig /path`, `$KUBECONFIG /path`, `in-cluster service account`, `~/.kube/config`. */
  from: string;
}

/** Where to look for a configuration. */
export interface KubeConfigLookup {
  /** `--kubeconfig PATH`, first choice. */
  kubeconfig?: string;
  /** Environment: KUBECONFIG, KUBERNETES_SERVICE_HOST/PORT, HOME. */
  env: NodeJS.ProcessEnv;
  /** Service account files directory (tests). Default the in-cluster mount. */
  serviceAccountDir?: string;
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

/** Options of {@link createKubeSource}. The CLI validates them. */
export interface KubeSourceOptions {
  kubeConfig: KubeConfig;
  /** Where the configuration came from, for the start-up log line. */
  configFrom?: string;
  /** The node whose view is computed (Local, traffic policies, zone). */
  nodeName: string;
  /** Handle Services labelled service-proxy-name=NAME; unset: Services without the label. */
  serviceProxyName?: string;
  /** Service labels to send (`--with-service-labels`); none when unset, as kpng. */
  labels?: GlobFilter;
  /** Service annotations to send (`--with-service-annotations`); none when unset. */
  annotations?: GlobFilter;
  /** Resolve `run` after the first complete state has been pushed. */
  once?: boolean;
  logger?: Logger;
  /** Restart delays of a failed informer (ms): doubles from `minMs` up to `maxMs`. Default 500 ms .. 30 s. */
  backoff?: { minMs: number; maxMs: number };
  /**
   * Server-side watch timeout asked for (s); the server ends the watch cleanly
   * and the informer resumes from its resourceVersion. A watch silent for
   * longer than this plus a minute (or twice this, when shorter) is taken as
   * dead and restarted.
   * Default: random in 5..10 min, as client-go does.
   */
  watchTimeoutSeconds?: number;
  /** Millisecond clock of the once-a-minute rule for repeated failures (tests). Default Date.now. */
  now?: () => number;
}

/** How long a failure out of the blue waits for companions before its line (ms). */
const GATHER_MS = 100;
/** Longest wait for the outcome of every informer restarted together (ms). */
const ATTEMPT_MAX_MS = 2000;

/** One watched resource: its informer and its health. */
interface Watched {
  /** Plural resource name, for RBAC messages. */
  resource: 'services' | 'endpointslices' | 'nodes';
  /** API group ('' = core). */
  group: string;
  informer: ListWatch<KubernetesObject>;
  /** Initial list completed (stays true: the cache keeps serving after errors). */
  synced: boolean;
  /** Last list/watch succeeded and nothing failed since. */
  healthy: boolean;
  /** Consecutive failures, for the backoff. */
  failures: number;
  idleTimer?: NodeJS.Timeout;
  /** Set when we abort a silent watch ourselves, to log why. */
  stalled: boolean;
}

const pathOf = (o: KubernetesObject): string => `${o.metadata?.namespace ?? ''}/${o.metadata?.name ?? ''}`;

/** `services`, `endpointslices.discovery.k8s.io`: what RBAC rules and `kubectl auth can-i` name. */
const qualified = (w: { resource: string; group: string }): string => (w.group ? `${w.resource}.${w.group}` : w.resource);

const NETWORK_CODES: Record<string, string> = {
  ECONNREFUSED: 'connection refused',
  ENOTFOUND: 'host not found',
  EAI_AGAIN: 'name resolution failed',
  ETIMEDOUT: 'connection timed out',
  EHOSTUNREACH: 'host unreachable',
  ENETUNREACH: 'network unreachable',
  ECONNRESET: 'connection reset',
  EPIPE: 'connection closed',
};

/**
 * One failed list or watch, described so that the failures of one attempt
 * share a line: "cannot reach the API server S: connection refused
 * (ECONNREFUSED; list services, list nodes)" rather than one line each.
 */
interface Failure {
  /** `list services`, `watch endpointslices.discovery.k8s.io`. */
  op: string;
  /** What went wrong, without the operation. */
  reason: string;
  /** The errno of an unreachable server (the line then starts "cannot reach the Kubernetes API server"). */
  unreachable?: string;
  /** A watch cut or gone silent (API server restarts, load balancers): a warning, not an error. */
  routine: boolean;
}

/**
 * What went wrong with a list or watch: unreachable server, 401, 403 (naming
 * the verb and resource RBAC must grant), or what the server said.
 */
function describeKubeError(err: unknown, verb: 'list' | 'watch', w: { resource: string; group: string }, server: string): Failure {
  const e = err as { code?: unknown; statusCode?: unknown; body?: unknown; message?: string; cause?: { code?: unknown } } | undefined;
  const status = typeof e?.code === 'number' ? e.code : typeof e?.statusCode === 'number' ? e.statusCode : undefined;
  const res = qualified(w);
  const op = `${verb} ${res}`;
  if (status !== undefined) {
    let serverSays = '';
    if (typeof e?.body === 'string') {
      try {
        const m = (JSON.parse(e.body) as { message?: unknown }).message;
        if (typeof m === 'string' && m) serverSays = ` (server: ${m})`;
      } catch {
        // not a Status object
      }
    }
    if (status === 401) {
      return { op, routine: false, reason: `401 Unauthorized: the API server ${server} rejected the credentials (check the kubeconfig user, or the service account token)${serverSays}` };
    }
    if (status === 403) {
      return {
        op,
        routine: false,
        reason:
          `403 Forbidden: RBAC does not allow verb "${verb}" on resource "${w.resource}" in API group "${w.group}"` +
          ` (the ClusterRole needs get, list and watch on ${res}; see manifests/rbac.yaml)${serverSays}`,
      };
    }
    return { op, routine: false, reason: `HTTP ${status}${serverSays || (e?.message && !e.message.startsWith('HTTP-Code') ? ` (${e.message})` : '')}` };
  }
  const code = typeof e?.code === 'string' ? e.code : typeof e?.cause?.code === 'string' ? e.cause.code : undefined;
  if (code && NETWORK_CODES[code]) return { op, routine: false, reason: NETWORK_CODES[code], unreachable: code };
  if (code === 'ERR_STREAM_PREMATURE_CLOSE') return { op, routine: true, reason: `connection to ${server} lost` };
  return { op, routine: false, reason: e?.message?.split('\n')[0] ?? String(err) };
}

/** One line for the failures of one attempt, those with the same reason together (in `fs` order). */
function failureLine(fs: Failure[], server: string): string {
  const groups = new Map<string, { f: Failure; ops: string[] }>();
  for (const f of fs) {
    const key = `${f.unreachable ?? ''}\n${f.reason}`;
    const g = groups.get(key);
    if (g) g.ops.push(f.op);
    else groups.set(key, { f, ops: [f.op] });
  }
  return [...groups.values()]
    .map(({ f, ops }) =>
      f.unreachable !== undefined ? `cannot reach the Kubernetes API server ${server}: ${f.reason} (${f.unreachable}; ${ops.join(', ')})` : `${ops.join(', ')}: ${f.reason}`,
    )
    .join('; ');
}

/** Marks errors of the list call, to name the verb in messages. */
class ListError extends Error {
  constructor(readonly inner: unknown) {
    super('list failed', { cause: inner });
  }
}

/**
 * The library's Watch, plus: bookmarks and a server-side timeout asked for,
 * an idle watchdog, and a hook when a watch request is established.
 */
class SourceWatch extends Watch {
  constructor(
    kc: KubeConfig,
    private readonly hooks: {
      /** The source stopped: start no watch, end one that was being opened. */
      stopped: () => boolean;
      timeoutSeconds: () => number;
      opened: (controller: AbortController, timeoutSeconds: number) => void;
      event: (type: string, obj: unknown) => void;
      ended: (err: unknown) => void;
    },
  ) {
    super(kc);
  }

  override async watch(
    path: string,
    queryParams: Record<string, string | number | boolean | undefined>,
    callback: (phase: string, apiObj: any, watchObj?: any) => void,
    done: (err: any) => void,
  ): Promise<AbortController> {
    // The informer goes on to watch after a list even when stopped meanwhile.
    if (this.hooks.stopped()) return new AbortController();
    let finished = false;
    const end = (err: unknown): void => {
      if (finished) return;
      finished = true;
      this.hooks.ended(err);
      done(err);
    };
    const timeoutSeconds = this.hooks.timeoutSeconds();
    const params = { ...queryParams, allowWatchBookmarks: true, timeoutSeconds };
    let controller: AbortController;
    try {
      controller = await super.watch(
        path,
        params,
        (phase, obj, raw) => {
          this.hooks.event(phase, obj);
          callback(phase, obj, raw);
        },
        end,
      );
    } catch (err) {
      // e.g. an unreadable token file: report it as a failed watch, never as
      // an unhandled rejection (the informer calls us from a callback).
      end(err);
      return new AbortController();
    }
    if (this.hooks.stopped()) controller.abort();
    else if (!finished) this.hooks.opened(controller, timeoutSeconds);
    return controller;
  }
}

/** Builds the Kubernetes API source. */
export function createKubeSource(options: KubeSourceOptions): Source {
  return { run: (sink, signal) => runKube(options, sink, signal) };
}

function runKube(options: KubeSourceOptions, sink: StateSink, signal: AbortSignal): Promise<void> {
  const log = options.logger ?? silentLogger;
  const kc = options.kubeConfig;
  const server = kc.getCurrentCluster()?.server ?? '(no server)';
  const { nodeName, serviceProxyName } = options;
  const backoff = options.backoff ?? { minMs: 500, maxMs: 30_000 };
  const core = kc.makeApiClient(CoreV1Api);
  const discovery = kc.makeApiClient(DiscoveryV1Api);
  const selector = serviceLabelSelector(serviceProxyName);
  const serviceOptions = { labels: options.labels, annotations: options.annotations };

  // What the informers told us, indexed for the conversion.
  const services = new Map<string, V1Service>();
  const slicesByService = new Map<string, Map<string, V1EndpointSlice>>();
  const sliceOwner = new Map<string, string>();
  let nodeZone: string | undefined;

  const store = new Store();
  /** Endpoint keys set in the store, per Service path. */
  const published = new Map<string, Set<string>>();
  const dirty = new Set<string>();
  let allDirty = false;
  let flushQueued = false;
  let lastPushed: State | undefined;
  let stopped = false;
  let reconnects = 0;
  let lastError: string | undefined;
  let lastStatus = '';
  // The same failure at most once a minute at its level (debug in between).
  const repeats = createRepeatFilter(options.now ? { now: options.now } : {});
  let announcedSync = false;

  return new Promise<void>((resolve) => {
    const watched: Watched[] = [];

    const allSynced = (): boolean => watched.every((w) => w.synced);

    const report = (): void => {
      const healthy = watched.every((w) => w.healthy);
      const s: SourceStatus = { connected: healthy, synced: allSynced(), reconnects, ...(!healthy && lastError ? { error: lastError } : {}) };
      const key = JSON.stringify(s);
      if (key !== lastStatus) {
        lastStatus = key;
        sink.status?.(s);
      }
    };

    const stop = (): void => {
      if (stopped) return;
      stopped = true;
      signal.removeEventListener('abort', stop);
      clearTimeout(restartTimer);
      clearTimeout(gatherTimer);
      for (const w of watched) {
        clearTimeout(w.idleTimer);
        void w.informer.stop();
      }
      resolve();
    };

    const queueFlush = (): void => {
      if (flushQueued || stopped) return;
      flushQueued = true;
      // After the current tick: a re-list fires all its callbacks in one tick.
      setImmediate(flush);
    };

    const markDirty = (path: string): void => {
      dirty.add(path);
      queueFlush();
    };

    /** Recomputes one Service and its endpoints in the store. */
    const rebuild = (path: string): void => {
      const svc = services.get(path);
      const had = published.get(path);
      if (!svc) {
        store.deleteService(path);
        if (had) for (const k of had) store.deleteEndpoint(`${path}/${k}`);
        published.delete(path);
        return;
      }
      let model;
      try {
        model = convertService(svc, serviceOptions);
      } catch (err) {
        // A malformed object must not stop the others; keep what we had.
        log.error(`service ${path}: cannot convert: ${(err as Error).message}`);
        return;
      }
      let slices: KubeEndpointSlice[] = [...(slicesByService.get(path)?.values() ?? [])];
      let eps: Array<[string, Endpoint]>;
      for (;;) {
        try {
          eps = convertEndpoints(svc, slices, { nodeName, nodeZone });
          break;
        } catch (err) {
          if (!(err instanceof ConversionError) || err.index === undefined) {
            log.error(`service ${path}: cannot compute endpoints: ${(err as Error).message}`);
            return;
          }
          // Leave the malformed slice out, keep the others.
          const bad = slices[err.index];
          log.error(`endpointslice ${bad ? pathOf(bad as KubernetesObject) : '?'}: cannot convert: ${err.message}`);
          slices = slices.filter((_, i) => i !== err.index);
        }
      }
      store.setService(path, model);
      const keys = new Set<string>();
      for (const [k, ep] of eps) {
        store.setEndpoint(`${path}/${k}`, ep);
        keys.add(k);
      }
      if (had) for (const k of had) if (!keys.has(k)) store.deleteEndpoint(`${path}/${k}`);
      published.set(path, keys);
    };

    function flush(): void {
      flushQueued = false;
      if (stopped) return;
      const paths = allDirty ? new Set([...services.keys(), ...published.keys()]) : dirty;
      for (const p of paths) rebuild(p);
      dirty.clear();
      allDirty = false;
      if (!allSynced()) return;
      const state = store.snapshot();
      if (!announcedSync) {
        announcedSync = true;
        log.info('initial lists complete', { services: state.services, endpoints: state.endpoints, slices: sliceOwner.size, zone: nodeZone ?? '' });
        report();
      }
      if (lastPushed && sameState(lastPushed, state)) return;
      lastPushed = state;
      log.debug('state', { services: state.services, endpoints: state.endpoints, bytes: state.bytes });
      void sink.push(state);
      if (options.once) stop();
    }

    // --- event handlers: update the indexes, mark Services dirty, flush later.

    const onService = (svc: V1Service, deleted: boolean): void => {
      const path = pathOf(svc);
      if (!deleted && isServiceSelected(svc, serviceProxyName)) services.set(path, svc);
      else services.delete(path);
      markDirty(path);
    };

    const onSlice = (slice: V1EndpointSlice, deleted: boolean): void => {
      const key = pathOf(slice);
      const name = slice.metadata?.name ?? '';
      const svcName = sliceServiceName(slice);
      const owner = !deleted && svcName ? `${slice.metadata?.namespace ?? ''}/${svcName}` : undefined;
      const before = sliceOwner.get(key);
      if (before !== undefined && before !== owner) {
        const group = slicesByService.get(before);
        group?.delete(name);
        if (group?.size === 0) slicesByService.delete(before);
        sliceOwner.delete(key);
        markDirty(before);
      }
      if (owner !== undefined) {
        let group = slicesByService.get(owner);
        if (!group) slicesByService.set(owner, (group = new Map()));
        group.set(name, slice);
        sliceOwner.set(key, owner);
        markDirty(owner);
      }
    };

    const onNode = (n: V1Node, deleted: boolean): void => {
      if (n.metadata?.name !== nodeName) return;
      const zone = deleted ? undefined : n.metadata?.labels?.[LABEL_ZONE];
      if (zone !== nodeZone) {
        log.info(zone !== undefined ? `node ${nodeName}: zone ${zone}` : `node ${nodeName}: no zone`);
        nodeZone = zone;
        allDirty = true;
        queueFlush();
      }
    };

    // --- informers

    const restartDelay = (w: Watched): number => Math.min(backoff.maxMs, backoff.minMs * 2 ** Math.max(0, w.failures - 1));

    // When the API server is down every informer fails, each on its own. One
    // attempt must give one log line naming what failed (and the same line
    // each time, for the once-a-minute rule), so failures are gathered into
    // attempts: the informers restarted together are awaited until each has
    // succeeded or failed (at most ATTEMPT_MAX_MS, a hung request must not
    // hold the others back), a failure out of the blue (a cut watch) waits
    // GATHER_MS for companions (the API server restarted: every watch is cut);
    // then one line, and one restart of all of them after the backoff.
    const inflight = new Set<Watched>();
    const failed = new Map<Watched, Failure>();
    const scheduled = new Set<Watched>();
    const recovered = new Set<Watched>();
    let recoveredAfter = 0;
    let restartTimer: NodeJS.Timeout | undefined;
    let restartAt = 0;
    let gatherTimer: NodeJS.Timeout | undefined;
    let gatherStart = 0;
    let gatherMin = 0;

    const restartScheduled = (): void => {
      restartTimer = undefined;
      if (stopped) return;
      reconnects++;
      const members = [...scheduled];
      scheduled.clear();
      for (const w of members) start(w);
    };

    const scheduleRestart = (delay: number): void => {
      const at = Date.now() + delay;
      // A failure during the backoff of another joins its restart, or moves it earlier.
      if (restartTimer !== undefined && restartAt <= at) return;
      clearTimeout(restartTimer);
      restartAt = at;
      restartTimer = setTimeout(restartScheduled, delay);
    };

    const logRecovered = (): void => {
      if (recovered.size === 0) return;
      const names = watched.filter((w) => recovered.has(w)).map(qualified);
      log.info(`${names.join(', ')}: connected again after ${recoveredAfter} failed attempt(s)`);
      recovered.clear();
      recoveredAfter = 0;
    };

    /** Reports the failures gathered (one line) and schedules their restart. */
    const concludeAttempt = (): void => {
      clearTimeout(gatherTimer);
      gatherTimer = undefined;
      logRecovered();
      if (stopped || failed.size === 0) return;
      const members = watched.filter((w) => failed.has(w)); // a stable order: the same failure, the same line
      const line = failureLine(members.map((w) => failed.get(w)!), server);
      const routine = members.every((w) => failed.get(w)!.routine);
      failed.clear();
      const delay = Math.min(...members.map(restartDelay));
      lastError = line;
      repeats.log(log, routine ? 'warn' : 'error', `${line}; retrying in ${delay}ms`, members.some((w) => !w.synced) ? { waiting: 'initial list' } : undefined, line);
      for (const w of members) scheduled.add(w);
      scheduleRestart(delay);
      report();
    };

    /** After each outcome: concludes the attempt once nothing it waits for is in flight. */
    const settle = (): void => {
      if (inflight.size > 0) return;
      logRecovered();
      if (gatherTimer !== undefined && Date.now() - gatherStart >= gatherMin) concludeAttempt();
    };

    const onGatherTimer = (): void => {
      const waited = Date.now() - gatherStart;
      if (inflight.size === 0 || waited >= ATTEMPT_MAX_MS) return concludeAttempt();
      gatherTimer = setTimeout(onGatherTimer, ATTEMPT_MAX_MS - waited);
    };

    const onFailure = (w: Watched, err: unknown): void => {
      if (stopped) return;
      clearTimeout(w.idleTimer);
      // Already failed, its restart pending: one failure, one restart.
      if (failed.has(w) || scheduled.has(w)) return;
      const verb = err instanceof ListError ? 'list' : 'watch';
      const inner = err instanceof ListError ? err.inner : err;
      const f: Failure = w.stalled
        ? { op: `watch ${qualified(w)}`, reason: 'no event for longer than the watch timeout', routine: true }
        : describeKubeError(inner, verb, w, server);
      w.stalled = false;
      w.failures++;
      w.healthy = false;
      const wasInflight = inflight.delete(w);
      failed.set(w, f);
      if (gatherTimer === undefined) {
        gatherStart = Date.now();
        // Part of an attempt in flight: its outcome comes with the others'.
        gatherMin = wasInflight || inflight.size > 0 ? 0 : GATHER_MS;
        gatherTimer = setTimeout(onGatherTimer, gatherMin || ATTEMPT_MAX_MS);
      }
      // For the status at once; the attempt's whole line replaces it when concluded.
      lastError = failureLine([f], server);
      report();
      settle();
    };

    const onHealthy = (w: Watched): void => {
      const wasInflight = inflight.delete(w);
      if (w.failures > 0) {
        recovered.add(w);
        recoveredAfter = Math.max(recoveredAfter, w.failures);
      }
      w.failures = 0;
      if (!w.healthy) {
        w.healthy = true;
        // All well again: the next failure is news.
        if (watched.every((x) => x.healthy)) repeats.clear();
        report();
      }
      if (wasInflight) settle();
    };

    const start = (w: Watched): void => {
      if (stopped) return;
      inflight.add(w);
      w.informer.start().catch((err: unknown) => onFailure(w, err));
    };

    // The library re-lists by itself on 410; we only say so.
    const expired = (w: Watched): void => log.info(`watch ${qualified(w)}: resourceVersion expired (410 Gone); listing again`);

    const timeoutSeconds = (): number => options.watchTimeoutSeconds ?? Math.floor(300 + Math.random() * 300);

    const makeWatched = <T extends KubernetesObject>(
      resource: Watched['resource'],
      group: string,
      path: string,
      list: () => Promise<KubernetesListObject<T>>,
      handler: (obj: T, deleted: boolean) => void,
      labelSelector?: string,
      fieldSelector?: string,
    ): Watched => {
      let w: Watched; // assigned below, before the informer can call back
      const watch = new SourceWatch(kc, {
        stopped: () => stopped,
        timeoutSeconds,
        opened: (controller, seconds) => {
          onHealthy(w);
          clearTimeout(w.idleTimer);
          // Silent past the timeout the server was asked for (plus some grace):
          // the connection is dead (half-open TCP); abort, the restart resumes.
          w.idleTimer = setTimeout(
            () => {
              w.stalled = true;
              controller.abort();
            },
            (seconds + Math.min(60, seconds)) * 1000,
          );
          w.idleTimer.unref();
        },
        event: (type, obj) => {
          w.idleTimer?.refresh();
          if (type === 'ERROR' && (obj as { code?: number } | undefined)?.code === 410) expired(w);
        },
        ended: (err) => {
          clearTimeout(w.idleTimer);
          if ((err as { statusCode?: number } | null)?.statusCode === 410) expired(w);
        },
      });
      const listFn = async (): Promise<KubernetesListObject<T>> => {
        let result: KubernetesListObject<T>;
        try {
          result = await list();
        } catch (err) {
          throw new ListError(err);
        }
        // The informer adds the items right after this resolves, in one tick.
        setImmediate(() => {
          if (stopped) return;
          onHealthy(w);
          if (!w.synced) {
            w.synced = true;
            log.debug(`${qualified(w)}: initial list complete`, { items: result.items.length });
            queueFlush();
            report();
          }
        });
        return result;
      };
      const informer = new ListWatch<T>(path, watch, listFn, false, labelSelector, fieldSelector);
      informer.on('add', (o) => handler(o, false));
      informer.on('update', (o) => handler(o, false));
      informer.on('delete', (o) => handler(o, true));
      informer.on('error', (err) => onFailure(w, err));
      w = { resource, group, informer: informer as unknown as ListWatch<KubernetesObject>, synced: false, healthy: false, failures: 0, stalled: false };
      return w;
    };

    watched.push(
      makeWatched<V1Service>('services', '', '/api/v1/services', () => core.listServiceForAllNamespaces({ labelSelector: selector }), onService, selector),
      makeWatched<V1EndpointSlice>('endpointslices', 'discovery.k8s.io', '/apis/discovery.k8s.io/v1/endpointslices', () => discovery.listEndpointSliceForAllNamespaces(), onSlice),
      makeWatched<V1Node>(
        'nodes',
        '',
        '/api/v1/nodes',
        () => core.listNode({ fieldSelector: `metadata.name=${nodeName}` }),
        onNode,
        undefined,
        `metadata.name=${nodeName}`,
      ),
    );

    if (signal.aborted) return stop();
    signal.addEventListener('abort', stop, { once: true });
    log.info(`watching the Kubernetes API ${server}`, { config: options.configFrom, node: nodeName, services: selector });
    report();
    for (const w of watched) start(w);
  });
}

