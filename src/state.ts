/**
 * The node-local state: a store that applies localv1 ops (set, delete, reset)
 * and publishes immutable snapshots (`State`) of NDJSON lines in the reference
 * client's order. Each Service's line is cached and re-encoded only when the
 * Service or one of its endpoints changed.
 */
import { encodeEndpoint, encodeLine, encodeService, encodeServiceEndpoints } from './gojson.js';
import type { Endpoint, Service, ServiceEndpoints } from './model.js';

/** A complete node-local state, as the callout receives it. Immutable. */
export interface State {
  /** One NDJSON line per Service (each ends with `\n`), in kpng order. */
  readonly lines: readonly Buffer[];
  /** Number of Services. */
  readonly services: number;
  /** Number of Endpoints over all Services. */
  readonly endpoints: number;
  /** Total bytes of `lines`. */
  readonly bytes: number;
}

/** The empty state. */
export const emptyState: State = Object.freeze({ lines: Object.freeze([]) as readonly Buffer[], services: 0, endpoints: 0, bytes: 0 });

/** Builds a state from already grouped items, keeping their order (replay). */
export function stateFromItems(items: readonly ServiceEndpoints[]): State {
  const lines = items.map((it) => Buffer.from(encodeServiceEndpoints(it)));
  return {
    lines,
    services: items.length,
    endpoints: items.reduce((n, it) => n + it.Endpoints.length, 0),
    bytes: lines.reduce((n, l) => n + l.length, 0),
  };
}

/** True when two states would give the callout byte-identical input. */
export function sameState(a: State, b: State): boolean {
  if (a === b) return true;
  if (a.bytes !== b.bytes || a.lines.length !== b.lines.length) return false;
  for (let i = 0; i < a.lines.length; i++) {
    const x = a.lines[i]!;
    const y = b.lines[i]!;
    if (x !== y && !x.equals(y)) return false;
  }
  return true;
}

/** The whole state as one string (tests, small outputs). */
export function stateText(s: State): string {
  return Buffer.concat(s.lines as Buffer[]).toString('utf8');
}

/**
 * kpng's path order: bytes compared in order, except that `/` sorts before
 * every other byte (so `default/a/x` follows `default/a`, never `default/a-b`).
 */
export function comparePaths(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    let x = a.charCodeAt(i);
    let y = b.charCodeAt(i);
    if (x === y) continue;
    x = x === 0x2f ? -1 : x >= 0xd800 ? (x < 0xe000 ? x + 0x2000 : x - 0x800) : x;
    y = y === 0x2f ? -1 : y >= 0xd800 ? (y < 0xe000 ? y + 0x2000 : y - 0x800) : y;
    return x - y;
  }
  return a.length - b.length;
}

/** `ns/name/pod` -> [`ns/name`, `pod`]; undefined when the path has no service part. */
export function splitEndpointPath(path: string): [string, string] | undefined {
  const a = path.indexOf('/');
  if (a < 0) return undefined;
  const b = path.indexOf('/', a + 1);
  if (b < 0) return undefined;
  return [path.slice(0, b), path.slice(b + 1)];
}

interface EpEntry {
  value: Endpoint;
  json?: string;
}

interface SvcEntry {
  value: Service;
  json?: string;
  line?: Buffer;
}

/** Reports endpoints that have no Service (logged, never fatal). */
export type OrphanReporter = (endpointPaths: string[]) => void;

/**
 * The working copy a source applies ops to. Call `snapshot()` only when the
 * change set is complete (kpng `Sync`): a state built from part of a diff never
 * existed.
 */
export class Store {
  private readonly services = new Map<string, SvcEntry>();
  private readonly endpoints = new Map<string, Map<string, EpEntry>>();
  private readonly dirty = new Set<string>();
  private order: string[] | undefined = [];
  private last: State = emptyState;
  private readonly onOrphans: OrphanReporter | undefined;

  constructor(options: { onOrphans?: OrphanReporter } = {}) {
    this.onOrphans = options.onOrphans;
  }

  setService(path: string, value: Service): void {
    const had = this.services.get(path);
    if (had) {
      had.value = value;
      had.json = undefined;
    } else {
      this.services.set(path, { value });
      this.order = undefined;
    }
    this.dirty.add(path);
  }

  deleteService(path: string): void {
    if (this.services.delete(path)) {
      this.order = undefined;
      this.dirty.add(path);
    }
  }

  /** Sets the endpoint at `ns/name/key`; returns false for a path with no service part. */
  setEndpoint(path: string, value: Endpoint): boolean {
    const parts = splitEndpointPath(path);
    if (!parts) return false;
    const [svc, key] = parts;
    let group = this.endpoints.get(svc);
    if (!group) this.endpoints.set(svc, (group = new Map()));
    group.set(key, { value });
    this.dirty.add(svc);
    return true;
  }

  deleteEndpoint(path: string): void {
    const parts = splitEndpointPath(path);
    if (!parts) return;
    const [svc, key] = parts;
    const group = this.endpoints.get(svc);
    if (group?.delete(key)) {
      if (group.size === 0) this.endpoints.delete(svc);
      this.dirty.add(svc);
    }
  }

  /** Drops everything (kpng `Reset`, or a new stream). */
  reset(): void {
    this.services.clear();
    this.endpoints.clear();
    this.dirty.clear();
    this.order = [];
    this.last = emptyState;
  }

  get serviceCount(): number {
    return this.services.size;
  }

  /** The current complete state; unchanged services reuse their cached line. */
  snapshot(): State {
    if (this.dirty.size === 0 && this.order !== undefined) return this.last;
    const orphans: string[] = [];
    for (const path of this.dirty) {
      const svc = this.services.get(path);
      if (svc) svc.line = undefined;
      else if (this.endpoints.has(path)) {
        for (const key of this.endpoints.get(path)!.keys()) orphans.push(path + '/' + key);
      }
    }
    this.dirty.clear();
    if (orphans.length > 0) this.onOrphans?.(orphans);
    if (this.order === undefined) this.order = [...this.services.keys()].sort(comparePaths);
    const lines: Buffer[] = new Array(this.order.length);
    let bytes = 0;
    let endpoints = 0;
    for (let i = 0; i < this.order.length; i++) {
      const path = this.order[i]!;
      const entry = this.services.get(path)!;
      const group = this.endpoints.get(path);
      if (!entry.line) {
        entry.json ??= encodeService(entry.value);
        const eps: string[] = [];
        if (group) {
          const keys = [...group.keys()].sort(comparePaths);
          for (const k of keys) {
            const ep = group.get(k)!;
            ep.json ??= encodeEndpoint(ep.value);
            eps.push(ep.json);
          }
        }
        entry.line = Buffer.from(encodeLine(entry.json, eps));
      }
      endpoints += group ? group.size : 0;
      bytes += entry.line.length;
      lines[i] = entry.line;
    }
    this.last = { lines, services: lines.length, endpoints, bytes };
    return this.last;
  }
}
