#!/bin/sh
# run-demo.sh BUILD - `make demo`: fa-daemon on a private socket in a mktemp directory, four client
# processes at once doing checked attention, a table of latencies and rates, a clean stop.
# Extra arguments go to fa_demo (--clients N --requests M --seed S).
set -u
build=${1:-build}
[ $# -gt 0 ] && shift
for f in "$build/fa-daemon" "$build/tests/demo/fa_demo"; do
	if [ ! -x "$f" ]; then
		echo "run-demo: $f is not built (make BUILD=$build all)" >&2
		exit 1
	fi
done
dir=$(mktemp -d /tmp/fa-demo-XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT
trap 'exit 130' INT TERM
FA_BUILD=$build "$build/tests/demo/fa_demo" --dir "$dir" "$@"
