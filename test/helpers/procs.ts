/**
 * Process state read from /proc (Linux), for tests about callout processes:
 * one process, a process group, a parent's unreaped children, and a wait for
 * a process to be gone (the kernel finishing a kill has no event to wait on).
 */
import { readdirSync, readFileSync } from 'node:fs';
import { pollUntil } from './wait.js';

/** `/proc/PID/stat` fields after the command name: state, ppid, pgrp; undefined when gone. */
export function procStat(pid: number): { state: string; ppid: number; pgrp: number } | undefined {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return { state: f[0]!, ppid: Number(f[1]), pgrp: Number(f[2]) };
  } catch {
    return undefined;
  }
}

/** True while `pid` exists and is not a zombie (a zombie is gone for our purposes: PID 1 here may not reap). */
export function pidAlive(pid: number): boolean {
  const st = procStat(pid);
  return st !== undefined && st.state !== 'Z' && st.state !== 'X';
}

/** Every process for which `pred` holds on its stat. */
function processes(pred: (st: NonNullable<ReturnType<typeof procStat>>) => boolean): number[] {
  return readdirSync('/proc')
    .filter((n) => /^\d+$/.test(n))
    .map(Number)
    .filter((pid) => {
      const st = procStat(pid);
      return st !== undefined && pred(st);
    });
}

/** Processes of group `pgid` still running (zombies excluded). */
export function groupMembers(pgid: number): number[] {
  return processes((st) => st.pgrp === pgid && st.state !== 'Z' && st.state !== 'X');
}

/** Zombie children of `parent`: processes it failed to reap. */
export function zombieChildren(parent: number): number[] {
  return processes((st) => st.ppid === parent && st.state === 'Z');
}

/** Resolves once `pid` is gone (or a zombie); rejects after `ms`. */
export async function waitGone(pid: number, ms = 10_000): Promise<void> {
  await pollUntil(() => !pidAlive(pid), `process ${pid} to be gone`, ms);
}
