#!/bin/sh
# gpu-check.sh - every check that needs the GPU host, in one call (a device lease is short): build,
# then at once the kernel tests (forward sample, decode, backward sample), the serving tests
# through the real daemon (device and host buffers, asynchronous mode, backward included) and the
# PyTorch check of the Python package; then, alone so that nothing disturbs its timings,
# bench_hostile on the GPU backend (a dead client's cancellation, the drain on SIGTERM, memory).
# Correctness checks run side by side: they share the GPU but compare against float64, not time.
# FA_CHECK_ONLY names a subset of the steps (a re-run after a fix), FA_SKIP_BENCH=1 leaves out
# the benchmark. Logs go to $OUT (default /tmp/fa-gpu-out) as gpu-check.tar.gz. Run from the project root after
# `. .gpu-deps/env.sh`. Exit status 1 when a step failed.
set -u
OUT=${OUT:-/tmp/fa-gpu-out}
L=$OUT/gpu-check
mkdir -p "$L"
J=$(nproc 2>/dev/null || echo 4)
export PYTHONUNBUFFERED=1
{
	date -u +%Y-%m-%dT%H:%M:%SZ
	git rev-parse --short HEAD 2>/dev/null; cat COMMIT 2>/dev/null
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
} > "$L/env.txt"
start=$(date +%s)
if ! make -j"$J" all > "$L/build.log" 2>&1; then
	tail -40 "$L/build.log"; tar -C "$OUT" -czf "$OUT/gpu-check.tar.gz" gpu-check; exit 1
fi
echo "== build: $(( $(date +%s) - start ))s"
# name timeout command...: in the background, its exit status into $L/name.rc; FA_CHECK_ONLY
# ("gpu-async torch", say) runs only the steps it names
bg() {
	name=$1; t=$2; shift 2
	case " ${FA_CHECK_ONLY:-$name} " in *" $name "*) ;; *) return 0 ;; esac
	( s=$(date +%s); timeout "$t" "$@" > "$L/$name.log" 2>&1; r=$?
	  echo "$r $(( $(date +%s) - s ))" > "$L/$name.rc" ) &
}
T=${FA_CHECK_TIMEOUT:-330}
bg fwd-gpu "$T" build/tests/gpu/test_attn_fwd_gpu
bg decode-gpu "$T" build/tests/gpu/test_attn_decode_gpu
bg bwd-gpu "$T" build/tests/gpu/test_attn_bwd_gpu
bg bwd-window-gpu "$T" build/tests/gpu/test_attn_bwd_window_gpu
bg gpu-serving "$T" build/tests/integ/test_gpu_serving
bg gpu-async "$T" build/tests/integ/test_gpu_async
bg torch "$T" python3 python/tests/gpu_torch_check.py
wait
rc=0
for f in "$L"/*.rc; do
	n=$(basename "$f" .rc); set -- $(cat "$f")
	echo "== $n: exit $1 in $2s"
	[ "$1" = 0 ] || rc=1
	grep -E "FAIL|PASSED|SKIPPED|cases,|worst|check failed|overhead|p50" "$L/$n.log" | head -12
done
if [ "${FA_SKIP_BENCH:-0}" != 1 ]; then
	timeout 150 build/tests/bench/bench_hostile --gpu -n 200 > "$L/bench-hostile-gpu.log" 2>&1 ||
		{ echo "== bench_hostile --gpu: exit $?"; rc=1; }
	tail -n 30 "$L/bench-hostile-gpu.log"
fi
echo "== total: $(( $(date +%s) - start ))s"
tar -C "$OUT" -czf "$OUT/gpu-check.tar.gz" gpu-check
exit $rc
