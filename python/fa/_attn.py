"""Forward attention from Python arrays: resolve each array to (fa_buffer, offset), stage what
is not in daemon-visible memory, build fa_attn_fwd_args, call, copy staged outputs back.

Layouts: fa's tensors are [B, S, H, D]; PyTorch's SDPA passes [B, H, S, D], which is the same
memory with the middle dimensions swapped, so it is the strides that change, never the data.
"""
import ctypes as C
import struct
import sys
import threading
import warnings

from . import _abi, _arrays, _cuda, _devstage, _fast
from ._arrays import CUDA, HOST
from ._client import default_client
from ._errors import FaError, usage


class FaCopyWarning(UserWarning):
    """An array was copied because its memory is not visible to the daemon (shown once)."""


_warned = set()


def _warn_once(key, text):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(text + " (shown once)", FaCopyWarning, stacklevel=5)


_TENSOR = _abi.packer(_abi.fa_tensor)
_OFF = {n: getattr(_abi.fa_attn_fwd_args, n).offset for n in ("q", "k", "v", "o", "lse")}
_SCALE = _abi.fa_attn_fwd_args.scale.offset
_MASK = _abi.fa_attn_fwd_args.mask.offset
_PREC = _abi.fa_attn_fwd_args.precision.offset
_ARGS_BYTES = C.sizeof(_abi.fa_attn_fwd_args) + _abi.ARGS_SLACK
_DOUBLE = struct.Struct("<d")
_INT = struct.Struct("<i")
_INT64 = struct.Struct("<q")
NO_WINDOW = (-1, -1)
assert C.sizeof(C.c_int) == 4
_tls = threading.local()


def window_size(w, fn="window_size"):
    """FlashAttention's window_size (left, right) as a tuple of two ints (-1: unbounded on
    that side); raises FaError FA_EINVAL for anything else."""
    try:
        left, right = w
        t = (int(left), int(right))
    except (TypeError, ValueError):
        raise usage("FA_EINVAL", "%s=%r: a pair (left, right) of ints, -1 for an unbounded "
                    "side ((-1, -1): no window)" % (fn, w)) from None
    if t[0] != left or t[1] != right or min(t) < -1:
        raise usage("FA_EINVAL", "%s=%r: each side an int >= -1 (-1: unbounded)" % (fn, w))
    return t


def softcap_value(cap):
    """softcap as a float >= 0 (0: off); FA_EINVAL otherwise (the daemon checks it again)."""
    try:
        f = float(cap)
    except (TypeError, ValueError):
        raise usage("FA_EINVAL", "softcap=%r: a number >= 0 (0: off)" % (cap,)) from None
    if not f >= 0.0 or f == float("inf"):
        raise usage("FA_EINVAL", "softcap=%r: finite and >= 0 (0: off)" % (cap,))
    return f


def pack_window(a, cls, window, softcap):
    """The window and softcap fields of an args block of struct `cls` (every args struct has
    them by these names): FlashAttention's window_size maps to fa's one for one (fa_client.h:
    a negative side is unbounded, a causal mask caps the right side at 0, as FlashAttention's
    causal does); (-1, -1) leaves the window off."""
    if window != NO_WINDOW:
        _INT.pack_into(a, cls.window.offset, 1)
        _INT64.pack_into(a, cls.window_left.offset, window[0])
        _INT64.pack_into(a, cls.window_right.offset, window[1])
    if softcap:
        _DOUBLE.pack_into(a, cls.softcap.offset, softcap)


def _args_block(nbytes=_ARGS_BYTES):
    """This thread's zeroed args block of nbytes (one per size: the forward's, the backward's)."""
    blocks = getattr(_tls, "blocks", None)
    if blocks is None:
        blocks = _tls.blocks = {}
    b = blocks.get(nbytes)
    if b is None:
        b = blocks[nbytes] = C.create_string_buffer(nbytes)
    else:
        C.memset(b, 0, nbytes)
    return b


def _np():
    np = sys.modules.get("numpy")
    if np is None:
        try:
            import numpy as np
        except ImportError:
            raise usage("FA_ENOTSUP", "host arrays outside fa's shared memory are staged "
                        "through NumPy, which is not installed") from None
    return np


