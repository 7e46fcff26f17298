/**
 * A real localv1 gRPC server on 127.0.0.1 for tests: it answers each
 * `WatchReq` (on any stream) with the next scripted revision, records the
 * NodeName it received, can be killed and restarted on the same port, can
 * send raw bytes, and can serve TLS.
 *
 * A revision is a list of ops; the server sends them and then a Sync, unless
 * the list already ends with `sync` or with a terminal op (`fail`, `stall`).
 * When no revision is queued, a request waits until `push()` gives one.
 *
 * Standalone (manual runs, benchmarks), serving a fixtures/compat ops file:
 *   node --import=@tapjs/typescript/import test/helpers/kpng-server.ts \
 *     --ops fixtures/compat/grouping.ops.json [--port 12090] \
 *     [--tls-key K --tls-crt C [--tls-ca CA --require-client-cert]]
 * It prints `listening on 127.0.0.1:PORT`, logs each WatchReq on stderr and
 * runs until SIGINT/SIGTERM.
 */
import { EventEmitter, once } from 'node:events';
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import * as grpc from '@grpc/grpc-js';
import type { Test } from 'tap';
import { marshalEndpoint, marshalOpItem, marshalService, unmarshalWatchReq, type WatchReq } from '../../src/codec.js';
import type { Endpoint, Service } from '../../src/model.js';

/** `services` (1), `endpoints` (2) or any number (unknown sets). */
export type SetKind = 'services' | 'endpoints' | number;

/** One scripted op. Values are model objects, encoded by our codec. */
export type ServerOp =
  | { op: 'sync' }
  | { op: 'reset' }
  /** `bytes` (raw Value bytes) wins over `value`. */
  | { op: 'set'; set: SetKind; path: string; value?: Service | Endpoint; bytes?: Uint8Array }
  | { op: 'delete'; set: SetKind; path: string }
  /** Sent as one OpItem message, as is (may be undecodable). */
  | { op: 'raw'; bytes: Uint8Array }
  /** Ends the stream with this status (default UNAVAILABLE); OK ends it cleanly. */
  | { op: 'fail'; code?: grpc.status; details?: string }
  /** Sends nothing more on this stream (a server stuck mid-diff). */
  | { op: 'stall' };

export type Revision = ServerOp[];

export interface ServerTls {
  key: Buffer;
  cert: Buffer;
  /** CA that verifies client certificates (mutual TLS). */
  ca?: Buffer;
  /** Reject clients without a certificate signed by `ca`. */
  requireClientCert?: boolean;
}

export interface KpngTestServerOptions {
  revisions?: Revision[];
  tls?: ServerTls;
  /** Port to bind (0 = any free one). */
  port?: number;
}

/** A received WatchReq. */
export interface RecordedRequest extends WatchReq {
  /** Which stream (1 = first one opened on this server object). */
  stream: number;
}

function setNumber(set: SetKind): number {
  return set === 'services' ? 1 : set === 'endpoints' ? 2 : set;
}

/** Encodes one scripted op as OpItem bytes (not for terminal ops). */
export function encodeOp(op: ServerOp): Buffer {
  switch (op.op) {
    case 'sync':
      return Buffer.from(marshalOpItem({ Sync: {} }));
    case 'reset':
      return Buffer.from(marshalOpItem({ Reset: {} }));
    case 'set': {
      const set = setNumber(op.set);
      const bytes =
        op.bytes ?? (op.value === undefined ? new Uint8Array() : set === 1 ? marshalService(op.value as Service) : marshalEndpoint(op.value as Endpoint));
      return Buffer.from(marshalOpItem({ Set: { Ref: { Set: set, Path: op.path }, Bytes: bytes } }));
    }
    case 'delete':
      return Buffer.from(marshalOpItem({ Delete: { Set: setNumber(op.set), Path: op.path } }));
    case 'raw':
      return Buffer.from(op.bytes);
    default:
      throw new Error(`op ${op.op} is not a message`);
  }
}

type Call = grpc.ServerDuplexStream<WatchReq, Buffer>;

export class KpngTestServer extends EventEmitter {
  /** Every WatchReq received, in order. */
  readonly requests: RecordedRequest[] = [];
  /** Revisions not yet sent. */
  readonly queue: Revision[];
  /** Streams opened so far (over restarts too). */
  streams = 0;
  port = 0;
  private server: grpc.Server | undefined;
  private readonly tls: ServerTls | undefined;
  private readonly waiting: Array<{ call: Call; stream: number }> = [];
  private readonly calls = new Set<Call>();

