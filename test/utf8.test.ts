/**
 * UTF-8 well-formedness (src/utf8.ts): every length accepted; what RFC 3629
 * rejects (overlong forms, surrogates, past U+10FFFF, cut or bad sequences)
 * rejected, at the offset of the sequence that goes wrong.
 */
import t from 'tap';
import { firstInvalidUtf8, isValidUtf8, utf8CodePoint, utf8Length } from '../src/utf8.js';

t.test('well-formed text of every sequence length', async (t) => {
  const b = Buffer.from('a é ✓ 𝄞 €');
  t.equal(isValidUtf8(b), true);
  t.equal(firstInvalidUtf8(b), -1);
  t.equal(isValidUtf8(new Uint8Array(0)), true);
  for (const ch of ['é', '✓', '𝄞', '\u0080', '\u07ff', '\u0800', '\uffff', '\u{10000}', '\u{10ffff}']) {
    const bytes = Buffer.from(ch);
    const cp = utf8CodePoint(bytes, 0, bytes.length);
    t.equal(cp, ch.codePointAt(0), `code point of ${JSON.stringify(ch)}`);
    t.equal(utf8Length(cp), bytes.length, `length of ${JSON.stringify(ch)}`);
  }
});

t.test('what RFC 3629 rejects, found where its sequence starts', async (t) => {
  for (const [bytes, what] of [
    [[0x61, 0xc0, 0xaf], 'overlong /'],
    [[0x61, 0xc1, 0xbf], 'overlong 2-byte'],
    [[0x61, 0xe0, 0x80, 0xaf], 'overlong 3-byte'],
    [[0x61, 0xf0, 0x80, 0x80, 0xaf], 'overlong 4-byte'],
    [[0x61, 0xed, 0xa0, 0x80], 'a surrogate'],
    [[0x61, 0xf4, 0x90, 0x80, 0x80], 'past U+10FFFF'],
    [[0x61, 0xf5, 0x80, 0x80, 0x80], 'a lead byte past U+10FFFF'],
    [[0x61, 0xe2, 0x82], 'cut at the end'],
    [[0x61, 0xe2, 0x28, 0xa1], 'a bad continuation byte'],
    [[0x61, 0x80], 'a lone continuation byte'],
    [[0x61, 0xff], '0xff'],
  ] as const) {
    const b = Uint8Array.from(bytes);
    t.equal(isValidUtf8(b), false, what);
    t.equal(firstInvalidUtf8(b), 1, what);
    t.equal(utf8CodePoint(b, 1, b.length), -1, what);
  }
});

t.test('a range: only its bytes count', async (t) => {
  const b = Buffer.from([0x61, 0xe2, 0x9c, 0x93, 0x62, 0xc3]);
  t.equal(isValidUtf8(b, 0, 5), true);
  t.equal(isValidUtf8(b), false);
  t.equal(firstInvalidUtf8(b, 0, 5), -1);
  t.equal(firstInvalidUtf8(b, 1), 5, 'from a later start: the cut sequence at the end');
  t.equal(isValidUtf8(b, 1, 3), false, 'a sequence cut by `end`');
  t.equal(firstInvalidUtf8(b, 1, 3), 1);
});
