/**
 * Test doubles that are real parts: a StateSink that records what a source
 * pushes, and a Logger (the real one) writing into an array.
 */
import { EventEmitter, once } from 'node:events';
import { createLogger, type Logger } from '../../src/log.js';
import type { SourceStatus, StateSink } from '../../src/source.js';
import { stateText, type State } from '../../src/state.js';
import { within } from './wait.js';

export interface RecordingSink extends StateSink {
  readonly states: State[];
  readonly statuses: SourceStatus[];
  /** Texts of the states pushed so far. */
  texts(): string[];
  /** Resolves when `n` states in total were pushed. */
  waitForStates(n: number): Promise<State>;
  /** Resolves when a status matching `pred` was reported (past ones count). */
  waitForStatus(pred: (s: SourceStatus) => boolean): Promise<SourceStatus>;
}

/**
 * `push` returns a promise that never settles, like a callout that never
 * ends: a live source must not wait on it.
 */
export function recordingSink(): RecordingSink {
  const ee = new EventEmitter();
  const states: State[] = [];
  const statuses: SourceStatus[] = [];
  return {
    states,
    statuses,
    push(state) {
      states.push(state);
      ee.emit('state');
      return new Promise<void>(() => {});
    },
    status(s) {
      statuses.push(s);
      ee.emit('status');
    },
    texts: () => states.map(stateText),
    async waitForStates(n) {
      while (states.length < n) await within(once(ee, 'state'), `waiting for state #${n} (have ${states.length})`);
      return states[n - 1]!;
    },
    async waitForStatus(pred) {
      for (;;) {
        const hit = statuses.find(pred);
        if (hit) return hit;
        await within(once(ee, 'status'), 'waiting for a status');
      }
    },
  };
}

export interface CapturedLog {
  logger: Logger;
  lines: string[];
  /** Resolves with the first line (past or future) matching `re`. */
  waitFor(re: RegExp): Promise<string>;
  matching(re: RegExp): string[];
}

/** The real text logger at debug verbosity, into an array. */
export function captureLog(): CapturedLog {
  const ee = new EventEmitter();
  const lines: string[] = [];
  const logger = createLogger({
    verbosity: 1,
    write: (line) => {
      lines.push(line.replace(/\n$/, ''));
      ee.emit('line');
    },
  });
  return {
    logger,
    lines,
    matching: (re) => lines.filter((l) => re.test(l)),
    async waitFor(re) {
      for (;;) {
        const hit = lines.find((l) => re.test(l));
        if (hit !== undefined) return hit;
        await within(once(ee, 'line'), `waiting for a log line matching ${re}`);
      }
    },
  };
}
