/**
 * The Kubernetes API source: watches Services (selected by the
 * service-proxy-name label, as kpng and kube-proxy do), discovery.k8s.io/v1
 * EndpointSlices and this node's Node, and publishes the node-local state
 * kpng's server would have sent to this node (see shared/kpng-localv1.md).
 *
 * This module wires the parts, each in src/sources/kube/:
 * - config.ts: where the API configuration comes from (loadKubeConfig);
 * - auth.ts + http.ts: TLS, credentials and requests to the API server;
 * - node-view.ts: the objects -> this node's state, pure and incremental;
 * - supervisor.ts + list-watch.ts: the list/watch loops, their health, status
 *   and restarts (failures.ts words what went wrong).
 *
 * The full @kubernetes/client-node is not loaded on the usual paths (its
 * import costs ~0.5 s and ~70 MB RSS, measured): see config.ts and auth.ts.
 *
 * Behaviour that matters to callers:
 * - nothing is pushed before every initial list completed, so the first
 *   state is never partial;
 * - a failed list or watch is restarted with jittered exponential backoff
 *   and resumes from its last resourceVersion; the objects already known
 *   stay, so a failure never turns into an empty state;
 * - 410 Gone re-lists; the re-list's objects all arrive in one tick, and the
 *   state is computed a tick later (setImmediate), so it is never seen
 *   half-applied;
 * - a state is pushed only when it differs from the last one pushed (kpng's
 *   server sent a Sync only for a non-empty diff);
 * - loops that fail together (the API server is down) give one log line per
 *   attempt and are restarted together; the same failure is logged at most
 *   once a minute, at debug level in between.
 */
import { DEFAULTS } from '../defaults.js';
import type { BackoffBounds } from '../backoff.js';
import { LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME, type KubeEndpointSlice, type KubeNode, type KubeService } from '../convert/kube-objects.js';
import type { GlobFilter } from '../convert/glob.js';
import { silentLogger, type Logger } from '../log.js';
import type { Source, StateSink } from '../source.js';
import { sameState, type State } from '../state.js';
import { credentialsFor } from './kube/auth.js';
import type { LoadedKubeConfig } from './kube/config.js';
import { ApiClient } from './kube/http.js';
import { addListWatch, type ApiObject, type ListWatchOptions } from './kube/list-watch.js';
import { NodeView } from './kube/node-view.js';
import { ListWatchSupervisor } from './kube/supervisor.js';

// The CLI loads the configuration and builds the source with one (lazy) import of this module.
export { loadKubeConfig } from './kube/config.js';

/** Restart delays of a failed list/watch when `backoff` is not given (ms). */
const DEFAULT_BACKOFF: BackoffBounds = { minMs: DEFAULTS.kubeRetryMinMs, maxMs: DEFAULTS.kubeRetryMaxMs };
/** Server-side watch timeouts asked for when `watchTimeoutSeconds` is not given: random in this range (s), as client-go. */
const DEFAULT_WATCH_TIMEOUT_S = { min: DEFAULTS.kubeWatchTimeoutMinS, max: DEFAULTS.kubeWatchTimeoutMaxS };

/**
 * The Services label selector kpng used: `service-proxy-name=NAME` with a
 * name, else "the label does not exist" (what kube-proxy handles), and in both
 * cases `!service.kubernetes.io/headless`.
 */
export function serviceLabelSelector(serviceProxyName?: string): string {
  const proxy = serviceProxyName ? `${LABEL_SERVICE_PROXY_NAME}=${serviceProxyName}` : `!${LABEL_SERVICE_PROXY_NAME}`;
  return `${proxy},!${LABEL_HEADLESS}`;
}

/** Options of {@link createKubeSource}. The CLI validates them. */
export interface KubeSourceOptions {
  kubeConfig: LoadedKubeConfig;
  /** Where the configuration came from, for the start-up log line. */
  configFrom?: string | undefined;
  /** The node whose view is computed (Local, traffic policies, zone). */
  nodeName: string;
  /** Handle Services labelled service-proxy-name=NAME; unset: Services without the label. */
  serviceProxyName?: string | undefined;
  /** Service labels to send (`--with-service-labels`); none when unset, as kpng. */
  labels?: GlobFilter | undefined;
  /** Service annotations to send (`--with-service-annotations`); none when unset. */
  annotations?: GlobFilter | undefined;
  /** Resolve `run` after the first complete state has been pushed. */
  once?: boolean | undefined;
  logger?: Logger | undefined;
  /** Restart delays of a failed list/watch (ms): doubles from `minMs` up to `maxMs`, ±20% jitter. Default 500 ms .. 30 s. */
  backoff?: BackoffBounds | undefined;
  /**
   * Server-side watch timeout asked for (s); the server ends the watch cleanly
   * and the loop resumes from its resourceVersion. A watch silent for
   * longer than this plus a minute (or twice this, when shorter) is taken as
   * dead and restarted.
   * Default: random in 5..10 min, as client-go does.
   */
  watchTimeoutSeconds?: number | undefined;
  /** Millisecond clock of the once-a-minute rule for repeated failures (tests). Default Date.now. */
  now?: (() => number) | undefined;
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
  const selector = serviceLabelSelector(serviceProxyName);
  const view = new NodeView({ nodeName, serviceProxyName, labels: options.labels, annotations: options.annotations, logger: log });
  const credentials = credentialsFor(kc);
  // A failure to get credentials (an import that fails) surfaces on each request, as a failed list.
  void credentials.then((c) => log.debug('kube API credentials', { via: c.via }), () => {});
  const client = new ApiClient({ server, credentials });
  let flushQueued = false;
  let lastPushed: State | undefined;
  let announcedSync = false;

