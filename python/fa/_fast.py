"""Calls that reuse a prepared argument block: the hot path of a loop calling fa with arrays of
the same shapes, strides and dtypes again and again (a training step, a serving loop).

The first call of a kind goes the full way (_attn.forward, _bwd.backward: every check, output
allocation, registration, staging) and leaves a Plan: the block it built, handed to the
library once (fa_prepare, client/fa_prepared.c), keyed by everything the block holds except
where the memory is (the op, its scalar arguments, and each array's library, memory kind,
shape, strides and dtype). A later call with the same key gives the library only where each
tensor is now (its buffer and address, in a struct fa_placement) in one call,
fa_prepared_call, which checks each place, patches a copy of the block, waits for PyTorch's
stream in synchronous mode and makes the call: one foreign call where a patch in Python, a
buffer-id query per allocation and a stream sync each cost one.

Where the memory is is found again on every call, and never trusted from an earlier one:
- device arrays: the registration that held this very address last time (Client._dev_ptr,
  emptied whenever a registration goes); the library then checks that the address and the
  tensor's span lie in that registration and that the driver's buffer id of the address is
  still the registered allocation's (one cuPointerGetAttribute per allocation and call): an
  allocation freed and replaced at the same address, of any size, has a new id;
- host arrays: the client's shared-memory buffer table, as the full path looks it up (and the
  library checks the span against the buffer again).
Anything else (an array outside a registered allocation, a place the library refuses, one
needing a staging copy, a library other than PyTorch and NumPy, a tensor subclass, negative
strides) goes the full way, which raises what it raises and makes the plan anew. So the full
path stays the only place a decision is made; a plan only remembers one.

Plans are per client and thread, at most MAX_PLANS each; the last one used per op is tried
first (one tuple comparison instead of a hash of the key).
"""
import ctypes as C
import struct
import sys

from . import _abi
from ._arrays import CUDA, HOST

MAX_PLANS = 64
enabled = True  # tests switch it off to compare with the full path
hits = 0        # calls served by a plan, in this process (tests and figures read it)

FWD, BWD = _abi.FA_PREPARED_FWD, _abi.FA_PREPARED_BWD
NMAX = _abi.FA_PREPARED_MAX_TENSORS
_PLACE_BYTES = C.sizeof(_abi.fa_placement)
_MOVED = _abi.fa_placement.moved.offset
_BUFS = _abi.fa_placement.buf.offset
_ADDRS = _abi.fa_placement.addr.offset
assert _abi.fa_placement.stream.offset == 0 and _abi.fa_placement.flags.offset == 8
assert _BUFS == 16 and _ADDRS == _BUFS + 8 * NMAX
SYNC_STREAM, ASYNC = _abi.FA_PLACE_SYNC_STREAM, _abi.FA_PLACE_ASYNC
MISS = object()  # serve(): not served, and no plan may be made for these arrays


def _placement_packer(n):
    """A struct.Struct writing stream, flags, n buffers and n addresses into an fa_placement
    in one call (moved is written by the library; the unused entries get zeros)."""
    return struct.Struct("<QI4x%dQ%dx%dQ" % (n, 8 * (NMAX - n), n))


class Plan:
    """A prepared call (the library's fa_prepared) and the per-call placement it is called
    with; block keeps the bytes it was prepared from (tests rebuild the patched block)."""
    __slots__ = ("pp", "place", "place_addr", "pack", "spans", "kind", "lib", "block",
                 "fields", "__weakref__")

    def __init__(self, lib, handle, op, src, size, fields, spans, kind):
        self.lib = lib
        self.pp = None
        self.block = bytes(C.string_at(C.addressof(src), size))
        self.fields = tuple(fields)
        self.spans = tuple(spans)
        self.kind = kind
        n = len(fields)
        pp = C.c_void_p()
        st = lib.fa_prepare(handle, op, src, n, (C.c_uint32 * n)(*fields),
                            (C.c_uint64 * n)(*spans), C.byref(pp))
        if st:
            raise OSError("fa_prepare: %s" % lib.fa_status_name(st).decode())
        self.pp = pp.value
        self.place = C.create_string_buffer(_PLACE_BYTES)
        self.place_addr = C.addressof(self.place)
        self.pack = _placement_packer(n).pack_into

    def __del__(self):
        pp, self.pp = getattr(self, "pp", None), None
        if pp:
            try:
                self.lib.fa_prepared_free(pp)
            except Exception:  # (interpreter shutdown: the library may be gone already)
                pass

    def moved(self):
        """The index the library refused (fa_placement.moved), -1 when none."""
        return struct.unpack_from("<i", self.place, _MOVED)[0]


