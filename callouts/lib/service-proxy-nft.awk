# service-proxy-nft: the planner's functions (service-proxy-nft-input.awk
# reads the records of service-proxy-nft.jq and calls them). For one state
# it writes the nft script (to the file `script`), and the conntrack
# deletions to make after it is applied (to the file `ctfile`, one line each:
# FAMILY DEST PORT ENDPOINT, DEST "any" for a NodePort, ENDPOINT "-" for all
# entries of that destination). Needs allip_awk_lib (ip4, ip6, addr, warn,
# shown) in front. Globals set by the input loop: input (full|changes), dry,
# script, ctfile, oldudp (full: the kernel's listing of sets udp4/udp6),
# eldir and fpre (full: where the elements go, see add_el); `wrote` is set
# when a script was written.
# Every address that reaches the script is a checked literal in canonical
# form, every number a checked integer, every name a checked Kubernetes
# name (another name is replaced by a hash of it); nothing else from the
# state is ever written.

function dnsname(s) { return length(s) <= 63 && s ~ /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/ }
function num(s, lo, hi) { return s ~ /^[0-9]+$/ && length(s) <= 10 && s + 0 >= lo && s + 0 <= hi }
# A number for an address, for hashing (cached).
function ipnum(a,   g, n, i, v) {
	if (a in IPN) return IPN[a]
	n = split(a, g, /[.:]/)
	v = 7
	for (i = 1; i <= n; i++) v = (v * 65599 + (index(a, ":") ? hexv(g[i]) + 1 : g[i] + 1)) % M
	return IPN[a] = v
}
function hexv(h,   v, i) {
	v = 0
	for (i = 1; i <= length(h); i++) v = v * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1
	return v
}
function fold(h, v) { return (h * 65599 + v) % M }
# Every byte counts: the characters of Kubernetes names (and /) as 1..38,
# any other byte as 64 + its value (the hashes of valid names are those of
# earlier versions, so their table elements stay valid across an upgrade).
function strhash(s, mul,   i, v) {
	if (!ordready) {
		ordready = 1
		for (i = 1; i < 256; i++) ORDH[sprintf("%c", i)] = 64 + i
		for (i = 1; i <= 38; i++) ORDH[substr("abcdefghijklmnopqrstuvwxyz0123456789-/", i, 1)] = i
	}
	v = 5381
	for (i = 1; i <= length(s); i++) v = (v * mul + ORDH[substr(s, i, 1)]) % M
	return v
}

