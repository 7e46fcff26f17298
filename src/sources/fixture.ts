/**
 * Fixture files -> states, for replay. A fixture is one state, in one of:
 *
 * - NDJSON exactly as kpng-json prints it: one `{"Service":…,"Endpoints":…}`
 *   per line, blank lines ignored;
 * - a JSON array of such items (or one item);
 * - Kubernetes manifests, YAML or JSON: several documents, and/or `kind: List`
 *   (or `ServiceList`, …) as `kubectl get svc,endpointslices -A -o yaml`
 *   prints. v1 Services, discovery.k8s.io/v1 EndpointSlices and v1 Nodes (for
 *   the node's zone) are used; other kinds are logged and ignored.
 *
 * kpng-json items are checked against the model and keep their order as
 * given; our encoder prints them, so the output is canonical. Manifests are
 * converted (convert/kubernetes.ts) through a `Store`, so their order is the
 * live sources'. Every error names the file, line and column:
 * `fixtures/bad.yaml:3:5: reason` (a CalloutError with code `input`).
 */
import { isUtf8 } from 'node:buffer';
import { LineCounter, parseAllDocuments, type Document } from 'yaml';
import { ConversionError, convertObjects, formatPath, type ConvertOptions, type FieldPath } from '../convert/kubernetes.js';
import { CalloutError } from '../errors.js';
import { silentLogger, type Logger } from '../log.js';
import type { Endpoint, IPSet, PortMapping, PortName, Service, ServiceEndpoints } from '../model.js';
import { stateFromItems, type State } from '../state.js';
import { findJsonPath, findJsonSyntaxError, lineCol } from './jsonpos.js';

/** How manifests are converted; see `ConvertOptions` (its `onSkip` is replaced by log lines). */
export type FixtureOptions = Omit<ConvertOptions, 'onSkip'> & {
  /** Skipped objects are logged here (other kinds at info level). */
  logger?: Logger;
};

/** File name extensions of fixture files (for directories). */
const FIXTURE_EXTENSIONS = ['.jsonl', '.ndjson', '.json', '.yaml', '.yml'] as const;

/** True for a file name replay reads from a directory: a fixture extension, not hidden. */
export function isFixtureName(name: string): boolean {
  return !name.startsWith('.') && FIXTURE_EXTENSIONS.some((e) => name.toLowerCase().endsWith(e));
}

/** One top-level value of a fixture and how to find a path inside it in the text. */
interface Entry {
  value: unknown;
  /** 1-based line/column of the value at `path` (relative to this entry). */
  locate(path: FieldPath): { line: number; col: number };
}

function inputError(file: string, pos: { line: number; col: number }, reason: string): CalloutError {
  return new CalloutError('input', `${file}:${pos.line}:${pos.col}: ${reason}`);
}

// ---------------------------------------------------------------- bytes -> text

/** Offset of the first byte that does not start a well-formed UTF-8 sequence (RFC 3629), or -1. */
function firstInvalidUtf8(b: Buffer): number {
  for (let i = 0; i < b.length; ) {
    const c = b[i]!;
    if (c < 0x80) {
      i++;
      continue;
    }
    const n = c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : 0;
    if (n === 0 || i + n >= b.length) return i;
    // The second byte's range excludes overlong forms, surrogates and code points past U+10FFFF.
    const lo = c === 0xe0 ? 0xa0 : c === 0xf0 ? 0x90 : 0x80;
    const hi = c === 0xed ? 0x9f : c === 0xf4 ? 0x8f : 0xbf;
    if (b[i + 1]! < lo || b[i + 1]! > hi) return i;
    for (let k = 2; k <= n; k++) if (b[i + k]! < 0x80 || b[i + k]! > 0xbf) return i;
    i += n + 1;
  }
  return -1;
}

/**
 * A fixture's bytes as text. Throws CalloutError('input')
 * `file: not a text file (…)` for a NUL byte or bytes that are not UTF-8
 * (decoding would silently replace them): a binary file, a gzipped dump, a
 * UTF-16 export.
 */
