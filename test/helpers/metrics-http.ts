/**
 * Reading a running bin's --metrics-addr endpoints (loopback only): where it
 * listens (from its log line), /metrics samples, /healthz and /readyz.
 */
import type { BinProcess } from './bin-process.js';
import { pollUntil, WAIT_MS } from './wait.js';

/** The base URL the bin logged (`serving /metrics, /healthz and /readyz on http://...`). */
export async function metricsBase(p: BinProcess): Promise<string> {
  const line = await p.line('stderr', /serving \/metrics, \/healthz and \/readyz on http:\/\/127\.0\.0\.1:\d+/);
  return /(http:\/\/127\.0\.0\.1:\d+)/.exec(line)![1]!;
}

/** Every sample of /metrics, `name{labels}` -> value. */
export async function scrape(base: string): Promise<Map<string, number>> {
  const res = await fetch(`${base}/metrics`);
  const text = await res.text();
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  return out;
}

/** GET a check endpoint: status and body. */
export async function check(base: string, path: '/healthz' | '/readyz'): Promise<{ status: number; body: string }> {
  const res = await fetch(`${base}${path}`);
  return { status: res.status, body: await res.text() };
}

/** Polls until `pred` holds for a scrape (a guard against hangs, not a timing assertion). */
export async function scrapeUntil(base: string, pred: (m: Map<string, number>) => boolean, what: string, ms = WAIT_MS): Promise<Map<string, number>> {
  let last = new Map<string, number>();
  return pollUntil(
    async () => {
      last = await scrape(base);
      return pred(last) && last;
    },
    () => `metrics: ${what}; last: ${JSON.stringify([...last].filter(([k]) => k.startsWith('kpng_')))}`,
    ms,
    25,
  );
}
