/**
 * The node-local state: a store that applies localv1 ops (set, delete, reset)
 * and publishes immutable snapshots (`State`) of NDJSON lines in the reference
 * client's order. Each Service's line is cached and re-encoded only when the
 * Service or one of its endpoints changed.
 */
import { compareUtf8, encodeEndpoint, encodeLine, encodeService, encodeServiceEndpoints } from './gojson.js';
import { forDifferentLines, LINES_PER_BLOCK, packBlock, packedState, packLines } from './line-blocks.js';
import type { Endpoint, Service, ServiceEndpoints } from './model.js';

/** A complete node-local state, as the callout receives it. Immutable. */
export interface State {
  /** One NDJSON line per Service (each ends with `\n`), in kpng order. */
  readonly lines: readonly Buffer[];
  /**
   * The same bytes as `lines`, packed into few Buffers (line-blocks.ts): what
   * a full input writes. Absent: write `lines`.
   */
  readonly blocks?: readonly Buffer[] | undefined;
  /**
   * With `blocks`: each block's lines (views into it), `lines` cut in
   * blocks of LINES_PER_BLOCK. A store's next state shares the arrays of the
   * blocks it did not touch, so comparing two states (`sameState`, a change
   * set) skips them, and a one-Service change copies no 10,000-entry array.
   */
  readonly lineBlocks?: readonly (readonly Buffer[])[] | undefined;
  /** Number of Services. */
  readonly services: number;
  /** Number of Endpoints over all Services. */
  readonly endpoints: number;
  /** Total bytes of `lines`. */
  readonly bytes: number;
  /**
   * Each line's Service as `namespace/name` (same order as `lines`), for
   * change sets (changes.ts); read from the lines when absent.
   */
  readonly keys?: readonly string[] | undefined;
  /** Where this state came from, for logs (replay: the fixture's name); not part of its content. */
  readonly origin?: string;
}

/** The empty state. */
export const emptyState: State = Object.freeze({ lines: Object.freeze([]) as readonly Buffer[], services: 0, endpoints: 0, bytes: 0 });

/** Builds a state from already grouped items, keeping their order (replay). */
export function stateFromItems(items: readonly ServiceEndpoints[]): State {
  const { blocks, lineBlocks } = packLines(items.map((it) => encodeServiceEndpoints(it)));
  return packedState(
    blocks,
    lineBlocks,
    items.map((it) => `${it.Service.Namespace ?? ''}/${it.Service.Name ?? ''}`),
    items.reduce((n, it) => n + it.Endpoints.length, 0),
    blocks.reduce((n, b) => n + b.length, 0),
  );
}

/** True when two states would give the callout byte-identical input. */
export function sameState(a: State, b: State): boolean {
  if (a === b) return true;
  if (a.bytes !== b.bytes || a.services !== b.services) return false;
  // Packed states are compared by block (reading `lines` would build the flat array); others line by line.
  if (!(a.lineBlocks && b.lineBlocks) && a.lines.length !== b.lines.length) return false;
  let same = true;
  forDifferentLines(a, b, (x, y) => (same = x === y || x.equals(y)));
  return same;
}

/** The whole state as one string (tests, small outputs). */
export function stateText(s: State): string {
  return Buffer.concat(s.lines as Buffer[]).toString('utf8');
}

/**
 * kpng's path order: bytes compared in order, except that `/` sorts before
 * every other byte (so `default/a/x` follows `default/a`, never `default/a-b`).
 */
export const comparePaths = (a: string, b: string): number => compareUtf8(a, b, true);

/**
 * Flattens a string built by concatenation, in place (V8 flattens a cons
 * string on charCodeAt): a cached encoding otherwise keeps its whole tree of
 * pieces alive, about 1 KB per Service.
 */
export function flat(s: string): string {
  flatSink ^= s.charCodeAt(0); // a store, so that no optimizer drops the call
  return s;
}
let flatSink = 0;

/** Sorts paths in kpng order; a server sends them (nearly) sorted, so check first. */
function sortedPaths(paths: string[]): string[] {
  for (let i = 1; i < paths.length; i++) if (comparePaths(paths[i - 1]!, paths[i]!) > 0) return paths.sort(comparePaths);
  return paths;
}

/** `ns/name/pod` -> `ns/name`; undefined when the path has no service part. */
function serviceOfEndpoint(path: string): string | undefined {
  const a = path.indexOf('/');
  if (a < 0) return undefined;
  const b = path.indexOf('/', a + 1);
  return b < 0 ? undefined : path.slice(0, b);
}

/** `ns/name/pod` -> [`ns/name`, `pod`]; undefined when the path has no service part. */
export function splitEndpointPath(path: string): [string, string] | undefined {
  const svc = serviceOfEndpoint(path);
  return svc === undefined ? undefined : [svc, path.slice(svc.length + 1)];
}

/** An endpoint as set: its model value until encoded, then its JSON (the value is dropped). */
type EpValue = Endpoint | string;

