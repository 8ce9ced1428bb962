#!/bin/sh
# perf-variants.sh - one device call for kernels/PERF-NOTES.md: build once, check the variant to
# keep on the GPU test's sample grid, then time -D variants of the kernel (FA_NVRTC_EXTRA) with the
# quick bf16 benchmark at D=64, 128 and 256 (S=4096, both masks), and print a table last.
# Run from the project root after `. .gpu-deps/env.sh`. Environment:
#   FA_KEEP="-D..."      the variant checked for correctness first (default: the source's defaults)
#   FA_VARIANTS="a|b|c"  the variants, '|'-separated ('-' = the defaults); default: the list below
#   FA_PV_DS="64 128 256"  head dims;  FA_PV_LIMIT=170  seconds after which no new timing starts
#   FA_PV_DS0="..."      head dims of the first variant only (default FA_PV_DS): e.g. the defaults
#                        at every dim, the candidates only where they apply
#   FA_PV_TEST=0         skip the correctness check
#   FA_PV_TEST2="FA_GPU_GRID=full FA_GPU_GRID_D=256"  a second check of FA_KEEP with these settings
#                        (pv-test2.log), e.g. every length pair at the head dims a switch acts on
#   FA_PV_TILES="64 128 64 4 2 1|..."  also time these tiles (D BR BC NW RT STAGES; tools/perf-tiles.c)
#                        under each '|'-separated FA_PV_TEXTRA (default: the defaults)
#   FA_PV_ANCHORS=1      PyTorch SDPA flash and cuDNN at the same shapes, in the same run
# Output: $OUT/pv-build.log, $OUT/pv-test.log, $OUT/pv-bench.log, $OUT/pv.tsv (variant, D, causal,
# TFLOP/s), pv-tiles.log, pv-anchors.log; the table is the last thing printed. More than the 8 files
# the device tool brings back: give it OUT=$OUT/pv and tar that folder afterwards.
# Order: build, checks, variants, anchors, tiles (the anchors before the optional tiles).
# Cost on the H200 (v4): sample-grid test 25 s, about 2.5 s per variant and head dim, 4 s per tile
# and mask, anchors 20 s; `FA_BENCH_BF16=1 sh tools/gpu-run.sh bench` (18 shapes and all anchors
# of tools/sdpa_anchors.py) about 40 s more. v5 call: build 1 s (after test_nvrtc_compile's), sample
# grid 29 s, FA_GPU_GRID=full FA_GPU_GRID_D=256 17 s, 7 timings 20 s, anchors 13 s, 2 tiles 10 s.
set -u
OUT=${OUT:-/tmp/fa-gpu-out}
B=${BUILD:-build-gpu}
mkdir -p "$OUT"
T0=$(date +%s)
J=$(nproc 2>/dev/null || echo 4)
el() { echo $(($(date +%s) - T0)); }
{
	date -u +%Y-%m-%dT%H:%M:%SZ
	git rev-parse --short HEAD 2>/dev/null; git status --short kernels tools 2>/dev/null | head -20
	nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>&1
} > "$OUT/pv-env.txt"
if ! make BUILD="$B" -j"$J" "$B/libfakernels.a" "$B/libfaproto.a" "$B/tests/gpu/test_attn_fwd_gpu" \
	"$B/tests/bench/bench_attn_fwd.o" > "$OUT/pv-build.log" 2>&1; then
	tail -40 "$OUT/pv-build.log"; exit 1
fi
cc -o "$B/tests/bench/bench_attn_fwd" "$B/tests/bench/bench_attn_fwd.o" "$B/libfakernels.a" \
	"$B/libfaproto.a" -lpthread -ldl -lm || exit 1
echo "built at $(el) s"
rc=0
if [ "${FA_PV_TEST:-1}" = 1 ]; then
	FA_NVRTC_EXTRA="${FA_KEEP:-}" FA_GPU_GRID=${FA_GPU_GRID:-sample} timeout ${FA_TEST_TIMEOUT:-90} \
		"$B/tests/gpu/test_attn_fwd_gpu" > "$OUT/pv-test.log" 2>&1 || rc=1
	echo "test of '${FA_KEEP:-}' (exit $rc) at $(el) s:"
	grep -E "^FAIL" "$OUT/pv-test.log" | head -10
	grep -E "compiled|cases,|worst|PASSED|FAILED|SKIPPED" "$OUT/pv-test.log" | head -14
	if [ -n "${FA_PV_TEST2:-}" ]; then
		# shellcheck disable=SC2086
		env FA_NVRTC_EXTRA="${FA_KEEP:-}" $FA_PV_TEST2 timeout ${FA_TEST2_TIMEOUT:-60} \
			"$B/tests/gpu/test_attn_fwd_gpu" > "$OUT/pv-test2.log" 2>&1 || rc=1
		echo "second test of '${FA_KEEP:-}' ($FA_PV_TEST2; exit $rc) at $(el) s:"
		grep -E "^FAIL" "$OUT/pv-test2.log" | head -10
		grep -E "GRID_D|compiled|cases,|worst|PASSED|FAILED|SKIPPED" "$OUT/pv-test2.log" | head -14
	fi
