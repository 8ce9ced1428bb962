#!/bin/sh
# gpu-bwddet.sh - one device call for the deterministic backward (issue 10): build, the
# deterministic cases of test_attn_bwd_gpu (wgmma forced for 16-bit 8..128), then det vs atomic
# for issue 10's four shapes on a quiet GPU. Logs in $OUT. After `. .gpu-deps/env.sh`.
set -u
OUT=${OUT:-/tmp/fa-gpu-out}; mkdir -p "$OUT"
B=build-gpu
T0=$(date +%s); el() { echo $(($(date +%s) - T0)); }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv; } > $OUT/env.txt 2>&1
timeout 90 make BUILD=$B -j16 $B/libfakernels.a $B/libfaproto.a $B/tests/gpu/test_attn_bwd_gpu \
	$B/tests/bench/bench_attn_bwd.o $B/tests/helpers/fa_ksettings.o > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
cc -o $B/tests/bench/bench_attn_bwd $B/tests/bench/bench_attn_bwd.o $B/tests/helpers/fa_ksettings.o \
	$B/libfakernels.a $B/libfacommon.a -lpthread -ldl -lm >> $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
echo "build $(el) s"
FA_GPU_GRID_DET=1 FA_WGMMA16_BWD=1 timeout 45 $B/tests/gpu/test_attn_bwd_gpu > $OUT/det-test.log 2>&1
echo "det test exit $? at $(el) s"
grep -E "^FAIL|cases,|worst|PASSED|FAILED|BITS|FAR" $OUT/det-test.log | head -30
grep -c "same bits x5" $OUT/det-test.log
FA_BENCH_SHAPES=0,1,2,4 FA_BENCH_TSV=$OUT/bench.tsv timeout 75 $B/tests/bench/bench_attn_bwd > $OUT/bench.log 2>&1
echo "bench exit $? at $(el) s"
cat $OUT/bench.log | cut -c1-220
