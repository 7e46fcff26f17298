/**
 * Golden compatibility: each fixtures/compat case goes through a real gRPC
 * server into the kpng source; the states pushed, printed one after the
 * other as kpng-json does, must equal the hand-written expected bytes.
 */
import t from 'tap';
import { createKpngSource } from '../src/sources/kpng.js';
import { KpngTestServer } from './helpers/kpng-server.js';
import { compatCase, compatCases } from './helpers/fixtures.js';
import { captureLog, recordingSink } from './helpers/sink.js';
import { within } from './helpers/wait.js';

const cases = compatCases();

t.ok(cases.length >= 10, `found ${cases.length} cases`);

for (const name of cases) {
  t.test(name, async (t) => {
    const { revisions, expected } = compatCase(name);
    const server = await new KpngTestServer({ revisions }).start();
    const sink = recordingSink();
    const log = captureLog();
    const ac = new AbortController();
    const run = createKpngSource({ api: server.address, nodeName: 'node-1', errorDelayMs: 10, logger: log.logger }).run(sink, ac.signal);
    t.teardown(async () => {
      ac.abort();
      await within(run, 'stopping');
      await server.close();
    });
    await sink.waitForStates(revisions.length);
    const got = Buffer.concat(sink.states.flatMap((s) => s.lines as Buffer[]));
    if (!got.equals(expected)) {
      // Show the first differing line, bytes escaped, for a readable failure.
      const g = got.toString('utf8').split('\n');
      const e = expected.toString('utf8').split('\n');
      const i = g.findIndex((l, k) => l !== e[k]);
      t.equal(JSON.stringify(g[i]), JSON.stringify(e[i]), `line ${i + 1} differs`);
    }
    t.ok(got.equals(expected), 'byte-identical output');
    t.same(log.matching(/warn|error/), [], 'nothing to warn about');
  });
}
