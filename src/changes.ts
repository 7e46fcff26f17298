/**
 * What a callout is given for a state (`--changes`): the full state, or the
 * change set from the last state it applied.
 *
 * A change set from P to N lists, in the full state's order (kpng order),
 * every Service (namespace/name) whose line differs between P and N: its P
 * line as `{"Previous":LINE}` if it was in P, then its N line (byte-identical
 * to the full state's) if it is in N. Unchanged Services are left out. A
 * state not in kpng order (a hand-written JSONL fixture keeps its file's
 * order) gives N's order, a removed Service right after the one before it in
 * P (or first).
 *
 * Cost: O(Services) pointer comparisons, bytes compared only for lines that
 * are not the same Buffer. A source's store keeps the line of every unchanged
 * Service as the same Buffer from one state to the next, except the other
 * lines of a re-packed block (line-blocks.ts: new views of the same bytes),
 * and the same keys array while no Service comes or goes; so at 10,000
 * Services a one-Service change compares ~160 block references and one
 * block's lines (~100 KB), never two 15 MB states (measured: ~2 ms when the
 * keys were compared as strings, well under 0.1 ms so).
 */
import { forDifferentLines } from './line-blocks.js';
import { comparePaths, type State } from './state.js';

/** What one run's stdin carries. */
export interface Input {
  kind: 'full' | 'changes';
  /** Written one after another. */
  chunks: readonly Buffer[];
  bytes: number;
}

/** The state as it is: its lines, packed in blocks when it has them (fewer, bigger writes). */
export function fullInput(state: State): Input {
  return { kind: 'full', chunks: state.blocks ?? state.lines, bytes: state.bytes };
}

/** The change set from `previous` to `state`, or the full state when there is no `previous`. */
export function inputFor(state: State, previous: State | undefined): Input {
  return previous ? changeSet(previous, state) : fullInput(state);
}

const PREVIOUS = Buffer.from('{"Previous":');
const CLOSE = Buffer.from('}\n');

/** A change set as it is written: `previous` lines and added lines, in order. */
class ChangeWriter {
  private readonly chunks: Buffer[] = [];
  private bytes = 0;

  /** `line` (with its newline) as `{"Previous":LINE}`. */
  previous(line: Buffer): void {
    this.chunks.push(PREVIOUS, line.subarray(0, line.length - 1), CLOSE);
    this.bytes += PREVIOUS.length + line.length - 1 + CLOSE.length;
  }

  add(line: Buffer): void {
    this.chunks.push(line);
    this.bytes += line.length;
  }

  input(): Input {
    return { kind: 'changes', chunks: this.chunks, bytes: this.bytes };
  }
}

/** Two lines differ: not the same Buffer, and not the same bytes. */
const differ = (a: Buffer, b: Buffer): boolean => a !== b && !a.equals(b);

/**
 * No Service's line differs between `prev` and `next` (their change set is
 * empty), `next` not being byte-identical to `prev`: its lines are reordered.
 * States of one store keep their keys array while no Service comes or goes,
 * and hold their Services in one order: then a difference is a changed line,
 * and nothing is computed (the daemon's hot path).
 */
export function onlyReordered(prev: State, next: State): boolean {
  if (prev.services !== next.services || (prev.keys !== undefined && prev.keys === next.keys)) return false;
  return changeSet(prev, next).bytes === 0;
}

/** The change set from `prev` (the state last applied) to `next`. */
export function changeSet(prev: State, next: State): Input {
  const w = new ChangeWriter();
  // The usual case: the same Services in the same order (a store reuses its keys array until a
  // Service comes or goes), so line i is Service i in both: references compared, nothing else.
  if (prev.keys !== undefined && prev.keys === next.keys && prev.services === next.services) {
    // Only the blocks the two states do not share (state.ts `lineBlocks`), when they have them.
    forDifferentLines(prev, next, (a, b) => {
      if (differ(a, b)) {
        w.previous(a);
        w.add(b);
      }
    });
    return w.input();
  }
  const pk = keyed(prev);
  const nk = keyed(next);
  if (!sorted(pk) || !sorted(nk)) return inStateOrder(pk, nk, w);
  let i = 0;
  let j = 0;
  while (i < pk.length || j < nk.length) {
    const a = pk[i];
    const b = nk[j];
    const c = a === undefined ? 1 : b === undefined ? -1 : a.key === b.key ? 0 : comparePaths(a.key, b.key);
    if (c < 0) {
      w.previous(a!.line);
      i++;
    } else if (c > 0) {
      w.add(b!.line);
      j++;
    } else {
      if (differ(a!.line, b!.line)) {
        w.previous(a!.line);
        w.add(b!.line);
      }
      i++;
      j++;
    }
  }
  return w.input();
}

interface Keyed {
  key: string;
  line: Buffer;
}

/** The state's lines with their Service keys, in the state's order. */
function keyed(s: State): Keyed[] {
  const keys = s.keys ?? s.lines.map(keyOfLine);
  return s.lines.map((line, i) => ({ key: keys[i]!, line }));
}

function sorted(k: readonly Keyed[]): boolean {
  for (let i = 1; i < k.length; i++) if (comparePaths(k[i - 1]!.key, k[i]!.key) > 0) return false;
  return true;
}

/** The change set of states not in kpng order: N's order, each removed Service after its predecessor in P. */
function inStateOrder(pk: readonly Keyed[], nk: readonly Keyed[], w: ChangeWriter): Input {
  const before = new Map(pk.map((k) => [k.key, k.line]));
  const inNext = new Set(nk.map((k) => k.key));
  // Removed Services, grouped under the nearest Service before them in P that N keeps ('' = none).
  const removedAfter = new Map<string, Buffer[]>();
  let anchor = '';
  for (const k of pk) {
    if (inNext.has(k.key)) anchor = k.key;
    else {
      const list = removedAfter.get(anchor);
      if (list) list.push(k.line);
      else removedAfter.set(anchor, [k.line]);
    }
  }
  for (const line of removedAfter.get('') ?? []) w.previous(line);
  for (const k of nk) {
    const old = before.get(k.key);
    if (old === undefined || differ(old, k.line)) {
      if (old !== undefined) w.previous(old);
      w.add(k.line);
    }
    for (const line of removedAfter.get(k.key) ?? []) w.previous(line);
  }
  return w.input();
}

/** `namespace/name` of a state line (for states built without their keys). */
function keyOfLine(line: Buffer): string {
  const svc = (JSON.parse(line.toString('utf8')) as { Service?: { Namespace?: string; Name?: string } | null }).Service;
  return `${svc?.Namespace ?? ''}/${svc?.Name ?? ''}`;
}
