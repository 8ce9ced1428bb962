#!/bin/sh
# gpu-fwdacc.sh - one device call for the fp32 3xtf32 forward's accuracy at long key lengths
# (kernels/PERF-NOTES.md, "The 3xtf32 forward's lse at long key lengths"), in this order:
#   build;
#   test:  test_attn_fwd_gpu's sample (defaults) and its fp32 3xtf32 cases again under
#          FA_ACC_X3S_ENV (default FA_WG_BC=16: X3S, the wgmma forward above head dim 128),
#          then test_attn_bwd_gpu's sample (FA_ACC_BWD_TEST=0: not), in the background while
#   err:   SDPA's errors against float64 with the inputs dumped (tools/sdpa_bwd_anchors.py
#          FA_ERR_DUMP, fp32 only: D=64/128 S=1000, D=128/256 S=4096, full and causal), ours on
#          the same inputs (bench_attn_bwd FA_BENCH_ERR_DIR: forward O / lse errors and the
#          gradients'), the defaults, then every FA_ACC_VARIANTS entry in parallel (separate
#          processes: errors do not depend on timing);
#   bench: on a quiet GPU, bench_attn_fwd FA_BENCH_X3=1 (fp32 3xtf32 D=128/192/256 S=4096) with
#          the defaults and each FA_ACC_BENCH entry, then SDPA mem-efficient's fp32 forward of
#          the same run (sdpa_bwd_anchors.py FA_ANCHORS_FWD=1).
# An entry of FA_ACC_VARIANTS / FA_ACC_BENCH is "NAME;ENV": ENV's assignments separated by
# spaces, a ',' in a value standing for a space (FA_NVRTC_EXTRA=-DFA_A=1,-DFA_B=2); entries
# by '|'. A bench entry's FA_BENCH_X3 may narrow the head dims ("192 256" written 192,256).
# FA_ACC_STEPS (default "test err bench") picks steps. Logs in $OUT/fa, tarred into
# $OUT/fa.tar.gz; a summary is printed last. Run from the project root after
# `. .gpu-deps/env.sh`.
set -u
OUT=${OUT:-/tmp/fa-gpu-out}
B=${BUILD:-build-gpu}
L=$OUT/fa
mkdir -p "$L"
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
export PYTHONUNBUFFERED=1
J=$(nproc 2>/dev/null || echo 4)
STEPS=${FA_ACC_STEPS:-test err bench}
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
pack() { tar -C "$OUT" -czf "$OUT/fa.tar.gz" fa; }
{
	date -u +%Y-%m-%dT%H:%M:%SZ
	cat COMMIT 2>/dev/null
	nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
		--format=csv 2>&1
} > "$L/env.txt"
if ! make BUILD="$B" -j"$J" "$B/libfakernels.a" "$B/libfaproto.a" "$B/tests/gpu/test_attn_bwd_gpu" \
	"$B/tests/gpu/test_attn_fwd_gpu" "$B/tests/bench/bench_attn_fwd" \
	"$B/tests/bench/bench_attn_bwd.o" "$B/tests/helpers/fa_ksettings.o" > "$L/build.log" 2>&1; then
	tail -40 "$L/build.log"; pack; exit 1
fi
cc -o "$B/tests/bench/bench_attn_bwd" "$B/tests/bench/bench_attn_bwd.o" \
	"$B/tests/helpers/fa_ksettings.o" "$B/libfakernels.a" "$B/libfacommon.a" -lpthread -ldl -lm \
	> "$L/link.log" 2>&1 || cat "$L/link.log"
echo "build done at $(el) s"
# with_env "ENV" CMD...: CMD with the entry's assignments exported (',' -> ' ' in each value)
with_env() (
	for w in $1; do export "$(echo "$w" | tr ',' ' ')"; done
	shift
	exec "$@"
)
rc=0
TP=
if has test; then
	( timeout ${FA_TEST_TIMEOUT:-150} "$B/tests/gpu/test_attn_fwd_gpu" > "$L/test-fwd.log" 2>&1
	  echo "exit $?" >> "$L/test-fwd.log"
	  env ${FA_ACC_X3S_ENV:-FA_WG_BC=16} FA_GPU_GRID_DT=fp32-3xtf32 timeout ${FA_TEST_X3S_TIMEOUT:-90} \
		"$B/tests/gpu/test_attn_fwd_gpu" > "$L/test-fwd-x3s.log" 2>&1
	  echo "exit $?" >> "$L/test-fwd-x3s.log"
	  if [ "${FA_ACC_BWD_TEST:-1}" = 1 ]; then
		timeout ${FA_TEST_BWD_TIMEOUT:-120} "$B/tests/gpu/test_attn_bwd_gpu" \
			> "$L/test-bwd.log" 2>&1
		echo "exit $?" >> "$L/test-bwd.log"
	  fi ) &
	TP=$!
