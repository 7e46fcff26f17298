# service-proxy-nft: the records of service-proxy-nft.jq, written without jq
# for a small input (a per-run change set), because jq 1.6's start-up alone
# takes 23-30 ms (see json-flat.awk, which must be in front of this file).
#
# Reads the state lines on stdin, copies each to the file `copy`, and writes
# the records to the file `out`, "Z" last. Exit 0: every line was read here,
# and `out` holds exactly what jq would have written. Exit 3: some line is
# not one it is sure of (anything unusual: see json-flat.awk, and any value
# of a type other than the canonical one or null), or the input is over
# `max` bytes; then `out` is incomplete and the caller runs jq on `copy`,
# which always holds the whole input. Variables: copy, out, max.
#
# The record (see service-proxy-nft.jq): TYPE NS NAME ETPLOCAL AFFINITY
# TIMEOUT HEADLESS nC4 C4... nC6 C6... nX4 X4... nX6 X6... nPORTS [NAME PROTO
# PORT NODEPORT TARGETPORT]... nEPS [IP4 IP6 INTERNAL EXTERNAL nOVR [NAME
# PORT]...]...

BEGIN { sure = 1; size = 0 }
{
	print > copy
	if (!sure) next
	size += length($0) + 1
	if (size > max) { sure = 0; next }
	if ($0 ~ /^ *$/) next
	if (!jflat($0)) { sure = 0; next }
	if (!(("$" SUBSEP "Previous") in JT ? record("P", "$" SUBSEP "Previous") : record("S", "$"))) sure = 0
}
END {
	close(copy)
	if (!sure) exit 3
	print "Z" > out
	close(out)
	exit 0
}

# A value's type, or "" when there is none (reading JT[P] would create it).
function jt(P) { return (P in JT) ? JT[P] : "" }
# jq's `// default` treats null and false alike: nothing there.
function none(P) { return !(P in JT) || jt(P) == "z" || jt(P) == "f" }
# b: "1" for true, "0" for anything else.
function jb(P) { return jt(P) == "t" ? "1" : "0" }
# A string (or nothing: ""); "" and rsure = 0 for another type.
function jstr(P) { if (jt(P) == "s") return J[P]; if (!none(P)) rsure = 0; return "" }
# A number (or nothing: 0); 0 and rsure = 0 for another type.
function jnum(P) { if (jt(P) == "n") return J[P]; if (!none(P)) rsure = 0; return "0" }
# An array (1), nothing (0, as an empty one); another type: rsure = 0.
function jarr(P) { if (jt(P) == "a") return 1; if (!none(P)) rsure = 0; return 0 }
# An object (1), nothing (0); another type: rsure = 0.
function jobj(P) { if (jt(P) == "o") return 1; if (!none(P)) rsure = 0; return 0 }
# The strings of the array at P, each after a tab; `jcount` gets their number.
function jstrs(P,   i, s) {
	jcount = 0; s = ""
	if (!jarr(P)) return ""
	for (i = 0; i < JN[P]; i++) {
		if (jt(P SUBSEP i) != "s") { rsure = 0; return "" }
		s = s "\t" J[P SUBSEP i]
	}
	jcount = JN[P]
	return s
}
# The first string of the array P.K (P an object or nothing), or "".
function jfirst(P, K) {
	if (!jobj(P) || !jarr(P SUBSEP K) || JN[P SUBSEP K] == 0) return ""
	return jstr(P SUBSEP K SUBSEP 0)
}
# The addresses of family K (V4, V6) of the IP set P.K, after a tab each; `jcount` their number.
function jips(P, K) {
	jcount = 0
	if (!jobj(P)) return ""
	return jstrs(P SUBSEP K)
}

# Writes the record of the line's object at R (TYPE t) to `out`; 0 when not
# sure (what it wrote is then of no use: the whole input goes to jq). The
# endpoints are written one by one: a string grown by each would be copied
# each time (a Service of 2,000 endpoints took 0.2 s so).
function record(t, R,   S, A, IP, r, ips, n, i, e, P, E, O, j, x4, n4) {
	rsure = 1
	if (jt(R) != "o" || jt(R SUBSEP "Service") != "o") return 0
	S = R SUBSEP "Service"
	r = t "\t" jstr(S SUBSEP "Namespace") "\t" jstr(S SUBSEP "Name") "\t" jb(S SUBSEP "ExternalTrafficToLocal")
	A = S SUBSEP "SessionAffinity"
	if (jt(A) == "o" && jt(A SUBSEP "ClientIP") == "o") r = r "\t1\t" jnum(A SUBSEP "ClientIP" SUBSEP "TimeoutSeconds")
	else r = r "\t0\t0"
	IP = S SUBSEP "IPs"
	jobj(IP)
	r = r "\t" jb(IP SUBSEP "Headless")
	ips = jips(IP SUBSEP "ClusterIPs", "V4"); r = r "\t" jcount ips
	ips = jips(IP SUBSEP "ClusterIPs", "V6"); r = r "\t" jcount ips
	x4 = jips(IP SUBSEP "ExternalIPs", "V4"); n4 = jcount
	ips = jips(IP SUBSEP "LoadBalancerIPs", "V4"); r = r "\t" (n4 + jcount) x4 ips
	x4 = jips(IP SUBSEP "ExternalIPs", "V6"); n4 = jcount
	ips = jips(IP SUBSEP "LoadBalancerIPs", "V6"); r = r "\t" (n4 + jcount) x4 ips
	P = S SUBSEP "Ports"
	n = jarr(P) ? JN[P] : 0
	r = r "\t" n
	for (i = 0; i < n; i++) {
		if (jt(P SUBSEP i) != "o") return 0
		e = P SUBSEP i
		r = r "\t" jstr(e SUBSEP "Name") "\t" jnum(e SUBSEP "Protocol") "\t" jnum(e SUBSEP "Port") "\t" jnum(e SUBSEP "NodePort") "\t" jnum(e SUBSEP "TargetPort")
	}
	E = R SUBSEP "Endpoints"
	n = jarr(E) ? JN[E] : 0
	printf "%s\t%s", r, n > out
	for (i = 0; i < n; i++) {
		if (jt(E SUBSEP i) != "o") return 0
		e = E SUBSEP i
		r = "\t" jfirst(e SUBSEP "IPs", "V4") "\t" jfirst(e SUBSEP "IPs", "V6")
		if (jt(e SUBSEP "Scopes") == "o") r = r "\t" jb(e SUBSEP "Scopes" SUBSEP "Internal") "\t" jb(e SUBSEP "Scopes" SUBSEP "External")
		else r = r "\t1\t1"
		O = e SUBSEP "PortOverrides"
		r = r "\t" (jarr(O) ? JN[O] : 0)
		if (jt(O) == "a") for (j = 0; j < JN[O]; j++) {
			if (jt(O SUBSEP j) != "o") return 0
			r = r "\t" jstr(O SUBSEP j SUBSEP "Name") "\t" jnum(O SUBSEP j SUBSEP "Port")
		}
		printf "%s", r > out
	}
	printf "\n" > out
	return rsure
}
