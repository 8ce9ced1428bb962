"""GPU host check of the Python package with PyTorch (not part of CI: it needs a GPU).

    python3 python/tests/gpu_torch_check.py            # starts BUILD/fa-daemon --backend gpu
    FA_SOCKET=ipc:///path python3 python/tests/gpu_torch_check.py   # or use a running daemon

Checks, printing a line per case: fa.scaled_dot_product_attention and fa.flash_attn_func on CUDA
tensors (fp16, bf16, fp32; odd shapes, GQA, causal both ways, BHSD and BSHD strides) against a
float64 reference, with torch.nn.functional.scaled_dot_product_attention's own error beside it;
the logsumexp; CPU tensors (staged, and in place from fa.empty_host); the asynchronous mode; that
a loop re-registers nothing (the registration cache); the overhead of one Python call over
the bare C call (p50 of 1000, target <= 10 us) and its parts (fresh outputs, the stream sync,
the buffer-id query, the Python side alone on the fast and the full path, the library's side
of the fast path's prepared call); the library's prepared call on device memory (placed, with
the stream wait, asynchronous, past the allocation, and an allocation freed and made anew at
the same address refused by its buffer id); the copy of memory
CUDA IPC cannot export, in child processes (expandable_segments, cudaMallocAsync, managed:
what cuIpcGetMemHandle says, forward and gradients through the copy, one warning). Then
training: gradients through loss.backward()
(fp16, bf16, fp32 up to head dim 256; odd shapes, Sq != Sk, GQA/MQA, both causal alignments)
against float64 autograd with torch SDPA's own gradient error beside them, the fp32 precisions,
packed qkv, upstream gradients of other strides, the deterministic flag bit for bit, the
asynchronous mode, torch.compile(fullgraph=True) of a block forward and backward, and figures:
the autograd path's cost per call and a training step against torch's SDPA (the default
asynchronous ordering and stream="sync", the daemon's time per call, registrations and
prebuilt blocks per step, each call alone, the host side with the attention calls stubbed).
Then inference: the window and softcap (forward; the backward where the GPU serves it),
flash_attn_varlen_func and flash_attn_with_kvcache (contiguous, paged 16 and 256, append)
against infer_ref.py; a call the GPU build refuses with FA_ENOTSUP prints n/a, not a failure.
FA_TORCH_CHECK_PARTS / FA_TORCH_TRAINING_PARTS (comma lists of part names) pick parts, run in
the order named (FA_TORCH_CHECK_PARTS: overhead, prepared, cache, fallback, correctness, host,
training, inference).
While the daemon's GPU backend has no backward kernels the training part says so and is skipped.
Exit 1 on any correctness failure, 0 otherwise (overheads and ratios are reported, not
enforced); exit 0 with SKIP when torch or CUDA is missing.
"""
import ctypes
import math
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

try:
    import torch
except ImportError:
    print("SKIP: PyTorch is not installed for %s" % sys.executable)
    sys.exit(0)
CPU_DRY_RUN = "--cpu-dry-run" in sys.argv[1:]
if not CPU_DRY_RUN and not torch.cuda.is_available():
    print("SKIP: torch.cuda.is_available() is False (no GPU or driver)")
    sys.exit(0)

import fa  # noqa: E402
import fa._attn  # noqa: E402
import fa._fast  # noqa: E402
from fa_daemon import Daemon  # noqa: E402
from stub_attention import Stubbed  # noqa: E402
from torch_ref import ref, ref_grads, rel  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
failures = []


def record(name, err, tol, extra=""):
    ok = err <= tol
    print("  %-4s %-62s err %.2e (tol %.0e)%s" % ("ok" if ok else "FAIL", name, err, tol, extra))
    if not ok:
        failures.append(name)


# (B, Sq, Sk, Hq, Hkv, D)
SHAPES = [(1, 1, 1, 1, 1, 64), (2, 77, 133, 8, 2, 64), (3, 129, 65, 6, 3, 128),
          (1, 1, 1000, 4, 1, 128), (1, 33, 33, 5, 5, 40), (2, 200, 17, 4, 4, 96),
          (1, 64, 300, 2, 2, 256)]


def correctness(c):
    g = torch.Generator(device="cuda").manual_seed(0)
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        for B, Sq, Sk, Hq, Hkv, D in SHAPES:
            if dt == torch.float32 and D > 128:
                continue
            name = "%s B%d Sq%d Sk%d H%d/%d D%d" % (str(dt)[6:], B, Sq, Sk, Hq, Hkv, D)
            q = torch.randn(B, Sq, Hq, D, device="cuda", dtype=dt, generator=g)
            k = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt, generator=g)
            v = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt, generator=g)
            for causal in (False, True):
                # flash_attn_func: BSHD contiguous, bottom-right causal, with lse
                o, lse = fa.flash_attn_func(q, k, v, causal=causal, return_lse=True, client=c)
                ro, rl = ref(q, k, v, "br" if causal else "none")
                record("flash %s causal=%d bshd" % (name, causal), rel(o, ro), TOL[dt])
                fin = torch.isfinite(rl)
                le = (lse.double()[fin] - rl[fin]).abs().max().item() if fin.any() else 0.0
                if not torch.equal(torch.isneginf(lse), torch.isneginf(rl)):
                    le = math.inf
                record("flash %s causal=%d lse" % (name, causal), le,
                       1e-2 if dt != torch.float32 else 1e-4)
                # sdpa: BHSD views of BSHD memory (strided) and BHSD contiguous, top-left causal
                for layout in ("bshd-strides", "bhsd"):
                    if layout == "bhsd":
                        qq, kk, vv = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                    else:
                        qq, kk, vv = (x.transpose(1, 2) for x in (q, k, v))
                    o = fa.scaled_dot_product_attention(qq, kk, vv, is_causal=causal,
                                                        enable_gqa=Hq != Hkv, client=c)
                    ro, _ = ref(q, k, v, "tl" if causal else "none")
                    extra = ""
                    if not (causal and Sq > Sk):  # torch gives NaN rows there
                        try:
                            t = torch.nn.functional.scaled_dot_product_attention(
                                qq, kk, vv, is_causal=causal, enable_gqa=Hq != Hkv)
                            extra = "  torch sdpa err %.2e" % rel(t.transpose(1, 2), ro)
                        except RuntimeError as e:
                            extra = "  torch sdpa: %s" % str(e).splitlines()[0][:40]
                    record("sdpa  %s causal=%d %s" % (name, causal, layout),
                           rel(o.transpose(1, 2), ro), TOL[dt], extra)