interface SvcEntry {
  /** The model value until encoded (undefined when set as JSON). */
  value: Service | undefined;
  json: string | undefined;
  /** The cached line; undefined when the Service or one of its endpoints changed. */
  line: Buffer | undefined;
  /** Endpoints in `line`. */
  eps: number;
  /** Position in the ordered state (valid while the order is). */
  index: number;
}

/** Reports endpoints that have no Service (logged, never fatal). */
export type OrphanReporter = (endpointPaths: string[]) => void;

/**
 * The working copy a source applies ops to. Call `snapshot()` only when the
 * change set is complete (kpng `Sync`): a state built from part of a diff never
 * existed.
 *
 * Performance (bench/run.js): a snapshot after a change that adds or removes
 * no Service costs O(changed Services) plus one array copy, not a walk over
 * every Service (which, memory-bound, took ~3 ms for 10,000). Values are
 * encoded once and then kept only as JSON, which also keeps the heap small.
 */
export class Store {
  private readonly services = new Map<string, SvcEntry>();
  /** Service path -> its endpoints, keyed by their full path (same order as by key: one prefix). */
  private readonly endpoints = new Map<string, Map<string, EpValue>>();
  /** Service path -> the JSON of all its endpoints, in path order, set at once (`setEndpointsJson`). */
  private readonly wholes = new Map<string, readonly string[]>();
  /** The group the last endpoint op went to: streams send a Service's endpoints together. */
  private lastSvc = '';
  private lastGroup: Map<string, EpValue> | undefined;
  private readonly dirty = new Set<string>();
  /** False after a Service was added or deleted: the next snapshot sorts again (and renumbers `index`). */
  private ordered = true;
  private last: State = emptyState;
  private readonly onOrphans: OrphanReporter | undefined;

  constructor(options: { onOrphans?: OrphanReporter } = {}) {
    this.onOrphans = options.onOrphans;
  }

  setService(path: string, value: Service): void {
    this.putService(path, value, undefined);
  }

  /** Like setService, with the Service already encoded (gojson `encodeService`, or the wire fast path). */
  setServiceJson(path: string, json: string): void {
    this.putService(path, undefined, json);
  }

  private putService(path: string, value: Service | undefined, json: string | undefined): void {
    const had = this.services.get(path);
    if (had) {
      had.value = value;
      had.json = json;
    } else {
      this.services.set(path, { value, json, line: undefined, eps: 0, index: -1 });
      this.ordered = false;
    }
    this.dirty.add(path);
  }

  deleteService(path: string): void {
    if (this.services.delete(path)) {
      this.ordered = false;
      this.dirty.add(path);
    }
  }

  /** Sets the endpoint at `ns/name/key`; returns false for a path with no service part. */
  setEndpoint(path: string, value: Endpoint): boolean {
    return this.putEndpoint(path, value);
  }

  /** Like setEndpoint, with the Endpoint already encoded (gojson `encodeEndpoint`, or the wire fast path). */
  setEndpointJson(path: string, json: string): boolean {
    return this.putEndpoint(path, json);
  }

  private putEndpoint(path: string, value: EpValue): boolean {
    const last = this.lastSvc;
    // Fast path: the same Service as the last op (no split, no lookups; already dirty).
    if (this.lastGroup !== undefined && path.length > last.length + 1 && path.charCodeAt(last.length) === 0x2f && path.startsWith(last)) {
      this.lastGroup.set(path, value);
      return true;
    }
    const svc = serviceOfEndpoint(path);
    if (svc === undefined) return false;
    let group = this.endpoints.get(svc);
    if (!group) this.endpoints.set(svc, (group = new Map()));
    group.set(path, value);
    this.dirty.add(svc);
    this.lastSvc = svc;
    this.lastGroup = group;
    return true;
  }

  /**
   * Sets every endpoint of the Service `path` at once, encoded and in path
   * order; an empty list drops them. For a source that recomputes a
   * Service's endpoints as a whole (the Kubernetes API source): the store
   * keeps the list as given, not an entry per endpoint (at 10,000 Services ×
   * 10 endpoints the per-endpoint paths and maps took ~10 MB). Not mixed
   * with setEndpoint* / deleteEndpoint for one Service; not reported as
   * orphans.
   */
  setEndpointsJson(path: string, jsons: readonly string[]): void {
    if (jsons.length > 0) this.wholes.set(path, jsons);
    else if (!this.wholes.delete(path)) return;
    this.dirty.add(path);
  }

  deleteEndpoint(path: string): void {
    const svc = serviceOfEndpoint(path);
    if (svc === undefined) return;
    const group = this.endpoints.get(svc);
    if (group?.delete(path)) {
      if (group.size === 0) {
        this.endpoints.delete(svc);
        if (group === this.lastGroup) this.lastGroup = undefined;
      }
      this.dirty.add(svc);
    }
  }

