"""Backward attention from Python arrays: q, k, v, o, dout and the forward's lse in, dq, dk, dv
out, through fa_attn_bwd_args (resolved, staged and copied back as the forward's arrays are).

The checks here are the ones only Python can make (how many dimensions, host or device memory,
read-only outputs, lse missing); dtypes, shapes, strides, extents, overlaps and alignment are the
library's and the daemon's, so their statuses and detail texts are the C API's.
"""
import ctypes as C

import sys

from . import _abi, _arrays, _attn, _fast, _lib
from ._client import default_client
from ._errors import usage

_OFF = {n: getattr(_abi.fa_attn_bwd_args, n).offset
        for n in ("q", "k", "v", "o", "dout", "lse", "dq", "dk", "dv")}
_SCALE = _abi.fa_attn_bwd_args.scale.offset
_MASK = _abi.fa_attn_bwd_args.mask.offset
_PREC = _abi.fa_attn_bwd_args.precision.offset
_FLAGS = _abi.fa_attn_bwd_args.flags.offset
_ARGS_BYTES = C.sizeof(_abi.fa_attn_bwd_args) + _abi.ARGS_SLACK
_NAMES = ("q", "k", "v", "out", "dout", "lse")
_ARG = {"out": "o"}  # the Python name of an array to its fa_attn_bwd_args field

MISSING_LSE = ("lse is required: the backward recomputes the attention weights from the "
               "forward's logsumexp; run the forward with return_lse=True (flash_attn_func, "
               "attn_fwd) and pass the lse it returned")


def backward(q, k, v, o, dout, lse, *, bhsd, mask, scale, deterministic=False, dq=None,
             dk=None, dv=None, client=None, precision=_abi.FA_PREC_DEFAULT, gqa=True,
             stream=None, window=_attn.NO_WINDOW, softcap=0.0):
    """(dq, dk, dv) for the forward that took q, k, v (BHSD when bhsd, else BSHD), wrote o and
    lse [B, Hq, Sq] fp32, with this mask, scale, precision, window and softcap (as
    _attn.forward takes them); dout is dL/do, shaped like o.
    dq, dk, dv: written when given, else allocated like q, k and v. stream: as in the forward.
    Raises FaError."""
    c = client if client is not None else default_client()
    if stream == "sync" or (stream == "auto" and _attn.small_for_async(q, k, bhsd)):
        stream = None
    lib = c._lib
    if getattr(lib, "fa_attn_bwd", None) is None:
        raise usage("FA_ENOTSUP", "the loaded libfaclient (%s, %s) has no fa_attn_bwd: it "
                    "predates the backward pass; install a newer one"
                    % (lib.fa_version_string().decode(), _lib.path()))
    if lse is None:
        raise usage("FA_EINVAL", MISSING_LSE)
    k_fast = None
    if _fast.enabled:
        dq = _alloc(dq, q)
        dk = _alloc(dk, k)
        dv = _alloc(dv, v)
        if dq is not None and dk is not None and dv is not None:
            meta = (bhsd, mask, float(scale) if scale else 0.0, precision, gqa,
                    bool(deterministic), window, softcap)
            k_fast = _fast.serve(c, _fast.BWD, meta, (q, k, v, o, dout, lse, dq, dk, dv),
                                 stream)
            if k_fast is None:
                return dq, dk, dv
    ins = [_arrays.view_of(x, n) for x, n in zip((q, k, v, o, dout, lse), _NAMES)]
    for vw, n in zip(ins, _NAMES):
        want = 3 if n == "lse" else 4
        if len(vw.shape) != want:
            raise usage("FA_ESHAPE", "%s: %d dimensions %s; fa takes %d: %s" % (
                n, len(vw.shape), tuple(vw.shape), want,
                "[batch, heads, seq_q] (the forward's lse)" if n == "lse" else
                "[batch, heads, seq, head_dim]" if bhsd else "[batch, seq, heads, head_dim]"))
    vq = ins[0]
    kind = vq.kind
    for vw, n in zip(ins[1:], _NAMES[1:]):
        if vw.kind != kind:
            raise usage("FA_EINVAL", "q is %s memory but %s is %s memory: pass all on one "
                        "device" % (kind, n, vw.kind))
    qs, ks = _attn._fa_dims(vq, bhsd)[0], _attn._fa_dims(ins[1], bhsd)[0]
    if not gqa and qs[2] != ks[2]:
        raise usage("FA_ESHAPE", "q has %d heads and k %d: pass enable_gqa=True for grouped-"
                    "query attention" % (qs[2], ks[2]))
    outs = []
    for g, like, n in ((dq, ins[0], "dq"), (dk, ins[1], "dk"), (dv, ins[2], "dv")):
        if g is None:
            g = _arrays.empty_like(like, tuple(like.shape), like.dtype, n)
        vg = _arrays.view_of(g, n)
        if vg.kind != kind:
            raise usage("FA_EINVAL", "%s is %s memory but q is %s memory" % (n, vg.kind, kind))
        if not vg.writeable:
            raise usage("FA_EINVAL", "%s is read-only" % n)
        if len(vg.shape) != 4:
            raise usage("FA_ESHAPE", "%s: %d dimensions %s; fa takes 4, like %s" % (
                n, len(vg.shape), tuple(vg.shape), n[1:]))
        outs.append(g)
        ins.append(vg)
    tnames = list(_NAMES) + ["dq", "dk", "dv"]

    res, back, keep = _attn.resolve(c, ins, tnames, ("dq", "dk", "dv"), kind, stream, vq)
    a = _attn._args_block(_ARGS_BYTES)
    fields = [_OFF[_ARG.get(n, n)] for n in tnames]
    for i, (vw, n) in enumerate(zip(ins, tnames)):
        _attn.pack_tensor(a, fields[i], vw, res[i], bhsd, n == "lse")
    _attn._DOUBLE.pack_into(a, _SCALE, float(scale) if scale else 0.0)
    _attn._INT.pack_into(a, _MASK, mask)
    _attn._INT.pack_into(a, _PREC, precision)
    _attn._INT.pack_into(a, _FLAGS, _abi.FA_BWD_DETERMINISTIC if deterministic else 0)
    _attn.pack_window(a, _abi.fa_attn_bwd_args, window, softcap)
    if k_fast is not None and k_fast is not _fast.MISS and not back and len(res) == len(ins):
        _fast.store(c, k_fast, _fast.BWD, a, _ARGS_BYTES, fields, ins, kind)
    _attn.call(c, C.addressof(a), kind, stream, vq, lib.fa_attn_bwd, lib.fa_attn_bwd_async,
               back)
    _attn.copy_back(back)
    del keep
    return tuple(outs)


def _alloc(g, like):
    """A gradient output like `like` (as the full path allocates it) when it is a PyTorch
    tensor or NumPy array, g when given, None when the full path must allocate it."""
    if g is not None:
        return g
    t = type(like)
    torch = sys.modules.get("torch")
    if torch is not None and t is torch.Tensor:
        return torch.empty_like(like)
    np = sys.modules.get("numpy")
    if np is not None and t is np.ndarray:
        return np.empty_like(like)
    return None
