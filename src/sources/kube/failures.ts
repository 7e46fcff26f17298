/**
 * What a failed list or watch means, in words people can act on: the API
 * server cannot be reached, the credentials are rejected (401), RBAC lacks a
 * verb (403, naming what to grant), or what the server said. The failures of
 * one attempt are put on one line (`failureLine`), so a server that is down
 * gives one line per attempt, not one per resource. Pure: no I/O, no timers.
 */

/** A watched resource as RBAC names it. */
export interface ResourceName {
  /** Plural resource name: `services`, `endpointslices`, `nodes`. */
  resource: string;
  /** API group ('' = core). */
  group: string;
}

/** `services`, `endpointslices.discovery.k8s.io`: what RBAC rules and `kubectl auth can-i` name. */
export const qualified = (r: ResourceName): string => (r.group ? `${r.resource}.${r.group}` : r.resource);

/** The `code` of a request whose server, connected, sent nothing within the request timeout (http.ts). */
export const NO_ANSWER = 'ERR_KUBE_NO_ANSWER';

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
export interface Failure {
  /** `list services`, `watch endpointslices.discovery.k8s.io`. */
  op: string;
  /** What went wrong, without the operation. */
  reason: string;
  /** The errno of an unreachable server (the line then starts "cannot reach the Kubernetes API server"). */
  unreachable?: string | undefined;
  /** A watch cut or gone silent (API server restarts, load balancers): a warning, not an error. */
  routine: boolean;
  /**
   * Failures in a row as the member counts them, when its list or watch
   * looked healthy in between (watches that end or expire at once): the
   * backoff grows from this, not from the supervisor's count, which a
   * successful list resets.
   */
  streak?: number | undefined;
}

/** The failure of a watch that stayed silent past its timeout (the idle watchdog aborted it). */
export function stalledWatch(r: ResourceName): Failure {
  return { op: `watch ${qualified(r)}`, reason: 'no event for longer than the watch timeout', routine: true };
}

/** The Status message in an error body of the API server, as ` (server: ...)`, else ''. */
function serverSays(body: unknown): string {
  if (typeof body !== 'string') return '';
  try {
    const m = (JSON.parse(body) as { message?: unknown }).message;
    return typeof m === 'string' && m ? ` (server: ${m})` : '';
  } catch {
    return ''; // not a Status object
  }
}

/**
 * What went wrong with a list or watch: unreachable server, 401, 403 (naming
 * the verb and resource RBAC must grant), or what the server said. `err` is
 * what a request rejects with (http.ts): an HTTP status (`statusCode`, or
 * `code` as a number, with the Status `body` as text), a network error
 * (`code`, or `cause.code`), or a response cut short
 * (ERR_STREAM_PREMATURE_CLOSE).
 */
export function describeKubeError(err: unknown, verb: 'list' | 'watch', r: ResourceName, server: string): Failure {
  const e = err as { code?: unknown; statusCode?: unknown; body?: unknown; message?: string; cause?: { code?: unknown } } | undefined;
  const status = typeof e?.code === 'number' ? e.code : typeof e?.statusCode === 'number' ? e.statusCode : undefined;
  const res = qualified(r);
  const op = `${verb} ${res}`;
  if (status !== undefined) {
    const says = serverSays(e?.body);
    if (status === 401) {
      return { op, routine: false, reason: `401 Unauthorized: the API server ${server} rejected the credentials (check the kubeconfig user, or the service account token)${says}` };
    }
    if (status === 403) {
      return {
        op,
        routine: false,
        reason:
          `403 Forbidden: RBAC does not allow verb "${verb}" on resource "${r.resource}" in API group "${r.group}"` +
          ` (the ClusterRole needs get, list and watch on ${res}; see manifests/rbac.yaml)${says}`,
      };
    }
    return { op, routine: false, reason: `HTTP ${status}${says || (e?.message && !e.message.startsWith('HTTP-Code') ? ` (${e.message})` : '')}` };
  }
  const code = typeof e?.code === 'string' ? e.code : typeof e?.cause?.code === 'string' ? e.cause.code : undefined;
  if (code && NETWORK_CODES[code]) return { op, routine: false, reason: NETWORK_CODES[code], unreachable: code };
  if (code === 'ERR_STREAM_PREMATURE_CLOSE') return { op, routine: true, reason: `connection to ${server} lost` };
  if (code === NO_ANSWER) return { op, routine: false, reason: `${e?.message ?? 'no answer'} (${server})` };
  // Node's certificate verification codes (UNABLE_TO_VERIFY_LEAF_SIGNATURE, SELF_SIGNED_CERT_IN_CHAIN,
  // CERT_HAS_EXPIRED, ERR_TLS_CERT_ALTNAME_INVALID...): say which server and which setting to check.
  if (code && /^(CERT_|UNABLE_TO_|SELF_SIGNED|DEPTH_ZERO_SELF_SIGNED|ERR_TLS_CERT_ALTNAME)/.test(code)) {
    const what = e?.message?.split('\n')[0] ?? code;
    return {
      op,
      routine: false,
      reason:
        `the API server ${server}'s TLS certificate is not trusted: ${what} (${code}); check the cluster's certificate-authority` +
        ` (certificate-authority-data, tls-server-name) in the kubeconfig, or in a pod the service account's ca.crt`,
    };
  }
  // An alert the server sent about our client certificate (missing, expired, refused).
  if (code && /^ERR_SSL_.*ALERT.*CERTIFICATE/.test(code)) {
    const what = e?.message?.split('\n')[0] ?? code;
    return { op, routine: false, reason: `the API server ${server} refused our client certificate: ${what} (${code}); check client-certificate and client-key in the kubeconfig` };
  }
  return { op, routine: false, reason: e?.message?.split('\n')[0] ?? String(err) };
}

/** One line for the failures of one attempt, those with the same reason together (in `fs` order). */
export function failureLine(fs: readonly Failure[], server: string): string {
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
