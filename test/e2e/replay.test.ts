/**
 * `kpng-callout replay` and `kpng-json replay`: the built bins as child
 * processes on real fixture files and real callout scripts. Waits on output
 * lines (markers), never on fixed sleeps.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { chmodSync, copyFileSync, mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t, { type Test } from 'tap';
import { runBin, type BinProcess } from '../helpers/bin-process.js';
import { replaceFile, shScript, tempDir } from '../helpers/files.js';
import { blogJsonl, blogJsonlPath, blogYaml, blogYamlPath, repoRoot, stateLine } from '../helpers/fixtures.js';
import { within } from '../helpers/wait.js';

/** The startup line (version, source, node, callout): its own tests check it. */
const startupLine = /^\S+ info: \S+ \S+ starting /;

/** Exit code, stdout as text, stderr past the startup line. */
async function finished(c: BinProcess): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const code = await c.exited();
  return { code, stdout: c.bytes('stdout').toString(), stderr: c.stderr.filter((l) => !startupLine.test(l)).join('\n') };
}

const tmp = (t: Test): string => tempDir(t, 'kpng-e2e-replay-');

/** Prints the Name of the Service in its input (sh). */
const serviceName = `sed -n 's/.*"Name":"\\([^"]*\\)".*/\\1/p'`;

t.test('the Quick start: the blog example through the default callout (/bin/cat)', async (t) => {
  const c = runBin(t, 'kpng-callout', ['replay', '--node-name', 'vm-002', '--service-proxy-name', 'kpng-example', 'fixtures/kpng-example.yaml']);
  const r = await finished(c);
  t.equal(r.code, 0);
  t.equal(r.stdout, blogJsonl);
  t.match(r.stderr, /callout run finished run=1 status=ok/);
});

