/** Ports for tests: one held busy, as another program on the node would hold it. */
import { createServer, type AddressInfo } from 'node:net';
import type { Test } from 'tap';

/** A port held by a plain TCP server of this process on `host`, released at `t`'s teardown. */
export async function heldPort(t: Pick<Test, 'teardown'>, host = '127.0.0.1'): Promise<number> {
  const holder = createServer();
  await new Promise<void>((resolve) => holder.listen(0, host, resolve));
  t.teardown(() => new Promise<void>((resolve) => holder.close(() => resolve())));
  return (holder.address() as AddressInfo).port;
}
