# json-records.awk: the loop of a callout's records reader without jq, for
# a small input (a per-run change set), because jq 1.6's start-up alone
# takes 23-30 ms. Put json-flat.awk in front of it and the reader (which
# defines record(t, R)) after it: service-proxy-nft-records.awk,
# allip-nft-records.awk.
#
# Reads the state lines on stdin, copies each to the file `copy`, and has
# record(t, R) write the record of each to the file `out` ({"Previous":X}
# lines as type "P" from X, others as "S" from the line), "Z" last. Exit 0:
# every line was read here, and `out` holds exactly what the callout's jq
# program would have written. Exit 3: some line is not one it is sure of
# (json-flat.awk refuses it, or record() returns 0: a value of a type other
# than the canonical one or null), or the input is over `max` bytes; then
# `out` is of no use and the caller runs jq on `copy`, which always holds
# the whole input. Variables: copy, out, max.

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
# What jq's `// default` and `?` treat alike: no value, null, or false.
function none(P) { return !(P in JT) || JT[P] == "z" || JT[P] == "f" }

# Typed reads, as the callouts' jq programs read (`// default`, `?`): a
# value of an unexpected type sets rsure = 0 (the caller then leaves the
# input to jq).
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
# The strings of the array P.K (P an object or nothing), each after a tab;
# `jcount` gets their number.
function jlist(P, K) {
	jcount = 0
	if (!jobj(P)) return ""
	return jstrs(P SUBSEP K)
}
