#!/bin/sh
# perf-variants.sh - one device call for kernels/PERF-NOTES.md: the quick benchmark at D=64,
# 128 and 256 for -D variants of the kernel (FA_NVRTC_EXTRA). Logs in $OUT/logs.tgz.
set -u
R=/tmp/pv; rm -rf $R; mkdir -p $R
export BUILD=build-gpu FA_ANCHORS=0 FA_BENCH_TIMEOUT=60 FA_BENCH_BF16=1
for v in "" "-DFA_FOLD=0" "-DFA_SKIP_RESCALE=0" "-DFA_NEGQ=0"; do
	for d in 64 256 128; do
		echo "== variant '$v' D=$d"
		FA_BENCH_D=$d FA_NVRTC_EXTRA="$v" OUT=$R/v sh tools/gpu-run.sh quick 2>&1 | grep -E "^(bf16|fp16|fp32-bf16) .*TFLOP" | grep -v causal
	done
done
tar czf $OUT/logs.tgz -C $R .
