/**
 * The replay source on real files: directory order, several paths, stdin,
 * one push at a time (each awaited), fail-fast on bad input, and --watch
 * (fixture edits, broken fixtures keeping the last good state, new files,
 * the callout file) with chokidar on a temporary directory.
 */
import { EventEmitter, once } from 'node:events';
import { mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
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
  const states: State[] = [];
  const gates: Array<() => void> = [];
  let inFlight = 0;
  let maxInFlight = 0;
  const sink: StateSink = {
    push(state: State) {
      states.push(state);
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
    states,
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
    /** Resolves when `pred` holds, checked after every push. */
    async waitUntil(pred: () => boolean, what: string) {
      while (!pred()) await within(once(ee, 'push'), `${what} (have ${texts.length}, last ${texts.at(-1) ?? 'none'})`);
    },
  };
}

/**
 * An editor's atomic save (sed -i, vim, VS Code): a temporary file in the same
 * directory, renamed over `path`.
 */
function atomicSave(path: string, text: string): void {
  const tmpPath = join(dirname(path), `sed${Math.random().toString(36).slice(2, 8)}`);
  writeFileSync(tmpPath, text);
  renameSync(tmpPath, path);
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

const ROUNDS = 25;

t.test('--watch on a single file survives many rounds of two atomic saves milliseconds apart', async (t) => {
  const dir = tmp(t);
  const fx = join(dir, 's.jsonl');
  writeFileSync(fx, item('r0'));
  const log = captureLog();
  const s = gatedSink(true);
  const ac = new AbortController();
  const done = createReplaySource(opts([fx], { watch: true, debounceMs: 20, logger: log.logger })).run(s.sink, ac.signal);
  t.teardown(() => ac.abort());
  t.equal(await s.waitFor(1), item('r0'));
  await log.waitFor(/watching .* for changes/);
  for (let i = 1; i <= ROUNDS; i++) {
    atomicSave(fx, item(`r${i}a`));
    await sleep(i % 4); // 0-3 ms apart: the stimulus, not a wait for a result
    atomicSave(fx, item(`r${i}b`));
    // The pause before the next round is the time this run takes.
    await s.waitUntil(() => s.texts.at(-1) === item(`r${i}b`), `round ${i}: the second save runs`);
  }
  t.ok(s.texts.length <= 1 + 2 * ROUNDS, 'at most one run per save');
  ac.abort();
  await within(done, 'the watcher to stop');
});

/** A --watch replay of one fixture with a watched callout file, after its first run. */
async function watchWithCallout(t: Test) {
  const dir = tmp(t);
  const fx = join(dir, 's.jsonl');
  writeFileSync(fx, item('x'));
  const callout = join(dir, 'callout.sh');
  writeFileSync(callout, '#!/bin/sh\n# 0\n');
  const log = captureLog();
  const s = gatedSink(true);
  const ac = new AbortController();
  const done = createReplaySource(opts([fx], { watch: true, watchExtra: [callout], debounceMs: 20, logger: log.logger })).run(s.sink, ac.signal);
  t.teardown(() => ac.abort());
  await s.waitFor(1);
  await log.waitFor(/watching .* for changes/);
  return { fx, callout, log, s, ac, done };
}

t.test('--watch on the callout file survives many rounds of two atomic saves milliseconds apart', async (t) => {
  const { callout, s, ac, done } = await watchWithCallout(t);
  for (let i = 1; i <= ROUNDS; i++) {
    // The first save writes the content already in force (no run when read alone), the second a new one:
    // exactly one run per round, and only if the second save is seen.
    atomicSave(callout, `#!/bin/sh\n# ${i - 1}\n`);
    await sleep(i % 4);
    atomicSave(callout, `#!/bin/sh\n# ${i}\n`);
    t.equal(await s.waitFor(1 + i), item('x'), `round ${i}: the last state runs again`);
  }
  ac.abort();
  await within(done, 'the watcher to stop');
  t.equal(s.texts.length, 1 + ROUNDS, 'one run per round');
});

t.test('--watch: a callout deleted and recreated is still watched', async (t) => {
  const { fx, callout, log, s, ac, done } = await watchWithCallout(t);
  unlinkSync(callout);
  await log.waitFor(new RegExp(`watch: unlink ${callout}`));
  writeFileSync(callout, '#!/bin/sh\n# 1\n');
  await s.waitFor(2);
  writeFileSync(callout, '#!/bin/sh\n# 2\n');
  await s.waitFor(3);
  atomicSave(callout, '#!/bin/sh\n# 3\n');
  await s.waitFor(4);
  // Deleted and recreated at once (rm; cat > callout).
  unlinkSync(callout);
  writeFileSync(callout, '#!/bin/sh\n# 4\n');
  await s.waitFor(5);
  writeFileSync(callout, '#!/bin/sh\n# 5\n');
  await s.waitFor(6);
  // The fixture is still watched too.
  atomicSave(fx, item('y'));
  t.equal(await s.waitFor(7), item('y'));
  ac.abort();
  await within(done, 'the watcher to stop');
  t.equal(s.texts.length, 7);
});

t.test('--watch with polling (network file systems): edits, atomic saves, the callout', async (t) => {
  const dir = tmp(t);
  const fx = join(dir, 's.jsonl');
  writeFileSync(fx, item('p0'));
  const callout = join(dir, 'callout.sh');
  writeFileSync(callout, '#!/bin/sh\n# 0\n');
  const log = captureLog();
  const s = gatedSink(true);
  const ac = new AbortController();
  const done = createReplaySource(opts([fx], { watch: true, watchExtra: [callout], debounceMs: 20, usePolling: true, pollIntervalMs: 50, logger: log.logger })).run(
    s.sink,
    ac.signal,
  );
  t.teardown(() => ac.abort());
  t.equal(await s.waitFor(1), item('p0'));
  await log.waitFor(/watching .* for changes \(polling every 50 ms\)$/);
  writeFileSync(fx, item('p1'));
  t.equal(await s.waitFor(2), item('p1'), 'an in-place edit');
  for (let i = 2; i <= 6; i++) {
    atomicSave(fx, item(`p${i}a`));
    atomicSave(fx, item(`p${i}`));
    await s.waitUntil(() => s.texts.at(-1) === item(`p${i}`), `polling round ${i}`);
  }
  const n = s.texts.length;
  atomicSave(callout, '#!/bin/sh\n# 1\n');
  t.equal(await s.waitFor(n + 1), item('p6'), 'a callout change');
  unlinkSync(callout);
  await log.waitFor(new RegExp(`watch: poll ${callout}`));
  writeFileSync(callout, '#!/bin/sh\n# 2\n');
  t.equal(await s.waitFor(n + 2), item('p6'), 'a callout deleted, then recreated');
  unlinkSync(fx);
  await log.waitFor(/s\.jsonl: gone; keeping its last good state/);
  writeFileSync(fx, item('back'));
  t.equal(await s.waitFor(n + 3), item('back'), 'a fixture deleted, then recreated');
  ac.abort();
  await within(done, 'the watcher to stop');
});

const emptyWarning = (name: string) =>
  `kpng-callout warn: ${name}: no Services in this fixture: the state is empty (a data-plane callout given it deletes every rule it made)`;

t.test('a fixture with no Services runs the empty state, with a warning naming it', async (t) => {
  const dir = tmp(t);
  const files = { empty: join(dir, 'empty.jsonl'), obj: join(dir, 'obj.json'), other: join(dir, 'other.json'), ok: join(dir, 'ok.jsonl') };
  writeFileSync(files.empty, '');
  writeFileSync(files.obj, '{}');
  writeFileSync(files.other, '{"a":1}\n');
  writeFileSync(files.ok, item('ok'));
  const log = captureLog();
  const s = gatedSink(true);
  await createReplaySource(opts([files.empty, files.obj, files.ok, files.other], { logger: log.logger })).run(s.sink, new AbortController().signal);
  t.same(s.texts, ['', '', item('ok'), ''], 'every state runs, the empty ones too');
  t.same(log.matching(/ warn: /), [emptyWarning(files.empty), emptyWarning(files.obj), emptyWarning(files.other)]);

  const log2 = captureLog();
  const s2 = gatedSink(true);
  await createReplaySource(opts(['-'], { stdin: Readable.from([]), logger: log2.logger })).run(s2.sink, new AbortController().signal);
  t.same(s2.texts, ['']);
  t.same(log2.matching(/ warn: /), [emptyWarning('<stdin>')], '- with empty stdin');

  // --watch: emptied by an edit, it runs (a deliberate "no Services" is legitimate) and is named.
  const log3 = captureLog();
  const s3 = gatedSink(true);
  const ac = new AbortController();
  const done = createReplaySource(opts([files.ok], { watch: true, debounceMs: 20, logger: log3.logger })).run(s3.sink, ac.signal);
  t.teardown(() => ac.abort());
  await log3.waitFor(/watching .* for changes/);
  writeFileSync(files.ok, '');
  t.equal(await s3.waitFor(2), '');
  t.same(log3.matching(/ warn: /), [emptyWarning(files.ok)]);
  ac.abort();
  await within(done, 'the watcher to stop');
});

t.test('a binary file is not a text file: named first, nothing runs; under --watch its last good state stays', async (t) => {
  const dir = tmp(t);
  const ok = join(dir, 'a.jsonl');
  const bin = join(dir, 'b.json');
  writeFileSync(ok, item('a'));
  writeFileSync(bin, Buffer.from([0x1f, 0x8b, 0x08, 0x00, 0x00]));
  const s = gatedSink(true);
  const notText = `${bin}: not a text file (not UTF-8 at line 1, column 2; fixtures are UTF-8 text)`;
  await t.rejects(createReplaySource(opts([ok, bin])).run(s.sink, new AbortController().signal), new CalloutError('input', notText));
  t.same(s.texts, [], 'nothing ran');
  await t.rejects(
    createReplaySource(opts(['-'], { stdin: Readable.from([Buffer.from('a: 1\n\0')]) })).run(s.sink, new AbortController().signal),
    new CalloutError('input', '<stdin>: not a text file (a NUL byte at line 2, column 1; fixtures are UTF-8 text)'),
  );

  const log = captureLog();
  const s2 = gatedSink(true);
  const ac = new AbortController();
  const done = createReplaySource(opts([ok], { watch: true, debounceMs: 20, logger: log.logger })).run(s2.sink, ac.signal);
  t.teardown(() => ac.abort());
  await log.waitFor(/watching .* for changes/);
  writeFileSync(ok, Buffer.from([0xff, 0xfe, 0x61, 0x00]));
  t.equal(await log.waitFor(/ error: /), `kpng-callout error: ${ok}: not a text file (UTF-16; convert it with iconv -f UTF-16 -t UTF-8; fixtures are UTF-8 text) (keeping its last good state)`);
  writeFileSync(ok, item('a2'));
  t.equal(await s2.waitFor(2), item('a2'), 'fixed: runs');
  ac.abort();
  await within(done, 'the watcher to stop');
});

t.test("every state carries its fixture's name as origin (files, directories, stdin, --watch, a callout re-run)", async (t) => {
  const dir = tmp(t);
  const sub = join(dir, 'states');
  mkdirSync(sub);
  writeFileSync(join(sub, '1.yaml'), blogYaml);
  writeFileSync(join(dir, 'z.jsonl'), item('z'));
  const s = gatedSink(true);
  await createReplaySource(opts([join(dir, 'z.jsonl'), sub])).run(s.sink, new AbortController().signal);
  t.same(
    s.states.map((st) => st.origin),
    [join(dir, 'z.jsonl'), join(sub, '1.yaml')],
  );
  const s2 = gatedSink(true);
  await createReplaySource(opts(['-'], { stdin: Readable.from([item('x')]) })).run(s2.sink, new AbortController().signal);
  t.equal(s2.states[0]!.origin, '<stdin>');

  const callout = join(dir, 'callout.sh');
  writeFileSync(callout, '#!/bin/sh\n');
  const log = captureLog();
  const s3 = gatedSink(true);
  const ac = new AbortController();
  const done = createReplaySource(opts([sub, join(dir, 'z.jsonl')], { watch: true, watchExtra: [callout], debounceMs: 20, logger: log.logger })).run(s3.sink, ac.signal);
  t.teardown(() => ac.abort());
  await s3.waitFor(2);
  await log.waitFor(/watching .* for changes/);
  writeFileSync(join(sub, '1.yaml'), '- Service: {Namespace: a, Name: x}\n  Endpoints: null\n');
  await s3.waitFor(3);
  t.equal(s3.states[2]!.origin, join(sub, '1.yaml'));
  t.equal(await log.waitFor(/changed, running/), `kpng-callout info: ${join(sub, '1.yaml')}: changed, running`);
  writeFileSync(callout, '#!/bin/sh\n# 2\n');
  await s3.waitFor(4);
  t.equal(s3.states[3]!.origin, join(sub, '1.yaml'), 'the last state, from the fixture it came from');
  t.equal(await log.waitFor(/callout changed/), `kpng-callout info: ${callout}: callout changed, running ${join(sub, '1.yaml')} again`);
  ac.abort();
  await within(done, 'the watcher to stop');
});
