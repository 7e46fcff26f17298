/**
 * The fixtures replay paths stand for, and reading one: files as given,
 * directories as their fixture files in name (byte) order, `-` as stdin.
 * Read as bytes, so that a binary file is named as such rather than decoded
 * into replacement characters (fixture.ts's `fixtureText`).
 */
import { readdir, readFile, stat } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { CalloutError } from '../../errors.js';
import { compareUtf8 } from '../../gojson.js';
import type { Logger } from '../../log.js';
import type { State } from '../../state.js';
import { fixtureText, isFixtureName, parseFixture, type FixtureOptions } from '../fixture.js';

/** How stdin is named in messages and in a state's `origin`. */
const STDIN_NAME = '<stdin>';

/** One fixture of the sequence: how it is named in messages and where it is. */
export interface Slot {
  /** As shown to the user: the path as given, or `dir/name`; `<stdin>` for `-`. */
  name: string;
  /** Absolute path; '' for stdin. */
  abs: string;
}

/** A file system error as a message says it. */
export function errnoText(err: unknown): string {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') return 'no such file or directory';
  if (code === 'EACCES') return 'permission denied';
  return `cannot read (${code ?? (err as Error).message})`;
}

/** Fixture files of a directory, in name (byte) order. */
async function listDir(dir: string): Promise<string[]> {
  const ents = await readdir(dir, { withFileTypes: true });
  return ents
    .filter((e) => (e.isFile() || e.isSymbolicLink()) && isFixtureName(e.name))
    .map((e) => e.name)
    .sort(compareUtf8);
}

/**
 * The fixtures `paths` stand for, now. Strict (`tolerant` false): a missing
 * path or a directory without fixtures throws CalloutError('input'). Tolerant
 * (--watch, where they may appear later): a missing path is kept as a file,
 * an unreadable directory skipped, and `onDir` told of each directory
 * argument read (its name as given, absolute path and number of fixtures,
 * 0 included).
 */
export async function expandPaths(
  paths: readonly string[],
  tolerant: boolean,
  onDir?: (dir: { name: string; abs: string; fixtures: number }) => void,
): Promise<Slot[]> {
  const out: Slot[] = [];
  for (const p of paths) {
    if (p === '-') {
      out.push({ name: STDIN_NAME, abs: '' });
      continue;
    }
    let isDir = false;
    try {
      isDir = (await stat(p)).isDirectory();
    } catch (err) {
      if (!tolerant) throw new CalloutError('input', `${p}: ${errnoText(err)}`, { cause: err });
    }
    if (!isDir) {
      out.push({ name: p, abs: resolve(p) });
      continue;
    }
    let names: string[];
    try {
      names = await listDir(p);
    } catch (err) {
      if (!tolerant) throw new CalloutError('input', `${p}: ${errnoText(err)}`, { cause: err });
      continue;
    }
    if (names.length === 0 && !tolerant) throw new CalloutError('input', `${p}: no fixture files (*.jsonl, *.ndjson, *.json, *.yaml, *.yml) in this directory`);
    onDir?.({ name: p, abs: resolve(p), fixtures: names.length });
    for (const n of names) out.push({ name: join(p, n), abs: resolve(p, n) });
  }
  return out;
}

/** Reads `s` to its end; an abort (a stop signal while stdin stays open) ends the read at once, by destroying `s`. */
async function readStream(s: NodeJS.ReadableStream, signal: AbortSignal | undefined): Promise<Buffer> {
  signal?.throwIfAborted();
  const chunks: Buffer[] = [];
  const stop = (): void => void (s as NodeJS.ReadableStream & { destroy?: () => void }).destroy?.();
  signal?.addEventListener('abort', stop, { once: true });
  try {
    for await (const c of s) chunks.push(typeof c === 'string' ? Buffer.from(c) : (c as Buffer));
  } finally {
    signal?.removeEventListener('abort', stop);
  }
  return Buffer.concat(chunks);
}

/**
 * A fixture's bytes (`-` from `stdin`); throws CalloutError('input') `name:
 * reason` when it cannot be read, and `signal`'s reason once it is aborted.
 */
export async function readSlot(slot: Slot, stdin: NodeJS.ReadableStream = process.stdin, signal?: AbortSignal): Promise<Buffer> {
  try {
    return slot.abs === '' ? await readStream(stdin, signal) : await readFile(slot.abs, { signal });
  } catch (err) {
    if (signal?.aborted) throw signal.reason;
    throw new CalloutError('input', `${slot.name}: ${errnoText(err)}`, { cause: err });
  }
}

/** The fixture's state, its `origin` set to the fixture's name. Throws CalloutError('input'). */
export function parseSlot(slot: Slot, data: Buffer, opts: FixtureOptions & { logger: Logger }): State {
  return stateOf(slot, fixtureText(data, slot.name), opts);
}

/**
 * Reads a fixture (as `readSlot`) and parses it (as `parseSlot`). The bytes
 * are read and decoded in a frame of their own, so that they can be
 * collected while the text is parsed: 60 MB less at the peak for a 60 MB dump.
 */
export async function loadSlot(slot: Slot, opts: FixtureOptions & { logger: Logger; stdin?: NodeJS.ReadableStream | undefined }, signal?: AbortSignal): Promise<State> {
  return stateOf(slot, await readSlotText(slot, opts.stdin, signal), opts);
}

async function readSlotText(slot: Slot, stdin: NodeJS.ReadableStream | undefined, signal: AbortSignal | undefined): Promise<string> {
  return fixtureText(await readSlot(slot, stdin, signal), slot.name);
}

function stateOf(slot: Slot, text: string, opts: FixtureOptions & { logger: Logger }): State {
  const state = parseFixture(text, slot.name, opts);
  opts.logger.debug(`${slot.name}: ${state.services} services, ${state.endpoints} endpoints`);
  return { ...state, origin: slot.name };
}

/** Says so when a state about to run is empty: legitimate, but to a data-plane callout it means "delete every rule". */
export function warnIfEmpty(st: State, log: Logger): void {
  if (st.services === 0) {
    log.warn(`${st.origin ?? STDIN_NAME}: no Services in this fixture: the state is empty (a data-plane callout given it deletes every rule it made)`);
  }
}
