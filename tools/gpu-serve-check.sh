#!/bin/sh
# gpu-serve-check.sh - the serving path on a GPU host, in one call: build everything, then the
# GPU serving tests (device and host buffers through the real daemon), the start-up benchmark
# (empty vs warm kernel cache), the latency benchmark, the serving benchmark (daemon against the
# kernel in-process: per-request overhead, throughput of 1/4/8 clients), the demo on the GPU
# backend and the kernel tests' CI sample. Logs go to $OUT (default /tmp/fa-gpu-out). Run from the
# project root after `. .gpu-deps/env.sh`.
set -u
OUT=${OUT:-/tmp/fa-gpu-out}
B=${BUILD:-build-gpu}
J=$(nproc 2>/dev/null || echo 4)
mkdir -p "$OUT"
export FA_BUILD=$B
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt" 2>&1
if ! make -j"$J" BUILD="$B" all > "$OUT/build.log" 2>&1; then
	tail -40 "$OUT/build.log"
	exit 1
fi
rc=0
step() { # name timeout command...
	name=$1; t=$2; shift 2
	start=$(date +%s)
	timeout "$t" "$@" > "$OUT/$name.log" 2>&1
	r=$?
	echo "== $name: exit $r in $(( $(date +%s) - start ))s"
	[ $r -eq 0 ] || rc=1
}
# about 1.5-2.5 min: 1,000 register cycles of 256 MiB, a client killed mid-kernel, the autotuner
step gpu-serving 300 "$B/tests/integ/test_gpu_serving"
grep -E "PASSED|FAILED|SKIPPED|p50|us" "$OUT/gpu-serving.log" | head -12
step gpu-async 200 "$B/tests/integ/test_gpu_async"
grep -E "OK|FAILED|SKIPPED|check failed|per call|canary|stuck|GPU 1" "$OUT/gpu-async.log" | head -24
step bench-startup 90 "$B/tests/bench/bench_startup"
cat "$OUT/bench-startup.log"
step bench-latency 60 "$B/tests/bench/bench_latency"
tail -n 12 "$OUT/bench-latency.log"
step bench-serving 150 "$B/tests/bench/bench_serving"
grep -E "FAILED|skipped" "$OUT/bench-serving.log" | head -8
tail -n 24 "$OUT/bench-serving.log"
step demo 120 sh tests/demo/run-demo.sh "$B"
tail -n 12 "$OUT/demo.log"
step gpu-kernels 90 env FA_GPU_GRID=sample "$B/tests/gpu/test_attn_fwd_gpu"
grep -E "cases,|worst|PASSED|FAILED" "$OUT/gpu-kernels.log" | head -8
exit $rc
