# service-proxy-nft: the records of service-proxy-nft.jq, written without jq
# for a small input (a per-run change set); see json-records.awk (the loop:
# json-flat.awk, json-records.awk, then this file).
#
# The record (see service-proxy-nft.jq): TYPE NS NAME ETPLOCAL AFFINITY
# TIMEOUT HEADLESS nC4 C4... nC6 C6... nX4 X4... nX6 X6... nPORTS [NAME PROTO
# PORT NODEPORT TARGETPORT-or-N]... nEPS [IP4 IP6 INTERNAL EXTERNAL nOVR [NAME
# PORT]...]...

# The first string of the array P.K (P an object or nothing), or "".
function jfirst(P, K) {
	if (!jobj(P) || !jarr(P SUBSEP K) || JN[P SUBSEP K] == 0) return ""
	return jstr(P SUBSEP K SUBSEP 0)
}
# The port P's TargetPort, or N: none, its target named (as the jq's `tport`).
function tport(P,   x) {
	x = jnum(P SUBSEP "TargetPort")
	if (x + 0 == 0 && jt(P SUBSEP "TargetPortName") == "s" && J[P SUBSEP "TargetPortName"] != "") return "N"
	return x
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
	ips = jlist(IP SUBSEP "ClusterIPs", "V4"); r = r "\t" jcount ips
	ips = jlist(IP SUBSEP "ClusterIPs", "V6"); r = r "\t" jcount ips
	x4 = jlist(IP SUBSEP "ExternalIPs", "V4"); n4 = jcount
	ips = jlist(IP SUBSEP "LoadBalancerIPs", "V4"); r = r "\t" (n4 + jcount) x4 ips
	x4 = jlist(IP SUBSEP "ExternalIPs", "V6"); n4 = jcount
	ips = jlist(IP SUBSEP "LoadBalancerIPs", "V6"); r = r "\t" (n4 + jcount) x4 ips
	P = S SUBSEP "Ports"
	n = jarr(P) ? JN[P] : 0
	r = r "\t" n
	for (i = 0; i < n; i++) {
		if (jt(P SUBSEP i) != "o") return 0
		e = P SUBSEP i
		r = r "\t" jstr(e SUBSEP "Name") "\t" jnum(e SUBSEP "Protocol") "\t" jnum(e SUBSEP "Port") "\t" jnum(e SUBSEP "NodePort") "\t" tport(e)
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
