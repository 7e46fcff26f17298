/**
 * resync-timer.ts on a fake clock: a period starts at each restart, ends once,
 * and stop and restart forget what was due.
 */
import t from 'tap';
import { ResyncTimer } from '../../src/runner/resync-timer.js';
import { FakeClock } from './harness.js';

t.test('a period from each restart; restart forgets a due resync; stop ends it; 0 never fires', async (t) => {
  const clock = new FakeClock();
  const ended: number[] = [];
  const r = new ResyncTimer(1000, clock.timers, () => ended.push(clock.now()));
  r.restart();
  clock.advance(600);
  r.restart(); // a full run at 600: the period starts again
  clock.advance(999);
  t.same(ended, []);
  clock.advance(1);
  t.same(ended, [1600], 'one period after the last restart');
  clock.advance(5000);
  t.same(ended, [1600], 'once: the next period starts at the next restart');
  r.due = true;
  r.restart();
  t.equal(r.due, false, 'a full run hands the state over: nothing due any more');
  r.stop();
  clock.advance(5000);
  t.same(ended, [1600], 'stopped');
  const never = new ResyncTimer(0, clock.timers, () => ended.push(-1));
  never.restart();
  clock.advance(1e9);
  t.same(ended, [1600], 'period 0: no resync');
});
