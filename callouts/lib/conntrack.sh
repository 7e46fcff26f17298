# conntrack.sh: the UDP flow cleanup of the bundled callouts (sourced; POSIX sh).
#
# udp_flows_clear PROG FILE deletes the UDP conntrack entries FILE lists, one
# per line "FAMILY DEST PORT REPLYSRC": FAMILY 4 or 6, DEST an address or
# `any`, PORT a number or `any`, REPLYSRC an address or `-` (any): the flows
# to an endpoint that went, and the untranslated ones of a destination that
# had no endpoint (REPLYSRC = DEST), as kube-proxy deletes them, so that a
# client keeping its source port follows the change. Every field is checked
# again (digits, hex digits, dots and colons only); a line that fails is
# skipped. PROG names the callout in the one message it may write (conntrack
# missing).
#
# Each `conntrack -D` walks the whole table (~7 ms here even when it is
# empty, and they do not overlap: 4,000 of them took 30 s, one at a time or 8
# at once), so: none at all when this network namespace holds no flow (its
# counter, read without a process); a few lines are deleted one by one; more
# (a re-list, a big change set) read the family's UDP flows once
# (`conntrack -L`) and delete only for the lines that describe one of them,
# one `conntrack -D` per line (not per flow: an exact-tuple delete walks the
# table too, and an endpoint of a busy UDP Service may hold thousands of
# flows). Their own output and status are dropped
# ("0 flow entries" exits 1: not an error); they get none of the caller's
# descriptors above 2 (a callout's fd 3 is its ack pipe).
udp_flows_clear() {
	[ -s "$2" ] || return 0
	_ct_count=
	# (read fails at the file's end even when it read the number)
	[ ! -r /proc/sys/net/netfilter/nf_conntrack_count ] || read -r _ct_count </proc/sys/net/netfilter/nf_conntrack_count || :
	[ "$_ct_count" != 0 ] || return 0
	if ! command -v conntrack >/dev/null 2>&1; then
		printf '%s: conntrack is missing: stale UDP flows are not cleared\n' "$1" >&2
		return 0
	fi
	_ct_lines=$(sort -u -- "$2")
	if [ "$(printf '%s\n' "$_ct_lines" | wc -l)" -le 8 ]; then
		printf '%s\n' "$_ct_lines" | udp_flows_delete
		return 0
	fi
	for _ct_fam in 4 6; do
		grep -q "^$_ct_fam " -- "$2" || continue
		conntrack -L -f "ipv$_ct_fam" -p udp 2>/dev/null </dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- |
			_ct_specs=$2 awk -v fam="$_ct_fam" "$udp_flows_pick" | udp_flows_delete
	done
}

# udp_flows_delete: one `conntrack -D` per line of stdin ("FAMILY DEST PORT
# REPLYSRC", checked again), filtered as the line says.
udp_flows_delete() {
	while IFS=' ' read -r _ct_f _ct_d _ct_p _ct_e; do
		udp_flow_ok "$_ct_f" "$_ct_d" "$_ct_p" "$_ct_e" || continue
		set -- -D -f "ipv$_ct_f" -p udp
		[ "$_ct_d" = any ] || set -- "$@" --orig-dst "$_ct_d"
		[ "$_ct_p" = any ] || set -- "$@" --orig-port-dst "$_ct_p"
		[ "$_ct_e" = - ] || set -- "$@" --reply-src "$_ct_e"
		conntrack "$@" >/dev/null 2>&1 </dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-
	done
}

# udp_flow_ok FAMILY DEST PORT REPLYSRC: the fields of a line, checked again.
udp_flow_ok() {
	case $1 in 4 | 6) ;; *) return 1 ;; esac
	case $2 in any) ;; '' | *[!0-9a-fA-F:.]*) return 1 ;; esac
	case $3 in any) ;; '' | *[!0-9]*) return 1 ;; esac
	case $4 in -) ;; '' | *[!0-9a-fA-F:.]*) return 1 ;; esac
}

# awk: `conntrack -L` lines in ("udp 17 TTL src= dst= sport= dport= [...]
# src= dst= sport= dport= ..."; the first four are the original direction,
# the second src= the reply's source); out the lines of the file
# $_ct_specs (family `fam`; from the environment: -v would expand
# backslashes in its name) that describe at least one flow, once each.
# shellcheck disable=SC2016 # $i is awk's
udp_flows_pick='
BEGIN {
	specs = ENVIRON["_ct_specs"]
	while ((getline l < specs) > 0) {
		n = split(l, f, " ")
		if (n == 4 && f[1] == fam) want[f[2] " " f[3] " " f[4]] = 1
	}
	close(specs)
}
{
	src = dst = sp = dp = rs = ""
	for (i = 1; i <= NF; i++) {
		k = $i; v = $i; sub(/=.*/, "", k); sub(/^[^=]*=/, "", v)
		if (k == "src") { if (src == "") src = v; else if (rs == "") rs = v }
		else if (k == "dst" && dst == "") dst = v
		else if (k == "sport" && sp == "") sp = v
		else if (k == "dport" && dp == "") dp = v
	}
	if (src == "" || dst == "" || sp == "" || dp == "") next
	pick(dst, dp, rs); pick("any", dp, rs); pick(dst, "any", rs); pick("any", "any", rs)
}
function pick(d, p, r) { hit(d " " p " " r); hit(d " " p " -") }
function hit(k) { if ((k in want) && !(k in done)) { done[k] = 1; print fam " " k } }
'
