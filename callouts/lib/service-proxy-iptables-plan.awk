# service-proxy-iptables-plan.awk: used by callouts/service-proxy-iptables.
# Input: the jq records (tab-separated; @tsv-escaped, so a state string is
# always exactly one field) of one family FAM (4 or 6):
#   P fam svc portname proto port nodeport targetport etplocal affinity
#   C ip                      a cluster IP of the port above
#   X ip                      an external or load-balancer IP
#   E ip targetport int ext   an endpoint (first address of the family)
# then, after a line "SAVED", the current iptables-save of nat and filter.
# Output: the restore input (nat, then filter) on stdout as blocks, one line
# each: SORTKEY TAB SUBKEY TAB SEQ TAB the block's lines joined by \001; the
# callout sorts them (sort -t TAB -k1,1r -k2,2r -k3,3n) and cuts the keys off.
# The chains to add go to the file PRE (a restore input of their own, below),
# conntrack deletion lines (UDP; lib/conntrack.sh) to the file CT, log lines to stderr.
#
# Why blocks, in that order: iptables-nft-restore --noflush (1.8.9) files
# every chain name a batch mentions in a sorted linked list, walked from its
# smallest name by strcmp: at 1,000 Services a batch in the natural order
# spent ~66 s there (measured; 250 Services 1.9 s, 500 11.8 s). So the
# shared chains have the smallest names, the chains of one Service port share
# a prefix (its block), and the blocks come largest name first: every name a
# rule mentions is then among the first few of the list.
# But the chains must not be created in that order: iptables-nft-save sorts
# the chains it lists with a quicksort whose pivot is the first of them (in
# the kernel's order: creation), quadratic and as deep as the list when they
# were created sorted (2,000 Services: 6.4 s, and more than a minute at
# 10,000; kube-proxy runs iptables-save on every sync). So the chains this
# run adds are created first, apart (to the file PRE, in the order of the
# state: random by name), in transactions of 1,000 (the sorted list is per
# transaction): empty chains nothing jumps to yet, harmless if the rest fails.
# Nothing from the state reaches the output unless it passed ip/port checks.
# TCP is refused with a reset: an ICMPv6 error ends an IPv6 connect only at its SYN retransmit (~1 s).
function rej() { return PROTO == "tcp" ? "REJECT --reject-with tcp-reset" : "REJECT" }
# warn(), shown(), ip4(), ip6(), addr(fam, s): lib/allip-plan.sh (allip_awk_lib), prepended by the callout.
function port(s) { return s ~ /^[1-9][0-9]*$/ && length(s) <= 5 && s + 0 <= 65535 }
# 16 base32 characters from four polynomial hashes of s (80 bits).
function hash(s,   i, c, a, b, d, e, n, out, v, k) {
	a = 7; b = 11; d = 13; e = 17
	n = length(s)
	for (i = 1; i <= n; i++) {
		c = ord[substr(s, i, 1)] + 1
		a = (a * 31 + c) % 1048573; b = (b * 131 + c) % 1048571
		d = (d * 257 + c) % 1048559; e = (e * 37 + c * 3) % 1048549
	}
	out = ""
	v[1] = a; v[2] = b; v[3] = d; v[4] = e
	for (k = 1; k <= 4; k++)
		for (i = 0; i < 4; i++) { out = out substr(B32, v[k] % 32 + 1, 1); v[k] = int(v[k] / 32) }
	return out
}
# A name of `len` hash characters after `pre` for key (KPNG-SP-T + 11 for a
# Service port, its group; the group + E + 7 for an endpoint of it), or "" on a collision.
function chainname(pre, key, len,   n) {
	n = pre substr(hash(key), 1, len)
	if ((n in owner) && owner[n] != key) { warn("chain name collision for " shown(key) "; skipped"); return "" }
	owner[n] = key
	return n
}
# An entry (S, X) or endpoint chain of a Service port, named as here or as
# before (KPNG-SP-S-, -X-, -E- + 16 characters); the block a chain of ours
# goes in: its Service port's prefix (KPNG-SP-T + 11), else its own name.
function sxchain(c) { return c ~ /^KPNG-SP-T[a-z2-7]+[SX]$/ || c ~ /^KPNG-SP-[SX]-/ }
function epchainname(c) { return c ~ /^KPNG-SP-T[a-z2-7]+E[a-z2-7]+$/ || c ~ /^KPNG-SP-E-/ }
function groupof(c) { return c ~ /^KPNG-SP-T[a-z2-7]+(S|X|E[a-z2-7]+)$/ ? substr(c, 1, 20) : c }
function join(a, b) { return a == "" ? b : b == "" ? a : a SEP b }
function emit(key, sk, block) { if (block != "") printf "%s\t%s\t%d\t%s\n", key, sk, ++seq, block }
# nat rules and declarations go to the current block, filter ones to the filter table's.
function nat(r) { blk = join(blk, r) }
function filt(r) { filr = join(filr, r) }
function decl(t, c) {
	if ((t, c) in want) return
	want[t, c] = 1
	if (t == "nat") { bdecl = join(bdecl, ":" c " - [0:0]"); created[++ncreated] = c }
	else fdecl = join(fdecl, ":" c " - [0:0]")
}
# Rules sending new connections to the endpoint chains of list L (space
# separated keys into epchain[]) from chain CH.
function lb(ch, l,   a, n, i, e) {
	n = split(l, a, " ")
	if (aff) for (i = 1; i <= n; i++) {
		e = epchain[a[i]]
		nat("-A " ch " -m recent --rcheck --seconds " aff " --reap --name " e " --mask " MASK " --rsource -j " e)
	}
	for (i = 1; i <= n; i++) {
		e = epchain[a[i]]
		if (i < n) nat(sprintf("-A %s -m statistic --mode random --probability %.11f -j %s", ch, 1 / (n - i + 1), e))
		else nat("-A " ch " -j " e)
	}
}
function flush() {
	if (!have) return
	have = 0
	if (!ok) return
	port_rules()
	# Declarations first: a rule may only jump to a chain declared before it.
	emit(GP, "~", join(bdecl, blk))
	bdecl = blk = ""
}
function port_rules(   pm, i, k, sname, xname, ipl, xl, x, n) {
	# only the destinations this Service owns; none: no chains either
	n = 0
	for (i = 1; i <= ncl; i++) if (mine("destination " cl[i] " " PROTO " " PORT)) cl[++n] = cl[i]
	ncl = n; n = 0
	for (i = 1; i <= nx; i++) if (mine("destination " xip[i] " " PROTO " " PORT)) xip[++n] = xip[i]
	nx = n
	if (NP != "" && !mine("NodePort " PROTO " " NP)) NP = ""
	if (!ncl && !nx && NP == "") return
	pm = " -p " PROTO " -m " PROTO " --dport " PORT
	ipl = xl = ""
	for (i = 1; i <= nep; i++) {
		k = epip[i]
		if (!(k in epchain)) continue
		if (epint[i]) ipl = ipl (ipl == "" ? "" : " ") k
		if (epext[i]) xl = xl (xl == "" ? "" : " ") k
		if (!(k in emitted)) {
			emitted[k] = 1
			x = epchain[k]
			decl("nat", x)
			nat("-A " x " -s " k SLASH " -j KPNG-SP-MARK-MASQ")
			if (aff) nat("-A " x " -m recent --set --name " x " --mask " MASK " --rsource")
			nat("-A " x " -p " PROTO " -m " PROTO " -j DNAT --to-destination " (FAM == 6 ? "[" k "]" : k) ":" eptp[k])
		}
	}
	sname = SNAME; xname = XNAME
	if (ipl != "") { decl("nat", sname); lb(sname, ipl) }
	for (i = 1; i <= ncl; i++) {
		if (ipl != "") nat("-A KPNG-SP-SERVICES -d " cl[i] SLASH pm " -j " sname)
		else filt("-A KPNG-SP-SERVICES -d " cl[i] SLASH pm " -m comment --comment \"no endpoints\" -j " rej())
		if (PROTO == "udp") want_eps("d " cl[i] " " PORT, ipl)
	}
	if (nx || NP) {
		if (xl != "" || (ETP && ipl != "")) {
			decl("nat", xname)
			if (!ETP) nat("-A " xname " -j KPNG-SP-MARK-MASQ")
			else if (ipl != "") {
				nat("-A " xname " -m addrtype --src-type LOCAL -j KPNG-SP-MARK-MASQ")
				nat("-A " xname " -m addrtype --src-type LOCAL -j " sname)
			}
			if (xl != "") { if (xl == ipl) nat("-A " xname " -j " sname); else lb(xname, xl) }
		}
		for (i = 1; i <= nx; i++) {
			if (xl != "" || (ETP && ipl != "")) nat("-A KPNG-SP-SERVICES -d " xip[i] SLASH pm " -j " xname)
			if (xl == "") filt("-A KPNG-SP-SERVICES -d " xip[i] SLASH pm " -m comment --comment \"no external endpoints\" -j " rej())
			if (PROTO == "udp") want_eps("d " xip[i] " " PORT, xl)
		}
		if (NP) {
			if (xl != "" || (ETP && ipl != "")) nat("-A KPNG-SP-NODEPORTS -p " PROTO " -m " PROTO " --dport " NP " -j " xname)
			if (xl == "") filt("-A KPNG-SP-SERVICES -p " PROTO " -m addrtype --dst-type LOCAL -m " PROTO " --dport " NP " -m comment --comment \"no external endpoints\" -j " rej())
			if (PROTO == "udp") want_eps("n " NP, xl)
		}
	}
}
# Whether this Service port may program destination key d (d DEST PROTO PORT
# or n PROTO NODEPORT): the first Service in the state's order owns it, as
# in service-proxy-nft; a later one is logged and left out.
function mine(d) {
	if (!(d in downer)) { downer[d] = svc; return 1 }
	if (downer[d] == svc) return 1
	if (!((d, svc) in dwarned)) { dwarned[d, svc] = 1; warn(shown(svc) ": skipping " d ": already used by " shown(downer[d])) }
	return 0
}
# The endpoints (IP#PORT) a UDP destination now sends to.
function want_eps(key, l,   a, n, i, t) {
	n = split(l, a, " "); t = ""
	for (i = 1; i <= n; i++) t = t (t == "" ? "" : " ") a[i] "#" eptp[a[i]]
	newset[key] = (key in newset) ? newset[key] " " t : t; newkey[key] = 1
}
BEGIN {
	FS = "\t"
	SEP = "\001"
	B32 = "abcdefghijklmnopqrstuvwxyz234567"
	for (i = 1; i < 256; i++) ord[sprintf("%c", i)] = i
	SLASH = FAM == 4 ? "/32" : "/128"
	MASK = FAM == 4 ? "255.255.255.255" : "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
	fk = FAM == 4 ? "V4" : "V6"
	decl("nat", "KPNG-SP-SERVICES"); decl("nat", "KPNG-SP-NODEPORTS")
	decl("nat", "KPNG-SP-POSTROUTING"); decl("nat", "KPNG-SP-MARK-MASQ")
	decl("filter", "KPNG-SP-SERVICES")
	nat("-A KPNG-SP-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN")
	nat("-A KPNG-SP-POSTROUTING -j MARK --set-xmark 0x4000/0x0")
	nat("-A KPNG-SP-POSTROUTING -j MASQUERADE --random-fully")
	nat("-A KPNG-SP-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000")
	emit("~3", "~", join("*nat", join(bdecl, blk)))
	bdecl = blk = ""
}
saved { 
	if ($0 ~ /^\*/) table = substr($0, 2)
	else if ($0 ~ /^:KPNG-SP-/) { c = substr($0, 2); sub(/ .*/, "", c); had[table, c] = 1; hadc[++nhad] = table SUBSEP c }
	else if ($0 ~ /^-A (PREROUTING|OUTPUT|POSTROUTING|INPUT|FORWARD) .*-j KPNG-SP-/) jl[table, $0]++
	else if (table == "nat" && $0 ~ /^-A KPNG-SP-/) {
		split($0, w, " ")
		c = w[2]; tgt = ""
		for (i = 3; i < length(w); i++) if (w[i] == "-j") tgt = w[i + 1]
		if (c == "KPNG-SP-SERVICES" && $0 ~ / -p udp / && match($0, / -d [^ ]+ /)) {
			d = substr($0, RSTART + 4, RLENGTH - 5); sub(/\/[0-9]+$/, "", d)
			match($0, / --dport [0-9]+/); p = substr($0, RSTART + 9, RLENGTH - 9)
			oldroot["d " d " " p] = tgt
		} else if (c == "KPNG-SP-NODEPORTS" && $0 ~ / -p udp /) {
			match($0, / --dport [0-9]+/); p = substr($0, RSTART + 9, RLENGTH - 9)
			oldroot["n " p] = tgt
		} else if (sxchain(c) && (sxchain(tgt) || epchainname(tgt))) kids[c] = kids[c] " " tgt
		else if (epchainname(c) && match($0, /--to-destination [^ ]+/)) {
			# IP#PORT: a flow to an endpoint whose port changed is stale too (as kube-proxy's IP:port).
			d = substr($0, RSTART + 17, RLENGTH - 17); p = d; sub(/.*:/, "", p)
			if (d ~ /^\[/) { sub(/^\[/, "", d); sub(/\].*/, "", d) } else sub(/:[0-9]+$/, "", d)
			dnat[c] = d "#" p
		}
	}
	next
}
$0 == "SAVED" { flush(); saved = 1; next }
$1 == "P" {
	flush()
	have = 1; ok = 0; ncl = nx = nep = 0
	delete epchain; delete emitted
	svc = $3; name = shown(svc) " port " shown($4)
	if ($5 == "1") PROTO = "tcp"; else if ($5 == "2") PROTO = "udp"; else if ($5 == "3") PROTO = "sctp"
	else { if (FAM == 4) warn(name ": skipped: protocol " shown($5) " is not TCP, UDP or SCTP"); next }
	if (!port($6)) { if (FAM == 4) warn(name ": skipped: port " shown($6) " is not an integer 1-65535"); next }
	PORT = $6
	NP = ""
	if ($7 != "0") { if (port($7)) NP = $7; else if (FAM == 4) warn(name ": NodePort " shown($7) " is not an integer 1-65535; ignored") }
	TP = PORT
	if ($8 != "0") { if (port($8)) TP = $8; else if (FAM == 4) warn(name ": target port " shown($8) " is not an integer 1-65535; using the port") }
	ETP = $9 == "true"
	aff = ""
	if ($10 != "-1") {
		aff = 10800
		if ($10 ~ /^[1-9][0-9]*$/ && length($10) <= 5 && $10 + 0 <= 86400) aff = $10
		else if ($10 != "0" && FAM == 4) warn(name ": session affinity timeout " shown($10) " is not 1..86400; using 10800")
	}
	key = FAM "|" svc "|" $4 "|" PROTO "|" PORT
	GP = chainname("KPNG-SP-T", key, 11)
	if (GP == "") next
	SNAME = GP "S"; XNAME = GP "X"
	ok = 1
	next
}
!ok { next }
$1 == "C" { k = addr(FAM, $2); if (k == "") warn(name ": skipping cluster IP " shown($2) ": not a literal IPv" FAM " address"); else cl[++ncl] = k; next }
$1 == "X" { k = addr(FAM, $2); if (k == "") warn(name ": skipping external IP " shown($2) ": not a literal IPv" FAM " address"); else xip[++nx] = k; next }
$1 == "E" {
	k = addr(FAM, $2)
	if (k == "") { warn(name ": skipping endpoint " shown($2) ": not a literal IPv" FAM " address"); next }
	if (k in epchain) next
	# -1: a named target port its overrides do not list (not an endpoint of this port)
	if ($3 == "-1") next
	# -2: its override for this port has no number (an EndpointSlice port without one): not used, as kube-proxy
	if ($3 == "-2") { warn(name ": endpoint " k ": its port override has no port number: not used for this port"); next }
	p = $3 == "" || $3 == "0" ? TP : $3
	if (!port(p)) { warn(name ": skipping endpoint " k ": port " shown(p) " is not an integer 1-65535"); next }
	x = chainname(GP "E", key "|" k "|" p, 7)
	if (x == "") next
	epchain[k] = x; eptp[k] = p
	nep++; epip[nep] = k; epint[nep] = $4 == "true"; epext[nep] = $5 == "true"
	next
}
# The endpoints (IP#PORT) reachable in the saved rules from chain c.
function reach(c, depth,   a, n, i, out) {
	if (c in dnat) return dnat[c]
	if (depth > 3 || !(c in kids)) return ""
	n = split(kids[c], a, " "); out = ""
	for (i = 1; i <= n; i++) out = out " " reach(a[i], depth + 1)
	return out
}
# The jump from a built-in chain, added when missing (duplicates removed).
function jumps(t, hook, rule,   n, out) {
	n = jl[t, "-A " hook " " rule] + 0
	out = n == 0 ? "-I " hook " 1 " rule : ""
	for (; n > 1; n--) out = join(out, "-D " hook " " rule)
	return out
}
# The chains of ours in table t no longer wanted, each emptied then deleted
# at once, after the chains that jumped to it were emptied. In nat: in the
# block of its Service port, after that block's own declarations (its S and X,
# and the shared chains, are emptied before it), largest name first (X, S,
# then E: each after the chains that jump to it); returned for filter (where
# only KPNG-SP-SERVICES jumps anywhere), to follow its declaration.
function stale(t,   i, tc, c, out) {
	out = ""
	for (i = 1; i <= nhad; i++) {
		split(hadc[i], tc, SUBSEP); c = tc[2]
		if (tc[1] != t || ((t, c) in want)) continue
		if (t == "nat") emit(groupof(c), c, ":" c " - [0:0]" SEP "-X " c)
		else out = join(out, ":" c " - [0:0]" SEP "-X " c)
	}
	return out
}
END {
	flush()
	stale("nat")
	# The nat chains to create (see the header), 1,000 a transaction.
	n = 0
	for (i = 1; i <= ncreated; i++) {
		c = created[i]
		if (("nat", c) in had) continue
		if (n % 1000 == 0) { if (n > 0) print "COMMIT" > PRE; print "*nat" > PRE }
		print ":" c " - [0:0]" > PRE
		n++
	}
	if (n > 0) { print "COMMIT" > PRE; close(PRE) }
	# not loopback (as kube-proxy): without route_localnet a NodePort DNATed
	# from 127.0.0.1 / ::1 leaves with a loopback source and is dropped (a hang)
	b = "-A KPNG-SP-SERVICES ! -d " (FAM == 4 ? "127.0.0.0/8" : "::1/128") " -m addrtype --dst-type LOCAL -j KPNG-SP-NODEPORTS"
	b = join(b, jumps("nat", "PREROUTING", "-j KPNG-SP-SERVICES"))
	b = join(b, jumps("nat", "OUTPUT", "-j KPNG-SP-SERVICES"))
	b = join(b, jumps("nat", "POSTROUTING", "-j KPNG-SP-POSTROUTING"))
	emit("!1", "~", join(b, "COMMIT"))
	b = join("*filter", join(fdecl, join(stale("filter"), filr)))
	b = join(b, jumps("filter", "INPUT", "-m conntrack --ctstate NEW -j KPNG-SP-SERVICES"))
	b = join(b, jumps("filter", "FORWARD", "-m conntrack --ctstate NEW -j KPNG-SP-SERVICES"))
	b = join(b, jumps("filter", "OUTPUT", "-m conntrack --ctstate NEW -j KPNG-SP-SERVICES"))
	emit("!0", "~", join(b, "COMMIT"))
	# UDP conntrack: endpoints that went away, destinations that got endpoints.
	if (!(("nat", "KPNG-SP-SERVICES") in had)) exit 0
	for (k in newkey) {
		delete nowep
		n = split(newset[k], a, " "); for (i = 1; i <= n; i++) nowep[epaddr(a[i])] = 1
		split(k, kk, " ")
		if (!(k in oldroot)) { if (n > 0) ctline(kk, "-"); continue }
		m = split(reach(oldroot[k], 0), a, " ")
		if (m == 0 && n > 0) { ctline(kk, "-"); continue }
		for (i = 1; i <= m; i++) if (!(a[i] in nowep)) { e = a[i]; sub(/#.*/, "", e); ctline(kk, e) }
	}
	for (k in oldroot) if (!(k in newkey)) {
		split(k, kk, " "); m = split(reach(oldroot[k], 0), a, " ")
		for (i = 1; i <= m; i++) { e = a[i]; sub(/#.*/, "", e); ctline(kk, e) }
	}
}
# A line of CT (lib/conntrack.sh): "FAMILY DEST PORT REPLYSRC" for the
# destination key kk ("d" ADDRESS PORT, or a NodePort: "n" PORT) and the
# endpoint address e ("-": any).
function ctline(kk, e) { print FAM " " (kk[1] == "d" ? kk[2] " " kk[3] : "any " kk[2]) " " e > CT }
function epaddr(k) { return k }
