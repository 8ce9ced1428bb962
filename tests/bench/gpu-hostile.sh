#!/bin/sh
# gpu-hostile.sh - issue 14 / issue 12 item 2 on the GPU host, in one call: build, the GPU
# backend's tests (serving, asynchronous mode, queues), the CPU-side hostile tests, then
# bench_hostile on the GPU backend and on the CPU backend. Logs and figures go to OUT (default
# ./hostile-out), tarred into hostile.tar.gz there.
#   cd <tree> && . ../.gpu-deps/env.sh && sh tests/bench/gpu-hostile.sh [OUT]
set -u
out=${1:-${OUT:-./hostile-out}}
mkdir -p "$out"
log="$out/hostile.log"
{
	echo "== build"; make -j16 all 2>&1 | tail -5
	echo "== tests"
	sh tests/run.sh build build/tests/daemon/test_gpu_queue build/tests/daemon/test_backend_cpu \
		build/tests/integ/test_gpu_serving build/tests/integ/test_gpu_async \
		build/tests/integ/test_hostile build/tests/integ/test_client_death 2>&1 | tail -12
	echo "== bench_hostile --gpu"; timeout 200 build/tests/bench/bench_hostile --gpu -n 300 2>&1
	echo "== bench_hostile (cpu)"; timeout 120 build/tests/bench/bench_hostile -n 300 2>&1
} > "$log" 2>&1
cp build/test-logs/*.log "$out/" 2>/dev/null
(cd "$out" && tar czf hostile.tar.gz *.log)
tail -30 "$log"