def host_and_async(c):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 31, 4, 64, generator=g)
    k = torch.randn(2, 45, 2, 64, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fa.FaCopyWarning)
        o = fa.flash_attn_func(q, k, k, causal=True, client=c)
    record("cpu fp32 tensors (staged)", rel(o, ref(q, k, k, "br")[0]), 1e-5)
    qh = fa.empty_host((2, 31, 4, 64), torch.bfloat16, client=c)
    qh.copy_(q)
    oh = fa.empty_host((2, 31, 4, 64), torch.bfloat16, client=c)
    fa._attn._warned.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        fa.flash_attn_func(qh, qh, qh, out=oh, client=c)
    copies = [x for x in w if issubclass(x.category, fa.FaCopyWarning)]
    record("cpu bf16 in fa.empty_host, in place (%d copy warnings)" % len(copies),
           rel(oh, ref(qh, qh, qh, "none")[0]) if not copies else math.inf, 1e-2)
    qd = torch.randn(1, 100, 8, 128, device="cuda", dtype=torch.float16)
    try:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = qd * 1.0  # queued on s: the call must wait for it without a host sync
            o = fa.flash_attn_func(x, x, x, client=c, stream="current")
            o2 = o * 1.0
        s.synchronize()
        record("async mode on a side stream", rel(o2, ref(qd, qd, qd, "none")[0]), 2e-3)
    except fa.FaError as e:
        print("  note async mode unavailable here: %s" % e)


def cache(c):
    q = torch.randn(2, 128, 8, 64, device="cuda", dtype=torch.bfloat16)
    o = torch.empty_like(q)
    fa.flash_attn_func(q, q, q, out=o, client=c)
    before = c.device_registrations_made
    for _ in range(50):
        fa.flash_attn_func(q, q, q, out=o, client=c)
        fa.flash_attn_func(q, q, q, client=c)  # fresh outputs from the caching allocator
    made = c.device_registrations_made - before
    print("  %-4s registration cache: %d registrations in 100 calls after the first "
          "(%d allocations registered)" % ("ok" if made <= 1 else "FAIL", made,
                                           c.device_cache_size))
    if made > 1:
        failures.append("registration cache")


def overhead(c):
    q = torch.randn(1, 128, 16, 64, device="cuda", dtype=torch.bfloat16)
    o = torch.empty_like(q)
    for _ in range(50):
        fa.flash_attn_func(q, q, q, out=o, client=c)
    torch.cuda.synchronize()
    # The bare C call: the same arguments, built once.
    block = ctypes.create_string_buffer(ctypes.sizeof(fa._abi.fa_attn_fwd_args) + 256)
    bufq, offq = c._device_find(q.data_ptr(), fa._cuda.driver())
    bufo, offo = c._device_find(o.data_ptr(), fa._cuda.driver())
    st = q.stride()
    for name, (b, off) in (("q", (bufq, offq)), ("k", (bufq, offq)), ("v", (bufq, offq)),
                           ("o", (bufo, offo))):
        fa._attn._TENSOR.pack_into(block, fa._attn._OFF[name], b, off, fa._abi.FA_DTYPE_BF16,
                                   *q.shape, *st)
    lib, h, addr = c._lib, c._c, ctypes.addressof(block)
    # the fast path's own library call, on the placement the last Python call wrote
    plan = c._tls.fast.mru[fa._fast.FWD][1]
    pp, place = plan.pp, plan.place_addr

    def p50(fn, n=1000):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            fn()
            ts.append(time.perf_counter_ns() - t0)
        return statistics.median(ts) / 1000.0

    def bare():
        if lib.fa_attn_fwd(h, addr):
            raise RuntimeError("bare fa_attn_fwd failed")

    def bare_prepared():
        if lib.fa_prepared_call(pp, place):
            raise RuntimeError("bare fa_prepared_call failed")

    py = lambda: fa.flash_attn_func(q, q, q, out=o, client=c)  # noqa: E731
    fresh = lambda: fa.flash_attn_func(q, q, q, client=c)  # noqa: E731
    stream = torch.cuda.current_stream()
    drv = fa._cuda.driver()
    raw = fa._fast.current_stream(q.get_device())
    hits = fa._fast.hits
    best = {}
    for _ in range(3):  # interleaved, best of three rounds
        for name, fn in (("c", bare), ("prep", bare_prepared), ("py", py), ("fresh", fresh),
                         ("sync", stream.synchronize),
                         ("rawsync", lambda: drv.stream_synchronize(raw)),
                         ("id", lambda: drv.buffer_id(q.data_ptr())),
                         ("range", lambda: drv.range_of(q.data_ptr()))):
            best[name] = min(best.get(name, math.inf), p50(fn))
    served = fa._fast.hits - hits
    tc, tp = best["c"], best["py"]
    d = tp - tc
    print("  overhead: C call p50 %.1f us, fa.flash_attn_func p50 %.1f us: +%.1f us per call "
          "(PyTorch's stream sync alone %.1f us, through the driver %.1f us); target "
          "<= 10 us: %s" % (tc, tp, d, best["sync"], best["rawsync"],
                            "met" if d <= 10 else "MISSED"))
    print("  overhead: fresh outputs (torch.empty_like each call) p50 %.1f us (+%.1f us); "
          "%d of %d timed Python calls served by a prepared block; one buffer-id query "
          "through Python %.2f us, the full pointer query %.2f us" % (
              best["fresh"], best["fresh"] - tc, served, 6000, best["id"], best["range"]))
    with Stubbed(c):
        side = {}
        for _ in range(3):
            for on in (True, False):
                fa._fast.enabled = on
                side[on] = min(side.get(on, math.inf), p50(py))
        fa._fast.enabled = True
    print("  overhead: breakdown of the +%.1f us: the library's side (fa_prepared_call %.1f us "
          "- bare fa_attn_fwd %.1f us: place checks, two buffer-id queries, the stream sync) "
          "%+.1f us, the Python side (attention calls stubbed) %.1f us (full path, fa._fast "
          "off: %.1f us), the rest %+.1f us" % (
              d, best["prep"], tc, best["prep"] - tc, side[True], side[False],
              tp - best["prep"] - side[True]))


