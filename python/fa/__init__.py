"""fa: attention computed by fa-daemon, from PyTorch, CuPy and NumPy arrays.

    import fa
    out = fa.scaled_dot_product_attention(q, k, v, is_causal=True)   # [B, H, S, D], PyTorch's
    out, lse = fa.flash_attn_func(q, k, v, causal=True, return_lse=True)  # [B, S, H, D]
    out.sum().backward()   # PyTorch tensors with requires_grad: through fa's backward

Training: with PyTorch tensors that require grad, both functions are differentiable (the
backward runs in the daemon too), and torch.compile traces them (the custom ops fa::attn_fwd
and fa::attn_bwd, PyTorch >= 2.4). attn_fwd/attn_bwd and flash_attn_backward are the explicit
forward and backward calls for every array kind.

CUDA arrays are used in place (their allocation registered once by CUDA IPC and cached); host
arrays are used in place when they live in fa's shared memory (fa.empty_host), and are copied
through a staging buffer otherwise (a FaCopyWarning says so once). Errors raise fa.FaError with
.status (the status name) and .detail (the daemon's detail text). python/README.md has the rules.
"""
import sys as _sys

from . import _abi
from ._attn import FaCopyWarning, forward as _forward
from ._bwd import backward as _backward
from ._client import Client, default_client, set_default_client
from ._errors import (FaArgumentError, FaError, FaMemoryError, FaNotSupportedError,
                      FaTimeoutError, FaUnavailableError, usage as _usage)
from ._host import empty_host, is_host_shared
from ._version import __version__

MASK_NONE = _abi.FA_MASK_NONE
MASK_CAUSAL_BOTTOM_RIGHT = _abi.FA_MASK_CAUSAL_BOTTOM_RIGHT
MASK_CAUSAL_TOP_LEFT = _abi.FA_MASK_CAUSAL_TOP_LEFT
_PRECISION = {None: _abi.FA_PREC_DEFAULT, "default": _abi.FA_PREC_DEFAULT,
              "ieee": _abi.FA_PREC_IEEE, "3xtf32": _abi.FA_PREC_3XTF32,
              "tf32": _abi.FA_PREC_TF32, "bf16": _abi.FA_PREC_BF16}


def _precision(p):
    try:
        return _PRECISION[p]
    except (KeyError, TypeError):
        raise _usage("FA_EINVAL", "precision %r; one of %s" % (
            p, ", ".join(k for k in _PRECISION if k))) from None


_LAYOUTS = {"bshd": False, "bhsd": True}
_MASKS = (_abi.FA_MASK_NONE, _abi.FA_MASK_CAUSAL_BOTTOM_RIGHT, _abi.FA_MASK_CAUSAL_TOP_LEFT)
_torch_mod = None


def _autograd_module(q, k, v):
    """fa._torch when q, k, v are PyTorch tensors whose call needs autograd or is being
    traced by torch.compile, else None (the plain call serves it, a few us cheaper)."""
    global _torch_mod
    torch = _sys.modules.get("torch")
    if torch is None or not isinstance(q, torch.Tensor):
        return None
    m = _torch_mod
    if m is None:
        from . import _torch as m
        _torch_mod = m
    return m if m.needs_op(q, k, v) else None


def _no_out_with_autograd(out, fn):
    if out is not None:
        raise _usage("FA_EINVAL", "%s: out= with tensors that require grad (or under "
                     "torch.compile): autograd cannot differentiate into a caller's buffer "
                     "(PyTorch's out= functions refuse this too); drop out=" % fn)


def _layout(layout):
    try:
        return _LAYOUTS[layout]
    except (KeyError, TypeError):
        raise _usage("FA_EINVAL", "layout %r; 'bshd' ([B, S, H, D], FlashAttention's) or "
                     "'bhsd' ([B, H, S, D], PyTorch SDPA's)" % (layout,)) from None


def _mask(mask):
    if mask not in _MASKS:
        raise _usage("FA_EINVAL", "mask %r; fa.MASK_NONE, fa.MASK_CAUSAL_BOTTOM_RIGHT or "
                     "fa.MASK_CAUSAL_TOP_LEFT" % (mask,))
    return mask


