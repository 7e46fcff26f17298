# service-proxy-nft: the planner's shared chains and maps (see
# service-proxy-nft.awk, which uses these): the chains every Service with N
# endpoints shares (the table's fixed chains are in
# service-proxy-nft-table.nft), and which destination a
# Service port's packets are keyed by.

# Keys. The destinations of a Service that go to the same endpoints share
# their elements, keyed by one destination; the others go through a chain
# that rewrites the packet's destination to that key (`ip daddr set`, keyF:
# the checksums follow) before the shared chain's lookup; nf_nat then
# rewrites it to the endpoint, and the conntrack entry keeps the address the
# client used, which replies come from. Only a new connection's first packet
# passes a nat chain. Two ways, the first one where it can be:
#   per Service  the Service's first cluster IP of the family keys the
#                endpoint addresses (epaF_N: KEY . INDEX : address) for all
#                of its ports, and each port's target port (tpF: KEY . proto
#                . port : target port), when every endpoint of a port has the
#                same target port; one endpoint list per Service and family
#                (its first: another list, say the external endpoints of an
#                ExternalTrafficToLocal Service, is keyed per port); chains
#                qF_N (the lookup), wF_N (mark, then q), sF_N (rewrite, then
#                q), zF_N (mark, then s);
#   per port     the first destination of a Service port keys its endpoints
#                and target ports (epF_N: KEY . proto . port . INDEX : address
#                . port) for the destinations with the same endpoints (same
#                family, protocol, port, endpoints and target ports); chains
#                pF_N, xF_N (mark, then p), rF_N (rewrite, then p), yF_N (mark,
#                then r).
# Why: each destination's own N elements made the endpoint maps most of
# nft's time (400,000 of 535,000 elements at 10,000 Services with a cluster
# and an external IP each); per Service they are 100,000 elements of a
# smaller type, about a quarter of the time (bench/RESULTS.md).
# The per-Service key is a cluster IP no other Service holds (a full state
# checks cipseen; a change set's guards fail on one two Services hold), so
# the elements keyed by it are its Service's only.
# canon(c): for claim c, sets cq (the per-Service key, or ""), cqnew (its
# endpoint elements are new in this plan) and cqtp (its tpF element is new
# in this plan), and returns the destination c is rewritten to ("":
# none, or no endpoint elements: affinity, NodePort, none). QG, QT, QU and
# CANON are reset per Service (plan()); a full state calls it only for the
# claims it keeps, in order, so a key is always the Service's own.
function canon(c,   p, f, key, g, t) {
	cq = ""; cqnew = cqtp = 0
	if (ck[c] != "d" || ceps[c] == "") return ""
	split(ckey[c], p, " ")
	f = cf[c]; key = QK[f]; t = f SUBSEP p[3] SUBSEP p[5]
	if (key != "" && ctp[c] != "" && !((f " " key) in cipseen)) {
		g = f SUBSEP cal[c]
		if (!(g in QG) && !(f in QU)) { QG[g] = 1; QU[f] = 1; cqnew = 1 }
		# its port's target port is that of the key's (the same addresses may
		# have another target port in the other scope: then per port)
		if ((g in QG) && (!(t in QT) || QT[t] == ctp[c])) {
			cq = key
			if (!(t in QT)) { QT[t] = ctp[c]; cqtp = 1 }
			return p[1] == key ? "" : key
		}
	}
	if ((t, ceps[c]) in CANON) return CANON[t, ceps[c]]
	CANON[t, ceps[c]] = p[1]
	return ""
}
# The verdict of claim c after canon(c) returned rw: its own (cverd) when
# keyed per port by itself, or for affinity and none; else the shared chain
# of its kind (see pchain()): rF_N, or yF_N when it masquerades, per port; qF_N,
# wF_N, sF_N, zF_N per Service. Notes the shared chains it goes through in
# pneed (a table declares only those).
function cverdict(c, rw,   k) {
	if (cq == "" && rw == "") {
		# keyed per port by itself: pF_N / xF_N (nF_N / mF_N for a NodePort), when
		# it has endpoints and no affinity (ceps: else its own verdict)
		if (ceps[c] != "") need(cf[c], ck[c] == "d" ? (cmq[c] ? "x" : "p") : (cmq[c] ? "m" : "n"), cnn[c])
		return cverd[c]
	}
	k = cq == "" ? "r" : rw == "" ? "q" : "s"
	if (cmq[c]) k = MASQ[k]
	need(cf[c], k, cnn[c])
	return "goto " k cf[c] "_" cnn[c]
}
# need(f, k, n): chain kF_N, and those it goes to, in pneed.
function need(f, k, n) { pneed[f, k, n] = 1; if (k in GOTO) need(f, GOTO[k], n) }
# hops(k): how many chains a chain of kind k goes through to its lookup (0: a
# lookup, which goes to none): the order a transaction must create them in.
function hops(k) { return k in GOTO ? 1 + hops(GOTO[k]) : 0 }
# The elements claim c needs besides its svcF / npF element, after canon(c)
# returned rw: its keyF element, its tpF element and its endpoint elements
# (epaF_N per Service when new in this plan; epF_N / epnpF_N per port when
# c keys them); each map CLM[i], key CLK[i], value CLV[i]. Returns how many.
function claim_els(c, rw,   n, eps, e, m) {
	ncl = 0
	if (rw != "") cl_el("key" cf[c], ckey[c], rw)
	# (ckey after the address: proto . port)
	if (cqtp) cl_el("tp" cf[c], cq " . " substr(ckey[c], index(ckey[c], " . ") + 3), ctp[c])
	if (cq != "") {
		if (!cqnew) return ncl
		n = split(cal[c], eps, "|")
		m = epmap(cf[c], "q", n)
		for (e = 1; e <= n; e++) cl_el(m, cq " . " (e - 1), eps[e])
	} else if (ceps[c] != "" && rw == "") {
		n = split(ceps[c], eps, "|")
		m = epmap(cf[c], ck[c] == "d" ? "p" : "n", n)
		for (e = 1; e <= n; e++) cl_el(m, ckey[c] " . " (e - 1), eps[e])
	}
	return ncl
}
function cl_el(m, k, v) { CLM[++ncl] = m; CLK[ncl] = k; CLV[ncl] = v }

