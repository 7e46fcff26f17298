/**
 * callouts/service-proxy-nft costs that grow with the size of the table or the length
 * of a session (DRY_RUN, jq only; no root):
 * - a persistent callout removes each full frame's element files once the frame is
 *   done, applied or refused (a session with resyncs must not fill its temporary
 *   directory);
 * - a change set that needs shared chains its Previous lines did not go through
 *   asks nft for the table's chains once, not once per chain (`nft list chain`
 *   loads every element of the table: about 1 s each at 10,000 Services), and one
 *   that needs none of those (an endpoint moved) asks nothing.
 */
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t from 'tap';
import { missingTools, runCommand } from '../../helpers/command.js';
import { repoPath } from '../../helpers/fixtures.js';
import { PersistentCallout } from '../../helpers/persistent-callout.js';

const SP = repoPath('callouts/service-proxy-nft');
const noJq = missingTools(['jq']).length > 0;

/** Service `name` with `eps` endpoints, 198.51.100.FROM and on. */
function svc(name: string, ip: string, eps: number, nodePort?: number, from = 1): string {
  return JSON.stringify({
    Service: {
      Namespace: 'default',
      Name: name,
      Type: nodePort ? 'NodePort' : 'ClusterIP',
      IPs: { ClusterIPs: { V4: [ip] } },
      Ports: [{ Protocol: 1, Port: 80, TargetPort: 8080, ...(nodePort ? { NodePort: nodePort } : {}) }],
    },
    Endpoints: Array.from({ length: eps }, (_, i) => ({ IPs: { V4: [`198.51.100.${i + from}`] }, Scopes: { Internal: true, External: true } })),
  });
}

/** Every file under `dir`, relative. */
function files(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((d) => d.isFile())
    .map((d) => join(d.parentPath ?? (d as unknown as { path: string }).path, d.name).slice(dir.length + 1))
    .sort();
}

t.test('a persistent session does not keep the element files of its full frames', { skip: noJq ? 'jq is missing' : false }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'kpspscale-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const p = new PersistentCallout(SP, undefined, { DRY_RUN: '1', TMPDIR: dir });
  t.equal(await p.frame('full', `${svc('a', '192.0.2.1', 2)}\n`), 'ok', 'full frame 1');
  t.equal(await p.frame('full', `${svc('a', '192.0.2.1', 3)}\n`), 'ok', 'full frame 2');
  // the loop removes a frame's files after acknowledging it: one more frame, and they are gone
  t.equal(await p.frame('changes', ''), 'ok', 'an empty change frame');
  const left = files(dir).filter((f) => /\/el\//.test(f));
  t.same(left, [], 'no element file of a finished frame is left');
  t.same(await p.end(), { code: 0, signal: null }, 'exit 0 at the end of input');
});

t.test('a full frame refused for bad input does not leave its element files either', { skip: noJq ? 'jq is missing' : false }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'kpspscale-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const p = new PersistentCallout(SP, undefined, { DRY_RUN: '1', TMPDIR: dir });
  // elements of the first Service are written before the bad line is read
  t.match(await p.frame('full', `${svc('a', '192.0.2.1', 3)}\n{"Service":\n`), /^error /, 'the frame is refused');
  t.equal(await p.frame('full', `${svc('a', '192.0.2.1', 2)}\n`), 'ok', 'a good full frame after it');
  t.equal(await p.frame('changes', ''), 'ok', 'an empty change frame');
  t.same(files(dir).filter((f) => /\/el\//.test(f)), [], 'no element file of a finished frame is left');
  t.same(await p.end(), { code: 0, signal: null }, 'exit 0 at the end of input');
});

t.test('a change set asks nft for the chains once, and only for chains its Previous lines did not go through', { skip: noJq ? 'jq is missing' : false }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'kpspscale-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const log = join(dir, 'nft.log');
  // a stand-in nft: logs its arguments, has no table
  writeFileSync(join(dir, 'nft'), `#!/bin/sh\necho "$*" >>'${log}'\nexit 1\n`);
  chmodSync(join(dir, 'nft'), 0o755);
  /** DRY_RUN of change set `cs`: its script and the nft calls it made. */
  const plan = async (cs: string) => {
    writeFileSync(log, '');
    const r = await runCommand(SP, [], { input: cs, env: { ...process.env, DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'changes', PATH: `${dir}:${process.env.PATH}` }, timeoutMs: 60_000 });
    t.equal(r.code, 0, 'the change set is planned', { stderr: r.stderr });
    return { script: r.stdout, calls: readFileSync(log, 'utf8').split('\n').filter(Boolean) };
  };
  const added = (script: string) => [...script.matchAll(/^add chain inet kpng_service_proxy (\S+)$/gm)].map((m) => m[1]).sort();
  // two new Services of 65 and 66 endpoints, keyed per Service (q); the NodePort's traffic is masqueraded (m, then n)
  const big = svc('big', '192.0.2.1', 65, 30080);
  const grown = await plan(`${big}\n${svc('big2', '192.0.2.2', 66)}\n`);
  t.same(added(grown.script), ['m4_65', 'n4_65', 'q4_65', 'q4_66'], 'the chains they go through, and no other');
  t.ok(grown.calls.length <= 1, `at most one nft call (${grown.calls.length}: ${grown.calls.join('; ')})`);
  const moved = await plan(`{"Previous":${big}}\n${svc('big', '192.0.2.1', 65, 30080, 2)}\n`);
  t.same([added(moved.script), moved.calls], [[], []], 'an endpoint moved: the Previous line went through the same chains; nft is not asked');
  const more = await plan(`{"Previous":${big}}\n${svc('big', '192.0.2.1', 66, 30080)}\n`);
  t.same(added(more.script), ['m4_66', 'n4_66', 'q4_66'], 'one more endpoint: the chains of 66');
  t.equal(more.calls.length, 1, 'asked once');
});
