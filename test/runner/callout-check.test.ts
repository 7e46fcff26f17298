/**
 * checkCallout resolves the callout as execvp would, with real files,
 * directories and a PATH built for each case; a callout process words its
 * spawn errors the same way.
 */
import t from 'tap';
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { checkCallout, spawnErrorMessage } from '../../src/runner/callout-check.js';
import { CalloutProcess } from '../../src/runner/callout-process.js';
import { emptyState } from '../../src/state.js';
import { replaceFile, shScript, tempDir } from '../helpers/files.js';

const root = tempDir(t, 'callout-check-');
let n = 0;
/** A fresh directory under the test's tmp dir. */
function freshDir(): string {
  const d = join(root, `d${++n}`);
  mkdirSync(d);
  return d;
}

t.test('a path (a name with a slash) is taken as is, relative to cwd', async (t) => {
  const d = freshDir();
  const p = shScript(d, 'callout.sh', 'exit 0\n');
  t.same(checkCallout(p, {}), { ok: true, path: p });
  t.same(checkCallout('./callout.sh', { PATH: '/nonexistent' }, d), { ok: true, path: p });
  const sp = shScript(d, 'with space.sh', 'exit 0\n');
  t.same(checkCallout(sp, {}), { ok: true, path: sp }, 'a file whose name has a space is fine');
});

t.test('a bare name is searched in PATH, skipping what cannot run, as execvp', async (t) => {
  const [a, b, c] = [freshDir(), freshDir(), freshDir()];
  shScript(a, 'tool', 'exit 0\n', 0o644);
  mkdirSync(join(b, 'tool'));
  const good = shScript(c, 'tool', 'exit 0\n');
  const notADir = shScript(root, `file${++n}`, 'exit 0\n', 0o644);
  t.same(checkCallout('tool', { PATH: [join(root, 'missing'), notADir, a, b, c].join(':') }), { ok: true, path: good });
  t.same(checkCallout('tool', { PATH: `:${a}` }, c), { ok: true, path: good }, 'an empty entry is the current directory');
  t.match(checkCallout('sh', {}), { ok: true, path: /^\/(usr\/)?bin\/sh$/ }, 'no PATH: /usr/bin:/bin');
});

t.test('not found: 127, with PATH named', async (t) => {
  const d = freshDir();
  const missing = join(d, 'nope');
  t.same(checkCallout(missing, {}), {
    ok: false,
    exitCode: 127,
    code: 'ENOENT',
    message: `callout ${missing}: not found (ENOENT); set --callout or $CALLOUT to an executable file`,
  });
  const r = checkCallout('kpng-no-such-tool', { PATH: `${d}:/nonexistent` });
  t.same(r, {
    ok: false,
    exitCode: 127,
    code: 'ENOENT',
    message: `callout kpng-no-such-tool: not found in $PATH (ENOENT); set --callout or $CALLOUT to an executable file, or to a program name in $PATH (PATH=${d}:/nonexistent)`,
  });
  const notADir = shScript(d, 'afile', 'exit 0\n', 0o644);
  t.match(checkCallout(join(notADir, 'x'), {}), { ok: false, exitCode: 127, code: 'ENOTDIR', message: /not found \(ENOTDIR\): a part of its path is a file/ });
  t.match(checkCallout('', {}), { ok: false, exitCode: 127, message: 'callout "": empty name; set --callout or $CALLOUT to an executable file' });
});

