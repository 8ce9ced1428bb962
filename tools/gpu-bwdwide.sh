#!/bin/sh
# gpu-bwdwide.sh - one device call for the wgmma backward's wide form (attn_bwd_sm90.cu, head
# dims 136..256; kernels/PERF-NOTES.md): build; test_attn_bwd_gpu's 16-bit sample under the
# defaults, then its wide head dims (136 160 192 200 256) under each FA_WIDE_TESTS entry
# ('|'-separated FA_NVRTC_EXTRA values); bench_attn_bwd on FA_BENCH_SHAPES (default the wide
# rows 3,14,15,16 and row 0) with the planner's first two tiles (FA_BENCH_SWEEP_N=2: the wide
# form against attn_bwd.cu), then each FA_WIDE_VARIANTS entry on FA_WIDE_VSHAPES (default 3);
# last the SDPA anchors of the same run (FA_ANCHORS_D256=1). FA_WIDE_TEST=0 / FA_WIDE_ANCHORS=0
# leave out the default test / the anchors. Logs in $OUT/bw, tarred into
# $OUT/bw.tar.gz after each stage; a summary last. Run from the project root after
# `. .gpu-deps/env.sh`.
set -u
OUT=${OUT:-/tmp/fa-gpu-out}
B=${BUILD:-build-gpu}
L=$OUT/bw
mkdir -p "$L"
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
pack() { tar -C "$OUT" -czf "$OUT/bw.tar.gz" bw; }
vname() { echo "$1" | tr -c 'A-Za-z0-9_\n' '_'; }
export PYTHONUNBUFFERED=1
J=$(nproc 2>/dev/null || echo 4)
{
	date -u +%Y-%m-%dT%H:%M:%SZ
	cat COMMIT 2>/dev/null
	nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
		--format=csv 2>&1
} > "$L/env.txt"
if ! make BUILD="$B" -j"$J" "$B/libfakernels.a" "$B/libfaproto.a" "$B/tests/gpu/test_attn_bwd_gpu" \
	"$B/tests/bench/bench_attn_bwd.o" "$B/tests/helpers/fa_ksettings.o" > "$L/build.log" 2>&1; then
	tail -40 "$L/build.log"; pack; exit 1
fi
cc -o "$B/tests/bench/bench_attn_bwd" "$B/tests/bench/bench_attn_bwd.o" \
	"$B/tests/helpers/fa_ksettings.o" "$B/libfakernels.a" "$B/libfacommon.a" -lpthread -ldl -lm \
	> "$L/link.log" 2>&1 || cat "$L/link.log"
echo "build done at $(el) s"
rc=0
if [ "${FA_WIDE_TEST:-1}" = 1 ]; then
	FA_GPU_GRID_DT="fp16 bf16" FA_GPU_VERBOSE=1 timeout ${FA_TEST_TIMEOUT:-90} \
		"$B/tests/gpu/test_attn_bwd_gpu" > "$L/test.log" 2>&1 || rc=1
	echo "test (defaults) done at $(el) s"
fi
IFS='|'; for v in ${FA_WIDE_TESTS:-}; do
	unset IFS
	FA_NVRTC_EXTRA="$v" FA_GPU_GRID_DT="fp16 bf16" FA_GPU_GRID_D="136 160 192 200 256" \
		FA_GPU_VERBOSE=1 timeout ${FA_VTEST_TIMEOUT:-40} "$B/tests/gpu/test_attn_bwd_gpu" \
		> "$L/test-$(vname "$v").log" 2>&1 || rc=1
	echo "test ($v) done at $(el) s"
done; unset IFS
pack
FA_BENCH_SHAPES=${FA_BENCH_SHAPES:-3,14,15,16,0} FA_BENCH_SWEEP=1 FA_BENCH_SWEEP_N=2 \
	timeout ${FA_BENCH_TIMEOUT:-70} "$B/tests/bench/bench_attn_bwd" > "$L/bench.log" 2>&1 || rc=1
echo "bench done at $(el) s"
IFS='|'; for v in ${FA_WIDE_VARIANTS:-}; do
	unset IFS
	FA_NVRTC_EXTRA="$v" FA_BENCH_SHAPES=${FA_WIDE_VSHAPES:-3} timeout ${FA_VBENCH_TIMEOUT:-30} \
		"$B/tests/bench/bench_attn_bwd" > "$L/vb-$(vname "$v").log" 2>&1
	echo "bench ($v) done at $(el) s"
done; unset IFS
pack
if [ "${FA_WIDE_ANCHORS:-1}" = 1 ]; then
	FA_ANCHORS_SPEED_ONLY=1 FA_ANCHORS_DT=${FA_ANCHORS_DT:-bf16,fp16} FA_ANCHORS_D256=1 \
		timeout ${FA_ANCHORS_TIMEOUT:-60} python3 tools/sdpa_bwd_anchors.py > "$L/anchors.log" \
		2>&1 || echo "anchors: exit $?"
	echo "anchors done at $(el) s"
fi
pack
echo "== summary ($(el) s, rc $rc)"
for f in "$L"/test*.log; do
	[ -f "$f" ] || continue
	echo "-- $(basename "$f")"; grep -E "^FAIL|cases,|worst.*(fp16|bf16) |FAILED|PASSED" "$f" | head -12
done
grep -hE "fwd\+bwd|sweep" "$L/bench.log" | cut -c1-200
for f in "$L"/vb-*.log; do
	[ -f "$f" ] && { echo "-- $(basename "$f")"; grep -E "fwd\+bwd|rror" "$f" | cut -c1-200; }
done
grep -sh tflops "$L/anchors.log" | sed 's/"kind": "speed", //' | cut -c1-150
exit $rc
