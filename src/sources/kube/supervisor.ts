/**
 * Supervision of the list/watch loops (one per watched resource): their
 * health, the source's status, and restarts with jittered backoff. It knows
 * nothing of HTTP or of the client library: a member starts, and reports
 * back that it listed, is healthy, or failed (a {@link Failure} already in
 * words); the supervisor decides when to restart it and what to log.
 *
 * When the API server is down every member fails, each on its own. One
 * attempt must give one log line naming what failed (and the same line each
 * time, for the once-a-minute rule of createRepeatFilter), so failures are
 * gathered into attempts: the members restarted together are awaited until
 * each has succeeded or failed (at most ATTEMPT_MAX_MS: a hung request must
 * not hold the others back), a failure out of the blue (a cut watch) waits
 * GATHER_MS for companions (the API server restarted: every watch is cut);
 * then one line, and one restart of all of them after the backoff (jittered:
 * identical nodes must not retry in lockstep after an API server restart).
 *
 * Also here: the idle watchdog a member arms on each open watch.
 */
import { backoffDelay, type BackoffBounds } from '../../backoff.js';
import { createRepeatFilter, silentLogger, type Logger, type RepeatFilter } from '../../log.js';
import type { SourceStatus } from '../../source.js';
import { failureLine, qualified, type Failure, type ResourceName } from './failures.js';

/** How long a failure out of the blue waits for companions before its line (ms). */
const GATHER_MS = 100;
/** Longest wait for the outcome of every member restarted together (ms). */
const ATTEMPT_MAX_MS = 2000;

/** One list/watch loop, as the supervisor drives it. */
export interface Member extends ResourceName {
  /** Lists (unless it can resume) and watches; reports through the supervisor's `listed`, `healthy` and `failed`. */
  start(): void;
  /** Ends the loop for good. */
  stop(): void;
}

/** Options of {@link ListWatchSupervisor}. */
export interface SupervisorOptions {
  /** The API server's URL, for messages. */
  server: string;
  /** Restart delays of failed members (jittered, see backoffDelay). */
  backoff: BackoffBounds;
  logger?: Logger | undefined;
  /** Millisecond clock of the once-a-minute rule for repeated failures (tests). Default Date.now. */
  now?: (() => number) | undefined;
  /** Status changes (deduplicated). */
  onStatus?: ((status: SourceStatus) => void) | undefined;
  /** Every member completed its initial list (called once). */
  onSynced?: (() => void) | undefined;
}

/** What the supervisor knows of a member. */
interface Health {
  /** Initial list completed (stays true: what is known keeps serving after errors). */
  synced: boolean;
  /** Last list/watch succeeded and nothing failed since. */
  healthy: boolean;
  /** Consecutive failures, for the backoff. */
  failures: number;
}

/** Drives a set of members; see the module comment. */
export class ListWatchSupervisor {
  private readonly log: Logger;
  private readonly members = new Map<Member, Health>();
  private stopped = false;
  private reconnects = 0;
  private lastError: string | undefined;
  private lastStatus = '';
  /** The same failure at most once a minute at its level (debug in between). */
  private readonly repeats: RepeatFilter;
  /** Started, outcome not known yet. */
  private readonly inflight = new Set<Member>();
  /** Failed in the attempt being gathered. */
  private readonly gathered = new Map<Member, Failure>();
  /** Waiting for the restart timer. */
  private readonly scheduled = new Set<Member>();
  /** Healthy again after failures: one "connected again" line for them. */
  private readonly recovered = new Set<Member>();
  private recoveredAfter = 0;
  private restartTimer: NodeJS.Timeout | undefined;
  private restartAt = 0;
  private gatherTimer: NodeJS.Timeout | undefined;
  private gatherStart = 0;
  private gatherMin = 0;

  constructor(private readonly options: SupervisorOptions) {
    this.log = options.logger ?? silentLogger;
    this.repeats = createRepeatFilter({ now: options.now });
  }

  /** Adds a member (before {@link start}). */
  add(member: Member): void {
    this.members.set(member, { synced: false, healthy: false, failures: 0 });
  }

  /** Every member completed its initial list. */
  get synced(): boolean {
    return [...this.members.values()].every((h) => h.synced);
  }

  /** Stopped: members must open nothing new. */
  get isStopped(): boolean {
    return this.stopped;
  }

  /** Reports the first status and starts every member. */
  start(): void {
    this.report();
    for (const m of this.members.keys()) this.startMember(m);
  }

