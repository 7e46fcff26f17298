/**
 * The one debounce rule (the runner's states, replay --watch's file events):
 * due after the quiet time, but never later than max-wait after the first
 * event of a burst.
 */
import t from 'tap';
import { debounceDue } from '../src/debounce.js';

t.test('debounce: quiet time, bounded by max-wait from the first event', async (t) => {
  t.equal(debounceDue(0, 0, 100, 1000), 100);
  t.equal(debounceDue(0, 950, 100, 1000), 1000, 'max-wait wins');
  t.equal(debounceDue(0, 500, 0, 1000), 500, 'debounce 0: at once');
});

t.test('each new event moves the due time, until max-wait caps it', async (t) => {
  const first = 10_000;
  const dues = [0, 300, 600, 850, 900, 2000].map((after) => debounceDue(first, first + after, 100, 1000));
  t.same(dues, [10_100, 10_400, 10_700, 10_950, 11_000, 11_000]);
  t.equal(debounceDue(first, first, 5000, 1000), 11_000, 'a debounce longer than max-wait: max-wait bounds it');
  t.equal(debounceDue(first, first + 3000, 100, 1000), 11_000, 'an overdue burst is due at once (in the past)');
});