def _causal_bias(mask):
    """The fa mask for a torch.nn.attention.bias.CausalBias, else None."""
    variant = getattr(getattr(mask, "variant", None), "name", None)
    if type(mask).__name__ == "CausalBias" and variant in ("UPPER_LEFT", "LOWER_RIGHT"):
        return (_abi.FA_MASK_CAUSAL_TOP_LEFT if variant == "UPPER_LEFT"
                else _abi.FA_MASK_CAUSAL_BOTTOM_RIGHT)
    return None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, out=None,
                                 precision=None, client=None, stream=None):
    """torch.nn.functional.scaled_dot_product_attention's contract, computed by fa-daemon.

    query [B, Hq, Sq, D], key and value [B, Hkv, Sk, D] (any strides with D contiguous);
    returns out [B, Hq, Sq, D] allocated like query (or written into `out`).
    is_causal: PyTorch's alignment, top-left (query i sees keys j <= i). attn_mask: only a
    torch.nn.attention.bias.CausalBias (causal_upper_left / causal_lower_right); any other mask,
    and dropout_p != 0, raise FaNotSupportedError. enable_gqa: Hq a multiple of Hkv (without it
    the head counts must match, as in PyTorch). scale: default 1/sqrt(D).
    precision (fp32 inputs): None/"default" (3xtf32), "ieee", "3xtf32", "tf32", "bf16".
    stream: None waits for PyTorch's current stream and returns when out is written; "current"
    (or a stream) orders the call on that stream instead (fa's asynchronous mode).
    client: a fa.Client (default: the process-wide one).
    Differentiable for PyTorch tensors that require grad (out= is refused then): then stream
    None orders forward and backward on PyTorch's current stream (the asynchronous mode, as
    PyTorch's own ops are ordered) while the daemon serves that, synchronously otherwise;
    stream="sync" keeps both synchronous. The backward is deterministic under
    torch.use_deterministic_algorithms(True)."""
    mask = _abi.FA_MASK_CAUSAL_TOP_LEFT if is_causal else _abi.FA_MASK_NONE
    if attn_mask is not None:
        m = _causal_bias(attn_mask)
        if m is None:
            raise _usage("FA_ENOTSUP", "attn_mask: fa computes no mask or a causal one; pass "
                         "is_causal=True (top-left, PyTorch's) or a CausalBias "
                         "(torch.nn.attention.bias.causal_lower_right for bottom-right)")
        if is_causal:
            raise _usage("FA_EINVAL", "attn_mask and is_causal=True together (PyTorch "
                         "refuses this too)")
        mask = m
    if dropout_p:
        raise _usage("FA_ENOTSUP", "dropout_p=%r: fa has no dropout; pass dropout_p=0.0 (for "
                     "example dropout_p=p if self.training else 0.0 at inference)" % dropout_p)
    prec = _precision(precision)
    m = _autograd_module(query, key, value)
    if m is not None:
        _no_out_with_autograd(out, "scaled_dot_product_attention")
        if not enable_gqa and query.shape[1] != key.shape[1]:
            raise _usage("FA_ESHAPE", "q has %d heads and k %d: pass enable_gqa=True for "
                         "grouped-query attention" % (query.shape[1], key.shape[1]))
        o, _ = m.attention(query, key, value, bhsd=True, mask=mask, scale=scale,
                           precision=prec, want_lse=False, deterministic=False, client=client,
                           stream=stream)
        return o
    o, _ = _forward(query, key, value, bhsd=True, mask=mask, scale=scale, want_lse=False,
                    out=out, client=client, precision=prec, gqa=enable_gqa, stream=stream)
    return o


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, return_lse=False, out=None, precision=None,
                    client=None, stream=None):
    """FlashAttention's flash_attn_func (same positional order), computed by fa-daemon.

    q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D] (GQA/MQA when Hq is a multiple of Hkv; any strides
    with D contiguous). causal: FlashAttention's bottom-right alignment (query i sees keys
    j <= i + Sk - Sq). Returns out [B, Sq, Hq, D]; with return_lse=True, (out, lse) where lse is
    FlashAttention's softmax_lse: float32 [B, Hq, Sq], natural log, -inf for a row that sees no
    key; return_attn_probs=True returns (out, lse, None) as FlashAttention does without dropout.
    dropout_p != 0, window_size other than (-1, -1), softcap and alibi_slopes raise
    FaNotSupportedError (not in this version of fa). precision, client, stream: as in
    scaled_dot_product_attention. Differentiable for PyTorch tensors that require grad (the
    gradient flows through out; lse is not differentiable, as in FlashAttention);
    deterministic=True (or torch.use_deterministic_algorithms(True)) makes the backward give
    the same bits on every run."""
    if dropout_p:
        raise _usage("FA_ENOTSUP", "dropout_p=%r: fa has no dropout" % dropout_p)
    if window_size != (-1, -1) and tuple(window_size) != (-1, -1):
        raise _usage("FA_ENOTSUP", "window_size=%r: sliding-window attention is not in this "
                     "version of fa" % (tuple(window_size),))
    if softcap:
        raise _usage("FA_ENOTSUP", "softcap=%r: not in this version of fa" % softcap)
    if alibi_slopes is not None:
        raise _usage("FA_ENOTSUP", "alibi_slopes: not supported by fa")
    want = return_lse or return_attn_probs
    mask = _abi.FA_MASK_CAUSAL_BOTTOM_RIGHT if causal else _abi.FA_MASK_NONE
    prec = _precision(precision)
    m = _autograd_module(q, k, v)
    if m is not None:
        _no_out_with_autograd(out, "flash_attn_func")
        o, lse = m.attention(q, k, v, bhsd=False, mask=mask, scale=softmax_scale,
                             precision=prec, want_lse=want, deterministic=deterministic,
                             client=client, stream=stream)
    else:
        o, lse = _forward(q, k, v, bhsd=False, mask=mask, scale=softmax_scale, want_lse=want,
                          out=out, client=client, precision=prec, stream=stream)
    if return_attn_probs:
        return o, lse, None
    return (o, lse) if return_lse else o