def _raw(np, ptr, shape, strides, itemsize):
    """A NumPy array of raw bits over host memory at ptr (element strides)."""
    v = _arrays.View(None, HOST, "raw", ptr, {2: _abi.FA_DTYPE_FP16, 4: _abi.FA_DTYPE_FP32}
                     [itemsize], shape, strides)
    lo, hi = v.extent()
    mem = (C.c_char * max(hi - lo, 1)).from_address(lo)
    return np.ndarray(shape, dtype=np.uint16 if itemsize == 2 else np.uint32, buffer=mem,
                      offset=ptr - lo, strides=tuple(s * itemsize for s in strides))


class _Staged:
    __slots__ = ("view", "arr", "off")


def _resolve_host(c, views, names, outputs):
    """Each host View to (buf, offset); those outside fa's shm are staged. Returns the list and
    the staged outputs to copy back."""
    res, todo = [], []
    for v, n in zip(views, names):
        lo, hi = v.extent()
        hit = None
        if min(v.strides) >= 0:
            hit = c._host_find(lo, hi)
        if hit is None:
            todo.append((len(res), v, n))
            res.append(None)
        else:
            res.append(hit)
    back = []
    if todo:
        np = _np()
        sizes = []
        for _, v, _n in todo:
            nbytes = v.itemsize
            for s in v.shape:
                nbytes *= s
            sizes.append((nbytes + 255) & ~255)
        hb = c._staging(sum(sizes))
        off = 0
        for (i, v, n), size in zip(todo, sizes):
            why = ("has negative strides" if min(v.strides) < 0 else
                   "is not in fa's shared memory")
            _warn_once("host", "fa: %s %s: host arrays outside it are copied through a "
                       "shared-memory staging buffer (the daemon sees no other host memory); "
                       "allocate them with fa.empty_host(), and pass out=, to avoid the copies"
                       % (n, why))
            contig = []
            acc = 1
            for s in reversed(v.shape):
                contig.append(acc)
                acc *= s
            contig = tuple(reversed(contig))
            dst = _raw(np, hb.base + off, v.shape, contig, v.itemsize)
            if n in outputs:
                back.append((dst, v.ptr, v.shape, v.strides, v.itemsize))
            else:
                np.copyto(dst, _raw(np, v.ptr, v.shape, v.strides, v.itemsize))
            v.ptr, v.strides = hb.base + off, contig
            res[i] = (hb.buf, off)
            off += size
        res.append(hb)  # kept alive until the call is done
    return res, back


def _resolve_cuda(c, views, tnames, outputs, vq):
    """(buf, offset) of every device View, and the staging (a _devstage.Staged, or ()) of
    those whose memory CUDA IPC cannot export: copied, said once per cause in a warning."""
    drv = _cuda_driver()
    res, bad = [], []
    for i, v in enumerate(views):
        try:
            res.append(c._device_find(v.ptr, drv))
        except FaError as e:
            if e.status != "FA_EIPC":
                raise
            res.append(None)
            bad.append(i)
    if not bad:
        return res, ()
    if vq.lib != "torch":  # the copies run on the default stream: the producer first
        _sync_producer(vq)
    return res, _devstage.stage(c, drv, views, tnames, outputs, res, bad,
                                _producer_stream(vq), _warn_once)


def _cuda_driver():
    try:
        return _cuda.driver()
    except OSError as e:
        raise usage("FA_ENOGPU", "CUDA arrays need the CUDA driver here: %s" % e) from None


def _fa_dims(v, bhsd):
    sh, st = v.shape, v.strides
    if bhsd:
        return (sh[0], sh[2], sh[1], sh[3]), (st[0], st[2], st[1], st[3])
    return tuple(sh), tuple(st)


