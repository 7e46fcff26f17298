/**
 * The defaults table: its formatting, and that the README's option tables
 * and the help show the same defaults (one source of truth).
 */
import { readFileSync } from 'node:fs';
import t from 'tap';
import { DEFAULTS, formatDuration, formatSize } from '../src/defaults.js';
import { repoPath } from './helpers/fixtures.js';

const readme = readFileSync(repoPath('README.md'), 'utf8');

t.test('durations and sizes print as the help and README write them', async (t) => {
  t.equal(formatDuration(0), '0');
  t.equal(formatDuration(100), '100ms');
  t.equal(formatDuration(1500), '1500ms');
  t.equal(formatDuration(1000), '1s');
  t.equal(formatDuration(60_000), '1m');
  t.equal(formatDuration(90_000), '1m30s');
  t.equal(formatDuration(3_600_000), '1h');
  t.equal(formatDuration(5_400_000), '1h30m');
  t.equal(formatSize(4 * 1024 * 1024), '4MiB');
  t.equal(formatSize(512 * 1024), '512KiB');
  t.equal(formatSize(1000), '1000');
});

t.test("the README's option tables state the defaults of src/defaults.ts", async (t) => {
  /** The README table row of `option`: its default column. */
  const row = (option: string): string | undefined => {
    const line = readme.split('\n').find((l) => l.startsWith(`| \`${option}`));
    return line?.replaceAll('\\|', '/').split('|')[2]?.trim();
  };
  const d = formatDuration;
  t.equal(row('--debounce'), `\`${d(DEFAULTS.debounceMs)}\``);
  t.equal(row('--max-wait'), `\`${d(DEFAULTS.maxWaitMs)}\``);
  t.equal(row('--timeout'), `\`${d(DEFAULTS.timeoutMs)}\``);
  t.match(row('--resync-period'), `\`${d(DEFAULTS.resyncPeriodMs)}\``);
  t.equal(row('--retry-min'), `\`${d(DEFAULTS.retryMinMs)}\`, \`${d(DEFAULTS.retryMaxMs)}\``);
  t.equal(row('--api'), `\`${DEFAULTS.api}\``);
  t.equal(row('--error-delay'), `\`${d(DEFAULTS.errorDelayMs)}\``);
  t.equal(row('--max-msg-size'), `\`${formatSize(DEFAULTS.maxMsgSize)}\``);
  t.match(row('--callout'), DEFAULTS.callout);
  t.match(row('--log-format'), `\`${DEFAULTS.logFormat}\``);
  t.match(readme, `SIGKILL ${d(DEFAULTS.killGraceMs).replace('s', ' s')}`, 'the kill grace');
});
