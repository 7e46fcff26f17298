// service-proxy-nft: the fast planner of a full state, per run (node
// service-proxy-nft-full.mjs STATE OLDUDP CTFILE RCFILE 4>PIPE). It writes
// the same table as jq and awk (lib/service-proxy-nft.jq, .awk, -chains.awk:
// full_service(), full_end(), canon(), claim_els()), written again here for
// speed: at 10,000 Services x 10 endpoints they take 2.7 CPU-s and 1.8 s
// before nft may start, this 0.65 s (bench/RESULTS.md). It writes to fd 4 as it
// plans, for `nft -f /dev/fd/0`, which parses a pipe as it arrives; its
// elements inside the table block, a block per set every CHUNK elements, and
// the table's closing brace last: a script cut short (this process gone, or
// a state it leaves to jq and awk) is a syntax error, and nft commits nothing.
// Exit 0: planned (CTFILE holds the conntrack deletions, as awk's); 3: a state
// it is not sure of (see service-proxy-nft-plan.mjs), planned by jq and awk;
// 2: it failed. The same in RCFILE, written before it closes the pipe.
import { closeSync, openSync, readFileSync, write, writeFileSync, writeSync } from 'node:fs';
import { setTimeout as sleep, setImmediate as yieldToWrites } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Fallback, PR, addr, fields, num, plan } from './service-proxy-nft-plan.mjs';

const T = 'inet kpng_service_proxy';
const CHUNK = 4096;
const [statePath = '', oldudpPath = '', ctPath = '', rcPath = ''] = process.argv.slice(2);
// The script goes to file descriptor 4 (the pipe to nft), not to stdout: a
// stray write to stdout (a preloaded module, a warning) cannot get into it.
const OUT = 4;
const here = fileURLToPath(new URL('.', import.meta.url));

// The script goes out by asynchronous writes (libuv's threads), so that the
// planning goes on while a write waits for nft to read: with writeSync the two
// took turns (1.25 s where planning alone takes 0.65, 10,000 Services).
let out = '';
let written = Promise.resolve();
function put(s) {
  out += s;
  if (out.length >= 1 << 16) flush();
}
function flush() {
  if (out === '') return;
  const b = Buffer.from(out);
  out = '';
  written = written.then(() => writeAll(b));
  // (its failure is told by the last `await written`, not as unhandled)
  written.catch(() => {});
}
const writeAsync = promisify(write);
async function writeAll(b) {
  for (let o = 0; o < b.length; ) {
    try {
      o += (await writeAsync(OUT, b, o, b.length - o, null)).bytesWritten;
    } catch (e) {
      // should the pipe be non-blocking after all: again once nft has read
      if (e?.code !== 'EAGAIN') throw e;
      await sleep(2);
    }
  }
}