fi
if has err; then
	D=/tmp/fa-acc-dump
	rm -rf "$D"
	FA_ERR_DUMP=$D FA_ANCHORS_ERR_ONLY=1 FA_ANCHORS_ERR_DT=fp32 FA_ANCHORS_D256=1 \
		timeout ${FA_ERR_PY_TIMEOUT:-120} python3 tools/sdpa_bwd_anchors.py > "$L/sdpa-err.log" 2>&1 ||
		echo "sdpa errors: exit $?"
	echo "sdpa errors done at $(el) s"
	VP=
	( FA_BENCH_ERR_DIR=$D FA_BENCH_SHAPES=none timeout ${FA_ERR_TIMEOUT:-200} \
		"$B/tests/bench/bench_attn_bwd" > "$L/err-default.log" 2>&1
	  echo "exit $?" >> "$L/err-default.log" ) &
	VP="$VP $!"
	IFS='|'; for v in ${FA_ACC_VARIANTS:-}; do
		unset IFS
		name=${v%%;*}; envs=${v#*;}
		( with_env "FA_BENCH_ERR_DIR=$D FA_BENCH_SHAPES=none $envs" \
			timeout ${FA_ERR_VTIMEOUT:-200} "$B/tests/bench/bench_attn_bwd" \
			> "$L/err-$name.log" 2>&1
		  echo "exit $? ($envs)" >> "$L/err-$name.log" ) &
		VP="$VP $!"
	done; unset IFS
	for p in $VP; do wait "$p"; done
	echo "ours done at $(el) s"
fi
[ -n "$TP" ] && wait "$TP"
for f in "$L"/test-*.log; do
	[ -f "$f" ] && { tail -1 "$f" | grep -q "exit 0" || rc=1; }
done
echo "tests done at $(el) s (rc $rc)"
pack
if has bench; then
	timeout ${FA_BENCH_TIMEOUT:-90} env FA_BENCH_X3=1 "$B/tests/bench/bench_attn_fwd" \
		> "$L/bench-default.log" 2>&1 || rc=1
	echo "bench done at $(el) s"
	IFS='|'; for v in ${FA_ACC_BENCH:-}; do
		unset IFS
		name=${v%%;*}; envs=${v#*;}
		with_env "FA_BENCH_X3=1 $envs" timeout ${FA_BENCH_VTIMEOUT:-60} \
			"$B/tests/bench/bench_attn_fwd" > "$L/bench-$name.log" 2>&1
		echo "bench $name done at $(el) s"
	done; unset IFS
	pack
	FA_ANCHORS_SPEED_ONLY=1 FA_ANCHORS_DT=fp32 FA_ANCHORS_FWD=1 timeout ${FA_ANCHORS_TIMEOUT:-60} \
		python3 tools/sdpa_bwd_anchors.py > "$L/anchors.log" 2>&1 || echo "anchors: exit $?"
	echo "anchors done at $(el) s"
fi
pack
echo "== summary ($(el) s)"
grep -h '"kind": "error"' "$L/sdpa-err.log" 2>/dev/null | cut -c1-300
for f in "$L"/err-*.log; do
	[ -f "$f" ] && { echo "-- $(basename "$f")"; grep -E "^(err|fwd) |exit" "$f"; }
done
for f in "$L"/test-*.log; do
	[ -f "$f" ] && { echo "-- $(basename "$f")"; grep -E "cases|worst|FAIL|PASSED|FAILED|exit" "$f" | head -14; }
done
for f in "$L"/bench-*.log; do
	[ -f "$f" ] && { echo "-- $(basename "$f")"; grep -iE "3xtf32|fp32" "$f" | cut -c1-150 | head -8; }
done
grep -h tflops "$L/anchors.log" 2>/dev/null | cut -c1-200
exit $rc
