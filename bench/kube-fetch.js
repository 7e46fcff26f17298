// The reference the kube source's first sync is measured against (the bench
// server's `fetch` command, bench/kube-bench-server.js): a separate `node`
// process GETs the three lists the source lists (same selectors,
// concurrently, as the source does) with node:http and reads the bodies whole
// without parsing them.
import { spawn } from 'node:child_process';

// A plain client: the three lists the source makes, concurrently, bodies read whole, not parsed.
const FETCH_CLIENT = `
import http from 'node:http';
const [base, node, selector] = process.argv.slice(1);
const paths = ['/api/v1/services?labelSelector=' + encodeURIComponent(selector), '/apis/discovery.k8s.io/v1/endpointslices', '/api/v1/nodes?fieldSelector=' + encodeURIComponent('metadata.name=' + node)];
const t0 = process.hrtime.bigint();
const sizes = await Promise.all(paths.map((p) => new Promise((res, rej) => {
  http.get(base + p, (r) => {
    let n = 0;
    r.on('data', (b) => (n += b.length));
    r.on('end', () => (r.statusCode === 200 ? res(n) : rej(new Error(p + ': ' + r.statusCode))));
  }).on('error', rej);
})));
console.log(Number(process.hrtime.bigint() - t0) / 1e6, sizes.reduce((a, b) => a + b, 0));`;

/**
 * Times FETCH_CLIENT against `url` for Node `node`, Services by `selector` (one
 * warm-up, then `runs`): { median, min, max, bytes, wallMedian } in ms.
 */
export async function fetchTime(url, runs, node, selector) {
  const once = () =>
    new Promise((res, rej) => {
      const env = { ...process.env };
      delete env.NODE_OPTIONS;
      const t0 = process.hrtime.bigint();
      const child = spawn(process.execPath, ['--input-type=module', '-e', FETCH_CLIENT, url, node, selector], { stdio: ['ignore', 'pipe', 'inherit'], env });
      let out = '';
      child.stdout.on('data', (b) => (out += b));
      child.on('error', rej);
      child.on('close', (code) => {
        if (code !== 0) return rej(new Error(`fetch client exited ${code}`));
        const [ms, bytes] = out.trim().split(' ').map(Number);
        res({ ms, bytes, wall: Number(process.hrtime.bigint() - t0) / 1e6 });
      });
    });
  await once();
  const rs = [];
  for (let k = 0; k < runs; k++) rs.push(await once());
  const mid = (xs) => xs.sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)];
  const ms = rs.map((r) => r.ms);
  return { median: mid(ms.slice()), min: Math.min(...ms), max: Math.max(...ms), bytes: rs[0].bytes, wallMedian: mid(rs.map((r) => r.wall)) };
}
