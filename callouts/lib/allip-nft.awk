# kpng-example-allip-nft: the planner (awk), reading the records of the
# callout's jq program (or of lib/allip-nft-records.awk): the input loop, the
# outcome of a run or frame, and a full state. Change sets and the recorded
# mapping are in allip-nft-changes.awk, which goes after this file; both need
# allip_awk_lib (warn, shown, addr...) in front. It decides everything, on
# checked addresses only, keeps the mapping (per external IP: its claimants in
# kpng order, and what the table maps it to), writes the nft script and runs
# nft. Variables: prog, table, framed, input, dry, lb, script, pats,
# statefile, statenew, ctfile, unapplied (see the callout).

BEGIN {
	FS = "\t"
	M = 4294967296
	T = "inet " table
	valid = 0
	if (!framed) {
		open_frame()
		kind = input
		if (kind == "full") full_start()
	}
}
$1 == "Z" { zseen = 1; exit }
$1 == "E" {
	if (!inframe) reply(0, "an empty line outside a frame")
	else finish()
	next
}
$1 == "F" {
	if (inframe) { if (bad == "") bad = "a frame header inside a frame"; next }
	open_frame()
	if (NF == 3 && ($2 == "full" || $2 == "changes") && $3 ~ /^[0-9]+$/) { kind = $2; seq = $3 }
	else bad = "a frame header without a numeric Seq and an Input of full or changes"
	if (kind == "full") full_start()
	next
}
{
	if (!inframe) { open_frame(); bad = "a frame that does not start with a Frame header" }
	if ($1 == "X") { if (bad == "") bad = "cannot read the state as JSON lines"; next }
	# a full state as it comes, while jq reads on; a change set at its end
	if (kind == "full") full_record()
	else rec[++nrec] = $0
}
END {
	if (framed) exit zseen ? 0 : 1
	if (!zseen && bad == "") bad = "the state was not read to its end"
	finish()
	exit rc
}

function open_frame() { inframe = 1; nrec = 0; delete rec; bad = ""; kind = ""; seq = "" }

function finish() {
	if (bad != "") fail(bad)
	else if (kind == "full") full_end()
	else changes()
	inframe = 0
	delete rec
}

# The outcome: per run, the exit status; persistent, a line for the frame loop
# (see below), which acknowledges the frame.
function reply(ok, why) {
	if (!framed) { rc = ok ? 0 : 1; return }
	gsub(/[^ -~]/, "?", why)
	print (ok ? "ok " kind : "error " why)
	fflush()
}
function fail(why) {
	valid = 0
	warn(why "; nothing changed")
	reply(0, why)
}
function done(msg) {
	if (!dry) warn(msg)
	reply(1)
}

# A hash of one mapping line ("F IP ENDPOINTS"), to sum into the gen element:
# over its groups of digits, each hashed once (a loop per character costs
# more than the rest of the awk work of a full state). The polynomial is
# linear in the groups, so it ends with a product of its halves: else two
# lines trading their endpoints would sum to the same gen (every product
# stays below 2^53, so exact in the doubles of awk).
function hsh(s,   g, n, i, v, x, hi, lo) {
	n = split(s, g, /[ .:]/)
	v = 5381
	for (i = 1; i <= n; i++) {
		x = g[i]
		v = (v * 65599 + (x in hg ? hg[x] : (hg[x] = hgroup(x)))) % M
	}
	hi = int(v / 65536); lo = v % 65536
	return (v * 31 + (hi * lo % 65536) * 40503 + lo * lo) % M
}
function hgroup(x,   v, i, n) {
	n = length(x)
	for (i = 1; i <= n; i++) v = v * 16 + index("0123456789abcdef", substr(x, i, 1))
	return v + n * 1048576
}
function count(f, d) { if (f == 4) n4 += d; else n6 += d }

# kpng order of Service keys: bytes, "/" before any other. As a plain byte
# comparison of a rewritten key: "/" -> \001\001, NUL (\0 from @tsv; awk
# strings hold no NUL) -> \001\002, \001 -> \001\003.
function sortkey(k,   s, out, i, c) {
	if (k in skc) return skc[k]
	s = k; out = ""
	while ((i = index(s, "\\")) > 0) {
		c = substr(s, i + 1, 1)
		out = out skpart(substr(s, 1, i - 1)) (c == "t" ? "\t" : c == "n" ? "\n" : c == "r" ? "\r" : c == "0" ? "\001\002" : skpart(c))
		s = substr(s, i + 2)
	}
	return skc[k] = out skpart(s)
}
function skpart(s,   out, i) {
	if (index(s, "\001")) gsub(/\001/, "\001\003", s)
	out = ""
	while ((i = index(s, "/")) > 0) { out = out substr(s, 1, i - 1) "\001\001"; s = substr(s, i + 1) }
	return out s
}

