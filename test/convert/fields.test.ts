/**
 * The typed field reader (src/convert/fields.ts): absent (undefined, null)
 * reads as undefined, a wrong type throws a ConversionError naming the path,
 * in the same words for Kubernetes objects and fixture items.
 */
import t from 'tap';
import { ConversionError, Fields, describeValue, formatPath } from '../../src/convert/fields.js';

/** The message a read throws, or 'ok'. */
function errorOf(read: () => unknown): string {
  try {
    read();
    return 'ok';
  } catch (err) {
    if (err instanceof ConversionError) return err.message;
    throw err;
  }
}

t.test('paths and values as messages show them', async (t) => {
  t.equal(formatPath(['spec', 'ports', 0, 'port']), 'spec.ports[0].port');
  t.equal(formatPath([0, 'Service']), '[0].Service');
  t.equal(formatPath([]), '(object)');
  t.same([null, [], {}, '80', 7, true, undefined].map(describeValue), ['null', 'a list', 'an object', '"80"', '7', 'true', 'undefined']);
  const e = new ConversionError(['a', 1], 'bad', 3);
  t.equal(e.message, 'a[1]: bad');
  t.equal(e.reason, 'bad');
  t.same(e.path, ['a', 1]);
  t.equal(e.index, 3);
  t.equal(e.name, 'ConversionError');
});

t.test('scalars: absent is undefined, the right type passes, a wrong one throws', async (t) => {
  /** The fields of `{x: v}`. */
  const x = (v: unknown) => Fields.read({ x: v }, [])!;
  for (const read of ['string', 'int32', 'bool', 'list', 'strings', 'stringMap', 'object'] as const) {
    t.equal(x(undefined)[read]('x'), undefined, `${read}(undefined)`);
    t.equal(x(null)[read]('x'), undefined, `${read}(null)`);
    t.equal(Fields.read({}, [])![read]('x'), undefined, `${read}(missing)`);
  }
  t.equal(x('').string('x'), '');
  t.equal(x(false).bool('x'), false);
  t.equal(x(-(2 ** 31)).int32('x'), -(2 ** 31));
  t.equal(x(2 ** 31 - 1).int32('x'), 2 ** 31 - 1);
  t.same(x(['a', 'b']).strings('x'), ['a', 'b']);
  t.same(x([1, null]).list('x'), [1, null]);
  t.equal(errorOf(() => x(7).string('x')), 'x: expected a string, got 7');
  t.equal(errorOf(() => x('yes').bool('x')), 'x: expected true or false, got "yes"');
  t.equal(errorOf(() => x('80').int32('x')), 'x: expected an integer, got "80"');
  t.equal(errorOf(() => x(1.5).int32('x')), 'x: expected an integer, got 1.5');
  t.equal(errorOf(() => x(2 ** 31).int32('x')), 'x: expected a 32-bit integer, got 2147483648');
  t.equal(errorOf(() => x({}).list('x')), 'x: expected a list, got an object');
  t.equal(errorOf(() => x(['a', null]).strings('x')), 'x[1]: expected a string, got null');
  t.equal(errorOf(() => x('a').strings('x')), 'x: expected a list, got "a"');
});

t.test('objects: fields read with their paths; unknown keys rejected when the allowed ones are given', async (t) => {
  const f = Fields.read({ name: 'n', port: 80, on: true, tags: ['a'], labels: { a: 'b' }, sub: { k: 1 }, nul: null, list: [{ p: 1 }, null] }, ['o'])!;
  t.equal(f.string('name'), 'n');
  t.equal(f.int32('port'), 80);
  t.equal(f.bool('on'), true);
  t.same(f.strings('tags'), ['a']);
  t.same(f.stringMap('labels'), { a: 'b' });
  t.equal(f.object('sub')!.int32('k'), 1);
  t.same(f.object('sub')!.path, ['o', 'sub']);
  t.equal(f.object('nul'), undefined);
  t.equal(f.has('nul'), false);
  t.equal(f.has('name'), true);
  t.equal(f.value('port'), 80);
  t.same(f.at('list', 1), ['o', 'list', 1]);
  t.same(
    f.map('list', (v, path) => [v === null ? null : Fields.orEmpty(v, path).int32('p'), path]),
    [
      [1, ['o', 'list', 0]],
      [null, ['o', 'list', 1]],
    ],
  );
  t.equal(f.map('missing', () => 1), undefined);
  t.equal(errorOf(() => f.string('port')), 'o.port: expected a string, got 80');
  t.equal(errorOf(() => f.object('name')), 'o.name: expected an object, got "n"');
  t.equal(errorOf(() => f.object('list')), 'o.list: expected an object, got a list');
  t.equal(errorOf(() => Fields.read({ labels: { a: 1 } }, [])!.stringMap('labels')), 'labels.a: expected a string, got 1');
  t.equal(errorOf(() => Fields.read({ Name: 'x', Nmae: 'y' }, ['Service'], ['Name'])), 'Service.Nmae: unknown field "Nmae" (expected one of Name)');
});

t.test('absent objects: undefined, an error, or an object without fields', async (t) => {
  t.equal(Fields.read(null, ['a']), undefined);
  t.equal(errorOf(() => Fields.require(null, ['a', 0])), 'a[0]: expected an object, got null');
  t.equal(errorOf(() => Fields.require('x', ['a'])), 'a: expected an object, got "x"');
  const empty = Fields.orEmpty(undefined, ['spec']);
  t.equal(empty.string('type'), undefined);
  t.same(empty.at('type'), ['spec', 'type']);
  t.equal(errorOf(() => Fields.orEmpty(7, ['spec'])), 'spec: expected an object, got 7');
});

t.test('objects reached through others: their paths are made when an error needs them, and are the same', async (t) => {
  const f = Fields.read({ a: { b: { c: 'x' } }, list: [{ n: 1 }, null, 'bad', { n: 'two' }] }, ['o'])!;
  const b = f.object('a')!.object('b')!;
  t.same(b.path, ['o', 'a', 'b']);
  t.equal(errorOf(() => b.int32('c')), 'o.a.b.c: expected an integer, got "x"');
  t.same(b.at('c', 2), ['o', 'a', 'b', 'c', 2]);
  const items = f.list('list')!;
  t.same(f.element(items[0], 'list', 0).path, ['o', 'list', 0]);
  t.equal(f.element(items[0], 'list', 0).int32('n'), 1);
  t.equal(f.element(items[1], 'list', 1).int32('n'), undefined, 'absent: an object without fields');
  t.same(f.element(items[1], 'list', 1).path, ['o', 'list', 1]);
  t.equal(errorOf(() => f.element(items[2], 'list', 2)), 'o.list[2]: expected an object, got "bad"');
  t.equal(errorOf(() => f.element(items[3], 'list', 3).int32('n')), 'o.list[3].n: expected an integer, got "two"');
  t.equal(errorOf(() => f.object('a', ['z'])), 'o.a.b: unknown field "b" (expected one of z)', 'allowed keys still checked');
});
