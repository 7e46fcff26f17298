/**
 * callouts/service-proxy-nft as a persistent callout (KPNG_CALLOUT_MODE=persistent),
 * fed directly: frames on stdin, acknowledgements on fd 3.
 * - DRY_RUN (needs jq only): a full frame prints exactly the script of a run
 *   with the same state, a change frame that of a run with the same change
 *   set; bad frames are answered "error" and the loop goes on; the end of
 *   input ends it (exit 0); without fd 3 it refuses to start.
 * - In a network namespace the test creates (root, nft): a full frame and a
 *   change frame leave the table a run of the new state in full leaves; the
 *   same change set again fails its guards ("error", table unchanged).
 * Real traffic through `kpng-callout replay --persistent`: service-proxy-replay.test.ts.
 */
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import t from 'tap';
import { missingTools, mustRun, runCommand, type CommandResult } from '../../helpers/command.js';
import { repoPath } from '../../helpers/fixtures.js';
import { tempDir } from '../../helpers/files.js';
import { netnsMissing } from '../../helpers/netns.js';
import { tableShape } from '../../helpers/nft-table.js';
import { PersistentCallout } from '../../helpers/persistent-callout.js';

const SP = repoPath('callouts/service-proxy-nft');

/** A ClusterIP Service line: TCP/UDP `port` -> `target` on `eps` (IPv4, both scopes). */
function svc(name: string, ip: string, proto: 1 | 2, port: number, target: number, eps: string[]): string {
  return JSON.stringify({
    Service: { Namespace: 'default', Name: name, Type: 'ClusterIP', IPs: { ClusterIPs: { V4: [ip] } }, Ports: [{ Protocol: proto, Port: port, TargetPort: target }] },
    Endpoints: eps.map((e) => ({ IPs: { V4: [e] }, Scopes: { Internal: true, External: true } })),
  });
}
const web1 = svc('web', '192.0.2.10', 1, 80, 8080, ['198.51.100.2', '198.51.100.3']);
const web2 = svc('web', '192.0.2.10', 1, 80, 8080, ['198.51.100.3']);
const dns = svc('dns', '192.0.2.11', 2, 53, 5353, ['198.51.100.2']);
const api = svc('api', '192.0.2.12', 1, 443, 8443, ['198.51.100.4']);
// kpng order: default/api, default/dns, default/web
const S1 = `${dns}\n${web1}\n`;
const S2 = `${api}\n${dns}\n${web2}\n`;
const CHANGES = `${api}\n{"Previous":${web1}}\n${web2}\n`;

function run(input: string, env: NodeJS.ProcessEnv, ns?: string): Promise<CommandResult> {
  const [cmd, args] = ns ? ['ip', ['netns', 'exec', ns, SP]] : [SP, []];
  return runCommand(cmd as string, args as string[], { input, env: { ...process.env, ...env }, timeoutMs: 60_000 });
}

const noJq = missingTools(['jq']).length > 0;