# The external IPs and local endpoints of family f in record a[1..n] (see
# jqprog): sets xa..xb and ea..eb, their places in a; 0 if either is empty
# (no claim, nothing checked, as in allip_plan).
function lists(a, n, f,   i) {
	if (a[3] !~ /^[0-9]+$/) return 0
	xa = 4; xb = 3 + a[3]; i = xb + 1
	if (a[i] !~ /^[0-9]+$/) return 0
	ea = i + 1; eb = i + a[i]
	if (f == 6) {
		i = eb + 1
		if (a[i] !~ /^[0-9]+$/) return 0
		xa = i + 1; xb = i + a[i]; ea = xb + 1; eb = n
	}
	return xb >= xa && eb >= ea
}
# The claims of family f in record a: the endpoints ce (" E1 E2"), the external
# IPs cx[1..cn] (checked, each once). Logs what it skips if loud.
function claims(a, n, f, loud,   i, k) {
	cn = 0
	ce = ""
	if (!lists(a, n, f)) return 0
	delete seen
	for (i = ea; i <= eb; i++) {
		k = addr(f, a[i])
		if (k == "") { if (loud) warn(shown(a[2]) ": skipping local endpoint " shown(a[i]) ": not a literal IPv" f " address"); continue }
		if (k in seen) continue
		seen[k] = 1
		ce = ce " " k
	}
	delete seen
	for (i = xa; i <= xb; i++) {
		k = addr(f, a[i])
		if (k == "") { if (loud) warn(shown(a[2]) ": skipping external IP " shown(a[i]) ": not a literal IPv" f " address"); continue }
		if (allip_special(f, k)) { if (loud) warn(shown(a[2]) ": skipping external IP " shown(k) ": unspecified, loopback or link-local"); continue }
		if (ce == "" || (k in seen)) continue
		seen[k] = 1
		cx[++cn] = k
	}
	return cn
}
function first(list,   i) { i = index(list, "\t"); return i ? substr(list, 1, i - 1) : list }
function chain(f, x) { if (f == 6) gsub(/:/, "_", x); return "m" f "_" x }
function dnat(f, v,   e, n, i, r) {
	n = split(v, e, " ")
	r = "dnat " (f == 4 ? "ip" : "ip6") " to numgen inc mod " n " map { "
	for (i = 1; i <= n; i++) r = r (i > 1 ? ", " : "") (i - 1) " : " e[i]
	return r " }"
}
function multi(v) { return index(substr(v, 2), " ") > 0 }
# Where a script goes: per run (not dry), the script file; persistent, a file
# per frame, which the frame loop removes once applied (awk may be a frame ahead).
function script_out() {
	if (!framed) return dry ? "/dev/stdout" : script
	return script "." ++nscript
}
# The script is written (out): per run, apply it; persistent, hand it to the
# frame loop, with the hash the gen set must hold afterwards (hex, as nft lists
# it) and, for a short change set, its one-line form (tx) on the next line.
function applied(msg, out, tx,   r) {
	msg = msg "; " n4 " IPv4 and " n6 " IPv6 external IPs mapped"
	ct_save()
	if (framed) {
		if (tx != "" && length(tx) > 16384) { print tx > out; close(out) }
		print "apply " kind " " (tx != "" && length(tx) <= 16384 ? "-" : out) " " sprintf("0x%04x%04x", int(H / 65536), H % 65536) " " msg
		if (tx != "" && length(tx) <= 16384) print tx
		fflush()
		return
	}
	if (!dry) {
		r = system("exec nft -f '" script "' </dev/null")
		if (r != 0) {
			valid = 0
			warn("nft -f failed; rules unchanged")
			return reply(0, "nft -f failed")
		}
	}
	save()
	done(msg)
}

