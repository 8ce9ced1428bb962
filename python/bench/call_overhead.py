"""The cost of one Python call over the same C call, in one run (issue 13: target <= 10 us), and
where it goes.

    python3 python/bench/call_overhead.py            # CPU backend: starts BUILD/fa-daemon
    python3 python/bench/call_overhead.py --gpu      # CUDA tensors, --backend gpu (GPU host)
    FA_SOCKET=ipc:///path python3 python/bench/call_overhead.py [--gpu]

The method is gpu_torch_check.py's: the bare fa_attn_fwd through ctypes on an argument block
built once, against fa.flash_attn_func(q, k, v, out=o) on the same arrays; each p50 of N calls,
interleaved, best of three rounds. The breakdown of the difference, each measured alone in the
same rounds:
- the library's side: the fast path's own foreign call (fa_prepared_call on the placement the
  last Python call wrote: its place checks, one buffer-id query per allocation, the stream
  wait) minus the bare fa_attn_fwd;
- the Python side: the Python call with the library's attention entry points replaced by
  no-op Python functions (tests/stub_attention.py), on the fast path and the full path;
- the rest: what neither accounts for (the foreign call's own conversion, caches after the
  blocking call).
With --gpu also the pieces the library's side is made of, through ctypes: PyTorch's stream
sync, one buffer-id query, and the cost of a ctypes call of a trivial library function. Arrays:
q = k = v (as the figures before), then q, k and v apart (what a model passes). PyTorch CUDA
tensors with --gpu; else PyTorch CPU tensors and NumPy arrays in fa.empty_host memory (in
place, no staging), tiny shapes so the daemon's compute does not drown the difference. Also
the backward's and the autograd path's Python side. Exit 0 (figures are reported, not
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
from stub_attention import Stubbed  # noqa: E402

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


def last_plan(c):
    """The plan this thread's last forward went through."""
    return c._tls.fast.mru[fa._fast.FWD][1]


def measure(c, label, q, k, v, o):
    """One array kind: the C call against the Python call, and the breakdown."""
    from fa import _arrays
    for _ in range(50):
        fa.flash_attn_func(q, k, v, out=o, client=c)
    views = [_arrays.view_of(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (o, "out"))]
    if views[0].kind == _arrays.CUDA:
        drv = fa._cuda.driver()
        res = [c._device_find(vw.ptr, drv) for vw in views]
    else:
        res = [c._host_find(*vw.extent()) for vw in views]
    block = bare_block(c, views, res, ["q", "k", "v", "o"],
                       ctypes.sizeof(fa._abi.fa_attn_fwd_args) + fa._abi.ARGS_SLACK)
    lib, h, addr = c._lib, c._c, ctypes.addressof(block)
    plan = last_plan(c)
    pp, place = plan.pp, plan.place_addr

    def bare():
        if lib.fa_attn_fwd(h, addr):
            raise RuntimeError("bare fa_attn_fwd failed")

    def bare_prepared():
        if lib.fa_prepared_call(pp, place):
            raise RuntimeError("bare fa_prepared_call failed")

    def py():
        fa.flash_attn_func(q, k, v, out=o, client=c)

    def py_fresh():
        fa.flash_attn_func(q, k, v, client=c)

    fa._fast.enabled = True
    hits = fa._fast.hits
    tc, tprep, tp = best(bare, bare_prepared, py)
    served = fa._fast.hits - hits
    print("%s: C call p50 %.1f us, fa.flash_attn_func p50 %.1f us: +%.1f us per call; target "
          "<= 10 us: %s (%d of %d timed Python calls served by a prepared block)" % (
              label, tc, tp, tp - tc, "met" if tp - tc <= 10 else "MISSED", served, 3 * N))
    # fresh outputs only on the device: a host output not in fa.empty_host memory is staged
    fns = [py, py_fresh] if views[0].kind == _arrays.CUDA else [py]
    with Stubbed(c):
        fa._fast.enabled = True
        fast = best(*fns)
        fa._fast.enabled = False
        full = best(*fns)
        fa._fast.enabled = True
    side = fast[0]
    print("%s: breakdown of the +%.1f us: library side (fa_prepared_call %.1f us - bare "
          "fa_attn_fwd %.1f us) %+.1f us, Python side %.1f us, rest %+.1f us" % (
              label, tp - tc, tprep, tc, tprep - tc, side, tp - tprep - side))
    extra = ["", ""]
    if len(fns) > 1:
        extra = [" (fresh out %.1f us)" % fast[1], " (fresh out %.1f us)" % full[1]]
    print("%s: Python side alone (attention calls stubbed): fast path %.1f us%s, full path "
          "%.1f us%s" % (label, fast[0], extra[0], full[0], extra[1]))
    return dict(c=tc, prep=tprep, py=tp, fast=fast[0], full=full[0])


def gpu_pieces(c, q):
    """The library side's parts, each through ctypes (so each includes one ctypes call)."""
    drv = fa._cuda.driver()
    raw = fa._fast.current_stream(q.get_device())
    ptr = q.data_ptr()
    lib, h = c._lib, c._c
    vals = (ctypes.c_uint64 * 1)()
    va = ctypes.addressof(vals)
    get = drv.lib.cuPointerGetAttribute
    sync = drv.stream_synchronize
    tsync, tid, tnop = best(lambda: sync(raw), lambda: get(va, 7, ptr),
                            lambda: lib.fa_client_epoch(h))
    print("  pieces through ctypes: cuStreamSynchronize(PyTorch's stream) %.2f us, one buffer-id "
          "query %.2f us, a trivial library call (fa_client_epoch) %.2f us" % (tsync, tid, tnop))


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
            measure(c, "torch cuda bf16 B1 S128 H16 D64 q=k=v", q, q, q, o)
            k, v = torch.randn_like(q), torch.randn_like(q)
            measure(c, "torch cuda bf16 B1 S128 H16 D64 q, k, v apart", q, k, v, o)
            gpu_pieces(c, q)
            lse = torch.empty(1, 16, 128, device="cuda")
            measure_bwd(c, "torch cuda", q, lse, torch)
        else:
            if torch is not None:
                q = fa.empty_host((1, 2, 1, 8), torch.float16, client=c)
                q.copy_(torch.randn(q.shape))
                o = fa.empty_host((1, 2, 1, 8), torch.float16, client=c)
                measure(c, "torch cpu fp16 (fa.empty_host) B1 S2 H1 D8 q=k=v", q, q, q, o)
                k = fa.empty_host((1, 2, 1, 8), torch.float16, client=c)
                v = fa.empty_host((1, 2, 1, 8), torch.float16, client=c)
                k.copy_(q)
                v.copy_(q)
                measure(c, "torch cpu fp16 (fa.empty_host) B1 S2 H1 D8 q, k, v apart", q, k,
                        v, o)
                lse = fa.empty_host((1, 1, 2), torch.float32, client=c)
                measure_bwd(c, "torch cpu", q, lse, None,
                            lambda: fa.empty_host(q.shape, torch.float16, client=c))
            else:
                print("  note: PyTorch is not installed: NumPy only")
            import numpy as np
            q = fa.empty_host((1, 2, 1, 8), "float16", client=c)
            q[...] = np.random.randn(*q.shape)
            o = fa.empty_host((1, 2, 1, 8), "float16", client=c)
            measure(c, "numpy fp16 (fa.empty_host) B1 S2 H1 D8 q=k=v", q, q, q, o)
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
