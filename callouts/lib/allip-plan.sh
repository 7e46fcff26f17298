# Shared by kpng-example-allip and kpng-example-allip-nft: sourced, not run.
#
# allip_plan PROG DIR
#   Reads the node-local state (one {"Service":...,"Endpoints":[...]} line per
#   Service) on stdin and writes the desired "all-ip" mapping on stdout, one
#   line per external IP that has at least one local endpoint of its family:
#
#     4 EXTERNAL-IP ENDPOINT-IP [ENDPOINT-IP...]
#     6 EXTERNAL-IP ENDPOINT-IP [ENDPOINT-IP...]
#
#   Every address on stdout has passed a strict literal IPv4/IPv6 check and is
#   written in its canonical form (IPv6 as inet_ntop and iptables-save write
#   it), so the lines hold nothing but [0-9a-f:.] and spaces. Everything else
#   is logged on stderr, prefixed with PROG, and skipped. Returns non-zero
#   (and prints nothing) when jq is missing or the input is not JSON. DIR is a
#   private directory for a scratch file.
#
#   External IPs are the Service's ExternalIPs plus its LoadBalancerIPs (set
#   KPNG_ALLIP_LB_IPS=0 to leave load-balancer IPs out). Endpoints are those
#   with "Local": true; of each, the first address of the family is used (the
#   addresses of one endpoint are interchangeable, as in an EndpointSlice).
#   An external IP claimed by an earlier Service is skipped with a log line.
#
#   jq runs once for the whole state and decides nothing about a state string:
#   it writes one tab-separated record per Service and family (family, name,
#   number of external IPs, external IPs, local endpoint IPs; @tsv escapes
#   tabs, newlines and backslashes, so a string is always exactly one field),
#   and awk decides what is an address. No state string ever reaches a shell
#   word, an eval or a command's option.
#
# The pieces, for a callout that reads the state its own way (the nft one):
#   allip_need_jq PROG   fails, saying so, when jq is missing
#   allip_lb             "true" or "false": whether load-balancer IPs count
#   allip_jq_rows        jq: def allip_rows($i; $lb), the records of one line
#   allip_awk_lib        awk: warn(), shown(), ip4(), ip6(), addr(fam, s)
#   allip_read_changes PROG DIR READER RESHAPE PLANNER [AWK-ARG...]
#                        a per-run change set on stdin, through PLANNER: its
#                        records written by awk (json-flat.awk, json-records.awk,
#                        then the READER file, with the AWK-ARGs) when awk is
#                        sure to read it as jq would, else by RESHAPE (jq) from
#                        the copy awk made (DIR/in); RESHAPE and PLANNER are
#                        commands (shell functions) reading stdin
#                        (warn() prefixes the global "prog")
#   nft_err_told FILE    what nft -i wrote to FILE (its stderr), if anything,
#                        told on stderr, bounded; FILE is then emptied; fails
#                        when there was something

# shellcheck disable=SC2016 # $i, $k, $lb... are jq variables
allip_jq_rows='
def allip_rows($i; $lb):
	("V4", "V6") as $k
	| [ $i.Service?.IPs?.ExternalIPs?[$k]?[]?,
	    if $lb then $i.Service?.IPs?.LoadBalancerIPs?[$k]?[]? else empty end ] as $x
	| select($x != [])
	| [ $i.Endpoints?[]? | select(.Local? == true) | .IPs?[$k]?[0]? | values ] as $e
	| select($e != [])
	| [$k, "\($i.Service?.Namespace?)/\($i.Service?.Name?)", ($x | length)] + $x + $e
	| map(tostring) | @tsv;
'

