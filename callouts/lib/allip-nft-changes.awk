# kpng-example-allip-nft: the planner's change sets, and the mapping recorded
# for them between runs (functions; after allip-nft.awk, which calls them).

# UDP flows of an external IP x whose endpoints went from ov to nv (" E1 E2"),
# to delete once applied (as kube-proxy): a client keeping its source port
# would stay on an endpoint that went, or untranslated when x had none. One
# line each in CT, as lib/conntrack.sh reads them: "FAMILY IP any ENDPOINT"
# (all ports; ENDPOINT = IP: flows not translated).
function went(x, ov, nv,   p, q, n, i, keep, f) {
	f = index(x, ":") ? 6 : 4
	if (ov == "") { if (nv != "") CT[++nct] = f " " x " any " x; return }
	n = split(nv, q, " ")
	for (i = 1; i <= n; i++) keep[q[i]] = 1
	n = split(ov, p, " ")
	for (i = 1; i <= n; i++) if (!(p[i] in keep)) CT[++nct] = f " " x " any " p[i]
}
# Writes CT for the shell (clear_udp), which deletes them once applied.
function ct_save(   i) {
	printf "" > ctfile
	if (!dry) for (i = 1; i <= nct; i++) print CT[i] > ctfile
	close(ctfile)
	delete CT
	nct = 0
}

# Whether the space-separated lists a and b hold the same addresses.
function same(a, b,   p, q, na, nb, i, in_a) {
	na = split(a, p, " ")
	nb = split(b, q, " ")
	if (na != nb) return 0
	for (i = 1; i <= na; i++) in_a[p[i]] = 1
	for (i = 1; i <= nb; i++) if (!(q[i] in in_a)) return 0
	return 1
}
# Adds key k to the claimants of (f, x), in kpng order.
function claim(f, x, k,   l, n, i, s, out, put) {
	if (!((f, x) in cl) || cl[f, x] == "") { cl[f, x] = k; return }
	n = split(cl[f, x], l, "\t")
	s = sortkey(k)
	out = ""
	for (i = 1; i <= n; i++) {
		if (!put && s < sortkey(l[i])) { out = out (out == "" ? "" : "\t") k; put = 1 }
		out = out (out == "" ? "" : "\t") l[i]
	}
	if (!put) out = out "\t" k
	cl[f, x] = out
	if (first(out) == k) warn(shown(l[1]) ": skipping external IP " x ": already used by " shown(k))
	else warn(shown(k) ": skipping external IP " x ": already used by " shown(first(out)))
}
function unclaim(f, x, k,   l, n, i, out) {
	n = split(cl[f, x], l, "\t")
	out = ""
	for (i = 1; i <= n; i++) if (l[i] != k) out = out (out == "" ? "" : "\t") l[i]
	cl[f, x] = out
}
function touch(f, x) { if (!((f, x) in aff)) { aff[f, x] = 1; al[++na] = f SUBSEP x } }