fi
# the v4 and v5 switches against the defaults (kernels/PERF-NOTES.md); '-' twice gives the spread
DEF='-|-DFA_PAIR=0|-DFA_QREG=0|-DFA_LDFAST=0|-DFA_ONEBAR=1 -DFA_SADDR=1|-DFA_EARLYRS=1 -DFA_RTHR=8|-'
VARS=${FA_VARIANTS:-$DEF}
: > "$OUT/pv.tsv"
rm -f "$OUT/pv-tiles.log" "$OUT/pv-anchors.log"
: > "$OUT/pv-bench.log"
n=0
IFS='|'
for v in $VARS; do
	IFS=' '
	[ "$v" = - ] && v=
	n=$((n + 1))
	ds=${FA_PV_DS:-64 128 256}
	[ "$n" = 1 ] && ds=${FA_PV_DS0:-$ds}
	for d in $ds; do
		if [ "$(el)" -gt "${FA_PV_LIMIT:-170}" ]; then
			echo "time limit: variant $n '$v' D=$d and later not timed"; break 2
		fi
		echo "== $n '$v' D=$d" >> "$OUT/pv-bench.log"
		FA_BENCH_QUICK=1 FA_BENCH_BF16=1 FA_BENCH_D=$d FA_NVRTC_EXTRA="$v" timeout 40 \
			"$B/tests/bench/bench_attn_fwd" > "$OUT/pv-one.log" 2>&1
		cat "$OUT/pv-one.log" >> "$OUT/pv-bench.log"
		# "bf16 D=128 S= 4096 B= 8 H=16 causal 128x64 w4r2 s2 3.3 ms 332.6 TFLOP/s"
		awk -v n="$n" -v v="$v" -v d="$d" '/TFLOP\/s/ { c = ($0 ~ / causal /) ? "causal" : "-";
			for (i = 1; i <= NF; i++) if ($i == "TFLOP/s") tf = $(i - 1);
			printf "%s\t%s\t%s\t%s\t%s\n", n, v, d, c, tf }' "$OUT/pv-one.log" >> "$OUT/pv.tsv"
	done
	IFS='|'
done
IFS=' '
# FA_PV_ANCHORS=1: PyTorch SDPA flash and cuDNN at the same shapes, same run (as tools/sdpa_anchors.py)
if [ "${FA_PV_ANCHORS:-0}" = 1 ]; then
	PYTHONUNBUFFERED=1 timeout ${FA_PV_ATIMEOUT:-60} python3 - > "$OUT/pv-anchors.log" 2>&1 <<'EOF'
import torch, torch.nn.functional as F, triton.testing as tt
from torch.nn.attention import sdpa_kernel, SDPBackend
print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(0))
for d in (64, 128, 256):
    for causal in (False, True):
        b, h, s = 8, 16, 4096
        q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn_like(q); v = torch.randn_like(q)
        fl = 4 * b * h * s * s * d / (2 if causal else 1)
        for name, bk in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(bk):
                ms = tt.do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                 warmup=50, rep=200, return_mode="median")
            print("anchor D=%d %s %s %.3f ms %.1f TFLOP/s" % (d, "causal" if causal else "-", name, ms, fl / ms / 1e9), flush=True)
EOF
fi
# FA_PV_TILES="D BR BC NW RT ST|...": given tiles, timed under each '|'-separated FA_PV_TEXTRA
if [ -n "${FA_PV_TILES:-}" ]; then
	cc -std=c11 -D_GNU_SOURCE -O2 -Iclient/include -Ikernels -o "$B/perf-tiles" tools/perf-tiles.c \
		"$B/libfakernels.a" "$B/libfaproto.a" "$B/libfacommon.a" -lpthread -ldl -lm || rc=1
	IFS='|'
	for x in ${FA_PV_TEXTRA:--}; do
		[ "$x" = - ] && x=
		if [ "$(el)" -gt "${FA_PV_TLIMIT:-190}" ]; then echo "time limit: tiles under '$x' not timed"; break; fi
		set -f
		# shellcheck disable=SC2086
		FA_NVRTC_EXTRA="$x" timeout 60 "$B/perf-tiles" $FA_PV_TILES > "$OUT/pv-tiles-one.log" 2>&1
		set +f
		sed "s/^/[$x] /" "$OUT/pv-tiles-one.log" >> "$OUT/pv-tiles.log"
	done
	IFS=' '
fi
[ -f "$OUT/pv-tiles.log" ] && cat "$OUT/pv-tiles.log"
[ -f "$OUT/pv-anchors.log" ] && grep -E "anchor|torch|Error" "$OUT/pv-anchors.log"
echo "done at $(el) s; TFLOP/s, bf16 S=4096 (non-causal / causal):"
awk -F'\t' '{ k = $1 "\t" $2; if (!(k in seen)) { seen[k] = 1; order[++m] = k }
	val[k, $3, $4] = $5 }
	END { printf "%-3s %-44s %13s %13s %13s\n", "#", "variant", "D=64", "D=128", "D=256";
	for (i = 1; i <= m; i++) { split(order[i], a, "\t");
		printf "%-3s %-44s", a[1], a[2] == "" ? "(defaults)" : a[2];
		for (j = 0; j < 3; j++) { d = j == 0 ? 64 : j == 1 ? 128 : 256;
			printf " %6s/%-6s", val[order[i], d, "-"], val[order[i], d, "causal"] }
		printf "\n" } }' "$OUT/pv.tsv"
exit $rc
