#!/bin/sh
# gpu-bwdws.sh - one device call for the window and softcap on the wgmma backward
# (attn_bwd_sm90.cu FA_WIN / FA_SOFTCAP; kernels/PERF-NOTES.md): build; test_attn_bwd_gpu's
# 16-bit window and softcap cases (FA_GPU_GRID_WIN=1, every tile printed); bench_attn_bwd's rows
# 17-20 (FA_BENCH_SHAPES: window (1023, 0), softcap 30, both at bf16 D=128 S=4096, both at
# D=256) swept over the planner's first tile and attn_bwd.cu's first (FA_BENCH_SWEEP_N=1), the
# deterministic mode per tile; then the whole 16-bit sample in the time left (FA_BWDWS_LIMIT,
# default 285 s from the start). Logs in $OUT/ws, tarred into $OUT/ws.tar.gz after each stage; a
# summary last. Run from the project root after `. .gpu-deps/env.sh`.
set -u
OUT=${OUT:-/tmp/fa-gpu-out}
B=${BUILD:-build-gpu}
L=$OUT/ws
mkdir -p "$L"
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
pack() { tar -C "$OUT" -czf "$OUT/ws.tar.gz" ws; }
J=$(nproc 2>/dev/null || echo 4)
{
	date -u +%Y-%m-%dT%H:%M:%SZ
	cat COMMIT 2>/dev/null
	nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
		--format=csv 2>&1
} > "$L/env.txt"
if ! timeout ${FA_BUILD_TIMEOUT:-150} make BUILD="$B" -j"$J" "$B/libfakernels.a" "$B/libfaproto.a" \
	"$B/tests/gpu/test_attn_bwd_gpu" "$B/tests/bench/bench_attn_bwd.o" \
	"$B/tests/helpers/fa_ksettings.o" > "$L/build.log" 2>&1; then
	tail -40 "$L/build.log"; pack; exit 1
fi
cc -o "$B/tests/bench/bench_attn_bwd" "$B/tests/bench/bench_attn_bwd.o" \
	"$B/tests/helpers/fa_ksettings.o" "$B/libfakernels.a" "$B/libfacommon.a" -lpthread -ldl -lm \
	> "$L/link.log" 2>&1 || cat "$L/link.log"
echo "build done at $(el) s"
rc=0
FA_GPU_GRID_WIN=1 FA_GPU_GRID_DT="fp16 bf16" FA_GPU_VERBOSE=1 timeout ${FA_WTEST_TIMEOUT:-75} \
	"$B/tests/gpu/test_attn_bwd_gpu" > "$L/test-win.log" 2>&1 || rc=1
echo "test (window, softcap) done at $(el) s"
pack
FA_BENCH_SHAPES=${FA_BENCH_SHAPES:-17,18,19,20} FA_BENCH_SWEEP=1 FA_BENCH_SWEEP_N=1 \
	timeout ${FA_BENCH_TIMEOUT:-80} "$B/tests/bench/bench_attn_bwd" > "$L/bench.log" 2>&1 || rc=1
echo "bench done at $(el) s"
pack
left=$((${FA_BWDWS_LIMIT:-285} - $(el)))
if [ "$left" -gt 20 ]; then
	FA_GPU_GRID_DT="fp16 bf16" FA_GPU_VERBOSE=1 timeout "$left" "$B/tests/gpu/test_attn_bwd_gpu" \
		> "$L/test-16bit.log" 2>&1 || rc=1
	echo "test (16-bit sample) done at $(el) s"
fi
pack
echo "== summary ($(el) s, rc $rc)"
for f in "$L"/test*.log; do
	[ -f "$f" ] || continue
	echo "-- $(basename "$f")"
	grep -E "^FAIL|cases,|worst.*(fp16|bf16) |FAILED|PASSED|GRID" "$f" | head -14
	grep -cE "^ok .*tile bwd wg" "$f" | sed 's/^/wgmma cases ok: /'
done
grep -hE "fwd\+bwd|sweep|rror" "$L/bench.log" | cut -c1-220
exit $rc
