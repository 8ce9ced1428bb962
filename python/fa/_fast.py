"""Calls that reuse a prebuilt argument block: the hot path of a loop calling fa with arrays of
the same shapes, strides and dtypes again and again (a training step, a serving loop).

The first call of a kind goes the full way (_attn.forward, _bwd.backward: every check, output
allocation, registration, staging) and leaves a Plan: a copy of the fa_attn_*_args block it
built, keyed by everything the block holds except where the memory is (the op, its scalar
arguments, and each array's library, memory kind, shape, strides and dtype). A later call with
the same key patches only each tensor's (buffer, offset) into that block and calls the library.

Where the memory is is found again on every call, and never trusted from an earlier one:
- device arrays: the registration that held this very address last time, used only while it is
  still the client's registration of its allocation and the driver's buffer id of the address
  still equals the registration's (one cuPointerGetAttribute per allocation and call): an
  allocation freed and replaced at the same address, of any size, has a new id;
- host arrays: the client's shared-memory buffer table, as the full path looks it up.
Anything else (an array outside a registered allocation, one needing a staging copy, a library
other than PyTorch and NumPy, a tensor subclass, negative strides) goes the full way, which
raises what it raises and makes the plan anew. So the full path stays the only place a decision
is made; a plan only remembers one.

Plans are per client and thread (the block is patched in place), at most MAX_PLANS each.
"""
import ctypes as C
import struct
import sys

from . import _abi, _cuda
from ._arrays import CUDA, HOST

MAX_PLANS = 64
# fa_tensor starts with its buffer and offset: the two fields a call patches.
assert _abi.fa_tensor.buf.offset == 0 and _abi.fa_tensor.offset.offset == 8
_BUFOFF = struct.Struct("<QQ")
enabled = True  # tests switch it off to compare with the full path
hits = 0        # calls served by a plan, in this process (tests and figures read it)

FWD, BWD = "fwd", "bwd"


class Plan:
    """A prebuilt argument block and, per tensor, where its (buffer, offset) goes and how many
    bytes from its first element its elements reach."""
    __slots__ = ("block", "addr", "fields", "spans", "kind", "size")

    def __init__(self, src, size, fields, views, kind):
        self.block = (C.c_char * size).from_buffer_copy(src)
        self.addr = C.addressof(self.block)
        self.size = size
        self.fields = tuple(fields)
        self.spans = tuple(v.extent()[1] - v.ptr for v in views)
        self.kind = kind


# ---- what identifies an array: (kind, address, key part), or None for the full path --------
def _torch_sig(x):
    if x.is_cuda:
        return CUDA, x.data_ptr(), (1, x.shape, x.stride(), x.dtype)
    if x.is_cpu:
        return HOST, x.data_ptr(), (2, x.shape, x.stride(), x.dtype)
    return None


def _numpy_sig(x):
    ptr, readonly = x.__array_interface__["data"]
    # the address's low bits: the full path's alignment check depends on them
    return HOST, ptr, (3, x.shape, x.strides, x.dtype, readonly, ptr & 15)


_SIG = {}  # type -> its signature function, or False (the full path)


def _sig_fn(t):
    torch = sys.modules.get("torch")
    if torch is not None and t in (torch.Tensor, torch.nn.Parameter):
        f = _torch_sig
    else:
        np = sys.modules.get("numpy")
        f = _numpy_sig if np is not None and t is np.ndarray else False
    _SIG[t] = f
    return f


def key(op, meta, arrays):
    """(key, addresses, kind) of a call on `arrays`, or (None, None, None) when only the full
    path takes it (other libraries, mixed memory kinds)."""
    ks = [op, meta]
    ptrs = []
    kind = None
    for x in arrays:
        f = _SIG.get(type(x))
        if f is None:
            f = _sig_fn(type(x))
        if f is _torch_sig:  # the common case inline (a function call less per array)
            if x.is_cuda:
                s = CUDA, x.data_ptr(), (1, x.shape, x.stride(), x.dtype)
            else:
                s = _torch_sig(x)
        else:
            s = f(x) if f else None
        if s is None or (kind is not None and s[0] is not kind):
            return None, None, None
        kind = s[0]
        ptrs.append(s[1])
        ks.append(s[2])
    return tuple(ks), ptrs, kind


def plan(c, k):
    """This thread's plan of `c` for key k, or None."""
    plans = getattr(c._tls, "plans", None)
    return plans.get(k) if plans is not None else None


def store(c, k, block, size, fields, views, kind):
    """Remember the block the full path just built for key k (copied: the full path's block is
    reused by its next call)."""
    if min(min(v.strides, default=0) for v in views) < 0:
        return
    plans = getattr(c._tls, "plans", None)
    if plans is None:
        plans = c._tls.plans = {}
    elif len(plans) >= MAX_PLANS:
        plans.clear()
    plans[k] = Plan(block, size, fields, views, kind)


def patch(c, p, ptrs):
    """Write each tensor's (buffer, offset) into p's block for the arrays now at `ptrs`. False
    when one is not where a plan may take it (the full path decides then)."""
    global hits
    block = p.block
    pack = _BUFOFF.pack_into
    if p.kind is CUDA:
        drv = _cuda._cu
        byptr, dev = c._dev_ptr, c._dev
        seen = []
        for ptr, field, span in zip(ptrs, p.fields, p.spans):
            r = byptr.get(ptr)
            if (r is None or dev.get(r.base) is not r or ptr < r.base or
                    ptr + span > r.base + r.size):
                return False
            if r not in seen:
                if drv.buffer_id(ptr) != r.bufid:
                    return False
                seen.append(r)
            pack(block, field, r.buf, ptr - r.base)
        hits += 1
        return True
    find = c._host_find
    last = None
    for ptr, field, span in zip(ptrs, p.fields, p.spans):
        if last is None or last[0] != ptr or last[1] != span:  # (q, k, v often one array)
            hit = find(ptr, ptr + span)
            if hit is None:
                return False
            last = (ptr, span, hit)
        else:
            hit = last[2]
        pack(block, field, hit[0], hit[1])
    hits += 1
    return True


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