# A full state: the mapping as allip_plan makes it (the first claim of an
# external IP, in input order, wins), and a script replacing the whole table.
# Each record is taken as it arrives (the mapping held so far is dropped: a
# frame that fails now leaves none, and a full state must come next).
function full_start(   fx, mark) {
	# the mapping the kernel holds, when known (a session after a frame that
	# succeeded): what changed gets its UDP flows cleared (see went)
	delete okv
	oknown = framed && valid
	# the shell marks a frame it could not apply: the kernel may not hold kv
	# (getline opens it without a process: -1 when there is none)
	if (oknown && (getline mark < unapplied) >= 0) { close(unapplied); oknown = 0; system("rm -f '" unapplied "'") }
	if (oknown) for (fx in kv) okv[fx] = kv[fx]
	delete cl; delete kv; delete sx; delete se; delete skc; delete CW
	ncw = 0
	delete el; delete ne; delete fseen
	n4 = n6 = H = nk = 0
	valid = 0
	ordered = unique = 1
}
function full_record(   a, n, k, f, x, j, s, m, fx) {
	n = split($0, a, "\t")
	if (a[1] != "S" || n < 2) return
	k = a[2]
	s = sortkey(k)
	if (k in fseen) unique = 0
	else if (nk++ && s <= flast) ordered = 0
	fseen[k] = 1
	flast = s
	for (f = 4; f <= 6; f += 2) {
		if (!claims(a, n, f, 1)) continue
		se[k, f] = ce
		sx[k, f] = ""
		m = multi(ce)
		for (j = 1; j <= cn; j++) {
			x = cx[j]
			fx = f SUBSEP x
			sx[k, f] = sx[k, f] " " x
			if (fx in cl) {
				# told at the end (reorder may give x to another claimant)
				if (shown(first(cl[fx])) != shown(k)) CW[++ncw] = shown(k) ": skipping external IP " x ": already used by " shown(first(cl[fx]))
				cl[fx] = cl[fx] "\t" k
				continue
			}
			cl[fx] = k
			kv[fx] = ce
			if (f == 4) n4++
			else n6++
			H = (H + hsh(f " " x ce)) % M
			# by map: dnatF (m = 0) or multiF (m = 1)
			el[f, m, ++ne[f, m]] = x
		}
	}
}
# A full state out of the kpng order (a hand-written fixture): each external IP
# claimed more than once goes to its first claimant in the kpng order, as
# change sets decide (claim()), which keep its claimants in that order too;
# the elements of the maps are then listed again from the mapping.
function reorder(   fx, l, n, i, j, t, k0, p, f, x, m) {
	for (fx in cl) {
		n = split(cl[fx], l, "\t")
		if (n < 2) continue
		for (i = 2; i <= n; i++) {
			t = l[i]
			for (j = i - 1; j >= 1 && sortkey(t) < sortkey(l[j]); j--) l[j + 1] = l[j]
			l[j + 1] = t
		}
		k0 = first(cl[fx])
		cl[fx] = l[1]
		for (i = 2; i <= n; i++) cl[fx] = cl[fx] "\t" l[i]
		if (l[1] == k0) continue
		split(fx, p, SUBSEP)
		f = p[1]; x = p[2]
		H = (H - hsh(f " " x kv[fx]) + M) % M
		kv[fx] = se[l[1], f]
		H = (H + hsh(f " " x kv[fx])) % M
	}
	delete el
	delete ne
	for (fx in kv) { split(fx, p, SUBSEP); m = multi(kv[fx]); el[p[1], m, ++ne[p[1], m]] = p[2] }
}
function full_end(   f, m, j, x, out, fx, p, l, n) {
	delete fseen
	if (!ordered) {
		reorder()
		ncw = 0
		for (fx in cl) {
			n = split(cl[fx], l, "\t")
			split(fx, p, SUBSEP)
			for (j = 2; j <= n; j++) if (shown(l[j]) != shown(l[1])) CW[++ncw] = shown(l[j]) ": skipping external IP " p[2] ": already used by " shown(l[1])
		}
	}
	for (j = 1; j <= ncw; j++) warn(CW[j])
	delete CW
	ncw = 0
	out = script_out()
	print "table " T " {}" > out
	print "delete table " T > out
	print "table " T " {" > out
	print "\tset gen {\n\t\ttype mark\n\t\telements = { " sprintf("%.0f", H) " }\n\t}" > out
	for (m = 0; m <= 1; m++) for (f = 4; f <= 6; f += 2) {
		print "\tmap " (m ? "multi" : "dnat") f " {\n\t\ttype ipv" f "_addr : " (m ? "verdict" : "ipv" f "_addr") > out
		if (ne[f, m]) {
			print "\t\telements = {" > out
			for (j = 1; j <= ne[f, m]; j++) {
				x = el[f, m, j]
				print "\t\t\t" x " : " (m ? "goto " chain(f, x) : substr(kv[f, x], 2)) "," > out
			}
			print "\t\t}" > out
		}
		print "\t}" > out
	}
	for (f = 4; f <= 6; f += 2) for (j = 1; j <= ne[f, 1]; j++) {
		x = el[f, 1, j]
		print "\tchain " chain(f, x) " {\n\t\t" dnat(f, kv[f, x]) "\n\t}" > out
	}
	delete el
	delete ne
	print "\tchain services {\n\t\tip daddr vmap @multi4\n\t\tip6 daddr vmap @multi6" > out
	print "\t\tdnat ip to ip daddr map @dnat4\n\t\tdnat ip6 to ip6 daddr map @dnat6\n\t}" > out
	print "\tchain prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}" > out
	print "\tchain output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}" > out
	print "}" > out
	if (out != "/dev/stdout") close(out)
	valid = unique
	if (oknown) {
		for (fx in okv) { split(fx, p, SUBSEP); went(p[2], okv[fx], (fx in kv) ? kv[fx] : "") }
		for (fx in kv) if (!(fx in okv)) { split(fx, p, SUBSEP); went(p[2], "", kv[fx]) }
	}
	applied("full state applied", out)
}
