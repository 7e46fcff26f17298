/**
 * The one error class: its code, the exit status it may ask for, its cause;
 * and the wording of a bad option value.
 */
import t from 'tap';
import { CalloutError, usageError } from '../src/errors.js';

t.test('a CalloutError is an Error with a code, an optional exit status and a cause', async (t) => {
  const cause = new Error('EACCES');
  const e = new CalloutError('callout', 'callout /x: is not executable', { cause, exitCode: 126 });
  t.ok(e instanceof Error);
  t.equal(e.name, 'CalloutError');
  t.equal(e.code, 'callout');
  t.equal(e.message, 'callout /x: is not executable');
  t.equal(e.exitCode, 126);
  t.equal(e.cause, cause);
  t.match(String(e), /^CalloutError: callout \/x: is not executable$/);

  const plain = new CalloutError('input', 'bad fixture');
  t.equal(plain.exitCode, undefined, "no exit status of its own: the code's usual one applies");
  t.equal(plain.cause, undefined);
});

t.test('usageError: the option, what was given and what was expected', async (t) => {
  const e = usageError('--api', '127.0.0.1:99999', 'port out of range 1-65535');
  t.ok(e instanceof CalloutError);
  t.equal(e.code, 'usage');
  t.equal(e.message, '--api 127.0.0.1:99999: port out of range 1-65535');
  t.equal(e.exitCode, undefined);
});