def forward(q, k, v, *, bhsd, mask, scale, want_lse, out=None, lse_out=None, client=None,
            precision=_abi.FA_PREC_DEFAULT, gqa=True, stream=None, window=NO_WINDOW,
            softcap=0.0):
    """O (and lse [B, Hq, Sq] fp32 when want_lse) for q, k, v in BHSD (bhsd) or BSHD layout.
    window: (left, right) as window_size() returns it; softcap: softcap_value()'s.
    stream: None or "sync" (synchronous: wait for the producer's stream first), "current"
    (PyTorch's current stream, asynchronous mode), or "auto" (the asynchronous mode on
    PyTorch's current stream for CUDA tensors while the daemon serves it, else synchronous:
    what autograd uses by default, see _ordered).
    Raises FaError."""
    c = client if client is not None else default_client()
    if stream == "sync" or (stream == "auto" and small_for_async(q, k, bhsd)):
        stream = None
    k_fast = None
    if _fast.enabled:
        if out is None:
            out = alloc_like(q, v)
        if want_lse and lse_out is None and out is not None:
            lse_out = alloc_lse(q, bhsd)
        if out is not None and (lse_out is not None or not want_lse):
            meta = (bhsd, mask, float(scale) if scale else 0.0, precision, gqa, window,
                    softcap)
            k_fast = _fast.serve(c, _fast.FWD, meta, (q, k, v, out, lse_out) if want_lse
                                 else (q, k, v, out), stream)
            if k_fast is None:
                return out, lse_out
    names = ("q", "k", "v")
    ins = [_arrays.view_of(x, n) for x, n in zip((q, k, v), names)]
    for vw, n in zip(ins, names):
        if len(vw.shape) != 4:
            raise usage("FA_ESHAPE", "%s: %d dimensions %s; fa takes 4: %s" % (
                n, len(vw.shape), tuple(vw.shape),
                "[batch, heads, seq, head_dim]" if bhsd else "[batch, seq, heads, head_dim]"))
    vq = ins[0]
    kind = vq.kind
    for vw, n in zip(ins[1:], names[1:]):
        if vw.kind != kind:
            raise usage("FA_EINVAL", "q is %s memory but %s is %s memory: pass all on one "
                        "device" % (kind, n, vw.kind))
        if vw.dtype != vq.dtype:
            raise usage("FA_EDTYPE", "q is %s but %s is %s: one dtype for q, k, v and out" % (
                _arrays._DTYPE_NAMES[vq.dtype], n, _arrays._DTYPE_NAMES[vw.dtype]))
    qs, ks = _fa_dims(vq, bhsd)[0], _fa_dims(ins[1], bhsd)[0]
    if not gqa and qs[2] != ks[2]:
        raise usage("FA_ESHAPE", "q has %d heads and k %d: pass enable_gqa=True for grouped-"
                    "query attention" % (qs[2], ks[2]))
    if out is None:
        out = _arrays.empty_like(vq, tuple(vq.shape[:3]) + (ins[2].shape[3],), vq.dtype, "out")
    vo = _arrays.view_of(out, "out")
    if vo.kind != kind:
        raise usage("FA_EINVAL", "out is %s memory but q is %s memory" % (vo.kind, kind))
    if not vo.writeable:
        raise usage("FA_EINVAL", "out is read-only")
    views = ins + [vo]
    tnames = ["q", "k", "v", "out"]
    lse = None
    if want_lse:
        B, Sq, H = qs[0], qs[1], qs[2]
        lse = lse_out if lse_out is not None else _arrays.empty_like(
            vq, (B, H, Sq), _abi.FA_DTYPE_FP32, "lse")
        vl = _arrays.view_of(lse, "lse")
        if tuple(vl.shape) != (B, H, Sq) or vl.dtype != _abi.FA_DTYPE_FP32 or vl.kind != kind:
            raise usage("FA_ESHAPE", "lse must be float32 [%d, %d, %d] %s memory" % (
                B, H, Sq, kind))
        views.append(vl)
        tnames.append("lse")

    res, back, keep = resolve(c, views, tnames, ("out", "lse"), kind, stream, vq)
    a = _args_block()
    fields = [_OFF["o" if n == "out" else n] for n in tnames]
    for i, (vw, n) in enumerate(zip(views, tnames)):
        pack_tensor(a, fields[i], vw, res[i], bhsd, n == "lse")
    _DOUBLE.pack_into(a, _SCALE, float(scale) if scale else 0.0)
    _INT.pack_into(a, _MASK, mask)
    _INT.pack_into(a, _PREC, precision)
    pack_window(a, _abi.fa_attn_fwd_args, window, softcap)
    lib = c._lib
    if k_fast is not None and k_fast is not _fast.MISS and not back and len(res) == len(views):
        _fast.store(c, k_fast, _fast.FWD, a, _ARGS_BYTES, fields, views, kind)
    call(c, C.addressof(a), kind, stream, vq, lib.fa_attn_fwd, lib.fa_attn_fwd_async, back)
    copy_back(back)
    del keep
    return out, lse


