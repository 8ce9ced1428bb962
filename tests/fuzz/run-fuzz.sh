#!/bin/sh
# run-fuzz.sh BINARY SECONDS - run one libFuzzer target for SECONDS on a copy of the seed corpus.
#
# The seeds in tests/fuzz/corpus/ are one valid message of each op (requests and replies), written
# by fa_proto_encode_req/rep; the copy in a temp dir takes what the fuzzer adds, so the tree stays
# clean. Crash, leak and timeout inputs are kept under BINARY's folder in fuzz-artifacts/.
# Exits non-zero when the fuzzer reports anything or leaves an artifact.
set -u
if [ $# -ne 2 ]; then
	echo "usage: $0 BINARY SECONDS" >&2
	exit 2
fi
bin=$1
secs=$2
here=$(cd "$(dirname "$0")" && pwd)
name=$(basename "$bin")
artifacts=$(cd "$(dirname "$bin")" && pwd)/fuzz-artifacts/$name
work=$(mktemp -d "${TMPDIR:-/tmp}/fa-fuzz.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

mkdir -p "$work/corpus" "$artifacts"
cp "$here"/corpus/* "$work/corpus/" || exit 1
before=$(ls "$artifacts" | wc -l)

echo "  FUZZ    $name for ${secs}s (seeds: $(ls "$work/corpus" | wc -l))"
"$bin" -max_total_time="$secs" -max_len=70000 -rss_limit_mb=2048 -timeout=10 \
	-print_final_stats=1 -artifact_prefix="$artifacts/" "$work/corpus" >"$work/log" 2>&1
rc=$?

runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log")
after=$(ls "$artifacts" | wc -l)
if [ $rc -ne 0 ] || [ "$after" -ne "$before" ]; then
	tail -n 60 "$work/log"
	echo "  FAIL    $name: exit $rc, artifacts in $artifacts"
	exit 1
fi
echo "  PASS    $name: ${runs:-?} runs, ${rate:-?} exec/s, corpus grew to $(ls "$work/corpus" | wc -l)"