t.test('service-proxy-nft persistent, dry run', { skip: noJq ? 'jq is missing (apt-get install jq)' : false }, async (t) => {
  const full = await run(S1, { DRY_RUN: '1' });
  t.equal(full.code, 0, 'a run of S1 exits 0', { stderr: full.stderr });
  const changes = await run(CHANGES, { DRY_RUN: '1', KPNG_CALLOUT_INPUT: 'changes' });
  t.equal(changes.code, 0, 'a run of the change set exits 0', { stderr: changes.stderr });

  const p = new PersistentCallout(SP, undefined, { DRY_RUN: '1' });
  t.equal(await p.frame('full', S1), 'ok', 'a full frame: ok');
  await p.waitStdout(full.stdout.length);
  t.equal(p.stdout, full.stdout, 'it prints the script of a run with the same state');
  p.stdout = '';
  t.equal(await p.frame('changes', CHANGES), 'ok', 'a change frame: ok');
  await p.waitStdout(changes.stdout.length);
  t.equal(p.stdout, changes.stdout, 'it prints the script of a run with the same change set');
  t.match(changes.stdout, /epa?4_1 /, 'the change set touches the map of Services with one endpoint');
  t.match(await p.send('garbage\n\n'), /^error .*Frame header/, 'a frame without a header: error');
  t.match(await p.frame('full', `{"Previous":${web1}}\n`), /^error .*Previous/, 'a Previous line in a full frame: error');
  t.match(await p.frame('changes', `${web2}\n${web2}\n`), /^error .*repeated/, 'a change frame naming a Service twice: error');
  t.match(await p.frame('full', 'not json\n'), /^error /, 'a frame that is not JSON: error');
  t.equal(await p.frame('changes', ''), 'ok', 'an empty change frame: ok (nothing to do)');
  t.equal(await p.frame('full', S2), 'ok', 'the loop goes on after errors: a full frame, ok');
  const end = await p.end();
  t.same(end, { code: 0, signal: null }, 'the end of input: exit 0');

  const noFd3 = await run('', { DRY_RUN: '1', KPNG_CALLOUT_MODE: 'persistent' });
  t.equal(noFd3.code, 1, 'without fd 3: exit 1');
  t.match(noFd3.stderr, /file descriptor 3/, 'saying it needs fd 3');
});

const NS_PREFIX = 'kpspp-';
const why = await netnsMissing(NS_PREFIX, ['ip', 'nft', 'jq'], 'apt-get install iproute2 nftables jq');

t.test('service-proxy-nft persistent, in a network namespace', { skip: why ?? false }, async (t) => {
  const ns = `${NS_PREFIX}${process.pid}-node`;
  await mustRun('ip', ['netns', 'add', ns]);
  t.teardown(() => runCommand('ip', ['netns', 'del', ns]).then(() => undefined));
  // as tables of the same elements and rules compare equal (a change set adds a shared chain it needs)
  const table = async (): Promise<string[]> => tableShape(await mustRun('ip', ['netns', 'exec', ns, 'nft', '-j', 'list', 'table', 'inet', 'kpng_service_proxy']));

  const tmp = tempDir(t, 'kpng-sp-persistent-');
  const p = new PersistentCallout(SP, ns, { TMPDIR: tmp });
  t.teardown(() => p.end().then(() => undefined, () => undefined));
  t.equal(await p.frame('full', S1), 'ok', 'full frame S1: ok');
  const afterFull = await table();
  t.equal(await p.frame('changes', CHANGES), 'ok', 'change frame S1 -> S2: ok');
  const afterChanges = await table();
  t.notSame(afterChanges, afterFull, 'the change set changed the table');
  for (let i = 1; i <= 3; i++) {
    const before = p.stderr.length;
    t.equal(await p.frame('changes', CHANGES), 'error nft failed; rules unchanged', `the same change set again (${i}): its guards fail`);
    // nft echoes the whole one-line transaction per error: an excerpt of it, and nothing kept
    const said = p.stderr.slice(before);
    t.match(said, /Error: /, 'nft\'s error is told');
    t.ok(said.split('\n').every((l) => l.length <= 300), 'in lines of at most 300 characters');
    const errs = readdirSync(tmp, { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('nft.err'));
    t.same(errs.map((f) => statSync(join(tmp, f)).size), [0], 'nft\'s error file emptied after each refusal');
  }
  t.same(await table(), afterChanges, 'the table is unchanged');

  const r = await run(S2, {}, ns);
  t.equal(r.code, 0, 'a run of S2 in full', { stderr: r.stderr });
  t.same(await table(), afterChanges, 'the change frame left the table of S2 in full');
  const r1 = await run(S1, {}, ns);
  t.equal(r1.code, 0, 'a run of S1 in full', { stderr: r1.stderr });
  t.same(await table(), afterFull, 'the full frame left the table of S1 in full');

  t.equal(await p.frame('full', S2), 'ok', 'full frame S2: ok');
  t.same(await table(), afterChanges, 'the table of S2');
  t.same(await p.end(), { code: 0, signal: null }, 'the end of input: exit 0');
});
