// service-proxy-nft: what one Service asks for, for the full-state planner of
// service-proxy-nft-full.mjs. It is lib/service-proxy-nft.jq's record and
// lib/service-proxy-nft.awk's plan() and affinity(), written again in
// JavaScript for speed (10,000 Services: jq and awk take 2.7 CPU-s, this
// 0.65 with reading the JSON; bench/RESULTS.md), for the states it is sure
// of only: every value of the type the state gives it, and nothing awk would
// log but a destination two Services claim or a second line for a Service
// (logged by the planner as awk does). Anything else throws Fallback, and the
// callout plans the state with jq and awk, which log and skip what they
// refuse. It plans what they plan, element for element (a test compares).

/** Thrown for a state this planner leaves to jq and awk. */
export class Fallback extends Error {}
const fallback = (why) => {
  throw new Fallback(why);
};

const M = 4294967296;
/** Protocol numbers of the state, by name. */
export const PR = { 1: 'tcp', 2: 'udp', 3: 'sctp' };

const isObj = (v) => typeof v === 'object' && v !== null && !Array.isArray(v);
// jq's `a // b`: b when a is null, false or missing
const alt = (v, d) => (v === undefined || v === null || v === false ? d : v);
/** A list the state may leave out: an array, else [] for none; another type: Fallback. */
function list(v) {
  const l = alt(v, []);
  if (!Array.isArray(l)) fallback('a list that is not an array');
  return l;
}
function str(v) {
  const s = alt(v, '');
  if (typeof s !== 'string') fallback('a string that is not one');
  return s;
}
/** A number field as jq writes it: a non-negative integer (none: "0"); another value: Fallback. */
function int(v) {
  const n = alt(v, 0);
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > 2147483647 || Object.is(n, -0)) fallback('a number that is not a port');
  return String(n);
}
const flag = (v) => (v === true ? '1' : '0');

/**
 * The fields of service-proxy-nft.jq's record for Service line `i` (a[1] is
 * its TYPE, "S"), 1-based as awk's split().
 */
export function fields(i) {
  if (!isObj(i) || !isObj(i.Service) || 'Previous' in i) fallback('not a Service line');
  const s = i.Service;
  const ip = alt(s.IPs, {});
  if (!isObj(ip)) fallback('IPs');
  const fam = (o, k) => {
    const x = alt(o, null);
    if (x === null) return [];
    if (!isObj(x)) fallback('an IP set');
    return list(x[k]).map((a) => (typeof a === 'string' ? a : fallback('an address')));
  };
  const a = [undefined, 'S', str(s.Namespace), str(s.Name), flag(s.ExternalTrafficToLocal)];
  const sa = s.SessionAffinity;
  if (sa === undefined || sa === null) a.push('0', '0');
  else if (!isObj(sa)) fallback('SessionAffinity');
  else if (sa.ClientIP === undefined || sa.ClientIP === null) a.push('0', '0');
  else if (!isObj(sa.ClientIP)) fallback('ClientIP');
  else a.push('1', int(sa.ClientIP.TimeoutSeconds));
  a.push(flag(ip.Headless));
  for (const l of [
    fam(ip.ClusterIPs, 'V4'),
    fam(ip.ClusterIPs, 'V6'),
    [...fam(ip.ExternalIPs, 'V4'), ...fam(ip.LoadBalancerIPs, 'V4')],
    [...fam(ip.ExternalIPs, 'V6'), ...fam(ip.LoadBalancerIPs, 'V6')],
  ]) a.push(String(l.length), ...l);
  const ports = list(s.Ports);
  a.push(String(ports.length));
  for (const p of ports) {
    if (!isObj(p)) fallback('a port');
    const named = alt(p.TargetPort, 0) === 0 && typeof p.TargetPortName === 'string' && p.TargetPortName !== '';
    a.push(str(p.Name), int(p.Protocol), int(p.Port), int(p.NodePort), named ? 'N' : int(p.TargetPort));
  }
  const eps = list(i.Endpoints);
  a.push(String(eps.length));
  for (const e of eps) {
    if (!isObj(e)) fallback('an endpoint');
    const ips = alt(e.IPs, null);
    if (ips !== null && !isObj(ips)) fallback('endpoint IPs');
    const first = (k) => {
      const x = ips === null ? '' : alt(list(ips[k])[0], '');
      return typeof x === 'string' ? x : fallback('an endpoint address');
    };
    a.push(first('V4'), first('V6'));
    const sc = e.Scopes;
    if (sc === undefined || sc === null) a.push('1', '1');
    else if (!isObj(sc)) fallback('Scopes');
    else a.push(flag(sc.Internal), flag(sc.External));
    const ovs = list(e.PortOverrides);
    a.push(String(ovs.length));
    for (const o of ovs) {
      if (!isObj(o)) fallback('a port override');
      a.push(str(o.Name), int(o.Port));
    }
  }
  return a;
}