# A change set: per changed Service, its old claims (from the mapping, checked
# against its Previous line) go, its new ones come; each external IP they touch
# gets the endpoints of its first claimant, and only those that differ from
# what the table holds get a command.
function changes(   i, n, a, k, t, s, last, nc, ck, ct, c, f, x, xs, j, ov, nv, D, nd, A, nA, H0, out, l) {
	nostate = "no applied state to apply a change set to; a full state is needed"
	if (framed && !valid) return fail(nostate)
	delete pe; delete px; delete ne; delete nx; delete cseen
	nc = 0
	for (i = 1; i <= nrec; i++) {
		n = split(rec[i], a, "\t")
		if (n < 2) return fail("a change set line that is not a Service")
		k = a[2]
		t = a[1]
		if (t == "S" && nc && ck[nc] == k && ct[nc] == "P") ct[nc] = "PS"
		else {
			# any order (claim() keeps claimants in the kpng order); each Service once
			if (k in cseen) return fail("change set lines repeated")
			cseen[k] = 1
			ck[++nc] = k
			ct[nc] = t
		}
		for (f = 4; f <= 6; f += 2) {
			if (!claims(a, n, f, t == "S")) continue
			s = ""
			for (j = 1; j <= cn; j++) s = s " " cx[j]
			if (t == "P") { pe[nc, f] = ce; px[nc, f] = s } else { ne[nc, f] = ce; nx[nc, f] = s }
		}
	}
	if (!framed) {
		load_state(nc, ck)
		if (!valid) return fail(nostate)
	}
	for (c = 1; c <= nc; c++) {
		k = ck[c]
		for (f = 4; f <= 6; f += 2) {
			s = (k, f) in sx ? sx[k, f] : ""
			t = (c, f) in px ? px[c, f] : ""
			if (!same(s, t) || (t != "" && se[k, f] != pe[c, f]))
				return fail("the change set does not match the applied state")
		}
	}
	delete aff
	delete al
	na = 0
	for (c = 1; c <= nc; c++) {
		k = ck[c]
		for (f = 4; f <= 6; f += 2) {
			if (!((k, f) in sx)) continue
			n = split(sx[k, f], xs, " ")
			for (j = 1; j <= n; j++) { unclaim(f, xs[j], k); touch(f, xs[j]) }
			delete sx[k, f]
			delete se[k, f]
		}
	}
	for (c = 1; c <= nc; c++) {
		k = ck[c]
		for (f = 4; f <= 6; f += 2) {
			if (!((c, f) in nx)) continue
			sx[k, f] = nx[c, f]
			se[k, f] = ne[c, f]
			n = split(nx[c, f], xs, " ")
			for (j = 1; j <= n; j++) { claim(f, xs[j], k); touch(f, xs[j]) }
		}
	}
	delete pe; delete px; delete ne; delete nx
	H0 = H
	nd = nA = 0
	for (i = 1; i <= na; i++) {
		split(al[i], a, SUBSEP)
		f = a[1]
		x = a[2]
		ov = (f, x) in kv ? kv[f, x] : ""
		nv = ""
		if (cl[f, x] == "") delete cl[f, x]
		else nv = se[first(cl[f, x]), f]
		if (ov == nv) continue
		went(x, ov, nv)
		if (multi(ov) && multi(nv)) {
			A[++nA] = "flush chain " T " " chain(f, x)
			A[++nA] = "add rule " T " " chain(f, x) " " dnat(f, nv)
		} else {
			if (ov != "" && !multi(ov)) D[++nd] = "delete element " T " dnat" f " { " x " }"
			if (multi(ov)) {
				D[++nd] = "delete element " T " multi" f " { " x " }"
				D[++nd] = "delete chain " T " " chain(f, x)
			}
			if (nv != "" && !multi(nv)) A[++nA] = "create element " T " dnat" f " { " x " : " substr(nv, 2) " }"
			if (multi(nv)) {
				A[++nA] = "create chain " T " " chain(f, x)
				A[++nA] = "add rule " T " " chain(f, x) " " dnat(f, nv)
				A[++nA] = "create element " T " multi" f " { " x " : goto " chain(f, x) " }"
			}
		}
		if (ov != "") { H = (H - hsh(f " " x ov) + M) % M; delete kv[f, x]; count(f, -1) }
		if (nv != "") { H = (H + hsh(f " " x nv)) % M; kv[f, x] = nv; count(f, 1) }
	}
	if (nd + nA == 0) {
		save()
		if (!dry) warn("change set applied: no mapping changed")
		return reply(1)
	}
	D[0] = "delete element " T " gen { " sprintf("%.0f", H0) " }"
	A[0] = "add element " T " gen { " sprintf("%.0f", H) " }"
	out = script_out()
	if (framed && !dry) {
		# one line, one transaction for nft -i (the frame loop sends it)
		l = D[0] "; " A[0]
		for (i = 1; i <= nd; i++) l = l "; " D[i]
		for (i = 1; i <= nA; i++) l = l "; " A[i]
		return applied("change set applied: " (nd + nA) " command(s)", out, l)
	}
	print D[0] "\n" A[0] > out
	for (i = 1; i <= nd; i++) print D[i] > out
	for (i = 1; i <= nA; i++) print A[i] > out
	if (out != "/dev/stdout") close(out)
	applied("change set applied: " (nd + nA) " command(s)", out)
}