  constructor(options: KpngTestServerOptions = {}) {
    super();
    this.queue = [...(options.revisions ?? [])];
    this.tls = options.tls;
    this.port = options.port ?? 0;
  }

  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  /** Binds (the same port again after a kill). */
  async start(): Promise<this> {
    const server = new grpc.Server();
    server.addService(
      {
        Watch: {
          path: '/localv1.Sets/Watch',
          requestStream: true,
          responseStream: true,
          requestSerialize: () => Buffer.alloc(0),
          requestDeserialize: (b: Buffer) => unmarshalWatchReq(b),
          // Ops are encoded up front so that raw bytes can be sent too.
          responseSerialize: (b: Buffer) => b,
          responseDeserialize: (b: Buffer) => b,
        },
      } as grpc.ServiceDefinition,
      { Watch: (call: Call) => this.onCall(call) },
    );
    const creds = this.tls
      ? grpc.ServerCredentials.createSsl(this.tls.ca ?? null, [{ private_key: this.tls.key, cert_chain: this.tls.cert }], this.tls.requireClientCert ?? false)
      : grpc.ServerCredentials.createInsecure();
    this.port = await new Promise<number>((resolve, reject) =>
      server.bindAsync(`127.0.0.1:${this.port}`, creds, (err, port) => (err ? reject(err) : resolve(port))),
    );
    this.server = server;
    return this;
  }

  /** Queues a revision; answers a waiting request at once. */
  push(...revisions: Revision[]): void {
    this.queue.push(...revisions);
    while (this.queue.length > 0 && this.waiting.length > 0) {
      const w = this.waiting.shift()!;
      if (this.calls.has(w.call)) this.send(w.call, this.queue.shift()!);
    }
  }

  /** Resolves when `n` requests in total have been received. */
  async waitForRequests(n: number): Promise<RecordedRequest> {
    while (this.requests.length < n) await once(this, 'request');
    return this.requests[n - 1]!;
  }

  /** Resolves when `n` streams in total have been opened. */
  async waitForStreams(n: number): Promise<void> {
    while (this.streams < n) await once(this, 'stream');
  }

  /** Resolves when no client stream is open. */
  async waitForNoCalls(): Promise<void> {
    while (this.calls.size > 0) await once(this, 'call-closed');
  }

  /** Drops the server and every stream at once (the client sees an error). */
  async kill(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    this.waiting.length = 0;
    if (!server) return;
    server.forceShutdown();
    this.calls.clear();
  }

  async restart(): Promise<this> {
    await this.kill();
    return this.start();
  }

  async close(): Promise<void> {
    await this.kill();
  }

  private onCall(call: Call): void {
    const stream = ++this.streams;
    this.calls.add(call);
    this.emit('stream', stream);
    const closed = (): void => {
      if (this.calls.delete(call)) this.emit('call-closed', stream);
    };
    call.on('cancelled', closed);
    call.on('end', closed);
    call.on('error', closed);
    call.on('data', (req: WatchReq) => {
      this.requests.push({ ...req, stream });
      this.emit('request', this.requests[this.requests.length - 1]);
      const next = this.queue.shift();
      if (next) this.send(call, next);
      else this.waiting.push({ call, stream });
    });
  }

  private send(call: Call, revision: Revision): void {
    for (const op of revision) {
      if (op.op === 'stall') return;
      if (op.op === 'fail') {
        const code = op.code ?? grpc.status.UNAVAILABLE;
        if (code === grpc.status.OK) call.end();
        // grpc-js turns an 'error' on a server stream into the call's status.
        else call.emit('error', Object.assign(new Error(op.details ?? 'scripted failure'), { code, details: op.details ?? 'scripted failure' }));
        return;
      }
      call.write(encodeOp(op));
    }
    if (revision[revision.length - 1]?.op !== 'sync') call.write(encodeOp({ op: 'sync' }));
  }
}

/** Starts a server (helper for the common case). */
export function startKpngServer(options: KpngTestServerOptions = {}): Promise<KpngTestServer> {
  return new KpngTestServer(options).start();
}

/** Starts a server scripted with `revisions` (TLS when `tls`), closed at `t`'s teardown. */
export async function serve(t: Pick<Test, 'teardown'>, revisions: Revision[] = [], tls?: ServerTls): Promise<KpngTestServer> {
  const server = await startKpngServer({ revisions, ...(tls ? { tls } : {}) });
  t.teardown(() => server.close());
  return server;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      ops: { type: 'string' },
      port: { type: 'string', default: '0' },
      'tls-key': { type: 'string' },
      'tls-crt': { type: 'string' },
      'tls-ca': { type: 'string' },
      'require-client-cert': { type: 'boolean', default: false },
    },
  });
  const revisions = values.ops ? (JSON.parse(readFileSync(values.ops, 'utf8')) as { revisions: Revision[] }).revisions : [];
  const key = values['tls-key'];
  const crt = values['tls-crt'];
  const tls: ServerTls | undefined =
    key && crt
      ? {
          key: readFileSync(key),
          cert: readFileSync(crt),
          ...(values['tls-ca'] ? { ca: readFileSync(values['tls-ca']) } : {}),
          requireClientCert: values['require-client-cert'],
        }
      : undefined;
  const server = await new KpngTestServer({ revisions, port: Number(values.port), ...(tls ? { tls } : {}) }).start();
  server.on('request', (r: RecordedRequest) => process.stderr.write(`WatchReq stream=${r.stream} NodeName=${JSON.stringify(r.NodeName)}\n`));
  process.stdout.write(`listening on ${server.address}\n`);
  const stop = (): void => void server.close();
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
