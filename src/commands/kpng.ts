/**
 * The default command: a kpng controller's node-local gRPC API as the source
 * (src/sources/kpng.ts), with the Go client's flags.
 */
import { readFileSync } from 'node:fs';
import { Option, type Command } from 'commander';
import { DEFAULTS, formatDuration, formatSize } from '../defaults.js';
import { CalloutError, usageError } from '../errors.js';
import { parseHostPort, parseSize, type Address } from '../options.js';
import type { CommonOptions } from '../pipeline.js';
import type { Source } from '../source.js';
import { duration } from './common.js';

/** Raw values of the kpng options (typed by argParser). */
export interface KpngFlags {
  api: Address;
  errorDelay: number;
  maxMsgSize: number;
  tlsCa?: string;
  tlsCrt?: string;
  tlsKey?: string;
}

/** Adds the kpng source's options to the root command. */
export function addKpngOptions(cmd: Command): Command {
  return cmd
    .addOption(
      new Option('--api <host:port>', 'kpng controller API address (or unix:PATH)')
        .argParser((v: string) => parseHostPort('--api', v))
        .default(parseHostPort('--api', DEFAULTS.api), DEFAULTS.api),
    )
    .addOption(new Option('--error-delay <duration>', 'wait before reconnecting after a stream error').argParser(duration('--error-delay')).default(DEFAULTS.errorDelayMs, formatDuration(DEFAULTS.errorDelayMs)))
    .addOption(
      new Option('--max-msg-size <bytes>', 'largest gRPC message accepted (e.g. 4MiB)')
        .argParser((v: string) => parseSize('--max-msg-size', v))
        .default(DEFAULTS.maxMsgSize, formatSize(DEFAULTS.maxMsgSize)),
    )
    .option('--tls-ca <file>', 'CA certificate to verify the server (enables TLS)')
    .option('--tls-crt <file>', 'client certificate for mutual TLS (needs --tls-key)')
    .option('--tls-key <file>', 'client key for mutual TLS (needs --tls-crt)');
}

function readOptFile(option: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? 'error';
    throw new CalloutError('usage', `${option} ${path}: cannot read file (${code})`, { cause: err });
  }
}

/** Builds the kpng gRPC source from validated options; grpc-js and protobufjs load only now (the other sources don't need them). */
export async function kpngSourceFrom(o: KpngFlags, common: CommonOptions): Promise<Source> {
  if ((o.tlsCrt === undefined) !== (o.tlsKey === undefined)) {
    const [given, missing] = o.tlsCrt !== undefined ? ['--tls-crt', '--tls-key'] : ['--tls-key', '--tls-crt'];
    throw usageError(given, String(o.tlsCrt ?? o.tlsKey), `mutual TLS needs ${missing} too`);
  }
  // 0 would reconnect in a busy loop (hundreds of times a second) while the controller is away.
  if (o.errorDelay <= 0) throw usageError('--error-delay', formatDuration(o.errorDelay), 'expected a duration above 0');
  const anyTls = o.tlsCa !== undefined || o.tlsCrt !== undefined;
  const tls = anyTls
    ? {
        ca: o.tlsCa !== undefined ? readOptFile('--tls-ca', o.tlsCa) : undefined,
        cert: o.tlsCrt !== undefined ? readOptFile('--tls-crt', o.tlsCrt) : undefined,
        key: o.tlsKey !== undefined ? readOptFile('--tls-key', o.tlsKey) : undefined,
      }
    : undefined;
  const { checkTlsMaterial, createKpngSource } = await import('../sources/kpng.js');
  if (tls) {
    // Checked here, where the options and files have names (the source would only say "TLS files").
    try {
      checkTlsMaterial(tls, { ca: `--tls-ca ${o.tlsCa}`, cert: `--tls-crt ${o.tlsCrt}`, key: `--tls-key ${o.tlsKey}` });
    } catch (err) {
      throw new CalloutError('usage', (err as Error).message, { cause: err });
    }
  }
  return createKpngSource({
    api: o.api.text,
    nodeName: common.nodeName,
    once: common.once,
    errorDelayMs: o.errorDelay,
    maxMsgSize: o.maxMsgSize,
    tls,
    logger: common.logger,
  });
}
