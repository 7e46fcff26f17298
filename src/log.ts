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
