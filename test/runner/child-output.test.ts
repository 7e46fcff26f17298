/**
 * ChildOutput on a stand-in child (an EventEmitter with PassThrough pipes):
 * stdout forwarded unchanged and stderr as lines, backpressure from our side,
 * and the bounded read after the exit: to the end when the pipes close,
 * given up when they stay open and quiet, or when output keeps flowing.
 */
import t from 'tap';
import type { ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { PassThrough, Writable } from 'node:stream';
import { setImmediate as nextTurn, setTimeout as sleep } from 'node:timers/promises';
import { ChildOutput } from '../../src/runner/child-output.js';
import { Outlet } from '../../src/runner/outlet.js';
import { StderrLines, textLineFormat } from '../../src/runner/stderr-lines.js';
import { captureLog } from '../helpers/sink.js';
import { Sink, slowStream } from './harness.js';

function fakeChild() {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  const ee = Object.assign(new EventEmitter(), { stdout, stderr });
  return { child: ee as unknown as ChildProcess, stdout, stderr, close: () => ee.emit('close', 0, null) };
}

function setup(out: NodeJS.WritableStream = new Sink(), pipeDrainMs = 30) {
  const c = fakeChild();
  const err = new Sink();
  const log = captureLog();
  const lines = new StderrLines(textLineFormat(1));
  const output = new ChildOutput(c.child, {
    out: new Outlet(out, () => {}),
    err: new Outlet(err, () => {}),
    stderrLines: lines,
    pipeDrainMs,
    logger: log.logger,
    fields: { run: 1 },
  });
  return { ...c, output, err, log, lines };
}

t.test('stdout unchanged, stderr by lines; read to the end when the pipes close', async (t) => {
  const out = new Sink();
  const c = setup(out, 60_000);
  c.stdout.write('raw \u00fc');
  c.stderr.write('one\ntw');
  await out.waitFor('raw');
  await c.err.waitFor('[run 1] one\n');
  c.output.noteExit();
  c.stdout.end('\n');
  c.stderr.end('o');
  setImmediate(c.close);
  await c.output.drain(() => false);
  t.equal(out.text(), 'raw \u00fc\n');
  t.equal(c.err.text(), '[run 1] one\n[run 1] two\n', 'the final partial line is written');
  t.equal(c.lines.tail(), 'one\ntwo');
  t.equal(c.log.lines.length, 0, 'nothing to say');
});

t.test('pipes held open and quiet after the exit: reading stops after pipeDrainMs', async (t) => {
  const c = setup(new Sink(), 30);
  c.stderr.write('partial');
  c.output.noteExit();
  const t0 = Date.now();
  await c.output.drain(() => false);
  t.ok(Date.now() - t0 < 5000);
  t.ok(c.stdout.destroyed && c.stderr.destroyed, 'the pipes are let go');
  t.equal(c.err.text(), '[run 1] partial\n');
  t.match(c.log.lines, [/debug: callout exited but its output is still open \(background process\?\): stop reading run=1$/]);
});

t.test('backpressure: a pipe pauses while our side is full, and resumes on drain', async (t) => {
  const slow = slowStream(1);
  const c = setup(slow.stream, 30);
  c.stdout.write('x');
  await nextTurn();
  t.ok(c.stdout.isPaused(), 'paused');
  slow.complete();
  await nextTurn();
  t.notOk(c.stdout.isPaused(), 'resumed');
});

t.test('while our side is blocked, the drain waits for it unless the run was killed', async (t) => {
  const slow = slowStream(1);
  const c = setup(slow.stream, 20);
  c.stdout.write('x');
  await nextTurn();
  c.output.noteExit();
  let finished = false;
  const drained = c.output.drain(() => false).then(() => (finished = true));
  await sleep(100); // five quiet periods: still waiting on us
  t.notOk(finished, 'not given up while only our output holds it');
  slow.complete();
  c.stdout.end();
  c.stderr.end();
  c.close();
  await drained;

  const k = setup(new Writable({ highWaterMark: 1, write: () => {} }), 20);
  k.stdout.write('x');
  await nextTurn();
  k.output.noteExit();
  await k.output.drain(() => true);
  t.ok(k.stdout.destroyed, 'killed: given up at the first quiet period');
});

t.test('output that keeps flowing after the exit: reading stops past 4 MiB', async (t) => {
  const c = setup(new Sink(), 1000);
  c.output.noteExit();
  const chunk = Buffer.alloc(64 * 1024, 0x61);
  let writing = true;
  const pump = (): void => {
    if (!writing || c.stdout.destroyed) return;
    c.stdout.write(chunk);
    setImmediate(pump);
  };
  pump();
  await c.output.drain(() => false);
  writing = false;
  t.ok(c.stdout.destroyed, 'a background writer does not hold the run');
});
