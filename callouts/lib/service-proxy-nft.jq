# service-proxy-nft: reshapes each state line into one tab-separated record
# (jq -nrR, one input line at a time). It decides nothing: every value is
# passed on as a string (@tsv escapes tabs, newlines and backslashes, so one
# state string is always exactly one field) and awk checks them all.
#
# Record: TYPE NS NAME ETPLOCAL AFFINITY TIMEOUT HEADLESS
#         nC4 C4... nC6 C6... nX4 X4... nX6 X6...        (X = ExternalIPs + LoadBalancerIPs)
#         nPORTS [NAME PROTO PORT NODEPORT TARGETPORT]...
#         nEPS [IP4 IP6 INTERNAL EXTERNAL nOVR [NAME PORT]...]...
# TYPE is S (a Service line) or P (a {"Previous":...} line); "X" for a line
# that is not JSON or not a Service, "Z" once stdin was read to its end.
# Persistent ($framed true), also "F INPUT SEQ" for a frame header and "E"
# for the empty line that ends a frame.
#
# Speed (jq 1.6, 10,000 Services x 10 endpoints, 18 MB): one array built from
# generators and written by @tsv takes 3 s where concatenated arrays and
# map(tostring) took 5 s. @tsv refuses an object or array inside a record, so
# a line with one is written again the slow way (`$slow`: tostring turns it
# into text, which awk then refuses as it refuses any bad value); a count is
# that of the values written after it (`n`: objects and arrays only).
def b: if . == true then "1" else "0" end;
def n: if type == "array" or type == "object" then length else 0 end;
# A number field: a number as it is, none (null, false) as 0, anything else
# as its JSON text, which awk's checks then refuse and log (a string "83" is
# not a port: only numbers from the state are used, as the iptables callout).
def int: if type == "number" then . elif . == null then 0 else tojson end;
# A port's TargetPort, or N: none, its target named (TargetPortName; see plan()).
def tport: if ((.TargetPort? // 0) == 0) and ((.TargetPortName? | type) == "string") and .TargetPortName != "" then "N" else (.TargetPort? // null | int) end;
def rec($t; $i; $slow):
	if ($i | type) == "object" and ($i.Service | type) == "object" then
		$i.Service as $s
		| ($s.IPs? // {}) as $ip
		| ($ip.ClusterIPs?.V4? // []) as $c4 | ($ip.ClusterIPs?.V6? // []) as $c6
		| [$ip.ExternalIPs?.V4?[]?, $ip.LoadBalancerIPs?.V4?[]?] as $x4
		| [$ip.ExternalIPs?.V6?[]?, $ip.LoadBalancerIPs?.V6?[]?] as $x6
		| ($s.Ports? // []) as $ports
		| ($i.Endpoints? // []) as $eps
		| [$t, ($s.Namespace? // ""), ($s.Name? // ""), ($s.ExternalTrafficToLocal? | b),
		   (if ($s.SessionAffinity? | type) == "object" and ($s.SessionAffinity.ClientIP? | type) == "object"
		    then "1", ($s.SessionAffinity.ClientIP.TimeoutSeconds? // null | int) else "0", 0 end),
		   ($ip.Headless? // false | b),
		   ($c4 | n), $c4[]?, ($c6 | n), $c6[]?, ($x4 | length), $x4[], ($x6 | length), $x6[],
		   ($ports | n), ($ports[]? | (.Name? // ""), (.Protocol? // null | int), (.Port? // null | int), (.NodePort? // null | int), tport),
		   ($eps | n), ($eps[]? | (.IPs?.V4?[0]? // ""), (.IPs?.V6?[0]? // ""),
		      ((.Scopes? // null) as $sc | if ($sc | type) == "object" then ($sc.Internal | b), ($sc.External | b) else "1", "1" end),
		      ((.PortOverrides? // []) | n), (.PortOverrides?[]? | (.Name? // ""), (.Port? // null | int)))]
		| if $slow then map(tostring) else . end | @tsv
	else "X" end;
# A number field of frec (after `// 0`: none is 0, as int): the number as it is, else an error.
def fnum: if type == "number" then . else error end;
# The same record, faster (10,000 Services: 1.25-1.35 CPU-s where rec takes
# 1.5-2.0, jq 1.6): no `?`, few function calls. It errors, rather than
# differ from rec, on any value of a type rec treats apart (a number field
# that is not a number, null or false; a list that is neither an array, an
# object nor null: `[]`...), and the line is then written by rec. A number is
# passed as it is, not through arithmetic (which would write -0 as 0, and
# 80.0 as 80 in jq 1.7, which keeps literals). Used when $fast (the callout
# always; a test compares the two).
def frec($t; $i):
	if ($i.Service | type) == "object" then
		$i.Service as $s
		| ($s.IPs // {}) as $ip
		| ($ip.ClusterIPs.V4 // []) as $c4 | ($ip.ClusterIPs.V6 // []) as $c6
		| [($ip.ExternalIPs.V4 // [])[], ($ip.LoadBalancerIPs.V4 // [])[]] as $x4
		| [($ip.ExternalIPs.V6 // [])[], ($ip.LoadBalancerIPs.V6 // [])[]] as $x6
		| [$t, ($s.Namespace // ""), ($s.Name // ""), (if $s.ExternalTrafficToLocal == true then "1" else "0" end),
		   ($s.SessionAffinity | if . == null then "0", 0 else (.ClientIP | if . == null then "0", 0 else "1", (.TimeoutSeconds // 0 | fnum) end) end),
		   (if $ip.Headless == true then "1" else "0" end),
		   ($c4 | length), $c4[], ($c6 | length), $c6[], ($x4 | length), $x4[], ($x6 | length), $x6[],
		   (($s.Ports // []) | length, (.[] | (.Name // ""), (.Protocol // 0 | fnum), (.Port // 0 | fnum), (.NodePort // 0 | fnum),
		      (if ((.TargetPort // 0) == 0) and (.TargetPortName | type) == "string" and .TargetPortName != "" then "N" else (.TargetPort // 0 | fnum) end))),
		   (($i.Endpoints // []) | length, (.[] | (.IPs | (.V4[0] // ""), (.V6[0] // "")),
		      (.Scopes | if . == null then "1", "1" else (if .Internal == true then "1" else "0" end), (if .External == true then "1" else "0" end) end),
		      ((.PortOverrides // []) | length, (.[] | (.Name // ""), (.Port // 0 | fnum)))))]
		| @tsv
	else "X" end;
def line($slow):
	if type == "object" and has("Previous") then rec("P"; .Previous; $slow) else rec("S"; .; $slow) end;
def fline: if type == "object" and has("Previous") then frec("P"; .Previous) else frec("S"; .) end;
# Persistent ($framed): a Frame header is "F INPUT SEQ", the empty line that
# ends a frame "E".
(inputs
	| if $framed and . == "" then "E"
	  elif test("^[ \t\r]*$") then empty
	  else (try (fromjson | if $framed and type == "object" and has("Frame")
	             then ["F", (.Frame?.Input? // ""), (.Frame?.Seq? // "")] | map(tostring) | @tsv
	             elif $fast then (. as $l | try fline catch ($l | line(false)))
	             else line(false) end) catch null)
	       // (try (fromjson | line(true)) catch "X")
	  end), "Z"
