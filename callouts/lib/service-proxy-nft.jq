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
def b: if . == true then "1" else "0" end;
def list: [.[]?] | [length] + .;
def rec($t; $i):
	if ($i | type) == "object" and ($i.Service | type) == "object" then
		$i.Service as $s
		| ($s.IPs? // {}) as $ip
		| (if ($s.SessionAffinity? | type) == "object" and ($s.SessionAffinity.ClientIP? | type) == "object"
		   then ["1", ($s.SessionAffinity.ClientIP.TimeoutSeconds? // 0)] else ["0", 0] end) as $aff
		| [$t, ($s.Namespace? // ""), ($s.Name? // ""), ($s.ExternalTrafficToLocal? | b)] + $aff + [($ip.Headless? | b)]
		  + ($ip.ClusterIPs?.V4? | list) + ($ip.ClusterIPs?.V6? | list)
		  + ([$ip.ExternalIPs?.V4?[]?, $ip.LoadBalancerIPs?.V4?[]?] | list)
		  + ([$ip.ExternalIPs?.V6?[]?, $ip.LoadBalancerIPs?.V6?[]?] | list)
		  + ([$s.Ports?[]? | [(.Name? // ""), (.Protocol? // 0), (.Port? // 0), (.NodePort? // 0), (.TargetPort? // 0)]]
		     | [length] + (add // []))
		  + ([$i.Endpoints?[]? | . as $e
		      | (if ($e.Scopes? | type) == "object" then [($e.Scopes.Internal? | b), ($e.Scopes.External? | b)] else ["1", "1"] end) as $sc
		      | [($e.IPs?.V4?[0]? // ""), ($e.IPs?.V6?[0]? // "")] + $sc
		        + ([$e.PortOverrides?[]? | [(.Name? // ""), (.Port? // 0)]] | [length] + (add // []))]
		     | [length] + (add // []))
		| map(tostring) | @tsv
	else "X" end;
(inputs
	| select(test("^[ \t\r]*$") | not)
	| try (fromjson | if type == "object" and has("Previous") then rec("P"; .Previous) else rec("S"; .) end)
	  catch "X"), "Z"
