/**
 * The replay source on real files (src/sources/replay.ts): directory order,
 * several paths, stdin, one push at a time (each awaited), fail-fast on bad
 * input, empty states warned about, and each state's origin, with and
 * without --watch (whose own behaviour is in replay/watch.test.ts).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import t from 'tap';
import { CalloutError } from '../../src/errors.js';
import { createReplaySource, checkReplayPaths, type ReplayOptions } from '../../src/sources/replay.js';
import { tempDir } from '../helpers/files.js';
import { blogJsonl, blogView, blogYaml, stateLine } from '../helpers/fixtures.js';
import { gatedSink } from '../helpers/gated-sink.js';
import { captureLog } from '../helpers/sink.js';
import { within } from '../helpers/wait.js';

const opts = (paths: string[], extra: Partial<ReplayOptions> = {}): ReplayOptions => ({ paths, ...blogView, ...extra });

t.test('a directory: its fixture files in name order; others skipped', async (t) => {
  const dir = tempDir(t, 'replay-test-');
  writeFileSync(join(dir, 'b.yaml'), blogYaml);
  writeFileSync(join(dir, 'a.jsonl'), stateLine('a'));
  writeFileSync(join(dir, 'C.json'), `[${stateLine('C').trim()}]`);
  writeFileSync(join(dir, 'c.ndjson'), stateLine('c'));
  writeFileSync(join(dir, 'd.yml'), blogYaml);
  writeFileSync(join(dir, 'README.md'), '# not a fixture');
  writeFileSync(join(dir, '.hidden.yaml'), 'broken: [');
  mkdirSync(join(dir, 'sub.yaml'));
  const s = gatedSink(true);
  await createReplaySource(opts([dir])).run(s.sink, new AbortController().signal);
  t.same(s.texts, [stateLine('C'), stateLine('a'), blogJsonl, stateLine('c'), blogJsonl]);
});

t.test('several paths run in the order given, each push awaited before the next', async (t) => {
  const dir = tempDir(t, 'replay-test-');
  const sub = join(dir, 'states');
  mkdirSync(sub);
  writeFileSync(join(sub, '2.jsonl'), stateLine('two'));
  writeFileSync(join(sub, '1.jsonl'), stateLine('one'));
  writeFileSync(join(dir, 'z.jsonl'), stateLine('z'));
  writeFileSync(join(dir, 'blog.yaml'), blogYaml);
  const s = gatedSink();
  const done = createReplaySource(opts([join(dir, 'z.jsonl'), sub, join(dir, 'blog.yaml')])).run(s.sink, new AbortController().signal);
  for (const [i, want] of [stateLine('z'), stateLine('one'), stateLine('two'), blogJsonl].entries()) {
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
  await createReplaySource(opts(['-'], { stdin: Readable.from([stateLine('x') + stateLine('y')]) })).run(s2.sink, new AbortController().signal);
  t.same(s2.texts, [stateLine('x') + stateLine('y')], 'stdin NDJSON');
  const dir = tempDir(t, 'replay-test-');
  writeFileSync(join(dir, 'a.jsonl'), stateLine('a'));
  writeFileSync(join(dir, 'b.jsonl'), stateLine('b'));
  const s3 = gatedSink(true);
  await createReplaySource(opts([dir], { once: true })).run(s3.sink, new AbortController().signal);
  t.same(s3.texts, [stateLine('a')], '--once: the first state only');
  t.equal(checkReplayPaths([], false), 'replay needs at least one path');
  t.equal(checkReplayPaths(['-', '-'], false), '- (stdin) can be given only once');
  t.equal(checkReplayPaths(['-'], true), '--watch cannot watch - (stdin)');
  t.equal(checkReplayPaths(['a', '-'], false), undefined);
});

t.test('bad input fails before anything runs, naming file, line, column', async (t) => {
  const dir = tempDir(t, 'replay-test-');
  writeFileSync(join(dir, '1.jsonl'), stateLine('a'));
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

const emptyWarning = (name: string) =>
  `kpng-callout warn: ${name}: no Services in this fixture: the state is empty (a data-plane callout given it deletes every rule it made)`;

t.test('a fixture with no Services runs the empty state, with a warning naming it', async (t) => {
  const dir = tempDir(t, 'replay-test-');
  const files = { empty: join(dir, 'empty.jsonl'), obj: join(dir, 'obj.json'), other: join(dir, 'other.json'), ok: join(dir, 'ok.jsonl') };
  writeFileSync(files.empty, '');
  writeFileSync(files.obj, '{}');
  writeFileSync(files.other, '{"a":1}\n');
  writeFileSync(files.ok, stateLine('ok'));
  const log = captureLog();
  const s = gatedSink(true);
  await createReplaySource(opts([files.empty, files.obj, files.ok, files.other], { logger: log.logger })).run(s.sink, new AbortController().signal);
  t.same(s.texts, ['', '', stateLine('ok'), ''], 'every state runs, the empty ones too');
  t.same(log.matching(/ warn: /), [emptyWarning(files.empty), emptyWarning(files.obj), emptyWarning(files.other)]);

  const log2 = captureLog();
  const s2 = gatedSink(true);
  await createReplaySource(opts(['-'], { stdin: Readable.from([]), logger: log2.logger })).run(s2.sink, new AbortController().signal);
  t.same(s2.texts, ['']);
  t.same(log2.matching(/ warn: /), [emptyWarning('<stdin>')], '- with empty stdin');

  // --watch: a 0-byte file is one being written (`> file` truncates first): not run, said; emptied
  // deliberately (a newline alone), it runs (a "no Services" is legitimate) and is named.
  const log3 = captureLog();
  const s3 = gatedSink(true);
  const ac = new AbortController();
  const done = createReplaySource(opts([files.ok], { watch: true, debounceMs: 20, logger: log3.logger })).run(s3.sink, ac.signal);
  t.teardown(() => ac.abort());
  await log3.waitFor(/watching .* for changes/);
  writeFileSync(files.ok, '');
  await log3.waitFor(/ok\.jsonl: empty; waiting for its content/);
  writeFileSync(files.ok, '\n');
  t.equal(await s3.waitFor(2), '');
  t.same(log3.matching(/ warn: /), [emptyWarning(files.ok)]);
  t.equal(s3.texts.length, 2, 'the 0-byte file did not run');
  ac.abort();
  await within(done, 'the watcher to stop');
});

t.test('a binary file is not a text file: named first, nothing runs; under --watch its last good state stays', async (t) => {
  const dir = tempDir(t, 'replay-test-');
  const ok = join(dir, 'a.jsonl');
  const bin = join(dir, 'b.json');
  writeFileSync(ok, stateLine('a'));
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
  writeFileSync(ok, stateLine('a2'));
  t.equal(await s2.waitFor(2), stateLine('a2'), 'fixed: runs');
  ac.abort();
  await within(done, 'the watcher to stop');
});

t.test("every state carries its fixture's name as origin (files, directories, stdin, --watch, a callout re-run)", async (t) => {
  const dir = tempDir(t, 'replay-test-');
  const sub = join(dir, 'states');
  mkdirSync(sub);
  writeFileSync(join(sub, '1.yaml'), blogYaml);
  writeFileSync(join(dir, 'z.jsonl'), stateLine('z'));
  const s = gatedSink(true);
  await createReplaySource(opts([join(dir, 'z.jsonl'), sub])).run(s.sink, new AbortController().signal);
  t.same(
    s.states.map((st) => st.origin),
    [join(dir, 'z.jsonl'), join(sub, '1.yaml')],
  );
  const s2 = gatedSink(true);
  await createReplaySource(opts(['-'], { stdin: Readable.from([stateLine('x')]) })).run(s2.sink, new AbortController().signal);
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
