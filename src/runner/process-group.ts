/**
 * A callout's process group: which of its processes are alive, and ending
 * them all. The callout is spawned with setsid(), so it leads a group and a
 * session of its own and whatever it starts carries its pid as their ids:
 * signalling the group (and the session members that left it) reaches every
 * descendant, background processes included, and nothing of a callout
 * outlives it or us.
 *
 * Listing the members reads /proc/PID/stat of every process (~23 µs each:
 * 1.5 ms with 65 processes, measured), after every run. But pids are handed
 * out in increasing order until they wrap at pid_max, so while the last pid
 * given out (/proc/sys/kernel/ns_last_pid) is still at or above the leader's
 * and the group is young, only pids from the leader's on can be members; when
 * few pids were given out since, those are read directly, without listing
 * /proc (a thread's id reads like a pid there: only thread-group leaders count).
 */
import { readdirSync, readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import type { LogFields, Logger } from '../log.js';

const POLL_MS = 50;
/** A group younger than this cannot have seen pids wrap around and come back past its leader's (that takes pid_max forks). */
const NO_WRAP_MS = 5000;
/** After SIGKILL, how long we keep checking that the group is gone. */
const AFTER_KILL_WAIT_MS = 2000;

interface Member {
  pid: number;
  pgrp: number;
}

/** Reading these many /proc/PID/stat files directly beats listing /proc (~0.2 ms) first. */
const PROBE_MAX = 64;

/** `pid`'s group and whether it is live (not a zombie), or undefined when there is no such pid (any more). */
function statOf(pid: number): { pgrp: number; session: number; live: boolean } | undefined {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
  } catch {
    return undefined; // exited meanwhile, or never was
  }
  // pid (comm) state ppid pgrp session ...; comm may contain spaces and parentheses.
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { pgrp: Number(f[2]), session: Number(f[3]), live: f[0] !== 'Z' && f[0] !== 'X' };
}

/** A thread's id reads like a pid in /proc (unlisted): only a thread group's leader is a process. */
function isProcess(pid: number): boolean {
  try {
    return new RegExp(`^Tgid:\\s*${pid}$`, 'm').test(readFileSync(`/proc/${pid}/status`, 'latin1'));
  } catch {
    return false;
  }
}

/**
 * Live processes of group `pgid`, read from /proc: those in the process
 * group, and those of session `pgid` that moved to another group (a shell
 * with job control puts each background job in a group of its own). Zombies
 * are skipped: they never go away when PID 1 does not reap orphans
 * (containers without an init). Only pids in `range` when given (see the
 * module comment). Undefined without /proc.
 */
function scan(pgid: number, range?: { from: number; to: number }): Member[] | undefined {
  if (process.platform !== 'linux') return undefined;
  const found: Member[] = [];
  const check = (pid: number): void => {
    const st = statOf(pid);
    if (st?.live && (st.pgrp === pgid || st.session === pgid)) found.push({ pid, pgrp: st.pgrp });
  };
  if (range && range.to - range.from < PROBE_MAX) {
    for (let pid = range.from; pid <= range.to; pid++) check(pid);
    // Probed, not listed: a thread of a member would pass for a process.
    return found.filter((m) => m.pid === pgid || isProcess(m.pid));
  }
  let names: string[];
  try {
    names = readdirSync('/proc');
  } catch {
    return undefined;
  }
  for (const name of names) if (/^\d+$/.test(name) && Number(name) >= (range?.from ?? 0)) check(Number(name));
  return found;
}

/** The last pid given out in our pid namespace, or undefined when the kernel does not say. */
function lastPid(): number | undefined {
  try {
    const n = Number(readFileSync('/proc/sys/kernel/ns_last_pid', 'latin1'));
    return Number.isInteger(n) && n > 0 ? n : undefined;
  } catch {
    return undefined;
  }
}