def stub_attention(c):
    """c's attention calls become no-ops (the host side alone); registrations still happen
    (`unstub_attention(c)` undoes it)."""
    s = Stubbed(c)
    s.__enter__()
    c._stubbed = s


def unstub_attention(c):
    c._stubbed.__exit__()
    del c._stubbed


def prepared(c):
    """The library's prepared call on device memory (client/fa_prepared.c), through ctypes: a
    forward placed in a cuMemAlloc allocation runs; the same allocation freed and another made
    at the same address is refused by the buffer id (FA_EREGION, moved 0) before anything is
    sent; a place past the allocation is FA_ERANGE; the stream wait and the asynchronous mode
    on PyTorch's stream run."""
    A = fa._abi
    drv = fa._cuda.driver()
    x = torch.empty(1, device="cuda")  # the context PyTorch made current
    ctx = drv.context_of(x.data_ptr(), x.get_device())
    S, D = 16, 64
    tbytes = S * D * 2
    size = 4 * tbytes
    mem = drv.mem_alloc(ctx, size)
    lib, h = c._lib, c._c
    b = ctypes.c_void_p()
    st = lib.fa_buffer_register_device(h, mem, size, ctypes.byref(b))
    if st:
        raise RuntimeError("fa_buffer_register_device: %s" % lib.fa_status_name(st).decode())
    block = ctypes.create_string_buffer(ctypes.sizeof(A.fa_attn_fwd_args) + A.ARGS_SLACK)
    names = ("q", "k", "v", "o")
    for i, n in enumerate(names):
        fa._attn._TENSOR.pack_into(block, fa._attn._OFF[n], b.value, i * tbytes,
                                   A.FA_DTYPE_FP16, 1, S, 1, D, S * D, D, D, 1)
    fields = (ctypes.c_uint32 * 4)(*[fa._attn._OFF[n] for n in names])
    spans = (ctypes.c_uint64 * 4)(*([tbytes] * 4))
    pp = ctypes.c_void_p()
    st = lib.fa_prepare(h, A.FA_PREPARED_FWD, block, 4, fields, spans, ctypes.byref(pp))
    if st:
        raise RuntimeError("fa_prepare: %s" % lib.fa_status_name(st).decode())
    pl = A.fa_placement()
    raw = fa._fast.current_stream(x.get_device())

    def call(addrs, flags=0, stream=None):
        pl.flags, pl.stream, pl.moved = flags, stream, 99
        for i, a in enumerate(addrs):
            pl.buf[i], pl.addr[i] = b.value, a
        r = lib.fa_prepared_call(pp.value, ctypes.addressof(pl))
        return lib.fa_status_name(r).decode(), pl.moved

    at = [mem + i * tbytes for i in range(4)]
    try:
        got = {"placed": call(at), "sync stream": call(at, A.FA_PLACE_SYNC_STREAM, raw),
               "async": call(at, A.FA_PLACE_ASYNC, raw)}
        torch.cuda.synchronize()
        got["past the allocation"] = call(at[:3] + [mem + size - tbytes + 16])
        want = {"placed": ("FA_OK", -1), "sync stream": ("FA_OK", -1),
                "async": ("FA_OK", -1), "past the allocation": ("FA_ERANGE", 3)}
        drv.mem_free(ctx, mem)
        mem2 = drv.mem_alloc(ctx, size)
        if mem2 == mem:
            got["freed, made anew at the same address"] = call(at)
            want["freed, made anew at the same address"] = ("FA_EREGION", 0)
        else:
            print("  n/a  prepared: the driver gave the new allocation another address "
                  "(0x%x, was 0x%x): the reuse case did not arise" % (mem2, mem))
        drv.mem_free(ctx, mem2)
    finally:
        lib.fa_buffer_free(b.value)
        lib.fa_prepared_free(pp.value)
    for name, w in want.items():
        ok = got[name] == w
        print("  %-4s prepared call on device memory, %s: %s moved %d (want %s %d)" % (
            "ok" if ok else "FAIL", name, got[name][0], got[name][1], w[0], w[1]))
        if not ok:
            failures.append("prepared " + name)


FALLBACK_MODES = {
    # PyTorch's caching allocator on cuMemCreate/cuMemMap segments (VMM)
    "expandable_segments": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    # PyTorch on cudaMallocAsync's stream-ordered pool
    "cudaMallocAsync": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    # cuMemAllocManaged memory wrapped as a tensor (__cuda_array_interface__)
    "managed": {},
}