  return new Promise<void>((resolve) => {
    const supervisor = new ListWatchSupervisor({
      server,
      backoff: options.backoff ?? DEFAULT_BACKOFF,
      logger: log,
      now: options.now,
      onStatus: (s) => sink.status?.(s),
      onSynced: () => queueFlush(),
    });

    const stop = (): void => {
      if (supervisor.isStopped) return;
      signal.removeEventListener('abort', stop);
      supervisor.stop();
      client.close();
      resolve();
    };

    const queueFlush = (): void => {
      if (flushQueued || supervisor.isStopped) return;
      flushQueued = true;
      // After the current tick: a re-list hands over all its objects in one tick.
      setImmediate(flush);
    };

    function flush(): void {
      flushQueued = false;
      if (supervisor.isStopped || !supervisor.synced) return;
      const state = view.state();
      if (!announcedSync) {
        announcedSync = true;
        log.info('initial lists complete', { services: state.services, endpoints: state.endpoints, slices: view.sliceCount, zone: view.zone ?? '' });
        // A wrong --node-name ($NODE_NAME, or a hostname that is not the Node's name) otherwise goes unnoticed:
        // Local only marks endpoints whose nodeName is that name (none, when it is wrong).
        if (!view.nodeKnown) log.warn(`node ${nodeName}: no such Node in the API: its zone is unknown (endpoints with topology hints are left out) and only endpoints whose nodeName is ${nodeName} are Local; set --node-name (or $NODE_NAME) to this node's name as \`kubectl get nodes\` shows it`);
      }
      if (lastPushed && sameState(lastPushed, state)) return;
      lastPushed = state;
      log.debug('state', { services: state.services, endpoints: state.endpoints, bytes: state.bytes });
      void sink.push(state);
      if (options.once) stop();
    }

    const changed = (maybe: boolean): void => {
      if (maybe) queueFlush();
    };

    const { min, max } = DEFAULT_WATCH_TIMEOUT_S;
    const timeoutSeconds = (): number => options.watchTimeoutSeconds ?? Math.floor(min + Math.random() * (max - min));
    /** Watches one resource; its objects (parsed JSON, typed by convert/kube-objects.ts) go to the view's `set` or `del`. */
    const watch = <T>(
      where: Pick<ListWatchOptions, 'resource' | 'group' | 'path' | 'labelSelector' | 'fieldSelector'>,
      set: (obj: T) => boolean,
      del: (obj: T) => boolean,
      stage?: (obj: T) => () => boolean,
    ): void => {
      addListWatch({
        ...where,
        client,
        supervisor,
        server,
        logger: log,
        timeoutSeconds,
        onObject: (o: ApiObject, deleted) => changed(deleted ? del(o as T) : set(o as T)),
        // A re-list keeps what the view makes of each object, not the object, until it is complete.
        stage:
          stage &&
          ((o: ApiObject) => {
            const apply = stage(o as T);
            return () => changed(apply());
          }),
        // A re-list that changes nothing publishes no state: its garbage (~40 MB of pages at 10,000 Services) is still given back.
        onListed: () => sink.worked?.(),
      });
    };
    const onlyThisNode = `metadata.name=${nodeName}`;
    watch<KubeService>(
      { resource: 'services', group: '', path: '/api/v1/services', labelSelector: selector },
      (o) => view.setService(o),
      (o) => view.deleteService(o),
      (o) => view.stageService(o),
    );
    watch<KubeEndpointSlice>(
      { resource: 'endpointslices', group: 'discovery.k8s.io', path: '/apis/discovery.k8s.io/v1/endpointslices' },
      (o) => view.setSlice(o),
      (o) => view.deleteSlice(o),
      (o) => view.stageSlice(o),
    );
    watch<KubeNode>(
      { resource: 'nodes', group: '', path: '/api/v1/nodes', fieldSelector: onlyThisNode },
      (o) => view.setNode(o),
      (o) => view.deleteNode(o),
    );

    if (signal.aborted) return stop();
    signal.addEventListener('abort', stop, { once: true });
    log.info(`watching the Kubernetes API ${server}`, { config: options.configFrom, node: nodeName, services: selector });
    supervisor.start();
  });
}
