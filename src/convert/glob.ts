/**
 * Glob filters for `--with-service-labels` / `--with-service-annotations`,
 * with the syntax of the library kpng uses (github.com/gobwas/glob, no
 * separators): `*` any run of characters (`/` and `.` included), `?` one
 * character, `[abc]` `[a-z]` `[!abc]` classes, `{a,b}` alternatives, `\`
 * escapes the next character.
 */

/** A compiled list of globs: a key is kept when any glob matches it. */
export interface GlobFilter {
  matches(key: string): boolean;
}

// In unicode mode only syntax characters may be escaped, and `-` only inside a class.
function escapeRe(c: string): string {
  return /[\\^$.*+?()[\]{}|/]/.test(c) ? '\\' + c : c;
}

function escapeClass(c: string): string {
  return /[\\\]\[^-]/.test(c) ? '\\' + c : c;
}

/** Glob -> regexp source; throws an Error naming the problem. */
function globSource(glob: string): string {
  let re = '';
  let depth = 0;
  const chars = [...glob];
  for (let i = 0; i < chars.length; i++) {
    const c = chars[i]!;
    if (c === '\\') {
      const n = chars[++i];
      if (n === undefined) throw new Error('trailing backslash');
      re += escapeRe(n);
    } else if (c === '*') {
      while (chars[i + 1] === '*') i++;
      re += '[^]*';
    } else if (c === '?') {
      re += '[^]';
    } else if (c === '[') {
      let j = i + 1;
      let negate = false;
      if (chars[j] === '!') {
        negate = true;
        j++;
      }
      let cls = '';
      let closed = false;
      for (; j < chars.length; j++) {
        const d = chars[j]!;
        if (d === ']' && cls !== '') {
          closed = true;
          break;
        }
        if (d === '\\') {
          const n = chars[++j];
          if (n === undefined) break;
          cls += escapeClass(n);
        } else if (d === '-' && cls !== '' && chars[j + 1] !== ']') cls += '-';
        else cls += escapeClass(d);
      }
      if (!closed) throw new Error('unclosed [');
      re += (negate ? '[^' : '[') + cls + ']';
      i = j;
    } else if (c === '{') {
      depth++;
      re += '(?:';
    } else if (c === '}' && depth > 0) {
      depth--;
      re += ')';
    } else if (c === ',' && depth > 0) {
      re += '|';
    } else {
      re += escapeRe(c);
    }
  }
  if (depth > 0) throw new Error('unclosed {');
  return re;
}

/**
 * Compiles globs; undefined for an empty list (kpng then sends no labels or
 * annotations at all). Throws an Error (`invalid glob "x": unclosed [`) for a
 * bad glob, for the CLI to turn into a usage error.
 */
export function compileGlobs(globs: readonly string[] | undefined): GlobFilter | undefined {
  if (!globs || globs.length === 0) return undefined;
  const parts = globs.map((g) => {
    try {
      return globSource(g);
    } catch (err) {
      throw new Error(`invalid glob ${JSON.stringify(g)}: ${(err as Error).message}`);
    }
  });
  const re = new RegExp('^(?:' + parts.join('|') + ')$', 'u');
  return { matches: (key) => re.test(key) };
}

/**
 * Splits a comma-separated flag value into globs, keeping commas inside
 * `{a,b}` alternatives.
 */
export function splitGlobList(value: string): string[] {
  const out: string[] = [];
  let cur = '';
  let depth = 0;
  for (let i = 0; i < value.length; i++) {
    const c = value[i]!;
    if (c === '\\' && i + 1 < value.length) {
      cur += c + value[++i]!;
      continue;
    }
    if (c === '{') depth++;
    else if (c === '}' && depth > 0) depth--;
    if (c === ',' && depth === 0) {
      if (cur !== '') out.push(cur);
      cur = '';
    } else cur += c;
  }
  if (cur !== '') out.push(cur);
  return out;
}

/** The entries of `src` whose key matches `filter`; undefined without a filter. */
export function filterMap(src: Record<string, unknown> | undefined | null, filter: GlobFilter | undefined): Record<string, string> | undefined {
  if (!filter) return undefined;
  // No prototype: a key `__proto__` (valid in a hand-written manifest) is kept as kpng keeps it.
  const dst = Object.create(null) as Record<string, string>;
  if (src) for (const [k, v] of Object.entries(src)) if (typeof v === 'string' && filter.matches(k)) dst[k] = v;
  return dst;
}
