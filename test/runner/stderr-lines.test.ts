/**
 * StderrLines on plain Buffers: chunks split into lines whatever the chunk
 * boundaries, the text and JSON formats, long lines cut at UTF-8 character
 * boundaries, the final partial line, and the bounded tail.
 */
import t from 'tap';
import { jsonLineFormat, StderrLines, textLineFormat } from '../../src/runner/stderr-lines.js';

const b = (s: string): Buffer => Buffer.from(s, 'utf8');
/** Feeds `chunks` and returns everything written, flush included. */
function feed(lines: StderrLines, ...chunks: Buffer[]): string {
  const out: Buffer[] = [];
  for (const c of chunks) {
    const w = lines.push(c);
    if (w) out.push(w);
  }
  const rest = lines.flush();
  if (rest) out.push(rest);
  return Buffer.concat(out).toString('utf8');
}

t.test('text: each line prefixed with its run, whatever the chunks', async (t) => {
  const lines = new StderrLines(textLineFormat(7));
  t.equal(lines.push(b('par')), undefined, 'nothing before a newline');
  t.equal(lines.push(b('tial\nsecond\nthi'))?.toString(), '[run 7] partial\n[run 7] second\n');
  t.equal(lines.push(b('rd')), undefined);
  t.equal(lines.flush()?.toString(), '[run 7] third\n', 'the last line without newline, on flush');
  t.equal(lines.flush(), undefined, 'flushed once');
  t.equal(feed(new StderrLines(textLineFormat(1)), b('\n\n')), '[run 1] \n[run 1] \n', 'empty lines are lines');
});

t.test('text keeps the bytes: CR and invalid UTF-8 pass through', async (t) => {
  const raw = Buffer.from([0x62, 0xff, 0x0d, 0x0a]);
  t.same(new StderrLines(textLineFormat(1)).push(raw), Buffer.concat([b('[run 1] '), Buffer.from([0x62, 0xff, 0x0d]), b('\n')]));
});

t.test('json: one valid object per line, CR dropped, bad bytes replaced', async (t) => {
  const at = Date.parse('2024-05-06T07:08:09.010Z');
  const text = feed(new StderrLines(jsonLineFormat(2, () => at)), b('crlf\r\n'), Buffer.from([0x62, 0xff, 0x0a]), b('quote " end'));
  t.same(
    text.trimEnd().split('\n').map((l) => JSON.parse(l)),
    [
      { time: '2024-05-06T07:08:09.010Z', level: 'info', run: 2, stream: 'stderr', msg: 'crlf' },
      { time: '2024-05-06T07:08:09.010Z', level: 'info', run: 2, stream: 'stderr', msg: 'b\ufffd' },
      { time: '2024-05-06T07:08:09.010Z', level: 'info', run: 2, stream: 'stderr', msg: 'quote " end' },
    ],
  );
});

t.test('a line over 16 KiB is cut into lines, never inside a character', async (t) => {
  for (const ch of ['a', 'ü', '€', '😀']) {
    const long = 'x' + ch.repeat(20_000);
    const raw = Buffer.from(long + '\n');
    // Whole, and in small chunks that never hold a newline (the partial-line path).
    for (const chunks of [[raw], Array.from({ length: Math.ceil(raw.length / 1000) }, (_, i) => raw.subarray(i * 1000, (i + 1) * 1000))]) {
      const out = feed(new StderrLines((line) => Buffer.concat([line, b('\n')])), ...chunks);
      const pieces = out.split('\n').slice(0, -1);
      t.ok(pieces.length >= 2, `${ch}: cut`);
      t.ok(pieces.every((p) => Buffer.byteLength(p) <= 16 * 1024 && !p.includes('\ufffd')), `${ch}: pieces of at most 16 KiB, whole characters`);
      t.equal(pieces.join(''), long, `${ch}: nothing lost`);
    }
  }
});

t.test('the tail: the last 10 lines, 2 KB at most, without CRs', async (t) => {
  const lines = new StderrLines(textLineFormat(1));
  t.equal(lines.tail(), undefined, 'none yet');
  feed(lines, b(Array.from({ length: 15 }, (_, i) => `line ${i + 1}\r\n`).join('')), b('last'));
  t.equal(lines.tail(), [...Array.from({ length: 9 }, (_, i) => `line ${i + 7}`), 'last'].join('\n'));
  const big = new StderrLines(textLineFormat(1));
  feed(big, b(`${'a'.repeat(1500)}\n${'b'.repeat(1500)}\n`));
  t.equal(big.tail(), 'b'.repeat(1500), 'older lines dropped past 2 KB');
  const huge = new StderrLines(textLineFormat(1));
  feed(huge, b(`${'c'.repeat(5000)}\n`));
  t.equal(huge.tail(), '…' + 'c'.repeat(2048), 'one huge line keeps its end');
});

t.test('formats with a label asked for each line (a persistent callout: the newest frame)', async (t) => {
  let frame = 1;
  const text = textLineFormat(() => `frame ${frame}`);
  const json = jsonLineFormat(() => ({ frame }), () => 0);
  t.equal(text(Buffer.from('a')).toString(), '[frame 1] a\n');
  frame = 2;
  t.equal(text(Buffer.from('b')).toString(), '[frame 2] b\n');
  t.same(JSON.parse(json(Buffer.from('c')).toString()), { time: '1970-01-01T00:00:00.000Z', level: 'info', frame: 2, stream: 'stderr', msg: 'c' });
});
