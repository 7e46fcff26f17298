#!/usr/bin/env node
// Benchmark of the kpng wire codec (node bench/codec.js, after npm run build).
//
// A full state of 10,000 Services and 100,000 Endpoints (10 per Service), as
// the OpItem frames a kpng server sends on a fresh stream, is decoded:
//   decode     OpItem, then its Service/Endpoint bytes, into model objects
//              (what src/sources/kpng.ts does per message);
//   ingest     decode + apply to a Store + the first snapshot (every line
//              encoded): the time from the last byte received to the state
//              handed to the runner, for a fresh stream.
// Services: a ClusterIP, an empty ExternalIPs, two ports. Endpoints: one IPv4
// address, two port overrides, both scopes; one in ten local.
// Median of --runs runs (default 15) after 3 warm-up runs.
//
// Prints a table and records it in bench/RESULTS.md, in a section of its own
// (replaced on each run; other benchmarks keep theirs). Options:
//   --services 10000 --per-service 10 --runs 15 --no-record
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { flag, machine, recordSection, root, runDate } from './lib.js';

const { marshalEndpoint, marshalOpItem, marshalService, unmarshalEndpoint, unmarshalOpItem, unmarshalService } = await import(
  join(root, 'dist/codec.js')
);
const { Store } = await import(join(root, 'dist/state.js'));

const SECTION = '## Codec: decoding a full kpng state';
const arg = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : def;
};
const SERVICES = arg('services', 10_000);
const PER_SERVICE = arg('per-service', 10);
const RUNS = arg('runs', 15);
const RECORD = !flag('--no-record');

/** The frames a server would send, as grpc-js hands them over (Buffers). */
function frames() {
  const out = [];
  for (let i = 0; i < SERVICES; i++) {
    const ns = `ns-${i % 50}`;
    const name = `svc-${i}`;
    const svc = {
      Namespace: ns,
      Name: name,
      Type: 'ClusterIP',
      IPs: { ClusterIPs: { V4: [`10.96.${i >> 8}.${i & 255}`] }, ExternalIPs: {} },
      Ports: [
        { Name: 'http', Protocol: 1, Port: 80, TargetPort: 8080 },
        { Name: 'https', Protocol: 1, Port: 443, TargetPortName: 'https' },
      ],
    };
    out.push(Buffer.from(marshalOpItem({ Set: { Ref: { Set: 1, Path: `${ns}/${name}` }, Bytes: marshalService(svc) } })));
    for (let j = 0; j < PER_SERVICE; j++) {
      const ep = {
        IPs: { V4: [`10.${128 + (j & 63)}.${i >> 8}.${i & 255}`] },
        Local: j === 0,
        PortOverrides: [
          { Name: 'http', Port: 8080 },
          { Name: 'https', Port: 8443 },
        ],
        Scopes: { Internal: true, External: true },
      };
      const path = `${ns}/${name}/${name}-7d9f8b6c5-${j.toString(36).padStart(5, 'x')}`;
      out.push(Buffer.from(marshalOpItem({ Set: { Ref: { Set: 2, Path: path }, Bytes: marshalEndpoint(ep) } })));
    }
  }
  out.push(Buffer.from(marshalOpItem({ Sync: {} })));
  return out;
}

function decodeAll(bufs, store) {
  let state;
  for (const b of bufs) {
    const op = unmarshalOpItem(b);
    if (op.Set) {
      const ref = op.Set.Ref;
      if (ref.Set === 1) {
        const v = unmarshalService(op.Set.Bytes);
        store?.setService(ref.Path, v);
      } else {
        const v = unmarshalEndpoint(op.Set.Bytes);
        store?.setEndpoint(ref.Path, v);
      }
    } else if (op.Sync && store) state = store.snapshot();
  }
  return state;
}

function measure(f) {
  for (let i = 0; i < 3; i++) f();
  const times = [];
  for (let i = 0; i < RUNS; i++) {
    const t0 = process.hrtime.bigint();
    f();
    times.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  times.sort((a, b) => a - b);
  return { median: times[Math.floor(times.length / 2)], min: times[0], max: times[times.length - 1] };
}

const bufs = frames();
const bytes = bufs.reduce((n, b) => n + b.length, 0);
const values = bufs.length - 1;
const decode = measure(() => decodeAll(bufs));
let lastState;
const ingest = measure(() => {
  lastState = decodeAll(bufs, new Store());
});

const ms = (x) => x.toFixed(1);
const rows = [
  ['decode', decode],
  ['ingest (decode + store + first snapshot)', ingest],
].map(([what, m]) => [what, ms(m.median), `${ms(m.min)}–${ms(m.max)}`, ((values / m.median) * 1000 / 1e6).toFixed(2), ((bytes / 2 ** 20) / (m.median / 1000)).toFixed(0)]);

const table = [
  '| phase | median ms | min–max ms | million values/s | wire MiB/s |',
  '|---|---:|---:|---:|---:|',
  ...rows.map((r) => `| ${r.join(' | ')} |`),
].join('\n');

const pbjs = JSON.parse(readFileSync(join(root, 'node_modules/protobufjs/package.json'), 'utf8')).version;
const section = `${SECTION}

Run on ${runDate()} UTC, ${machine({ memory: false })}; protobufjs ${pbjs}.
\`node bench/codec.js\`: ${SERVICES.toLocaleString('en-US')} Services and ${(SERVICES * PER_SERVICE).toLocaleString('en-US')} Endpoints
(${(bytes / 2 ** 20).toFixed(1)} MiB of OpItem frames; the state printed is ${(lastState.bytes / 2 ** 20).toFixed(1)} MiB of JSON),
median of ${RUNS} runs. "decode" turns every frame into model objects (strict UTF-8, presence kept);
"ingest" adds applying them to a fresh Store and building the first state (every line encoded).

${table}
`;

console.log(table);
if (RECORD) {
  recordSection(SECTION, section);
}
