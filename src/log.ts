/**
 * Logging: one line per event on stderr, as text or JSON lines. Sources, the
 * runner and the CLI all log through a `Logger` handed to them, so tests can
 * capture it and the format is decided in one place.
 */
export type LogLevel = 'error' | 'warn' | 'info' | 'debug';

/** Extra structured fields; printed as key=value in text format. */
export type LogFields = Record<string, string | number | boolean | null | undefined>;

export interface Logger {
  error(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  info(msg: string, fields?: LogFields): void;
  debug(msg: string, fields?: LogFields): void;
}

export interface LoggerOptions {
  /** `text` (default) or `json` (one JSON object per line). */
  format?: 'text' | 'json';
  /** 0 = info and above (default), 1+ = debug too, -1 = warnings and errors only. */
  verbosity?: number;
  /** Where lines go; default process.stderr. */
  write?: (line: string) => void;
  /** Program name at the start of text lines (default kpng-callout). */
  name?: string;
  /** Clock, for tests. */
  now?: () => Date;
}

const rank: Record<LogLevel, number> = { error: -1, warn: -1, info: 0, debug: 1 };

function textValue(v: string | number | boolean | null): string {
  const s = String(v);
  return /^[^\s"=]+$/.test(s) ? s : JSON.stringify(s);
}

export function createLogger(options: LoggerOptions = {}): Logger {
  const format = options.format ?? 'text';
  const verbosity = options.verbosity ?? 0;
  const write = options.write ?? ((line: string) => void process.stderr.write(line));
  const now = options.now ?? (() => new Date());
  const name = options.name ?? 'kpng-callout';
  const emit = (level: LogLevel, msg: string, fields?: LogFields): void => {
    if (rank[level] > verbosity) return;
    if (format === 'json') {
      const rec: Record<string, unknown> = { time: now().toISOString(), level, msg };
      if (fields) for (const [k, v] of Object.entries(fields)) if (v !== undefined) rec[k] = v;
      write(JSON.stringify(rec) + '\n');
      return;
    }
    let line = `${name} ${level}: ${msg}`;
    if (fields) {
      for (const [k, v] of Object.entries(fields)) if (v !== undefined) line += ` ${k}=${textValue(v)}`;
    }
    write(line + '\n');
  };
  return {
    error: (m, f) => emit('error', m, f),
    warn: (m, f) => emit('warn', m, f),
    info: (m, f) => emit('info', m, f),
    debug: (m, f) => emit('debug', m, f),
  };
}

/** A logger that drops everything (library default). */
export const silentLogger: Logger = { error() {}, warn() {}, info() {}, debug() {} };

/** Options of {@link createRepeatFilter}. */
export interface RepeatFilterOptions {
  /** Least time between two reports of the same failure at its own level (ms). Default 60000. */
  intervalMs?: number;
  /** Millisecond clock (tests). Default Date.now. */
  now?: (() => number) | undefined;
}

/** What to do with one occurrence of a failure. */
export interface RepeatVerdict {
  /** Log it at its own level (true) or at debug only (false). */
  loud: boolean;
  /** For a loud repeat: how many occurrences since the last loud one went to debug only (else 0). */
  repeated: number;
}

/**
 * The rule for failures that keep happening (a source retrying a server that
 * is down): logged when a failure first happens or changes, the same failure
 * again at most once per interval (with how many times it repeated), at debug
 * level in between. `clear()` when the condition is over (connected again),
 * so the next failure is logged at once.
 */
export interface RepeatFilter {
  /** Decides for one occurrence of the failure `key` (a message without what varies per attempt). */
  check(key: string): RepeatVerdict;
  /**
   * Logs `msg` at `level` or at debug as {@link check} decides, a loud repeat
   * with the field `repeated=N`. `key` defaults to `msg`.
   */
  log(logger: Logger, level: 'error' | 'warn' | 'info', msg: string, fields?: LogFields, key?: string): void;
  /** The failing condition is over: the next failure is new. */
  clear(): void;
}

export function createRepeatFilter(options: RepeatFilterOptions = {}): RepeatFilter {
  const intervalMs = options.intervalMs ?? 60_000;
  const now = options.now ?? Date.now;
  // Only the latest failure is remembered: a change is news even when it
  // changes back (A, B, A logs three lines), so the log always shows the
  // current failure.
  let last: { key: string; loudAt: number; quiet: number } | undefined;
  const check = (key: string): RepeatVerdict => {
    const t = now();
    if (last === undefined || last.key !== key || t - last.loudAt >= intervalMs) {
      const repeated = last?.key === key ? last.quiet : 0;
      last = { key, loudAt: t, quiet: 0 };
      return { loud: true, repeated };
    }
    last.quiet++;
    return { loud: false, repeated: 0 };
  };
  return {
    check,
    log(logger, level, msg, fields, key = msg) {
      const v = check(key);
      if (!v.loud) return logger.debug(msg, fields);
      logger[level](msg, v.repeated > 0 ? { ...fields, repeated: v.repeated } : fields);
    },
    clear() {
      last = undefined;
    },
  };
}