def fallback_child(mode):
    """In a process of its own (the allocator is chosen at CUDA's start): what CUDA IPC says of
    this memory, then fa's copy through an exportable staging buffer, its one warning, the
    results against float64, a backward through it, and the cost of the copy."""
    c = fa.Client(os.environ["FA_SOCKET"])
    drv = fa._cuda.driver()
    g = torch.Generator(device="cuda").manual_seed(5)
    shape = (2, 77, 4, 64)
    if mode == "managed":
        n = 4 * 2 * 77 * 4 * 64 * 2
        drv.lib.cuMemAllocManaged.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        p = ctypes.c_uint64(0)
        torch.zeros(1, device="cuda")  # the primary context current on this thread
        r = drv.lib.cuMemAllocManaged(ctypes.addressof(p), n, 1)
        assert r == 0, "cuMemAllocManaged: %d" % r

        class Managed:
            __cuda_array_interface__ = {"data": (p.value, False), "shape": (4,) + shape,
                                        "typestr": "<f2", "version": 3}
        mem = torch.as_tensor(Managed(), device="cuda")
        mem.copy_(torch.randn((4,) + shape, device="cuda", dtype=torch.float16, generator=g))
        q, k, v, o = mem.unbind(0)
    else:
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16, generator=g)
                   for _ in range(3))
        o = torch.empty_like(q)
    ptr = q.data_ptr()
    base = drv.range_of(ptr)[0]
    drv.lib.cuIpcGetMemHandle.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    handle = (ctypes.c_char * 64)()
    ipc = drv.lib.cuIpcGetMemHandle(ctypes.addressof(handle), base)
    print("  note %s: cuIpcGetMemHandle says CUresult %d, IS_LEGACY_CUDA_IPC_CAPABLE %d, "
          "cause: %s" % (mode, ipc, drv.exportable(ptr),
                         drv.not_exportable_cause(ptr) if not drv.exportable(ptr) else "-"))
    ok = True
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            fa.flash_attn_func(q, k, v, causal=True, out=o, client=c)
    said = [str(x.message) for x in w if issubclass(x.category, fa.FaCopyWarning)]
    err = rel(o, ref(q, k, v, "br")[0])
    good = err <= 2e-3 and (len(said) == 1 or (ipc == 0 and not said))
    ok &= good
    print("  %-4s %s: forward through the staging copy, err %.2e, %d copy warning(s) in 3 "
          "calls%s" % ("ok" if good else "FAIL", mode, err, len(said),
                       (": " + said[0][:150]) if said else ""))
    x = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    gout = torch.randn(shape, device="cuda", dtype=torch.float16, generator=g)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fa.FaCopyWarning)
            fa.flash_attn_func(*x, causal=True, client=c).backward(gout)
        want = ref_grads(q, k, v, gout, "br")
        e = max(rel(a.grad, b) for a, b in zip(x, want[1:]))
        good = e <= 5e-3
        ok &= good
        print("  %-4s %s: gradients through the staging copy, worst err %.2e"
              % ("ok" if good else "FAIL", mode, e))
    except fa.FaNotSupportedError as e:
        print("  note %s: no backward here: %s" % (mode, e))

    def p50(fn, n=200):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            fn()
            ts.append(time.perf_counter_ns() - t0)
        return statistics.median(ts) / 1000.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fa.FaCopyWarning)
        t = p50(lambda: fa.flash_attn_func(q, k, v, causal=True, out=o, client=c))
    print("  note %s: one staged call B2 S77 H4 D64 fp16 p50 %.1f us" % (mode, t))
    c.close()
    return 0 if ok else 1


def fallback(url):
    import subprocess
    for mode, env in FALLBACK_MODES.items():
        e = dict(os.environ, FA_SOCKET=url, **env)
        try:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--fallback-child",
                                mode], env=e, capture_output=True, text=True, timeout=120)
            out, rc = r.stdout + r.stderr, r.returncode
        except subprocess.TimeoutExpired as t:
            out, rc = (t.stdout or "") if isinstance(t.stdout, str) else "", "timeout"
        sys.stdout.write(out if out.endswith("\n") or not out else out + "\n")
        if rc != 0:
            print("  FAIL fallback %s: exit %s" % (mode, rc))
            failures.append("fallback " + mode)


# ---- training: the backward through autograd ------------------------------------------------
# Gradients against float64 (the forward's rounding feeds them, so looser than the forward's).
GTOL = {torch.float32: 5e-5, torch.float16: 5e-3, torch.bfloat16: 4e-2}
# (B, Sq, Sk, Hq, Hkv, D): odd lengths, Sq != Sk both ways, GQA/MQA, head dims 40..256
TRAIN_SHAPES = [(1, 1, 1, 1, 1, 64), (2, 77, 133, 8, 2, 64), (3, 129, 65, 6, 3, 128),
                (1, 1, 1000, 4, 1, 128), (1, 33, 33, 5, 5, 40), (2, 200, 17, 4, 4, 96),
                (1, 64, 300, 2, 2, 256), (1, 1000, 1000, 4, 4, 128), (1, 127, 129, 4, 2, 256)]
over_sdpa = []  # (case, ratio): fa's gradient error above 1.5x torch SDPA's (reported)
# The training part on CPU tensors and the CPU backend (--cpu-dry-run, small shapes): to try
# this script's code where there is no GPU; the GPU host runs it on "cuda".
DEV = "cuda"


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def grads_of(fn, xs, gout):
    """[o, dq, dk, dv] of fn(*xs) with upstream gradient gout (fresh leaves of xs)."""
    xs = [x.detach().clone().requires_grad_() for x in xs]
    o = fn(*xs)
    o.backward(gout)
    return [o.detach()] + [x.grad for x in xs]


def backward_available(c):
    x = torch.randn(1, 8, 1, 64, device=DEV, dtype=torch.float16, requires_grad=True)
    try:
        fa.flash_attn_func(x, x, x, client=c).sum().backward()
    except fa.FaNotSupportedError as e:
        print("  SKIP training cases: the daemon serves no backward here: %s" % e)
        return False
    return True


