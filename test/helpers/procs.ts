/** Process state read from /proc (Linux), for tests about callout processes. */
import { readFileSync } from 'node:fs';

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

/** True while `pid` exists and is not a zombie (a zombie is gone for our purposes). */
export function pidAlive(pid: number): boolean {
  const st = procStat(pid);
  return st !== undefined && st.state !== 'Z';
}
