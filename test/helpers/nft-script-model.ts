/**
 * What an nft script of service-proxy-nft makes of its table, whatever the
 * form it is written in: the declarations of each set and map, the elements of
 * each (as a sorted list), and the rules of each chain. Reads both forms the
 * callout writes: jq and awk's (the table, then an `add element` command per
 * set) and the node planner's (the elements inside the table, a block per set
 * now and then). Two scripts with the same model make the same table.
 */
export interface ScriptModel {
  decls: Record<string, string[]>;
  elements: Record<string, string[]>;
  chains: Record<string, string>;
}

export function scriptModel(script: string): ScriptModel {
  const lines = script.split('\n');
  const decls = new Map<string, Set<string>>();
  const elements = new Map<string, Set<string>>();
  const chains: Record<string, string> = {};
  const add = (m: Map<string, Set<string>>, k: string, v: string) => {
    let s = m.get(k);
    if (!s) m.set(k, (s = new Set()));
    s.add(v);
  };
  const el = (l: string) => l.trim().replace(/,$/, '');
  let i = 0;
  const at = (k: number) => lines[k] ?? '';
  while (i < lines.length) {
    const l = at(i);
    let m = /^add element inet \S+ (\S+) \{$/.exec(l);
    if (m) {
      for (i++; i < lines.length && at(i) !== '}'; i++) add(elements, m[1]!, el(at(i)));
      i++;
      continue;
    }
    m = /^\t(?:set|map) (\S+) \{$/.exec(l);
    if (m) {
      add(decls, m[1]!, at(++i).trim());
      if (at(++i).trim() === 'elements = {') {
        for (i++; i < lines.length && at(i).trim() !== '}'; i++) add(elements, m[1]!, el(at(i)));
        i++;
      }
      if (at(i) !== '\t}') throw new Error(`line ${i + 1}: ${at(i)}: not the end of a set`);
      i++;
      continue;
    }
    m = /^\tset (\S+) (\{.*\})$/.exec(l);
    if (m) {
      add(decls, m[1]!, m[2]!);
      i++;
      continue;
    }
    m = /^\tchain (\S+) \{$/.exec(l);
    if (m) {
      const body: string[] = [];
      for (i++; i < lines.length && at(i) !== '\t}'; i++) body.push(at(i));
      if (m[1]! in chains) throw new Error(`chain ${m[1]} twice`);
      chains[m[1]!] = body.join('\n');
      i++;
      continue;
    }
    i++;
  }
  const obj = (m: Map<string, Set<string>>) => Object.fromEntries([...m].sort(([a], [b]) => (a < b ? -1 : 1)).map(([k, v]) => [k, [...v].sort()]));
  return { decls: obj(decls), elements: obj(elements), chains };
}
