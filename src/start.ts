/**
 * What the bins run first: stop signals are caught before the program's
 * modules load (~0.1 s, longer on a busy node), so that one arriving then is
 * a stop (exit 0, as README's table says), not Node's default death by the
 * signal (143, 130, 129). Imports nothing else at load time; cli.ts takes the
 * signals over as it starts.
 */
import type { Tool } from './cli.js';
import { STOP_SIGNALS } from './signals.js';

/** Runs `tool`'s command line. */
export async function start(tool: Tool): Promise<void> {
  // Nothing has started yet: nothing to stop but ourselves.
  const early = (): never => process.exit(0);
  for (const s of STOP_SIGNALS) process.on(s, early);
  const { main } = await import('./cli.js');
  // main installs its own handlers before its first await; ours go only then, so that no
  // moment is left without one (with none, Node restores the default action).
  const running = main(tool);
  for (const s of STOP_SIGNALS) process.off(s, early);
  await running;
}
