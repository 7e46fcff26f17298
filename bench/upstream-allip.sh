#!/bin/sh
# For bench/callouts.js only: a re-creation of the way the retired kpng
# repository's examples/pipe-exec/scripts/kpng-example-allip applies a state,
# to measure it against callouts/kpng-example-allip. Per Service it runs jq
# several times (once over the whole state to pick the Service out, then once
# per value it needs) and one iptables command per rule, each preceded by a
# listing of the chain to see whether the rule is already there.
#
# Like the original it passes state strings unquoted to iptables, never removes
# a rule and writes straight into PREROUTING and OUTPUT: never use it on a
# real node.
set -u
work=$(mktemp -d) || exit 1
trap 'rm -rf -- "$work"' EXIT

jq -s . >"$work/all"
i=0
while :; do
	jq ".[$i]" "$work/all" >"$work/svc"
	grep -q '^null' "$work/svc" && break
	jq .Service.Name "$work/svc"
	for fam in 4 6; do
		if [ "$fam" = 4 ]; then k=V4 cmd=iptables len=32; else k=V6 cmd=ip6tables len=128; fi
		xip=$(jq -r ".Service.IPs.ExternalIPs.$k[0]" "$work/svc")
		[ -n "$xip" ] && [ "$xip" != null ] || continue
		podip=$(jq -r ".Endpoints[]|select(.Local == true)|select(.IPs.$k != null)|.IPs.$k[0]" "$work/svc")
		[ -n "$podip" ] && [ "$podip" != null ] || continue
		for hook in PREROUTING OUTPUT; do
			$cmd -t nat -S $hook | grep -qF "$xip/$len" ||
				$cmd -t nat -A $hook -d $xip/$len -j DNAT --to-destination $podip
		done
	done
	i=$((i + 1))
done
