// userspace-proxy: what its modules share: the program's name, the
// defaults and reading of its environment options, its log lines and its
// acks. See userspace-proxy.mjs.
import { writeSync } from 'node:fs';

const PROG = 'userspace-proxy';

/** Defaults of the environment options (README: callouts/README.md "userspace-proxy"). */
export const DEFAULTS = Object.freeze({
  /** USERSPACE_PROXY_MAX_CONNECTIONS: TCP connections plus UDP sessions at once. */
  maxConnections: 10_000,
  /** USERSPACE_PROXY_UDP_IDLE_TIMEOUT_MS: a UDP session without a datagram either way for this long is closed. */
  udpIdleTimeoutMs: 30_000,
  /** USERSPACE_PROXY_CONNECT_TIMEOUT_MS: the first attempt's connect timeout; doubled at each further attempt. */
  connectTimeoutMs: 1_000,
  /** USERSPACE_PROXY_CONNECT_ATTEMPTS: endpoints tried per TCP connection (never more than there are). */
  connectAttempts: 4,
  /** USERSPACE_PROXY_BUFFER_BYTES: stream high-water mark per direction of a TCP connection. */
  bufferBytes: 256 * 1024,
  /** SessionAffinity ClientIP with no TimeoutSeconds (Kubernetes' default). */
  affinitySeconds: 10_800,
});


export const log = (msg) => process.stderr.write(`${PROG}: ${msg}\n`);
/** A state string as it may appear in a log line: JSON-quoted (no control characters, no injection). */
export const q = (s) => JSON.stringify(String(s));

/** Reads the options from `env`; throws naming the variable on a bad value. */
export function readOptions(env = process.env) {
  const int = (name, dflt, min, max) => {
    const raw = env[name];
    if (raw === undefined || raw === '') return dflt;
    if (!/^[0-9]+$/.test(raw) || Number(raw) < min || Number(raw) > max) {
      throw new Error(`${name} must be an integer from ${min} to ${max}, not ${q(raw)}`);
    }
    return Number(raw);
  };
  const logMode = env.USERSPACE_PROXY_LOG ?? '';
  if (logMode !== '' && logMode !== 'connections') throw new Error(`USERSPACE_PROXY_LOG must be "connections" or empty, not ${q(logMode)}`);
  return {
    maxConnections: int('USERSPACE_PROXY_MAX_CONNECTIONS', DEFAULTS.maxConnections, 1, 1_000_000),
    udpIdleTimeoutMs: int('USERSPACE_PROXY_UDP_IDLE_TIMEOUT_MS', DEFAULTS.udpIdleTimeoutMs, 10, 86_400_000),
    connectTimeoutMs: int('USERSPACE_PROXY_CONNECT_TIMEOUT_MS', DEFAULTS.connectTimeoutMs, 10, 600_000),
    connectAttempts: int('USERSPACE_PROXY_CONNECT_ATTEMPTS', DEFAULTS.connectAttempts, 1, 100),
    bufferBytes: int('USERSPACE_PROXY_BUFFER_BYTES', DEFAULTS.bufferBytes, 1024, 64 * 1024 * 1024),
    logConnections: logMode === 'connections',
  };
}

/** Writes one ack line on fd 3. */
export function ack(line) {
  const buf = Buffer.from(line.replace(/[\r\n]+/g, ' ').slice(0, 4000) + '\n');
  for (let off = 0; off < buf.length; ) {
    try {
      off += writeSync(3, buf, off);
    } catch (err) {
      if (err.code === 'EAGAIN') continue;
      log(`cannot write the ack on fd 3 (${err.code ?? err.message}): exiting`);
      process.exit(1);
    }
  }
}
