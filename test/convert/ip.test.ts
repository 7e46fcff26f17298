/**
 * IP addresses (src/convert/ip.ts): Go's `net.ParseIP` table (net/ip_test.go)
 * and the cases kpng meets in Services, as the family `addIP` files them
 * under; sets sorted and deduplicated as kpng's `IPSet.Add` keeps them.
 */
import t from 'tap';
import { addIP, ipSet } from '../../src/convert/ip.js';
import type { IPSet } from '../../src/model.js';

/** 4 or 6 for the list `addIP` puts `s` in, undefined when it drops it. */
function familyOf(s: string): 4 | 6 | undefined {
  const set: IPSet = {};
  const added = addIP(set, s);
  const f = set.V4 ? 4 : set.V6 ? 6 : undefined;
  if (added !== (f !== undefined)) throw new Error(`addIP(${s}) returned ${added} but filed it under ${f}`);
  return f;
}

t.test("Go's net.ParseIP table (IPv4-mapped IPv6 counts as IPv4, as To4 says)", async (t) => {
  const cases: Array<[string, 4 | 6 | undefined]> = [
    ['127.0.1.2', 4],
    ['127.0.0.1', 4],
    ['::ffff:127.1.2.3', 4],
    ['::ffff:7f01:0203', 4],
    ['0:0:0:0:0000:ffff:127.1.2.3', 4],
    ['0:0:0:0:000000:ffff:127.1.2.3', undefined],
    ['0:0:0:0::ffff:127.1.2.3', 4],
    ['2001:4860:0:2001::68', 6],
    ['2001:4860:0000:2001:0000:0000:0000:0068', 6],
    ['-0.0.0.0', undefined],
    ['0.-1.0.0', undefined],
    ['0.0.-2.0', undefined],
    ['0.0.0.-3', undefined],
    ['127.0.0.256', undefined],
    ['abc', undefined],
    ['123:', undefined],
    ['fe80::1%lo0', undefined],
    ['fe80::1%911', undefined],
    ['', undefined],
    ['a1:a2:a3:a4::b1:b2:b3:b4', undefined], // Go issue 6628: an ellipsis standing for no group
    ['127.001.002.003', undefined],
    ['::ffff:127.001.002.003', undefined],
    ['123.000.000.000', undefined],
    ['1.2..4', undefined],
    ['0123.0.0.1', undefined],
  ];
  for (const [s, f] of cases) t.equal(familyOf(s), f, s);
});

t.test('the forms Services carry', async (t) => {
  const cases: Array<[string, 4 | 6 | undefined]> = [
    ['10.0.0.1', 4], ['0.0.0.0', 4], ['255.255.255.255', 4], ['256.0.0.1', undefined], ['1.2.3', undefined], ['1.2.3.4.5', undefined],
    ['192.0.2.010', undefined], ['01.2.3.4', undefined], ['1.2.3.4 ', undefined], [' 1.2.3.4', undefined], ['None', undefined],
    ['::', 6], ['::1', 6], ['fd00::1', 6], ['FD00::A', 6], ['1:2:3:4:5:6:7:8', 6], ['1:2:3:4:5:6:7::', 6], ['::2:3:4:5:6:7:8', 6],
    ['1:2:3:4:5:6:7:8:9', undefined], ['1::2::3', undefined], ['12345::1', undefined], ['1:2:3:4:5:6:7:8::', undefined], [':1::', undefined],
    ['fe80::1%eth0', undefined], ['::ffff:10.0.0.1', 4], ['::ffff:a00:1', 4], ['::10.0.0.1', 6], ['1:2:3:4:5:6:1.2.3.4', 6],
    ['1:2:3:4:5:6:7:1.2.3.4', undefined], ['::ffff:1.2.3.04', undefined], ['0:0:0:0:0:ffff:c000:201', 4],
    ['::ffff:0:0', 4], ['::fffe:1.2.3.4', 6], ['::ffff:1:2:3', 6], ['0:0:0:0:ffff:0:0:0', 6], ['[::1]', undefined],
    // Mapped addresses in any case; ffff elsewhere is plain IPv6.
    ['::FFFF:10.0.0.1', 4], ['::FfFf:a00:1', 4], ['2001:db8::ffff:1', 6], ['ffff::1', 6], ['::ffff', 6],
  ];
  for (const [s, f] of cases) t.equal(familyOf(s), f, s);
});

t.test('sets: split by family, sorted as strings, deduplicated, the strings kept as written', async (t) => {
  t.same(ipSet(['b::1', '10.0.0.2', 'a::1', '10.0.0.10', 'a::1', 'x']), { V4: ['10.0.0.10', '10.0.0.2'], V6: ['a::1', 'b::1'] });
  t.same(ipSet(['::ffff:10.0.0.1', '10.0.0.1', 'FD00::1']), { V4: ['10.0.0.1', '::ffff:10.0.0.1'], V6: ['FD00::1'] });
  t.same(ipSet(['bogus', 7, null]), {}, 'nothing valid: present and empty');
  t.same(ipSet(undefined), {});
  const set: IPSet = {};
  t.equal(addIP(set, '10.0.0.1'), true);
  t.equal(addIP(set, '10.0.0.1'), true, 'a duplicate is accepted, stored once');
  t.equal(addIP(set, '10.0.0.01'), false);
  t.same(set, { V4: ['10.0.0.1'] });
});
