/**
 * The kpng source: watches a kpng server's node-local API (localv1
 * `Sets/Watch`, see shared/kpng-localv1.md) and publishes a complete state at
 * every `Sync`.
 *
 * Behaviour that matters to callers:
 * - ingest never waits for the consumer: the next `WatchReq` goes out right
 *   after a state is pushed, and the runner coalesces;
 * - only complete states are pushed: nothing mid-diff, nothing from a broken
 *   stream; after a failure the source waits `errorDelayMs`, reconnects with
 *   an empty store and pushes again only at the new stream's first `Sync`
 *   (the wait is jittered, up to 20% shorter, by src/backoff.ts);
 * - a value that does not decode is logged and skipped, keeping the value held
 *   before (as the reference client does);
 * - a stream failure is warned about when it first happens or changes, the
 *   same failure again at most once a minute (debug in between; see
 *   createRepeatFilter).
 */
import { createPrivateKey, X509Certificate, type KeyObject } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { format } from 'node:util';
import * as grpc from '@grpc/grpc-js';
import { unmarshalService, marshalWatchReq, type OpItem, type Ref } from '../codec.js';
import { backoffDelay } from '../backoff.js';
import { DEFAULTS } from '../defaults.js';
import { CalloutError } from '../errors.js';
import { createRepeatFilter, silentLogger, type Logger } from '../log.js';
import { EndpointsSet, ServicesSet } from '../model.js';
import type { Source, SourceStatus, StateSink } from '../source.js';
import { Store } from '../state.js';
// Fast paths of the hot loop: OpItems without protobufjs, Endpoints straight to JSON.
import { decodeOpItem, endpointJson } from '../wirejson.js';

/** Full method path of the only call of the localv1 API. */
const WATCH_METHOD = '/localv1.Sets/Watch';

/** TLS material (PEM contents, not paths). TLS is used when any is given. */
export interface KpngTlsOptions {
  /** CA bundle that verifies the server; the system roots when absent. */
  ca?: Buffer | undefined;
  /** Client certificate chain, for mutual TLS (needs `key`). */
  cert?: Buffer | undefined;
  /** Client private key, for mutual TLS (needs `cert`). */
  key?: Buffer | undefined;
}

/** Options of {@link createKpngSource}. The CLI validates them. */
export interface KpngSourceOptions {
  /** `host:port` (or `unix:PATH`) of the kpng API. Default {@link DEFAULTS}.api. */
  api?: string | undefined;
  /** The node whose local state is watched, sent in every `WatchReq`. */
  nodeName: string;
  /** Resolve `run` after the first complete state has been pushed. */
  once?: boolean | undefined;
  /** Wait after a stream failure before reconnecting (ms). Default {@link DEFAULTS}.errorDelayMs. */
  errorDelayMs?: number | undefined;
  /** Largest message accepted from the server (bytes). Default {@link DEFAULTS}.maxMsgSize. */
  maxMsgSize?: number | undefined;
  /** TLS (mutual with cert and key) when set with at least one member. */
  tls?: KpngTlsOptions | undefined;
  /** Where log lines go. Default: nowhere. */
  logger?: Logger | undefined;
  /** Millisecond clock of the once-a-minute rule for repeated failures (tests). Default Date.now. */
  now?: (() => number) | undefined;
  /**
   * An attempt without an answer (no headers, no data) this long is logged
   * and reported (ms). Default {@link DEFAULTS}.noAnswerMs, grpc-go's connect
   * timeout, which the Go client had; grpc-js has none: an address whose SYNs
   * are dropped waits for the kernel (~2 min), a server that accepts but never
   * speaks (stopped, wedged) for ever. Only reported, not abandoned: grpc-js
   * leaves a connection still in its handshake open when its channel closes,
   * so a new attempt each time would leak one.
   */
  noAnswerMs?: number | undefined;
  /** HTTP/2 keepalive ping interval on an open stream (ms). Default {@link DEFAULTS}.keepaliveMs. */
  keepaliveMs?: number | undefined;
  /** A keepalive ping unanswered this long fails the stream (ms). Default {@link DEFAULTS}.keepaliveTimeoutMs. */
  keepaliveTimeoutMs?: number | undefined;
}

/**
 * Whether grpc-js may send `api` through a proxy, as grpc-go would: not a
 * Unix socket, `localhost` or a loopback address (Go's
 * http.ProxyFromEnvironment never proxies them), and only with `https_proxy`
 * (or grpc-js's own `grpc_proxy`) set: grpc-go looks the proxy up for an
 * https URL, so `http_proxy` alone, which grpc-js would use, is not a proxy
 * for it. grpc-js reads lower-case names only (`no_proxy` too).
 */
