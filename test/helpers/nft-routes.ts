/**
 * What a service-proxy-nft DRY_RUN script sends each destination to, read
 * from its elements the way the kernel looks them up (svcF, keyF, then the
 * endpoint maps of the chain kind), so tests state where traffic goes, not
 * how the elements are keyed (see callouts/lib/service-proxy-nft-chains.awk).
 */

/**
 * The elements of each map or set of a full state's script, by name: from its
 * `add element` blocks (jq and awk's form) and from the `elements = {` blocks
 * inside the table (the node planner's form, a block per set now and then).
 */
export function scriptElements(script: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  let current: string[] | undefined;
  let end = '';
  let declared: string | undefined;
  const open = (name: string, closer: string) => {
    current = out.get(name) ?? [];
    out.set(name, current);
    end = closer;
  };
  for (const line of script.split('\n')) {
    const head = /^add element inet \S+ (\S+) \{$/.exec(line);
    const decl = /^\t(?:set|map) (\S+) \{$/.exec(line);
    if (head) open(head[1] as string, '}');
    else if (decl) declared = decl[1];
    else if (declared && line === '\t\telements = {') open(declared, '\t\t}');
    else if (current && line === end) current = undefined;
    else if (current) current.push(line.trim().replace(/,$/, ''));
  }
  return out;
}

/** "KEY : VALUE" elements as a map. */
function pairs(els: string[] | undefined): Map<string, string> {
  return new Map((els ?? []).map((e) => e.split(' : ') as [string, string]));
}

/**
 * Per destination of svc4/svc6 ("DEST . proto . port"), its endpoints as "ADDRESS:PORT"
 * in index order, or its verdict when it goes to no shared chain (affinity).
 */
export function routes(script: string): Map<string, string[]> {
  const els = scriptElements(script);
  const maps = new Map<string, Map<string, string>>();
  /** The elements of map `name` as KEY -> VALUE, read once. */
  const map = (name: string): Map<string, string> => {
    if (!maps.has(name)) maps.set(name, pairs(els.get(name)));
    return maps.get(name) as Map<string, string>;
  };
  const out = new Map<string, string[]>();
  for (const f of ['4', '6']) {
    const keys = map(`key${f}`);
    const tports = map(`tp${f}`);
    for (const [dest, verdict] of map(`svc${f}`)) {
      const m = /^goto ([pqrsxywz])\d_(\d+)$/.exec(verdict);
      if (!m) {
        out.set(dest, [verdict]);
        continue;
      }
      const [kind, n] = [m[1] as string, Number(m[2])];
      const [addr, proto, port] = dest.split(' . ') as [string, string, string];
      const key = 'rysz'.includes(kind) ? (keys.get(dest) ?? '?') : addr;
      const eps: string[] = [];
      for (let i = 0; i < n; i++) {
        if ('qwsz'.includes(kind)) {
          eps.push(`${map(`epa${f}_${n}`).get(`${key} . ${i}`) ?? '?'}:${tports.get(`${key} . ${proto} . ${port}`) ?? '?'}`);
        } else {
          eps.push((map(`ep${f}_${n}`).get(`${key} . ${proto} . ${port} . ${i}`) ?? '?').replace(' . ', ':'));
        }
      }
      out.set(dest, eps);
    }
  }
  return out;
}
