# json-flat.awk: reads one line of plain JSON into flat arrays, for callouts
# that must not start jq for a small input (awk functions: put this file in
# front of a program).
#
# Why hand-written: jq 1.6 needs 23-30 ms just to start (it compiles its
# builtins each time), more than half of the 50 ms a one-Service change set
# may take end to end (measured, bench/RESULTS.md). So a callout reads a
# small input here and falls back to jq for everything else.
#
# Deliberately narrow: jflat(s) returns 0 (the caller then uses jq) for any
# line that is not printable ASCII, holds a backslash (so no string has an
# escape, and every string is exactly the text between two quotes), a number
# other than an integer of at most 15 digits, a duplicate key, or a top level
# that is not an object. What it accepts it reads as jq does.
#
# Result, for the path P of each value ("$" the line, "$" SUBSEP KEY an
# object's member, "$" SUBSEP N an array's element N, from 0):
#   JT[P]  its type: o (object), a (array), s (string), n (number), t (true),
#          f (false), z (null); absent: no such value
#   J[P]   a string's text or a number's digits
#   JN[P]  the number of members or elements of an object or array
# Keys are printable ASCII, so SUBSEP (\034) never occurs in one.

function jflat(s,   q, n, i) {
	delete J; delete JT; delete JN; delete JTOK; delete JVAL
	jnt = 0
	if (s ~ /[^ -~]/ || index(s, "\\")) return 0
	n = split(s, q, "\"")
	if (n % 2 == 0) return 0
	for (i = 1; i <= n; i++) {
		if (i % 2 == 0) { JTOK[++jnt] = "s"; JVAL[jnt] = q[i] }
		else if (!jlex(q[i])) return 0
	}
	jpos = 1
	if (JTOK[1] != "{" || !jvalue("$")) return 0
	return jpos == jnt + 1
}

# The tokens of a stretch outside strings: punctuation, integers, literals.
function jlex(o,   j, l, c, w) {
	l = length(o)
	for (j = 1; j <= l; j++) {
		c = substr(o, j, 1)
		if (c == " ") continue
		if (index("{}[]:,", c)) { JTOK[++jnt] = c; continue }
		w = c
		while (j < l && index("{}[]:, ", substr(o, j + 1, 1)) == 0) w = w substr(o, ++j, 1)
		if (w == "true") JTOK[++jnt] = "t"
		else if (w == "false") JTOK[++jnt] = "f"
		else if (w == "null") JTOK[++jnt] = "z"
		else if (w ~ /^(0|[1-9][0-9]*)$/ && length(w) <= 15) { JTOK[++jnt] = "n"; JVAL[jnt] = w }
		else return 0
	}
	return 1
}

# The value that starts at token jpos, at path P.
function jvalue(P,   t, key, c) {
	t = JTOK[jpos++]
	if (t == "{") {
		JT[P] = "o"; c = 0
		if (JTOK[jpos] == "}") { jpos++; JN[P] = 0; return 1 }
		for (;;) {
			if (JTOK[jpos] != "s" || JTOK[jpos + 1] != ":") return 0
			key = JVAL[jpos]; jpos += 2
			if ((P SUBSEP key) in JT) return 0
			if (!jvalue(P SUBSEP key)) return 0
			c++
			t = JTOK[jpos++]
			if (t == "}") { JN[P] = c; return 1 }
			if (t != ",") return 0
		}
	}
	if (t == "[") {
		JT[P] = "a"; c = 0
		if (JTOK[jpos] == "]") { jpos++; JN[P] = 0; return 1 }
		for (;;) {
			if (!jvalue(P SUBSEP c)) return 0
			c++
			t = JTOK[jpos++]
			if (t == "]") { JN[P] = c; return 1 }
			if (t != ",") return 0
		}
	}
	if (t == "s" || t == "n") { JT[P] = t; J[P] = JVAL[jpos - 1]; return 1 }
	if (t == "t" || t == "f" || t == "z") { JT[P] = t; return 1 }
	return 0
}