export function mayProxy(api: string, env: NodeJS.ProcessEnv): boolean {
  if (!env.grpc_proxy && !env.https_proxy) return false;
  if (api.startsWith('unix')) return false;
  const host = api
    .replace(/^(dns:(\/\/[^/]*\/)?|ipv4:|ipv6:)/, '')
    .replace(/:\d+$/, '').replace(/^\[(.*)\]$/, '$1').toLowerCase();
  return !(host === 'localhost' || host.endsWith('.localhost') || host === '::1' || /^127\./.test(host) || /^::ffff:127\./.test(host));
}


/** A stream attempt ended: cleanly (aborted / once satisfied), by failure, or by a bug. */
type Outcome = { kind: 'done' } | { kind: 'failed'; reason: string; synced: boolean } | { kind: 'fatal'; error: unknown };

/** Waits `ms`, or less when `signal` aborts. */
async function pause(ms: number, signal: AbortSignal): Promise<void> {
  await sleep(ms, undefined, { signal }).catch(() => undefined);
}

/** `1000` -> `1s`, `250` -> `250ms`, `1500` -> `1.5s`. */
function formatDelay(ms: number): string {
  return ms >= 1000 ? `${ms / 1000}s` : `${ms}ms`;
}

function isServiceError(err: unknown): err is grpc.ServiceError {
  return typeof err === 'object' && err !== null && typeof (err as { code?: unknown }).code === 'number';
}

const pemCertificate = /-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g;

/** The certificates of `pem`, each parsed; throws unless there is at least one and all of them parse. */
function certificates(pem: Buffer, what: string): X509Certificate[] {
  const blocks = pem.toString('latin1').match(pemCertificate);
  if (!blocks) throw new Error(`${what}: no PEM certificate found`);
  return blocks.map((block) => {
    try {
      return new X509Certificate(block);
    } catch (err) {
      throw new Error(`${what}: ${(err as Error).message}`, { cause: err });
    }
  });
}

/**
 * Throws (an Error whose message starts with the part's name from `names`)
 * unless the TLS material is usable: a CA bundle and a certificate chain
 * with certificates that parse (Node accepts a CA bundle without any
 * certificate in it, and then fails every handshake), a private key, both
 * or neither of certificate and key, and the key the certificate's.
 */
export function checkTlsMaterial(tls: KpngTlsOptions, names: { ca: string; cert: string; key: string } = { ca: 'CA', cert: 'certificate', key: 'key' }): void {
  if (tls.ca) certificates(tls.ca, names.ca);
  const chain = tls.cert ? certificates(tls.cert, names.cert) : undefined;
  if (chain && !tls.key) throw new Error(`${names.cert}: a client certificate needs its key`);
  if (tls.key && !chain) throw new Error(`${names.key}: a client key needs its certificate`);
  if (!chain || !tls.key) return;
  let key: KeyObject;
  try {
    key = createPrivateKey(tls.key);
  } catch (err) {
    throw new Error(`${names.key}: not a PEM private key (${(err as Error).message})`, { cause: err });
  }
  if (!chain[0]!.checkPrivateKey(key)) throw new Error(`${names.key}: not the key of the certificate in ${names.cert}`);
}

function setName(set: number): string {
  return set === ServicesSet ? 'Service' : 'Endpoint';
}

