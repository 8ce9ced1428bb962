#!/bin/sh
# gpu-bwdwg32.sh - one device call for the fp32 wgmma backward (kernels/attn_bwd_sm90_tf32.cu):
# build; the GPU test's fp32 tf32 / 3xtf32 cases with the kernel forced (FA_WGMMA32_BWD=1,
# every case's tile printed); bench_attn_bwd on FA_BENCH_SHAPES (default: fp32 tf32 D=128, its
# causal form, tf32 and 3xtf32 D=64) with attn_bwd.cu (FA_WGMMA32_BWD=0) and with the new
# kernel (=1), one after the other in the same call; then SDPA mem-efficient's fp32 timings
# (tools/sdpa_bwd_anchors.py). FA_WG32_STEPS (default "test bench anchors") picks steps;
# FA_WG32_EXTRA: FA_NVRTC_EXTRA for a third bench run of the new kernel. Logs in $OUT/wg32.
# Run from the project root after `. .gpu-deps/env.sh`.
set -u
OUT=${OUT:-/tmp/fa-gpu-out}
B=${BUILD:-build-gpu}
L=$OUT/wg32
mkdir -p "$L"
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
export PYTHONUNBUFFERED=1
J=$(nproc 2>/dev/null || echo 4)
STEPS=${FA_WG32_STEPS:-test bench anchors}
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
{
	date -u +%Y-%m-%dT%H:%M:%SZ
	cat COMMIT 2>/dev/null
	nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
		--format=csv 2>&1
} > "$L/env.txt"
if ! make BUILD="$B" -j"$J" "$B/libfakernels.a" "$B/libfaproto.a" "$B/tests/gpu/test_attn_bwd_gpu" \
	"$B/tests/bench/bench_attn_bwd.o" "$B/tests/helpers/fa_ksettings.o" > "$L/build.log" 2>&1; then
	tail -40 "$L/build.log"; exit 1
fi
cc -o "$B/tests/bench/bench_attn_bwd" "$B/tests/bench/bench_attn_bwd.o" \
	"$B/tests/helpers/fa_ksettings.o" "$B/libfakernels.a" "$B/libfacommon.a" -lpthread -ldl -lm \
	> "$L/link.log" 2>&1 || cat "$L/link.log"
echo "built at $(el) s"
rc=0
if has test; then
	FA_WGMMA32_BWD=1 FA_GPU_GRID=${FA_GPU_GRID:-sample} FA_GPU_VERBOSE=1 \
		FA_GPU_GRID_DT=${FA_WG32_DT:-"fp32-3xtf32 fp32-tf32"} \
		timeout ${FA_WG32_TEST_TIMEOUT:-100} "$B/tests/gpu/test_attn_bwd_gpu" > "$L/test.log" 2>&1 ||
		rc=1
	echo "test done at $(el) s (rc $rc)"
	grep -E "^FAIL|GPU:|cases,|worst|PASSED|FAILED|wgmma tile|Error|error" "$L/test.log" | head -40
	grep -c "wg kv64" "$L/test.log" | sed 's/^/cases on the fp32 wgmma tile: /'
fi
if has bench; then
	SH=${FA_BENCH_SHAPES:-8,23,21,22}
	for m in 0 1; do
		FA_WGMMA32_BWD=$m FA_BENCH_SHAPES=$SH FA_BENCH_TSV="$L/bench.tsv" \
			timeout ${FA_WG32_BENCH_TIMEOUT:-50} "$B/tests/bench/bench_attn_bwd" \
			> "$L/bench$m.log" 2>&1 || rc=1
		echo "FA_WGMMA32_BWD=$m (at $(el) s):"; grep -v "^GPU" "$L/bench$m.log"
	done
	if [ -n "${FA_WG32_EXTRA:-}" ]; then
		FA_WGMMA32_BWD=1 FA_NVRTC_EXTRA="$FA_WG32_EXTRA" FA_BENCH_SHAPES=$SH \
			timeout ${FA_WG32_BENCH_TIMEOUT:-50} "$B/tests/bench/bench_attn_bwd" \
			> "$L/bench-x.log" 2>&1 || rc=1
		echo "FA_WGMMA32_BWD=1 FA_NVRTC_EXTRA=$FA_WG32_EXTRA:"; grep -v "^GPU" "$L/bench-x.log"
	fi
fi
if has anchors; then
	FA_ANCHORS_SPEED_ONLY=1 FA_ANCHORS_DT=fp32 timeout ${FA_WG32_ANCHORS_TIMEOUT:-60} \
		python3 tools/sdpa_bwd_anchors.py > "$L/anchors.log" 2>&1 || echo "anchors: exit $?"
	echo "anchors (at $(el) s):"; grep -v "^#" "$L/anchors.log" | cut -c1-160 | head -20
fi
exit $rc