# plan(record): what one Service asks for, independent of every other
# Service. Sets: pk (its key "ns/name", "" if skipped), pid ("H1 . H2"),
# ptag (pk when both are valid Kubernetes names, else "h" and pid's hashes:
# what names its affinity objects),
# phash (a hash of all of it), claims 1..nc (cf family, ck "d"|"n", ckey,
# cmap, cverd, ceps "EP . PORT" joined by "|" (none with affinity), cepsu
# (the same, always), cal (their addresses), ctp (their one target port, or
# ""), cnn (how many), cmq (masqueraded), cudp "DEST PORT" or ""),
# affinity objects 1..na (aset (decl) / achain (name) lines in aobj), and
# its cluster IPs 1..ncip (cipf family, cip address; none when headless).
# (The shared chains a claim goes through are noted by cverdict().)
function plan(line, loud,   a, n, i, j, k, ns, nm, etp, aff, tmo, hl, f, cnt, c, x, np, pt, ne, e, h, pname, proto, port, nport, tport, pi, pj, dests, nd, dk, seen, eint, eext, ni, nx, ov, o, ep, tp, key, sc, list, nl, verd, pn, named, al, tu, both, built) {
	n = split(line, a, "\t")
	pk = ""; nc = 0; na = 0; nhp = 0; phash = 0; delete AFID; delete AFN; delete CANON; delete QG; delete QT; delete QU; delete HPU
	ns = a[2]; nm = a[3]
	pk = ns "/" nm
	pid = sprintf("%.0f . %.0f", strhash(pk, 31), strhash(pk, 65599))
	# a name Kubernetes would refuse (an old or a hand-made state) is never
	# written into the ruleset: its objects are named by its hashes
	ptag = dnsname(ns) && dnsname(nm) ? pk : sprintf("h%.0f-%.0f", strhash(pk, 31), strhash(pk, 65599))
	etp = a[4] == "1"; aff = a[5] == "1"; tmo = a[6]; hl = a[7] == "1"
	if (aff) {
		if (tmo == "0" || tmo == "") tmo = 10800
		else if (!num(tmo, 1, 86400)) { if (loud) warn(shown(pk) ": session affinity timeout " shown(tmo) " is not 1..86400; using 10800"); tmo = 10800 }
	}
	h = fold(fold(fold(7, etp), aff), aff ? tmo + 0 : 0)
	i = 8
	# address lists: C4 C6 X4 X6
	for (c = 1; c <= 4; c++) {
		cnt = a[i]; if (cnt !~ /^[0-9]+$/) return bad_rec(loud)
		f = (c % 2) ? 4 : 6
		nl = 0; delete seen
		for (j = 1; j <= cnt; j++) {
			x = addr(f, a[i + j])
			if (x == "") { if (loud) warn(shown(pk) ": skipping " (c <= 2 ? "cluster" : "external") " IP " shown(a[i + j]) ": not a literal IPv" f " address"); continue }
			if (x in seen) continue
			seen[x] = 1
			L[c, ++nl] = x
		}
		LN[c] = nl
		i += cnt + 1
	}
	# its cluster IPs (clusteripsF: new connections to a port it does not serve are rejected);
	# the first of each family keys its endpoints (canon())
	ncip = 0
	QK[4] = hl || !LN[1] ? "" : L[1, 1]; QK[6] = hl || !LN[2] ? "" : L[2, 1]
	if (!hl) for (c = 1; c <= 2; c++) for (j = 1; j <= LN[c]; j++) { cipf[++ncip] = c == 1 ? 4 : 6; cip[ncip] = L[c, j]; h = fold(h, ipnum(L[c, j])) }
	np = a[i]; if (np !~ /^[0-9]+$/) return bad_rec(loud)
	pi = i + 1
	i += 5 * np + 1
	ne = a[i]; if (ne !~ /^[0-9]+$/) return bad_rec(loud)
	# endpoints: E4[e], E6[e], EI[e], EX[e], overrides
	j = i + 1
	for (e = 1; e <= ne; e++) {
		E4[e] = a[j] == "" ? "" : addr(4, a[j])
		E6[e] = a[j + 1] == "" ? "" : addr(6, a[j + 1])
		if (loud && a[j] != "" && E4[e] == "") warn(shown(pk) ": skipping endpoint address " shown(a[j]) ": not a literal IPv4 address")
		if (loud && a[j + 1] != "" && E6[e] == "") warn(shown(pk) ": skipping endpoint address " shown(a[j + 1]) ": not a literal IPv6 address")
		EI[e] = a[j + 2] == "1"; EX[e] = a[j + 3] == "1"
		o = a[j + 4]; if (o !~ /^[0-9]+$/) return bad_rec(loud)
		OS[e] = j + 5; ON[e] = o
		j += 5 + 2 * o
	}
	delete pseen
	for (pj = 0; pj < np; pj++) {
		pname = a[pi + 5 * pj]; proto = a[pi + 5 * pj + 1]; port = a[pi + 5 * pj + 2]
		nport = a[pi + 5 * pj + 3]; tport = a[pi + 5 * pj + 4]
		# N: no TargetPort, the target is named (TargetPortName)
		named = tport == "N"; if (named) tport = "0"
		if (!(proto in PR)) { if (loud) warn(shown(pk) ": skipping port " shown(port) ": protocol " shown(proto) " is not TCP, UDP or SCTP"); continue }
		if (!num(port, 1, 65535)) { if (loud) warn(shown(pk) ": skipping port " shown(port) ": not a port number"); continue }
		if (nport != "0" && !num(nport, 1, 65535)) { if (loud) warn(shown(pk) ": ignoring NodePort " shown(nport) ": not a port number"); nport = 0 }
		if (tport != "0" && !num(tport, 1, 65535)) { if (loud) warn(shown(pk) ": ignoring target port " shown(tport) ": not a port number"); tport = 0 }
		if ((proto, port) in pseen) { if (loud) warn(shown(pk) ": skipping port " port "/" PR[proto] ": listed twice"); continue }
		pseen[proto, port] = 1
		port += 0; nport += 0; tport += 0
		pn = PR[proto] port
		h = fold(fold(fold(h, proto), port), nport)
		for (f = 4; f <= 6; f += 2) {
			# endpoints of this family, with their target port (both: each of them of both scopes)
			ni = nx = 0; both = 1; built = 0
			for (e = 1; e <= ne; e++) {
				ep = f == 4 ? E4[e] : E6[e]
				if (ep == "") continue
				tp = tport ? tport : port
				for (o = 0; o < ON[e]; o++) if (a[OS[e] + 2 * o] == pname) {
					if (num(a[OS[e] + 2 * o + 1], 1, 65535)) tp = a[OS[e] + 2 * o + 1] + 0
					else tp = -1
					break
				}
				# Its override for this port has no usable number (an EndpointSlice
				# port without one): not an endpoint of this port (as kube-proxy).
				if (tp == -1) { if (loud) warn(shown(pk) ": endpoint " shown(ep) ": its port " shown(pname) " is " shown(a[OS[e] + 2 * o + 1]) ", not a port number: not used for port " port); continue }
				# A named target port its overrides do not list: the pod does not
				# serve it, so it is no endpoint of this port (as kube-proxy).
				if (named && o == ON[e] && ON[e] > 0) continue
				if (EI[e]) { eint[++ni] = ep; tint[ni] = tp }
				if (EX[e]) { eext[++nx] = ep; text[nx] = tp }
				if (EI[e] != EX[e]) both = 0
				h = fold(h, (ipnum(ep) * 262147 + tp * 4 + EI[e] * 2 + EX[e]) % M)
			}
			# destinations: cluster IPs (internal endpoints), external IPs and the NodePort (external endpoints)
			for (sc = 1; sc <= 2; sc++) {
				c = sc == 1 ? (f == 4 ? 1 : 2) : (f == 4 ? 3 : 4)
				if (sc == 1 && hl) continue
				nd = LN[c] + (sc == 2 && nport ? 1 : 0)
				if (!nd) continue
				n = sc == 1 ? ni : nx
				# the endpoints (EP . PORT), their addresses, and their one target port ("": several);
				# the external ones are the internal ones when each endpoint is of both scopes
				if (!built || !both) {
					list = al = tu = ""
					for (e = 1; e <= n; e++) {
						ep = sc == 1 ? eint[e] : eext[e]; tp = sc == 1 ? tint[e] : text[e]
						list = list (e > 1 ? "|" : "") ep " . " tp
						al = al (e > 1 ? "|" : "") ep
						if (e == 1) tu = tp; else if (tu != tp) tu = ""
						# masqueraded when it reaches itself (hairpin): each once
						if (!((f, ep) in HPU)) { HPU[f, ep] = 1; HPF[++nhp] = f; HPE[nhp] = ep }
					}
				}
				built = 1
				verd = ""
				if (n && aff) verd = "goto " affinity(f, sc, ptag, PR[proto], pn, n, sc == 1 ? "c" : "x", sc == 2 && !etp, tmo, eint, tint, eext, text)
				for (k = 1; k <= nd; k++) {
					nc++
					cf[nc] = f
					h = fold(h, sc * 3 + f)
					if (k <= LN[c]) {
						x = L[c, k]
						ck[nc] = "d"; ckey[nc] = x " . " PR[proto] " . " port
						cmap[nc] = (n ? "svc" : "noep") f
						cverd[nc] = n ? (verd != "" ? verd : "goto " (sc == 2 && !etp ? "x" : "p") f "_" n) : "goto reject_new"
						cudp[nc] = proto == 2 ? x " " port : ""
						h = fold(h, ipnum(x))
					} else {
						ck[nc] = "n"; ckey[nc] = PR[proto] " . " nport
						cmap[nc] = (n ? "np" : "noepnp") f
						cverd[nc] = n ? (verd != "" ? verd : "goto " (!etp ? "m" : "n") f "_" n) : "goto reject_new"
						cudp[nc] = proto == 2 ? (f == 4 ? "0.0.0.0" : "::") " " nport : ""
						h = fold(h, nport)
					}
					ceps[nc] = (aff ? "" : list)
					cepsu[nc] = list
					cal[nc] = al; ctp[nc] = tu; cnn[nc] = n; cmq[nc] = sc == 2 && !etp
				}
			}
		}
	}
	phash = sprintf("%.0f", h)
	return 1
}
function bad_rec(loud) { if (loud) warn(shown(pk) ": skipping a Service line of an unexpected shape"); pk = ""; return 0 }

