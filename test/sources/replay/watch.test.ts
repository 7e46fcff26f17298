/**
 * replay --watch (src/sources/replay/watch.ts) on real files: edits re-run,
 * a broken fixture keeps the last good state, new files and the callout
 * re-run; editors' atomic saves, deletions and polling.
 */
import { mkdirSync, renameSync, rmSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import t, { type Test } from 'tap';
import type { Logger } from '../../../src/log.js';
import { runWatch, type WatchOptions } from '../../../src/sources/replay/watch.js';
import { replaceFile, tempDir } from '../../helpers/files.js';
import { blogJsonl, blogView, blogYaml, stateLine } from '../../helpers/fixtures.js';
import { gatedSink } from '../../helpers/gated-sink.js';
import { captureLog } from '../../helpers/sink.js';
import { pollUntil, within } from '../../helpers/wait.js';

const opts = (paths: string[], extra: Partial<WatchOptions> & { logger: Logger }): WatchOptions => ({ paths, ...blogView, ...extra });

/** Starts a watch of `paths` (debounce 20 ms) into a gated sink, with a captured log; stopped at the test's end. */
function watching(t: Test, paths: string[], extra: Partial<WatchOptions> = {}) {
  const log = captureLog();
  const s = gatedSink(true);
  const ac = new AbortController();
  const done = runWatch(opts(paths, { debounceMs: 20, logger: log.logger, ...extra }), s.sink, ac.signal);
  t.teardown(() => ac.abort());
  return { log, s, ac, done };
}

t.test('--watch: edits re-run, a broken fixture keeps the last good state, new files and the callout re-run', async (t) => {
  const dir = tempDir(t, 'replay-test-');
  const fx = join(dir, 'fixtures');
  mkdirSync(fx);
  writeFileSync(join(fx, 'a.jsonl'), stateLine('a1'));
  writeFileSync(join(fx, 'b.jsonl'), stateLine('b1'));
  const callout = join(dir, 'callout.sh');
  writeFileSync(callout, '#!/bin/sh\ncat\n');
  const { log, s, ac, done } = watching(t, [fx], { watchExtra: [callout] });
  t.equal(await s.waitFor(1), stateLine('a1'));
  t.equal(await s.waitFor(2), stateLine('b1'));
  await log.waitFor(/watching .* for changes/);

  writeFileSync(join(fx, 'a.jsonl'), stateLine('a2'));
  t.equal(await s.waitFor(3), stateLine('a2'), 'an edit re-runs that fixture');

  writeFileSync(join(fx, 'a.jsonl'), stateLine('a3').replace('"Name"', '"Nmae"'));
  const err = await log.waitFor(/error/);
  t.equal(
    err,
    `kpng-callout error: ${join(fx, 'a.jsonl')}:1:42: Service.Nmae: unknown field "Nmae" (expected one of Namespace, Name, Type, Labels, Annotations, IPs, IPFilters, MapIP, Ports, ExternalTrafficToLocal, SessionAffinity, InternalTrafficToLocal, HealthCheckNodePort) (keeping its last good state)`,
  );
  writeFileSync(join(fx, 'a.jsonl'), stateLine('a3').replace('"Name"', '"Nmae"')); // same error: not reported again
  writeFileSync(callout, '#!/bin/sh\ncat >/dev/null\n');
  t.equal(await s.waitFor(4), stateLine('a2'), 'the callout changed: the last good state runs again');

  writeFileSync(join(fx, 'a.jsonl'), stateLine('a4'));
  t.equal(await s.waitFor(5), stateLine('a4'), 'fixed: runs again');
  t.equal(log.matching(/error/).length, 1, 'the broken fixture was reported once');

  writeFileSync(join(fx, 'c.yaml'), blogYaml);
  t.equal(await s.waitFor(6), blogJsonl, 'a new file in the directory runs');
  writeFileSync(join(fx, 'notes.txt'), 'ignored');
  writeFileSync(join(fx, 'b.jsonl'), stateLine('b1')); // same content: no run
  writeFileSync(join(fx, 'b.jsonl'), stateLine('b2'));
  t.equal(await s.waitFor(7), stateLine('b2'));
  // An editor's atomic save: write a temporary file, rename it over the fixture.
  writeFileSync(join(dir, 'b.tmp'), stateLine('b3'));
  renameSync(join(dir, 'b.tmp'), join(fx, 'b.jsonl'));
  t.equal(await s.waitFor(8), stateLine('b3'), 'replaced by rename');
  t.equal(s.texts.length, 8);
  ac.abort();
  await within(done, 'the watcher to stop');
});

const ROUNDS = 25;

t.test('--watch on a single file survives many rounds of two atomic saves milliseconds apart', async (t) => {
  const dir = tempDir(t, 'replay-test-');
  const fx = join(dir, 's.jsonl');
  writeFileSync(fx, stateLine('r0'));
  const { log, s, ac, done } = watching(t, [fx]);
  t.equal(await s.waitFor(1), stateLine('r0'));
  await log.waitFor(/watching .* for changes/);
  for (let i = 1; i <= ROUNDS; i++) {
    replaceFile(fx, stateLine(`r${i}a`));
    await sleep(i % 4); // 0-3 ms apart: the stimulus, not a wait for a result
    replaceFile(fx, stateLine(`r${i}b`));
    // The pause before the next round is the time this run takes.
    await s.waitUntil(() => s.texts.at(-1) === stateLine(`r${i}b`), `round ${i}: the second save runs`);
  }
  t.ok(s.texts.length <= 1 + 2 * ROUNDS, 'at most one run per save');
  ac.abort();
  await within(done, 'the watcher to stop');
});

/** A --watch replay of one fixture (state `x`) with a watched callout file, after its first run. */
async function watchWithCallout(t: Test, extra: Partial<WatchOptions> = {}) {
  const dir = tempDir(t, 'replay-test-');
  const fx = join(dir, 's.jsonl');
  writeFileSync(fx, stateLine('x'));
  const callout = join(dir, 'callout.sh');
  writeFileSync(callout, '#!/bin/sh\n# 0\n');
  const { log, s, ac, done } = watching(t, [fx], { watchExtra: [callout], ...extra });
  await s.waitFor(1);
  await log.waitFor(/watching .* for changes/);
  return { fx, callout, log, s, ac, done };
}

t.test('--watch on the callout file survives many rounds of two atomic saves milliseconds apart', async (t) => {
  const { callout, s, ac, done } = await watchWithCallout(t);
  for (let i = 1; i <= ROUNDS; i++) {
    // The first save writes the content already in force (no run when read alone), the second a new one:
    // exactly one run per round, and only if the second save is seen.
    replaceFile(callout, `#!/bin/sh\n# ${i - 1}\n`);
    await sleep(i % 4);
    replaceFile(callout, `#!/bin/sh\n# ${i}\n`);
    t.equal(await s.waitFor(1 + i), stateLine('x'), `round ${i}: the last state runs again`);
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
  replaceFile(callout, '#!/bin/sh\n# 3\n');
  await s.waitFor(4);
  // Deleted and recreated at once (rm; cat > callout).
  unlinkSync(callout);
  writeFileSync(callout, '#!/bin/sh\n# 4\n');
  await s.waitFor(5);
  writeFileSync(callout, '#!/bin/sh\n# 5\n');
  await s.waitFor(6);
  // The fixture is still watched too.
  replaceFile(fx, stateLine('y'));
  t.equal(await s.waitFor(7), stateLine('y'));
  ac.abort();
  await within(done, 'the watcher to stop');
  t.equal(s.texts.length, 7);
});

t.test('--watch with polling (network file systems): edits, atomic saves, the callout', async (t) => {
  const { fx, callout, log, s, ac, done } = await watchWithCallout(t, { usePolling: true, pollIntervalMs: 50 });
  t.equal(s.texts[0], stateLine('x'));
  await log.waitFor(/watching .* for changes \(polling every 50 ms\)$/);
  writeFileSync(fx, stateLine('p1'));
  t.equal(await s.waitFor(2), stateLine('p1'), 'an in-place edit');
  for (let i = 2; i <= 6; i++) {
    replaceFile(fx, stateLine(`p${i}a`));
    replaceFile(fx, stateLine(`p${i}`));
    await s.waitUntil(() => s.texts.at(-1) === stateLine(`p${i}`), `polling round ${i}`);
  }
  const n = s.texts.length;
  replaceFile(callout, '#!/bin/sh\n# 1\n');
  t.equal(await s.waitFor(n + 1), stateLine('p6'), 'a callout change');
  unlinkSync(callout);
  await log.waitFor(new RegExp(`watch: poll ${callout}`));
  writeFileSync(callout, '#!/bin/sh\n# 2\n');
  t.equal(await s.waitFor(n + 2), stateLine('p6'), 'a callout deleted, then recreated');
  unlinkSync(fx);
  await log.waitFor(/s\.jsonl: gone; keeping its last good state/);
  writeFileSync(fx, stateLine('back'));
  t.equal(await s.waitFor(n + 3), stateLine('back'), 'a fixture deleted, then recreated');
  ac.abort();
  await within(done, 'the watcher to stop');
});

t.test('--watch: a fixture seen while it is written in steps is run once, whole; an empty one in between is never run', async (t) => {
  const dir = tempDir(t, 'replay-test-');
  const fx = join(dir, 's.yaml');
  const version = (n: number): string => blogYaml.replaceAll('10.0.0.55', `10.0.0.${n}`);
  const expected = (n: number): string => blogJsonl.replaceAll('10.0.0.55', `10.0.0.${n}`);
  writeFileSync(fx, version(1));
  const { log, s, ac, done } = watching(t, [fx]);
  await s.waitFor(1);
  await log.waitFor(/watching .* for changes/);
  // A program writing the new content in two steps, with a pause longer than the debounce: cut mid-line.
  const v2 = version(2);
  const cut = v2.indexOf('\n', v2.length / 2) - 3;
  writeFileSync(fx, v2.slice(0, cut));
  await sleep(250);
  writeFileSync(fx, v2);
  t.equal(await s.waitFor(2), expected(2), 'the whole new content');
  // Truncated, then written after a pause (vim's backupcopy=yes, a slow writer).
  const v3 = version(3);
  writeFileSync(fx, '');
  await sleep(250);
  writeFileSync(fx, v3);
  t.equal(await s.waitFor(3), expected(3));
  // Truncated, written much later (`kubectl get ... > file`): never the empty state.
  writeFileSync(fx, '');
  await log.waitFor(/s\.yaml: empty; waiting for its content/);
  writeFileSync(fx, version(4));
  t.equal(await s.waitFor(4), expected(4));
  await sleep(100);
  t.equal(s.texts.length, 4, 'nothing else ran: no cut state, no empty state');
  ac.abort();
  await within(done, 'the watcher to stop');
});

t.test('--watch: paths that appear later, a directory made again, a symlink pointed elsewhere', async (t) => {
  const dir = tempDir(t, 'replay-test-');
  const later = join(dir, 'later', 's.jsonl');
  const states = join(dir, 'states');
  const sub = join(dir, 'sub');
  mkdirSync(sub);
  writeFileSync(join(sub, 'f.jsonl'), stateLine('sub1'));
  writeFileSync(join(dir, 't1.jsonl'), stateLine('t1'));
  writeFileSync(join(dir, 't2.jsonl'), stateLine('t2'));
  const link = join(dir, 'link.jsonl');
  symlinkSync(join(dir, 't1.jsonl'), link);
  const { log, s, ac, done } = watching(t, [later, states, join(sub, 'f.jsonl'), link]);
  t.equal(await s.waitFor(1), stateLine('sub1'));
  t.equal(await s.waitFor(2), stateLine('t1'));
  await log.waitFor(/watching .* for changes/);

  mkdirSync(join(dir, 'later'));
  writeFileSync(later, stateLine('later'));
  t.equal(await s.waitFor(3), stateLine('later'), 'a file whose directory did not exist');
  mkdirSync(states);
  writeFileSync(join(states, '10-a.jsonl'), stateLine('states'));
  t.equal(await s.waitFor(4), stateLine('states'), 'a directory argument that did not exist');
  writeFileSync(join(states, '20-b.jsonl'), stateLine('states2'));
  t.equal(await s.waitFor(5), stateLine('states2'), 'and a new file in it');

  renameSync(sub, join(dir, 'sub.old'));
  mkdirSync(sub);
  writeFileSync(join(sub, 'f.jsonl'), stateLine('sub2'));
  t.equal(await s.waitFor(6), stateLine('sub2'), 'a directory renamed away and made again');
  writeFileSync(join(sub, 'f.jsonl'), stateLine('sub3'));
  t.equal(await s.waitFor(7), stateLine('sub3'), 'and later edits in it');

  unlinkSync(link);
  symlinkSync(join(dir, 't2.jsonl'), link);
  t.equal(await s.waitFor(8), stateLine('t2'), 'a symlink pointed at another file');
  writeFileSync(join(dir, 't2.jsonl'), stateLine('t2b'));
  t.equal(await s.waitFor(9), stateLine('t2b'), 'and edits of its new target');

  unlinkSync(later);
  await log.waitFor(/later\/s\.jsonl: gone/);
  writeFileSync(join(sub, 'f.jsonl'), stateLine('sub4'));
  t.equal(await s.waitFor(10), stateLine('sub4'));
  t.equal(log.matching(/: gone;/).length, 1, 'a deletion is told once');
  ac.abort();
  await within(done, 'the watcher to stop');
});

t.test('--watch: a directory argument deleted is told as gone (info, once per going), its states kept, not an error', async (t) => {
  const dir = tempDir(t, 'replay-test-');
  const fx = join(dir, 'fx');
  mkdirSync(fx);
  writeFileSync(join(fx, 'a.jsonl'), stateLine('a1'));
  const { log, s, ac, done } = watching(t, [fx]);
  t.equal(await s.waitFor(1), stateLine('a1'));
  await log.waitFor(/watching .* for changes/);
  rmSync(fx, { recursive: true });
  await log.waitFor(/fx: gone; keeping the last good states of its fixtures until it comes back/);
  mkdirSync(fx);
  writeFileSync(join(fx, 'a.jsonl'), stateLine('a2'));
  t.equal(await s.waitFor(2), stateLine('a2'), 'back, with a new state');
  rmSync(fx, { recursive: true });
  await pollUntil(() => log.matching(/fx: gone;/).length === 2, 'the second going told too');
  t.same(log.matching(/error/), [], 'no error');
  t.equal(s.states.length, 2, 'no run for the goings');
  ac.abort();
  await within(done, 'the watcher to stop');
});

t.test('--watch: an empty directory argument: told once while empty, its going told as gone, not an error', async (t) => {
  const dir = tempDir(t, 'replay-test-');
  const fx = join(dir, 'fx');
  mkdirSync(fx);
  const other = join(dir, 'other.jsonl');
  writeFileSync(other, stateLine('o1'));
  const { log, s, ac, done } = watching(t, [fx, other]);
  t.equal(await s.waitFor(1), stateLine('o1'));
  await log.waitFor(/watching .* for changes/);
  // Batches for another fixture: the emptiness is not told again.
  writeFileSync(other, stateLine('o2'));
  t.equal(await s.waitFor(2), stateLine('o2'));
  writeFileSync(other, stateLine('o3'));
  t.equal(await s.waitFor(3), stateLine('o3'));
  t.equal(log.matching(/fx: no fixture files yet/).length, 1, 'told once while it stays empty');
  rmSync(fx, { recursive: true });
  await log.waitFor(/fx: gone; watching for it to come back/);
  mkdirSync(fx);
  await pollUntil(() => log.matching(/fx: no fixture files yet/).length === 2, 'back empty: told again');
  writeFileSync(join(fx, 'a.jsonl'), stateLine('a'));
  t.equal(await s.waitFor(4), stateLine('a'), 'a fixture in it runs');
  t.same(log.matching(/error/), [], 'no error');
  t.equal(log.matching(/no fixture files yet/).length, 2, 'the emptiness told once per time it is empty');
  ac.abort();
  await within(done, 'the watcher to stop');
});

t.test('--watch: a callout truncated, then written after a pause, runs the last state again once', async (t) => {
  const { callout, s, ac, done } = await watchWithCallout(t);
  writeFileSync(callout, '');
  await sleep(250);
  writeFileSync(callout, '#!/bin/sh\n# new\n');
  t.equal(await s.waitFor(2), stateLine('x'));
  await sleep(700);
  t.equal(s.texts.length, 2, 'one run: not for the empty program');
  ac.abort();
  await within(done, 'the watcher to stop');
});

t.test('--watch: a new fixture that stays empty for a while (`> file` of a slow writer) runs only with its content', async (t) => {
  const dir = tempDir(t, 'replay-test-');
  writeFileSync(join(dir, 'a.jsonl'), stateLine('a'));
  const { log, s, ac, done } = watching(t, [dir]);
  await s.waitFor(1);
  await log.waitFor(/watching .* for changes/);
  writeFileSync(join(dir, 'b.jsonl'), '');
  await log.waitFor(/b\.jsonl: empty; waiting for its content/);
  writeFileSync(join(dir, 'b.jsonl'), stateLine('b'));
  t.equal(await s.waitFor(2), stateLine('b'));
  t.equal(s.texts.length, 2, 'no empty state ran');
  ac.abort();
  await within(done, 'the watcher to stop');
});
