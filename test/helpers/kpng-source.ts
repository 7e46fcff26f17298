/**
 * The kpng source's test harness: a real localv1 gRPC server on loopback
 * (KpngTestServer), the source running against it into a recording sink,
 * and builders of the Services, Endpoints and server ops the tests send.
 */
import type { Test } from 'tap';
import type { Endpoint, Service } from '../../src/model.js';
import { createKpngSource, type KpngSourceOptions } from '../../src/sources/kpng.js';
import { stateFromItems, stateText } from '../../src/state.js';
import { KpngTestServer, type Revision, type ServerOp } from './kpng-server.js';
import { captureLog, recordingSink, type CapturedLog, type RecordingSink } from './sink.js';
import { within } from './wait.js';

export const svc = (ns: string, name: string, extra: Service = {}): Service => ({
  Namespace: ns,
  Name: name,
  Type: 'ClusterIP',
  IPs: { ClusterIPs: { V4: ['10.96.0.1'] } },
  ...extra,
});
export const ep = (ip: string, extra: Endpoint = {}): Endpoint => ({ IPs: { V4: [ip] }, Scopes: { Internal: true, External: true }, ...extra });
export const setSvc = (s: Service): ServerOp => ({ op: 'set', set: 'services', path: `${s.Namespace}/${s.Name}`, value: s });
export const setEp = (path: string, e: Endpoint): ServerOp => ({ op: 'set', set: 'endpoints', path, value: e });

/** The text the source must push for these items (grouping done by hand). */
export const text = (...items: Array<[Service, Endpoint[]]>): string => stateText(stateFromItems(items.map(([Service, Endpoints]) => ({ Service, Endpoints }))));

export interface Harness {
  server: KpngTestServer;
  sink: RecordingSink;
  log: CapturedLog;
  run: Promise<void>;
  stop(): Promise<void>;
}

export async function start(
  t: Test,
  revisions: Revision[],
  options: Partial<KpngSourceOptions> = {},
  server?: KpngTestServer,
): Promise<Harness> {
  const srv = server ?? (await new KpngTestServer({ revisions }).start());
  const sink = recordingSink();
  const log = captureLog();
  const ac = new AbortController();
  const source = createKpngSource({ api: srv.address, nodeName: 'node-1', errorDelayMs: 10, logger: log.logger, ...options });
  const run = source.run(sink, ac.signal);
  // Surface an unexpected rejection at the point of failure, not as unhandled.
  run.catch(() => {});
  let stopped = false;
  const stop = async (): Promise<void> => {
    if (stopped) return;
    stopped = true;
    ac.abort();
    await within(run, 'waiting for run() to stop');
    await srv.close();
  };
  t.teardown(stop);
  return { server: srv, sink, log, run, stop };
}
