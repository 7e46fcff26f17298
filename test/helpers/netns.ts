/**
 * What every network-namespace lab needs: a check that namespaces can be made
 * here (with the reason when not, for the skip message), and the removal of
 * namespaces that an earlier, killed run of the same lab left behind. A lab
 * names its namespaces `prefix + pid + '-' + role`.
 */
import { spawnSync } from 'node:child_process';
import { missingTools, runCommand } from './command.js';

/**
 * Why namespaces of `prefix` cannot be made here, or undefined when they can.
 * `probe` runs inside a fresh namespace for a lab's own extra check (its message, or undefined).
 */
export async function netnsMissing(prefix: string, tools: readonly string[], installHint: string, probe?: (ns: string) => Promise<string | undefined>): Promise<string | undefined> {
  if (process.platform !== 'linux') return 'network namespaces need Linux';
  if (process.getuid?.() !== 0) return 'network namespaces need root';
  const missing = missingTools([...tools]);
  if (missing.length) return `missing tools: ${missing.join(', ')} (${installHint})`;
  const ns = `${prefix}${process.pid}-probe`;
  const r = await runCommand('ip', ['netns', 'add', ns]);
  if (r.code !== 0) return `cannot create a network namespace: ${r.stderr.trim()}`;
  const why = await probe?.(ns);
  await runCommand('ip', ['netns', 'del', ns]);
  if (why) return why;
  removeStaleNamespaces(prefix);
  return undefined;
}

/** Removes namespaces of `prefix` whose run (its pid) is gone. */
export function removeStaleNamespaces(prefix: string): void {
  const list = spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' }).stdout ?? '';
  for (const line of list.split('\n')) {
    const m = new RegExp(`^(${prefix}(\\d+)-[a-z0-9-]+)\\b`).exec(line);
    if (!m || Number(m[2]) === process.pid) continue;
    try {
      process.kill(Number(m[2]), 0);
      continue; // that run is still going
    } catch {
      spawnSync('ip', ['netns', 'del', m[1]!], { stdio: 'ignore' });
    }
  }
}
