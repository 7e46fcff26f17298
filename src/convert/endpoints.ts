/**
 * EndpointSlices -> the endpoints one node sees for a Service, as kpng's
 * server (server/pkg/endpoints, store2localdiff) computes them for a node,
 * and the key each endpoint is stored under (endpoint-key.ts).
 *
 * In two steps, so that the Kubernetes API source reads a slice once, when it
 * changes, and keeps only what it needs of it: `compileSlice` reads a slice
 * for one node (what depends neither on the node's zone nor on the Service's
 * traffic policies: each ready endpoint's JSON up to its ports, its key,
 * whether it is on the node, its zone hints), and `nodeEndpoints` picks and
 * finishes a Service's endpoints from its compiled slices, the policies and
 * the zone. `convertEndpoints` does both at once (replay).
 */
import { encodeEndpoint, goString } from '../gojson.js';
import type { IPSet, PortName } from '../model.js';
import { writeEndpointKey } from './endpoint-key.js';
import { ConversionError, Fields } from './fields.js';
import { addIP } from './ip.js';
import { LABEL_SERVICE_NAME, labelsOf, type KubeEndpointSlice, type KubeService } from './kube-objects.js';
import { keyOrder } from './key-order.js';
import { hex64, xxh64Hex } from './xxhash.js';

/** Which node the endpoints are computed for. */
export interface NodeOptions {
  /** Endpoints on this node are `Local`. */
  nodeName: string;
  /**
   * The node's zone (`topology.kubernetes.io/zone` of its Node object);
   * undefined when the node is unknown: then endpoints with zone hints are
   * not sent, as kpng does.
   */
  nodeZone?: string | undefined;
}

/** The traffic policies of a Service that decide an endpoint's scopes. */
export interface Policies {
  internalLocal: boolean;
  externalLocal: boolean;
}

/** The name of the Service an EndpointSlice belongs to (its `kubernetes.io/service-name` label), or undefined. */
export function sliceServiceName(slice: KubeEndpointSlice): string | undefined {
  return labelsOf(slice)?.[LABEL_SERVICE_NAME] || undefined;
}

/** The four policy pairs, shared (a source keeps one per Service). */
const policyPairs: readonly Policies[] = [false, true].flatMap((internalLocal) => [false, true].map((externalLocal) => Object.freeze({ internalLocal, externalLocal })));

/** A Service's traffic policies (read as kpng reads them: only the exact value `Local` counts). */
export function policiesOf(svc: KubeService): Policies {
  const spec = Fields.read(svc.spec, ['spec']);
  const internalLocal = spec?.value('internalTrafficPolicy') === 'Local';
  const externalLocal = spec?.value('externalTrafficPolicy') === 'Local';
  return policyPairs[(internalLocal ? 2 : 0) + (externalLocal ? 1 : 0)]!;
}

/**
 * An endpoint with a field that does not read. Fields are read in kpng's
 * order and only as far as needed, so whether the error counts depends on
 * how far the endpoint gets: `always` (its conditions or hints), `inZone`
 * (its nodeName: read once the zone hints let it through), `inScope`
 * (hostname, addresses: read once it has a scope).
 */
class SliceProblem {
  constructor(
    readonly error: ConversionError,
    readonly counts: 'always' | 'inZone' | 'inScope',
    readonly local: boolean,
  ) {}
}

const scopesJson = ['', '"Scopes":{"Internal":true}}', '"Scopes":{"External":true}}', '"Scopes":{"Internal":true,"External":true}}'];

/**
 * A slice read for one node by `compileSlice`: its ready endpoints, in slice
 * order, as parallel arrays (an object per endpoint took 56 bytes more, a
 * hex key string 32 more: at 100,000 endpoints, 9 MB).
 */
export class CompiledSlice {
  /** `tail(scope)`s made so far. */
  private tails: string[] | undefined;

  constructor(
    /** Fails the whole slice, whatever the zone and policies (its `endpoints` or `ports`). */
    readonly error: ConversionError | undefined,
    /**
     * Each endpoint's JSON up to its PortOverrides (`{"IPs":…,` or just `{`;
     * `tail` completes it: the ports are the slice's, the scopes depend on
     * the policies), or the problem of one that does not read.
     */
    readonly heads: ReadonlyArray<string | SliceProblem>,
    /** Per endpoint, three numbers: its key's hash words (hi, lo; see endpoint-key.ts) and 1 when it is on this node, else 0. */
    readonly words: readonly number[],
    /** Per endpoint, the zones of its hints (undefined: none); undefined when no endpoint has any. */
    readonly zones: ReadonlyArray<readonly string[] | undefined> | undefined,
    /** `"PortOverrides":[…],` of its ports, or empty. */
    readonly ports: string,
  ) {}