def gradient_case(c, name, q, k, v, gout, causal, gqa, dt):
    """flash_attn_func (BSHD, bottom-right) and scaled_dot_product_attention (BHSD views,
    top-left, torch SDPA's error beside) gradients of one case against float64."""
    F = torch.nn.functional
    want = ref_grads(q, k, v, gout, "br" if causal else "none")
    got = grads_of(lambda a, b, x: fa.flash_attn_func(a, b, x, causal=causal,
                                                      client=c), (q, k, v), gout)
    for i, gname in enumerate(("dq", "dk", "dv"), 1):
        record("grad flash %s causal=%d %s" % (name, causal, gname),
               rel(got[i], want[i]), GTOL[dt])
    # sdpa: BHSD views of BSHD memory, top-left, against torch's SDPA (same dtype)
    want = ref_grads(q, k, v, gout, "tl" if causal else "none")
    views = [x.transpose(1, 2) for x in (q, k, v)]
    got = grads_of(lambda a, b, x: fa.scaled_dot_product_attention(
        a, b, x, is_causal=causal, enable_gqa=gqa, client=c), views,
        gout.transpose(1, 2))
    try:
        t = grads_of(lambda a, b, x: F.scaled_dot_product_attention(
            a, b, x, is_causal=causal, enable_gqa=gqa), views, gout.transpose(1, 2))
    except RuntimeError:
        t = None
    for i, gname in enumerate(("dq", "dk", "dv"), 1):
        e = rel(got[i].transpose(1, 2), want[i])
        extra = ""
        if t is not None:
            te = rel(t[i].transpose(1, 2), want[i])
            ratio = e / te if te > 0 else (0.0 if e == 0 else math.inf)
            extra = "  sdpa %.2e  x%.2f" % (te, ratio)
            if ratio > 1.5:
                over_sdpa.append(("sdpa %s causal=%d %s" % (name, causal, gname),
                                  ratio))
        record("grad sdpa  %s causal=%d %s" % (name, causal, gname), e, GTOL[dt],
               extra)


def gradients(c):
    g = torch.Generator(device=DEV).manual_seed(2)
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        for B, Sq, Sk, Hq, Hkv, D in TRAIN_SHAPES:
            name = "%s B%d Sq%d Sk%d H%d/%d D%d" % (str(dt)[6:], B, Sq, Sk, Hq, Hkv, D)
            q = torch.randn(B, Sq, Hq, D, device=DEV, dtype=dt, generator=g)
            k = torch.randn(B, Sk, Hkv, D, device=DEV, dtype=dt, generator=g)
            v = torch.randn(B, Sk, Hkv, D, device=DEV, dtype=dt, generator=g)
            gout = torch.randn(B, Sq, Hq, D, device=DEV, dtype=dt, generator=g)
            for causal in (False, True):
                try:
                    gradient_case(c, name, q, k, v, gout, causal, Hq != Hkv, dt)
                except fa.FaError as e:  # a configuration the daemon refuses: this case fails
                    print("  FAIL grad %s causal=%d: %s" % (name, causal, e))
                    failures.append("grad %s causal=%d" % (name, causal))
    # fp32 precisions on the seed's case (fp32, D=128, causal)
    q, k, v, gout = (torch.randn(2, 300, 8, 128, device=DEV, generator=g) for _ in range(4))
    want = ref_grads(q, k, v, gout, "br")
    for prec, tol in (("ieee", 1e-5), ("3xtf32", 5e-5), ("tf32", 1e-2), ("bf16", 5e-2)):
        got = grads_of(lambda a, b, x: fa.flash_attn_func(a, b, x, causal=True, precision=prec,
                                                          client=c), (q, k, v), gout)
        record("grad flash fp32 D128 causal precision=%s (dq, dk, dv worst)" % prec,
               max(rel(got[i], want[i]) for i in (1, 2, 3)), tol)


def training_layouts_and_modes(c):
    g = torch.Generator(device=DEV).manual_seed(3)
    # packed qkv [B, S, 3, H, D] (views that are not dense): the gradient lands in qkv.grad
    qkv = torch.randn(2, 257, 3, 8, 64, device=DEV, dtype=torch.bfloat16, generator=g)
    gout = torch.randn(2, 257, 8, 64, device=DEV, dtype=torch.bfloat16, generator=g)
    leaf = qkv.clone().requires_grad_()
    fa.flash_attn_func(*leaf.unbind(2), causal=True, client=c).backward(gout)
    want = ref_grads(*qkv.unbind(2), gout, "br")
    record("grad packed qkv bf16 causal (qkv.grad)",
           rel(leaf.grad, torch.stack(want[1:], 2)), GTOL[torch.bfloat16])
    # upstream gradients: expanded (o.sum(): copied), transposed (head dim contiguous: not)
    q = torch.randn(2, 8, 100, 64, device=DEV, dtype=torch.float16, generator=g)
    # (o.sum()'s gradient is constant along the head dim: dS = P (dP - delta) cancels, so
    # fp16 rounding weighs more there; torch SDPA's own error is printed beside it)
    for what, loss, tol in (("o.sum()", lambda o: o.float().sum(), 2e-2),
                            ("transposed", lambda o: (o.transpose(1, 2) *
                                                      q.transpose(1, 2)).sum(), 5e-3)):
        errs = []
        for fn in (lambda *x: fa.scaled_dot_product_attention(*x, client=c),
                   torch.nn.functional.scaled_dot_product_attention):
            got = [x.requires_grad_() for x in (q.clone(), q.clone(), q.clone())]
            loss(fn(*got)).backward()
            ref_x = [x.detach().double().requires_grad_() for x in got]
            loss(torch.nn.functional.scaled_dot_product_attention(*ref_x)).backward()
            errs.append(max(rel(a.grad, b.grad) for a, b in zip(got, ref_x)))
        record("grad upstream %s fp16 (dq, dk, dv worst)" % what, errs[0], tol,
               "  sdpa %.2e" % errs[1])
    # deterministic: the same bits twice; the atomic default reported
    n = 1000 if DEV == "cuda" else 100
    q, k, v, gout = (torch.randn(2, n, 16, 128, device=DEV, dtype=torch.bfloat16,
                                 generator=g) for _ in range(4))
    for det in (True, False):
        runs = [grads_of(lambda a, b, x: fa.flash_attn_func(a, b, x, causal=True,
                                                            deterministic=det, client=c),
                         (q, k, v), gout) for _ in range(3)]
        same = all(torch.equal(runs[0][i], r[i]) for r in runs[1:] for i in (1, 2, 3))
        if det:
            print("  %-4s deterministic=True: 3 runs bit for bit %s" % (
                "ok" if same else "FAIL", "equal" if same else "DIFFERENT"))
            if not same:
                failures.append("deterministic backward")
        else:
            print("  note deterministic=False: 3 runs %s" % (
                "bit for bit equal" if same else "differ in the last bits (atomics)"))
    # asynchronous mode: forward and backward ordered on a side stream
    if DEV != "cuda":
        return
    x = torch.randn(1, 300, 8, 128, device=DEV, dtype=torch.float16, generator=g)
    gout = torch.randn_like(x)
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            leaf = (x * 1.0).requires_grad_()
            fa.flash_attn_func(leaf, leaf, leaf, causal=True, client=c,
                               stream="current").backward(gout)
            dx = leaf.grad * 1.0
        s.synchronize()
        want = ref_grads(x, x, x, gout, "br")
        record("grad async mode on a side stream (dq+dk+dv)", rel(dx, sum(want[1:])),
               GTOL[torch.float16])
    except fa.FaError as e:
        print("  note async backward unavailable here: %s" % e)


