// userspace-proxy: its main: checks that it runs as a persistent callout,
// reads frames from stdin, applies each to the proxy and acknowledges it on
// fd 3; ends at EOF, SIGTERM or SIGINT. See userspace-proxy.mjs.
import { fstatSync, readlinkSync } from 'node:fs';
import { ack, log, readOptions } from './userspace-proxy-common.mjs';
import { localAddresses } from './userspace-proxy-address.mjs';
import { UserspaceProxy } from './userspace-proxy.mjs';
import { Planner } from './userspace-proxy-plan.mjs';
import { FrameReader, ServiceTable } from './userspace-proxy-state.mjs';

/** Listeners that could not be bound: how many are logged one by one, and named in the ack. */
const MAX_TOLD = 20;
const MAX_ACKED = 10;

export function main() {
  if (process.env.KPNG_CALLOUT_MODE !== 'persistent') {
    log('a persistent callout: run it with `kpng-callout --persistent [--changes] --callout …/userspace-proxy` (KPNG_CALLOUT_MODE is not "persistent")');
    process.exit(1);
  }
  try {
    fstatSync(3);
    // With fd 3 closed at our start, Node's own event poll takes that number (seen where /proc is).
    let link = '';
    try {
      link = readlinkSync('/proc/self/fd/3');
    } catch {
      // no /proc: fstat is all we can tell
    }
    if (/^anon_inode:/.test(link)) throw new Error('not ours');
  } catch {
    log('file descriptor 3 (the acks) is not open: run it with `kpng-callout --persistent`');
    process.exit(1);
  }
  let options;
  try {
    options = readOptions();
  } catch (err) {
    log(err.message);
    process.exit(1);
  }
  const proxy = new UserspaceProxy(options);
  const table = new ServiceTable((msg) => log(msg));
  const planner = new Planner();
  log(`started (pid ${process.pid}, node ${process.version}; max connections ${options.maxConnections}, UDP idle timeout ${options.udpIdleTimeoutMs} ms)`);

  let queue = Promise.resolve();
  let exiting = false;
  const exit = (why) => {
    if (exiting) return;
    exiting = true;
    proxy.stop();
    log(`${why}: listeners closed, exiting`);
    // stderr is a pipe (synchronous on Linux): every line is out.
    process.exit(0);
  };
  let told = new Set();
  const frames = new FrameReader((header, lines) => {
    queue = queue.then(async () => {
      if (exiting) return;
      const r = table.apply(header, lines);
      if (!r.ok) {
        log(`frame not applied: ${r.why}`);
        ack(`error ${r.why}`);
        return;
      }
      // What the plan says about the state (an address claimed twice) is told once while it holds, not at every frame.
      const now = new Set();
      const plan = planner.plan(
        table.ordered(),
        (msg) => {
          now.add(msg);
          if (!told.has(msg)) log(msg);
        },
        localAddresses(),
      );
      told = now;
      const failed = await proxy.reconcile(plan);
      if (exiting) return;
      if (failed.length === 0) {
        ack('ok');
        return;
      }
      // Bounded: past the open-file limit every listener fails, at every frame (40,000 at 10,000 Services).
      for (const f of failed.slice(0, MAX_TOLD)) log(`cannot listen on ${f.where} for ${f.label}: ${f.why}`);
      if (failed.length > MAX_TOLD) log(`cannot listen on ${failed.length - MAX_TOLD} more addresses (${failed.length} in all)`);
      const more = failed.length > MAX_ACKED ? `; and ${failed.length - MAX_ACKED} more` : '';
      ack(`error cannot listen on ${failed.slice(0, MAX_ACKED).map((f) => `${f.where}: ${f.why}`).join('; ')}${more}`);
    });
  });
  process.stdin.setEncoding('utf8');
  process.stdin.on('data', (text) => frames.push(text));
  process.stdin.on('end', () => {
    if (frames.end()) log('the input ended inside a frame: that frame is ignored');
    queue = queue.then(() => exit('end of input'));
  });
  process.stdin.on('error', (err) => exit(`stdin: ${err.code ?? err.message}`));
  process.on('SIGTERM', () => exit('SIGTERM'));
  process.on('SIGINT', () => exit('SIGINT'));
  process.on('SIGUSR2', () => log(proxy.stats()));
}
