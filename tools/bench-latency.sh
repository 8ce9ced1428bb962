#!/bin/sh
# bench-latency.sh - issue 12's serving figures on the GPU host, in one device call: build, then
# bench_ring alone (nothing else may share the GPU or the host while it times): the legacy daemon
# (--loop-spin-us 0 --prewake-us 0) and the new one (its defaults), each with the ring client and
# the socket client, every figure against its in-process anchor from the same run; then, in the
# time the call has left, the serving tests through tools/gpu-check.sh (gpu-serving gpu-async).
#
#   . .gpu-deps/env.sh && sh tools/bench-latency.sh
#
# BENCH_ARGS: bench_ring's arguments (default "-n 1000 -l 20"); BUDGET_S: the whole call's
# seconds (default 230); SKIP_TESTS=1: the benchmark only. Logs under $OUT (default
# /tmp/fa-gpu-out): build.log, bench-ring.log, gpu-check/. Exit status 1 when a step failed.
set -u
OUT=${OUT:-/tmp/fa-gpu-out}
mkdir -p "$OUT"
start=$(date +%s)
J=$(nproc 2>/dev/null || echo 4)
{
	date -u +%Y-%m-%dT%H:%M:%SZ
	git rev-parse --short HEAD 2>/dev/null; cat COMMIT 2>/dev/null
	nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader 2>&1
} > "$OUT/env.txt"
if ! make -j"$J" all > "$OUT/build.log" 2>&1; then
	tail -40 "$OUT/build.log"
	exit 1
fi
echo "== build: $(( $(date +%s) - start ))s"
rc=0
# shellcheck disable=SC2086 # BENCH_ARGS is a word list
timeout 150 build/tests/bench/bench_ring ${BENCH_ARGS:--n 1000 -l 20} > "$OUT/bench-ring.log" 2>&1 ||
	rc=1
echo "== bench_ring: exit $rc after $(( $(date +%s) - start ))s"
if grep -q '^== bench_ring' "$OUT/bench-ring.log"; then
	sed -n '/^== bench_ring/,$p' "$OUT/bench-ring.log"
else
	tail -30 "$OUT/bench-ring.log"
fi
left=$(( ${BUDGET_S:-230} - ($(date +%s) - start) - 15 ))
if [ "${SKIP_TESTS:-0}" != 1 ] && [ "$left" -ge 45 ]; then
	OUT=$OUT FA_CHECK_ONLY="gpu-serving gpu-async" FA_SKIP_BENCH=1 FA_CHECK_TIMEOUT=$left \
		sh tools/gpu-check.sh || rc=1
else
	echo "== serving tests: skipped (${left}s left of the call)"
fi
echo "== total: $(( $(date +%s) - start ))s"
exit $rc