export function fixtureText(data: Buffer, file: string): string {
  const notText = (why: string): CalloutError => new CalloutError('input', `${file}: not a text file (${why}; fixtures are UTF-8 text)`);
  // UTF-16 with a byte order mark: what PowerShell's `>` writes.
  if (data.length >= 2 && ((data[0] === 0xff && data[1] === 0xfe) || (data[0] === 0xfe && data[1] === 0xff))) {
    throw notText('UTF-16; convert it with iconv -f UTF-16 -t UTF-8');
  }
  const nul = data.indexOf(0);
  const bad = isUtf8(data) ? -1 : firstInvalidUtf8(data);
  if (nul < 0 && bad < 0) return data.toString('utf8');
  const at = nul < 0 ? bad : bad < 0 ? nul : Math.min(nul, bad);
  // (A negative offset would search from the end.)
  const lineStart = at === 0 ? 0 : data.lastIndexOf(0x0a, at - 1) + 1;
  let line = 1;
  for (let i = data.indexOf(0x0a); i >= 0 && i < at; i = data.indexOf(0x0a, i + 1)) line++;
  // Everything before `at` is valid UTF-8: columns count characters, as in the other messages.
  const col = data.subarray(lineStart, at).toString('utf8').length + 1;
  throw notText(`${at === nul ? 'a NUL byte' : 'not UTF-8'} at line ${line}, column ${col}`);
}

// ---------------------------------------------------------------- readers

function jsonDocument(text: string, file: string): Entry[] {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    const e = findJsonSyntaxError(text) ?? { offset: 0, reason: 'invalid JSON' };
    throw inputError(file, lineCol(text, e.offset), e.reason);
  }
  return [{ value, locate: (path) => lineCol(text, findJsonPath(text, path)) }];
}

function ndjson(text: string, file: string): Entry[] {
  const out: Entry[] = [];
  let lineNo = 0;
  for (let start = 0; start < text.length; ) {
    let end = text.indexOf('\n', start);
    if (end < 0) end = text.length;
    lineNo++;
    const line = text.slice(start, end);
    const ln = lineNo;
    if (line.trim() !== '') {
      let value: unknown;
      try {
        value = JSON.parse(line);
      } catch {
        const e = findJsonSyntaxError(line) ?? { offset: 0, reason: 'invalid JSON' };
        throw inputError(file, { line: ln, col: e.offset + 1 }, e.reason);
      }
      out.push({ value, locate: (path) => ({ line: ln, col: findJsonPath(line, path) + 1 }) });
    }
    start = end + 1;
  }
  return out;
}

function yamlDocuments(text: string, file: string): Entry[] {
  const lc = new LineCounter();
  const parsed = parseAllDocuments(text, { lineCounter: lc, prettyErrors: false });
  const docs: Document[] = Array.isArray(parsed) ? parsed : [];
  const out: Entry[] = [];
  for (const doc of docs) {
    const err = doc.errors[0];
    if (err) throw inputError(file, lc.linePos(err.pos[0]), err.message);
    if (doc.contents === null) continue; // an empty document (comments, `---` only)
    let value: unknown;
    try {
      value = doc.toJS({ maxAliasCount: 1000 });
    } catch (e) {
      const start = doc.contents.range?.[0] ?? 0;
      throw inputError(file, lc.linePos(start), (e as Error).message);
    }
    if (value === null || value === undefined) continue;
    out.push({
      value,
      locate: (path) => {
        for (let n = path.length; n >= 0; n--) {
          const node = doc.getIn(path.slice(0, n), true) as { range?: [number, number, number] } | undefined;
          if (node && typeof node === 'object' && node.range) return lc.linePos(node.range[0]);
          // A missing key: point at the parent collection.
        }
        return lc.linePos(doc.contents?.range?.[0] ?? 0);
      },
    });
  }
  return out;
}

