# kpng-example-allip-nft: the records of its jq program (`jqprog` in the
# callout), written without jq for a small input (a per-run change set);
# see json-records.awk (the loop: json-flat.awk, json-records.awk, then
# this file). Variable: lb (true: LoadBalancerIPs count as external IPs).
#
# The record: TYPE NS/NAME nX4 X4... nE4 E4... nX6 X6... E6... (the local
# endpoints' first address of each family), or TYPE alone for a line that
# is no Service.

# A value in a jq string interpolation ("\(.)"): a string as it is, null,
# true, false and numbers as their text; rsure = 0 for an object or array.
function jtext(P,   t) {
	t = jt(P)
	if (t == "s" || t == "n") return J[P]
	if (t == "" || t == "z") return "null"
	if (t == "t") return "true"
	if (t == "f") return "false"
	rsure = 0
	return ""
}

# Writes the record of the line's object at R (TYPE t) to `out`; 0 when not
# sure (what it wrote is then of no use: the whole input goes to jq). The
# endpoints are kept in arrays, not strings grown by each (copied each time).
function record(t, R,   S, IP, E, e, n, i, x4, n4, x6, n6, E4, ne4, E6, ne6, s) {
	rsure = 1
	if (jt(R) != "o") return 0
	S = R SUBSEP "Service"
	if (jt(S) != "o") { print t > out; return 1 }
	IP = S SUBSEP "IPs"
	x4 = jlist(IP SUBSEP "ExternalIPs", "V4"); n4 = jcount
	if (lb == "true") { s = jlist(IP SUBSEP "LoadBalancerIPs", "V4"); x4 = x4 s; n4 += jcount }
	x6 = jlist(IP SUBSEP "ExternalIPs", "V6"); n6 = jcount
	if (lb == "true") { s = jlist(IP SUBSEP "LoadBalancerIPs", "V6"); x6 = x6 s; n6 += jcount }
	if (jt(IP) != "o" && !none(IP)) rsure = 0
	E = R SUBSEP "Endpoints"
	n = 0
	if (jt(E) == "a") n = JN[E]
	else if (!none(E)) rsure = 0
	ne4 = ne6 = 0
	for (i = 0; i < n; i++) {
		e = E SUBSEP i
		if (jt(e) != "o") return 0
		if (jt(e SUBSEP "Local") != "t") continue
		s = first(e SUBSEP "IPs", "V4"); if (s != "") E4[++ne4] = substr(s, 2)
		s = first(e SUBSEP "IPs", "V6"); if (s != "") E6[++ne6] = substr(s, 2)
	}
	printf "%s\t%s/%s\t%s%s\t%s", t, jtext(S SUBSEP "Namespace"), jtext(S SUBSEP "Name"), n4, x4, ne4 > out
	for (i = 1; i <= ne4; i++) printf "\t%s", E4[i] > out
	printf "\t%s%s", n6, x6 > out
	for (i = 1; i <= ne6; i++) printf "\t%s", E6[i] > out
	printf "\n" > out
	return rsure
}
# The first string of the array P.K (P an object or nothing) after an "s"
# (so that an empty string is told from none), or "" when it has none (jq's
# `values` drops a null); rsure = 0 for anything else.
function first(P, K,   A, t) {
	if (jt(P) != "o") { if (!none(P)) rsure = 0; return "" }
	A = P SUBSEP K
	if (jt(A) != "a") { if (!none(A)) rsure = 0; return "" }
	if (JN[A] == 0) return ""
	t = jt(A SUBSEP 0)
	if (t == "s") return "s" J[A SUBSEP 0]
	if (t != "z") rsure = 0
	return ""
}