# Per run: the mapping in a file, for the next change set. A header (format,
# KPNG_ALLIP_LB_IPS, hash, IPv4 and IPv6 counts), then one line per mapped or
# claimed external IP: family, IP, then each claimant (kpng order) and its
# endpoints. A change set reads and rewrites only the lines it may touch (grep
# -F for its Services and new IPs): reading 20,000 lines in awk takes longer
# than the rest of the run.
function header() {
	return "kpng-allip-nft-state\t2\t" lb "\t" sprintf("%.0f", H) "\t" n4 "\t" n6
}
function save(   fx, p, l, n, j, f) {
	if (statenew == "" || dry) return
	if (!valid) { printf "" > statenew; close(statenew); return }
	print header() > statenew
	close(statenew)
	# the lines this run did not read, as they were (grep exits 1 when none)
	if (kind == "changes" && system("exec grep -v -F -f '" pats "' -- '" statefile "' >>'" statenew "'") > 1) {
		warn("cannot rewrite the recorded state; the next change set will need a full state")
		printf "" > statenew
		close(statenew)
		return
	}
	for (fx in cl) {
		split(fx, p, SUBSEP)
		f = p[1]
		n = split(cl[fx], l, "\t")
		for (j = 1; j <= n; j++) p[2] = p[2] "\t" l[j] "\t" se[l[j], f]
		print f "\t" p[2] >> statenew
	}
	close(statenew)
}
# Loads the header and the lines of the recorded state that name a changed
# Service (ck[1..nc]) or an external IP it claims now.
function load_state(nc, ck,   c, f, j, n, xs, l, h, a, cmd) {
	valid = 0
	if (statefile == "") return
	print "kpng-allip-nft-state\t" > pats
	for (c = 1; c <= nc; c++) {
		print "\t" ck[c] "\t" > pats
		for (f = 4; f <= 6; f += 2) {
			if (!((c, f) in nx)) continue
			n = split(nx[c, f], xs, " ")
			for (j = 1; j <= n; j++) print f "\t" xs[j] "\t" > pats
		}
	}
	close(pats)
	cmd = "exec grep -F -f '" pats "' -- '" statefile "' 2>/dev/null"
	if ((cmd | getline l) > 0) {
		split(l, h, "\t")
		if (h[1] == "kpng-allip-nft-state" && h[2] == 2 && h[3] == lb && h[4] ~ /^[0-9]+$/ && h[5] ~ /^[0-9]+$/ && h[6] ~ /^[0-9]+$/) {
			H = h[4] + 0
			n4 = h[5] + 0
			n6 = h[6] + 0
			valid = 1
			while ((cmd | getline l) > 0) {
				n = split(l, a, "\t")
				# only addresses reach a script, even from this file
				if (a[1] !~ /^[46]$/ || n < 4 || n % 2 || l !~ /^[^\t]*\t[0-9a-f:.]+(\t[^\t]*\t[0-9a-f:. ]+)+$/) { valid = 0; break }
				f = a[1]
				cl[f, a[2]] = a[3]
				kv[f, a[2]] = a[4]
				for (j = 3; j < n; j += 2) {
					if (j > 3) cl[f, a[2]] = cl[f, a[2]] "\t" a[j]
					se[a[j], f] = a[j + 1]
					sx[a[j], f] = sx[a[j], f] " " a[2]
				}
			}
		}
	}
	close(cmd)
}
