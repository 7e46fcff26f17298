/**
 * The HTTP side of observability: serves a {@link Metrics}' `/metrics`,
 * `/healthz` and `/readyz` on `--metrics-addr`, or `/healthz` and `/readyz`
 * alone on `--health-addr` (metrics on loopback, probes on the node's
 * address, as kube-proxy splits them).
 */
import { existsSync } from 'node:fs';
import { lstat, unlink } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { dirname } from 'node:path';
import { CalloutError } from '../errors.js';
import { silentLogger, type Logger } from '../log.js';
import type { Address } from '../options.js';
import type { Check, Metrics } from './metrics.js';

/** A running metrics HTTP server. */
export interface MetricsServer {
  /**
   * Where it listens: `host:port` (the real port when 0 was asked; `[::]:port`
   * or `0.0.0.0:port` for every interface) or `unix:PATH`.
   */
  readonly address: string;
  /** Stops listening and drops open connections. */
  close(): Promise<void>;
}

/** Options of {@link serveMetrics}. */
export interface ServeOptions {
  /**
   * `all` (default): `/metrics`, `/healthz` and `/readyz`. `health`: only
   * `/healthz` and `/readyz`, for an address the kubelet's probes reach while
   * the metrics stay on loopback (kube-proxy's split).
   */
  endpoints?: 'all' | 'health';
  /** The option named in errors and logs. Default `--metrics-addr`, or `--health-addr` for `health`. */
  flag?: string;
}

const ERRNO_TEXT: Record<string, string> = {
  EADDRINUSE: 'address already in use',
  EADDRNOTAVAIL: 'address not available on this host',
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  ENOTFOUND: 'host not found',
  EAI_AGAIN: 'name resolution failed',
  EAFNOSUPPORT: 'address family not supported',
  ENOENT: 'no such directory',
  ENOTDIR: 'not a directory',
};

/** Why listening failed, for people: `address already in use (EADDRINUSE)`. */
function listenErrorText(err: NodeJS.ErrnoException, port: number, unix: string | undefined): string {
  // libuv reports a Unix socket in a missing directory as EACCES.
  const code = unix !== undefined && err.code === 'EACCES' && !existsSync(dirname(unix)) ? 'ENOENT' : err.code;
  if (code === undefined) return err.message;
  let text = `${ERRNO_TEXT[code] ?? err.message} (${code})`;
  if (code === 'EADDRINUSE') text += unix !== undefined ? '; a process listens there, or the path is not a socket: choose another path' : '; another process listens there: choose another port';
  if (code === 'EACCES' && unix === undefined && port > 0 && port < 1024) text += '; ports below 1024 need root or CAP_NET_BIND_SERVICE';
  return text;
}

/**
 * Serves `/metrics`, `/healthz` and `/readyz` for `metrics` on `addr`
 * (as parseHostPort parsed it: a host, `''` for every interface, or a Unix
 * socket; port 0 picks a free one); with `endpoints: 'health'`
 * only `/healthz` and `/readyz`.
 *
 * `:port` listens on the unspecified IPv6 address `::`, dual-stack (IPv4
 * clients too), or on 0.0.0.0 where IPv6 is unavailable: Node's behaviour for
 * a listen without a host.
 *
 * Rejects with CalloutError code `io` (exit 1, not a usage error) naming the
 * flag, the address and the errno when it cannot listen:
 * `--metrics-addr 127.0.0.1:9100: cannot listen: address already in use (EADDRINUSE); ...`.
 */
export async function serveMetrics(metrics: Metrics, addr: Address, logger: Logger = silentLogger, options: ServeOptions = {}): Promise<MetricsServer> {
  const endpoints = options.endpoints ?? 'all';
  const flag = options.flag ?? (endpoints === 'health' ? '--health-addr' : '--metrics-addr');
  const paths = endpoints === 'all' ? '/metrics, /healthz and /readyz' : '/healthz and /readyz';
  const check = (res: ServerResponse, c: Check, head: boolean): void => {
    res.writeHead(c.ok ? 200 : 503, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' });
    res.end(head ? undefined : c.reason + '\n');
  };
  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = (req.url ?? '/').split('?')[0];
    const head = req.method === 'HEAD';
    if (req.method !== 'GET' && !head) {
      res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain; charset=utf-8' });
      res.end('method not allowed\n');
      return;
    }
    switch (path) {
      case '/metrics': {
        if (endpoints === 'health') break;
        const body = await metrics.registry.metrics();
        res.writeHead(200, { 'content-type': metrics.registry.contentType, 'cache-control': 'no-store' });
        res.end(head ? undefined : body);
        return;
      }
      case '/healthz':
        return check(res, metrics.health(), head);
      case '/readyz':
        return check(res, metrics.readiness(), head);
    }
    res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' });
    res.end(endpoints === 'all' ? 'not found: try /metrics, /healthz or /readyz\n' : 'not found: try /healthz or /readyz (this is the health address; /metrics is on --metrics-addr)\n');
  };

  const server: Server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      logger.warn(`${flag}: ${req.url ?? ''}: ${(err as Error)?.message ?? String(err)}`);
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain; charset=utf-8' });
      res.end('internal error\n');
    });
  });
  // Scrapes must never keep the process alive on exit.
  server.unref();

  const unix = 'unix' in addr ? addr.unix : undefined;
  const host = 'host' in addr ? addr.host : '';
  const port = 'port' in addr ? addr.port : 0;
  if (unix !== undefined && (await removeStaleSocket(unix))) logger.info(`${flag} ${addr.text}: removed a stale socket file (no process listened on it)`);
  await new Promise<void>((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException): void => {
      reject(new CalloutError('io', `${flag} ${addr.text}: cannot listen: ${listenErrorText(err, port, unix)}`, { cause: err }));
    };
    server.once('error', onError);
    const onListening = (): void => {
      server.off('error', onError);
      resolve();
    };
    if (unix !== undefined) server.listen(unix, onListening);
    // No host: Node listens on `::` (dual-stack) or, without IPv6, on 0.0.0.0.
    else if (host === '') server.listen(port, onListening);
    else server.listen(port, host, onListening);
  });
  server.on('error', (err) => logger.warn(`${flag} server: ${err.message}`));
  let address = addr.text;
  if (unix === undefined) {
    const a = server.address() as AddressInfo;
    const h = host === '' ? a.address : host;
    address = `${h.includes(':') ? `[${h}]` : h}:${a.port}`;
  }
  const where = unix !== undefined ? address : `http://${address}${host === '' ? ' (every interface)' : ''}`;
  logger.info(`serving ${paths} on ${where}`);
  return {
    address,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

/**
 * Removes `path` when it is a socket file no process listens on (one killed
 * before it could remove it, SIGKILL or the OOM killer): else every restart
 * would fail with EADDRINUSE. A socket that answers, or any other file, stays.
 */
async function removeStaleSocket(path: string): Promise<boolean> {
  const st = await lstat(path).catch(() => undefined);
  if (!st?.isSocket()) return false;
  const refused = await new Promise<boolean>((resolve) => {
    const c = connect(path);
    c.once('connect', () => {
      c.destroy();
      resolve(false);
    });
    c.once('error', (err: NodeJS.ErrnoException) => resolve(err.code === 'ECONNREFUSED'));
    // No answer either way (a listener whose backlog is full): someone's, leave it.
    c.setTimeout(1000, () => {
      c.destroy();
      resolve(false);
    });
  });
  return refused && unlink(path).then(() => true, () => false);
}
