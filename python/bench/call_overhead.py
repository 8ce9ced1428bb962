"""The cost of one Python call over the same C call, in one run (issue 13: target <= 10 us).

    python3 python/bench/call_overhead.py            # CPU backend: starts BUILD/fa-daemon
    python3 python/bench/call_overhead.py --gpu      # CUDA tensors, --backend gpu (GPU host)
    FA_SOCKET=ipc:///path python3 python/bench/call_overhead.py [--gpu]

The method is gpu_torch_check.py's: the bare fa_attn_fwd through ctypes on an argument block
built once, against fa.flash_attn_func(q, k, v, out=o) on the same arrays; each p50 of N calls,
the two interleaved, best of three rounds. Beside it, the Python side alone (the C call replaced
by a no-op: the figure that does not depend on the daemon's noise), for the full path (every
check, fa._fast off) and the fast path (a prebuilt block patched), and the backward's and the
autograd path's. Arrays: PyTorch CUDA tensors with --gpu; else PyTorch CPU tensors and NumPy
arrays in fa.empty_host memory (in place, no staging), tiny shapes so the daemon's compute does
not drown the difference. Prints one line per figure; exit 0 (figures are reported, not
enforced).
"""
import ctypes
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import fa  # noqa: E402
import fa._attn  # noqa: E402
import fa._fast  # noqa: E402
from fa_daemon import Daemon  # noqa: E402

GPU = "--gpu" in sys.argv[1:]
N = int(os.environ.get("FA_BENCH_N", "1000"))


def p50(fn, n=N):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1000.0


def best(*fns, rounds=3):
    """Each fn's p50, interleaved, the best of `rounds` rounds."""
    out = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            out[i] = min(out[i], p50(fn))
    return out


def bare_block(c, views, res, names, size):
    """The C call's argument block, built once (as gpu_torch_check.py's overhead builds it)."""
    block = ctypes.create_string_buffer(size)
    for vw, where, n in zip(views, res, names):
        fa._attn.pack_tensor(block, fa._attn._OFF[n], vw, where, False, n == "lse")
    return block


class Stubbed:
    """The client's attention calls replaced by a no-op (the Python side alone)."""

    def __init__(self, c):
        self.c = c

    def __enter__(self):
        real = self.c._call

        def stub(fn, *args, what=None):  # registrations of new allocations still happen
            if getattr(fn, "__name__", "").startswith("fa_attn_"):
                return None
            return real(fn, *args, what=what)
        self.c._call = stub

    def __exit__(self, *e):
        del self.c._call


def measure(c, label, q, o, sync=None):
    """One array kind: C call vs Python call, and the Python side alone."""
    from fa import _arrays
    for _ in range(50):
        fa.flash_attn_func(q, q, q, out=o, client=c)
    vq, vo = _arrays.view_of(q, "q"), _arrays.view_of(o, "out")
    if vq.kind == _arrays.CUDA:
        drv = fa._cuda.driver()
        res = [c._device_find(vq.ptr, drv)] * 3 + [c._device_find(vo.ptr, drv)]
    else:
        res = [c._host_find(*vq.extent())] * 3 + [c._host_find(*vo.extent())]
    block = bare_block(c, [vq, vq, vq, vo], res, ["q", "k", "v", "o"],
                       ctypes.sizeof(fa._abi.fa_attn_fwd_args) + fa._abi.ARGS_SLACK)
    lib, h, addr = c._lib, c._c, ctypes.addressof(block)

    def bare():
        if lib.fa_attn_fwd(h, addr):
            raise RuntimeError("bare fa_attn_fwd failed")

    def py():
        fa.flash_attn_func(q, q, q, out=o, client=c)

    def py_fresh():
        fa.flash_attn_func(q, q, q, client=c)

    figures = {}
    fa._fast.enabled = True
    tc, tp = best(bare, py)
    figures["c"], figures["py"] = tc, tp
    line = "%s: C call p50 %.1f us, fa.flash_attn_func p50 %.1f us: +%.1f us per call" % (
        label, tc, tp, tp - tc)
    if sync is not None:
        (ts,) = best(sync)
        line += " (PyTorch's stream sync alone %.1f us)" % ts
    print(line + "; target <= 10 us: %s" % ("met" if tp - tc <= 10 else "MISSED"))
    # fresh outputs only on the device: a host output not in fa.empty_host memory is staged
    fns = [py, py_fresh] if vq.kind == _arrays.CUDA else [py]
    with Stubbed(c):
        fa._fast.enabled = True
        fast = best(*fns)
        fa._fast.enabled = False
        full = best(*fns)
        fa._fast.enabled = True
    extra = ["", ""]
    if len(fns) > 1:
        extra = [" (fresh out %.1f us)" % fast[1], " (fresh out %.1f us)" % full[1]]
    print("%s: Python side alone (C call stubbed): fast path %.1f us%s, full path %.1f us%s"
          % (label, fast[0], extra[0], full[0], extra[1]))
    fast, full = fast[0], full[0]
    figures.update(fast=fast, full=full)
    return figures