/** Which reader a file gets: by extension, else by its first character. */
function readEntries(text: string, file: string): Entry[] {
  const lower = file.toLowerCase();
  if (lower.endsWith('.yaml') || lower.endsWith('.yml')) return yamlDocuments(text, file);
  if (lower.endsWith('.jsonl') || lower.endsWith('.ndjson')) return ndjson(text, file);
  const m = /\S/.exec(text);
  if (!m) return [];
  if (m[0] !== '{' && m[0] !== '[') {
    if (lower.endsWith('.json')) return jsonDocument(text, file); // reports the syntax error
    return yamlDocuments(text, file);
  }
  // One JSON document (pretty-printed or not), or NDJSON: one value per line.
  try {
    const value: unknown = JSON.parse(text);
    return [{ value, locate: (path) => lineCol(text, findJsonPath(text, path)) }];
  } catch {
    // NDJSON when the first non-blank line is a JSON value on its own; else a broken document.
    const first = text.slice(m.index, (text.indexOf('\n', m.index) + 1 || text.length + 1) - 1);
    let firstOk = true;
    try {
      JSON.parse(first);
    } catch {
      firstOk = false;
    }
    return firstOk ? ndjson(text, file) : jsonDocument(text, file);
  }
}

// ---------------------------------------------------------------- kpng-json items

type P = Array<string | number>;

function fail(path: P, reason: string): never {
  throw new ConversionError(path, reason);
}

function kind(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'object') return 'an object';
  return typeof v === 'string' ? JSON.stringify(v) : String(v);
}

function fields(v: unknown, path: P, allowed: readonly string[]): Record<string, unknown> {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) fail(path, `expected an object, got ${kind(v)}`);
  for (const k of Object.keys(v)) if (!allowed.includes(k)) fail([...path, k], `unknown field ${JSON.stringify(k)} (expected one of ${allowed.join(', ')})`);
  return v as Record<string, unknown>;
}

function optStr(o: Record<string, unknown>, k: string, path: P): string | undefined {
  const v = o[k];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'string') fail([...path, k], `expected a string, got ${kind(v)}`);
  return v;
}

function optInt(o: Record<string, unknown>, k: string, path: P): number | undefined {
  const v = o[k];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < -(2 ** 31) || v >= 2 ** 31) fail([...path, k], `expected a 32-bit integer, got ${kind(v)}`);
  return v;
}

function optBool(o: Record<string, unknown>, k: string, path: P): boolean | undefined {
  const v = o[k];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') fail([...path, k], `expected true or false, got ${kind(v)}`);
  return v;
}

function optList<T>(o: Record<string, unknown>, k: string, path: P, each: (v: unknown, path: P) => T): T[] | undefined {
  const v = o[k];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v)) fail([...path, k], `expected a list, got ${kind(v)}`);
  return v.map((x, i) => each(x, [...path, k, i]));
}

function optMap(o: Record<string, unknown>, k: string, path: P): Record<string, string> | undefined {
  const v = o[k];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'object' || Array.isArray(v)) fail([...path, k], `expected an object, got ${kind(v)}`);
  for (const [mk, mv] of Object.entries(v)) if (typeof mv !== 'string') fail([...path, k, mk], `expected a string, got ${kind(mv)}`);
  return v as Record<string, string>;
}

const strItem = (v: unknown, path: P): string => (typeof v === 'string' ? v : fail(path, `expected a string, got ${kind(v)}`));

function optMsg<T>(o: Record<string, unknown>, k: string, path: P, read: (v: unknown, path: P) => T): T | undefined {
  const v = o[k];
  return v === undefined || v === null ? undefined : read(v, [...path, k]);
}

function ipSetItem(v: unknown, path: P): IPSet {
  const o = fields(v, path, ['V4', 'V6']);
  const s: IPSet = {};
  const v4 = optList(o, 'V4', path, strItem);
  const v6 = optList(o, 'V6', path, strItem);
  if (v4) s.V4 = v4;
  if (v6) s.V6 = v6;
  return s;
}

function set<T, K extends keyof T>(target: T, k: K, v: T[K] | undefined): void {
  if (v !== undefined) target[k] = v;
}

