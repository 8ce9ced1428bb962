# Decode anchors: PyTorch SDPA (cuDNN, flash, efficient) on the shapes of
# tests/bench/bench_attn_decode.c, in the same device call, and the copy ceiling.
# TB/s counts K and V read once (the kv heads, not the query heads), like the benchmark.
# GQA through enable_gqa=True; a backend that refuses it is retried with K/V expanded to the
# query heads (a copy, made before timing; marked "expanded": it reads group x the bytes).
import torch, json, math, os
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
import triton.testing as tt
dev = torch.device("cuda")
p = torch.cuda.get_device_properties(0)
print("device", p.name, "SMs", p.multi_processor_count, "torch", torch.__version__, "cudnn", torch.backends.cudnn.version())
BK = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# name, dtype, D, B, Sq, Sk, Hq, Hkv, causal (bottom-right)
SHAPES = [
    ("issue-1 B16 8k", "bf16", 128, 16, 1, 8192, 32, 8, False),
    ("issue-2 B64 2k", "bf16", 128, 64, 1, 2048, 32, 8, False),
    ("issue-3 B1 32k", "bf16", 128, 1, 1, 32768, 32, 8, False),
    ("spec Sq4 causal", "bf16", 128, 16, 4, 8192, 32, 8, True),
    ("spec Sq8 causal", "bf16", 128, 16, 8, 8192, 32, 8, True),
    ("fp16 d64 B16 8k", "fp16", 64, 16, 1, 8192, 32, 8, False),
    ("bf16 d256 B8 4k", "bf16", 256, 8, 1, 4096, 32, 8, False),
    ("MQA B16 8k", "bf16", 128, 16, 1, 8192, 32, 1, False),
    ("fp32 B16 8k", "fp32", 128, 16, 1, 8192, 32, 8, False),
]
# FA_DECODE_ANCHORS_ONLY=issue: only the shapes whose name contains it (a short device call)
ONLY = os.environ.get("FA_DECODE_ANCHORS_ONLY", "")
SHAPES = [s for s in SHAPES if ONLY in s[0]]
rows = []
for name, dt, d, b, sq, sk, hq, hkv, causal in SHAPES:
    q = torch.randn(b, hq, sq, d, device=dev, dtype=DT[dt])
    k = torch.randn(b, hkv, sk, d, device=dev, dtype=DT[dt]); v = torch.randn_like(k)
    kvbytes = 2 * k.numel() * k.element_size()
    mask = None
    if causal:  # bottom-right: query i sees keys j <= i + sk - sq
        mask = torch.ones(sq, sk, dtype=torch.bool, device=dev).tril(diagonal=sk - sq)
    for bk in ["cudnn", "flash", "efficient"]:
        if dt == "fp32" and bk != "efficient":
            continue
        r = dict(shape=name, dt=dt, d=d, b=b, sq=sq, sk=sk, hq=hq, hkv=hkv, causal=causal, bk=bk)
        for how in ["gqa", "expanded"]:
            try:
                if how == "gqa":
                    kk, vv, kw = k, v, dict(enable_gqa=True)
                else:
                    kk = k.repeat_interleave(hq // hkv, dim=1); vv = v.repeat_interleave(hq // hkv, dim=1); kw = {}
                with sdpa_kernel(BK[bk]):
                    def fn():
                        with torch.no_grad():
                            F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, **kw)
                    fn()
                    ms = tt.do_bench(fn, warmup=25, rep=100, return_mode="median")
                r.update(how=how, us=ms * 1e3, tbs=kvbytes / ms / 1e9)
                r.pop("err", None)
                break
            except Exception as e:
                r["err"] = (how + ": " + str(e).splitlines()[0])[:160]
        rows.append(r); print(json.dumps(r), flush=True)
    del q, k, v; torch.cuda.empty_cache()
x = torch.empty(2**30, dtype=torch.uint8, device=dev); y = torch.empty_like(x)
ms = tt.do_bench(lambda: y.copy_(x), return_mode="median"); print("ceiling copy GB/s (r+w)", 2*2**30/ms/1e6)
json.dump(rows, open(os.environ.get("OUT", "/tmp") + "/decode_anchors.json", "w"))
