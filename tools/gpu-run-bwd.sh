#!/bin/sh
# gpu-run-bwd.sh - what the GPU host runs for the backward kernels, in one call: build, the
# backward planner and NVRTC checks, the backward GPU tests (FA_GPU_GRID, default sample), the
# forward + backward benchmark (FA_BENCH_SWEEP=1 for the tile sweep) and the PyTorch SDPA
# backward anchors of the same run. Logs go to $OUT (default /tmp/fa-gpu-out), tarred into
# $OUT/bwd-logs.tar.gz. Run from the project root after `. .gpu-deps/env.sh`.
set -u
OUT=${OUT:-/tmp/fa-gpu-out}
B=${BUILD:-build-gpu}
L=$OUT/bwd
mkdir -p "$L"
export PYTHONUNBUFFERED=1
J=$(nproc 2>/dev/null || echo 4)
{
	date -u +%Y-%m-%dT%H:%M:%SZ
	git rev-parse --short HEAD 2>/dev/null; cat COMMIT 2>/dev/null
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1
} > "$L/env.txt"
if ! make BUILD="$B" -j"$J" "$B/libfakernels.a" "$B/libfaproto.a" "$B/tests/unit/test_planner_bwd" \
	"$B/tests/gpu/test_attn_bwd_gpu" "$B/tests/bench/bench_attn_bwd.o" "$B/tests/helpers/fa_ksettings.o" > "$L/build.log" 2>&1; then
	tail -40 "$L/build.log"; tar -C "$OUT" -czf "$OUT/bwd-logs.tar.gz" bwd; exit 1
fi
cc -o "$B/tests/bench/bench_attn_bwd" "$B/tests/bench/bench_attn_bwd.o" "$B/tests/helpers/fa_ksettings.o" \
	"$B/libfakernels.a" "$B/libfacommon.a" -lpthread -ldl -lm > "$L/link.log" 2>&1 || cat "$L/link.log"
rc=0
[ -x "$B/tests/unit/test_planner_bwd" ] && "$B/tests/unit/test_planner_bwd" > "$L/planner.log" 2>&1
if [ "${FA_SKIP_TEST:-0}" != 1 ]; then
	FA_GPU_GRID=${FA_GPU_GRID:-sample} timeout ${FA_TEST_TIMEOUT:-150} "$B/tests/gpu/test_attn_bwd_gpu" \
		> "$L/gpu-test.log" 2>&1 || rc=1
	grep -E "^FAIL" "$L/gpu-test.log" | head -30
	grep -E "GPU:|cases,|worst|PASSED|FAILED|SKIPPED|ok  |misaligned|no lse" "$L/gpu-test.log" | head -40
fi
if [ "${FA_SKIP_BENCH:-0}" != 1 ]; then
	FA_BENCH_TSV="$L/bench.tsv" timeout ${FA_BENCH_TIMEOUT:-120} "$B/tests/bench/bench_attn_bwd" \
		> "$L/bench.log" 2>&1 || rc=1
	cat "$L/bench.log"
fi
if [ "${FA_ANCHORS:-1}" = 1 ]; then
	timeout ${FA_ANCHORS_TIMEOUT:-90} python3 tools/sdpa_bwd_anchors.py > "$L/anchors.log" 2>&1 ||
		echo "anchors: exit $? (see anchors.log)"
	cat "$L/anchors.log" | cut -c1-200
fi
tar -C "$OUT" -czf "$OUT/bwd-logs.tar.gz" bwd
rm -rf "$L"
exit $rc