def training_compile(c):
    class Block(torch.nn.Module):
        def __init__(self, d=256, hq=8, hkv=2, hd=64):
            super().__init__()
            self.hq, self.hkv, self.hd = hq, hkv, hd
            self.wq = torch.nn.Linear(d, hq * hd)
            self.wkv = torch.nn.Linear(d, 2 * hkv * hd)
            self.wo = torch.nn.Linear(hq * hd, d)

        def forward(self, x):
            B, S, _ = x.shape
            q = self.wq(x).view(B, S, self.hq, self.hd).transpose(1, 2)
            kv = self.wkv(x).view(B, S, 2, self.hkv, self.hd)
            o = fa.scaled_dot_product_attention(q, kv[:, :, 0].transpose(1, 2),
                                                kv[:, :, 1].transpose(1, 2), is_causal=True,
                                                enable_gqa=True, client=c)
            return self.wo(o.transpose(1, 2).reshape(B, S, -1))

    for dt in (torch.float32, torch.bfloat16):
        torch.manual_seed(4)
        m = Block().to(DEV, dt)
        x = torch.randn(2, 333 if DEV == "cuda" else 33, 256, device=DEV, dtype=dt)

        def step(fn):
            m.zero_grad(set_to_none=True)
            y = fn(x)
            y.float().square().sum().backward()
            return [y.detach()] + [p.grad.clone() for p in m.parameters()]
        eager = step(m)
        try:
            torch._dynamo.reset()
            comp = step(torch.compile(m, fullgraph=True))
        except Exception as e:  # a graph break or a compile error is this check's failure
            print("  FAIL torch.compile(fullgraph=True) %s: %s" % (dt, str(e).splitlines()[0]))
            failures.append("torch.compile %s" % dt)
            continue
        record("torch.compile fullgraph %s block forward+backward vs eager (worst)" %
               str(dt)[6:], max(rel(a, b) for a, b in zip(comp, eager)),
               1e-4 if dt == torch.float32 else 2e-2)


def training_overhead(c):
    """Figures: the autograd path's cost per call, and a training step against torch's SDPA."""
    from fa import _torch as FT
    q = torch.randn(1, 128, 16, 64, device=DEV, dtype=torch.bfloat16)
    leaf = q.clone().requires_grad_()

    def p50(fn, n=300):
        for _ in range(30):
            fn()
        sync()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            fn()
            ts.append(time.perf_counter_ns() - t0)
        return statistics.median(ts) / 1000.0
    plain = p50(lambda: fa.flash_attn_func(q, q, q, client=c))
    line = ["  training overhead (p50, B1 S128 H16 D64 bf16): plain forward %.1f us" % plain]
    for route in ("function", "op"):
        FT.route = route
        line.append("%s forward %.1f us, forward+backward %.1f us" % (
            "autograd.Function" if route == "function" else "custom op",
            p50(lambda: fa.flash_attn_func(leaf, leaf, leaf, client=c)),
            p50(lambda: fa.flash_attn_func(leaf, leaf, leaf, client=c).sum().backward())))
    FT.route = "auto"
    print("; ".join(line))
    B, S, H, D = (2, 4096, 16, 128) if DEV == "cuda" else (1, 256, 4, 64)
    x = [torch.randn(B, H, S, D, device=DEV, dtype=torch.bfloat16).requires_grad_()
         for _ in range(3)]
    gout = torch.randn(B, H, S, D, device=DEV, dtype=torch.bfloat16)
    flops = 4 * B * H * S * S * D / 2 * 3.5  # causal forward + 2.5x backward
    steps = 10

    def timed(fn):
        for _ in range(3):
            fn().backward(gout)
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            fn().backward(gout)
        sync()
        return (time.perf_counter() - t0) / steps * 1e3

    def compute_us():
        r = c.stats().get("requests", {})
        return r.get("fwd_compute_us_total", 0), r.get("bwd_compute_us_total", 0)
    shape = "B%d S%d H%d D%d bf16 causal" % (B, S, H, D)
    for name, fn in (("fa (default: async on the current stream)",
                      lambda: fa.scaled_dot_product_attention(*x, is_causal=True, client=c)),
                     ("fa stream='sync'",
                      lambda: fa.scaled_dot_product_attention(*x, is_causal=True, client=c,
                                                              stream="sync")),
                     ("torch sdpa", lambda: torch.nn.functional.scaled_dot_product_attention(
                         *x, is_causal=True))):
        made, hits, cu = c.device_registrations_made, fa._fast.hits, compute_us()
        ms = timed(fn)
        cu2 = compute_us()
        extra = ""
        if name.startswith("fa"):
            extra = ("; in the daemon per step: forward %.2f ms, backward %.2f ms (enqueue to "
                     "completion); %d registrations and %d of %d calls through a prebuilt "
                     "block over the 13 steps" % (
                         (cu2[0] - cu[0]) / 13e3, (cu2[1] - cu[1]) / 13e3,
                         c.device_registrations_made - made, fa._fast.hits - hits, 26))
        print("  training step %s, %s: %.2f ms (%.0f TFLOP/s, backward counted 2.5x)%s" % (
            shape, name, ms, flops / ms / 1e9, extra))
    # the parts: one forward and one backward call alone (synchronous, outputs given: the
    # round trip and the kernel), and the host side of a step with the daemon calls stubbed
    q, k, v = (t.detach() for t in x)
    o = torch.empty_like(q)
    lse = torch.empty(B, H, S, device=DEV)
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))

    def per_call(fn, n=10):
        for _ in range(2):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        return (time.perf_counter() - t0) / n * 1e3
    tf = per_call(lambda: fa.attn_fwd(q, k, v, layout="bhsd", mask=fa.MASK_CAUSAL_TOP_LEFT,
                                      out=o, lse=lse, client=c))
    tb = per_call(lambda: fa.attn_bwd(q, k, v, o, gout, lse, layout="bhsd",
                                      mask=fa.MASK_CAUSAL_TOP_LEFT, dq=dq, dk=dk, dv=dv,
                                      client=c))
    tsf = per_call(lambda: torch.nn.functional.scaled_dot_product_attention(
        *x, is_causal=True).detach())
    stub_attention(c)
    try:
        host = per_call(lambda: fa.scaled_dot_product_attention(
            *x, is_causal=True, client=c).backward(gout), 30)
    finally:
        unstub_attention(c)
    print("  training step parts: fa forward call %.2f ms, fa backward call %.2f ms "
          "(synchronous, each the round trip and the kernel); torch sdpa forward %.2f ms; "
          "the host side of an fa step (daemon calls stubbed: Python, autograd, the .grad "
          "sums) %.2f ms" % (tf, tb, tsf, host))


