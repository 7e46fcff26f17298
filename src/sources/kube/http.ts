/**
 * GET requests to the Kubernetes API server over node:http/node:https: one
 * keep-alive agent per client (lists reuse connections; each watch holds
 * its own), the TLS options and credentials of auth.ts on every request, a
 * 401 answered by refreshing an exec or file token and retrying once, and
 * the two ways a body is read: a list page as one JSON value, a watch as
 * newline-delimited JSON events handed over line by line as they arrive.
 *
 * Hand-written rather than the client library's API classes and Watch: those
 * come with its generated models (~0.5 s and ~70 MB RSS to import, measured)
 * and turn every listed object into a typed model instance; we need the
 * plain JSON, one page at a time.
 *
 * Errors keep the shapes failures.ts words: an {@link ApiError} (`statusCode`,
 * the Status `body`) for an HTTP status, Node's network errors (`code`
 * ECONNREFUSED...) before a response, and `code` ERR_STREAM_PREMATURE_CLOSE
 * when a response is cut (a dropped watch: "connection lost"), {@link NO_ANSWER}
 * when a connected server sends nothing within the request timeout.
 */
import http from 'node:http';
import https from 'node:https';
import { finished, pipeline, type Readable } from 'node:stream';
import { StringDecoder } from 'node:string_decoder';
import { createGunzip } from 'node:zlib';
import type { Credentials } from './auth.js';
import { NO_ANSWER } from './failures.js';

/** Longest silence before a response's headers (and within a list body): the request is abandoned (ms). */
const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;
/** Error bodies are kept up to this size (a Status is small). */
const MAX_ERROR_BODY = 64 * 1024;

/** An HTTP status other than 200, with the body the server sent (a Status object, as text). */
export class ApiError extends Error {
  constructor(
    readonly statusCode: number,
    readonly body: string,
    statusMessage: string | undefined,
  ) {
    super(statusMessage || `HTTP ${statusCode}`);
    this.name = 'ApiError';
  }
}

/** The error of a response cut before its end. */
function cutShort(cause: unknown): Error {
  return Object.assign(new Error('the connection was closed before the response ended', { cause }), { code: 'ERR_STREAM_PREMATURE_CLOSE' });
}

/** Options of {@link ApiClient}. */
export interface ApiClientOptions {
  /** The API server's URL (`https://host:port`, maybe with a path prefix). */
  server: string;
  /** The credentials (resolved on the first request: it may import the full library). */
  credentials: Promise<Credentials>;
  /** Longest silence before a response's headers, and within a list body (ms). Default 60 s. */
  requestTimeoutMs?: number | undefined;
}

/** What is asked: `stream` for a watch (silence allowed, no compression), else a list page. */
export interface RequestKind {
  signal: AbortSignal;
  stream: boolean;
}

/** A response of status 200: its body (gunzipped when compressed). */
export interface ApiResponse {
  body: Readable;
}

/** Requests to one API server; see the module comment. */
export class ApiClient {
  /** The server's URL, or why it is not one (each request then fails with it). */
  private readonly base: URL | Error;
  private readonly agent: http.Agent;
  private readonly timeoutMs: number;

  constructor(private readonly options: ApiClientOptions) {
    this.base = serverUrl(options.server);
    const Agent = !(this.base instanceof Error) && this.base.protocol === 'http:' ? http.Agent : https.Agent;
    this.agent = new Agent({ keepAlive: true });
    this.timeoutMs = options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
  }

  /** Closes idle connections (open requests are ended by their signals). */
  close(): void {
    this.agent.destroy();
  }

  /**
   * GET `path` with `query` (undefined values left out). Resolves with the
   * response of a 200; rejects with an ApiError for another status (after one
   * retry with refreshed credentials for a 401), or with the network error.
   */
  async get(path: string, query: Record<string, string | number | undefined>, o: RequestKind): Promise<ApiResponse> {
    const base = this.base;
    if (base instanceof Error) throw base;
    const url = new URL(base.pathname.replace(/\/$/, '') + path, base);
    for (const [k, v] of Object.entries(query)) if (v !== undefined) url.searchParams.set(k, String(v));
    const credentials = await this.options.credentials;
    for (let retried = false; ; retried = true) {
      const res = await this.requestFresh(url, credentials, o);
      if (res.statusCode === 200) return { body: decoded(res) };
      const body = await readCapped(decoded(res), MAX_ERROR_BODY).catch(() => '');
      if (res.statusCode === 401 && !retried && credentials.refresh()) continue;
      throw new ApiError(res.statusCode ?? 0, body, res.statusMessage);
    }
  }

  /**
   * {@link request}, made once more when it failed on a kept-alive connection
   * the server had closed meanwhile (ECONNRESET/EPIPE before any answer on a
   * reused socket: a server that closes after a response without
   * `Connection: close`, an idle timeout racing the reuse). A GET is
   * idempotent; Go's transport (client-go) retries these too.
   */
  private async requestFresh(url: URL, credentials: Credentials, o: RequestKind): Promise<http.IncomingMessage> {
    try {
      return await this.request(url, credentials, o);
    } catch (err) {
      const code = (err as { code?: unknown }).code;
      if (!(err as { reusedSocket?: boolean }).reusedSocket || (code !== 'ECONNRESET' && code !== 'EPIPE') || o.signal.aborted) throw err;
      return this.request(url, credentials, o);
    }
  }

