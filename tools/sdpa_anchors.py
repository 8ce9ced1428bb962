# Anchor timings: PyTorch SDPA backends on this GPU, forward and forward+backward.
# Copied from ../shared/gpu/sdpa_anchors.py (which does not travel to the GPU host).
# FA_ANCHORS_FWD_ONLY=1 skips the backward and math rows (tools/gpu-run.sh uses it).
import torch, sys, json, math, os
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
import triton.testing as tt
torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda")
p = torch.cuda.get_device_properties(0)
print("device", p.name, "SMs", p.multi_processor_count, "torch", torch.__version__, "cudnn", torch.backends.cudnn.version())
BK = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
rows = []
def bench(dt, d, s, causal, bk, bwd, tokens=16384*2, heads=16):
    b = max(1, tokens // s)
    q = torch.randn(b, heads, s, d, device=dev, dtype=DT[dt], requires_grad=bwd)
    k = torch.randn_like(q, requires_grad=bwd); v = torch.randn_like(q, requires_grad=bwd)
    fl = 4 * b * heads * s * s * d / (2 if causal else 1)
    try:
        with sdpa_kernel(BK[bk]):
            if bwd:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                g = torch.randn_like(o)
                def fn():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    o.backward(g)
                fl *= 3.5
            else:
                def fn():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            ms = tt.do_bench(fn, warmup=50, rep=200, return_mode="median")
        r = dict(dt=dt, d=d, s=s, b=b, h=heads, causal=causal, bk=bk, bwd=bwd, ms=ms, tflops=fl / ms / 1e9)
    except Exception as e:
        r = dict(dt=dt, d=d, s=s, b=b, h=heads, causal=causal, bk=bk, bwd=bwd, err=str(e).splitlines()[0][:120])
    rows.append(r); print(json.dumps(r), flush=True)
    del q, k, v; torch.cuda.empty_cache()

for dt in ["bf16", "fp32"]:
    for d in [64, 128, 256]:
        for s in [1024, 4096, 16384]:
            for causal in [False, True]:
                for bk in ["flash", "cudnn", "efficient"]:
                    if dt == "fp32" and bk in ("flash", "cudnn"): continue
                    bench(dt, d, s, causal, bk, False)
# backward at the headline shape
FWD_ONLY = os.environ.get("FA_ANCHORS_FWD_ONLY") == "1"
for dt in ([] if FWD_ONLY else ["bf16", "fp32"]):
    for d in [64, 128]:
        for causal in [False, True]:
            for bk in ["flash", "cudnn", "efficient"]:
                if dt == "fp32" and bk in ("flash", "cudnn"): continue
                bench(dt, d, 4096, causal, bk, True)
# fp32 with tf32 allowed on the math backend, head dim 128, seq 4096
if not FWD_ONLY:
    torch.backends.cuda.matmul.allow_tf32 = True
    bench("fp32", 128, 4096, False, "math", False)
    torch.backends.cuda.matmul.allow_tf32 = False
    bench("fp32", 128, 4096, False, "math", False)
# ceilings: bf16 matmul and d2d copy
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16); bm = torch.randn_like(a)
ms = tt.do_bench(lambda: a @ bm, return_mode="median"); print("ceiling bf16 matmul TFLOPs", 2*8192**3/ms/1e9)
a32 = a.float(); b32 = bm.float()
torch.backends.cuda.matmul.allow_tf32 = True
ms = tt.do_bench(lambda: a32 @ b32, return_mode="median"); print("ceiling tf32 matmul TFLOPs", 2*8192**3/ms/1e9)
torch.backends.cuda.matmul.allow_tf32 = False
ms = tt.do_bench(lambda: a32 @ b32, return_mode="median"); print("ceiling fp32 matmul TFLOPs", 2*8192**3/ms/1e9)
x = torch.empty(2**30, dtype=torch.uint8, device=dev); y = torch.empty_like(x)
ms = tt.do_bench(lambda: y.copy_(x), return_mode="median"); print("ceiling copy GB/s (r+w)", 2*2**30/ms/1e6)
json.dump(rows, open(os.environ.get("OUT", "/tmp") + "/anchors.json", "w"))
