# SDPA anchors for bench_attn_varlen: PyTorch SDPA (cuDNN, flash) on the dense equivalent of the
# varlen batch (B=16 sequences of S tokens each, S given), bf16, D=128, 32 query heads, 8 KV heads
# (K and V repeated to 32 heads: SDPA's flash and cuDNN backends take equal head counts), no mask
# and causal; median of triton's do_bench. Usage: python3 tools/sdpa_varlen_anchors.py S
import sys, json, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
import triton.testing as tt
S = int(sys.argv[1]); B, HQ, HKV, D = 16, 32, 8, 128
dev = torch.device("cuda")
q = torch.randn(B, HQ, S, D, device=dev, dtype=torch.bfloat16)
k = torch.randn(B, HKV, S, D, device=dev, dtype=torch.bfloat16).repeat_interleave(HQ // HKV, 1)
v = torch.randn_like(k)
for causal in (False, True):
    for name, bk in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        fl = 4 * B * HQ * S * S * D / (2 if causal else 1)
        try:
            with sdpa_kernel(bk), torch.no_grad():
                ms = tt.do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                 warmup=50, rep=200, return_mode="median")
            print(json.dumps(dict(sdpa=name, B=B, S=S, causal=causal, ms=round(ms, 4),
                                  tflops=round(fl / ms / 1e9, 1))), flush=True)
        except Exception as e:
            print(json.dumps(dict(sdpa=name, causal=causal, err=str(e).splitlines()[0][:120])))