  private async request(url: URL, credentials: Credentials, o: RequestKind): Promise<http.IncomingMessage> {
    const auth = await credentials.forRequest();
    o.signal.throwIfAborted();
    const send = url.protocol === 'http:' ? http.request : https.request;
    return new Promise((resolve, reject) => {
      const req = send(url, {
        method: 'GET',
        agent: auth.agent ?? this.agent,
        ...auth.tls,
        ...(auth.auth !== undefined ? { auth: auth.auth } : {}),
        // Lists may come compressed (the API server compresses large ones when asked); watches never are.
        headers: { Accept: 'application/json', ...(o.stream ? {} : { 'Accept-Encoding': 'gzip' }), ...auth.headers },
        signal: o.signal,
      });
      req.setTimeout(this.timeoutMs, () => {
        // Connected, yet silent (an overloaded API server, APF queueing) is not "cannot reach".
        const connected = req.socket !== null && !req.socket.connecting;
        const err = connected
          ? Object.assign(new Error(`the API server accepted the connection but sent no answer in ${this.timeoutMs / 1000} s`), { code: NO_ANSWER })
          : Object.assign(new Error(`no connection in ${this.timeoutMs / 1000} s`), { code: 'ETIMEDOUT' });
        req.destroy(err);
      });
      // A kept-alive connection the server closed meanwhile: said so, for requestFresh.
      const onError = (err: Error): void => reject(req.reusedSocket ? Object.assign(err, { reusedSocket: true }) : err);
      req.once('error', onError);
      req.once('response', (res) => {
        // A watch may be quiet for minutes: its silence is the idle watchdog's business.
        if (o.stream) req.setTimeout(0);
        req.removeListener('error', onError);
        // Errors after the response surface on the response: keep them from becoming uncaught.
        req.on('error', () => {});
        resolve(res);
      });
      req.end();
    });
  }
}

/**
 * Hands each chunk of a response body to `onChunk` as it arrives; resolves at
 * its end. A body cut short (or silent past the request timeout) rejects with
 * ERR_STREAM_PREMATURE_CLOSE; what `onChunk` throws ends the request and
 * rejects as it is.
 */
export async function eachChunk(body: Readable, onChunk: (chunk: Buffer) => void): Promise<void> {
  const chunks = body[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  for (;;) {
    let next: IteratorResult<Buffer>;
    try {
      next = await chunks.next();
    } catch (err) {
      throw cutShort(err);
    }
    if (next.done) return;
    try {
      onChunk(next.value);
    } catch (err) {
      body.destroy();
      throw err;
    }
  }
}

/** The server's URL (https:// when it names no scheme, as client-go), or the error saying why it is none. */
function serverUrl(server: string): URL | Error {
  try {
    const url = new URL(/^[a-z][a-z0-9+.-]*:\/\//i.test(server) ? server : `https://${server}`);
    if (url.protocol === 'http:' || url.protocol === 'https:') return url;
    return new Error(`the server ${server} is not an http:// or https:// URL`);
  } catch {
    return new Error(`the server ${server} is not a URL`);
  }
}

/** The body of `res`, gunzipped when the server compressed it; a cut response errors with ERR_STREAM_PREMATURE_CLOSE. */
function decoded(res: http.IncomingMessage): Readable {
  if (res.headers['content-encoding'] !== 'gzip') return res;
  return pipeline(res, createGunzip(), () => {});
}

/** The body as text, at most `max` bytes kept. */
async function readCapped(res: Readable, max: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of res) {
    if (size < max) chunks.push(c as Buffer);
    size += (c as Buffer).length;
  }
  return Buffer.concat(chunks).toString('utf8').slice(0, max);
}

/**
 * Calls `onLine` with each line of `body` (newline-delimited JSON events) as
 * it arrives, without the newline; blank lines are skipped. Resolves when the
 * body ends cleanly (a last line without a newline included), rejects with
 * ERR_STREAM_PREMATURE_CLOSE when it is cut, or with what `onLine` throws
 * (the body is then destroyed). `onChunk` is told of every chunk (the idle
 * watchdog).
 */
export function readLines(body: Readable, onLine: (line: string) => void, onChunk?: () => void): Promise<void> {
  const decoder = new StringDecoder('utf8');
  let pending = '';
  return new Promise<void>((resolve, reject) => {
    let failed = false;
    const lines = (text: string): void => {
      pending += text;
      let start = 0;
      for (let nl = pending.indexOf('\n'); nl >= 0; nl = pending.indexOf('\n', start)) {
        const line = pending.slice(start, nl);
        start = nl + 1;
        if (line.trim() !== '') onLine(line);
      }
      pending = pending.slice(start);
    };
    body.on('data', (chunk: Buffer) => {
      if (failed) return;
      onChunk?.();
      try {
        lines(decoder.write(chunk));
      } catch (err) {
        failed = true;
        body.destroy();
        reject(err);
      }
    });
    finished(body, (err) => {
      if (failed) return;
      if (err) return reject(cutShort(err));
      try {
        lines(decoder.end() + '\n');
        resolve();
      } catch (e) {
        reject(e);
      }
    });
  });
}