function serviceItem(v: unknown, path: P): Service {
  const o = fields(v, path, [
    'Namespace', 'Name', 'Type', 'Labels', 'Annotations', 'IPs', 'IPFilters', 'MapIP', 'Ports',
    'ExternalTrafficToLocal', 'SessionAffinity', 'InternalTrafficToLocal', 'HealthCheckNodePort',
  ]);
  const s: Service = {};
  set(s, 'Namespace', optStr(o, 'Namespace', path));
  set(s, 'Name', optStr(o, 'Name', path));
  if (!s.Name) fail([...path, 'Name'], 'missing Service name');
  set(s, 'Type', optStr(o, 'Type', path));
  set(s, 'Labels', optMap(o, 'Labels', path));
  set(s, 'Annotations', optMap(o, 'Annotations', path));
  set(
    s,
    'IPs',
    optMsg(o, 'IPs', path, (x, p) => {
      const i = fields(x, p, ['ClusterIPs', 'ExternalIPs', 'LoadBalancerIPs', 'Headless']);
      const ips: NonNullable<Service['IPs']> = {};
      set(ips, 'ClusterIPs', optMsg(i, 'ClusterIPs', p, ipSetItem));
      set(ips, 'ExternalIPs', optMsg(i, 'ExternalIPs', p, ipSetItem));
      set(ips, 'LoadBalancerIPs', optMsg(i, 'LoadBalancerIPs', p, ipSetItem));
      set(ips, 'Headless', optBool(i, 'Headless', p));
      return ips;
    }),
  );
  set(
    s,
    'IPFilters',
    optList(o, 'IPFilters', path, (x, p) => {
      const f = fields(x, p, ['TargetIPs', 'SourceRanges']);
      const out: NonNullable<Service['IPFilters']>[number] = {};
      set(out, 'TargetIPs', optMsg(f, 'TargetIPs', p, ipSetItem));
      set(out, 'SourceRanges', optList(f, 'SourceRanges', p, strItem));
      return out;
    }),
  );
  set(s, 'MapIP', optBool(o, 'MapIP', path));
  set(
    s,
    'Ports',
    optList(o, 'Ports', path, (x, p): PortMapping => {
      const f = fields(x, p, ['Name', 'Protocol', 'Port', 'NodePort', 'TargetPort', 'TargetPortName']);
      const pm: PortMapping = {};
      set(pm, 'Name', optStr(f, 'Name', p));
      set(pm, 'Protocol', optInt(f, 'Protocol', p));
      set(pm, 'Port', optInt(f, 'Port', p));
      set(pm, 'NodePort', optInt(f, 'NodePort', p));
      set(pm, 'TargetPort', optInt(f, 'TargetPort', p));
      set(pm, 'TargetPortName', optStr(f, 'TargetPortName', p));
      return pm;
    }),
  );
  set(s, 'ExternalTrafficToLocal', optBool(o, 'ExternalTrafficToLocal', path));
  set(
    s,
    'SessionAffinity',
    optMsg(o, 'SessionAffinity', path, (x, p) => {
      const a = fields(x, p, ['ClientIP']);
      const c = optMsg(a, 'ClientIP', p, (y, q) => {
        const t = optInt(fields(y, q, ['TimeoutSeconds']), 'TimeoutSeconds', q);
        return t === undefined ? {} : { TimeoutSeconds: t };
      });
      return c === undefined ? {} : { ClientIP: c };
    }),
  );
  set(s, 'InternalTrafficToLocal', optBool(o, 'InternalTrafficToLocal', path));
  set(s, 'HealthCheckNodePort', optInt(o, 'HealthCheckNodePort', path));
  return s;
}

function endpointItem(v: unknown, path: P): Endpoint {
  const o = fields(v, path, ['Hostname', 'IPs', 'Local', 'PortOverrides', 'Scopes']);
  const e: Endpoint = {};
  set(e, 'Hostname', optStr(o, 'Hostname', path));
  set(e, 'IPs', optMsg(o, 'IPs', path, ipSetItem));
  set(e, 'Local', optBool(o, 'Local', path));
  set(
    e,
    'PortOverrides',
    optList(o, 'PortOverrides', path, (x, p): PortName => {
      const f = fields(x, p, ['Name', 'Port']);
      const pn: PortName = {};
      set(pn, 'Name', optStr(f, 'Name', p));
      set(pn, 'Port', optInt(f, 'Port', p));
      return pn;
    }),
  );
  set(
    e,
    'Scopes',
    optMsg(o, 'Scopes', path, (x, p) => {
      const f = fields(x, p, ['Internal', 'External']);
      const sc: NonNullable<Endpoint['Scopes']> = {};
      set(sc, 'Internal', optBool(f, 'Internal', p));
      set(sc, 'External', optBool(f, 'External', p));
      return sc;
    }),
  );
  return e;
}

