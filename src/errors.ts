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
  /** A callout run failed. */
  | 'run';

export class CalloutError extends Error {
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'CalloutError';
    this.code = code;
  }
}

/** `--api 127.0.0.1:99999: port out of range 1-65535` */
export function usageError(option: string, given: string, expected: string): CalloutError {
  return new CalloutError('usage', `${option} ${given}: ${expected}`);
}
