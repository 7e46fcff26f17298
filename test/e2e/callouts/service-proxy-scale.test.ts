/**
 * callouts/service-proxy-nft costs that grow with the size of the table or the length
 * of a session (DRY_RUN, jq only; no root):
 * - a persistent callout removes each full frame's element files once the frame is
 *   done, applied or refused (a session with resyncs must not fill its temporary
 *   directory);
 * - a change set that needs shared chains of over 64 endpoints asks nft for the
 *   table's chains once, not once per chain (`nft list chain` loads every element
 *   of the table: about 1 s each at 10,000 Services).
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

function svc(name: string, ip: string, eps: number, nodePort?: number): string {
  return JSON.stringify({
    Service: {
      Namespace: 'default',
      Name: name,
      Type: nodePort ? 'NodePort' : 'ClusterIP',
      IPs: { ClusterIPs: { V4: [ip] } },
      Ports: [{ Protocol: 1, Port: 80, TargetPort: 8080, ...(nodePort ? { NodePort: nodePort } : {}) }],
    },
    Endpoints: Array.from({ length: eps }, (_, i) => ({ IPs: { V4: [`198.51.100.${i + 1}`] }, Scopes: { Internal: true, External: true } })),
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

t.test('a change set asks nft for the chains once', { skip: noJq ? 'jq is missing' : false }, async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'kpspscale-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const log = join(dir, 'nft.log');
  // a stand-in nft: logs its arguments, has no table
  writeFileSync(join(dir, 'nft'), `#!/bin/sh\necho "$*" >>'${log}'\nexit 1\n`);
  chmodSync(join(dir, 'nft'), 0o755);
  writeFileSync(log, '');
  // 65 endpoints, external (NodePort) traffic masqueraded: p4_65, x4_65 is not needed, n4_65, m4_65
  const cs = `${svc('big', '192.0.2.1', 65, 30080)}\n${svc('big2', '192.0.2.2', 66)}\n`;
  const r = await runCommand(SP, [], { input: cs, env: { ...process.env, DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'changes', PATH: `${dir}:${process.env.PATH}` }, timeoutMs: 60_000 });
  t.equal(r.code, 0, 'the change set is planned', { stderr: r.stderr });
  for (const c of ['p4_65', 'n4_65', 'm4_65', 'p4_66']) t.match(r.stdout, new RegExp(`add chain inet kpng_service_proxy ${c}\\n`), `chain ${c} is added`);
  const calls = readFileSync(log, 'utf8').split('\n').filter(Boolean);
  t.ok(calls.length <= 1, `at most one nft call (${calls.length}: ${calls.join('; ')})`);
});
