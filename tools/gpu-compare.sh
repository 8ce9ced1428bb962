#!/bin/sh
# gpu-compare.sh [grid|bench|serve] - evidence, on the GPU host, that a change kept the GPU half's
# behaviour: the tree of an earlier commit (BASE_SRC, default build-base-src/, made here with
# `git archive COMMIT | tar -x -C build-base-src`) and this tree are built side by side and run in
# the same call, so the figures compare within one run.
#   grid   build both; this tree's full forward grid (FA_GPU_GRID=full) against the float64
#          reference; the quick benchmark (D=128, S=4096) base/new twice, and D=64 once
#   bench  build both; the whole forward benchmark, base then new (and base again if time allows)
#   serve  build both; this tree's tools/gpu-serve-check.sh (serving tests, start-up, latency,
#          serving benchmark, demo), then the base tree's latency and serving benchmarks
# Logs go to $OUT (default /tmp/fa-gpu-out); the last lines printed are the comparison table.
# Run from the project root after `. .gpu-deps/env.sh`.
set -u
mode=${1:-grid}
OUT=${OUT:-/tmp/fa-gpu-out}
BASE_SRC=${BASE_SRC:-build-base-src}
J=$(nproc 2>/dev/null || echo 4)
mkdir -p "$OUT"
here=$(pwd)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader \
	> "$OUT/env.txt" 2>&1

# build TREE BUILD: everything (the tests and benchmarks of both trees)
build_tree() {
	(cd "$1" && make BUILD="$2" -j"$J" all > "$OUT/build-$(basename "$1").log" 2>&1) ||
		{ tail -30 "$OUT/build-$(basename "$1").log"; exit 1; }
}

bench_pair() { # label quick?
	for side in base new; do
		if [ $side = base ]; then dir=$BASE_SRC; else dir=.; fi
		(cd "$dir" && FA_BENCH_TSV="$OUT/bench-$side-$1.tsv" $2 \
			timeout 280 ./build-gpu/tests/bench/bench_attn_fwd > "$OUT/bench-$side-$1.log" 2>&1) ||
			echo "bench $side $1: exit $?"
	done
}

case $mode in
grid)
	build_tree "$BASE_SRC" build-gpu
	build_tree . build-gpu
	start=$(date +%s)
	FA_GPU_GRID=full FA_COMPILE_THREADS=$J timeout 380 build-gpu/tests/gpu/test_attn_fwd_gpu \
		> "$OUT/grid-full.log" 2>&1
	echo "== full grid: exit $? in $(( $(date +%s) - start ))s"
	grep -E "^FAIL" "$OUT/grid-full.log" | head -20
	grep -E "GPU:|compiled|cases,|worst|PASSED|FAILED|SKIPPED" "$OUT/grid-full.log" | head -20
	bench_pair q128-1 "env FA_BENCH_QUICK=1"
	bench_pair q64-1 "env FA_BENCH_QUICK=1 FA_BENCH_D=64"
	bench_pair q128-2 "env FA_BENCH_QUICK=1"
	;;
bench)
	build_tree "$BASE_SRC" build-gpu
	build_tree . build-gpu
	bench_pair full ""
	;;
serve)
	build_tree "$BASE_SRC" build-gpu
	OUT="$OUT/new" sh tools/gpu-serve-check.sh
	rc=$?
	mkdir -p "$OUT/base"
	for b in bench_latency bench_serving; do
		(cd "$BASE_SRC" && FA_BUILD=build-gpu timeout 150 build-gpu/tests/bench/$b \
			> "$OUT/base/$b.log" 2>&1) || echo "base $b: exit $?"
		echo "== base $b"; tail -n 24 "$OUT/base/$b.log"
	done
	exit $rc
	;;
*)
	echo "usage: $0 grid|bench|serve" >&2; exit 2 ;;
esac
# the comparison: one line per benchmark row, base and new TFLOP/s side by side
python3 - "$OUT" <<'EOF'
import glob, os, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "bench-*.tsv"))):
    side, run = os.path.basename(f)[6:-4].split("-", 1)
    for line in open(f):
        c = line.rstrip("\n").split("\t")
        if len(c) < 8 or c[5] != "chosen":  # label D S causal tile chosen ms TFLOP/s
            continue
        key = tuple(c[:5])
        rows.setdefault(key, {}).setdefault(side, []).append(float(c[-1]))
print("%-60s %-18s %-18s %s" % ("row", "base TFLOP/s", "new TFLOP/s", "new/base"))
for key, v in rows.items():
    b, n = v.get("base", []), v.get("new", [])
    if not b or not n:
        continue
    r = (sum(n) / len(n)) / (sum(b) / len(b))
    print("%-60s %-18s %-18s %.3f" % (" ".join(key)[:60], "/".join("%.1f" % x for x in b),
                                      "/".join("%.1f" % x for x in n), r))
EOF
