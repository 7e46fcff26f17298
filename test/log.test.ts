/**
 * The logger's line formats and the once-a-minute rule for repeated failures
 * (createRepeatFilter), on a fake clock.
 */
import t from 'tap';
import { createLogger, createRepeatFilter } from '../src/log.js';

/** The real logger at debug verbosity, into an array. */
function capture(format: 'text' | 'json' = 'text') {
  const lines: string[] = [];
  const logger = createLogger({ format, verbosity: 1, write: (l) => lines.push(l.replace(/\n$/, '')), now: () => new Date(0) });
  return { logger, lines };
}

t.test('text and JSON lines keep their format', async (t) => {
  const { logger, lines } = capture();
  logger.info('msg', { k: 'v', n: 1, s: 'two words', u: undefined });
  t.same(lines, ['kpng-callout info: msg k=v n=1 s="two words"']);
  const j = capture('json');
  j.logger.warn('msg', { k: 'v' });
  t.same(JSON.parse(j.lines[0]!), { time: '1970-01-01T00:00:00.000Z', level: 'warn', msg: 'msg', k: 'v' });
});

t.test('a failure is loud when new, again at most once per interval, with the count in between', async (t) => {
  let now = 0;
  const f = createRepeatFilter({ intervalMs: 60_000, now: () => now });
  t.same(f.check('A'), { loud: true, repeated: 0 }, 'first occurrence');
  now = 1000;
  t.same(f.check('A'), { loud: false, repeated: 0 });
  now = 59_999;
  t.same(f.check('A'), { loud: false, repeated: 0 }, 'still within the minute');
  now = 60_000;
  t.same(f.check('A'), { loud: true, repeated: 2 }, 'a minute after the last loud one: loud, 2 went quiet');
  now = 61_000;
  t.same(f.check('A'), { loud: false, repeated: 0 }, 'the minute counts from the last loud one');
  // A change is news at once, and so is the change back.
  t.same(f.check('B'), { loud: true, repeated: 0 });
  t.same(f.check('A'), { loud: true, repeated: 0 });
  t.same(f.check('A'), { loud: false, repeated: 0 });
  // After clear() (connected again) the same failure is news.
  f.clear();
  t.same(f.check('A'), { loud: true, repeated: 0 });
  // The same failure after a quiet spell longer than the interval: loud, nothing repeated.
  now = 500_000;
  t.same(f.check('A'), { loud: true, repeated: 0 });
});

t.test('log(): the level when loud, debug in between, repeated=N on a loud repeat', async (t) => {
  let now = 0;
  const f = createRepeatFilter({ now: () => now }); // default interval: a minute
  const { logger, lines } = capture();
  const fail = (delay: number): void => f.log(logger, 'warn', `stream failed: refused; retrying in ${delay}ms`, { waiting: 'x' }, 'stream failed: refused');
  fail(500);
  now = 30_000;
  fail(1000);
  now = 45_000;
  fail(2000);
  now = 60_000;
  fail(4000);
  t.same(lines, [
    'kpng-callout warn: stream failed: refused; retrying in 500ms waiting=x',
    'kpng-callout debug: stream failed: refused; retrying in 1000ms waiting=x',
    'kpng-callout debug: stream failed: refused; retrying in 2000ms waiting=x',
    'kpng-callout warn: stream failed: refused; retrying in 4000ms waiting=x repeated=2',
  ]);
  // The key defaults to the message.
  lines.length = 0;
  f.log(logger, 'error', 'same');
  f.log(logger, 'error', 'same');
  t.same(lines, ['kpng-callout error: same', 'kpng-callout debug: same']);
  // Quiet lines are dropped at the default verbosity: one line per minute at most.
  const quietLines: string[] = [];
  const quietLogger = createLogger({ write: (l) => quietLines.push(l) });
  const g = createRepeatFilter({ now: () => now });
  for (let i = 0; i < 100; i++) g.log(quietLogger, 'warn', 'down');
  t.equal(quietLines.length, 1);
});