// The fixed declarations and chains (service-proxy-nft-table.nft), and the type of each set.
const parts = [[], []];
{
  let part = 0;
  for (const l of readFileSync(`${here}service-proxy-nft-table.nft`, 'utf8').split('\n')) {
    if (l === '# chains') part = 1;
    else if (l !== '' && !l.startsWith('#')) parts[part].push(l);
  }
}
/** name -> [its declaration's first line, its type line] */
const TYPE = new Map();
parts[0].forEach((l, i) => {
  const m = /^\t(?:set|map) (\S+) \{$/.exec(l);
  if (m) TYPE.set(m[1], [l, parts[0][i + 1]]);
});
const decl = (m, type) => `\t${/^(svc|noep|np|noepnp|ep|epnp|key|tp)/.test(m) ? 'map' : 'set'} ${m} {\n\t\t${type}\n\t}`;

// Elements, a block per set every CHUNK (in the table block: a block that
// declares a set again adds to it).
const EL = new Map();
function addEl(m, el) {
  let l = EL.get(m);
  if (!l) EL.set(m, (l = []));
  l.push(el);
  if (l.length >= CHUNK) flushEl(m);
}
function flushEl(m) {
  const l = EL.get(m);
  if (!l?.length) return;
  const [head, type] = TYPE.get(m);
  put(`${head}\n${type}\n\t\telements = {\n\t\t\t${l.join(',\n\t\t\t')}\n\t\t}\n\t}\n`);
  EL.set(m, []);
}

// The shared chains (service-proxy-nft-chains.awk).
const GOTO = { x: 'p', m: 'n', y: 'r', w: 'q', z: 's', r: 'p', s: 'q' };
const MASQ = { p: 'x', r: 'y', q: 'w', s: 'z' };
const epmap = (f, k, n) => `${k === 'p' ? 'ep' : k === 'q' ? 'epa' : 'epnp'}${f}_${n}`;
function eptype(f, k) {
  const ip = f === 4 ? 'ip' : 'ip6';
  if (k === 'q') return `typeof ${ip} daddr . numgen random mod 2 : ${ip} daddr`;
  return `typeof ${k === 'p' ? `${ip} daddr . ` : ''}meta l4proto . th dport . numgen random mod 2 : ${ip} daddr . th dport`;
}
function pchain(f, k, n) {
  const ip = f === 4 ? 'ip' : 'ip6';
  let r;
  if (k === 'r' || k === 's') r = `\t\t${ip} daddr set ${ip} daddr . meta l4proto . th dport map @key${f}\n\t\tgoto ${GOTO[k]}${f}_${n}`;
  else if (k in GOTO) r = `\t\tmeta mark set meta mark | 0x00004000\n\t\tgoto ${GOTO[k]}${f}_${n}`;
  else {
    const m = epmap(f, k, n);
    r = [1, 2, 3]
      .map((pr) => `\t\tmeta l4proto ${PR[pr]} dnat ${ip}` +
        (k === 'q'
          ? ` to ${ip} daddr . numgen random mod ${n} map @${m} : ${ip} daddr . meta l4proto . th dport map @tp${f}`
          : ` addr . port to ${k === 'p' ? `${ip} daddr . ` : ''}meta l4proto . th dport . numgen random mod ${n} map @${m}`))
      .join('\n');
  }
  return `\tchain ${k}${f}_${n} {\n${r}\n\t}`;
}
/** The shared chains the state goes through ("f k n"), in the order first needed. */
const pneed = new Map();
function need(f, k, n) {
  pneed.set(`${f} ${k} ${n}`, [f, k, n]);
  if (k in GOTO) need(f, GOTO[k], n);
}

// State across Services (full_service()).
const owner = new Map();
const fseen = new Set();
const hpseen = new Set();
const cipseen = new Map();
const NEWU = new Set();
const NEWR = new Set();
const chains = [];

// canon() of service-proxy-nft-chains.awk for claim c of plan p (Q: the
// Service's QG, QT, QU, CANON): [rewrite, cq, cqnew, cqtp].
function canon(p, Q, c) {
  if (c.k !== 'd' || c.eps === '') return ['', '', false, false];
  const key = p.qk[c.f];
  const t = `${c.f} ${c.pr} ${c.port}`;
  if (key !== '' && c.tp !== '' && !cipseen.has(`${c.f} ${key}`)) {
    const g = `${c.f} ${c.al}`;
    let cqnew = false;
    if (!Q.G.has(g) && !Q.U.has(c.f)) {
      Q.G.add(g);
      Q.U.add(c.f);
      cqnew = true;
    }
    if (Q.G.has(g) && (!Q.T.has(t) || Q.T.get(t) === c.tp)) {
      const cqtp = !Q.T.has(t);
      if (cqtp) Q.T.set(t, c.tp);
      return [c.dest === key ? '' : key, key, cqnew, cqtp];
    }
  }
  const ck = `${t} ${c.eps}`;
  if (Q.C.has(ck)) return [Q.C.get(ck), '', false, false];
  Q.C.set(ck, c.dest);
  return ['', '', false, false];
}

// awk's warn() of a line that names Services (their names are Kubernetes
// names here: shown() only cuts them at 100 bytes)
const shown = (pk) => `"${pk.slice(0, 100)}"`;
const warn = (msg) => process.stderr.write(`service-proxy-nft: ${msg}\n`);
const dupd = new Set();

function fullService(p) {
  if (fseen.has(p.pk)) return warn(`${shown(p.pk)}: skipping a second line for this Service`);
  fseen.add(p.pk);
  addEl('ids', p.pid);
  addEl('gen', `${p.pid} . ${p.phash}`);
  for (const [kind, name, text] of p.aobj) {
    if (kind === 'set') put(`\tset ${name} ${text}\n`);
    else chains.push(`\tchain ${name} {\n${text}\n\t}`);
  }
  const Q = { G: new Set(), T: new Map(), U: new Set(), C: new Map() };
  for (const c of p.claims) {
    const key = `${c.k}${c.f} ${c.key}`;
    if (owner.has(key)) {
      // the first Service in kpng's order keeps it; a change set to it fails (dups)
      if (owner.get(key) !== p.pk) {
        warn(`${shown(p.pk)}: skipping ${c.k === 'd' ? 'destination' : 'NodePort'} ${c.key}: already used by ${shown(owner.get(key))}`);
        if (!dupd.has(key)) {
          dupd.add(key);
          addEl(`${c.k === 'd' ? 'dups' : 'dupsnp'}${c.f}`, c.key);
        }
      }
      continue;
    }
    owner.set(key, p.pk);
    const [rw, cq, cqnew, cqtp] = canon(p, Q, c);
    // cverdict()
    let verd = c.verd;
    if (cq !== '' || rw !== '') {
      let k = cq === '' ? 'r' : rw === '' ? 'q' : 's';
      if (c.mq) k = MASQ[k];
      need(c.f, k, c.n);
      verd = `goto ${k}${c.f}_${c.n}`;
    } else if (c.eps !== '') need(c.f, c.k === 'd' ? (c.mq ? 'x' : 'p') : c.mq ? 'm' : 'n', c.n);
    addEl(c.map, `${c.key} : ${verd}`);
    // claim_els()
    if (rw !== '') addEl(`key${c.f}`, `${c.key} : ${rw}`);
    if (cqtp) addEl(`tp${c.f}`, `${cq} . ${c.pr} . ${c.port} : ${c.tp}`);
    if (cq !== '') {
      if (cqnew) {
        const m = mapOf(c.f, 'q', c.n);
        for (let e = 0; e < c.n; e++) addEl(m, `${cq} . ${e} : ${c.use[e][0]}`);
      }
    } else if (c.eps !== '' && rw === '') {
      const m = mapOf(c.f, c.k === 'd' ? 'p' : 'n', c.n);
      for (let e = 0; e < c.n; e++) addEl(m, `${c.key} . ${e} : ${c.use[e][0]} . ${c.use[e][1]}`);
    }
    udpNew(c.f, c.udp, c.use);
  }
  for (const [f, ep] of p.hps) {
    if (!hpseen.has(`${f} ${ep}`)) {
      hpseen.add(`${f} ${ep}`);
      addEl(`hairpin${f}`, `${ep} . ${ep}`);
    }
  }
  for (const [f, ip] of p.cips) {
    const u = `${f} ${ip}`;
    if (!cipseen.has(u)) {
      cipseen.set(u, 1);
      addEl(`clusterips${f}`, ip);
    } else if (cipseen.get(u) === 1) {
      // held by two Services (not valid in Kubernetes): a change set to either fails
      cipseen.set(u, 2);
      addEl(`cipdups${f}`, ip);
    }
  }
}
function mapOf(f, k, n) {
  const m = epmap(f, k, n);
  if (!TYPE.has(m)) TYPE.set(m, [`\tmap ${m} {`, `\t\t${eptype(f, k)}`]);
  return m;
}

// UDP (udp_new(), read_old_udp(), full_ct() of service-proxy-nft.awk).
function udpNew(f, du, use) {
  if (du === '') return;
  const [d, port] = du.split(' ');
  const z = f === 4 ? '0.0.0.0' : '::';
  if (!use.length) {
    addEl(`udp${f}`, `${d} . ${port} . ${z} . 0`);
    NEWU.add(`${f} ${d} ${port} ${z} 0`);
    return;
  }
  for (const [ep, tp] of use) {
    const u = `${f} ${d} ${port} ${ep} ${tp}`;
    if (!NEWU.has(u)) {
      NEWU.add(u);
      addEl(`udp${f}`, `${d} . ${port} . ${ep} . ${tp}`);
    }
    NEWR.add(`${f} ${d} ${port}`);
  }
}
function conntrackLines() {
  const OLDU = new Map();
  const OLDD = new Set();
  let text = '';
  try {
    text = oldudpPath === '' ? '' : readFileSync(oldudpPath, 'latin1');
  } catch {}
  let f = 0;
  for (const m of text.matchAll(/set udp([46]) |elements = \{([^}]*)\}/g)) {
    if (m[1]) f = +m[1];
    else if (f) {
      for (const el of m[2].split(',')) {
        const q = el.trim().replace(/[ \t\n]+/g, ' ').split(' . ');
        if (q.length !== 4) continue;
        const x = addr(f, q[0]);
        const y = addr(f, q[2]);
        if (x === '' || y === '' || !num(q[1], 1, 65535) || !num(q[3], 0, 65535)) continue;
        OLDU.set(`${f} ${x} ${q[1]} ${y} ${q[3]}`, [f, x, q[1], y, q[3]]);
        OLDD.add(`${f} ${x} ${q[1]}`);
      }
    }
  }
  const lines = [];
  const ct = (f, d, port, ep) => lines.push(`${f} ${d === '0.0.0.0' || d === '::' ? 'any' : d} ${port} ${ep}\n`);
  for (const [f, x, port, y, yport] of OLDU.values()) {
    if (y === (f === 4 ? '0.0.0.0' : '::')) {
      if (NEWR.has(`${f} ${x} ${port}`)) ct(f, x, port, '-');
    } else if (!NEWU.has(`${f} ${x} ${port} ${y} ${yport}`)) ct(f, x, port, y);
  }
  // a destination the table did not have that has endpoints (not on a first run: no table)
  if (text !== '') {
    for (const k of NEWR) {
      if (!OLDD.has(k)) {
        const [f, x, port] = k.split(' ');
        ct(+f, x, port, '-');
      }
    }
  }
  return lines.join('');
}