allip_awk_lib='
	function warn(msg) { printf "%s: %s\n", prog, msg > "/dev/stderr" }
	# A state string, fit for a log line: printable ASCII, at most 100 bytes.
	function shown(s) { gsub(/[^ -~]/, "?", s); return "\"" substr(s, 1, 100) "\"" }
	function dec(s) { return s ~ /^(0|[1-9][0-9]?[0-9]?)$/ && s + 0 <= 255 }
	function ip4(s,   a) {
		if (s !~ /^[0-9.]+$/ || split(s, a, ".") != 4) return 0
		return dec(a[1]) && dec(a[2]) && dec(a[3]) && dec(a[4])
	}
	# The IPv6 literal s written as inet_ntop writes it (RFC 5952: lower case,
	# no leading zeros, the first longest run of two or more zero groups as
	# "::"), or "" if s is not one.
	function ip6(s,   n, a, q, w, h, t, nh, nt, gap, i, d, bb, bl, cb, cl, out) {
		if (s !~ /^[0-9A-Fa-f:.]+$/ || length(s) > 45) return ""
		d = index(s, "::")
		if (d && index(substr(s, d + 1), "::")) return ""
		if (s ~ /^:[^:]/ || s ~ /[^:]:$/) return ""
		n = split(s, a, ":")
		nh = nt = gap = 0
		for (i = 1; i <= n; i++) {
			if (a[i] == "") { gap = 1; continue } # only the one "::" leaves empty fields
			if (i == n && index(a[i], ".")) {
				if (!ip4(a[i])) return ""
				split(a[i], q, ".")
				if (gap) { t[++nt] = sprintf("%x", q[1] * 256 + q[2]); t[++nt] = sprintf("%x", q[3] * 256 + q[4]) }
				else { h[++nh] = sprintf("%x", q[1] * 256 + q[2]); h[++nh] = sprintf("%x", q[3] * 256 + q[4]) }
				continue
			}
			if (a[i] !~ /^[0-9A-Fa-f]+$/ || length(a[i]) > 4) return ""
			out = tolower(a[i]); sub(/^0+/, "", out); if (out == "") out = "0"
			if (gap) t[++nt] = out; else h[++nh] = out
		}
		if (d ? nh + nt > 7 : nh + nt != 8) return ""
		for (i = 1; i <= nh; i++) w[i] = h[i]
		for (; i <= 8 - nt; i++) w[i] = "0"
		for (; i <= 8; i++) w[i] = t[i - 8 + nt]
		bl = cl = 0
		for (i = 1; i <= 8; i++) {
			if (w[i] != "0") { cl = 0; continue }
			if (!cl++) cb = i
			if (cl > bl) { bb = cb; bl = cl }
		}
		if (bl < 2) bl = 0
		# inet_ntop keeps the IPv4 notation for ::a.b.c.d and ::ffff:a.b.c.d
		if (bl && bb == 1 && (bl == 6 || (bl == 5 && w[6] == "ffff"))) {
			return (bl == 6 ? "::" : "::ffff:") int(hex(w[7]) / 256) "." hex(w[7]) % 256 "." int(hex(w[8]) / 256) "." hex(w[8]) % 256
		}
		if (!bl) return w[1] ":" w[2] ":" w[3] ":" w[4] ":" w[5] ":" w[6] ":" w[7] ":" w[8]
		out = ""
		for (i = 1; i < bb; i++) out = out w[i] ":"
		out = (bb == 1 ? "::" : out ":")
		for (i = bb + bl; i <= 8; i++) out = out w[i] (i < 8 ? ":" : "")
		return out
	}
	function hex(h,   v, i) {
		for (i = 1; i <= length(h); i++) v = v * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1
		return v
	}
	# The address s in its canonical form, if it is one of family fam (4 or 6); else "".
	function addr(fam, s) { return fam == 4 ? (ip4(s) ? s : "") : ip6(s) }
	# Whether the canonical address k of family fam is one Kubernetes refuses as
	# an external IP (ValidateNonSpecialIP): unspecified, loopback, link-local
	# or link-local multicast (IPv4-mapped IPv6 addresses as their IPv4 address).
	# DNATed on all ports, 127.0.0.1 would take every loopback connection of the node.
	function allip_special(fam, k,   a, g) {
		if (fam == 4) {
			split(k, a, ".")
			return k == "0.0.0.0" || a[1] == 127 || (a[1] == 169 && a[2] == 254) || (a[1] == 224 && a[2] == 0 && a[3] == 0)
		}
		if (k == "::" || k == "::1") return 1
		if (k ~ /^::ffff:[0-9.]+$/) return allip_special(4, substr(k, 8))
		g = k
		sub(/:.*/, "", g)
		return length(g) == 4 && (g ~ /^fe[89ab]/ || g ~ /^ff.2$/)
	}
'

allip_need_jq() {
	command -v jq >/dev/null 2>&1 && return 0
	printf '%s: jq is missing; nothing changed\n' "$1" >&2
	return 1
}

# jq 1.6's start-up alone takes 23-30 ms, more than half of what a one-Service
# change set may take per run; awk reads up to 128 KiB (json-flat.awk says
# what it leaves to jq; above that size jq reads faster).
allip_read_changes() {
	_allip_prog=$1 _allip_dir=$2 _allip_reader=$3 _allip_reshape=$4 _allip_planner=$5
	shift 5
	LC_ALL=C awk -v copy="$_allip_dir/in" -v out="$_allip_dir/rec" -v max=131072 "$@" \
		-f "${_allip_reader%/*}/json-flat.awk" -f "${_allip_reader%/*}/json-records.awk" -f "$_allip_reader" 3>&- 5>&- 6<&-
	case $? in
	0) "$_allip_planner" <"$_allip_dir/rec" ;;
	3) "$_allip_reshape" <"$_allip_dir/in" | "$_allip_planner" ;;
	*)
		printf '%s: cannot read the change set; nothing changed\n' "$_allip_prog" >&2
		return 1
		;;
	esac
}