  /** Stops every member and every timer. */
  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    clearTimeout(this.restartTimer);
    clearTimeout(this.gatherTimer);
    for (const m of this.members.keys()) m.stop();
  }

  /** `member` listed `items` objects (and handed them over): healthy, and synced the first time. */
  listed(member: Member, items: number): void {
    if (this.stopped) return;
    this.healthy(member);
    const h = this.health(member);
    if (h.synced) return;
    h.synced = true;
    this.log.debug(`${qualified(member)}: initial list complete`, { items });
    if (this.synced) this.options.onSynced?.();
    this.report();
  }

  /** `member`'s list or watch succeeded (a watch was established). */
  healthy(member: Member): void {
    const h = this.health(member);
    const wasInflight = this.inflight.delete(member);
    if (h.failures > 0) {
      this.recovered.add(member);
      this.recoveredAfter = Math.max(this.recoveredAfter, h.failures);
    }
    h.failures = 0;
    if (!h.healthy) {
      h.healthy = true;
      // All well again: the next failure is news.
      if (this.allHealthy()) this.repeats.clear();
      this.report();
    }
    if (wasInflight) this.settle();
  }

  /** `member`'s list or watch failed: it is restarted after the backoff, with the others of its attempt. */
  failed(member: Member, failure: Failure): void {
    if (this.stopped) return;
    // Already failed, its restart pending: one failure, one restart.
    if (this.gathered.has(member) || this.scheduled.has(member)) return;
    const h = this.health(member);
    h.failures = Math.max(h.failures + 1, failure.streak ?? 0);
    h.healthy = false;
    const wasInflight = this.inflight.delete(member);
    this.gathered.set(member, failure);
    if (this.gatherTimer === undefined) {
      this.gatherStart = Date.now();
      // Part of an attempt in flight: its outcome comes with the others'.
      this.gatherMin = wasInflight || this.inflight.size > 0 ? 0 : GATHER_MS;
      this.gatherTimer = setTimeout(this.onGatherTimer, this.gatherMin || ATTEMPT_MAX_MS);
    }
    // For the status at once; the attempt's whole line replaces it when concluded.
    this.lastError = failureLine([failure], this.options.server);
    this.report();
    this.settle();
  }

  private health(member: Member): Health {
    const h = this.members.get(member);
    if (h === undefined) throw new Error(`${qualified(member)}: not a member`);
    return h;
  }

  private allHealthy(): boolean {
    return [...this.members.values()].every((h) => h.healthy);
  }

  private report(): void {
    const healthy = this.allHealthy();
    // Synced only while connected (as the kpng source): health must not say "ok" while the API server is unreachable.
    const s: SourceStatus = { connected: healthy, synced: healthy && this.synced, reconnects: this.reconnects, ...(!healthy && this.lastError ? { error: this.lastError } : {}) };
    const key = JSON.stringify(s);
    if (key === this.lastStatus) return;
    this.lastStatus = key;
    this.options.onStatus?.(s);
  }

  private startMember(member: Member): void {
    if (this.stopped) return;
    this.inflight.add(member);
    member.start();
  }

  /** In the order added: the same failure, the same line. */
  private inOrder(set: { has(m: Member): boolean }): Member[] {
    return [...this.members.keys()].filter((m) => set.has(m));
  }

  private logRecovered(): void {
    if (this.recovered.size === 0) return;
    const names = this.inOrder(this.recovered).map(qualified);
    this.log.info(`${names.join(', ')}: connected again after ${this.recoveredAfter} failed attempt(s)`);
    this.recovered.clear();
    this.recoveredAfter = 0;
  }

  /** After each outcome: concludes the attempt once nothing it waits for is in flight. */
  private settle(): void {
    if (this.inflight.size > 0) return;
    this.logRecovered();
    if (this.gatherTimer !== undefined && Date.now() - this.gatherStart >= this.gatherMin) this.concludeAttempt();
  }

  private readonly onGatherTimer = (): void => {
    const waited = Date.now() - this.gatherStart;
    if (this.inflight.size === 0 || waited >= ATTEMPT_MAX_MS) return this.concludeAttempt();
    this.gatherTimer = setTimeout(this.onGatherTimer, ATTEMPT_MAX_MS - waited);
  };

  /** Reports the failures gathered (one line) and schedules their restart. */
  private concludeAttempt(): void {
    clearTimeout(this.gatherTimer);
    this.gatherTimer = undefined;
    this.logRecovered();
    if (this.stopped || this.gathered.size === 0) return;
    const members = this.inOrder(this.gathered);
    const failures = members.map((m) => this.gathered.get(m)!);
    const line = failureLine(failures, this.options.server);
    const routine = failures.every((f) => f.routine);
    this.gathered.clear();
    // The least-failed member sets the pace: one restart for all of them.
    const attempt = Math.min(...members.map((m) => this.health(m).failures)) - 1;
    const delay = backoffDelay(attempt, this.options.backoff);
    this.lastError = line;
    const waiting = members.some((m) => !this.health(m).synced) ? { waiting: 'initial list' } : undefined;
    this.repeats.log(this.log, routine ? 'warn' : 'error', `${line}; retrying in ${delay}ms`, waiting, line);
    for (const m of members) this.scheduled.add(m);
    this.scheduleRestart(delay);
    this.report();
  }

  private scheduleRestart(delay: number): void {
    const at = Date.now() + delay;
    // A failure during the backoff of another joins its restart, or moves it earlier.
    if (this.restartTimer !== undefined && this.restartAt <= at) return;
    clearTimeout(this.restartTimer);
    this.restartAt = at;
    this.restartTimer = setTimeout(this.restartScheduled, delay);
  }

  private readonly restartScheduled = (): void => {
    this.restartTimer = undefined;
    if (this.stopped) return;
    this.reconnects++;
    const members = [...this.scheduled];
    this.scheduled.clear();
    for (const m of members) this.startMember(m);
  };
}

/** How long a watch may stay silent before it is taken as dead: its server-side timeout plus a minute (or twice it, when shorter), in ms. */
export function idleLimitMs(timeoutSeconds: number): number {
  return (timeoutSeconds + Math.min(60, timeoutSeconds)) * 1000;
}

/**
 * The idle watchdog of one watch: armed when the watch opens, reset by each
 * event, it calls `onIdle` when the watch stays silent past its limit (a
 * half-open TCP connection ends no watch by itself).
 */
export class IdleWatchdog {
  private timer: NodeJS.Timeout | undefined;

  /** (Re)arms: `onIdle` after `limitMs` without {@link poke}. */
  arm(limitMs: number, onIdle: () => void): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(onIdle, limitMs);
    // A watchdog alone must not keep the process alive.
    this.timer.unref();
  }

  /** An event came: the silence starts again. */
  poke(): void {
    this.timer?.refresh();
  }

  disarm(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}
