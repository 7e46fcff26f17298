/** A prefetched list page left unread while a slow page before it is read is not cut by the request timeout. */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import t from 'tap';
import { ApiClient } from '../../../src/sources/kube/http.js';
import { addListWatch } from '../../../src/sources/kube/list-watch.js';
import { ListWatchSupervisor } from '../../../src/sources/kube/supervisor.js';
import { captureLog } from '../../helpers/sink.js';
import { pollUntil } from '../../helpers/wait.js';

t.test('page 1 read for longer than the request timeout: the prefetched page 2 is still whole', async (t) => {
  const svc = (i: number) => ({ metadata: { name: `s${i}`, namespace: 'default', resourceVersion: String(i), annotations: { pad: 'x'.repeat(1000) } }, spec: {} });
  const lists: string[] = [];
  const srv = http.createServer((req, res) => {
    const u = new URL(req.url!, 'http://x');
    if (u.searchParams.get('watch')) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.flushHeaders();
      return;
    }
    lists.push(u.searchParams.get('continue') ?? '');
    res.writeHead(200, { 'content-type': 'application/json' });
    if (!u.searchParams.get('continue')) {
      // The continue token first, then the items slowly (each piece well within the timeout, 1.5 s in all).
      const text = JSON.stringify({ metadata: { resourceVersion: '5', continue: 'tok' }, items: Array.from({ length: 20 }, (_, i) => svc(i)) });
      const step = Math.ceil(text.length / 10);
      let at = 0;
      const tick = (): void => {
        if (at >= text.length) return void res.end();
        res.write(text.slice(at, (at += step)));
        setTimeout(tick, 150);
      };
      tick();
    } else res.end(JSON.stringify({ metadata: { resourceVersion: '5' }, items: Array.from({ length: 2000 }, (_, i) => svc(100 + i)) }));
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
  const client = new ApiClient({ server: url, credentials: Promise.resolve({ via: 'built-in', forRequest: async () => ({ headers: {}, tls: {} }), refresh: () => false }), requestTimeoutMs: 600 });
  const log = captureLog();
  const supervisor = new ListWatchSupervisor({ server: url, backoff: { minMs: 10, maxMs: 40 }, logger: log.logger, onStatus: () => {} });
  let n = 0;
  addListWatch({ resource: 'services', group: '', path: '/api/v1/services', client, timeoutSeconds: () => 300, supervisor, server: url, logger: log.logger, onObject: () => void n++ });
  supervisor.start();
  t.teardown(() => {
    supervisor.stop();
    client.close();
    srv.closeAllConnections();
    srv.close();
  });
  await pollUntil(() => n >= 2020, () => `2020 objects (have ${n}; log: ${log.lines.join(' | ')})`, 8000, 20);
  t.same(lists, ['', 'tok'], 'listed once: page 1, then page 2 (prefetched)');
  t.same(log.matching(/lost/), []);
});