// jq 1.6 reads at most 256 levels of nesting; a line past that is not read.
function brackets(l) {
  let n = 0;
  for (const c of '{[') for (let i = l.indexOf(c); i >= 0 && n <= 250; i = l.indexOf(c, i + 1)) n++;
  return n;
}
function tooDeep(l) {
  let d = 0;
  let s = false;
  for (let i = 0; i < l.length; i++) {
    const c = l[i];
    if (s) {
      if (c === '\\') i++;
      else if (c === '"') s = false;
    } else if (c === '"') s = true;
    else if (c === '{' || c === '[') {
      if (++d > 250) return true;
    } else if (c === '}' || c === ']') d--;
  }
  return false;
}

async function main() {
  const text = readFileSync(statePath, 'utf8');
  put(`table ${T} {}\ndelete table ${T}\ntable ${T} {\n${parts[0].join('\n')}\n`);
  let n = 0;
  for (const l of text.split('\n')) {
    if (/^[ \t\r]*$/.test(l)) continue;
    if (brackets(l) > 250 && tooDeep(l)) throw new Fallback('nesting');
    let o;
    try {
      o = JSON.parse(l);
    } catch {
      throw new Fallback('not JSON');
    }
    fullService(plan(fields(o)));
    // now and then, let the writes that finished start the next
    if (++n % 32 === 0) await yieldToWrites();
  }
  for (const m of EL.keys()) flushEl(m);
  for (const [f, k, n] of pneed.values()) if (!(k in GOTO)) put(`${decl(epmap(f, k, n), eptype(f, k))}\n`);
  for (const [f, k, n] of pneed.values()) put(`${pchain(f, k, n)}\n`);
  for (const c of chains) put(`${c}\n`);
  put(`${parts[1].join('\n')}\n`);
  const fd = openSync(ctPath, 'w');
  writeSync(fd, conntrackLines());
  closeSync(fd);
  // the closing brace last: until it, the script does not parse
  put('}\n');
  flush();
  await written;
  process.stderr.write(`service-proxy-nft: full state: ${n} Services planned (node)\n`);
}

/** The outcome, in RCFILE (the callout reads it after the pipeline, whose status is nft's). */
function done(code) {
  process.exitCode = code;
  try {
    if (rcPath !== '') writeFileSync(rcPath, `${code}\n`);
  } catch {}
}
try {
  await main();
  done(0);
  // nft may go on now: node's own exit waits for its compiler and GC threads (~50 ms)
  closeSync(OUT);
} catch (e) {
  if (!(e instanceof Fallback)) process.stderr.write(`service-proxy-nft: the fast planner failed: ${e?.message ?? e}\n`);
  done(e instanceof Fallback ? 3 : 2);
}