def training(c):
    if not backward_available(c):
        return
    if DEV != "cuda":
        TRAIN_SHAPES[:] = [s for s in TRAIN_SHAPES if s[1] * s[2] <= 40000]
    tparts = os.environ.get("FA_TORCH_TRAINING_PARTS", "").split(",")
    for part in (training_overhead, gradients, training_layouts_and_modes, training_compile):
        if tparts != [""] and part.__name__ not in tparts:
            continue
        try:
            part(c)
        except Exception as e:  # one part failing must not hide the others' figures
            import traceback
            traceback.print_exc()
            print("  FAIL %s: %s: %s" % (part.__name__, type(e).__name__, e))
            failures.append(part.__name__)
    if over_sdpa:
        worst = max(over_sdpa, key=lambda x: x[1])
        print("  note %d gradient cases above 1.5x torch SDPA's error (worst x%.2f: %s)" % (
            len(over_sdpa), worst[1], worst[0]))
    else:
        print("  ok   every gradient within 1.5x torch SDPA's error where SDPA ran")


# ---- inference: window, softcap, varlen, KV cache ----------------------------------------
def _np64(x):
    return x.detach().float().cpu().numpy()


def _served(name, fn):
    """fn() or None when the daemon refuses it with FA_ENOTSUP (a GPU build without that
    kernel: reported, not a failure)."""
    try:
        return fn()
    except fa.FaNotSupportedError as e:
        print("  n/a  %-62s FA_ENOTSUP: %s" % (name, e.detail[:70]))
        return None