t.test('a command with arguments (CALLOUT="jq -c ."): run without a shell, use a wrapper script', async (t) => {
  const r = checkCallout('jq -c .', { PATH: '/usr/bin:/bin' });
  t.equal(r.ok, false);
  if (r.ok) return;
  t.equal(r.exitCode, 127);
  t.equal(
    r.message,
    `callout "jq -c .": not found in $PATH (ENOENT); a callout is run without a shell, so its name cannot carry arguments: ` +
      `put the command in a wrapper script (chmod +x) and pass that script's path, for example\n  #!/bin/sh\n  exec jq -c .`,
  );
  t.equal(
    (checkCallout('sh ', {}) as { message: string }).message,
    `callout "sh ": not found in $PATH (ENOENT); the name has leading or trailing spaces: did you mean sh?`,
  );
  const p = checkCallout('/usr/bin/jq -c .', {});
  t.match(p, { ok: false, exitCode: 127, message: /^callout "\/usr\/bin\/jq -c \.": not found \(ENOENT\); a callout is run without a shell.*\n  #!\/bin\/sh\n  exec \/usr\/bin\/jq -c \.$/s });
});

t.test('a bare name that is a file in the current directory: suggest ./NAME', async (t) => {
  const d = freshDir();
  shScript(d, 'summary.sh', 'exit 0\n');
  const r = checkCallout('summary.sh', { PATH: '/usr/bin:/bin' }, d);
  t.same(r, {
    ok: false,
    exitCode: 127,
    code: 'ENOENT',
    message: `callout summary.sh: not found in $PATH (ENOENT); a name without '/' is looked up in $PATH only: for the file in the current directory, use ./summary.sh`,
  });
  shScript(d, 'plain.sh', 'exit 0\n', 0o644);
  t.match(checkCallout('plain.sh', { PATH: '/usr/bin:/bin' }, d), {
    ok: false,
    exitCode: 127,
    message: /use \.\/plain\.sh \(and make it executable: chmod \+x plain\.sh\)$/,
  });
});

t.test('a directory: 126, "is a directory"', async (t) => {
  const d = freshDir();
  t.same(checkCallout(d, {}), { ok: false, exitCode: 126, code: 'EACCES', message: `callout ${d}: is a directory, not a program; set --callout or $CALLOUT to an executable file` });
  mkdirSync(join(d, 'tool'));
  t.same(checkCallout('tool', { PATH: d }), {
    ok: false,
    exitCode: 126,
    code: 'EACCES',
    message: `callout tool: ${join(d, 'tool')}: is a directory, not a program; set --callout or $CALLOUT to an executable file`,
  });
});

t.test('not executable: 126, suggest chmod +x', async (t) => {
  const d = freshDir();
  const p = shScript(d, 'callout.sh', 'exit 0\n', 0o644);
  t.same(checkCallout(p, {}), { ok: false, exitCode: 126, code: 'EACCES', message: `callout ${p}: is not executable (EACCES); make it executable: chmod +x ${p}` });
  t.same(checkCallout('callout.sh', { PATH: d }), {
    ok: false,
    exitCode: 126,
    code: 'EACCES',
    message: `callout callout.sh: ${p}: is not executable (EACCES); make it executable: chmod +x ${p}`,
  });
});

t.test("a script's #! interpreter: missing, or a CR left by Windows line endings", async (t) => {
  const d = freshDir();
  const missing = replaceFile(join(d, 'py.sh'), '#!/nonexistent/python3 -u\nprint(1)\n', 0o755);
  t.same(checkCallout(missing, {}), {
    ok: false,
    exitCode: 127,
    code: 'ENOENT',
    message: `callout ${missing}: its interpreter /nonexistent/python3 (on its #! line) is not installed (ENOENT)`,
  });
  const crlf = replaceFile(join(d, 'crlf.sh'), '#!/bin/sh\r\necho hi\r\n', 0o755);
  t.match(checkCallout(crlf, {}), { ok: false, exitCode: 127, message: new RegExp(`^callout ${crlf}: its #! line ends with a carriage return .*sed -i 's/\\\\r\\$//' ${crlf}$`) });
  const withArgs = replaceFile(join(d, 'args.sh'), '#! /bin/sh -e\nexit 0\n', 0o755);
  t.same(checkCallout(withArgs, {}), { ok: true, path: withArgs }, 'a space after #! and arguments are fine');
});

t.test('a callout process words a spawn error at run time with the same message', async (t) => {
  const d = freshDir();
  const p = shScript(d, 'callout.sh', 'exit 0\n');
  t.equal(checkCallout(p, {}).ok, true, 'fine at startup');
  const callout = new CalloutProcess({ file: p, nodeName: 'n' });
  let run = 0;
  const runNow = (state: typeof emptyState) => callout.start({ run: ++run, state, reason: 'now' }).done;
  t.equal((await runNow(emptyState)).result, 'ok');
  rmSync(p);
  const gone = await runNow(emptyState);
  t.match(gone, { result: 'spawn-error', errorCode: 'ENOENT' });
  const c = checkCallout(p, {});
  t.equal(gone.message, c.ok ? 'unexpected' : c.message);
  replaceFile(p, '#!/bin/sh\r\nexit 0\r\n', 0o755);
  const crlf = await runNow(emptyState);
  t.match(crlf, { result: 'spawn-error', errorCode: 'ENOENT', message: /carriage return/ });
  t.equal(
    spawnErrorMessage(shScript(d, 'fine.sh', 'exit 0\n'), Object.assign(new Error('spawn E2BIG'), { code: 'E2BIG' }), {}),
    `callout ${join(d, 'fine.sh')}: could not be started (E2BIG): spawn E2BIG`,
    'an errno the check cannot explain is named',
  );
});