# ---- what identifies an array: (kind, address, key part), or None for the full path --------
def _numpy_sig(x):
    ptr, readonly = x.__array_interface__["data"]
    # the address's low bits: the full path's alignment check depends on them
    return HOST, ptr, (x.shape, x.strides, x.dtype, readonly, ptr & 15)


_SIG = {}       # type -> its signature function, or False (the full path); not PyTorch's
_TORCH = ()     # torch.Tensor and torch.nn.Parameter once PyTorch is seen


def _is_torch(t):
    """Whether t is a plain PyTorch tensor type (the first look fills _TORCH)."""
    global _TORCH
    if not _TORCH:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        global _SHAPE, _STRIDE, _DTYPE, _PTR
        T = torch.Tensor
        _SHAPE, _STRIDE = T.shape.__get__, T.stride
        _DTYPE, _PTR = T.dtype.__get__, T.data_ptr
        _TORCH = (T, torch.nn.Parameter)
    return t in _TORCH


def _sig_fn(t):
    np = sys.modules.get("numpy")
    f = _numpy_sig if np is not None and t is np.ndarray else False
    _SIG[t] = f
    return f


def key(op, meta, xs):
    """(key, addresses, kind) of a call on arrays xs, or (None, None, None) when only the full
    path takes it (other libraries, mixed memory kinds)."""
    t0 = type(xs[0])
    if t0 in _TORCH or _is_torch(t0):
        return _torch_key(op, meta, xs)
    ks = [op, meta]
    ptrs = []
    kind = None
    for x in xs:
        t = type(x)
        f = _SIG.get(t)
        if f is None:
            f = _sig_fn(t)
        s = f(x) if f else None
        if s is None or (kind is not None and s[0] is not kind):
            return None, None, None
        kind = s[0]
        ptrs.append(s[1])
        ks.append(s[2])
    ks.append(kind)
    return tuple(ks), ptrs, kind


def _torch_key(op, meta, xs):
    """key() for PyTorch tensors: each one's shape, strides and dtype, written out for the
    forward's four and five tensors (a loop costs a microsecond more on four). Only q's memory
    kind is read: every other address must then be found in that kind's table (device
    registrations, or shared-memory buffers), which a tensor of the other kind's never is
    (one address space under CUDA's unified addressing)."""
    T = _TORCH
    n = len(xs)
    if n == 4:
        q, k, v, o = xs
        if type(k) not in T or type(v) not in T or type(o) not in T:
            return None, None, None
        kind = CUDA if q.is_cuda else HOST
        return ((op, meta, kind, q.shape, q.stride(), q.dtype, k.shape, k.stride(), k.dtype,
                 v.shape, v.stride(), v.dtype, o.shape, o.stride(), o.dtype),
                [q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()], kind)
    if n == 5:
        q, k, v, o, lse = xs
        if (type(k) not in T or type(v) not in T or type(o) not in T or
                type(lse) not in T):
            return None, None, None
        kind = CUDA if q.is_cuda else HOST
        return ((op, meta, kind, q.shape, q.stride(), q.dtype, k.shape, k.stride(), k.dtype,
                 v.shape, v.stride(), v.dtype, o.shape, o.stride(), o.dtype, lse.shape,
                 lse.stride(), lse.dtype),
                [q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr()], kind)
    for x in xs:
        if type(x) not in T:
            return None, None, None
    kind = CUDA if xs[0].is_cuda else HOST
    return ((op, meta, kind, tuple(map(_SHAPE, xs)), tuple(map(_STRIDE, xs)),
             tuple(map(_DTYPE, xs))), list(map(_PTR, xs)), kind)


_SHAPE = _STRIDE = _DTYPE = _PTR = None


class _State:
    """One client's plans on one thread."""
    __slots__ = ("plans", "mru")

    def __init__(self):
        self.plans = {}
        self.mru = {}   # op -> (key, plan): the last plan used, compared before the lookup


def plan(c, k):
    """This thread's plan of `c` for key k, or None."""
    s = getattr(c._tls, "fast", None)
    if s is None:
        return None
    m = s.mru.get(k[0])
    if m is not None and m[0] == k:
        return m[1]
    p = s.plans.get(k)
    if p is not None:
        s.mru[k[0]] = (k, p)
    return p


