/**
 * Golden compatibility: each fixtures/compat case goes through a real gRPC
 * server into the kpng source; the states pushed, printed one after the
 * other as kpng-json does, must equal the hand-written expected bytes.
 */
import { readdirSync, readFileSync } from 'node:fs';
import t from 'tap';
import { createKpngSource } from '../src/sources/kpng.js';
import { KpngTestServer, type Revision } from './helpers/kpng-server.js';
import { captureLog, recordingSink, within } from './helpers/sink.js';

const dir = new URL('../fixtures/compat/', import.meta.url);
const cases = readdirSync(dir)
  .filter((f) => f.endsWith('.ops.json'))
  .map((f) => f.slice(0, -'.ops.json'.length))
  .sort();

t.ok(cases.length >= 10, `found ${cases.length} cases`);

for (const name of cases) {
  t.test(name, async (t) => {
    const ops = JSON.parse(readFileSync(new URL(`${name}.ops.json`, dir), 'utf8')) as { revisions: Revision[] };
    const expected = readFileSync(new URL(`${name}.expected.jsonl`, dir));
    const server = await new KpngTestServer({ revisions: ops.revisions }).start();
    const sink = recordingSink();
    const log = captureLog();
    const ac = new AbortController();
    const run = createKpngSource({ api: server.address, nodeName: 'node-1', errorDelayMs: 10, logger: log.logger }).run(sink, ac.signal);
    t.teardown(async () => {
      ac.abort();
      await within(run, 'stopping');
      await server.close();
    });
    await sink.waitForStates(ops.revisions.length);
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