allip_lb() {
	case ${KPNG_ALLIP_LB_IPS:-1} in
	0 | false | no) echo false ;;
	*) echo true ;;
	esac
}

allip_plan() {
	_allip_prog=$1
	allip_need_jq "$_allip_prog" || return 1
	_allip_lb=$(allip_lb)
	_allip_raw=$2/allip-plan.tsv
	if ! jq -r --argjson lb "$_allip_lb" "$allip_jq_rows"' . as $i | allip_rows($i; $lb)' >"$_allip_raw"; then
		printf '%s: cannot read the state as JSON lines; nothing changed\n' "$_allip_prog" >&2
		return 1
	fi
	awk -v prog="$_allip_prog" "$allip_awk_lib"'
	BEGIN { FS = "\t" }
	$1 != "V4" && $1 != "V6" || $3 !~ /^[0-9]+$/ { next }
	{
		fam = $1 == "V4" ? 4 : 6
		name = shown($2)
		last = $3 + 3
		eps = ""
		delete seen
		for (i = last + 1; i <= NF; i++) {
			k = addr(fam, $i)
			if (k == "") { warn(name ": skipping local endpoint " shown($i) ": not a literal IPv" fam " address"); continue }
			if (k in seen) continue
			seen[k] = 1
			eps = eps " " k
		}
		for (i = 4; i <= last; i++) {
			k = addr(fam, $i)
			if (k == "") { warn(name ": skipping external IP " shown($i) ": not a literal IPv" fam " address"); continue }
			if (allip_special(fam, k)) { warn(name ": skipping external IP " shown(k) ": unspecified, loopback or link-local"); continue }
			if (eps == "") continue
			if ((fam, k) in owner) {
				if (owner[fam, k] != name) warn(name ": skipping external IP " k ": already used by " owner[fam, k])
				continue
			}
			owner[fam, k] = name
			print fam " " k eps
		}
	}' "$_allip_raw"
}

# allip_full_only PROG: succeeds for a full state per run; else says why on
# stderr and fails (the iptables callouts rebuild their chains from the whole
# state each run: a change set applied as a state would drop the rules of
# every Service it leaves out, frames are no state at all, and an input kind
# of a later contract is not taken for a full state).
allip_full_only() {
	case ${KPNG_CALLOUT_INPUT:-full}/${KPNG_CALLOUT_MODE:-} in
	changes/*)
		printf '%s: a change set (KPNG_CALLOUT_INPUT=changes) cannot be applied: this callout needs the full state each run (kpng-callout without --changes); nothing changed\n' "$1" >&2
		return 1
		;;
	*/persistent)
		printf '%s: cannot run as a persistent callout (KPNG_CALLOUT_MODE=persistent; kpng-callout without --persistent); nothing changed\n' "$1" >&2
		return 1
		;;
	full/*) ;;
	*)
		printf '%s: KPNG_CALLOUT_INPUT must be full (or unset); nothing changed\n' "$1" >&2
		return 1
		;;
	esac
}

# nft_err_told FILE: what nft -i wrote to FILE (its stderr, opened for
# appending), if anything, as at most 30 lines of at most 300 characters on
# stderr; FILE is then emptied (nft's next error starts at 0). Fails when
# there was something. nft echoes the whole command under each error (a
# one-line transaction of a re-list can be megabytes) and marks the failing
# part with a caret line: of those two, a window of 240 characters around the
# first caret is shown, so that the failing element is what is seen.
# `test -s`, not `wc -c`: no process for a callout's every frame.
nft_err_told() {
	[ -s "$1" ] || return 0
	LC_ALL=C awk '
		n >= 30 { exit }
		/^[ \t^~]*\^/ && held != "" {
			c = index($0, "^"); s = c > 120 ? c - 120 : 1
			print (s > 1 ? "..." : "") substr(held, s, 240); print (s > 1 ? "   " : "") substr($0, s, 240)
			held = ""; n += 2; next
		}
		held != "" { print substr(held, 1, 300); n++ }
		{ held = $0 }
		END { if (held != "" && n < 30) print substr(held, 1, 300) }' "$1" >&2
	: >"$1"
	return 1
}