def inference(c):
    """flash_attn_func with a window and softcap (forward; the backward where served),
    flash_attn_varlen_func over ragged decode and prefill batches, flash_attn_with_kvcache on
    contiguous and paged caches (page sizes 16 and 256, shuffled tables) with the append, each
    against infer_ref.py's float64 reference."""
    import numpy as np
    import infer_ref as R
    g = torch.Generator(device=DEV).manual_seed(7)

    def rn(*shape, dt=torch.float16):
        return torch.randn(*shape, device=DEV, dtype=dt, generator=g)
    dts = (torch.float16, torch.bfloat16) if DEV == "cuda" else (torch.float32,)
    for dt in dts:
        tol = TOL[dt]
        for B, Sq, Sk, Hq, Hkv, D in ((2, 77, 133, 8, 2, 64), (1, 1, 1000, 4, 1, 128)):
            q, k, v = rn(B, Sq, Hq, D, dt=dt), rn(B, Sk, Hkv, D, dt=dt), rn(B, Sk, Hkv, D, dt=dt)
            for causal, w, cap in ((True, (31, 0), 0.0), (False, (16, 16), 0.0),
                                   (True, (-1, -1), 30.0), (False, (40, -1), 5.0)):
                name = "window %s B%d Sq%d Sk%d w%s cap%g c%d" % (str(dt)[6:], B, Sq, Sk, w,
                                                                   cap, causal)
                o = _served(name, lambda: fa.flash_attn_func(q, k, v, causal=causal,
                                                             window_size=w, softcap=cap,
                                                             client=c))
                if o is not None:
                    wo, _ = R.dense(_np64(q), _np64(k), _np64(v), causal, w, cap)
                    record(name, rel(o, torch.from_numpy(wo)), tol)
        xs = [rn(2, 65, 4, 64, dt=dt).requires_grad_() for _ in range(3)]
        name = "window backward %s w(17,0) cap10" % str(dt)[6:]

        def bwd():
            o = fa.flash_attn_func(*xs, causal=True, window_size=(17, 0), softcap=10.0,
                                   client=c)
            o.float().square().sum().backward()
            return o
        if _served(name, bwd) is not None:
            rs = [torch.from_numpy(_np64(x)).double().requires_grad_() for x in xs]
            import test_torch_infer as TI
            TI.ref_window(*rs, True, (17, 0), 10.0).square().sum().backward()
            for n, x, r in zip("qkv", xs, rs):
                record("%s d%s" % (name, n), rel(x.grad, r.grad), 4 * tol)
        # varlen: decode (1..16 queries per sequence) and prefill, with an empty sequence
        for lens_q, lens_k in (([1, 1, 4, 16], [1000, 17, 129, 4097]),
                               ([127, 1, 0, 300], [129, 1, 5, 300])):
            cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32, device=DEV)
            cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32, device=DEV)
            q = rn(int(cu_q[-1]), 8, 128, dt=dt)
            k, v = rn(int(cu_k[-1]), 2, 128, dt=dt), rn(int(cu_k[-1]), 2, 128, dt=dt)
            for causal in (False, True):
                name = "varlen %s q%s causal=%d" % (str(dt)[6:], lens_q, causal)
                o = _served(name, lambda: fa.flash_attn_varlen_func(
                    q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, client=c))
                if o is not None:
                    wo, _ = R.varlen(_np64(q), _np64(k), _np64(v), _np64(cu_q).astype(int),
                                     _np64(cu_k).astype(int), causal)
                    record(name, rel(o, torch.from_numpy(wo)), tol)
        # KV cache: contiguous and paged (16, 256), decode Sq 1 and 4, append of Sq tokens
        B, Hq, Hkv, D = 3, 8, 2, 128
        lens = torch.tensor([1, 1000, 4000], dtype=torch.int32, device=DEV)
        for ps in (0, 16, 256):
            for Sq in (1, 4):
                cap_tok = 4352
                if ps:
                    per = cap_tok // ps
                    pages = B * per + 5
                    kc, vc = rn(pages, ps, Hkv, D, dt=dt), rn(pages, ps, Hkv, D, dt=dt)
                    bt = torch.randperm(pages, generator=torch.Generator().manual_seed(ps))[
                        :B * per].view(B, per).to(torch.int32).to(DEV)
                else:
                    kc, vc = rn(B, cap_tok, Hkv, D, dt=dt), rn(B, cap_tok, Hkv, D, dt=dt)
                    bt = None
                q, kn, vn = rn(B, Sq, Hq, D, dt=dt), rn(B, Sq, Hkv, D, dt=dt), rn(B, Sq, Hkv, D,
                                                                                  dt=dt)
                name = "kvcache %s page%d Sq%d append" % (str(dt)[6:], ps, Sq)
                o = _served(name, lambda: fa.flash_attn_with_kvcache(
                    q, kc, vc, kn, vn, cache_seqlens=lens, block_table=bt, causal=True,
                    client=c))
                if o is not None:
                    wo, _ = R.kvcache(_np64(q), _np64(kc), _np64(vc),
                                      (_np64(lens) + Sq).astype(int),
                                      None if bt is None else _np64(bt).astype(int),
                                      causal=True)
                    record(name, rel(o, torch.from_numpy(wo)), tol)
        # a window over a cache: the GPU kernels serve it (FA_ENOTSUP here is a failure)
        q = rn(B, 1, Hq, D, dt=dt)
        kc, vc = rn(B, 4352, Hkv, D, dt=dt), rn(B, 4352, Hkv, D, dt=dt)
        name = "kvcache %s window (64, 0)" % str(dt)[6:]
        o = fa.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                       window_size=(64, 0), client=c)
        if o is not None:
            wo, _ = R.kvcache(_np64(q), _np64(kc), _np64(vc), _np64(lens).astype(int),
                              causal=True, window=(64, 0))
            record(name, rel(o, torch.from_numpy(wo)), tol)


def dry_run():
    """The training part on CPU tensors through a CPU-backend daemon (no GPU needed)."""
    global DEV
    DEV = "cpu"
    warnings.simplefilter("ignore", fa.FaCopyWarning)
    with Daemon() as d:
        c = fa.Client(d.url)
        training(c)
        try:
            inference(c)
        except Exception as e:
            import traceback
            traceback.print_exc()
            failures.append("inference: %s" % e)
        c.close()
    print("gpu_torch_check --cpu-dry-run: %d failed" % len(failures) +
          (": " + ", ".join(failures) if failures else ""))
    return 1 if failures else 0


def main():
    if CPU_DRY_RUN:
        return dry_run()
    if "--fallback-child" in sys.argv[1:]:
        return fallback_child(sys.argv[sys.argv.index("--fallback-child") + 1])
    d = None
    url = os.environ.get("FA_SOCKET")
    if not url:
        d = Daemon(backend="gpu")
        url = d.url
        print("daemon: %s (log %s)" % (url, d.log))
    try:
        c = fa.Client(url)
        print("fa %s, libfaclient %s from %s, torch %s, %s" % (
            fa.__version__, fa.library_version(), fa.library_path(), torch.__version__,
            torch.cuda.get_device_name()))
        every = (("overhead", overhead), ("prepared", prepared), ("cache", cache),
                 ("fallback", lambda c: fallback(url)), ("correctness", correctness),
                 ("host", host_and_async), ("training", training), ("inference", inference))
        # FA_TORCH_CHECK_PARTS runs the parts it names in its order (so a part named first
        # runs first under a time limit: on the H200, "inference,training" ran training
        # alone for 100 s before this order was kept)
        parts = [p for p in os.environ.get("FA_TORCH_CHECK_PARTS", "").split(",") if p]
        known = dict(every)
        unknown = [p for p in parts if p not in known]
        if unknown:
            print("FA_TORCH_CHECK_PARTS: unknown part(s) %s; the parts: %s" % (
                ", ".join(unknown), ", ".join(n for n, _ in every)))
            return 2
        for name, fn in ([(p, known[p]) for p in parts] if parts else every):
            try:
                fn(c)
            except Exception as e:  # one part failing must not hide the others' figures
                import traceback
                traceback.print_exc()
                print("  FAIL %s: %s: %s" % (name, type(e).__name__, e))
                failures.append(name)
            sys.stdout.flush()
        c.close()
    finally:
        if d is not None:
            d.close()
    print("gpu_torch_check: %d failed" % len(failures) + (": " + ", ".join(failures)
                                                          if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