export const dnsname = (s) => s.length <= 63 && /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(s);
/** awk's num(): digits, at most 10, within lo..hi. */
export const num = (s, lo, hi) => /^[0-9]+$/.test(s) && s.length <= 10 && +s >= lo && +s <= hi;
/** A dotted quad: four decimal numbers 0..255 without leading zeros (as allip_awk_lib's ip4()). */
export function ip4(s) {
  let parts = 0;
  let digits = 0;
  let v = 0;
  for (let i = 0; i <= s.length; i++) {
    const c = i < s.length ? s.charCodeAt(i) : 46;
    if (c === 46) {
      if (digits === 0 || v > 255 || ++parts > 4) return false;
      digits = v = 0;
    } else if (c >= 48 && c <= 57) {
      // a leading zero only as "0"
      if (digits === 1 && v === 0) return false;
      v = v * 10 + c - 48;
      if (++digits > 3) return false;
    } else return false;
  }
  return parts === 4;
}
/** The IPv6 literal s as inet_ntop writes it (RFC 5952), or "": allip_awk_lib's ip6(). */
export function ip6(s) {
  if (!/^[0-9A-Fa-f:.]+$/.test(s) || s.length > 45) return '';
  const d = s.indexOf('::');
  if (d >= 0 && s.indexOf('::', d + 1) >= 0) return '';
  if (/^:[^:]/.test(s) || /[^:]:$/.test(s)) return '';
  const parts = s.split(':');
  const h = [];
  const t = [];
  let gap = false;
  for (let i = 0; i < parts.length; i++) {
    const g = parts[i];
    if (g === '') {
      gap = true;
      continue;
    }
    const to = gap ? t : h;
    if (i === parts.length - 1 && g.includes('.')) {
      if (!ip4(g)) return '';
      const q = g.split('.').map(Number);
      to.push(((q[0] << 8) + q[1]).toString(16), ((q[2] << 8) + q[3]).toString(16));
      continue;
    }
    if (!/^[0-9A-Fa-f]+$/.test(g) || g.length > 4) return '';
    to.push(g.toLowerCase().replace(/^0+/, '') || '0');
  }
  if (d >= 0 ? h.length + t.length > 7 : h.length + t.length !== 8) return '';
  const w = [...h, ...Array(8 - h.length - t.length).fill('0'), ...t];
  let bb = 0;
  let bl = 0;
  for (let i = 0, cb = 0, cl = 0; i < 8; i++) {
    if (w[i] !== '0') {
      cl = 0;
      continue;
    }
    if (!cl++) cb = i;
    if (cl > bl) {
      bb = cb;
      bl = cl;
    }
  }
  if (bl < 2) bl = 0;
  const hx = (x) => parseInt(x, 16);
  // inet_ntop keeps the IPv4 notation for ::a.b.c.d and ::ffff:a.b.c.d
  if (bl && bb === 0 && (bl === 6 || (bl === 5 && w[5] === 'ffff'))) {
    const v4 = `${hx(w[6]) >> 8}.${hx(w[6]) & 255}.${hx(w[7]) >> 8}.${hx(w[7]) & 255}`;
    return (bl === 6 ? '::' : '::ffff:') + v4;
  }
  if (!bl) return w.join(':');
  return `${w.slice(0, bb).join(':')}::${w.slice(bb + bl).join(':')}`;
}
/** s in canonical form if it is an address of family f (4 or 6), else "". */
export const addr = (f, s) => (f === 4 ? (ip4(s) ? s : '') : ip6(s));

// The hashes of service-proxy-nft.awk (all below 2^32, so exact in a double).
// ipnum(): its groups (split at "." and ":"), decimal in an IPv4 address and
// hexadecimal in an IPv6 one, each plus 1, folded.
export function ipnum(a) {
  const base = a.includes(':') ? 16 : 10;
  let v = 7;
  let g = 0;
  for (let i = 0; i <= a.length; i++) {
    const c = i < a.length ? a.charCodeAt(i) : 46;
    if (c === 46 || c === 58) {
      v = (v * 65599 + g + 1) % M;
      g = 0;
    } else g = g * base + (c <= 57 ? c - 48 : c - 87);
  }
  return v;
}
export const fold = (h, v) => (h * 65599 + v) % M;
const ORD = 'abcdefghijklmnopqrstuvwxyz0123456789-/';
/** awk's strhash() of a Kubernetes name (other names fall back before). */
export function strhash(s, mul) {
  let v = 5381;
  for (let i = 0; i < s.length; i++) v = (v * mul + ORD.indexOf(s[i]) + 1) % M;
  return v;
}