def measure_bwd(c, label, q, lse, torch_mod, like=None):
    """The backward's Python side alone and the autograd path's (forward+backward). like: a
    function making an array like q where the daemon sees it in place (host arrays)."""
    like = like or (lambda: q.clone())
    o, dq, dk, dv = like(), like(), like(), like()
    fa.attn_fwd(q, q, q, out=o, lse=lse, client=c)

    def bwd():
        fa.attn_bwd(q, q, q, o, o, lse, dq=dq, dk=dk, dv=dv, client=c)

    fns = [bwd]
    if torch_mod is not None:
        leaf = q.clone().requires_grad_()
        g = torch_mod.ones_like(q)

        def train():
            fa.flash_attn_func(leaf, leaf, leaf, client=c).backward(g)
        fns.append(train)
    for f in fns:
        f()
    with Stubbed(c):
        fa._fast.enabled = True
        fast = best(*fns)
        fa._fast.enabled = False
        full = best(*fns)
        fa._fast.enabled = True
    print("%s: backward call, Python side alone: fast %.1f us, full %.1f us" % (
        label, fast[0], full[0]))
    if torch_mod is not None:
        print("%s: autograd forward+backward (loss.backward()), Python and PyTorch side "
              "alone: fast %.1f us, full %.1f us" % (label, fast[1], full[1]))


def main():
    d = None
    url = os.environ.get("FA_SOCKET")
    if not url:
        d = Daemon(backend="gpu" if GPU else "cpu")
        url = d.url
    try:
        c = fa.Client(url)
        try:
            import torch
        except ImportError:
            torch = None
        print("fa %s, libfaclient %s, %s, python %s%s" % (
            fa.__version__, fa.library_version(), "GPU backend" if GPU else "CPU backend",
            sys.version.split()[0], ", torch " + torch.__version__ if torch else ""))
        if GPU:
            if torch is None or not torch.cuda.is_available():
                print("SKIP: --gpu needs PyTorch with CUDA")
                return 0
            q = torch.randn(1, 128, 16, 64, device="cuda", dtype=torch.bfloat16)
            o = torch.empty_like(q)
            stream = torch.cuda.current_stream()
            measure(c, "torch cuda bf16 B1 S128 H16 D64", q, o, stream.synchronize)
            lse = torch.empty(1, 16, 128, device="cuda")
            measure_bwd(c, "torch cuda", q, lse, torch)
        else:
            if torch is not None:
                q = fa.empty_host((1, 2, 1, 8), torch.float16, client=c)
                q.copy_(torch.randn(q.shape))
                o = fa.empty_host((1, 2, 1, 8), torch.float16, client=c)
                measure(c, "torch cpu fp16 (fa.empty_host) B1 S2 H1 D8", q, o)
                lse = fa.empty_host((1, 1, 2), torch.float32, client=c)
                measure_bwd(c, "torch cpu", q, lse, None,
                            lambda: fa.empty_host(q.shape, torch.float16, client=c))
            else:
                print("  note: PyTorch is not installed: NumPy only")
            import numpy as np
            q = fa.empty_host((1, 2, 1, 8), "float16", client=c)
            q[...] = np.random.randn(*q.shape)
            o = fa.empty_host((1, 2, 1, 8), "float16", client=c)
            measure(c, "numpy fp16 (fa.empty_host) B1 S2 H1 D8", q, o)
            lse = fa.empty_host((1, 1, 2), "float32", client=c)
            measure_bwd(c, "numpy", q, lse, None,
                        lambda: fa.empty_host(q.shape, "float16", client=c))
        c.close()
    finally:
        if d is not None:
            d.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
