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
 * kpng-json items are checked against the model (fixture/items.ts) and keep
 * their order as given; our encoder prints them, so the output is canonical.
 * Manifests are converted (convert/kubernetes.ts) through a `Store`, so their
 * order is the live sources'. Every error names the file, line and column
 * (fixture/documents.ts): `fixtures/bad.yaml:3:5: reason` (a CalloutError
 * with code `input`).
 */
import { convertObjects, type ConvertOptions } from '../convert/kubernetes.js';
import { ConversionError, formatPath } from '../convert/fields.js';
import { CalloutError } from '../errors.js';
import { silentLogger, type Logger } from '../log.js';
import { stateFromItems, type State } from '../state.js';
import { firstInvalidUtf8 } from '../utf8.js';
import { inputError, readEntries, type Entry } from './fixture/documents.js';
import { isItem, itemFromJson } from './fixture/items.js';

/** How manifests are converted; see `ConvertOptions` (its `onSkip` is replaced by log lines). */
export type FixtureOptions = Omit<ConvertOptions, 'onSkip'> & {
  /** Skipped objects are logged here (other kinds at info level). */
  logger?: Logger | undefined;
};

/** File name extensions of fixture files (for directories). */
const FIXTURE_EXTENSIONS = ['.jsonl', '.ndjson', '.json', '.yaml', '.yml'] as const;

/** True for a file name replay reads from a directory: a fixture extension, not hidden. */
export function isFixtureName(name: string): boolean {
  return !name.startsWith('.') && FIXTURE_EXTENSIONS.some((e) => name.toLowerCase().endsWith(e));
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
  const bad = firstInvalidUtf8(data);
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

/** `path: reason`, or the reason alone for the object itself. */
const located = (err: ConversionError): string => (err.path.length > 0 ? `${formatPath(err.path)}: ${err.reason}` : err.reason);

/**
 * The values of a fixture one by one: top-level arrays (of items or objects)
 * and lists (`kind: List`, `ServiceList`, ...) flattened, each value still
 * able to locate its fields in the text.
 */
function flatten(entries: readonly Entry[], file: string): Entry[] {
  const flat: Entry[] = [];
  // Only a top-level array is flattened: a list inside a list is no fixture form, and
  // following lists at any depth overflowed the stack on a deeply nested one.
  const add = (e: Entry, top = false): void => {
    const v = e.value as Record<string, unknown> | null;
    if (top && Array.isArray(v)) {
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
    // `kubectl get -o yaml` prints `kind: List` after the items: a dump cut short (a kubectl that died, a
    // closed pipe) has items and no kind. Read as "not a state", it would be the empty state, whose run
    // deletes every rule: refuse it.
    if (v && typeof v === 'object' && !Array.isArray(v) && !('kind' in v) && Array.isArray(v.items)) {
      throw inputError(file, e.locate([]), 'a document with items but no kind: a List cut short? (kubectl prints kind: List after its items); give the whole dump');
    }
    flat.push(e);
  };
  for (const e of entries) add(e, true);
  return flat;
}

/**
 * Reads one fixture's text into a state. `file` names it in messages (and its
 * extension picks the reader: `.yaml`/`.yml` YAML, `.jsonl`/`.ndjson`
 * NDJSON, anything else by content). Throws CalloutError('input') with
 * `file:line:col: reason`.
 */
export function parseFixture(text: string, file: string, opts: FixtureOptions): State {
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  const flat = flatten(readEntries(text, file), file);
  const log = opts.logger ?? silentLogger;
  if (flat.length === 0) return stateFromItems([]);
  const items = flat.filter((e) => isItem(e.value));
  if (items.length === flat.length) {
    // A state holds each Service path (namespace/name) once: a change set or a callout keyed by it would mix two up.
    const seen = new Map<string, number>();
    return stateFromItems(
      flat.map((e, i) => {
        let item;
        try {
          item = itemFromJson(e.value);
        } catch (err) {
          if (err instanceof ConversionError) throw inputError(file, e.locate(err.path), located(err));
          throw err;
        }
        const path = `${item.Service.Namespace ?? ''}/${item.Service.Name ?? ''}`;
        const first = seen.get(path);
        if (first !== undefined) {
          const at = flat[first]!.locate([]);
          throw inputError(file, e.locate(['Service', 'Name']), `Service ${JSON.stringify(path)} (namespace/name) appears twice: first at line ${at.line}; each Service path once`);
        }
        seen.set(path, i);
        return item;
      }),
    );
  }
  if (items.length > 0) {
    throw inputError(file, items[0]!.locate([]), 'a kpng-json item ({"Service":…}) among Kubernetes objects: a fixture is either kpng-json output or manifests');
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
    if (err instanceof ConversionError && err.index !== undefined) throw inputError(file, flat[err.index]!.locate(err.path), located(err));
    throw err;
  }
}
