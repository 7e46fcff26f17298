# service-proxy-nft: the planner's input loop (the planning itself is in
# service-proxy-nft.awk). Reads the records of service-proxy-nft.jq.
#
# Per run (framed 0): one state, of kind `input`, planned once stdin was read
# to its end; exit 0 when planned (the script is `script`, unless a change
# set changes nothing), 1 when the state does not read (nothing planned).
#
# Persistent (framed 1): frames, each an F record (its input kind and Seq),
# its records and an E record. Each frame is planned at its E and told to
# the callout's frame loop as one line on stdout (flushed):
#   apply KIND SEQ   the script is `script`.SEQ (a full one: its elements in
#                    eldir/SEQ.*), the conntrack deletions `ctfile`.SEQ
#   ok               nothing to apply (a change set that changes nothing)
#   error WHY        the frame does not read; nothing is applied
#   end              (last) all of the input was read
# A full frame first lists the kernel's sets udp4/udp6 (`oldudp`), which the
# runner allows: it sends a frame only once the one before was acknowledged.
# Variables: prog, table, framed, input (per run), dry, script, ctfile,
# oldudp, eldir.

BEGIN {
	FS = "\t"
	M = 4294967296
	T = "inet " table
	PR[1] = "tcp"; PR[2] = "udp"; PR[3] = "sctp"
	base_script = script; base_ct = ctfile
	if (!framed) start_frame(input, "")
}
$1 == "Z" { zseen = 1; next }
framed && $1 == "F" {
	if (inframe) { if (bad == "") bad = "a frame header inside a frame"; next }
	if (NF == 3 && ($2 == "full" || $2 == "changes") && $3 ~ /^[0-9]+$/ && length($3) <= 15) start_frame($2, $3)
	else { start_frame("", ""); bad = "a frame header without a numeric Seq and an Input of full or changes" }
	next
}
framed && $1 == "E" {
	if (!inframe) reply("error an empty line outside a frame")
	else end_frame()
	next
}
framed && !inframe { start_frame("", ""); bad = "a frame that does not start with a Frame header" }
$1 == "X" { if (bad == "") bad = "cannot read the state: a line that is not a JSON Service line"; next }
$1 == "S" || $1 == "P" {
	if (bad != "") next
	if (input == "full") { if ($1 == "S") full_service($0); else bad = "a Previous line in a full state" }
	else rec[++nrec] = $0
	next
}
{ if (bad == "") bad = "cannot read the state" }
END {
	# persistent: a frame cut short by the end of input is not applied; "end"
	# tells the frame loop that all of the input was read
	if (framed) { if (zseen) reply("end"); exit zseen ? 0 : 1 }
	if (!zseen && bad == "") bad = "the state was not read to its end"
	if (bad != "") { warn(bad "; nothing changed"); exit 1 }
	plan_end()
	if (bad != "") { warn(bad "; nothing changed"); exit 1 }
	exit 0
}

function plan_end() { if (input == "full") full_end(); else changes() }

# A new state (a frame, or the run's only one): everything of the last one forgotten.
function start_frame(kind, seq) {
	delete pneed; delete G1; delete AOBJ; delete PT; delete PK; delete owner; delete PN; delete PPN
	delete ELORDER; delete ELN; delete rec; delete NEWU; delete NEWR; delete NEWD; delete OLDU
	delete IDS; delete GEN; delete DS; delete DCe; delete DCa; delete AS; delete AC
	delete ADD; delete DEL; delete hpseen; delete fseen; delete dupd; delete PREV
	delete KSEEN; delete HPA; delete CU1; delete CU2; delete CI1; delete CI2; delete cipseen; delete CD1; delete OLDD; HAVEOLD = 0
	nids = naobj = nelm = ng1 = nds = ndca = ndce = nas = nac = nrec = 0
	wrote = 0; bad = ""
	inframe = 1
	input = kind; fseq = seq
	if (framed) {
		fpre = seq "."
		script = base_script "." seq
		ctfile = base_ct "." seq
		if (input == "full" && !dry) {
			oldudp = base_ct ".udp"
			system("{ nft list set " T " udp4; nft list set " T " udp6; } >'" oldudp "' 2>/dev/null </dev/null")
		}
	}
	if (input == "full") read_old_udp()
}
function end_frame(   why) {
	inframe = 0
	if (bad != "") {
		wrote = 0
		warn((fseq != "" ? "frame " fseq ": " : "") bad "; nothing changed")
		why = bad; gsub(/[^ -~]/, "?", why)
		# framed: "fail SEQ WHY", so that the loop removes what the frame wrote (its elements so far)
		return reply(framed ? "fail " (fseq != "" ? fseq : "-") " " why : "error " why)
	}
	plan_end()
	if (bad != "") return end_frame()
	reply(wrote ? "apply " input " " fseq : "ok")
}
function reply(line) { print line; fflush() }