/** Whether signal 0 reaches process group `pgid` (zombies count: used only without /proc). */
function groupProbe(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Options of a `ProcessGroup`. */
export interface ProcessGroupOptions {
  /** SIGTERM -> SIGKILL grace, in milliseconds. */
  killGraceMs: number;
  logger: Logger;
  /** How log lines name the group's owner (`callout run 3`), and the fields they carry. */
  name: string;
  fields: LogFields;
  /** Monotonic clock in milliseconds (default performance.now). */
  now?: () => number;
}

/**
 * The process group (and session) led by a spawned callout, `pgid` being its
 * pid. From construction until `release()`, our process exiting SIGKILLs the
 * group: it is detached, nothing else would end it.
 */
export class ProcessGroup {
  private sigtermSent = false;
  private sigkillSent = false;
  private killTimer: NodeJS.Timeout | undefined;
  private readonly onProcessExit = (): void => this.kill();
  private readonly now: () => number;
  private readonly bornAt: number;

  constructor(
    readonly pgid: number,
    private readonly options: ProcessGroupOptions,
  ) {
    this.now = options.now ?? (() => performance.now());
    this.bornAt = this.now();
    process.on('exit', this.onProcessExit);
  }

  /**
   * Pids of the live (non-zombie) members, ascending. Without /proc (not
   * Linux) they cannot be listed: `[pgid]` stands for the group while signal 0
   * still reaches it.
   */
  members(): number[] {
    const m = scan(this.pgid, this.pidRange());
    if (m === undefined) return groupProbe(this.pgid) ? [this.pgid] : [];
    return m.map((x) => x.pid).sort((a, b) => a - b);
  }

  /** SIGTERM the group now and SIGKILL it after the grace (unless either is under way). */
  terminate(): void {
    if (this.sigtermSent || this.sigkillSent) return;
    this.sigtermSent = true;
    this.signal('SIGTERM');
    this.killTimer = setTimeout(() => {
      this.killTimer = undefined;
      this.options.logger.debug('callout group still running after SIGTERM: SIGKILL it', this.options.fields);
      this.kill();
    }, this.options.killGraceMs);
  }

  /** SIGKILL the group now. */
  kill(): void {
    this.cancelKillTimer();
    this.sigkillSent = true;
    this.signal('SIGKILL');
  }

  /**
   * Resolves once the group is gone: through the SIGTERM grace (the SIGKILL
   * timer is cancelled as soon as nothing is left), then bounded after
   * SIGKILL. Without a signal sent it waits as long as the group lives.
   */
  async waitGone(): Promise<void> {
    while (!this.sigkillSent && this.alive()) await sleep(POLL_MS);
    this.cancelKillTimer();
    for (let waited = 0; this.sigkillSent && waited < AFTER_KILL_WAIT_MS && this.alive(); waited += POLL_MS) await sleep(POLL_MS);
  }

  /**
   * Ends whatever is left in the group after its leader exited: SIGTERM then
   * SIGKILL after the grace, or at once when an earlier SIGTERM's grace is
   * over, or SIGKILL again (to reach what appeared since) after a kill; then
   * waits until it is gone and warns about any survivor.
   */
  async clear(): Promise<void> {
    if (!this.sigtermSent && !this.sigkillSent) this.terminate();
    else if (this.sigkillSent) this.signal('SIGKILL');
    else if (this.killTimer === undefined) this.kill();
    await this.waitGone();
    const still = this.members();
    if (still.length > 0) this.options.logger.warn(`${this.options.name}: processes still present after SIGKILL (pids ${still.join(', ')})`, this.options.fields);
  }

  /** Done with the group: our exit no longer kills it. */
  release(): void {
    this.cancelKillTimer();
    process.removeListener('exit', this.onProcessExit);
  }

  /** The pids a member can have: from the leader's to the last given out, while pids cannot have wrapped since it started (see the module comment); undefined: any. */
  private pidRange(): { from: number; to: number } | undefined {
    if (this.now() - this.bornAt >= NO_WRAP_MS) return undefined;
    const last = lastPid();
    return last !== undefined && last >= this.pgid ? { from: this.pgid, to: last } : undefined;
  }

  private alive(): boolean {
    return this.members().length > 0;
  }

  private cancelKillTimer(): void {
    clearTimeout(this.killTimer);
    this.killTimer = undefined;
  }

  /**
   * Sends `sig` to the process group and to the members of the session that
   * left it (background jobs of a shell with job control). Never throws.
   */
  private signal(sig: NodeJS.Signals): void {
    try {
      process.kill(-this.pgid, sig);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ESRCH') this.options.logger.debug(`cannot signal the callout's group: ${String(err)}`, this.options.fields);
    }
    for (const m of scan(this.pgid, this.pidRange()) ?? []) {
      if (m.pgrp === this.pgid) continue; // reached through the group
      try {
        process.kill(m.pid, sig);
      } catch {
        /* exited meanwhile */
      }
    }
  }
}
