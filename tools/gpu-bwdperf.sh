#!/bin/sh
# gpu-bwdperf.sh - one device call for the backward's accuracy, deterministic-mode and speed work
# (kernels/PERF-NOTES.md, backward), in this order:
#   build;
#   test:  the GPU test (FA_GPU_GRID, default sample) and, beside it, a second grid when
#          FA_GPU_GRID2 is set (FA_GPU_GRID2_DT narrows it: a shard of the full grid), both in the
#          background while
#   err:   SDPA's errors against float64 with the inputs dumped (FA_ERR_DUMP) and ours on the same
#          inputs (bench_attn_bwd FA_BENCH_ERR_DIR), the defaults and each FA_BWD_ERR_VARIANTS
#          entry (on the cases named FA_BWD_ERR_VONLY, default fp32_d128);
#   bench: then, on a quiet GPU and with the kernels the tests compiled in the disk cache,
#          bench_attn_bwd (FA_BENCH_SHAPES), then each FA_BWD_BENCH_VARIANTS entry ('|'-separated
#          FA_NVRTC_EXTRA values) on FA_BENCH_VSHAPES (default 0,5);
#   FA_BWD_ANCHORS=1: last, the SDPA timings of the same run (tools/sdpa_bwd_anchors.py).
# FA_BWD_STEPS (default "bench test err") picks steps. Logs in $OUT/bp, tarred into
# $OUT/bp.tar.gz; a summary is printed last. Run from the project root after
# `. .gpu-deps/env.sh`.
set -u
OUT=${OUT:-/tmp/fa-gpu-out}
B=${BUILD:-build-gpu}
L=$OUT/bp
mkdir -p "$L"
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
export PYTHONUNBUFFERED=1
J=$(nproc 2>/dev/null || echo 4)
STEPS=${FA_BWD_STEPS:-bench test err}
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
{
	date -u +%Y-%m-%dT%H:%M:%SZ
	cat COMMIT 2>/dev/null
	nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
		--format=csv 2>&1
} > "$L/env.txt"
if ! make BUILD="$B" -j"$J" "$B/libfakernels.a" "$B/libfaproto.a" "$B/tests/gpu/test_attn_bwd_gpu" \
	"$B/tests/bench/bench_attn_bwd.o" "$B/tests/helpers/fa_ksettings.o" > "$L/build.log" 2>&1; then
	tail -40 "$L/build.log"; tar -C "$OUT" -czf "$OUT/bp.tar.gz" bp; exit 1
fi
cc -o "$B/tests/bench/bench_attn_bwd" "$B/tests/bench/bench_attn_bwd.o" \
	"$B/tests/helpers/fa_ksettings.o" "$B/libfakernels.a" "$B/libfacommon.a" -lpthread -ldl -lm \
	> "$L/link.log" 2>&1 || cat "$L/link.log"
echo "build done at $(el) s"
rc=0
vname() { echo "$1" | tr -c 'A-Za-z0-9_\n' '_'; }
pack() { tar -C "$OUT" -czf "$OUT/bp.tar.gz" bp; } # after each stage: a cut-off call keeps it
TP= ; TP2=
if has test; then
	( FA_GPU_GRID=${FA_GPU_GRID:-sample} timeout ${FA_TEST_TIMEOUT:-100} \
		"$B/tests/gpu/test_attn_bwd_gpu" > "$L/gpu-test.log" 2>&1
	  echo "exit $?" >> "$L/gpu-test.log" ) &
	TP=$!
	if [ -n "${FA_GPU_GRID2:-}" ]; then
		( FA_GPU_GRID=$FA_GPU_GRID2 FA_GPU_GRID_DT=${FA_GPU_GRID2_DT:-} \
			timeout ${FA_TEST2_TIMEOUT:-100} "$B/tests/gpu/test_attn_bwd_gpu" \
			> "$L/gpu-test2.log" 2>&1
		  echo "exit $?" >> "$L/gpu-test2.log" ) &
		TP2=$!
	fi
fi
if has err; then
	D=/tmp/fa-err-dump
	rm -rf "$D"
	FA_ERR_DUMP=$D FA_ANCHORS_ERR_ONLY=1 timeout ${FA_ERR_PY_TIMEOUT:-70} \
		python3 tools/sdpa_bwd_anchors.py > "$L/sdpa-err.log" 2>&1 || echo "sdpa errors: exit $?"
	echo "sdpa errors done at $(el) s"
	FA_BENCH_ERR_DIR=$D FA_BENCH_SHAPES=none timeout ${FA_ERR_TIMEOUT:-50} \
		"$B/tests/bench/bench_attn_bwd" > "$L/err-default.log" 2>&1
	echo "ours (defaults) done at $(el) s"
	IFS='|'; for v in ${FA_BWD_ERR_VARIANTS:-}; do
		unset IFS
		FA_NVRTC_EXTRA="$v" FA_BENCH_ERR_DIR=$D FA_BENCH_ERR_ONLY=${FA_BWD_ERR_VONLY:-fp32_d128} \
			FA_BENCH_SHAPES=none timeout ${FA_ERR_VTIMEOUT:-30} \
			"$B/tests/bench/bench_attn_bwd" > "$L/err-$(vname "$v").log" 2>&1
		echo "ours ($v) done at $(el) s"
	done; unset IFS
fi
for p in $TP $TP2; do wait "$p"; done
for f in "$L"/gpu-test*.log; do
	[ -f "$f" ] && { tail -1 "$f" | grep -q "exit 0" || rc=1; }
done
echo "tests done at $(el) s (rc $rc)"
pack
if has bench; then
	FA_BENCH_SHAPES=${FA_BENCH_SHAPES:-} FA_BENCH_TSV="$L/bench.tsv" timeout ${FA_BENCH_TIMEOUT:-60} \
		"$B/tests/bench/bench_attn_bwd" > "$L/bench.log" 2>&1 || rc=1
	echo "bench done at $(el) s"
	IFS='|'; for v in ${FA_BWD_BENCH_VARIANTS:-}; do
		unset IFS
		FA_NVRTC_EXTRA="$v" FA_BENCH_SHAPES=${FA_BENCH_VSHAPES:-0,5} timeout 40 \
			"$B/tests/bench/bench_attn_bwd" > "$L/bench-$(vname "$v").log" 2>&1
		echo "bench ($v) done at $(el) s"
	done; unset IFS
fi
pack
if [ "${FA_BWD_ANCHORS:-0}" = 1 ]; then
	FA_ANCHORS_SPEED_ONLY=1 timeout ${FA_ANCHORS_TIMEOUT:-60} python3 tools/sdpa_bwd_anchors.py \
		> "$L/anchors.log" 2>&1 || echo "anchors: exit $?"
	echo "anchors done at $(el) s"
fi
pack
echo "== summary ($(el) s)"
grep -h '"kind": "error"' "$L/sdpa-err.log" 2>/dev/null | grep fp32 | cut -c1-170
for f in "$L"/err-*.log; do [ -f "$f" ] && { echo "-- $(basename "$f")"; grep "^err" "$f"; }; done
for f in "$L"/gpu-test*.log; do
	[ -f "$f" ] && { echo "-- $(basename "$f")"; grep -E "cases,|worst|FAIL|PASSED|FAILED|of .* cases|exit" "$f" | head -20; }
done
grep -hE "fwd\+bwd|det|forward alone" "$L"/bench*.log 2>/dev/null | cut -c1-190
grep -h tflops "$L/anchors.log" 2>/dev/null | cut -c1-160
exit $rc
