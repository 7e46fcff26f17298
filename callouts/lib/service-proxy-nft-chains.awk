# service-proxy-nft: the planner's shared chains and maps (see
# service-proxy-nft.awk, which uses these): the chains every Service with N
# endpoints shares, the table's fixed chains, and which destination a
# Service port's packets are keyed by.

# Keys. A Service port's destinations that go to the same endpoints (same
# family, protocol, port, endpoints and target ports: a cluster IP and an
# external IP of a Service whose endpoints serve both, or several external
# IPs) share one set of epF_N elements, keyed by the first of them (its
# canonical destination). The others go through rF_N / yF_N, which rewrite
# the packet's destination to it (`ip daddr set`, keyF: the checksums
# follow) before the shared chain's lookup; nf_nat then rewrites it to the
# endpoint, and the conntrack entry keeps the address the client used, which
# replies come from. Only a new connection's first packet passes a nat chain.
# Why: each destination's own N elements made the endpoint maps most of
# nft's time (400,000 of 535,000 elements at 10,000 Services with a cluster
# and an external IP each; bench/RESULTS.md).
# canon(c): claim c's canonical destination when it is not its own ("" when
# it is, or when it has no endpoint elements: affinity, NodePort, none).
# CANON is reset per Service (plan()); a full state calls it only for the
# claims it keeps, in order, so the canonical one is always the Service's own.
function canon(c,   p) {
	if (ck[c] != "d" || ceps[c] == "") return ""
	split(ckey[c], p, " ")
	if ((cf[c], p[3], p[5], ceps[c]) in CANON) return CANON[cf[c], p[3], p[5], ceps[c]]
	CANON[cf[c], p[3], p[5], ceps[c]] = p[1]
	return ""
}
# The verdict of claim c when its destination is rewritten: rF_N for pF_N,
# yF_N (mark, then rF_N) for xF_N; notes the chains in pneed.
function rverd(c,   v, k, p) {
	v = cverd[c]
	k = substr(v, 6, 1) == "x" ? "y" : "r"
	split(substr(v, 7), p, "_")
	# (plan() noted pF_N already)
	pneed[p[1], k, p[2]] = 1; pneed[p[1], "r", p[2]] = 1
	return "goto " k substr(v, 7)
}

# The map of the endpoints of destinations with N endpoints (kind p) or of
# NodePorts (kind n), and its type. A map per N: every rule that uses a map
# makes the kernel walk all its elements once per transaction (nft_bind_set:
# at 10,000 Services, 192 rules on one map of 400,000 elements took 18 s of
# kernel time; a map per N is walked by the 3 rules of its own chain).
function epmap(f, k, n) { return (k == "p" ? "ep" : "epnp") f "_" n }
function eptype(f, k) { return "typeof " (k == "p" ? (f == 4 ? "ip" : "ip6") " daddr . " : "") "meta l4proto . th dport . numgen random mod 2 : " (f == 4 ? "ip" : "ip6") " daddr . th dport" }
# The chains shared by all Services with N endpoints (no per-Service chain:
# the endpoints are elements of epF_N / epnpF_N, keyed by destination and index):
# p (the lookup), x (mark for masquerade, then p), r (the destination rewritten
# to its canonical one, then p), y (mark, then r); n and m, the same as p and x
# for NodePorts.
function pchain(f, k, n, how,   name, ip, r, pr, lk, m) {
	name = k f "_" n
	ip = f == 4 ? "ip" : "ip6"
	if (k == "x" || k == "m" || k == "y") r = "\t\tmeta mark set meta mark | 0x00004000\n\t\tgoto " (k == "x" ? "p" : k == "m" ? "n" : "r") f "_" n
	else if (k == "r") r = "\t\t" ip " daddr set " ip " daddr . meta l4proto . th dport map @key" f "\n\t\tgoto p" f "_" n
	else {
		lk = k == "p" ? ip " daddr . meta l4proto . th dport" : "meta l4proto . th dport"
		m = epmap(f, k, n)
		r = ""
		for (pr = 1; pr <= 3; pr++) r = r (pr > 1 ? "\n" : "") "\t\tmeta l4proto " PR[pr] " dnat " ip " addr . port to " lk " . numgen random mod " n " map @" m
	}
	if (how == "full") return "\tchain " name " {\n" r "\n\t}"
	gsub(/\t\t/, "add rule " T " " name " ", r)
	return (k == "p" || k == "n" ? "add map " T " " m " { " eptype(f, k) "; }\n" : "") "add chain " T " " name "\nflush chain " T " " name "\n" r
}
function fixed_chains() {
	return "\tchain reject_new {\n\t\tmeta l4proto tcp reject with tcp reset\n\t\treject with icmpx port-unreachable\n\t}\n" \
	"\tchain noep {\n\t\tip daddr . meta l4proto . th dport vmap @noep4\n\t\tip6 daddr . meta l4proto . th dport vmap @noep6\n" \
	"\t\tfib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @noepnp4\n" \
	"\t\tfib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @noepnp6\n\t}\n" \
	"\tchain filter_input {\n\t\ttype filter hook input priority -110; policy accept;\n\t\tct state new jump noep\n\t}\n" \
	"\tchain filter_forward {\n\t\ttype filter hook forward priority -110; policy accept;\n\t\tct state new jump noep\n\t\tct state new jump clusterips_check\n\t}\n" \
	"\tchain filter_output {\n\t\ttype filter hook output priority -110; policy accept;\n\t\tct state new jump noep\n\t}\n" \
	"\tchain clusterips_check {\n\t\tip daddr @clusterips4 goto reject_new\n\t\tip6 daddr @clusterips6 goto reject_new\n\t}\n" \
	"\tchain filter_output_post_dnat {\n\t\ttype filter hook output priority -90; policy accept;\n\t\tct state new fib daddr type != local jump clusterips_check\n\t}\n" \
	"\tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @svc4\n\t\tip6 daddr . meta l4proto . th dport vmap @svc6\n" \
	"\t\tfib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @np4\n" \
	"\t\tfib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @np6\n\t}\n" \
	"\tchain nat_prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}\n" \
	"\tchain nat_output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}\n" \
	"\tchain nat_postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n" \
	"\t\tmeta mark & 0x00004000 == 0x00004000 meta mark set meta mark ^ 0x00004000 masquerade fully-random\n" \
	"\t\tct status dnat ip saddr . ip daddr @hairpin4 masquerade\n\t\tct status dnat ip6 saddr . ip6 daddr @hairpin6 masquerade\n\t}"
}