def attn_fwd(q, k, v, *, layout="bshd", mask=MASK_NONE, scale=None, return_lse=False,
             out=None, lse=None, precision=None, client=None, stream=None):
    """fa's forward as the C API has it, for every array kind: out (and, with return_lse,
    (out, lse)) for q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D] (layout "bshd"; "bhsd" takes
    [B, H, S, D]). mask: fa.MASK_NONE, MASK_CAUSAL_BOTTOM_RIGHT (FlashAttention's) or
    MASK_CAUSAL_TOP_LEFT (PyTorch's); scale None: 1/sqrt(D). out and lse (float32 [B, Hq, Sq]):
    written when given. Not differentiable (see flash_attn_func); keep lse for attn_bwd."""
    o, lse_o = _forward(q, k, v, bhsd=_layout(layout), mask=_mask(mask), scale=scale,
                        want_lse=return_lse or lse is not None, out=out, lse_out=lse,
                        client=client, precision=_precision(precision), stream=stream)
    return (o, lse_o) if return_lse else o


def attn_bwd(q, k, v, o, dout, lse, *, layout="bshd", mask=MASK_NONE, scale=None,
             deterministic=False, dq=None, dk=None, dv=None, precision=None, client=None,
             stream=None):
    """fa's backward as the C API has it (fa_attn_bwd), for every array kind: (dq, dk, dv), the
    gradients of the forward that took q, k, v and wrote o and lse, given dout = dL/do.
    q, k, v, layout, mask, scale and precision: exactly as that forward had them; o and dout
    like q; lse float32 [B, Hq, Sq] (the forward's, run with return_lse=True: required).
    dq, dk, dv: written when given (each like q, k, v; sharing no byte with an input or each
    other), else allocated like q, k and v. With GQA/MQA dk and dv are summed over each query-
    head group. deterministic: the same bits on every run (FA_BWD_DETERMINISTIC). One dtype
    for all but lse; any strides with the head dim contiguous. Raises FaError."""
    return _backward(q, k, v, o, dout, lse, bhsd=_layout(layout), mask=_mask(mask),
                     scale=scale, deterministic=deterministic, dq=dq, dk=dk, dv=dv,
                     client=client, precision=_precision(precision), stream=stream)


def flash_attn_backward(dout, q, k, v, out, softmax_lse, dq=None, dk=None, dv=None, *,
                        softmax_scale=None, causal=False, deterministic=False, precision=None,
                        client=None, stream=None):
    """The backward of flash_attn_func in FlashAttention's shapes and argument order
    (flash_attn's _flash_attn_backward without dropout, window, softcap, ALiBi): (dq, dk, dv)
    for q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D], the forward's out and softmax_lse
    (return_lse=True), dout like out; causal is bottom-right. As attn_bwd otherwise."""
    return _backward(q, k, v, out, dout, softmax_lse, bhsd=False,
                     mask=_abi.FA_MASK_CAUSAL_BOTTOM_RIGHT if causal else _abi.FA_MASK_NONE,
                     scale=softmax_scale, deterministic=deterministic, dq=dq, dk=dk, dv=dv,
                     client=client, precision=_precision(precision), stream=stream)


def empty_cache():
    """Unregister every client's cached device allocations, then, when PyTorch is loaded,
    torch.cuda.empty_cache(): the order CUDA IPC requires (unregister, then free)."""
    from . import _client
    for c in list(_client._clients):
        if c._c and not c._closing:
            c.clear_device_cache()
    torch = _sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def library_path():
    """The path of the libfaclient this package loaded."""
    from . import _lib
    return _lib.path()


def library_version():
    """The loaded libfaclient's version string."""
    from . import _lib
    return _lib.load().fa_version_string().decode()


__all__ = ["Client", "FaArgumentError", "FaCopyWarning", "FaError", "FaMemoryError",
           "FaNotSupportedError", "FaTimeoutError", "FaUnavailableError",
           "MASK_CAUSAL_BOTTOM_RIGHT", "MASK_CAUSAL_TOP_LEFT", "MASK_NONE", "__version__",
           "attn_bwd", "attn_fwd", "default_client", "empty_cache", "empty_host",
           "flash_attn_backward", "flash_attn_func", "is_host_shared",
           "library_path", "library_version", "scaled_dot_product_attention",
           "set_default_client"]
