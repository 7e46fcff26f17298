/**
 * What replay paths stand for and reading one (src/sources/replay/fixtures.ts):
 * files as given, directories as their fixture files in byte order, `-` as
 * stdin; strict before a run, tolerant under --watch; read and parsed.
 */
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Readable } from 'node:stream';
import t from 'tap';
import { CalloutError } from '../../../src/errors.js';
import { errnoText, expandPaths, loadSlot, parseSlot, readSlot, warnIfEmpty } from '../../../src/sources/replay/fixtures.js';
import { tempDir } from '../../helpers/files.js';
import { stateLine } from '../../helpers/fixtures.js';
import { captureLog } from '../../helpers/sink.js';

t.test('expandPaths: files as given, directories in byte order, - as stdin', async (t) => {
  const dir = tempDir(t, 'replay-fixtures-');
  for (const n of ['b.yaml', 'a.jsonl', 'B.json', 'é.yml', 'c.ndjson', 'README.md', '.hidden.yaml']) writeFileSync(join(dir, n), '');
  mkdirSync(join(dir, 'sub.yaml'));
  symlinkSync(join(dir, 'a.jsonl'), join(dir, 'link.json'));
  const one = join(dir, 'a.jsonl');
  const slots = await expandPaths([one, '-', dir], false);
  t.same(
    slots.map((s) => s.name),
    [one, '<stdin>', ...['B.json', 'a.jsonl', 'b.yaml', 'c.ndjson', 'link.json', 'é.yml'].map((n) => join(dir, n))],
  );
  t.same(slots[1], { name: '<stdin>', abs: '' });
  t.equal(slots[2]!.abs, resolve(dir, 'B.json'));
});

t.test('expandPaths: strict fails on a missing path or an empty directory; tolerant keeps watching', async (t) => {
  const dir = tempDir(t, 'replay-fixtures-');
  const missing = join(dir, 'nope.yaml');
  const empty = join(dir, 'empty');
  mkdirSync(empty);
  await t.rejects(expandPaths([missing], false), new CalloutError('input', `${missing}: no such file or directory`));
  await t.rejects(expandPaths([empty], false), { message: `${empty}: no fixture files (*.jsonl, *.ndjson, *.json, *.yaml, *.yml) in this directory` });
  const dirs: unknown[] = [];
  t.same(await expandPaths([missing, empty, dir], true, (d) => dirs.push(d)), [{ name: missing, abs: missing }], 'a missing file stays in the sequence');
  t.same(dirs, [{ name: empty, abs: empty, fixtures: 0 }, { name: dir, abs: dir, fixtures: 0 }], 'directories are told with their number of fixtures');
});

t.test('readSlot: a file, stdin, or an error naming the fixture', async (t) => {
  const dir = tempDir(t, 'replay-fixtures-');
  const f = join(dir, 'a.jsonl');
  writeFileSync(f, stateLine('a'));
  t.equal((await readSlot({ name: f, abs: f })).toString(), stateLine('a'));
  t.equal((await readSlot({ name: '<stdin>', abs: '' }, Readable.from([Buffer.from('x'), 'y']))).toString(), 'xy');
  await t.rejects(readSlot({ name: 'gone.yaml', abs: join(dir, 'gone.yaml') }), new CalloutError('input', 'gone.yaml: no such file or directory'));
  t.equal(errnoText(Object.assign(new Error('x'), { code: 'EACCES' })), 'permission denied');
  t.equal(errnoText(Object.assign(new Error('x'), { code: 'EISDIR' })), 'cannot read (EISDIR)');
  t.equal(errnoText(new Error('odd')), 'cannot read (odd)');
});

t.test('parseSlot sets the origin; warnIfEmpty names an empty state', async (t) => {
  const log = captureLog();
  const opts = { nodeName: 'n', logger: log.logger };
  const st = parseSlot({ name: 'fx/a.jsonl', abs: '/x' }, Buffer.from(stateLine('a')), opts);
  t.equal(st.origin, 'fx/a.jsonl');
  t.equal(st.services, 1);
  t.same(log.matching(/ debug: /), ['kpng-callout debug: fx/a.jsonl: 1 services, 0 endpoints']);
  warnIfEmpty(st, log.logger);
  const empty = parseSlot({ name: '<stdin>', abs: '' }, Buffer.from(''), opts);
  warnIfEmpty(empty, log.logger);
  t.same(log.matching(/ warn: /), [
    'kpng-callout warn: <stdin>: no Services in this fixture: the state is empty (a data-plane callout given it deletes every rule it made)',
  ]);
  t.throws(() => parseSlot({ name: 'bad.jsonl', abs: '/x' }, Buffer.from('{'), opts), { message: "bad.jsonl:1:2: Expected property name or '}' in JSON" });
});

t.test('loadSlot: reads and parses a fixture (file or stdin), as readSlot and parseSlot do', async (t) => {
  const dir = tempDir(t, 'replay-fixtures-');
  const f = join(dir, 'a.jsonl');
  writeFileSync(f, stateLine('a'));
  const log = captureLog();
  const st = await loadSlot({ name: f, abs: f }, { nodeName: 'n', logger: log.logger });
  t.same([st.origin, st.services], [f, 1]);
  const fromStdin = await loadSlot({ name: '<stdin>', abs: '' }, { nodeName: 'n', logger: log.logger, stdin: Readable.from([Buffer.from(stateLine('b'))]) });
  t.same([fromStdin.origin, fromStdin.services], ['<stdin>', 1]);
  await t.rejects(loadSlot({ name: 'gone.yaml', abs: join(dir, 'gone.yaml') }, { nodeName: 'n', logger: log.logger }), new CalloutError('input', 'gone.yaml: no such file or directory'));
  writeFileSync(join(dir, 'bin.yaml'), Buffer.from([0x61, 0x00]));
  await t.rejects(loadSlot({ name: 'bin.yaml', abs: join(dir, 'bin.yaml') }, { nodeName: 'n', logger: log.logger }), {
    message: 'bin.yaml: not a text file (a NUL byte at line 1, column 2; fixtures are UTF-8 text)',
  });
});