/** Creates the source; nothing happens until `run`. */
export function createKpngSource(options: KpngSourceOptions): Source {
  const api = options.api ?? DEFAULTS.api;
  const errorDelayMs = options.errorDelayMs ?? DEFAULTS.errorDelayMs;
  const noAnswerMs = options.noAnswerMs ?? DEFAULTS.noAnswerMs;
  const maxMsgSize = options.maxMsgSize ?? DEFAULTS.maxMsgSize;
  const keepaliveMs = options.keepaliveMs ?? DEFAULTS.keepaliveMs;
  const keepaliveTimeoutMs = options.keepaliveTimeoutMs ?? DEFAULTS.keepaliveTimeoutMs;
  const log = options.logger ?? silentLogger;
  const request = Buffer.from(marshalWatchReq({ NodeName: options.nodeName }));
  // Logged once per kind for the life of the source: a server sending global
  // sets would otherwise flood the log on every revision.
  const ignoredSets = new Set<number>();
  let unknownOpLogged = false;

  function credentials(): grpc.ChannelCredentials {
    const tls = options.tls;
    if (!tls || (!tls.ca && !tls.cert && !tls.key)) return grpc.credentials.createInsecure();
    try {
      checkTlsMaterial(tls);
      return grpc.credentials.createSsl(tls.ca ?? null, tls.key ?? null, tls.cert ?? null);
    } catch (err) {
      // Bad PEM will not get better by retrying.
      throw new CalloutError('input', `TLS files for --api ${api}: ${(err as Error).message}`, { cause: err });
    }
  }

  function describe(err: unknown): string {
    if (!isServiceError(err)) return String((err as Error)?.message ?? err);
    const name = grpc.status[err.code] ?? String(err.code);
    // grpc-js appends an empty "Resolution note: " to connection errors, and a timestamp to some
    // ("Failed to connect (2026-…Z)"), which would make every repeat of one failure news; OpenSSL
    // messages and a server's details may span lines: one log line each.
    const details = (err.details ?? '')
      .replace(/\.? Resolution note: ?$/, '')
      .replace(/ \(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z\)/g, '')
      .replace(/\s*[\r\n]+\s*/g, ' ')
      .trim();
    // Only grpc-js's own limit is ours to raise; a server's RESOURCE_EXHAUSTED is the server's.
    if (err.code === grpc.status.RESOURCE_EXHAUSTED && /larger than/i.test(details)) {
      return `${name}: ${details}; a message exceeded --max-msg-size (${maxMsgSize} bytes), raise --max-msg-size`;
    }
    // Our own cancel happens only after the attempt is over: this one came
    // from the server (grpc-js says "Call cancelled", which reads as ours).
    if (err.code === grpc.status.CANCELLED) return `${name}: the server cancelled the stream`;
    return `${name}: ${details}`;
  }

  function ignoreSet(set: number, what: string): void {
    if (ignoredSets.has(set)) return;
    ignoredSets.add(set);
    log.debug(`ignoring ${what} ops on set ${set} (only Services and Endpoints are node-local)`);
  }

  /** Applies one non-Sync op to the store. */
  function apply(store: Store, op: OpItem): void {
    if (op.Set) {
      const ref: Ref | undefined = op.Set.Ref;
      if (!ref) {
        log.warn('skipping a Set op without a Ref');
        return;
      }
      if (ref.Set !== ServicesSet && ref.Set !== EndpointsSet) return ignoreSet(ref.Set, 'Set');
      try {
        if (ref.Set === ServicesSet) store.setService(ref.Path, unmarshalService(op.Set.Bytes));
        else if (!store.setEndpointJson(ref.Path, endpointJson(op.Set.Bytes))) {
          log.warn(`skipping Endpoint ${ref.Path}: its path has no namespace/service part`);
        }
      } catch (err) {
        // Nothing was stored: the value held before stays.
        log.warn(`cannot decode ${setName(ref.Set)} ${ref.Path}: ${(err as Error).message}; keeping the value held before`);
      }
    } else if (op.Delete) {
      const ref = op.Delete;
      if (ref.Set === ServicesSet) store.deleteService(ref.Path);
      else if (ref.Set === EndpointsSet) store.deleteEndpoint(ref.Path);
      else ignoreSet(ref.Set, 'Delete');
    } else if (op.Reset) {
      store.reset();
    } else if (!unknownOpLogged) {
      unknownOpLogged = true;
      log.debug('ignoring an OpItem of a kind this client does not know');
    }
  }

  return {
    async run(sink: StateSink, signal: AbortSignal): Promise<void> {
      // grpc-js writes its own lines to stderr ('E Failed to connect to proxy ...'),
      // which would break --log-format json: they are ours, at debug (-v), one line each.
      const grpcLine = (message: unknown, ...rest: unknown[]): void => log.debug(`grpc: ${format(message, ...rest).replace(/\s*\n\s*/g, ' ')}`);
      grpc.setLogger({ error: grpcLine, info: grpcLine, debug: grpcLine });
      const creds = credentials();
      let reconnects = 0;
      // A server down for an hour must not leave 3600 identical warnings:
      // the same failure is warned about at most once a minute.
      const repeats = createRepeatFilter({ now: options.now });

      const status = (s: SourceStatus): void => {
        try {
          sink.status?.(s);
        } catch (err) {
          log.debug(`status listener failed: ${(err as Error).message}`);
        }
      };

      /** One stream, from dial to failure (or abort / once). */
      const attempt = (): Promise<Outcome> =>
        new Promise<Outcome>((resolve) => {
          const client = new grpc.Client(api, creds, {
            'grpc.max_receive_message_length': maxMsgSize,
            // A private subchannel per attempt: a shared one would carry
            // grpc's own reconnect backoff over from the failed attempt.
            'grpc.use_local_subchannel_pool': 1,
            // A silent stream is normal (nothing changed): only pings tell a dead peer from a quiet one.
            'grpc.keepalive_time_ms': keepaliveMs,
            'grpc.keepalive_timeout_ms': keepaliveTimeoutMs,
            ...(mayProxy(api, process.env) ? {} : { 'grpc.enable_http_proxy': 0 }),
          });
          const call = client.makeBidiStreamRequest<Buffer, OpItem>(WATCH_METHOD, (b) => b, decodeOpItem);
          // A new stream re-sends the full state: start from nothing.
          const store = new Store({
            onOrphans: (paths) =>
              log.warn(
                `skipping ${paths.length} endpoint(s) whose Service is absent: ${paths.slice(0, 3).join(', ')}${paths.length > 3 ? ', ...' : ''}`,
              ),
          });
          let settled = false;
          let connected = false;
          let synced = false;

          const silent = setTimeout(() => {
            if (settled || synced) return;
            const channel = client.getChannel().getConnectivityState(false);
            // A grpc-go server (kpng) sends no response headers before its first message: a
            // READY channel is as far as "connected" goes while kpng has nothing to send.
            if (connected || channel === grpc.connectivityState.READY) {
              // kpng's server sends its first state only once it has synced with the Kubernetes API,
              // and none while no Service is selected for this node (an empty diff is never sent).
              log.info(`connected to ${api}, no state within ${formatDelay(noAnswerMs)}: kpng sends one once it has synced with the Kubernetes API and has a Service for this node; still waiting`);
              return;
            }
            const state = grpc.connectivityState[channel] ?? 'unknown';
            const reason = `no answer from ${api} within ${formatDelay(noAnswerMs)} (channel ${state}); still waiting`;
            repeats.log(log, 'warn', reason, undefined, reason);
            status({ connected: false, synced: false, reconnects, error: reason });
          }, noAnswerMs);
          const finish = (outcome: Outcome): void => {
            if (settled) return;
            settled = true;
            clearTimeout(silent);
            signal.removeEventListener('abort', onAbort);
            call.cancel();
            client.close();
            resolve(outcome);
          };
          const onAbort = (): void => finish({ kind: 'done' });
          const markConnected = (): void => {
            if (connected) return;
            connected = true;
            status({ connected: true, synced: false, reconnects });
          };

          call.on('metadata', markConnected);
          call.on('data', (op: OpItem) => {
            if (settled) return;
            markConnected();
            if (!op.Sync) {
              apply(store, op);
              return;
            }
            const state = store.snapshot();
            if (!synced) {
              synced = true;
              // Synced again: the next failure is news.
              repeats.clear();
              log.info(`synced with ${api}: ${state.services} services, ${state.endpoints} endpoints`);
              status({ connected: true, synced: true, reconnects });
            } else {
              log.debug(`sync: ${state.services} services, ${state.endpoints} endpoints, ${state.bytes} bytes`);
            }
            try {
              const pushed: unknown = sink.push(state);
              if (pushed instanceof Promise) {
                pushed.catch((err: unknown) => log.error(`state consumer failed: ${(err as Error)?.message ?? String(err)}`));
              }
            } catch (err) {
              finish({ kind: 'fatal', error: err });
              return;
            }
            if (options.once) return finish({ kind: 'done' });
            // Ask for the next diff now: the consumer's pace is the runner's business.
            call.write(request);
          });
          call.on('error', (err: unknown) => finish({ kind: 'failed', reason: describe(err), synced }));
          call.on('status', (s: grpc.StatusObject) => {
            // Errors arrive on 'error'; an OK status means the server ended the stream.
            if (s.code === grpc.status.OK) finish({ kind: 'failed', reason: 'the server ended the stream', synced });
          });

          if (signal.aborted) return finish({ kind: 'done' });
          signal.addEventListener('abort', onAbort, { once: true });
          call.write(request);
        });

      status({ connected: false, synced: false, reconnects });
      while (!signal.aborted) {
        const outcome = await attempt();
        if (outcome.kind === 'done') return;
        if (outcome.kind === 'fatal') throw outcome.error;
        if (signal.aborted) return;
        // --error-delay is the longest wait; jitter (up to 20% less) keeps the
        // nodes of a remote controller from reconnecting in lockstep.
        const delay = backoffDelay(0, { minMs: errorDelayMs, maxMs: errorDelayMs });
        repeats.log(log, 'warn', `stream to ${api} failed: ${outcome.reason}; reconnecting in ${formatDelay(delay)}`, undefined, outcome.reason);
        status({ connected: false, synced: false, reconnects, error: outcome.reason });
        await pause(delay, signal);
        if (signal.aborted) return;
        reconnects++;
      }
    },
  };
}