# The map of the endpoints of destinations with N endpoints (kind q: per
# Service; p: per Service port) or of NodePorts (kind n), and its type. A map per N: every rule that uses a map
# makes the kernel walk all its elements once per transaction (nft_bind_set:
# at 10,000 Services, 192 rules on one map of 400,000 elements took 18 s of
# kernel time; a map per N is walked by the 3 rules of its own chain).
function epmap(f, k, n) { return (k == "p" ? "ep" : k == "q" ? "epa" : "epnp") f "_" n }
function eptype(f, k,   ip) {
	ip = f == 4 ? "ip" : "ip6"
	if (k == "q") return "typeof " ip " daddr . numgen random mod 2 : " ip " daddr"
	return "typeof " (k == "p" ? ip " daddr . " : "") "meta l4proto . th dport . numgen random mod 2 : " ip " daddr . th dport"
}
# The chains shared by all Services with N endpoints (no per-Service chain:
# the endpoints are elements, see canon()): p and q (the lookups, per port
# and per Service), x and w (mark for masquerade, then p / q), r and s (the
# destination rewritten to its key, then p / q), y and z (mark, then r / s);
# n and m, the same as p and x for NodePorts. GOTO[k]: the chain kind k goes
# to (none: a lookup); MASQ[k]: the kind that marks, then goes to k's way.
BEGIN {
	GOTO["x"] = "p"; GOTO["m"] = "n"; GOTO["y"] = "r"; GOTO["w"] = "q"; GOTO["z"] = "s"; GOTO["r"] = "p"; GOTO["s"] = "q"
	MASQ["p"] = "x"; MASQ["r"] = "y"; MASQ["q"] = "w"; MASQ["s"] = "z"
}
function pchain(f, k, n, how,   name, ip, r, pr, m) {
	name = k f "_" n
	ip = f == 4 ? "ip" : "ip6"
	if (k == "r" || k == "s") r = "\t\t" ip " daddr set " ip " daddr . meta l4proto . th dport map @key" f "\n\t\tgoto " GOTO[k] f "_" n
	else if (k in GOTO) r = "\t\tmeta mark set meta mark | 0x00004000\n\t\tgoto " GOTO[k] f "_" n
	else {
		m = epmap(f, k, n)
		r = ""
		for (pr = 1; pr <= 3; pr++) {
			r = r (pr > 1 ? "\n" : "") "\t\tmeta l4proto " PR[pr] " dnat " ip
			if (k == "q") r = r " to " ip " daddr . numgen random mod " n " map @" m " : " ip " daddr . meta l4proto . th dport map @tp" f
			else r = r " addr . port to " (k == "p" ? ip " daddr . " : "") "meta l4proto . th dport . numgen random mod " n " map @" m
		}
	}
	if (how == "full") return "\tchain " name " {\n" r "\n\t}"
	gsub(/\t\t/, "add rule " T " " name " ", r)
	return (k in GOTO ? "" : "add map " T " " m " { " eptype(f, k) "; }\n") "add chain " T " " name "\nflush chain " T " " name "\n" r
}
