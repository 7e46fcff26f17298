/**
 * The bins at the edges of pipes and signals, as shells use them: stderr
 * whose reader left (`2>&1 >file | true`) or a full disk (`2>/dev/full`,
 * `>/dev/full`), `replay -` from a stdin that stays open, a second SIGINT, a
 * stop signal while the last output drains into a reader that stalls, and a
 * stop signal that arrives while a big fixture loads. Real processes and
 * pipes; waits on output markers and exits, never on fixed sleeps.
 */
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { binArgv, runBin } from '../helpers/bin-process.js';
import { shScript, tempDir } from '../helpers/files.js';
import { bigBlogFixture, blogJsonl, blogJsonlPath } from '../helpers/fixtures.js';
import { within } from '../helpers/wait.js';

const dir = tempDir(t, 'kpng-e2e-pipes-');

/** `sh -c SCRIPT` with $BIN_JSON / $BIN_CALLOUT set to the bins' argv (as shell words); its status and stderr. */
function sh(script: string): Promise<{ code: number | null; stderr: string }> {
  const q = (argv: string[]): string => argv.map((a) => `'${a.replaceAll("'", `'\\''`)}'`).join(' ');
  const full = `BIN_JSON="${q(binArgv('kpng-json', []))}"; BIN_CALLOUT="${q(binArgv('kpng-callout', []))}"; ${script}`;
  return new Promise((resolve, reject) => {
    const p = spawn('/bin/sh', ['-c', full], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    p.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
    p.once('error', reject);
    p.once('close', (code) => resolve({ code, stderr }));
  });
}

t.test("stderr's reader gone or a full disk: log lines are dropped, the output is all there, exit 0", async (t) => {
  const expected = readFileSync(blogJsonlPath, 'utf8');
  const out = join(dir, 'out.jsonl');
  const piped = await within(sh(`eval "$BIN_JSON replay ${blogJsonlPath}" 2>&1 >${out} | true; echo "status=\${?}" >&2; exit 0`), 'kpng-json');
  t.equal(readFileSync(out, 'utf8'), expected, '2>&1 >FILE | true: the state written');
  t.notMatch(piped.stderr, /throw|\n\s+at /, 'no crash');
  const status = await within(sh(`eval "$BIN_JSON replay ${blogJsonlPath}" 2>/dev/full >${out}; echo "status=$?" >&2`), 'kpng-json');
  t.match(status.stderr, /status=0/, '2>/dev/full: exit 0');
  t.equal(readFileSync(out, 'utf8'), expected);
  const callout = await within(sh(`eval "$BIN_CALLOUT replay --callout /bin/cat ${blogJsonlPath}" 2>/dev/full >${out}; echo "status=$?" >&2`), 'kpng-callout');
  t.match(callout.stderr, /status=0/, 'kpng-callout too');
  t.equal(readFileSync(out, 'utf8'), expected);
});

t.test('stdout on a full disk: exit 1 naming the error, never a silent 0', async (t) => {
  const r = await within(sh(`eval "$BIN_JSON replay ${blogJsonlPath}" >/dev/full; echo "status=$?" >&2`), 'kpng-json');
  t.match(r.stderr, /stdout: .*ENOSPC|stdout: no space/i);
  t.match(r.stderr, /status=1/);
});

t.test('replay - from a stdin that stays open: SIGTERM stops it at once, exit 0', async (t) => {
  const [file, ...args] = binArgv('kpng-json', ['replay', '-']);
  const p = spawn(file, args, { stdio: ['pipe', 'ignore', 'pipe'] });
  t.teardown(() => void p.kill('SIGKILL'));
  let stderr = '';
  p.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
  p.stdin.write(blogJsonl.slice(0, 40));
  await within(
    new Promise<void>((resolve) => {
      const check = (): void => void (/starting/.test(stderr) ? resolve() : setTimeout(check, 20));
      check();
    }),
    'the startup line',
  );
  const exited = new Promise<number | null>((resolve) => p.once('exit', (code) => resolve(code)));
  p.kill('SIGTERM');
  t.equal(await within(exited, 'exit after SIGTERM, stdin still open', 5000), 0);
  p.stdin.destroy();
});

t.test('a second SIGINT in replay: the callout killed, exit 130', async (t) => {
  const cb = shScript(dir, 'slow', 'cat >/dev/null; echo started >&2; exec sleep 1000\n');
  const p = runBin(t, 'kpng-callout', ['replay', '--callout', cb, blogJsonlPath]);
  await p.line('stderr', /\[run 1\] started/);
  p.proc.kill('SIGINT');
  await p.line('stderr', /SIGINT: stopping/);
  p.proc.kill('SIGINT');
  t.equal(await p.exited(), 130);
});

t.test('a stop signal while the last output drains into a reader that stalls: exit 0 soon, not killed by it', async (t) => {
  const big = bigBlogFixture(dir, 20_000);
  const [file, ...args] = binArgv('kpng-json', ['replay', '-vv', big]);
  // Its stdout is a pipe nobody reads: the output cannot drain.
  const p = spawn(file, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  t.teardown(() => void p.kill('SIGKILL'));
  p.stdout.pause();
  let stderr = '';
  p.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
  await within(
    new Promise<void>((resolve) => {
      const check = (): void => void (/state received/.test(stderr) ? resolve() : setTimeout(check, 20));
      check();
    }),
    'the state loaded',
  );
  const exited = new Promise<[number | null, NodeJS.Signals | null]>((resolve) => p.once('exit', (code, sig) => resolve([code, sig])));
  p.kill('SIGTERM');
  t.same(await within(exited, 'exit after SIGTERM', 8000), [0, null]);
});

t.test('a stop signal while a big fixture loads: the callout never runs, exit 0', async (t) => {
  const big = bigBlogFixture(dir, 50_000);
  const marker = join(dir, 'ran');
  const cb = shScript(dir, 'mark', `cat >/dev/null; touch ${marker}\n`);
  const p = runBin(t, 'kpng-callout', ['replay', '--callout', cb, big]);
  // The startup line comes before the fixture is read (about a second of synchronous parsing here).
  await p.line('stderr', /starting/);
  p.proc.kill('SIGTERM');
  t.equal(await p.exited(), 0);
  // Seen by the pipeline ("SIGTERM: stopping") or, a moment earlier, at start-up (an exit at once): never a run.
  t.throws(() => readFileSync(marker), 'the callout did not run');
});

t.test('a stop signal while the modules still load: a stop (exit 0), not death by the signal', async (t) => {
  // A loader hook holds the program's main module for 3 s and says when: the bin has started, its
  // own modules have not. Without handlers that early, SIGTERM would end it with the signal (143).
  const hooks = join(dir, 'slow-cli-hooks.mjs');
  writeFileSync(
    hooks,
    `import { writeSync } from 'node:fs';
export async function load(url, context, next) {
  if (url.endsWith('/dist/cli.js')) {
    writeSync(2, 'loading cli.js\\n');
    await new Promise((r) => setTimeout(r, 3000));
  }
  return next(url, context);
}
`,
  );
  const register = join(dir, 'slow-cli-register.mjs');
  writeFileSync(register, `import { register } from 'node:module';\nregister(${JSON.stringify(`file://${hooks}`)});\n`);
  for (const tool of ['kpng-json', 'kpng-callout']) {
    // binArgv's command line (tap's own NODE_OPTIONS left out), with the hook loaded first.
    const [file, ...args] = binArgv(tool, ['replay', blogJsonlPath]);
    const at = args.indexOf(process.execPath) + 1;
    const p = spawn(file, [...args.slice(0, at), '--import', register, ...args.slice(at)], { stdio: ['ignore', 'ignore', 'pipe'], env: { PATH: process.env.PATH } });
    t.teardown(() => void p.kill('SIGKILL'));
    let stderr = '';
    p.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
    await within(
      new Promise<void>((resolve) => {
        const check = (): void => void (/loading cli\.js/.test(stderr) ? resolve() : setTimeout(check, 10));
        check();
      }),
      () => `${tool}: the main module being loaded (stderr: ${stderr})`,
    );
    const exited = new Promise<[number | null, NodeJS.Signals | null]>((resolve) => p.once('exit', (code, signal) => resolve([code, signal])));
    p.kill('SIGTERM');
    t.same(await within(exited, `${tool}: exit after SIGTERM`, 10_000), [0, null], `${tool}: exit 0`);
    t.notMatch(stderr, /starting/, `${tool}: stopped before it started anything`);
  }
});
