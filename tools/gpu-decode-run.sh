#!/bin/sh
# gpu-decode-run.sh - what the GPU host runs for the decode kernels, in one call: build, the
# decode NVRTC checks, the decode GPU tests, the forward's GPU test (sample: its Sq = 1 cases now
# take the decode path), the decode benchmark (with the prefill kernel on the same shapes) and
# the SDPA decode anchors of the same run. Logs under $OUT, tarred into $OUT/decode-logs.tgz.
# Run from the project root after `. .gpu-deps/env.sh`.
set -u
OUT=${OUT:-/tmp/fa-gpu-out}
B=${BUILD:-build-gpu}
L="$OUT/logs"
mkdir -p "$L"
export PYTHONUNBUFFERED=1
J=$(nproc 2>/dev/null || echo 4)
{
	date -u +%Y-%m-%dT%H:%M:%SZ
	git rev-parse --short HEAD 2>/dev/null; cat .commit 2>/dev/null
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1
} > "$L/env.txt"
if ! make BUILD="$B" -j"$J" "$B/libfakernels.a" "$B/libfaproto.a" "$B/libfacommon.a" \
	"$B/tests/unit/test_nvrtc_decode" "$B/tests/gpu/test_attn_decode_gpu" \
	"$B/tests/gpu/test_attn_fwd_gpu" "$B/tests/bench/bench_attn_decode.o" \
	"$B/tests/helpers/fa_ksettings.o" > "$L/build.log" 2>&1; then
	tail -40 "$L/build.log"; tar -czf "$OUT/decode-logs.tgz" -C "$OUT" logs; exit 1
fi
cc -o "$B/tests/bench/bench_attn_decode" "$B/tests/bench/bench_attn_decode.o" \
	"$B/tests/helpers/fa_ksettings.o" "$B/libfakernels.a" "$B/libfaproto.a" "$B/libfacommon.a" \
	-lpthread -ldl -lm >> "$L/build.log" 2>&1 || { tail -20 "$L/build.log"; }
rc=0
FA_COMPILE_THREADS=$J timeout 60 "$B/tests/unit/test_nvrtc_decode" > "$L/nvrtc-decode.log" 2>&1 || rc=1
grep -E "splits of|bad|PASSED|FAILED|<--" "$L/nvrtc-decode.log" | head -12
timeout ${FA_TEST_TIMEOUT:-75} "$B/tests/gpu/test_attn_decode_gpu" > "$L/gpu-decode.log" 2>&1 || rc=1
grep -E "^FAIL|prepare:" "$L/gpu-decode.log" | head -30
grep -E "GPU:|compiled|cases,|worst|PASSED|FAILED|SKIPPED" "$L/gpu-decode.log" | head -16
FA_BENCH_TSV="$L/bench-decode.tsv" timeout 90 "$B/tests/bench/bench_attn_decode" > "$L/bench-decode.log" 2>&1 || rc=1
cat "$L/bench-decode.log"
OUT="$L" timeout 50 python3 tools/sdpa_decode_anchors.py > "$L/anchors-decode.log" 2>&1 || echo "anchors: exit $?"
grep -E "device|ceiling" "$L/anchors-decode.log"
python3 - "$L/anchors-decode.log" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print("%-16s %-9s %s" % (r["shape"], r["bk"], ("%8.1f us %5.2f TB/s %s" % (r["us"], r["tbs"], r["how"])) if "us" in r else r.get("err")))
PY
if [ "${FA_FWD_TEST:-1}" = 1 ]; then
	timeout ${FA_FWD_TIMEOUT:-90} "$B/tests/gpu/test_attn_fwd_gpu" > "$L/gpu-fwd.log" 2>&1 || rc=1
	grep -E "^FAIL" "$L/gpu-fwd.log" | head -10
	grep -E "cases,|worst|PASSED|FAILED" "$L/gpu-fwd.log" | head -10
fi
tar -czf "$OUT/decode-logs.tgz" -C "$OUT" logs
exit $rc