def alloc_like(q, v):
    """out for q and v when both are PyTorch tensors or NumPy arrays (allocated as the full
    path allocates it), else None (the full path allocates it)."""
    tq = type(q)
    if tq is not type(v):
        return None
    torch = sys.modules.get("torch")
    if torch is not None and tq is torch.Tensor:
        if q.dim() == 4 and v.dim() == 4 and q.shape[3] == v.shape[3] and q.dtype == v.dtype:
            return torch.empty_like(q)
        return None
    np = sys.modules.get("numpy")
    if np is not None and tq is np.ndarray:
        if q.ndim == 4 and v.ndim == 4 and q.shape[3] == v.shape[3] and q.dtype == v.dtype:
            return np.empty_like(q)
    return None


def alloc_lse(q, bhsd):
    """lse float32 [B, Hq, Sq] like the full path's, for a q alloc_like took."""
    B, Hq, Sq = (q.shape[0], q.shape[1], q.shape[2]) if bhsd else (q.shape[0], q.shape[2],
                                                                    q.shape[1])
    torch = sys.modules.get("torch")
    if torch is not None and type(q) is torch.Tensor:
        return torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device)
    np = sys.modules["numpy"]
    return np.empty((B, Hq, Sq), dtype=np.float32)


def call(c, addr, kind, stream, vq, fn, fn_async, back):
    """The library's call on a built block: synchronous (the producer waited for in resolve),
    or asynchronous on the stream `stream` names; "auto": see _ordered. back: resolve's copies
    to make afterwards (a staged call is synchronous under "auto")."""
    if stream == "auto":
        if kind == CUDA and vq.lib == "torch" and not back:
            _ordered(c, addr, stream, fn, fn_async, _stream_handle(vq, "current"),
                     lambda: _sync_producer(vq))
            return
        if kind == CUDA and not back:
            _sync_producer(vq)
        c._call(fn, addr, what=None)
    elif stream is None:
        c._call(fn, addr, what=None)
    else:
        c._call(fn_async, addr, C.c_void_p(_stream_handle(vq, stream)), what=None)


def _ordered(c, addr, stream, fn, fn_async, handle, sync):
    """A PyTorch CUDA call: stream None waits for the stream (sync()) and calls synchronously;
    "current" calls asynchronously on it; "auto" calls asynchronously while this client's
    daemon serves that and no CUDA graph is being captured, else as None. A daemon refusing
    the asynchronous mode itself (FA_EPERM: another user's daemon on the IPC-event path;
    FA_ENOTSUP: no GPU backend) is remembered once the synchronous retry succeeds, so "auto"
    stops trying; a refusal the synchronous call shares is the call's error."""
    if stream is not None and _async_ok(c, stream, fn_async):
        try:
            c._call(fn_async, addr, handle, what=None)
            return
        except FaError as e:
            if stream != "auto" or e.status not in _ASYNC_REFUSALS:
                raise
            refusal = e
    else:
        refusal = None
    sync()
    c._call(fn, addr, what=None)
    if refusal is not None:
        c._async_refused = refusal


# "auto" calls work below this (B * Hq * Sq * Sk * D) synchronously. Measured on the H200
# (daemon/RESULTS.md): at B1 H16 S128 D64 (1.7e7) a forward+backward through autograd took 1.17
# ms per step asynchronously against about 0.5 ms synchronously; at B2 H16 S4096 D128 causal
# (6.9e10) 3.35 ms against 4.80 ms. The bound lies between the two, not tuned further.
AUTO_ASYNC_MIN_WORK = 1 << 30


