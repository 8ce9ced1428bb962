#!/bin/sh
# gpu-paged-run.sh - what the GPU host runs for the decode kernel over the inference layouts
# (kernels/gpu_infer.c), in one call: build; side by side the inference GPU test
# the SDPA decode anchors of the issue's shapes, alone; side by side the inference GPU test
# (test_attn_infer_gpu), the daemon's end-to-end inference test on its GPU backend
# (test_gpu_infer) and the dense decode's GPU test (test_attn_decode_gpu: the kernel it shares);
# then alone the paged benchmark (bench_attn_paged, FA_BENCH_SWEEP=1 unless set). Logs under $OUT, tarred into
# $OUT/paged-logs.tgz. Run from the project root after `. .gpu-deps/env.sh`.
set -u
OUT=${OUT:-/tmp/fa-gpu-out}
L="$OUT/logs"
mkdir -p "$L"
export PYTHONUNBUFFERED=1
J=$(nproc 2>/dev/null || echo 4)
{
	date -u +%Y-%m-%dT%H:%M:%SZ
	git rev-parse --short HEAD 2>/dev/null; cat COMMIT 2>/dev/null
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1
} > "$L/env.txt"
start=$(date +%s)
if ! make -j"$J" all > "$L/build.log" 2>&1; then
	tail -40 "$L/build.log"; tar -czf "$OUT/paged-logs.tgz" -C "$OUT" logs; exit 1
fi
echo "== build: $(( $(date +%s) - start ))s"
# the anchors first, alone (the tests side by side would disturb their timings); FA_SKIP_ANCHORS=1
# leaves them out (a re-run of the kernels' side)
[ "${FA_SKIP_ANCHORS:-0}" = 1 ] || FA_DECODE_ANCHORS_ONLY=issue OUT="$L" timeout ${FA_ANCHORS_TIMEOUT:-35} python3 tools/sdpa_decode_anchors.py \
	> "$L/anchors-decode.log" 2>&1 || echo "anchors: exit $?"
grep -E "device|ceiling" "$L/anchors-decode.log"
python3 - "$L/anchors-decode.log" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print("%-16s %-9s %s" % (r["shape"], r["bk"], ("%8.1f us %5.2f TB/s %s" % (r["us"], r["tbs"], r["how"])) if "us" in r else r.get("err")))
PY
echo "== anchors: $(( $(date +%s) - start ))s"
T=${FA_TEST_TIMEOUT:-70}
rc=0
( timeout "$T" build/tests/gpu/test_attn_infer_gpu > "$L/infer-gpu.log" 2>&1; echo $? > "$L/infer-gpu.rc" ) &
( timeout "$T" build/tests/integ/test_gpu_infer > "$L/gpu-infer.log" 2>&1; echo $? > "$L/gpu-infer.rc" ) &
( timeout "$T" build/tests/gpu/test_attn_decode_gpu > "$L/decode-gpu.log" 2>&1; echo $? > "$L/decode-gpu.rc" ) &
wait
echo "== tests: $(( $(date +%s) - start ))s"
for n in infer-gpu gpu-infer decode-gpu; do
	echo "== $n: exit $(cat "$L/$n.rc")"
	[ "$(cat "$L/$n.rc")" = 0 ] || rc=1
	grep -E "^FAIL|^cpu FAIL|check failed|cases,|worst|PASSED|FAILED|SKIPPED|relative error|page_table" "$L/$n.log" | head -24
done
FA_BENCH_SWEEP=${FA_BENCH_SWEEP:-1} FA_BENCH_TSV="$L/bench-paged.tsv" timeout ${FA_BENCH_TIMEOUT:-50} \
	build/tests/bench/bench_attn_paged > "$L/bench-paged.log" 2>&1 || { echo "bench: exit $?"; rc=1; }
cat "$L/bench-paged.log"
echo "== total: $(( $(date +%s) - start ))s"
tar -czf "$OUT/paged-logs.tgz" -C "$OUT" logs
exit $rc
