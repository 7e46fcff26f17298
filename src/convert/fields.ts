/**
 * The one typed reader of parsed JSON and YAML objects: Kubernetes objects
 * (convert/) and kpng-json fixture items (sources/fixture/) both read their
 * fields through it, so a wrong type is worded the same everywhere and always
 * names the field's path (`spec.ports[0].port: expected an integer, got
 * "80"`), which replay turns into a line and column and the Kubernetes API
 * source into a log line.
 *
 * Absent fields (undefined, and null, which the API and kpng-json both send
 * for "not set") read as undefined; a field of the wrong type throws a
 * `ConversionError`.
 */

/** A path into an object: keys and array indexes (`['spec', 'ports', 0, 'port']`). */
export type FieldPath = ReadonlyArray<string | number>;

/** A field has the wrong type, is unknown, or a required one is missing. */
export class ConversionError extends Error {
  /** Where in the object (for replay: turned into line and column). */
  readonly path: FieldPath;
  /** Which object of a set (`convertObjects`' input, a Service's slices), when known. */
  index: number | undefined;
  /** The reason without the path. */
  readonly reason: string;
  constructor(path: FieldPath, reason: string, index?: number) {
    super(`${formatPath(path)}: ${reason}`);
    this.name = 'ConversionError';
    this.path = path;
    this.reason = reason;
    this.index = index;
  }
}

/** `spec.ports[0].port`; `(object)` for the object itself. */
export function formatPath(path: FieldPath): string {
  let s = '';
  for (const p of path) s += typeof p === 'number' ? `[${p}]` : s === '' ? p : '.' + p;
  return s === '' ? '(object)' : s;
}

/** A value as an error message shows what was found: `null`, `a list`, `an object`, `"80"`, `7`. */
export function describeValue(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'object') return 'an object';
  // A long string (a whole text file read as one YAML scalar) is cut: the message names the place, not the content.
  if (typeof v === 'string') return v.length > 80 ? `${JSON.stringify(v.slice(0, 80)).slice(0, -1)}…" (${v.length} characters)` : JSON.stringify(v);
  return String(v);
}

const absent = (v: unknown): v is undefined | null => v === undefined || v === null;

function expected(path: FieldPath, what: string, v: unknown): never {
  throw new ConversionError(path, `expected ${what}, got ${describeValue(v)}`);
}

/** A list, or undefined when absent. */
function readList(v: unknown, path: FieldPath): readonly unknown[] | undefined {
  if (absent(v)) return undefined;
  return Array.isArray(v) ? v : expected(path, 'a list', v);
}

/** A string, or undefined when absent. */
function readString(v: unknown, path: FieldPath): string | undefined {
  if (absent(v)) return undefined;
  return typeof v === 'string' ? v : expected(path, 'a string', v);
}

/** A 32-bit signed integer (the type of every number in the model), or undefined when absent. */
function readInt32(v: unknown, path: FieldPath): number | undefined {
  if (absent(v)) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v)) return expected(path, 'an integer', v);
  return v >= -(2 ** 31) && v < 2 ** 31 ? v : expected(path, 'a 32-bit integer', v);
}

/** true or false, or undefined when absent. */
function readBool(v: unknown, path: FieldPath): boolean | undefined {
  if (absent(v)) return undefined;
  return typeof v === 'boolean' ? v : expected(path, 'true or false', v);
}

/** A list of strings (none of them null), or undefined when absent. */
function readStringList(v: unknown, path: FieldPath): string[] | undefined {
  const l = readList(v, path);
  l?.forEach((x, i) => typeof x === 'string' || expected([...path, i], 'a string', x));
  return l as string[] | undefined;
}

/**
 * The fields of one object, each read with its path. The path of an object
 * reached through another (`object`, `element`) is made only when an error
 * needs it: a slice's endpoints are read field by field, 100,000 of them in
 * a big cluster.
 */
export class Fields {
  private where: FieldPath | undefined;

  private constructor(
    private readonly o: Readonly<Record<string, unknown>>,
    path: FieldPath | undefined,
    /** Without `path`: the object is `parent`'s `key` (element `index` of it, for a list). */
    private readonly parent?: Fields,
    private readonly key?: string,
    private readonly index?: number,
  ) {
    this.where = path;
  }

