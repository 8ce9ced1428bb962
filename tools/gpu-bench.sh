#!/bin/sh
# gpu-bench.sh - the serving benchmarks that print issue 12's and 13's targets against their
# anchors, in one call on the GPU host, one after another (a benchmark never shares the GPU with
# another): bench_priority (a small high-priority request beside 16k prefills), bench_ring
# (async enqueue, tiny request, large request through the daemon), bench_serving (per-request
# overhead, 1/4/8 clients against back-to-back launches and against as many in-process
# processes), python/bench/call_overhead.py --gpu (one Python call over the C call).
# FA_BENCH_ONLY names a subset ("priority ring"); FA_BENCH_TIMEOUT caps each (default 240 s).
# Builds first (make all) unless FA_NO_BUILD=1. Logs go to $OUT (default /tmp/fa-gpu-out) as
# gpu-bench/NAME.log. Run from the project root after `. .gpu-deps/env.sh`. Exit status 1 when a
# benchmark failed outright (a missed target is printed, never a failure).
set -u
OUT=${OUT:-/tmp/fa-gpu-out}
L=$OUT/gpu-bench
mkdir -p "$L"
J=$(nproc 2>/dev/null || echo 4)
export PYTHONUNBUFFERED=1
T=${FA_BENCH_TIMEOUT:-240}
start=$(date +%s)
if [ "${FA_NO_BUILD:-0}" != 1 ] && ! make -j"$J" all > "$L/build.log" 2>&1; then
	tail -40 "$L/build.log"; exit 1
fi
rc=0
step() { # name command...
	name=$1; shift
	case " ${FA_BENCH_ONLY:-$name} " in *" $name "*) ;; *) return 0 ;; esac
	s=$(date +%s)
	timeout "$T" "$@" > "$L/$name.log" 2>&1
	r=$?
	echo "== $name: exit $r in $(( $(date +%s) - s ))s"
	[ $r -eq 0 ] || rc=1
	# the figures: everything after the benchmark's own "==" header, or the tail
	if grep -q "^== " "$L/$name.log"; then sed -n '/^== /,$p' "$L/$name.log" | head -60
	else tail -n 25 "$L/$name.log"; fi
}
step priority build/tests/bench/bench_priority -t "${FA_PRIORITY_SECONDS:-3}"
step ring build/tests/bench/bench_ring -n "${FA_RING_N:-1000}" -l "${FA_RING_L:-60}"
step serving build/tests/bench/bench_serving -n "${FA_SERVING_N:-1000}" -t 2
step python python3 python/bench/call_overhead.py --gpu
echo "== total: $(( $(date +%s) - start ))s"
exit $rc
