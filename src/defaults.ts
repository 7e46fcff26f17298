/**
 * Every default of the command line, in one place: the option parsers, the
 * help text and the README all take them from here. Durations are in
 * milliseconds, sizes in bytes.
 */
export const DEFAULTS = {
  /** `--callout` when neither it nor $CALLOUT is set (as upstream kpng-callout). */
  callout: '/bin/cat',
  debounceMs: 100,
  maxWaitMs: 1000,
  timeoutMs: 60_000,
  /** SIGTERM -> SIGKILL grace for a callout's process group. */
  killGraceMs: 5000,
  resyncPeriodMs: 0,
  retryMinMs: 1000,
  retryMaxMs: 30_000,
  /** `--once-timeout`: 0 waits for ever. */
  onceTimeoutMs: 0,
  /** kpng source. */
  api: '127.0.0.1:12090',
  errorDelayMs: 1000,
  /** A kpng stream attempt without an answer this long is logged (grpc-go's connect timeout; see sources/kpng.ts). */
  noAnswerMs: 20_000,
  maxMsgSize: 4 * 1024 * 1024,
  /**
   * kpng source: an HTTP/2 ping this often on an open stream, so that a dead
   * controller or a lost network is noticed (the Go client had TCP keepalive,
   * 15 s, from Go's dialer; grpc-js has neither). Above 5 minutes on purpose:
   * a grpc-go server (kpng) answers pings more frequent than that on a quiet
   * stream with GOAWAY too_many_pings.
   */
  keepaliveMs: 330_000,
  /** kpng source: a ping unanswered this long closes the connection. */
  keepaliveTimeoutMs: 20_000,
  /** replay --watch with --watch-poll: how often files are polled. */
  watchIntervalMs: 1000,
  logFormat: 'text' as 'text' | 'json',
  /** After a state, this long without another before a memory-reducing GC gives memory back (src/memory.ts). */
  idleGcQuietMs: 1000,
  /** ...and only when the heap and its buffers grew this much (bytes; and by half) since the last such GC: after a burst, not each single change. */
  idleGcMinGrowth: 8 * 2 ** 20,
  /** After the first sync: the heap may grow this much (%) over what a full collection kept before the next (src/memory.ts). */
  steadyHeapGrowingPercent: 100,
  /** kube source: list/watch restart backoff (jittered, src/backoff.ts). */
  kubeRetryMinMs: 500,
  kubeRetryMaxMs: 30_000,
  /** kube source: the watch timeout asked of the API server, at random in this range (as client-go). */
  kubeWatchTimeoutMinS: 300,
  kubeWatchTimeoutMaxS: 600,
} as const;

/** A duration in Go's notation, zero parts left out (`100ms`, `1s`, `1m30s`, `1h`), for help texts. */
export function formatDuration(ms: number): string {
  if (ms === 0) return '0';
  if (ms < 1000 || ms % 1000 !== 0) return `${ms}ms`;
  const total = ms / 1000;
  const h = Math.floor(total / 3600);
  const m = Math.floor((total % 3600) / 60);
  const s = total % 60;
  return `${h ? `${h}h` : ''}${m ? `${m}m` : ''}${s ? `${s}s` : ''}`;
}

/** A byte size as the help shows it (`4MiB`). */
export function formatSize(n: number): string {
  if (n % 1048576 === 0) return `${n / 1048576}MiB`;
  if (n % 1024 === 0) return `${n / 1024}KiB`;
  return String(n);
}