  /** Some endpoint has zone hints: what the node sees depends on its zone. */
  get zoned(): boolean {
    return this.zones !== undefined;
  }

  /** The end of its endpoints' JSON with `scope` (1: Internal, 2: External, 3: both): one string per slice and scope. */
  tail(scope: number): string {
    const tails = (this.tails ??= []);
    return (tails[scope] ??= join(this.ports, scopesJson[scope]!));
  }
}

const noEndpoints = new CompiledSlice(undefined, [], [], undefined, '');

/**
 * The strings one after another as one flat string, for a string kept for
 * long: a concatenation is a tree of its pieces (a slice holds the whole
 * string it was cut from), and flattening it in place leaves a wrapper.
 */
const join = (...pieces: string[]): string => pieces.join('');

/**
 * An endpoint's JSON up to its PortOverrides: gojson `encodeEndpoint`'s
 * fields in its order, each followed by a comma.
 */
function headOf(hostname: string | undefined, ips: IPSet | undefined, local: boolean): string {
  // A fresh small array: cheaper than emptying a shared one (\`length = 0\` is a runtime call; measured).
  const p: string[] = ['{'];
  if (hostname) p.push('"Hostname":', goString(hostname), ',');
  if (ips) {
    // gojson `encodeIPSet`, written out: `addIP` let in only addresses
    // node:net's isIP accepts (hex digits, dots, colons), which JSON prints
    // as they are.
    const { V4, V6 } = ips;
    p.push('"IPs":{');
    if (V4 && V4.length > 0) p.push('"V4":["', V4.join('","'), '"]');
    if (V6 && V6.length > 0) p.push(V4 && V4.length > 0 ? ',"V6":["' : '"V6":["', V6.join('","'), '"]');
    p.push('},');
  }
  if (local) p.push('"Local":true,');
  // One flat string at once (see `join`; all of compileSlice allocated 1,040
  // bytes an endpoint with gojson's encoder and a concatenation, 840 so, and
  // keeps 115 instead of 150).
  return p.join('');
}

/** `"PortOverrides":[…],` for a slice's port list, or empty. */
function portsPart(overrides: PortName[]): string {
  if (overrides.length === 0) return '';
  const json = encodeEndpoint({ PortOverrides: overrides });
  return join(json.slice(1, -1), ',');
}

/** One of a slice's `ports`, as a PortOverride. */
function portName(p: Fields): PortName {
  const pn: PortName = {};
  const name = p.string('name');
  if (name) pn.Name = name;
  const port = p.int32('port');
  if (port) pn.Port = port;
  return pn;
}

const sameZones = (a: readonly string[] | undefined, b: readonly string[] | undefined): boolean =>
  a === b || (a !== undefined && b !== undefined && a.length === b.length && a.every((z, i) => z === b[i]));

/**
 * Reads `slice` for the node `nodeName`: kpng's rules that depend on neither
 * the zone nor the policies (not-ready endpoints dropped, a missing ready
 * condition counting as ready; `Local`; PortOverrides from the slice's ports).
 * Never throws `ConversionError`: what does not read is kept, to be reported
 * by `nodeEndpoints` when it counts. `previous` (the same slice before an
 * update) lends the keys of the endpoints it already had: an update hashes
 * only the endpoints it changed.
 */
