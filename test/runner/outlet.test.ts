/**
 * Outlet on in-process streams: writes and backpressure while the stream
 * works; once it errors or closes (or was dead from the start), writes are
 * dropped, waiters are released and `onBroken` is told once.
 */
import t from 'tap';
import { Writable } from 'node:stream';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { Outlet } from '../../src/runner/outlet.js';
import { slowStream } from './harness.js';

t.test('backpressure: write says when to wait, whenWritable fires on drain', async (t) => {
  const s = slowStream();
  const broken: string[] = [];
  const o = new Outlet(s.stream, (why) => broken.push(why));
  t.equal(o.write(Buffer.from('12345')), false, 'over the high-water mark');
  let woken = 0;
  const cancelled = o.whenWritable(() => woken--);
  o.whenWritable(() => woken++);
  cancelled();
  s.complete();
  await nextTurn();
  t.equal(woken, 1, 'the waiter ran, the cancelled one did not');
  t.same(s.got, ['12345']);
  t.same(broken, []);
});

t.test('a stream that errors (EPIPE) is broken for good: writes dropped, waiters released', async (t) => {
  const s = slowStream();
  const broken: string[] = [];
  const o = new Outlet(s.stream, (why) => broken.push(why));
  t.equal(o.write(Buffer.from('12345')), false);
  const woke = new Promise<void>((resolve) => o.whenWritable(resolve));
  s.fail(Object.assign(new Error('write EPIPE'), { code: 'EPIPE' }));
  await woke;
  t.same(broken, ['EPIPE'], 'told once, with the code');
  t.equal(o.write(Buffer.from('more')), true, 'never asks to wait again');
  t.same(s.got, ['12345'], 'dropped');
  let late = false;
  o.whenWritable(() => (late = true));
  t.notOk(late, 'not called synchronously');
  await Promise.resolve();
  t.ok(late, 'called on the next microtask');
  s.stream.emit('close');
  t.same(broken, ['EPIPE'], 'still told once');
});

t.test('a stream closed or destroyed before: broken from the start', async (t) => {
  const destroyed = new Writable({ write: (_c, _e, cb) => cb() });
  destroyed.destroy();
  const broken: string[] = [];
  const o = new Outlet(destroyed, (why) => broken.push(why));
  t.equal(o.write(Buffer.from('x')), true);
  const ended = new Writable({ write: (_c, _e, cb) => cb() });
  ended.end();
  t.equal(new Outlet(ended, () => {}).write(Buffer.from('x')), true, 'an ended stream takes nothing either');
});

t.test('a write that throws breaks the outlet', async (t) => {
  const broken: string[] = [];
  const throwing = new Writable({ write: (_c, _e, cb) => cb() });
  throwing.write = () => {
    throw Object.assign(new Error('boom'), { code: 'EBADF' });
  };
  const o = new Outlet(throwing, (why) => broken.push(why));
  t.equal(o.write(Buffer.from('x')), true);
  t.same(broken, ['EBADF']);
});
