/**
 * What an nft script of service-proxy-nft makes of its table, whatever the
 * form it is written in: the declarations of each set and map, the elements of
 * each (as a sorted list; scriptElements() reads both forms the callout
 * writes), and the rules of each chain. Two scripts with the same model make
 * the same table.
 */
import { scriptElements } from './nft-routes.js';

export interface ScriptModel {
  decls: Record<string, string[]>;
  elements: Record<string, string[]>;
  chains: Record<string, string>;
}

export function scriptModel(script: string): ScriptModel {
  const lines = script.split('\n');
  const decls = new Map<string, Set<string>>();
  const declare = (name: string, type: string) => decls.set(name, (decls.get(name) ?? new Set()).add(type));
  const chains: Record<string, string> = {};
  for (let i = 0; i < lines.length; i++) {
    const l = lines[i] ?? '';
    const set = /^\t(?:set|map) (\S+) \{$/.exec(l);
    const oneLine = /^\tset (\S+) (\{.*\})$/.exec(l);
    const chain = /^\tchain (\S+) \{$/.exec(l);
    if (set) declare(set[1]!, (lines[i + 1] ?? '').trim());
    else if (oneLine) declare(oneLine[1]!, oneLine[2]!);
    else if (chain) {
      const body: string[] = [];
      for (i++; i < lines.length && lines[i] !== '\t}'; i++) body.push(lines[i]!);
      if (chain[1]! in chains) throw new Error(`chain ${chain[1]} twice`);
      chains[chain[1]!] = body.join('\n');
    }
  }
  const sorted = <T>(m: Map<string, Iterable<T>>) =>
    Object.fromEntries([...m].sort(([a], [b]) => (a < b ? -1 : 1)).map(([k, v]) => [k, [...new Set(v)].sort()]));
  return { decls: sorted(decls), elements: sorted(scriptElements(script)), chains };
}