def small_for_async(q, k, bhsd):
    """Whether a call on q and k is below AUTO_ASYNC_MIN_WORK (False when the shapes are not
    4-dimensional: the full path says what is wrong)."""
    sq, sk = getattr(q, "shape", ()), getattr(k, "shape", ())
    if len(sq) != 4 or len(sk) != 4:
        return False
    if bhsd:
        return sq[0] * sq[1] * sq[2] * sk[2] * sq[3] < AUTO_ASYNC_MIN_WORK
    return sq[0] * sq[2] * sq[1] * sk[1] * sq[3] < AUTO_ASYNC_MIN_WORK


def _async_ok(c, stream, fn_async):
    """Whether to try the asynchronous mode: asked for ("current"), or "auto" while the
    daemon has not refused it to this client and no CUDA graph is being captured (a capture
    fails in either mode; the synchronous one says why)."""
    if stream != "auto":
        return True
    if fn_async is None or c._async_refused is not None:
        return False
    torch = sys.modules.get("torch")
    return not (torch is not None and torch.cuda.is_initialized() and
                torch.cuda.is_current_stream_capturing())


_ASYNC_REFUSALS = ("FA_EPERM", "FA_ENOTSUP")


def resolve(c, views, tnames, outputs, kind, stream, vq):
    """(buf, offset) of every View (in tnames' order), staging host arrays outside fa's shared
    memory; in synchronous mode the producer of CUDA inputs is waited for first. Returns
    (res, back, keep): back goes to copy_back after the call, keep must live until then."""
    if kind == CUDA:
        res, back = _resolve_cuda(c, views, tnames, outputs, vq)
        if stream is None and not back:  # (staging waited for the producer already)
            _sync_producer(vq)
        return res, back, back or None
    res, back = _resolve_host(c, views, tnames, outputs)
    return res, back, res


def copy_back(back):
    """Staged outputs to the caller's arrays (see resolve)."""
    if isinstance(back, _devstage.Staged):
        back.finish()
    elif back:
        np = _np()
        for staged, ptr, shape, strides, itemsize in back:
            np.copyto(_raw(np, ptr, shape, strides, itemsize), staged)


def pack_tensor(a, offset, vw, where, bhsd, is_lse):
    """One fa_tensor at `offset` of args block `a`: View vw at where = (buf, byte offset); lse
    [B, H, S] goes as fa's [B, H, S, 1], the others in fa's [B, S, H, D] order."""
    buf, off = where
    if is_lse:
        sh = (vw.shape[0], vw.shape[1], vw.shape[2], 1)
        st = (vw.strides[0], vw.strides[1], vw.strides[2], 1)
    else:
        sh, st = _fa_dims(vw, bhsd)
    _TENSOR.pack_into(a, offset, buf, off, vw.dtype, *sh, *st)


def _producer_stream(v):
    """The CUstream handle the work writing v runs on (0: the default stream)."""
    if v.lib == "torch":
        return _fast.current_stream(v.obj.get_device())
    if v.stream and v.stream not in (1, 2):
        return v.stream
    return 0


def _sync_producer(v):
    """Synchronous mode: the work writing the inputs must be finished before the daemon reads
    them. PyTorch: its current stream on the tensor's device; others: the whole context."""
    if v.lib == "torch":
        sys.modules["torch"].cuda.current_stream(v.obj.device).synchronize()
    elif v.stream:  # __cuda_array_interface__'s producer stream (1, 2: the default streams)
        _cuda_driver().synchronize(v.stream)
    else:
        _cuda_driver().synchronize()


def _stream_handle(v, stream):
    if stream == "current":
        if v.lib != "torch":
            raise usage("FA_EINVAL", "stream='current' needs PyTorch tensors; pass the "
                        "CUstream handle as an int")
        return sys.modules["torch"].cuda.current_stream(v.obj.device).cuda_stream
    if hasattr(stream, "cuda_stream"):
        return stream.cuda_stream
    return int(stream)
