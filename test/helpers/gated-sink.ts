/**
 * A StateSink for sources that await each push (replay): the test decides
 * when a push settles, or lets each settle at once, and can wait for the
 * n-th push or for a condition checked after every push.
 */
import { EventEmitter, once } from 'node:events';
import type { StateSink } from '../../src/source.js';
import { stateText, type State } from '../../src/state.js';
import { within } from './wait.js';

export interface GatedSink {
  sink: StateSink;
  /** Texts of the states pushed so far. */
  readonly texts: string[];
  readonly states: State[];
  /** The most pushes ever unsettled at once. */
  readonly maxInFlight: number;
  /** Settles the oldest unsettled push. */
  finish(): void;
  /** Resolves with the text of push #n (1-based), past or future. */
  waitFor(n: number): Promise<string>;
  /** Resolves when `pred` holds, checked after every push. */
  waitUntil(pred: () => boolean, what: string): Promise<void>;
}

/** A sink whose pushes settle only when the test calls `finish()` (or at once with `auto`). */
export function gatedSink(auto = false): GatedSink {
  const ee = new EventEmitter();
  const texts: string[] = [];
  const states: State[] = [];
  const gates: Array<() => void> = [];
  let inFlight = 0;
  let maxInFlight = 0;
  const sink: StateSink = {
    push(state: State) {
      states.push(state);
      texts.push(stateText(state));
      inFlight++;
      maxInFlight = Math.max(maxInFlight, inFlight);
      ee.emit('push');
      return new Promise<void>((res) => {
        const done = () => {
          inFlight--;
          res();
        };
        if (auto) setImmediate(done);
        else gates.push(done);
      });
    },
  };
  return {
    sink,
    texts,
    states,
    get maxInFlight() {
      return maxInFlight;
    },
    finish() {
      gates.shift()?.();
    },
    async waitFor(n: number) {
      while (texts.length < n) await within(once(ee, 'push'), `waiting for push #${n} (have ${texts.length}: ${texts.join('|')})`);
      return texts[n - 1]!;
    },
    async waitUntil(pred: () => boolean, what: string) {
      while (!pred()) await within(once(ee, 'push'), `${what} (have ${texts.length}, last ${texts.at(-1) ?? 'none'})`);
    },
  };
}
