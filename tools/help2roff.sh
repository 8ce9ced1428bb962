#!/bin/sh
# help2roff.sh IN.in < HELP > OUT - fill a man page template: the line "@OPTIONS@" becomes the
# option list of a program's --help text (as fa-daemon prints it: "  -x, --name ARG   text" with
# continuation lines indented), one .TP entry per option, so the page never drifts from the
# option table. Other lines of IN are copied; @VERSION@ is replaced by $VERSION.
set -eu
in=$1
opts=$(awk '
function esc(s) { gsub(/\\/, "\\e", s); gsub(/-/, "\\-", s); return s }
function flush() { if (have) { print ".TP"; print "\\fB" esc(opt) "\\fR"; if (text != "") print esc(text) } have = 0; text = "" }
/^  +-/ && !/^                    / {
	flush(); have = 1
	# the option words (starting with -), then one argument word (PATH, N, 0|1, auto|0|1),
	# then the description, which a long option has on the next lines only
	n = split($0, w, " "); opt = ""; k = 1
	while (k <= n && w[k] ~ /^-/) { opt = opt (opt == "" ? "" : " ") w[k]; k++ }
	if (k <= n && (w[k] ~ /^[A-Z0-9_]+$/ || w[k] ~ /\|/)) { opt = opt " " w[k]; k++ }
	text = ""
	for (; k <= n; k++) text = text (text == "" ? "" : " ") w[k]
	next
}
/^                    / && have { l = $0; sub(/^ +/, "", l); text = text (text == "" ? "" : " ") l; next }
{ flush() }
END { flush() }
')
while IFS= read -r line || [ -n "$line" ]; do
	if [ "$line" = "@OPTIONS@" ]; then
		printf '%s\n' "$opts"
	else
		printf '%s\n' "$line" | sed "s|@VERSION@|${VERSION:-}|g"
	fi
done < "$in"
