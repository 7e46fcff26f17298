/**
 * The replay source on real files: directory order, several paths, stdin,
 * one push at a time (each awaited), fail-fast on bad input, and --watch
 * (fixture edits, broken fixtures keeping the last good state, new files,
 * the callout file) with chokidar on a temporary directory.
 */
import { EventEmitter, once } from 'node:events';
import { mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import t, { type Test } from 'tap';
import { CalloutError } from '../../src/errors.js';
import { createReplaySource, checkReplayPaths, type ReplayOptions } from '../../src/sources/replay.js';
import type { StateSink } from '../../src/source.js';
import { stateText, type State } from '../../src/state.js';
import { captureLog, within } from '../helpers/sink.js';

const blogJsonl = readFileSync(new URL('../../fixtures/kpng-example.jsonl', import.meta.url), 'utf8');
const blogYaml = readFileSync(new URL('../../fixtures/kpng-example.yaml', import.meta.url), 'utf8');

/** A one-service state whose service is named `name` (its own line). */
const item = (name: string) => `{"Service":{"Namespace":"default","Name":"${name}","Type":"ClusterIP","SessionAffinity":null},"Endpoints":null}\n`;

function tmp(t: Test): string {
  const dir = mkdtempSync(join(tmpdir(), 'replay-test-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** A sink whose pushes settle only when the test calls `finish()` (or at once with `auto`). */
function gatedSink(auto = false) {
  const ee = new EventEmitter();
  const texts: string[] = [];
  const gates: Array<() => void> = [];
  let inFlight = 0;
  let maxInFlight = 0;
  const sink: StateSink = {
    push(state: State) {
      texts.push(stateText(state));
      inFlight++;
      maxInFlight = Math.max(maxInFlight, inFlight);
      ee.emit('push');
      return new Promise<void>((res) => {
        const done = () => {
          inFlight--;
          res();
        };
        if (auto) setImmediate(done);
        else gates.push(done);
      });
    },
  };
  return {
    sink,
    texts,
    get maxInFlight() {
      return maxInFlight;
    },
    finish() {
      gates.shift()?.();
    },
    async waitFor(n: number) {
      while (texts.length < n) await within(once(ee, 'push'), `waiting for push #${n} (have ${texts.length}: ${texts.join('|')})`);
      return texts[n - 1]!;
    },
  };
}

const opts = (paths: string[], extra: Partial<ReplayOptions> = {}): ReplayOptions => ({ paths, nodeName: 'vm-002', serviceProxyName: 'kpng-example', ...extra });

t.test('a directory: its fixture files in name order; others skipped', async (t) => {
  const dir = tmp(t);
  writeFileSync(join(dir, 'b.yaml'), blogYaml);
  writeFileSync(join(dir, 'a.jsonl'), item('a'));
  writeFileSync(join(dir, 'C.json'), `[${item('C').trim()}]`);
  writeFileSync(join(dir, 'c.ndjson'), item('c'));
  writeFileSync(join(dir, 'd.yml'), blogYaml);
  writeFileSync(join(dir, 'README.md'), '# not a fixture');
  writeFileSync(join(dir, '.hidden.yaml'), 'broken: [');
  mkdirSync(join(dir, 'sub.yaml'));
  const s = gatedSink(true);
  await createReplaySource(opts([dir])).run(s.sink, new AbortController().signal);
  t.same(s.texts, [item('C'), item('a'), blogJsonl, item('c'), blogJsonl]);
});

t.test('several paths run in the order given, each push awaited before the next', async (t) => {
  const dir = tmp(t);
  const sub = join(dir, 'states');
  mkdirSync(sub);
  writeFileSync(join(sub, '2.jsonl'), item('two'));
  writeFileSync(join(sub, '1.jsonl'), item('one'));
  writeFileSync(join(dir, 'z.jsonl'), item('z'));
  writeFileSync(join(dir, 'blog.yaml'), blogYaml);
  const s = gatedSink();
  const done = createReplaySource(opts([join(dir, 'z.jsonl'), sub, join(dir, 'blog.yaml')])).run(s.sink, new AbortController().signal);
  for (const [i, want] of [item('z'), item('one'), item('two'), blogJsonl].entries()) {
    t.equal(await s.waitFor(i + 1), want);
    t.equal(s.texts.length, i + 1, 'nothing more before this run finished');
    s.finish();
  }
  await within(done, 'the source to finish');
  t.equal(s.maxInFlight, 1);
});

t.test('stdin (-), --once, and path checks', async (t) => {
  const s = gatedSink(true);
  await createReplaySource(opts(['-'], { stdin: Readable.from([Buffer.from(blogYaml.slice(0, 100)), Buffer.from(blogYaml.slice(100))]) })).run(s.sink, new AbortController().signal);
  t.same(s.texts, [blogJsonl], 'stdin is sniffed (YAML)');
  const s2 = gatedSink(true);
  await createReplaySource(opts(['-'], { stdin: Readable.from([item('x') + item('y')]) })).run(s2.sink, new AbortController().signal);
  t.same(s2.texts, [item('x') + item('y')], 'stdin NDJSON');
  const dir = tmp(t);
  writeFileSync(join(dir, 'a.jsonl'), item('a'));
  writeFileSync(join(dir, 'b.jsonl'), item('b'));
  const s3 = gatedSink(true);
  await createReplaySource(opts([dir], { once: true })).run(s3.sink, new AbortController().signal);
  t.same(s3.texts, [item('a')], '--once: the first state only');
  t.equal(checkReplayPaths([], false), 'replay needs at least one path');
  t.equal(checkReplayPaths(['-', '-'], false), '- (stdin) can be given only once');
  t.equal(checkReplayPaths(['-'], true), '--watch cannot watch - (stdin)');
  t.equal(checkReplayPaths(['a', '-'], false), undefined);
});

t.test('bad input fails before anything runs, naming file, line, column', async (t) => {
  const dir = tmp(t);
  writeFileSync(join(dir, '1.jsonl'), item('a'));
  writeFileSync(join(dir, '2.yaml'), 'apiVersion: v1\nkind: Service\nmetadata:\n  name: [x\n');
  const s = gatedSink(true);
  await t.rejects(createReplaySource(opts([dir])).run(s.sink, new AbortController().signal), {
    name: 'CalloutError',
    code: 'input',
    message: `${join(dir, '2.yaml')}:5:1: Flow sequence in block collection must be sufficiently indented and end with a ]`,
  });
  t.same(s.texts, [], 'nothing pushed');
  await t.rejects(createReplaySource(opts([join(dir, 'nope.yaml')])).run(s.sink, new AbortController().signal), new CalloutError('input', `${join(dir, 'nope.yaml')}: no such file or directory`));
  const empty = join(dir, 'empty');
  mkdirSync(empty);
  await t.rejects(createReplaySource(opts([empty])).run(s.sink, new AbortController().signal), {
    message: `${empty}: no fixture files (*.jsonl, *.ndjson, *.json, *.yaml, *.yml) in this directory`,
  });
});

t.test('--watch: edits re-run, a broken fixture keeps the last good state, new files and the callout re-run', async (t) => {
  const dir = tmp(t);
  const fx = join(dir, 'fixtures');
  mkdirSync(fx);
  writeFileSync(join(fx, 'a.jsonl'), item('a1'));
  writeFileSync(join(fx, 'b.jsonl'), item('b1'));
  const callout = join(dir, 'callout.sh');
  writeFileSync(callout, '#!/bin/sh\ncat\n');
  const log = captureLog();
  const s = gatedSink(true);
  const ac = new AbortController();
  const done = createReplaySource(opts([fx], { watch: true, watchExtra: [callout], debounceMs: 20, logger: log.logger })).run(s.sink, ac.signal);
  t.teardown(() => ac.abort());
  t.equal(await s.waitFor(1), item('a1'));
  t.equal(await s.waitFor(2), item('b1'));
  await log.waitFor(/watching .* for changes/);

  writeFileSync(join(fx, 'a.jsonl'), item('a2'));
  t.equal(await s.waitFor(3), item('a2'), 'an edit re-runs that fixture');

  writeFileSync(join(fx, 'a.jsonl'), item('a3').replace('"Name"', '"Nmae"'));
  const err = await log.waitFor(/error/);
  t.equal(
    err,
    `kpng-callout error: ${join(fx, 'a.jsonl')}:1:42: Service.Nmae: unknown field "Nmae" (expected one of Namespace, Name, Type, Labels, Annotations, IPs, IPFilters, MapIP, Ports, ExternalTrafficToLocal, SessionAffinity, InternalTrafficToLocal, HealthCheckNodePort) (keeping its last good state)`,
  );
  writeFileSync(join(fx, 'a.jsonl'), item('a3').replace('"Name"', '"Nmae"')); // same error: not reported again
  writeFileSync(callout, '#!/bin/sh\ncat >/dev/null\n');
  t.equal(await s.waitFor(4), item('a2'), 'the callout changed: the last good state runs again');

  writeFileSync(join(fx, 'a.jsonl'), item('a4'));
  t.equal(await s.waitFor(5), item('a4'), 'fixed: runs again');
  t.equal(log.matching(/error/).length, 1, 'the broken fixture was reported once');

  writeFileSync(join(fx, 'c.yaml'), blogYaml);
  t.equal(await s.waitFor(6), blogJsonl, 'a new file in the directory runs');
  writeFileSync(join(fx, 'notes.txt'), 'ignored');
  writeFileSync(join(fx, 'b.jsonl'), item('b1')); // same content: no run
  writeFileSync(join(fx, 'b.jsonl'), item('b2'));
  t.equal(await s.waitFor(7), item('b2'));
  // An editor's atomic save: write a temporary file, rename it over the fixture.
  writeFileSync(join(dir, 'b.tmp'), item('b3'));
  renameSync(join(dir, 'b.tmp'), join(fx, 'b.jsonl'));
  t.equal(await s.waitFor(8), item('b3'), 'replaced by rename');
  t.equal(s.texts.length, 8);
  ac.abort();
  await within(done, 'the watcher to stop');
});