  /** Where the object is. */
  get path(): FieldPath {
    return (this.where ??= this.index === undefined ? this.parent!.at(this.key!) : this.parent!.at(this.key!, this.index));
  }

  /**
   * `v`'s fields, or undefined when `v` is absent; throws when it is not an
   * object or, given `allowed`, has a key not in it.
   */
  static read(v: unknown, path: FieldPath, allowed?: readonly string[]): Fields | undefined {
    if (absent(v)) return undefined;
    if (typeof v !== 'object' || Array.isArray(v)) return expected(path, 'an object', v);
    if (allowed) {
      for (const k of Object.keys(v)) {
        if (!allowed.includes(k)) throw new ConversionError([...path, k], `unknown field ${JSON.stringify(k)} (expected one of ${allowed.join(', ')})`);
      }
    }
    return new Fields(v as Record<string, unknown>, path);
  }

  /** As `read`, but an absent object is an error too. */
  static require(v: unknown, path: FieldPath, allowed?: readonly string[]): Fields {
    return Fields.read(v, path, allowed) ?? expected(path, 'an object', v);
  }

  /** As `read`, but an absent object reads as one without fields (the API's lenient reading). */
  static orEmpty(v: unknown, path: FieldPath): Fields {
    return Fields.read(v, path) ?? new Fields({}, path);
  }

  /** The path of `key` (and below it). */
  at(key: string, ...more: Array<string | number>): FieldPath {
    return [...this.path, key, ...more];
  }

  /** The raw value of `key`. */
  value(key: string): unknown {
    return this.o[key];
  }

  /** True when `key` holds a value (not undefined or null). */
  has(key: string): boolean {
    return !absent(this.o[key]);
  }

  // Each reader takes the common case (the right type, or absent) before
  // building the field's path, which only an error needs.

  object(key: string, allowed?: readonly string[]): Fields | undefined {
    const v = this.o[key];
    if (absent(v)) return undefined;
    if (allowed || typeof v !== 'object' || Array.isArray(v)) return Fields.read(v, this.at(key), allowed);
    return new Fields(v as Record<string, unknown>, undefined, this, key);
  }

  /**
   * `v`, element `index` of this object's list `key`, as `orEmpty` reads it
   * (absent: an object without fields; not an object: an error).
   */
  element(v: unknown, key: string, index: number): Fields {
    if (absent(v)) return new Fields({}, undefined, this, key, index);
    if (typeof v !== 'object' || Array.isArray(v)) return expected(this.at(key, index), 'an object', v);
    return new Fields(v as Record<string, unknown>, undefined, this, key, index);
  }

  list(key: string): readonly unknown[] | undefined {
    const v = this.o[key];
    return Array.isArray(v) ? v : absent(v) ? undefined : readList(v, this.at(key));
  }

  /** Each element of the list `key` read by `each` (given the element's path), or undefined when absent. */
  map<T>(key: string, each: (v: unknown, path: FieldPath) => T): T[] | undefined {
    return this.list(key)?.map((v, i) => each(v, this.at(key, i)));
  }

  string(key: string): string | undefined {
    const v = this.o[key];
    return typeof v === 'string' ? v : absent(v) ? undefined : readString(v, this.at(key));
  }

  int32(key: string): number | undefined {
    const v = this.o[key];
    return typeof v === 'number' && (v | 0) === v ? v : absent(v) ? undefined : readInt32(v, this.at(key));
  }

  bool(key: string): boolean | undefined {
    const v = this.o[key];
    return typeof v === 'boolean' ? v : absent(v) ? undefined : readBool(v, this.at(key));
  }

  strings(key: string): string[] | undefined {
    const v = this.o[key];
    if (Array.isArray(v)) {
      let i = 0;
      while (i < v.length && typeof v[i] === 'string') i++;
      if (i === v.length) return v as string[];
    }
    return absent(v) ? undefined : readStringList(v, this.at(key));
  }

  /** An object of strings (labels, annotations), or undefined when absent. */
  stringMap(key: string): Record<string, string> | undefined {
    const m = this.object(key);
    if (!m) return undefined;
    for (const k of Object.keys(m.o)) if (typeof m.o[k] !== 'string') expected(m.at(k), 'a string', m.o[k]);
    return m.o as Record<string, string>;
  }
}
