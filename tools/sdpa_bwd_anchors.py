# Backward anchors: PyTorch SDPA's flash, cuDNN and mem-efficient backends, forward + backward
# TFLOP/s at the shapes (B*S = 32k tokens, 16 heads, S = 4096; flops 3.5x the forward's,
# halved when causal), and each backend's own error against float64 on a small shape (relative
# Frobenius error of dQ, dK, dV; the float64 gradients by autograd through the math backend), so
# that tests/gpu/test_attn_bwd_gpu.c's errors can be put against them (kernels/RESULTS.md).
# Run by tools/gpu-run-bwd.sh in the same device call as bench_attn_bwd.
# FA_ERR_DUMP=dir: also writes each error case's inputs and float64 gradients there (cases.txt,
# name.{q,k,v,g}.f32, name.{dq,dk,dv}.f64), so that bench_attn_bwd (FA_BENCH_ERR_DIR) measures
# our error on the very same inputs; FA_ANCHORS_ERR_ONLY=1 skips the timings.
# The fp32 error cases add mem-efficient's forward errors (O, lse; fwd_* in its json line) and,
# dumping, the float64 O and lse (name.{o,lse}.f64). FA_ANCHORS_DT=fp32: time only the shapes of these dtypes (space- or comma-separated); FA_ANCHORS_FWD=1:
# also the forward alone of the fp32 shapes (mem-efficient; issue 10's fp32 D=256 forward row);
# FA_ANCHORS_D256=1: also the fp32 errors at D=256 (S=4096, where sm_90 runs the wgmma forward),
# and the 16-bit timings at bf16 D=256 causal, fp16 D=256 and bf16 D=192.
import json, os, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
import triton.testing as tt

torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda")
p = torch.cuda.get_device_properties(0)
print("device", p.name, "torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), flush=True)
BK = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
      "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def speed(dt, d, s, causal, bk, tokens=32768, heads=16, fwd_only=False):
    b = max(1, tokens // s)
    q = torch.randn(b, heads, s, d, device=dev, dtype=DT[dt], requires_grad=True)
    k = torch.randn_like(q, requires_grad=True)
    v = torch.randn_like(q, requires_grad=True)
    fl = (1 if fwd_only else 3.5) * 4 * b * heads * s * s * d / (2 if causal else 1)
    kind = "speed-fwd" if fwd_only else "speed"
    try:
        with sdpa_kernel(BK[bk]):
            g = torch.randn(b, heads, s, d, device=dev, dtype=DT[dt])
            def fn():
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                o.backward(g)
            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            ms = tt.do_bench(fwd if fwd_only else fn, warmup=20, rep=100, return_mode="median")
        r = dict(kind=kind, dt=dt, d=d, s=s, causal=causal, bk=bk, ms=ms, tflops=fl / ms / 1e9)
    except Exception as e:
        r = dict(kind=kind, dt=dt, d=d, s=s, causal=causal, bk=bk, err=str(e).splitlines()[0][:120])
    print(json.dumps(r), flush=True)
    del q, k, v
    torch.cuda.empty_cache()


def lse64(q, k, causal):
    """The natural logsumexp of each query row's scaled scores, in float64 (B, H, S)."""
    with torch.no_grad():
        sc = (q.detach() @ k.detach().transpose(-1, -2)) / q.shape[-1] ** 0.5
        if causal:
            n = sc.shape[-1]
            above = torch.triu(torch.ones(n, n, device=sc.device), 1).bool()
            sc = sc.masked_fill(above, float("-inf"))
        return torch.logsumexp(sc, dim=-1)


def fwd_errors(q, k, v, o64, l64, causal):
    """mem-efficient's forward alone against float64: O's relative Frobenius error, the lse's
    rms and mean error (natural units), as bench_attn_bwd prints ours."""
    try:
        with torch.no_grad():
            out = torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, None, True, 0.0, causal)
        o, l = out[0].double(), out[1][..., :q.shape[2]].double()
        dl = l - l64
        return dict(fwd_o=((o - o64).norm() / o64.norm()).item(),
                    fwd_lse_rms=dl.pow(2).mean().sqrt().item(), fwd_lse_mean=dl.mean().item())
    except Exception as ex:
        return dict(fwd_err=str(ex).splitlines()[0][:120])


def error(dt, d, s, causal, bk, b=2, heads=4):
    torch.manual_seed(1)
    q64 = (torch.rand(b, heads, s, d, device=dev, dtype=torch.float64) * 3 - 1.5)
    k64 = (torch.rand_like(q64) * 3 - 1.5)
    v64 = (torch.rand_like(q64) * 2 - 1)
    g64 = (torch.rand_like(q64) * 2 - 1)
    # the inputs rounded to the dtype, the oracle fed the rounded values
    q, k, v, g = (x.to(DT[dt]) for x in (q64, k64, v64, g64))
    qr, kr, vr = (x.to(torch.float64).requires_grad_() for x in (q, k, v))
    with sdpa_kernel(BK["math"]):
        o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
        o.backward(g.to(torch.float64))
    dump = os.environ.get("FA_ERR_DUMP")
    name = "%s_d%d_s%d_%s" % (dt, d, s, "causal" if causal else "full")
    if dump and bk == "efficient":
        os.makedirs(dump, exist_ok=True)
        for x, ext in ((q, "q.f32"), (k, "k.f32"), (v, "v.f32"), (g, "g.f32")):
            x.float().cpu().numpy().tofile(os.path.join(dump, name + "." + ext))
        for x, ext in ((qr, "dq.f64"), (kr, "dk.f64"), (vr, "dv.f64")):
            x.grad.cpu().numpy().tofile(os.path.join(dump, name + "." + ext))
        # the forward's float64 O and natural lse, for bench_attn_bwd's forward errors
        o.detach().cpu().numpy().tofile(os.path.join(dump, name + ".o.f64"))
        lse64(qr, kr, causal).cpu().numpy().tofile(os.path.join(dump, name + ".lse.f64"))
        with open(os.path.join(dump, "cases.txt"), "a") as f:
            f.write("%s %s %d %d %d %d %d\n" % (name, dt, d, s, int(causal), b, heads))
    try:
        q1, k1, v1 = (x.clone().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(BK[bk]):
            o1 = F.scaled_dot_product_attention(q1, k1, v1, is_causal=causal)
            o1.backward(g)
        e = [((a.grad.double() - b_.grad).norm() / b_.grad.norm()).item()
             for a, b_ in ((q1, qr), (k1, kr), (v1, vr))]
        r = dict(kind="error", dt=dt, d=d, s=s, causal=causal, bk=bk, dq=e[0], dk=e[1], dv=e[2])
        if dt == "fp32" and bk == "efficient":
            r.update(fwd_errors(q, k, v, o.detach(), lse64(qr, kr, causal), causal))
    except Exception as ex:
        r = dict(kind="error", dt=dt, d=d, s=s, causal=causal, bk=bk, err=str(ex).splitlines()[0][:120])
    print(json.dumps(r), flush=True)


for dt, d, causal in ([] if os.environ.get("FA_ANCHORS_ERR_ONLY") == "1" else
                      [("bf16", 128, False), ("bf16", 128, True), ("bf16", 64, False),
                       ("bf16", 256, False), ("fp16", 128, False), ("fp32", 128, False),
                       ("fp32", 256, False)]):
    only = os.environ.get("FA_ANCHORS_DT", "").replace(",", " ").split()
    if only and dt not in only:
        continue
    for bk in ["flash", "cudnn", "efficient"]:
        if dt == "fp32" and bk != "efficient":
            continue
        speed(dt, d, 4096, causal, bk)
        if dt == "fp32" and os.environ.get("FA_ANCHORS_FWD") == "1":
            speed(dt, d, 4096, causal, bk, fwd_only=True)
# FA_ANCHORS_D256=1: also the 16-bit timings above head dim 128 (the wgmma backward's wide form):
# bf16 D=256 causal, fp16 D=256, bf16 D=192 (FA_ANCHORS_DT filters them too)
for dt, d, causal in ([] if os.environ.get("FA_ANCHORS_ERR_ONLY") == "1" or
                      os.environ.get("FA_ANCHORS_D256") != "1" else
                      [("bf16", 256, True), ("fp16", 256, False), ("bf16", 192, False)]):
    only = os.environ.get("FA_ANCHORS_DT", "").replace(",", " ").split()
    if only and dt not in only:
        continue
    for bk in ["flash", "cudnn", "efficient"]:
        speed(dt, d, 4096, causal, bk)
# FA_ANCHORS_SPEED_ONLY=1: the timings only (the errors do not change between runs)
# FA_ANCHORS_ERR_DT=fp32: the error cases of these dtypes only
ERR_DT = os.environ.get("FA_ANCHORS_ERR_DT", "").replace(",", " ").split() or ["fp16", "bf16", "fp32"]
for dt in ([] if os.environ.get("FA_ANCHORS_SPEED_ONLY") == "1" else ERR_DT):
    for d in [64, 128]:
        for bk in ["flash", "cudnn", "efficient"]:
            if dt == "fp32" and bk != "efficient":
                continue
            error(dt, d, 1000, True, bk)
            error(dt, d, 1000, False, bk)
# fp32 at the length where the GPU test's worst fp32 case was (S=4096 D=128 causal)
if os.environ.get("FA_ANCHORS_SPEED_ONLY") != "1" and os.environ.get("FA_ANCHORS_D256") == "1":
    error("fp32", 256, 4096, True, "efficient", b=1, heads=2)
    error("fp32", 256, 4096, False, "efficient", b=1, heads=2)
if os.environ.get("FA_ANCHORS_SPEED_ONLY") != "1":
    error("fp32", 128, 4096, True, "efficient", b=1, heads=4)
    error("fp32", 128, 4096, False, "efficient", b=1, heads=4)