# Affinity: per Service port, family and scope, a chain that sends a client
# seen within the timeout to its endpoint (a dynamic set per endpoint), else
# picks one (numgen, uniformly, via a chain per endpoint that records it).
# A known client goes through its endpoint's chain too, whose update
# restarts the timeout: affinity lasts TimeoutSeconds after the client's
# last new connection, not its first (as kube-proxy and iptables' recent).
function affinity(f, sc, pk, pr, pn, n, s, masq, tmo, eint, tint, eext, text,   base, i, ep, tp, sa, da, body, id, shared) {
	base = f s "-" pk "-" pn
	# An endpoint's set and chain are the Service port's, shared by its
	# cluster IPs and external destinations (as kube-proxy): a client keeps its
	# endpoint whichever address of the Service it uses.
	shared = f "-" pk "-" pn
	sa = f == 4 ? "ip saddr" : "ip6 saddr"
	da = f == 4 ? "ip" : "ip6"
	body = masq ? "\t\tmeta mark set meta mark | 0x00004000\n" : ""
	for (i = 1; i <= n; i++) {
		ep = sc == 1 ? eint[i] : eext[i]; tp = sc == 1 ? tint[i] : text[i]
		if (!((shared, ep, tp) in AFID)) {
			id = AFID[shared, ep, tp] = ++AFN[shared]
			aobj[++na] = "set\ta" shared "-" id "\t{ type ipv" f "_addr; flags dynamic,timeout; timeout " tmo "s; }"
			aobj[++na] = "chain\te" shared "-" id "\t\t\tupdate @a" shared "-" id " { " sa " }\n\t\tmeta l4proto " pr " dnat " da " to " (f == 4 ? ep : "[" ep "]") ":" tp
		}
		EPID[i] = AFID[shared, ep, tp]
		body = body "\t\t" sa " @a" shared "-" EPID[i] " goto e" shared "-" EPID[i] "\n"
	}
	for (i = 1; i < n; i++) body = body "\t\tnumgen random mod " (n - i + 1) " == 0 goto e" shared "-" EPID[i] "\n"
	body = body "\t\tgoto e" shared "-" EPID[n]
	aobj[++na] = "chain\ta" base "\t" body
	return "a" base
}

