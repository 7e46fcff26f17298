/**
 * A state's lines packed into blocks: each block is one Buffer holding up to
 * `LINES_PER_BLOCK` consecutive lines, and each line is a view into its block.
 *
 * Why: a full state is written to a callout's stdin as the blocks, ~160
 * Buffers at 10,000 Services instead of 10,000. Measured (2 cores, 15 MB
 * state, spawn to the callout's EOF): one writev of 10,000 Buffers p50
 * 13–15 ms, of 157 blocks 9.6–10.6 ms, the same as one 15 MB Buffer; the
 * per-Buffer cost is in Node's stream and libuv, not in our code. Views keep
 * the memory what it was: every byte is held once, by its block.
 *
 * A store's states are made of blocks too (`packedState`): the next state
 * shares the blocks, and their arrays of lines, that a change did not touch,
 * and `forDifferentLines` compares two states block by block.
 */
import type { State } from './state.js';

/** Lines per block: 64 lines of ~1.5 KB make ~100 KB blocks. */
export const LINES_PER_BLOCK = 64;

/**
 * Packs `parts` (a line as a string to encode, or as bytes to copy) into one
 * block, and stores the view of each part into `lines[at + i]`. Returns the
 * block. A string is written as `Buffer.from` would encode it.
 */
export function packBlock(parts: readonly (string | Buffer)[], lines: Buffer[], at: number): Buffer {
  let total = 0;
  const sizes: number[] = new Array(parts.length);
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i]!;
    const n = typeof p === 'string' ? Buffer.byteLength(p, 'utf8') : p.length;
    sizes[i] = n;
    total += n;
  }
  const block = Buffer.allocUnsafeSlow(total);
  let off = 0;
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i]!;
    const n = sizes[i]!;
    if (typeof p === 'string') block.write(p, off, n, 'utf8');
    else p.copy(block, off);
    lines[at + i] = block.subarray(off, off + n);
    off += n;
  }
  return block;
}

/** Packs every line (strings or bytes) into blocks: the blocks, and each block's lines (views). */
export function packLines(parts: readonly (string | Buffer)[]): { blocks: Buffer[]; lineBlocks: Buffer[][] } {
  const blocks: Buffer[] = new Array(Math.ceil(parts.length / LINES_PER_BLOCK));
  const lineBlocks: Buffer[][] = new Array(blocks.length);
  for (let b = 0; b < blocks.length; b++) {
    const slice = parts.slice(b * LINES_PER_BLOCK, (b + 1) * LINES_PER_BLOCK);
    const views: Buffer[] = new Array(slice.length);
    blocks[b] = packBlock(slice, views, 0);
    lineBlocks[b] = views;
  }
  return { blocks, lineBlocks };
}

/**
 * A state of the store: `lines` is made from `lineBlocks` when first read
 * (an own enumerable property, so that `{ ...state }` keeps it): a
 * one-Service change allocates one block's array of views, not a copy of
 * every line's (at 10,000 Services, 80 KB per state, most of what each
 * revision left for the young-generation collector; measured by
 * bench/run.js (m)).
 */
export function packedState(blocks: readonly Buffer[], lineBlocks: readonly (readonly Buffer[])[], keys: readonly string[], endpoints: number, bytes: number): State {
  let flat: readonly Buffer[] | undefined;
  const state = { blocks, lineBlocks, keys, services: keys.length, endpoints, bytes } as State;
  Object.defineProperty(state, 'lines', { enumerable: true, get: () => (flat ??= lineBlocks.flat()) });
  return state;
}

/**
 * Calls `f` with the lines of `a` and `b` (same Services, same order) that
 * may differ, until it returns false: all of them, or, when both have
 * `lineBlocks`, those of the blocks they do not share.
 */
export function forDifferentLines(a: State, b: State, f: (x: Buffer, y: Buffer) => boolean | void): void {
  const ab = a.lineBlocks;
  const bb = b.lineBlocks;
  if (ab && bb && ab.length === bb.length) {
    for (let k = 0; k < ab.length; k++) {
      const x = ab[k]!;
      const y = bb[k]!;
      if (x === y) continue;
      for (let i = 0; i < x.length; i++) if (f(x[i]!, y[i]!) === false) return;
    }
    return;
  }
  const al = a.lines;
  const bl = b.lines;
  for (let i = 0; i < al.length; i++) if (f(al[i]!, bl[i]!) === false) return;
}
