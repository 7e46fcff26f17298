/**
 * callouts/lib/allip-plan.sh's `nft_err_told`, run by sh on files shaped as
 * nft writes its errors (no nft needed): bounded, showing the failing part of
 * a long command, and the file emptied. Needs sh and awk.
 */
import t from 'tap';
import { appendFileSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { runCommand } from '../helpers/command.js';
import { tempDir } from '../helpers/files.js';
import { repoPath } from '../helpers/fixtures.js';

const LIB = repoPath('callouts/lib/allip-plan.sh');

const told = (file: string) => runCommand('sh', ['-c', `. "$1" && nft_err_told "$2"`, 'sh', LIB, file]);

/** What nft_err_told says of `file`, which holds something. */
async function excerpt(file: string): Promise<string> {
  const r = await told(file);
  t.equal(r.code, 1, 'nft_err_told told something', { stderr: r.stderr });
  t.equal(r.stdout, '', 'nothing on stdout');
  return r.stderr;
}

t.test('nft_err_told: each error whole, and a window around the caret of a long command', async (t) => {
  const dir = tempDir(t, 'kpng-nft-err-');
  const file = join(dir, 'nft.err');
  // A one-line transaction of 2,000 commands; the 1,500th fails.
  const cmds = Array.from({ length: 2000 }, (_, i) => `add element inet t m { 192.0.2.${i % 250} . ${1000 + i} : 198.51.100.1 . 80 }`);
  const line = cmds.join(';');
  const at = line.indexOf(cmds[1500]!);
  writeFileSync(file, 'earlier error already told\n');
  await excerpt(file);
  // nft appends to the file emptied by the last call.
  appendFileSync(
    file,
    `/dev/stdin:1:${at + 1}-${at + cmds[1500]!.length}: Error: Could not process rule: File exists\n` +
      `${line}\n` +
      `${' '.repeat(at)}${'^'.repeat(cmds[1500]!.length)}\n`,
  );
  const out = await excerpt(file);
  const lines = out.replace(/\n$/, '').split('\n');
  t.equal(lines.length, 3, 'the error, the window of the command, the window of its caret line', { out });
  t.match(lines[0], /^\/dev\/stdin:1:\d+-\d+: Error: Could not process rule: File exists$/);
  t.notMatch(out, /earlier error/, 'only what was written since the last call');
  t.ok(lines.every((l) => l.length <= 300), 'lines of at most 300 characters');
  t.ok(lines[1]!.startsWith('...') && lines[1]!.includes(cmds[1500]!), 'the failing command is in the window', { line: lines[1] });
  t.equal(lines[2]!.indexOf('^'), lines[1]!.indexOf(cmds[1500]!), 'the caret under it');

  // Many errors: at most 30 lines.
  const many = Array.from({ length: 50 }, (_, i) => `/dev/stdin:${i}:1-3: Error: bad\nadd x\n^^^\n`).join('');
  writeFileSync(file, many);
  t.equal((await excerpt(file)).replace(/\n$/, '').split('\n').length, 30, 'at most 30 lines');

  // An error without a caret line.
  writeFileSync(file, 'Error: something else\n');
  t.equal(await excerpt(file), 'Error: something else\n');
});

t.test('nft_err_told: tells and empties a file that holds something; succeeds, silent, on an empty one', async (t) => {
  const dir = tempDir(t, 'kpng-nft-err-');
  const file = join(dir, 'nft.err');
  writeFileSync(file, '');
  t.same(await told(file), { code: 0, stdout: '', stderr: '' }, 'empty: nothing to tell');
  writeFileSync(file, 'Error: x\n');
  t.same(await told(file), { code: 1, stdout: '', stderr: 'Error: x\n' }, 'told, and it fails');
  t.equal(readFileSync(file, 'utf8'), '', 'emptied');
});