/**
 * plan() of service-proxy-nft.awk for the record a (fields()): the Service's
 * key pk, id pid, tag, hash phash, claims, affinity objects aobj (["set"|"chain",
 * name, text]), cluster IPs cips ([family, address]) and hairpin endpoints hps.
 * A claim: family f, kind k ("d" a destination dest, "n" a NodePort), its
 * key, map, verdict, endpoints (eps "EP . PORT|...", "" with affinity; epsu
 * always; al their addresses; use [EP, PORT] pairs), their one target port
 * tp ("" if several), n of them, mq (masqueraded), udp ("DEST PORT" or "").
 */
export function plan(a) {
  const ns = a[2];
  const nm = a[3];
  const pk = `${ns}/${nm}`;
  // a name Kubernetes would refuse is hashed into its objects' names: jq and awk
  if (!dnsname(ns) || !dnsname(nm)) fallback('a name that is not a DNS label');
  const r = { pk, pid: `${strhash(pk, 31)} . ${strhash(pk, 65599)}`, phash: '', claims: [], aobj: [], cips: [], hps: [] };
  const etp = a[4] === '1';
  const aff = a[5] === '1';
  let tmo = a[6];
  const hl = a[7] === '1';
  if (aff) {
    if (tmo === '0' || tmo === '') tmo = '10800';
    else if (!num(tmo, 1, 86400)) fallback('an affinity timeout');
  }
  let h = fold(fold(fold(7, +etp), +aff), aff ? +tmo : 0);
  let i = 8;
  const L = [];
  for (let c = 1; c <= 4; c++) {
    const cnt = +a[i];
    const f = c % 2 ? 4 : 6;
    const seen = new Set();
    const l = [];
    for (let j = 1; j <= cnt; j++) {
      const x = addr(f, a[i + j]);
      if (x === '') fallback('an address');
      if (seen.has(x)) continue;
      seen.add(x);
      l.push(x);
    }
    L[c] = l;
    i += cnt + 1;
  }
  const qk = { 4: hl || !L[1].length ? '' : L[1][0], 6: hl || !L[2].length ? '' : L[2][0] };
  r.qk = qk;
  if (!hl) {
    for (let c = 1; c <= 2; c++) {
      for (const x of L[c]) {
        r.cips.push([c === 1 ? 4 : 6, x]);
        h = fold(h, ipnum(x));
      }
    }
  }
  const np = +a[i];
  const pi = i + 1;
  i += 5 * np + 1;
  const ne = +a[i];
  const E = [];
  let j = i + 1;
  for (let e = 0; e < ne; e++) {
    const x = { 4: a[j] === '' ? '' : addr(4, a[j]), 6: a[j + 1] === '' ? '' : addr(6, a[j + 1]) };
    if ((a[j] !== '' && x[4] === '') || (a[j + 1] !== '' && x[6] === '')) fallback('an endpoint address');
    const o = +a[j + 4];
    E.push({ ip: x, int: a[j + 2] === '1', ext: a[j + 3] === '1', os: j + 5, on: o });
    j += 5 + 2 * o;
  }
  const pseen = new Set();
  const hpu = new Set();
  const afid = new Map();
  const afn = new Map();
  for (let pj = 0; pj < np; pj++) {
    const b = pi + 5 * pj;
    const pname = a[b];
    const proto = a[b + 1];
    let port = a[b + 2];
    let nport = a[b + 3];
    let tport = a[b + 4];
    const named = tport === 'N';
    if (named) tport = '0';
    if (!(proto in PR) || !num(port, 1, 65535) || (nport !== '0' && !num(nport, 1, 65535)) || (tport !== '0' && !num(tport, 1, 65535))) fallback('a port');
    if (pseen.has(`${proto} ${port}`)) fallback('a port listed twice');
    pseen.add(`${proto} ${port}`);
    port = +port;
    nport = +nport;
    tport = +tport;
    const pr = PR[proto];
    const pn = pr + port;
    h = fold(fold(fold(h, +proto), port), nport);
    for (const f of [4, 6]) {
      const eint = [];
      const eext = [];
      let both = true;
      let built = false;
      for (const e of E) {
        const ep = e.ip[f];
        if (ep === '') continue;
        let tp = tport || port;
        let o = 0;
        for (; o < e.on; o++) {
          if (a[e.os + 2 * o] === pname) {
            if (!num(a[e.os + 2 * o + 1], 1, 65535)) fallback('an endpoint port');
            tp = +a[e.os + 2 * o + 1];
            break;
          }
        }
        // a named target port its overrides do not list: not an endpoint of this port
        if (named && o === e.on && e.on > 0) continue;
        if (e.int) eint.push([ep, tp]);
        if (e.ext) eext.push([ep, tp]);
        if (e.int !== e.ext) both = false;
        h = fold(h, (ipnum(ep) * 262147 + tp * 4 + (e.int ? 2 : 0) + (e.ext ? 1 : 0)) % M);
      }
      let eps = '';
      let al = '';
      let tu = '';
      for (let sc = 1; sc <= 2; sc++) {
        const c = sc === 1 ? (f === 4 ? 1 : 2) : f === 4 ? 3 : 4;
        if (sc === 1 && hl) continue;
        const nd = L[c].length + (sc === 2 && nport ? 1 : 0);
        if (!nd) continue;
        const use = sc === 1 ? eint : eext;
        const n = use.length;
        if (!built || !both) {
          eps = al = '';
          tu = n ? use[0][1] : '';
          for (let e = 0; e < n; e++) {
            const [ep, tp] = use[e];
            eps += `${e ? '|' : ''}${ep} . ${tp}`;
            al += `${e ? '|' : ''}${ep}`;
            if (tp !== tu) tu = '';
            if (!hpu.has(`${f} ${ep}`)) {
              hpu.add(`${f} ${ep}`);
              r.hps.push([f, ep]);
            }
          }
        }
        built = true;
        const masq = sc === 2 && !etp;
        const verd = n && aff ? `goto ${affinity(r, afid, afn, f, sc, pk, pr, pn, masq, tmo, use)}` : '';
        for (let k = 0; k < nd; k++) {
          h = fold(h, sc * 3 + f);
          const cl = { f, eps: aff ? '' : eps, epsu: eps, al, use, tp: tu, n, mq: masq, dest: '', pr, port };
          if (k < L[c].length) {
            const x = L[c][k];
            cl.k = 'd';
            cl.dest = x;
            cl.key = `${x} . ${pr} . ${port}`;
            cl.map = (n ? 'svc' : 'noep') + f;
            cl.verd = n ? verd || `goto ${masq ? 'x' : 'p'}${f}_${n}` : 'goto reject_new';
            cl.udp = proto === '2' ? `${x} ${port}` : '';
            h = fold(h, ipnum(x));
          } else {
            cl.k = 'n';
            cl.key = `${pr} . ${nport}`;
            cl.map = (n ? 'np' : 'noepnp') + f;
            cl.verd = n ? verd || `goto ${!etp ? 'm' : 'n'}${f}_${n}` : 'goto reject_new';
            cl.udp = proto === '2' ? `${f === 4 ? '0.0.0.0' : '::'} ${nport}` : '';
            h = fold(h, nport);
          }
          r.claims.push(cl);
        }
      }
    }
  }
  r.phash = String(h);
  return r;
}

