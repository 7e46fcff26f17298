/**
 * Parsers for option values. Each throws a usage CalloutError that names the
 * option, what was given and what was expected, so the CLI can print it as is.
 */
import { usageError } from './errors.js';

const units: Record<string, number> = { ns: 1e-6, us: 1e-3, 'µs': 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/**
 * A Go-style duration (`100ms`, `1s`, `1m30s`, `0`) in milliseconds.
 * A bare number is rejected (is `5` seconds or milliseconds?) except `0`.
 */
export function parseDuration(option: string, value: string): number {
  const v = value.trim();
  if (v === '0') return 0;
  const re = /(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)/gy;
  let total = 0;
  let pos = 0;
  let m: RegExpExecArray | null;
  while ((m = re.exec(v)) !== null) {
    total += Number(m[1]) * units[m[2]!]!;
    pos = re.lastIndex;
  }
  if (v === '' || pos !== v.length) {
    throw usageError(option, JSON.stringify(value), 'expected a duration such as 100ms, 1s, 1m30s (or 0)');
  }
  // Node's timers hold at most 2^31-1 ms (a longer one fires at once): refused, not turned into 1 ms.
  if (total > MAX_DURATION_MS) throw usageError(option, JSON.stringify(value), 'expected a duration of at most 596h (2147483647ms, the longest timer)');
  return total;
}

/** The longest duration an option takes: Node's longest timer. */
const MAX_DURATION_MS = 2 ** 31 - 1;

const sizeUnits: Record<string, number> = { '': 1, b: 1, k: 1000, kb: 1000, ki: 1024, kib: 1024, m: 1e6, mb: 1e6, mi: 1048576, mib: 1048576, g: 1e9, gb: 1e9, gi: 1073741824, gib: 1073741824 };

/** A byte size: `4194304`, `4MiB`, `512KiB`, `10MB`. */
export function parseSize(option: string, value: string): number {
  const m = /^(\d+(?:\.\d+)?)\s*([a-zA-Z]*)$/.exec(value.trim());
  const mult = m ? sizeUnits[m[2]!.toLowerCase()] : undefined;
  if (!m || mult === undefined) throw usageError(option, JSON.stringify(value), 'expected a size in bytes such as 4194304, 4MiB or 512KiB');
  const n = Math.floor(Number(m[1]) * mult);
  if (n < 1 || n > 2 ** 31 - 1) throw usageError(option, value, 'size out of range: 1 byte to 2GiB - 1 (2147483647)');
  return n;
}

/** What {@link parseHostPort} accepts besides `HOST:PORT` with a port in 1-65535. */
export interface HostPortOptions {
  /** Port 0: listen on any free port (e.g. --metrics-addr in tests). */
  allowPortZero?: boolean;
  /** `:PORT`: listen on every interface (Go's convention; for listen addresses only). */
  allowEmptyHost?: boolean;
}

/**
 * An address parsed once, at the command line: a Unix socket, or a host
 * (brackets of an IPv6 literal removed; `''` for every interface) and port.
 * `text` is the address as given, for messages and for gRPC targets.
 */
export type Address = { readonly text: string } & ({ readonly unix: string } | { readonly host: string; readonly port: number });

/**
 * `host:port`, `[v6]:port` or a `unix:` address, validated and parsed.
 * See {@link HostPortOptions} for port 0 and `:PORT`.
 */
export function parseHostPort(option: string, value: string, options: HostPortOptions = {}): Address {
  const { allowPortZero = false, allowEmptyHost = false } = options;
  if (value.startsWith('unix:')) {
    if (value.length <= 5) throw usageError(option, value, 'expected unix:PATH');
    return { text: value, unix: value.slice(5) };
  }
  const m = /^(\[[0-9a-fA-F:.]+\]|[^:[\]\s]*):(\d+)$/.exec(value);
  if (!m) {
    const example = allowEmptyHost ? '127.0.0.1:9100, [::1]:9100 or :9100 (every interface)' : '127.0.0.1:12090 or [::1]:12090';
    throw usageError(option, JSON.stringify(value), `expected HOST:PORT, such as ${example}`);
  }
  const port = Number(m[2]);
  if (port < (allowPortZero ? 0 : 1) || port > 65535) throw usageError(option, value, `port out of range ${allowPortZero ? 0 : 1}-65535`);
  if (m[1] === '' && !allowEmptyHost) throw usageError(option, value, 'missing host, such as 127.0.0.1');
  return { text: value, host: m[1]!.replace(/^\[(.*)\]$/, '$1'), port };
}

/**
 * A node name (`--node-name`): non-empty and not starting with `-`, which no
 * Node name does (a DNS subdomain) and which means the value was left out
 * (`--node-name --once` would otherwise take `--once` as the name).
 */
export function parseNodeName(option: string, value: string): string {
  if (value.startsWith('-')) throw usageError(option, JSON.stringify(value), 'expected a node name, not an option (its value is missing)');
  return parseNonEmpty(option, value);
}

/** A non-empty string option (names, paths). */
export function parseNonEmpty(option: string, value: string): string {
  if (value.trim() === '') throw usageError(option, '""', 'expected a non-empty value');
  return value;
}

/**
 * Validates `--service-proxy-name`: a label value (at most 63 characters of
 * letters, digits, `-`, `_`, `.`, starting and ending with a letter or digit),
 * since the API server rejects a selector with anything else.
 */
export function parseServiceProxyName(option: string, value: string): string {
  if (!/^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$/.test(value)) {
    throw usageError(option, JSON.stringify(value), 'expected a label value: 1-63 letters, digits, "-", "_" or ".", starting and ending with a letter or digit');
  }
  return value;
}