  /** Drops everything (kpng `Reset`, or a new stream). */
  reset(): void {
    this.services.clear();
    this.endpoints.clear();
    this.wholes.clear();
    this.dirty.clear();
    this.lastGroup = undefined;
    this.ordered = true;
    this.last = emptyState;
  }

  get serviceCount(): number {
    return this.services.size;
  }

  /** The Service's JSON: as set with `setServiceJson`, or encoded by a snapshot (undefined: not there, or not encoded yet). */
  serviceJson(path: string): string | undefined {
    return this.services.get(path)?.json;
  }

  /** Encodes a Service's line from its (cached) JSON and its endpoints' (`entry.line` is set once it is packed). */
  private encode(path: string, entry: SvcEntry): string {
    if (entry.json === undefined) {
      entry.json = flat(encodeService(entry.value!));
      entry.value = undefined;
    }
    const group = this.endpoints.get(path);
    let eps: readonly string[] = this.wholes.get(path) ?? [];
    if (group) {
      const list: string[] = [];
      const keys = sortedPaths([...group.keys()]);
      for (const k of keys) {
        let v = group.get(k)!;
        if (typeof v !== 'string') group.set(k, (v = flat(encodeEndpoint(v))));
        list.push(v);
      }
      eps = list;
    }
    entry.eps = eps.length;
    return encodeLine(entry.json, eps);
  }

  /** The current complete state; unchanged services reuse their cached line. */
  snapshot(): State {
    if (this.dirty.size === 0 && this.ordered) return this.last;
    const orphans: string[] = [];
    const changed: string[] = [];
    for (const path of this.dirty) {
      if (this.services.has(path)) changed.push(path);
      else if (this.endpoints.has(path)) {
        for (const epPath of this.endpoints.get(path)!.keys()) orphans.push(epPath);
      }
    }
    this.dirty.clear();
    // Every group is dirty again for the next change set.
    this.lastGroup = undefined;
    if (orphans.length > 0) this.onOrphans?.(orphans);

    const { keys, blocks: lastBlocks, lineBlocks: lastLineBlocks } = this.last;
    if (this.ordered && keys !== undefined && lastBlocks !== undefined && lastLineBlocks !== undefined) {
      // Same Services as the last state: re-encode the changed ones, re-pack their blocks.
      const lineBlocks = lastLineBlocks.slice();
      const blocks = lastBlocks.slice();
      let bytes = this.last.bytes;
      let endpoints = this.last.endpoints;
      const fresh = new Map<number, string>();
      for (const path of changed) {
        const entry = this.services.get(path)!;
        bytes -= entry.line ? entry.line.length : 0;
        endpoints -= entry.eps;
        fresh.set(entry.index, this.encode(path, entry));
        endpoints += entry.eps;
      }
      const touched = new Set<number>();
      for (const i of fresh.keys()) touched.add(Math.floor(i / LINES_PER_BLOCK));
      for (const b of touched) {
        const at = b * LINES_PER_BLOCK;
        const old = lastLineBlocks[b]!;
        const parts: (string | Buffer)[] = [];
        for (let i = 0; i < old.length; i++) parts.push(fresh.get(at + i) ?? old[i]!);
        const views: Buffer[] = new Array(old.length);
        blocks[b] = packBlock(parts, views, 0);
        lineBlocks[b] = views;
        // Every line of the block is a view of the new one: nothing may keep the old block alive.
        for (let i = 0; i < views.length; i++) {
          this.services.get(keys[at + i]!)!.line = views[i];
          if (fresh.has(at + i)) bytes += views[i]!.length;
        }
      }
      this.last = packedState(blocks, lineBlocks, keys, endpoints, bytes);
      return this.last;
    }

    for (const path of changed) this.services.get(path)!.line = undefined;
    const paths = sortedPaths([...this.services.keys()]);
    const blocks: Buffer[] = new Array(Math.ceil(paths.length / LINES_PER_BLOCK));
    const lineBlocks: Buffer[][] = new Array(blocks.length);
    let bytes = 0;
    let endpoints = 0;
    // A block at a time, so that only one block's new lines are strings at once.
    for (let b = 0; b < blocks.length; b++) {
      const at = b * LINES_PER_BLOCK;
      const end = Math.min(at + LINES_PER_BLOCK, paths.length);
      const parts: (string | Buffer)[] = [];
      for (let i = at; i < end; i++) {
        const path = paths[i]!;
        const entry = this.services.get(path)!;
        entry.index = i;
        parts.push(entry.line ?? this.encode(path, entry));
        endpoints += entry.eps;
      }
      const views: Buffer[] = new Array(end - at);
      blocks[b] = packBlock(parts, views, 0);
      lineBlocks[b] = views;
      for (let i = 0; i < views.length; i++) {
        this.services.get(paths[at + i]!)!.line = views[i];
        bytes += views[i]!.length;
      }
    }
    this.ordered = true;
    this.last = packedState(blocks, lineBlocks, paths, endpoints, bytes);
    return this.last;
  }
}
