#!/usr/bin/env python3
"""results_table.py OUT - the forward benchmark (OUT/bench.tsv) beside the PyTorch SDPA anchors
of the same run (OUT/anchors.json) as a Markdown table, with card, date and commit (OUT/env.txt)."""
import json, os, sys
out = sys.argv[1]
env = open(os.path.join(out, "env.txt")).read().splitlines()
rows = [l.rstrip("\n").split("\t") for l in open(os.path.join(out, "bench.tsv")) if l.strip()]
try:
    anchors = json.load(open(os.path.join(out, "anchors.json")))
except Exception:
    anchors = []
A = {}
for a in anchors:
    if a.get("bwd") or "tflops" not in a:
        continue
    A[(a["dt"], a["d"], a["s"], bool(a["causal"]), a["bk"])] = a["tflops"]
print("# Forward benchmark\n")
print("Run: " + "; ".join(l for l in env if l.strip()) + "\n")
print("TFLOP/s = 4*B*H*S^2*D (halved when causal) / time; B*S = 32768 tokens, H = 16, BHSD, random inputs; "
      "fa timed with CUDA events (median), anchors with triton do_bench (median), same run.\n")
print("| input | D | S | causal | fa tile | fa TFLOP/s | SDPA flash | cuDNN | mem-efficient | fa/flash | fa/cuDNN | fa/mem-eff |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
def r(x, y):
    return "%.2f" % (x / y) if x and y else "-"
for l in rows:
    if len(l) < 8 or l[5] != "chosen":
        continue
    lab, d, s, c, tile, _, ms, tf = l[:8]
    d, s, c, tf = int(d), int(s), l[3] == "1", float(tf)
    dt = "bf16" if lab in ("bf16", "fp16") else "fp32"
    if lab == "fp16":
        dt = "fp16"
    fl = A.get((dt, d, s, c, "flash")); cu = A.get((dt, d, s, c, "cudnn")); me = A.get((dt, d, s, c, "efficient"))
    f = lambda x: "%.0f" % x if x else "-"
    print(f"| {lab} | {d} | {s} | {'yes' if c else 'no'} | {tile} | {tf:.1f} | {f(fl)} | {f(cu)} | {f(me)} | {r(tf, fl)} | {r(tf, cu)} | {r(tf, me)} |")
sw = [l for l in rows if len(l) >= 8 and l[5] == "sweep"]
if sw:
    print("\n## Tile sweep (every fitting tile, headline shapes)\n")
    print("| input | D | S | causal | tile | TFLOP/s |\n|---|---|---|---|---|---|")
    for l in sw:
        print(f"| {l[0]} | {l[1]} | {l[2]} | {'yes' if l[3] == '1' else 'no'} | {l[4]} | {float(l[7]):.1f} |")
