/**
 * service-proxy-nft's table in a form that tables holding the same elements
 * and rules compare equal by, whatever the order their objects were made in:
 * a change set adds a shared chain when it first needs one, and never removes
 * one, so a table reached by change sets may hold chains (and their empty
 * endpoint maps) that a full state of the same Services does not declare
 * (callouts/README.md). A shared chain's rules follow from its name.
 */

/** Shared chains (`q4_10`...) and their endpoint maps (`epa4_10`...): by name. */
const SHARED_CHAIN = /^[a-z][46]_[0-9]+$/;
const ENDPOINT_MAP = /^ep(a|np)?[46]_[0-9]+$/;

interface NftObject {
  chain?: { name: string };
  rule?: { chain: string; expr: unknown };
  set?: { name: string; elem?: unknown[] };
  map?: { name: string; elem?: unknown[] };
}

/**
 * `nft -j list table ...` output as sorted lines: each set and map with its
 * elements sorted, each chain with its rules in order; without the shared
 * chains and without endpoint maps that hold no element.
 */
export function tableShape(json: string): string[] {
  const objects = (JSON.parse(json) as { nftables: NftObject[] }).nftables;
  const rules = new Map<string, string[]>();
  for (const o of objects) if (o.rule) rules.set(o.rule.chain, [...(rules.get(o.rule.chain) ?? []), JSON.stringify(o.rule.expr)]);
  const out: string[] = [];
  for (const o of objects) {
    if (o.chain && !SHARED_CHAIN.test(o.chain.name)) out.push(`chain ${o.chain.name} ${JSON.stringify({ ...o.chain, handle: 0 })} ${(rules.get(o.chain.name) ?? []).join(' ')}`);
    const s = o.set ?? o.map;
    if (!s) continue;
    const elements = (s.elem ?? []).map((e) => JSON.stringify(e)).sort();
    if (ENDPOINT_MAP.test(s.name) && elements.length === 0) continue;
    out.push(`${o.set ? 'set' : 'map'} ${s.name} ${JSON.stringify({ ...s, elem: undefined, handle: 0 })} ${elements.join(' ')}`);
  }
  return out.sort();
}

/** The elements part of `nft list map` text (`elements = { ... }`), '' for none: a map the table lacks or an empty one. */
export function mapElements(listing: string | undefined): string {
  const at = listing?.indexOf('elements = {') ?? -1;
  return listing === undefined || at < 0 ? '' : listing.slice(at, listing.indexOf('}', at) + 1);
}