// affinity() of service-proxy-nft.awk: per Service port, family and scope, a
// chain; per endpoint of the Service port, a set and a chain shared by its scopes.
function affinity(r, afid, afn, f, sc, ptag, pr, pn, masq, tmo, use) {
  const base = `${f}${sc === 1 ? 'c' : 'x'}-${ptag}-${pn}`;
  const shared = `${f}-${ptag}-${pn}`;
  const sa = f === 4 ? 'ip saddr' : 'ip6 saddr';
  const da = f === 4 ? 'ip' : 'ip6';
  let body = masq ? '\t\tmeta mark set meta mark | 0x00004000\n' : '';
  const ids = [];
  for (const [ep, tp] of use) {
    const k = `${shared} ${ep} ${tp}`;
    if (!afid.has(k)) {
      const id = (afn.get(shared) ?? 0) + 1;
      afn.set(shared, id);
      afid.set(k, id);
      r.aobj.push(['set', `a${shared}-${id}`, `{ type ipv${f}_addr; flags dynamic,timeout; timeout ${tmo}s; }`]);
      r.aobj.push(['chain', `e${shared}-${id}`, `\t\tupdate @a${shared}-${id} { ${sa} }\n\t\tmeta l4proto ${pr} dnat ${da} to ${f === 4 ? ep : `[${ep}]`}:${tp}`]);
    }
    ids.push(afid.get(k));
    body += `\t\t${sa} @a${shared}-${afid.get(k)} goto e${shared}-${afid.get(k)}\n`;
  }
  for (let i = 0; i < ids.length - 1; i++) body += `\t\tnumgen random mod ${ids.length - i} == 0 goto e${shared}-${ids[i]}\n`;
  body += `\t\tgoto e${shared}-${ids[ids.length - 1]}`;
  r.aobj.push(['chain', `a${base}`, body]);
  return `a${base}`;
}
