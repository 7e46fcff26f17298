/**
 * An object's identity and labels (src/convert/kube-objects.ts): namespace
 * `default` when unset, a name required, labels type-checked.
 */
import t from 'tap';
import { ConversionError } from '../../src/convert/fields.js';
import { labelsOf, metadataOf, objectKey } from '../../src/convert/kube-objects.js';

t.test('objectKey: namespace defaults to default; a name is required', async (t) => {
  t.same(objectKey({ metadata: { name: 'web', namespace: 'prod' } }), { namespace: 'prod', name: 'web' });
  t.same(objectKey({ metadata: { name: 'web' } }), { namespace: 'default', name: 'web' });
  t.same(objectKey({ metadata: { name: 'web', namespace: '' } }), { namespace: 'default', name: 'web' });
  t.throws(() => objectKey({ metadata: { namespace: 'x' } }), new ConversionError(['metadata', 'name'], 'missing name'));
  t.throws(() => objectKey({}), { message: 'metadata.name: missing name' });
  t.throws(() => objectKey({ metadata: { name: 7 } }), { message: 'metadata.name: expected a string, got 7' });
  t.throws(() => objectKey({ metadata: [] }), { message: 'metadata: expected an object, got a list' });
});

t.test('labelsOf: the labels, or undefined; values must be strings', async (t) => {
  t.same(labelsOf({ metadata: { labels: { app: 'web' } } }), { app: 'web' });
  t.equal(labelsOf({ metadata: { labels: null } }), undefined);
  t.equal(labelsOf({}), undefined);
  t.throws(() => labelsOf({ metadata: { labels: { a: 1 } } }), { message: 'metadata.labels.a: expected a string, got 1' });
  t.same(metadataOf({}).path, ['metadata']);
});