/**
 * One kpng-json item (`{"Service":…,"Endpoints":…}`) read into the model,
 * with every field type-checked and unknown fields rejected. Throws
 * `ConversionError` naming the field.
 */
function itemFromJson(v: unknown): ServiceEndpoints {
  const o = fields(v, [], ['Service', 'Endpoints']);
  if (o.Service === undefined || o.Service === null) fail(['Service'], 'missing Service');
  const Service = serviceItem(o.Service, ['Service']);
  const Endpoints = optList(o, 'Endpoints', [], (x, p) => (x === null ? fail(p, 'expected an endpoint, got null') : endpointItem(x, p))) ?? [];
  return { Service, Endpoints };
}

// ---------------------------------------------------------------- fixture -> state

function isItem(v: unknown): boolean {
  return v !== null && typeof v === 'object' && !Array.isArray(v) && ('Service' in v || 'Endpoints' in v) && !('kind' in v);
}

/**
 * Reads one fixture's text into a state. `file` names it in messages (and its
 * extension picks the reader: `.yaml`/`.yml` YAML, `.jsonl`/`.ndjson`
 * NDJSON, anything else by content). Throws CalloutError('input') with
 * `file:line:col: reason`.
 */
export function parseFixture(text: string, file: string, opts: FixtureOptions): State {
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  const entries = readEntries(text, file);
  const log = opts.logger ?? silentLogger;
  // Flatten top-level arrays (of items or objects) and lists (`kind: List`, `ServiceList`, ...).
  const flat: Entry[] = [];
  const add = (e: Entry): void => {
    const v = e.value as Record<string, unknown> | null;
    if (Array.isArray(v)) {
      v.forEach((x, i) => add({ value: x, locate: (path) => e.locate([i, ...path]) }));
      return;
    }
    if (v && typeof v === 'object' && typeof v.kind === 'string' && v.kind.endsWith('List') && 'items' in v) {
      const items = v.items;
      if (items === null) return;
      if (!Array.isArray(items)) throw inputError(file, e.locate(['items']), 'items: expected a list');
      const itemKind = v.kind === 'List' ? undefined : v.kind.slice(0, -4);
      items.forEach((it, i) => {
        // Typed lists (ServiceList) leave kind and apiVersion out of their items.
        const value =
          itemKind && it && typeof it === 'object' && !Array.isArray(it) && !('kind' in it) ? { apiVersion: v.apiVersion, kind: itemKind, ...it } : it;
        flat.push({ value, locate: (path) => e.locate(['items', i, ...path]) });
      });
      return;
    }
    flat.push(e);
  };
  entries.forEach(add);
  if (flat.length === 0) return stateFromItems([]);
  const items = flat.filter((e) => isItem(e.value));
  if (items.length === flat.length) {
    return stateFromItems(
      flat.map((e) => {
        try {
          return itemFromJson(e.value);
        } catch (err) {
          if (err instanceof ConversionError) throw inputError(file, e.locate(err.path), `${formatPath(err.path)}: ${err.reason}`);
          throw err;
        }
      }),
    );
  }
  if (items.length > 0) {
    const first = items[0]!;
    throw inputError(file, first.locate([]), 'a kpng-json item ({"Service":…}) among Kubernetes objects: a fixture is either kpng-json output or manifests');
  }
  try {
    return convertObjects(
      flat.map((e) => e.value),
      {
        ...opts,
        onSkip: (i, msg, level) => {
          const pos = flat[i]!.locate([]);
          log[level](`${file}:${pos.line}:${pos.col}: ${msg}`);
        },
      },
    );
  } catch (err) {
    if (err instanceof ConversionError && err.index !== undefined) {
      const e = flat[err.index]!;
      throw inputError(file, e.locate(err.path), err.path.length > 0 ? `${formatPath(err.path)}: ${err.reason}` : err.reason);
    }
    throw err;
  }
}
