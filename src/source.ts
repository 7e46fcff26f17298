/**
 * What every source (kpng gRPC, replay, Kubernetes API) implements: produce
 * complete node-local states, nothing else. A source knows nothing of callouts.
 */
import type { State } from './state.js';

/** Connection status of a live source, for logs, metrics and /healthz. */
export interface SourceStatus {
  /** A stream/watch is established. */
  connected: boolean;
  /** The current connection delivered a complete state (first Sync, initial lists). */
  synced: boolean;
  /** Reconnections since start. */
  reconnects: number;
  /** Last error, when disconnected. */
  error?: string;
}

/** How a pushed state is meant. */
export interface PushOptions {
  /**
   * The last state again, on purpose (replay --watch: the callout program
   * changed): it runs even when identical, and in full.
   */
  again?: boolean | undefined;
}

/** Where a source delivers its states. */
export interface StateSink {
  /**
   * A complete state. Live sources never wait on the returned promise (ingest
   * never waits for the callout); replay awaits it to run fixtures in order.
   */
  push(state: State, options?: PushOptions): void | Promise<void>;
  /** Status changes of a live source. */
  status?: ((status: SourceStatus) => void) | undefined;
  /**
   * The source did a burst of work that gave no new state (a re-list that
   * changed nothing this node sees): the memory it used may be given back
   * once things are quiet, as after a state.
   */
  worked?: (() => void) | undefined;
}

export interface Source {
  /**
   * Produces states until `signal` aborts or the source is exhausted (replay
   * without --watch). Resolves on a clean stop; rejects with a CalloutError
   * only for errors that retrying cannot fix (bad files, bad TLS files).
   */
  run(sink: StateSink, signal: AbortSignal): Promise<void>;
}