t.test('kpng-json replay: every form prints the same canonical state; stdin', async (t) => {
  const dir = tmp(t);
  writeFileSync(join(dir, 'blog.jsonl'), blogJsonl);
  writeFileSync(join(dir, 'blog.json'), JSON.stringify([JSON.parse(blogJsonl)], null, 2));
  const args = ['replay', '--node-name', 'vm-002', '--service-proxy-name', 'kpng-example'];
  for (const f of [blogYamlPath, join(dir, 'blog.jsonl'), join(dir, 'blog.json')]) {
    const r = await finished(runBin(t, 'kpng-json', [...args, f]));
    t.same([r.code, r.stdout, r.stderr], [0, blogJsonl, ''], f);
  }
  const r = await finished(runBin(t, 'kpng-json', [...args, '-'], { stdin: blogYaml }));
  t.same([r.code, r.stdout], [0, blogJsonl], 'stdin');
  const lr = await finished(runBin(t, 'kpng-json', ['replay', '--with-service-labels', 'service.kubernetes.io/*', '--node-name', 'vm-002', '--service-proxy-name', 'kpng-example', blogYamlPath]));
  t.match(lr.stdout, /^\{"Service":\{"Namespace":"default","Name":"kpng-example","Type":"ClusterIP","Labels":\{"service.kubernetes.io\/service-proxy-name":"kpng-example"\},"IPs"/);
});

t.test('several paths and a directory: one run each, in order; the exit status is the first failure', async (t) => {
  const dir = tmp(t);
  const states = join(dir, 'states');
  mkdirSync(states);
  writeFileSync(join(states, '02-fail3.jsonl'), stateLine('fail3'));
  writeFileSync(join(states, '01-ok.jsonl'), stateLine('ok'));
  writeFileSync(join(states, '03-fail5.jsonl'), stateLine('fail5'));
  writeFileSync(join(dir, 'last.jsonl'), stateLine('last'));
  // Prints the run number and the service; exits with the digit in the name of a "failN" service.
  const callout = shScript(dir, 'callout', `in=$(cat); name=$(echo "$in" | ${serviceName}); echo "run $KPNG_CALLOUT_RUN $name"; case "$name" in fail*) exit \${name#fail};; esac; exit 0\n`);
  const r = await finished(runBin(t, 'kpng-callout', ['replay', '--callout', callout, states, join(dir, 'last.jsonl')]));
  t.equal(r.stdout, 'run 1 ok\nrun 2 fail3\nrun 3 fail5\nrun 4 last\n');
  t.equal(r.code, 3, 'the first failing run decides');
  const ok = await finished(runBin(t, 'kpng-callout', ['replay', '--callout', callout, join(states, '01-ok.jsonl'), join(dir, 'last.jsonl')]));
  t.same([ok.code, ok.stdout], [0, 'run 1 ok\nrun 2 last\n']);
});

t.test('bad input: file:line:col: reason, no stack trace, exit 1, nothing run', async (t) => {
  const dir = tmp(t);
  writeFileSync(join(dir, 'good.jsonl'), stateLine('good'));
  writeFileSync(join(dir, 'bad.yaml'), 'apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n  - port: eighty\n');
  const r = await finished(runBin(t, 'kpng-callout', ['replay', 'good.jsonl', 'bad.yaml'], { cwd: dir }));
  t.equal(r.code, 1);
  t.equal(r.stdout, '', 'nothing ran');
  t.equal(r.stderr, 'kpng-callout: bad.yaml:7:11: spec.ports[0].port: expected an integer, got "eighty"');
  const u = await finished(runBin(t, 'kpng-json', ['replay', '--watch', '-']));
  t.same([u.code, u.stderr], [2, 'kpng-json: --watch cannot watch - (stdin)\n(run kpng-json replay --help for usage)']);
  const m = await finished(runBin(t, 'kpng-json', ['replay', 'missing.yaml'], { cwd: dir }));
  t.same([m.code, m.stderr], [1, 'kpng-json: missing.yaml: no such file or directory']);
});

t.test('--watch: re-runs on a fixture edit and on a callout edit; a broken fixture keeps the last good state', async (t) => {
  const dir = tmp(t);
  const fx = join(dir, 'fixtures');
  mkdirSync(fx);
  writeFileSync(join(fx, 'state.jsonl'), stateLine('one'));
  shScript(dir, 'callout.sh', `echo "A $(${serviceName})"\n`);
  // A bare name is looked up in $PATH (as the runner does), so it is not watched; ./callout.sh is.
  const c = runBin(t, 'kpng-callout', ['replay', '--watch', '--debounce', '10ms', '--callout', 'callout.sh', 'fixtures'], { cwd: dir, env: { PATH: `${dir}:${process.env.PATH}` } });
  await c.line('stdout', /^A one$/);
  await c.line('stderr', /watching fixtures for changes/);
  c.proc.kill('SIGTERM');
  t.equal(await c.exited('exit on SIGTERM'), 0);

  const w = runBin(t, 'kpng-callout', ['replay', '--watch', '--debounce', '10ms', '--callout', './callout.sh', 'fixtures'], { cwd: dir });
  await w.line('stdout', /^A one$/);
  await w.line('stderr', /watching fixtures, \.\/callout\.sh for changes/);
  writeFileSync(join(fx, 'state.jsonl'), stateLine('two'));
  await w.line('stdout', /^A two$/, 'the run after the fixture edit');
  shScript(dir, 'callout.sh', `echo "B $(${serviceName})"\n`);
  await w.line('stdout', /^B two$/, 'the run after the callout edit');
  writeFileSync(join(fx, 'state.jsonl'), '{"Service":{"Name":"three",}}\n');
  const err = await w.line('stderr', /error/);
  // file:line:col of the error, a reason (its wording is V8's JSON parser's), what happens.
  t.match(err, /^kpng-callout error: fixtures\/state\.jsonl:1:28: \S.* \(keeping its last good state\)$/);
  shScript(dir, 'callout.sh', `echo "C $(${serviceName})"\n`);
  await w.line('stdout', /^C two$/, 'the last good state runs with the new callout');
  writeFileSync(join(fx, 'state.jsonl'), stateLine('four'));
  await w.line('stdout', /^C four$/, 'fixed fixture runs');
  t.same(w.stdout, ['A one', 'A two', 'B two', 'C two', 'C four']);
  t.same(w.stderr.filter((l) => / error: /.test(l)), [err], 'one error line');
  w.proc.kill('SIGTERM');
  t.equal(await w.exited('exit on SIGTERM'), 0);
});

/** Runs as this uid (a user of its own, for the inotify limits, which count per user). */
const spareUid = '54321';
const asSpare = ['setpriv', `--reuid=${spareUid}`, `--regid=${spareUid}`, '--clear-groups'];
/** inotify_init1's system call number (Linux's tables). */
const inotifyInit1 = ({ x64: 294, arm64: 26 } as Record<string, number>)[process.arch];
/** Why the inotify test cannot run here, or undefined. */
function noSpareUser(): string | undefined {
  if (process.getuid?.() !== 0) return 'needs root (to run as another user)';
  if (inotifyInit1 === undefined) return `inotify_init1's system call number on ${process.arch} is not known here`;
  const r = spawnSync(asSpare[0]!, [...asSpare.slice(1), 'sh', '-c', 'test -r "$1" && test -x "$2" && command -v perl', 'sh', join(repoRoot, 'bin/kpng-json'), process.execPath]);
  if (r.error) return 'setpriv is missing';
  return r.status === 0 ? undefined : `user ${spareUid} cannot read the repository or node, or perl is missing`;
}

t.test('--watch without inotify (its per-user limit reached): files given are polled, the watch stays up', { skip: noSpareUser() ?? false }, async (t) => {
  const dir = tmp(t);
  chmodSync(dir, 0o755);
  const f = join(dir, 'state.jsonl');
  writeFileSync(f, stateLine('one'));
  // Holds every inotify instance the user may have (fs.inotify.max_user_instances, 128 by default): perl's
  // syscall, inotify_init1 by its number on this architecture.
  const holder = spawn(asSpare[0]!, [...asSpare.slice(1), 'perl', '-e', `my @f; while (@f < 100000) { my $fd = syscall(${inotifyInit1}, 0); last if $fd < 0; push @f, $fd } $| = 1; print "held ", scalar(@f), "\\n"; <STDIN>;`], { stdio: ['pipe', 'pipe', 'inherit'] });
  t.teardown(() => void holder.kill());
  const [held] = (await within(once(holder.stdout!, 'data'), 'the inotify instances to be held')) as [Buffer];
  t.match(held.toString(), /^held \d+/);
  const w = runBin(t, 'kpng-json', ['replay', '--watch', f], { wrap: asSpare });
  await w.line('stdout', /"Name":"one"/);
  await w.line('stderr', /warn: watch: .*: polling state\.jsonl every 1000 ms instead \(raise fs\.inotify\.max_user_instances/);
  await w.line('stderr', /watching .* for changes/);
  replaceFile(f, stateLine('two'));
  await w.line('stdout', /"Name":"two"/, 'the state after the save');
  w.proc.kill('SIGTERM');
  t.equal(await w.exited('exit on SIGTERM'), 0);
});

t.test('--watch: a fixture renamed in its directory (the same state again) runs nothing', async (t) => {
  const dir = tmp(t);
  const fx = join(dir, 'fixtures');
  mkdirSync(fx);
  writeFileSync(join(fx, '10-a.jsonl'), stateLine('one'));
  shScript(dir, 'callout.sh', `echo "run $KPNG_CALLOUT_RUN $(${serviceName})"\n`);
  const w = runBin(t, 'kpng-callout', ['replay', '--watch', '--debounce', '10ms', '--callout', './callout.sh', 'fixtures'], { cwd: dir });
  await w.line('stdout', /^run 1 one$/);
  await w.line('stderr', /watching fixtures/);
  renameSync(join(fx, '10-a.jsonl'), join(fx, '20-a.jsonl'));
  writeFileSync(join(fx, '30-b.jsonl'), stateLine('two'));
  await w.line('stdout', /^run \d+ two$/, 'the run of the new state');
  t.same(w.stdout, ['run 1 one', 'run 2 two'], 'the renamed fixture ran nothing (its state was the one applied)');
  w.proc.kill('SIGTERM');
  t.equal(await w.exited('exit on SIGTERM'), 0);
});

t.test("--watch on one file: issue 9's recipe, sed -i edits milliseconds apart, then later edits, are all picked up", async (t) => {
  const dir = tmp(t);
  const fx = join(dir, 's.jsonl');
  copyFileSync(blogJsonlPath, fx);
  const callout = shScript(dir, 'cb', `sed -n 's/^{"Service":{"Namespace":"\\([^"]*\\)".*/NS \\1/p'\n`);
  const c = runBin(t, 'kpng-callout', ['replay', '--watch', '--callout', callout, fx]);
  await c.line('stdout', /^NS default$/);
  await c.line('stderr', /watching .* for changes/);
  // sed -i writes a temporary file beside s.jsonl and renames it over s.jsonl.
  const sedNamespace = (ns: string) => execFileSync('sed', ['-i', `s/"Namespace":"[^"]*"/"Namespace":"${ns}"/`, fx]);
  for (let i = 1; i <= 8; i++) {
    sedNamespace(`r${i}a`);
    sedNamespace(`r${i}b`);
    await c.line('stdout', new RegExp(`^NS r${i}b$`), `round ${i}: the run of the second edit`, 10_000);
  }
  sedNamespace('later');
  await c.line('stdout', /^NS later$/, 'the run of a later edit');
  c.proc.kill('SIGTERM');
  t.equal(await c.exited('exit on SIGTERM'), 0);
});

t.test('a fixture with no Services runs the empty state with a warning naming it; a binary file is not a text file', async (t) => {
  const dir = tmp(t);
  writeFileSync(join(dir, 'empty.jsonl'), '');
  writeFileSync(join(dir, 'other.json'), '{"a":1}\n');
  const callout = shScript(dir, 'count', 'echo "services: $(wc -l)"\n');
  for (const [args, name, stdin] of [
    [['empty.jsonl'], 'empty.jsonl', undefined],
    [['-'], '<stdin>', ''],
    [['other.json'], 'other.json', undefined],
  ] as const) {
    const r = await finished(runBin(t, 'kpng-callout', ['replay', '--callout', callout, ...args], { cwd: dir, stdin }));
    t.equal(r.code, 0, `${name}: an empty state is legitimate`);
    t.equal(r.stdout, 'services: 0\n', `${name}: the callout ran with it`);
    t.match(r.stderr, `warn: ${name}: no Services in this fixture: the state is empty (a data-plane callout given it deletes every rule it made)`);
  }
  writeFileSync(join(dir, 'dump.json'), Buffer.from([0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00]));
  const b = await finished(runBin(t, 'kpng-callout', ['replay', '--callout', callout, 'dump.json'], { cwd: dir }));
  t.equal(b.code, 1);
  t.equal(b.stdout, '', 'nothing ran');
  t.match(b.stderr, /^kpng-callout: dump\.json: not a text file \(not UTF-8 at line 1, column 2; fixtures are UTF-8 text\)$/m);
});
