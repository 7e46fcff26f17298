# service-proxy-nft: the planner's change sets (see service-proxy-nft.awk
# for the rest of the planning, which this uses): only the changed
# Services' elements and affinity chains, in one transaction guarded by the
# gen, ids and dups sets, and the maps themselves: a destination goes into
# svcF (npF) with `create` and is checked absent from noepF (noepnpF) after
# the additions, and the other way round, so a destination another Service
# holds fails the transaction (the runner then sends a full state, which
# decides as a full state does: the first in kpng order). Sets `bad` (and
# writes nothing) when the lines repeat a Service or are out of order, or
# when two of its Services hold one cluster IP (a guard cannot see that: each
# creates the same element).

# ---- change set: only the changed Services, guarded ----
function app(A, k, v) { if (k in A) A[k] = A[k] ", " v; else A[k] = v }
# The map a destination must not also be in (a Service's destination has
# endpoints or it has none, never both).
function othermap(m) { return m ~ /^svc/ ? "noep" substr(m, 4) : m ~ /^noepnp/ ? "np" substr(m, 7) : m ~ /^noep/ ? "svc" substr(m, 5) : "noepnp" substr(m, 3) }
# Whether the kernel holds chain `name` of our table (a read, so DRY_RUN asks
# too: its script is the one a real run would apply; no nft: it has none).
# One `nft list chains` per change set (no rules, no set elements: `nft list chain`
# loads every element of the table, about 1 s at 10,000 Services, per call).
function have_chain(name,   cmd, l, intable) {
	if (!chains_read) {
		chains_read = 1; delete HAVECH
		cmd = "nft list chains " substr(T, 1, index(T, " ") - 1) " 2>/dev/null </dev/null"
		while ((cmd | getline l) > 0) {
			if (l == "table " T " {") intable = 1
			else if (l == "}") intable = 0
			else if (intable && l ~ /^\tchain [^ ]+ \{$/) { sub(/^\tchain /, "", l); sub(/ \{$/, "", l); HAVECH[l] = 1 }
		}
		close(cmd)
	}
	return name in HAVECH
}
# Whether the table lacks shared chain k (f, kind, N; p: k split).
function lacks(k, p) { return !(k in PPN) && !have_chain(p[2] p[1] "_" p[3]) }
function changes(   i, n, a, k, t, c, e, eps, f, m, w, p, z, du, op, kk, same, ng2, G2, cn, d, dmax, NEWCH) {
	ng2 = 0; chains_read = 0
	for (i = 1; i <= nrec; i++) {
		split(rec[i], a, "\t")
		t = a[1]; k = a[2] "/" a[3]
		if (t == "S" && i > 1 && PT[i - 1] == "P" && PK[i - 1] == k) { PT[i] = t; PK[i] = k; continue }
		if (k in KSEEN) { bad = "change set lines repeated or out of order"; return }
		KSEEN[k] = 1; PT[i] = t; PK[i] = k
	}
	# first everything that goes (Previous lines), then what comes
	for (op = 1; op <= 2; op++) for (i = 1; i <= nrec; i++) {
		if ((op == 1) != (PT[i] == "P")) continue
		delete pneed
		if (!plan(rec[i], op == 2)) continue
		if (op == 1) {
			G1[++ng1] = "delete element " T " gen { " pid " . " phash " }"
			if (!(i < nrec && PT[i + 1] == "S" && PK[i + 1] == PK[i])) G1[++ng1] = "delete element " T " ids { " pid " }"
			PREV[pk] = 1
		} else {
			if (!(pk in PREV)) G1[++ng1] = "create element " T " ids { " pid " }"
			G1[++ng1] = "add element " T " gen { " pid " . " phash " }"
		}
		delete same
		for (c = 1; c <= nc; c++) {
			f = cf[c]
			# a destination the Service lists twice (a cluster IP also among its
			# external IPs): its first claim only, as in a full state
			kk = f SUBSEP ck[c] SUBSEP ckey[c]
			if (kk in same) continue
			same[kk] = 1
			# its key and endpoint elements (canon(): as in a full state)
			cn = canon(c)
			n = claim_els(c, cn)
			for (e = 1; e <= n; e++) {
				if (op == 1) app(DEL, CLM[e], CLK[e])
				else app(ADD, CLM[e], CLK[e] " : " CLV[e])
			}
			if (op == 1) {
				G1[++ng1] = "create element " T " " (ck[c] == "d" ? "dups" : "dupsnp") f " { " ckey[c] " }"
				G1[++ng1] = "delete element " T " " (ck[c] == "d" ? "dups" : "dupsnp") f " { " ckey[c] " }"
				app(DEL, cmap[c], ckey[c])
				# (the shared chains it went through, in pneed: the table has them)
				cverdict(c, cn)
			} else {
				app(ADD, cmap[c], ckey[c] " : " cverdict(c, cn))
				G2[++ng2] = "create element " T " " othermap(cmap[c]) " { " ckey[c] " : goto reject_new }"
				G2[++ng2] = "delete element " T " " othermap(cmap[c]) " { " ckey[c] " }"
			}
			if (cudp[c] != "") {
				split(cudp[c], du, " ")
				z = f == 4 ? "0.0.0.0" : "::"
				n = cepsu[c] == "" ? 0 : split(cepsu[c], eps, "|")
				if (!n) { eps[1] = z " . 0"; n = 1 }
				for (e = 1; e <= n; e++) {
					split(eps[e], w, " ")
					kk = f SUBSEP du[1] SUBSEP du[2] SUBSEP w[1] SUBSEP w[3]
					if (op == 1) { CD1[f, du[1], du[2]] = 1; if (!(kk in CU1)) { CU1[kk] = 1; app(DEL, "udp" f, du[1] " . " du[2] " . " w[1] " . " w[3]) } }
					else {
						if (!(kk in CU2)) { CU2[kk] = 1; app(ADD, "udp" f, du[1] " . " du[2] " . " w[1] " . " w[3]) }
						if (w[1] != z) NEWR[f, du[1], du[2]] = 1
					}
				}
			}
		}
		# the hairpin elements of all its endpoints, as a full state adds them
		if (op == 2) for (c = 1; c <= nhp; c++) if (!((HPF[c], HPE[c]) in HPA)) { HPA[HPF[c], HPE[c]] = 1; app(ADD, "hairpin" HPF[c], HPE[c] " . " HPE[c]) }
		# cluster IPs: those of what goes deleted (guarded: one another Service holds too, in
		# cipdupsF, fails the transaction), those of what comes created (one held already fails;
		# one two of them hold: the full state decides which keys by it)
		for (c = 1; c <= ncip; c++) {
			kk = cipf[c] SUBSEP cip[c]
			if (op == 1) {
				if (kk in CI1) continue
				CI1[kk] = 1
				G1[++ng1] = "create element " T " cipdups" cipf[c] " { " cip[c] " }"
				G1[++ng1] = "delete element " T " cipdups" cipf[c] " { " cip[c] " }"
				app(DEL, "clusterips" cipf[c], cip[c])
			} else if (kk in CI2) { bad = "two Services of the change set hold cluster IP " cip[c]; return }
			else { CI2[kk] = 1; app(ADD, "clusterips" cipf[c], cip[c]) }
		}
		for (c = 1; c <= na; c++) {
			split(aobj[c], p, "\t")
			if (op == 1) { if (p[1] == "set") DS[++nds] = "delete set " T " " p[2]; else if (substr(p[2], 1, 1) == "a") DCa[++ndca] = "delete chain " T " " p[2]; else DCe[++ndce] = "delete chain " T " " p[2] }
			else if (p[1] == "set") AS[++nas] = "add set " T " " p[2] " " p[3]
			else { AC[++nac] = "add chain " T " " p[2]; n = split(substr(aobj[c], length(p[2]) + 8), w, "\n"); for (e = 1; e <= n; e++) { sub(/^\t+/, "", w[e]); AC[++nac] = "add rule " T " " p[2] " " w[e] } }
		}
		# the shared chains it goes through (cverdict(): with those they go to)
		for (k in pneed) if (op == 1) PPN[k] = 1; else PN[k] = 1
	}
	if (!ng1) { if (!dry) warn("change set: nothing to do"); close(ctfile); return }
	out = script
	for (i = 1; i <= ng1; i++) print G1[i] > out
	for (m in DEL) print "delete element " T " " m " { " DEL[m] " }" > out
	for (i = 1; i <= ndca; i++) print DCa[i] > out
	for (i = 1; i <= ndce; i++) print DCe[i] > out
	for (i = 1; i <= nds; i++) print DS[i] > out
	# shared chains the table lacks (a full state declares only those it
	# uses), a chain after those it goes to (hops()); one the table has is
	# left as it is (nft 1.0.6 cannot evaluate a rule on an epF_N that holds
	# elements). One a Previous line went through the table has (PPN): the
	# common change (an endpoint moved) asks nft nothing.
	dmax = -1
	for (k in PN) {
		split(k, p, SUBSEP)
		if (!lacks(k, p)) continue
		d = hops(p[2]); if (d > dmax) dmax = d
		NEWCH[d] = NEWCH[d] pchain(p[1], p[2], p[3], "add") "\n"
	}
	for (d = 0; d <= dmax; d++) printf "%s", NEWCH[d] > out
	for (i = 1; i <= nas; i++) print AS[i] > out
	for (i = 1; i <= nac; i++) print AC[i] > out
	for (m in ADD) {
		if (m ~ /^(svc|noep|np|noepnp|clusterips)/) print "create element " T " " m " { " ADD[m] " }" > out
		else print "add element " T " " m " { " ADD[m] " }" > out
	}
	for (i = 1; i <= ng2; i++) print G2[i] > out
	close(out)
	wrote = 1
	# conntrack: endpoints that went, destinations that had none and now have some
	for (kk in CU1) {
		split(kk, p, SUBSEP)
		z = p[1] == 4 ? "0.0.0.0" : "::"
		if (p[4] == z) { if ((p[1], p[2], p[3]) in NEWR) ct_out(p[1], p[2], p[3], "-") }
		else if (!(kk in CU2)) ct_out(p[1], p[2], p[3], p[4])
	}
	# a destination no Previous line had (new Service, address or port), now with endpoints:
	# its untranslated flows from before go too (kube-proxy: a newly active UDP Service)
	for (kk in NEWR) if (!(kk in CD1)) { split(kk, p, SUBSEP); ct_out(p[1], p[2], p[3], "-") }
	close(ctfile)
	if (!dry) warn("change set: " nrec " line(s) applied")
}
