#!/bin/sh
# gpu-run.sh [test|bench|all] - what the GPU host runs for the forward kernel, in one call:
# build (kernels, planner, tests, benchmark), the planner and NVRTC compile checks, the GPU tests
# (FA_GPU_GRID, default full), the benchmark and the PyTorch SDPA anchors of the same run, and the
# results table. Logs and tables go to $OUT (default /tmp/fa-gpu-out). Run from the project root
# after `. .gpu-deps/env.sh`. Builds only its own targets, so a half-written daemon does not stop it.
set -u
mode=${1:-all}
OUT=${OUT:-/tmp/fa-gpu-out}
B=${BUILD:-build-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
J=$(nproc 2>/dev/null || echo 4)
{
	date -u +%Y-%m-%dT%H:%M:%SZ
	git rev-parse --short HEAD 2>/dev/null; git status --short kernels tests tools 2>/dev/null | head -20
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1
} > "$OUT/env.txt"
if ! make BUILD="$B" -j"$J" "$B/libfakernels.a" "$B/libfaproto.a" "$B/tests/unit/test_planner" \
	"$B/tests/unit/test_nvrtc_compile" "$B/tests/gpu/test_attn_fwd_gpu" \
	"$B/tests/bench/bench_attn_fwd.o" > "$OUT/build.log" 2>&1; then
	tail -40 "$OUT/build.log"; exit 1
fi
# the bench's make rule waits for fa-daemon; it needs only the kernels library
cc -o "$B/tests/bench/bench_attn_fwd" "$B/tests/bench/bench_attn_fwd.o" "$B/libfakernels.a" \
	"$B/libfaproto.a" -lpthread -ldl -lm || exit 1
rc=0
if [ "$mode" = test ] || [ "$mode" = all ]; then
	"$B/tests/unit/test_planner" > "$OUT/planner.log" 2>&1 || { rc=1; tail -20 "$OUT/planner.log"; }
	FA_GPU_GRID=${FA_NVRTC_GRID:-sample} FA_COMPILE_THREADS=$J "$B/tests/unit/test_nvrtc_compile" > "$OUT/nvrtc.log" 2>&1 || rc=1
	grep -E "specialisations|PASSED|FAILED|<--" "$OUT/nvrtc.log" | head -20
	FA_GPU_GRID=${FA_GPU_GRID:-full} timeout ${FA_TEST_TIMEOUT:-330} "$B/tests/gpu/test_attn_fwd_gpu" \
		> "$OUT/gpu-test.log" 2>&1 || rc=1
	grep -E "^FAIL" "$OUT/gpu-test.log" | head -30
	grep -E "GPU:|compiled|cases,|worst|PASSED|FAILED|SKIPPED|ok  " "$OUT/gpu-test.log" | head -24
fi
if [ "$mode" = bench ] || [ "$mode" = all ] || [ "$mode" = quick ]; then
	rm -f "$OUT/bench.tsv"
	[ "$mode" = quick ] && export FA_BENCH_QUICK=1
	FA_BENCH_TSV="$OUT/bench.tsv" timeout ${FA_BENCH_TIMEOUT:-240} "$B/tests/bench/bench_attn_fwd" \
		> "$OUT/bench.log" 2>&1 || rc=1
	cat "$OUT/bench.log"
	if [ "${FA_ANCHORS:-1}" = 1 ]; then
		FA_ANCHORS_FWD_ONLY=1 OUT="$OUT" timeout ${FA_ANCHORS_TIMEOUT:-200} python3 tools/sdpa_anchors.py \
			> "$OUT/anchors.log" 2>&1 || echo "anchors: exit $? (see anchors.log)"
		python3 tools/results_table.py "$OUT" > "$OUT/RESULTS.md" 2>"$OUT/table.err" || cat "$OUT/table.err"
		cat "$OUT/RESULTS.md"
	fi
fi
exit $rc