# ---- full state: the whole table, rebuilt in one transaction ----
function full_service(line,   i, f, key, e, n, u, cn) {
	if (!plan(line, 1)) return
	if (pk in fseen) { warn(shown(pk) ": skipping a second line for this Service"); return }
	fseen[pk] = 1
	IDS[++nids] = pid
	GEN[nids] = pid " . " phash
	for (i = 1; i <= na; i++) AOBJ[++naobj] = aobj[i]
	for (i = 1; i <= nc; i++) {
		f = cf[i]; key = ck[i] f " " ckey[i]
		if (key in owner) {
			if (owner[key] != pk) {
				warn(shown(pk) ": skipping " (ck[i] == "d" ? "destination " : "NodePort ") ckey[i] ": already used by " shown(owner[key]))
				if (!(key in dupd)) { dupd[key] = 1; add_el((ck[i] == "d" ? "dups" : "dupsnp") f, ckey[i]) }
			}
			continue
		}
		owner[key] = pk
		# its key, and its endpoint elements when it is the first of them (see canon())
		cn = canon(i)
		add_el(cmap[i], ckey[i] " : " cverdict(i, cn))
		n = claim_els(i, cn)
		for (e = 1; e <= n; e++) add_el(CLM[e], CLK[e] " : " CLV[e])
		udp_new(f, cudp[i], cepsu[i])
	}
	for (i = 1; i <= nhp; i++) { u = HPF[i] " " HPE[i]; if (!(u in hpseen)) { hpseen[u] = 1; add_el("hairpin" HPF[i], HPE[i] " . " HPE[i]) } }
	for (i = 1; i <= ncip; i++) {
		u = cipf[i] " " cip[i]
		if (!(u in cipseen)) { cipseen[u] = 1; add_el("clusterips" cipf[i], cip[i]) }
		# held by two Services (not valid in Kubernetes): a change set to either fails (a full state decides)
		else if (cipseen[u] == 1) { cipseen[u] = 2; add_el("cipdups" cipf[i], cip[i]) }
	}
}
# A full state's elements go straight to a file per set or map
# (eldir/fpreNAME, one "EL," line each; eldir/fprelist names them in order), added after the
# table by `add element` commands the callout puts together: keeping 500,000
# elements in an awk array until the end took 1.7 of awk's 4.3 s at 10,000
# Services (measured).
function add_el(m, el) {
	if (!(m in ELN)) { ELN[m] = 0; ELORDER[++nelm] = m }
	ELN[m]++
	print "\t" el "," > (eldir "/" fpre m)
}
# the UDP record (set udpF: DEST . PORT . ENDPOINT . ENDPOINT-PORT, ENDPOINT
# 0.0.0.0 / :: and port 0 for none): a flow is stale when its endpoint's IP:port
# went, a port change included (as kube-proxy)
function udp_new(f, du, list,   d, n, eps, e, w, z) {
	if (du == "") return
	split(du, d, " ")
	z = f == 4 ? "0.0.0.0" : "::"
	if (list == "") { add_el("udp" f, d[1] " . " d[2] " . " z " . 0"); NEWU[f, d[1], d[2], z, 0] = 1; NEWD[f, d[1], d[2]] = 1; return }
	n = split(list, eps, "|")
	for (e = 1; e <= n; e++) { split(eps[e], w, " "); if (!((f, d[1], d[2], w[1], w[3]) in NEWU)) { NEWU[f, d[1], d[2], w[1], w[3]] = 1; add_el("udp" f, d[1] " . " d[2] " . " w[1] " . " w[3]) }; NEWR[f, d[1], d[2]] = 1 }
}
function read_old_udp(   l, t, f, n, parts, i, p, x, y) {
	if (oldudp == "") return
	f = 0; t = ""
	while ((getline l < oldudp) > 0) {
		HAVEOLD = 1
		if (l ~ /set udp4 /) f = 4
		else if (l ~ /set udp6 /) f = 6
		if (index(l, "elements = {")) { t = substr(l, index(l, "{") + 1); inel = 1 }
		else if (inel) t = t l
		if (inel && index(l, "}")) {
			inel = 0
			sub(/}.*/, "", t)
			n = split(t, parts, ",")
			for (i = 1; i <= n; i++) {
				gsub(/[ \t]+/, " ", parts[i]); sub(/^ /, "", parts[i]); sub(/ $/, "", parts[i])
				if (split(parts[i], p, " \\. ") != 4) continue
				x = addr(f, p[1]); y = addr(f, p[3])
				if (x == "" || y == "" || !num(p[2], 1, 65535) || !num(p[4], 0, 65535)) continue
				OLDU[f, x, p[2], y, p[4]] = 1
				OLDD[f, x, p[2]] = 1
			}
			t = ""
		}
	}
	close(oldudp)
}
function ct_out(f, d, port, ep) {
	if (d == "0.0.0.0" || d == "::") d = "any"
	print f " " d " " port " " ep > ctfile
}
function full_ct(   k, p, z) {
	for (k in OLDU) {
		split(k, p, SUBSEP)
		z = p[1] == 4 ? "0.0.0.0" : "::"
		if (p[4] == z) { if ((p[1], p[2], p[3]) in NEWR) ct_out(p[1], p[2], p[3], "-") }
		else if (!((p[1], p[2], p[3], p[4], p[5]) in NEWU)) ct_out(p[1], p[2], p[3], p[4])
	}
	# a destination the table did not have (a new Service, address or port) that has
	# endpoints: a client may have sent to it before, its flow not translated; kube-proxy
	# clears those too (a newly active UDP Service). Not on a first run (no table).
	if (HAVEOLD) for (k in NEWR) if (!(k in OLDD)) { split(k, p, SUBSEP); ct_out(p[1], p[2], p[3], "-") }
}
function decl(m, type) { return "\t" (m ~ /^(svc|noep|np|noepnp|ep|epnp|key|tp)/ ? "map " : "set ") m " {\n\t\t" type "\n\t}" }
# table_part(1 or 2, out): the fixed declarations or the fixed chains of the
# table (lib/service-proxy-nft-table.nft, `tablefile`: the lines before and
# after its "# chains" line, those that start with "#" left out).
function table_part(part, out,   l, in2, r) {
	while ((r = getline l < tablefile) > 0) {
		if (l == "# chains") in2 = 1
		else if (substr(l, 1, 1) != "#" && (part == 2) == (in2 == 1)) print l > out
	}
	close(tablefile)
	if (r < 0) bad = "cannot read " tablefile
}
function full_end(   i, f, k, p, out, nm, body, t) {
	out = script
	print "table " T " {}" > out
	print "delete table " T > out
	print "table " T " {" > out
	for (i = 1; i <= nids; i++) { add_el("ids", IDS[i]); add_el("gen", GEN[i]) }
	table_part(1, out)
	for (i = 1; i <= naobj; i++) if (substr(AOBJ[i], 1, 4) == "set\t") { split(AOBJ[i], p, "\t"); print "\tset " p[2] " " p[3] > out }
	# the shared chains the state goes through, only those (a change set adds
	# those it needs and the table lacks), and the endpoint map of each lookup
	for (k in pneed) { split(k, p, SUBSEP); if (!(p[2] in GOTO)) print decl(epmap(p[1], p[2], p[3]), eptype(p[1], p[2])) > out }
	for (k in pneed) { split(k, p, SUBSEP); print pchain(p[1], p[2], p[3], "full") > out }
	for (i = 1; i <= naobj; i++) if (substr(AOBJ[i], 1, 6) == "chain\t") {
		split(AOBJ[i], p, "\t"); nm = p[2]; body = substr(AOBJ[i], length(nm) + 8)
		print "\tchain " nm " {\n" body "\n\t}" > out
	}
	table_part(2, out)
	print "}" > out
	close(out)
	for (i = 1; i <= nelm; i++) { close(eldir "/" fpre ELORDER[i]); print ELORDER[i] > (eldir "/" fpre "list") }
	close(eldir "/" fpre "list")
	wrote = 1
	full_ct()
	close(ctfile)
	if (!dry) warn("full state: " nids " Services planned")
}