def store(c, k, op, block, size, fields, views, kind):
    """Remember the block the full path just built for key k as a prepared call (the full
    path's block is reused by its next call: the library copies it). Nothing is stored when
    the loaded library has no prepared calls (an older one: every call goes the full way)."""
    if min(min(v.strides, default=0) for v in views) < 0:
        return
    lib = c._lib
    if getattr(lib, "fa_prepare", None) is None or len(fields) > NMAX:
        return
    s = getattr(c._tls, "fast", None)
    if s is None:
        s = c._tls.fast = _State()
    elif len(s.plans) >= MAX_PLANS:
        s.plans.clear()
        s.mru.clear()
    spans = [v.extent()[1] - v.ptr for v in views]
    try:
        p = Plan(lib, c._c, op, block, size, fields, spans, kind)
    except OSError:  # (the library refused or had no memory: this call's kind stays slow)
        return
    s.plans[k] = p
    s.mru[op] = (k, p)


def serve(c, op, meta, xs, stream):
    """Serve a call on arrays xs (in the block's tensor order) from this thread's plan: None
    when it was served (the library called; errors raised), else the key for the full path
    to store its plan under (MISS: no plan may be made)."""
    global hits
    t0 = type(xs[0])
    if t0 in _TORCH:  # (key() and plan() written out: two Python calls less on the hot path)
        k, ptrs, kind = _torch_key(op, meta, xs)
    else:
        k, ptrs, kind = key(op, meta, xs)
    if k is None:
        return MISS
    s = getattr(c._tls, "fast", None)
    if s is None:
        return k
    m = s.mru.get(op)
    if m is not None and m[0] == k:
        p = m[1]
    else:
        p = s.plans.get(k)
        if p is None:
            return k
        s.mru[op] = (k, p)
    bufs = []
    if kind is CUDA:
        byptr = c._dev_ptr
        r0 = None
        for ptr in ptrs:
            r = byptr.get(ptr)
            if r is None:
                return k
            bufs.append(r.buf)
            if r0 is None:
                r0 = r
        if type(xs[0]) not in _TORCH:
            if stream is not None:
                return k  # another library's stream: the full path's rules
            # what the full path does for an array without a stream: the context waited for
            from . import _cuda
            _cuda.driver().synchronize()
            h, flags = 0, 0
        elif stream is None or stream == "auto" or stream == "current":
            ordinal = r0.ordinal
            if ordinal < 0:
                return k
            h = current_stream(ordinal)
            if stream is None:
                flags = SYNC_STREAM
            elif stream == "current":
                flags = ASYNC
            else:
                from . import _attn
                flags = ASYNC if _attn._async_ok(c, stream, True) else SYNC_STREAM
        else:
            h = stream.cuda_stream if hasattr(stream, "cuda_stream") else int(stream)
            flags = ASYNC
    else:
        if stream is not None and stream != "auto":
            return k  # the full path says what is wrong with a stream for host arrays
        find = c._host_find
        for ptr, span in zip(ptrs, p.spans):
            hit = find(ptr, ptr + span)
            if hit is None:
                return k
            bufs.append(hit[0])
        h, flags = 0, 0
    p.pack(p.place, 0, h, flags, *bufs, *ptrs)
    st = c._call_prepared(p)
    if st is None:
        hits += 1
        return None
    if st < 0:
        return k  # a place the library refused: the full path resolves it anew
    from ._errors import error
    if flags == ASYNC and stream == "auto" and _refusal(st):
        # the daemon refused the asynchronous mode itself: synchronously, remembered once
        # that succeeds (as _attn._ordered does)
        refusal = error(c._lib, st, None)
        p.pack(p.place, 0, h, SYNC_STREAM, *bufs, *ptrs)
        st = c._call_prepared(p)
        if st is None:
            c._async_refused = refusal
            hits += 1
            return None
        if st < 0:
            return k
    raise error(c._lib, st, None)


def _refusal(st):
    return st in (_abi.FA_EPERM, _abi.FA_ENOTSUP)


# ---- PyTorch's current stream, without building a torch.cuda.Stream ------------------------
_raw_stream = None


def current_stream(ordinal):
    """The CUstream handle of PyTorch's current stream on device `ordinal`."""
    global _raw_stream
    f = _raw_stream
    if f is None:
        torch = sys.modules["torch"]
        f = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if f is None:  # an old PyTorch: the public way
            def f(i):
                return torch.cuda.current_stream(i).cuda_stream
        _raw_stream = f
    return f(ordinal)
