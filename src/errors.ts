/**
 * The one error class of kpng-callout. `code` groups errors for exit codes and
 * tests; `cause` keeps the underlying error for `-v` logs.
 */
export type ErrorCode =
  /** A command-line option or environment value is invalid (exit 2). */
  | 'usage'
  /** An input file or stream cannot be read or parsed. */
  | 'input'
  /** The source (kpng server, Kubernetes API) failed. */
  | 'source'
  /** A local resource cannot be used (a port in use, a file we must write): exit 1, no usage hint. */
  | 'io'
  /** The callout cannot be run at all (exit 127 or 126, as a shell would). */
  | 'callout';

export class CalloutError extends Error {
  readonly code: ErrorCode;
  /** The exit status this error asks for, when not the code's usual one. */
  readonly exitCode: number | undefined;
  /** A usage error about the root command's options (its --help, not a subcommand's, tells about them). */
  readonly rootHelp: boolean;
  constructor(code: ErrorCode, message: string, options?: { cause?: unknown; exitCode?: number; rootHelp?: boolean }) {
    super(message, options);
    this.name = 'CalloutError';
    this.code = code;
    this.exitCode = options?.exitCode;
    this.rootHelp = options?.rootHelp ?? false;
  }
}

/** `--api 127.0.0.1:99999: port out of range 1-65535` */
export function usageError(option: string, given: string, expected: string): CalloutError {
  return new CalloutError('usage', `${option} ${given}: ${expected}`);
}

/**
 * A write that failed because its reader went away (a closed pipe, a reset
 * socket, a stream we destroyed): no output was lost that anyone wanted.
 */
export function readerGone(err: { code?: string | undefined } | null | undefined): boolean {
  const code = err?.code;
  return code === 'EPIPE' || code === 'ECONNRESET' || code === 'ERR_STREAM_DESTROYED';
}
