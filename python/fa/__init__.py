"""fa: attention computed by fa-daemon, from PyTorch, CuPy and NumPy arrays.

    import fa
    out = fa.scaled_dot_product_attention(q, k, v, is_causal=True)   # [B, H, S, D], PyTorch's
    out, lse = fa.flash_attn_func(q, k, v, causal=True, return_lse=True)  # [B, S, H, D]

CUDA arrays are used in place (their allocation registered once by CUDA IPC and cached); host
arrays are used in place when they live in fa's shared memory (fa.empty_host), and are copied
through a staging buffer otherwise (a FaCopyWarning says so once). Errors raise fa.FaError with
.status (the status name) and .detail (the daemon's detail text). python/README.md has the rules.
"""
import sys as _sys

from . import _abi
from ._attn import FaCopyWarning, forward as _forward
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
    (or a stream) orders the call on that stream instead (fa's asynchronous mode: daemon of the
    same user only). client: a fa.Client (default: the process-wide one)."""
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
    o, _ = _forward(query, key, value, bhsd=True, mask=mask, scale=scale, want_lse=False,
                    out=out, client=client, precision=_precision(precision), gqa=enable_gqa,
                    stream=stream)
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
    scaled_dot_product_attention."""
    if dropout_p:
        raise _usage("FA_ENOTSUP", "dropout_p=%r: fa has no dropout" % dropout_p)
    if tuple(window_size) != (-1, -1):
        raise _usage("FA_ENOTSUP", "window_size=%r: sliding-window attention is not in this "
                     "version of fa" % (tuple(window_size),))
    if softcap:
        raise _usage("FA_ENOTSUP", "softcap=%r: not in this version of fa" % softcap)
    if alibi_slopes is not None:
        raise _usage("FA_ENOTSUP", "alibi_slopes: not supported by fa")
    want = return_lse or return_attn_probs
    o, lse = _forward(q, k, v, bhsd=False,
                      mask=_abi.FA_MASK_CAUSAL_BOTTOM_RIGHT if causal else _abi.FA_MASK_NONE,
                      scale=softmax_scale, want_lse=want, out=out, client=client,
                      precision=_precision(precision), stream=stream)
    if return_attn_probs:
        return o, lse, None
    return (o, lse) if return_lse else o


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
           "default_client", "empty_cache", "empty_host", "flash_attn_func", "is_host_shared",
           "library_path", "library_version", "scaled_dot_product_attention",
           "set_default_client"]
