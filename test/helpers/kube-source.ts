/**
 * The kube source's test harness: the source against a list/watch server on
 * loopback (test/helpers/kube-api-server.ts) into a recording sink, and
 * readers of the states it pushes (lines, names, endpoints; waiting for a
 * state or for the watches).
 */
import type { Test } from 'tap';
import { createKubeSource, loadKubeConfig, type KubeSourceOptions } from '../../src/sources/kube.js';
import { stateText, type State } from '../../src/state.js';
import { KubeApiServer, type KObject } from './kube-api-server.js';
import { captureLog, recordingSink, type RecordingSink } from './sink.js';
import { within } from './wait.js';

export interface Line {
  Service: { Namespace: string; Name: string; [k: string]: unknown };
  Endpoints: Array<{ IPs?: { V4?: string[]; V6?: string[] }; Local?: boolean; Scopes?: { Internal?: boolean; External?: boolean }; [k: string]: unknown }> | null;
}

export const lines = (s: State): Line[] =>
  stateText(s)
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as Line);

export const names = (s: State): string[] => lines(s).map((l) => `${l.Service.Namespace}/${l.Service.Name}`);

/** `ip[:L][:I][:E]` per endpoint of service `name` (L = Local, I/E = scopes). */
export function eps(s: State, name: string): string[] {
  const line = lines(s).find((l) => l.Service.Name === name);
  if (!line) return ['(no service)'];
  return (line.Endpoints ?? [])
    .map((e) => [...(e.IPs?.V4 ?? []), ...(e.IPs?.V6 ?? [])].join(',') + (e.Local ? ':L' : '') + (e.Scopes?.Internal ? ':I' : '') + (e.Scopes?.External ? ':E' : ''))
    .sort();
}

/** Resolves with the first pushed state (past or future) for which `pred` holds on the newest state. */
export async function until(sink: RecordingSink, pred: (s: State) => boolean, what = 'a matching state'): Promise<State> {
  for (let n = Math.max(1, sink.states.length); ; n++) {
    const s = await within(sink.waitForStates(n), `waiting for ${what}`);
    if (n === sink.states.length && pred(s)) return s;
  }
}

/** Resolves once `n` watches are open. */
export async function watching(srv: KubeApiServer, n = 3): Promise<void> {
  if (srv.watchCount() < n) await within(srv.waitForRequest(() => srv.watchCount() >= n), `${n} watches`);
}

export interface Setup {
  srv: KubeApiServer;
  sink: RecordingSink;
  log: ReturnType<typeof captureLog>;
  done: Promise<void>;
}

/**
 * A kube source for node `nodeName` (default node-a) against a list/watch
 * server on loopback holding `objects`, into a recording sink, its log
 * captured; stopped, and the server closed, at the end of t.
 */
export async function setup(
  t: Test,
  o: { objects?: Array<['services' | 'endpointslices' | 'nodes', KObject]>; srv?: KubeApiServer; listen?: boolean; kubeconfig?: string } & Partial<KubeSourceOptions> = {},
): Promise<Setup> {
  const srv = o.srv ?? new KubeApiServer();
  for (const [r, obj] of o.objects ?? []) srv.add(r, obj);
  if (o.listen !== false) await srv.listen();
  const { kubeConfig } = loadKubeConfig({ kubeconfig: o.kubeconfig ?? srv.writeKubeconfig(), env: {} });
  const sink = recordingSink();
  const log = captureLog();
  const ac = new AbortController();
  const source = createKubeSource({
    kubeConfig,
    nodeName: o.nodeName ?? 'node-a',
    serviceProxyName: o.serviceProxyName,
    logger: log.logger,
    backoff: { minMs: 20, maxMs: 200 },
    watchTimeoutSeconds: o.watchTimeoutSeconds,
    once: o.once,
    now: o.now,
  });
  const done = source.run(sink, ac.signal);
  t.teardown(async () => {
    ac.abort();
    await done;
    await srv.close();
  });
  return { srv, sink, log, done };
}