export function compileSlice(slice: KubeEndpointSlice, nodeName: string, previous?: CompiledSlice): CompiledSlice {
  const s = Fields.orEmpty(slice, []);
  let list: readonly unknown[] | undefined;
  let overrides: PortName[];
  try {
    list = s.list('endpoints');
    if (!list || list.length === 0) return noEndpoints;
    // One PortOverrides list per slice, shared by its endpoints (never mutated).
    overrides = s.list('ports')?.map((v, i) => portName(s.element(v, 'ports', i))) ?? [];
  } catch (err) {
    if (err instanceof ConversionError) return new CompiledSlice(err, [], [], undefined, '');
    throw err;
  }
  const ports = portsPart(overrides);
  // Head -> its index in `previous`.
  let known: Map<string, number> | undefined;
  if (previous) previous.heads.forEach((h, i) => typeof h === 'string' && (known ??= new Map()).set(h, i));
  // Sized for every endpoint, cut to the ready ones at the end (pushes would leave room to spare).
  const n = list.length;
  const heads = new Array<string | SliceProblem>(n);
  const words = new Array<number>(3 * n);
  let zonesOf: Array<readonly string[] | undefined> | undefined;
  let k = 0;
  for (let i = 0; i < n; i++) {
    let counts: SliceProblem['counts'] = 'always';
    let zones: string[] | undefined;
    let local = false;
    try {
      const e = s.element(list[i], 'endpoints', i);
      if (e.object('conditions')?.bool('ready') === false) continue;
      const hints = e.object('hints');
      const z = hints?.list('forZones')?.map((v, j) => hints.element(v, 'forZones', j).string('name') ?? '');
      if (z && z.length > 0) zones = z;
      counts = 'inZone';
      local = nodeName !== '' && e.string('nodeName') === nodeName;
      counts = 'inScope';
      const hostname = e.string('hostname') || undefined;
      const addrs = e.strings('addresses');
      let ips: IPSet | undefined;
      if (addrs && addrs.length > 0) {
        // As kpng: the set is present even when no address parses.
        ips = {};
        for (const a of addrs) addIP(ips, a);
      }
      let head = headOf(hostname, ips, local);
      const old = known?.get(head);
      if (old !== undefined) {
        // The same string (the store's JSON shares it) and the same key.
        head = previous!.heads[old] as string;
        words[3 * k] = previous!.words[3 * old]!;
        words[3 * k + 1] = previous!.words[3 * old + 1]!;
      } else writeEndpointKey(hostname, ips, local, words, 3 * k);
      words[3 * k + 2] = local ? 1 : 0;
      heads[k] = head;
    } catch (err) {
      if (!(err instanceof ConversionError)) throw err;
      heads[k] = new SliceProblem(err, counts, local);
      words[3 * k] = words[3 * k + 1] = words[3 * k + 2] = 0;
      if (counts === 'always') zones = undefined;
    }
    if (zones) (zonesOf ??= new Array<readonly string[] | undefined>(n).fill(undefined))[k] = zones;
    k++;
  }
  if (k < n) {
    heads.length = k;
    words.length = 3 * k;
    if (zonesOf) zonesOf.length = k;
  }
  return new CompiledSlice(undefined, heads, words, zonesOf, ports);
}

/** True when `b` (a new version of `a`) gives every node the same endpoints as `a`. */
export function sameSlice(a: CompiledSlice, b: CompiledSlice): boolean {
  if (a === b) return true;
  const n = a.heads.length;
  if (a.error || b.error || a.ports !== b.ports || n !== b.heads.length) return false;
  for (let i = 0; i < n; i++) {
    const h = a.heads[i]!;
    if (typeof h !== 'string' || h !== b.heads[i] || !sameZones(a.zones?.[i], b.zones?.[i])) return false;
  }
  // Same heads: same keys and locality.
  return true;
}

/** One endpoint a node sees, stored at `key`: its JSON (gojson `encodeEndpoint`) is `head + tail`. */
export interface NodeEndpoint {
  key: string;
  /** Its endpoint's (`CompiledSlice.heads`). */
  head: string;
  /** Its slice's (`CompiledSlice.tail`). */
  tail: string;
}

/**
 * kpng's path order of keys under one Service (state.ts `comparePaths`):
 * keys are ASCII (hex, and `-` for the renamed), without `/`, where it is
 * plain string order.
 */
const byKey = (a: NodeEndpoint, b: NodeEndpoint): number => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0);

/** The scopes of an endpoint: both when local, else those whose policy is not Local (0: none). */
const scopeOf = (local: boolean, p: Policies): number => (local || !p.internalLocal ? 1 : 0) | (local || !p.externalLocal ? 2 : 0);

/** Zone hints let the endpoint through (none, or one for the node's zone; an unknown zone lets no hinted endpoint through). */
const inZone = (zones: readonly string[] | undefined, zone: string | undefined): boolean => zones === undefined || (zone !== undefined && zones.includes(zone));

/** The endpoints a node sees, before ordering: the `n`th is endpoint `at[n]` of slice `from[n]`. */
interface Picked {
  from: CompiledSlice[];
  at: number[];
}

/** Applies the node-local rules of `nodeEndpoints` (not the order or the collapsing) to `slices`. */
function pick(slices: readonly CompiledSlice[], policies: Policies, zone: string | undefined, bad: (index: number, err: ConversionError) => void): Picked {
  const picked: Picked = { from: [], at: [] };
  const chosen: number[] = [];
  slices.forEach((slice, si) => {
    if (slice.error) return bad(si, slice.error);
    const { heads, words, zones } = slice;
    chosen.length = 0;
    for (let i = 0; i < heads.length; i++) {
      if (zones && !inZone(zones[i], zone)) continue;
      const h = heads[i]!;
      if (typeof h !== 'string') {
        if (h.counts === 'inScope' && scopeOf(h.local, policies) === 0) continue;
        return bad(si, h.error);
      }
      if (scopeOf(words[3 * i + 2] === 1, policies) !== 0) chosen.push(i);
    }
    for (const i of chosen) {
      picked.from.push(slice);
      picked.at.push(i);
    }
  });
  return picked;
}

