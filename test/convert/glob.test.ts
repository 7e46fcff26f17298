/**
 * Globs (src/convert/glob.ts): gobwas/glob syntax without separators, as kpng
 * matches label and annotation keys with it; lists split on commas outside
 * braces.
 */
import t from 'tap';
import { compileGlobs, filterMap, splitGlobList } from '../../src/convert/glob.js';

t.test('globs use gobwas/glob syntax without separators', async (t) => {
  const m = (globs: string[], key: string) => compileGlobs(globs)!.matches(key);
  t.ok(m(['*'], 'app.kubernetes.io/name'));
  t.ok(m(['app*'], 'app.kubernetes.io/name'));
  t.notOk(m(['app'], 'app.kubernetes.io/name'));
  t.ok(m(['?pp'], 'app'));
  t.ok(m(['[ab]pp'], 'bpp'));
  t.notOk(m(['[!ab]pp'], 'bpp'));
  t.ok(m(['[a-c]x'], 'bx'));
  t.ok(m(['{foo,bar}.io/*'], 'bar.io/x'));
  t.ok(m(['a\\*'], 'a*'));
  t.notOk(m(['a\\*'], 'ab'));
  t.ok(m(['x.y'], 'x.y'));
  t.notOk(m(['x.y'], 'xzy'));
  t.equal(compileGlobs([]), undefined);
  t.throws(() => compileGlobs(['[abc']), { message: 'invalid glob "[abc": unclosed [' });
  t.same(splitGlobList('a*,{b,c}d,,e'), ['a*', '{b,c}d', 'e']);
});

t.test('filterMap keeps the string entries whose key matches; nothing without a filter', async (t) => {
  const f = compileGlobs(['app*']);
  t.same(filterMap({ app: 'web', 'app.kubernetes.io/name': 'x', tier: 'front', appNum: 7 }, f), { app: 'web', 'app.kubernetes.io/name': 'x' });
  t.same(filterMap({ tier: 'front' }, f), {}, 'no match: present and empty');
  t.same(filterMap(null, f), {});
  t.equal(filterMap({ app: 'web' }, undefined), undefined);
});

t.test('filterMap keeps a key named __proto__ (a hand-written manifest may have one; kpng keeps it)', async (t) => {
  const src = JSON.parse('{"__proto__":"x","app":"y"}') as Record<string, unknown>;
  const out = filterMap(src, compileGlobs(['*']))!;
  t.same(Object.entries(out), [
    ['__proto__', 'x'],
    ['app', 'y'],
  ]);
});