/**
 * The endpoints one node sees for a Service, from its compiled slices (the
 * caller groups slices by their `kubernetes.io/service-name` label; see
 * `sliceServiceName`). Applies kpng's node-local rules: Scopes from the
 * traffic policies (both false: dropped), zone hints, identical endpoints
 * collapsed (even across slices).
 *
 * A slice that does not read is left out and given to `bad` with its index
 * in `slices` (in slice order). Returns the endpoints in path order, each to
 * store at `namespace/name/key`. The key is `endpointKey`; when two
 * different endpoints share it (same hostname, IPs and locality but e.g.
 * different ports), both get `-` and the hash of their full encoding
 * appended.
 */
export function nodeEndpoints(slices: readonly CompiledSlice[], policies: Policies, zone: string | undefined, bad: (index: number, err: ConversionError) => void): NodeEndpoint[] {
  const { from, at } = pick(slices, policies, zone, bad);
  const picked: NodeEndpoint[] = new Array(from.length);
  for (let n = 0; n < from.length; n++) {
    const { heads, words } = from[n]!;
    const i = at[n]!;
    picked[n] = { key: hex64(words[3 * i]!, words[3 * i + 1]!), head: heads[i] as string, tail: from[n]!.tail(scopeOf(words[3 * i + 2] === 1, policies)) };
  }
  // Stable: endpoints with one key keep their slice order.
  picked.sort(byKey);
  const out: NodeEndpoint[] = [];
  let renamed = false;
  for (let i = 0; i < picked.length; ) {
    let j = i + 1;
    const key = picked[i]!.key;
    while (j < picked.length && picked[j]!.key === key) j++;
    if (j === i + 1) {
      out.push(picked[i]!);
    } else {
      // One key for several: identical endpoints (same head and tail) are one, the first;
      // different ones each get the hash of their whole encoding appended.
      const run: NodeEndpoint[] = [];
      for (let k = i; k < j; k++) {
        const e = picked[k]!;
        if (!run.some((r) => r.head === e.head && r.tail === e.tail)) run.push(e);
      }
      if (run.length === 1) out.push(run[0]!);
      else {
        renamed = true;
        for (const e of run) out.push({ key: key + '-' + xxh64Hex(Buffer.from(e.head + e.tail, 'utf8')), head: e.head, tail: e.tail });
      }
    }
    i = j;
  }
  if (renamed) out.sort(byKey);
  return out;
}

/**
 * As `nodeEndpoints`, only each endpoint's JSON (`head + tail`), in the same
 * order: what the Kubernetes API source stores, ordered without the keys'
 * strings (key-order.ts). Two endpoints with one key (rare) take `nodeEndpoints`.
 */
export function nodeEndpointJsons(slices: readonly CompiledSlice[], policies: Policies, zone: string | undefined, bad: (index: number, err: ConversionError) => void): string[] {
  const { from, at } = pick(slices, policies, zone, bad);
  const words = new Array<number>(2 * from.length);
  for (let k = 0; k < from.length; k++) {
    words[2 * k] = from[k]!.words[3 * at[k]!]!;
    words[2 * k + 1] = from[k]!.words[3 * at[k]! + 1]!;
  }
  const order = keyOrder(words);
  // One key for two: collapsed or renamed there (`bad` was told above).
  if (!order) return nodeEndpoints(slices, policies, zone, () => {}).map((e) => e.head + e.tail);
  return order.map((k) => {
    const { heads, words: w } = from[k]!;
    const i = at[k]!;
    return (heads[i] as string) + from[k]!.tail(scopeOf(w[3 * i + 2] === 1, policies));
  });
}

/**
 * `compileSlice` and `nodeEndpoints` at once, for a Service (replay, tests):
 * `[key, endpoint JSON]` pairs in path order; store each at
 * `namespace/name/key` (`Store.setEndpointJson`). Throws `ConversionError`
 * (with `index` = the slice's index in `slices`).
 */
export function convertEndpoints(svc: KubeService, slices: readonly KubeEndpointSlice[], opts: NodeOptions): Array<[key: string, json: string]> {
  const policies = policiesOf(svc);
  const compiled = slices.map((s) => compileSlice(s, opts.nodeName));
  const eps = nodeEndpoints(compiled, policies, opts.nodeZone, (index, err) => {
    err.index = index;
    throw err;
  });
  return eps.map((e) => [e.key, e.head + e.tail]);
}
