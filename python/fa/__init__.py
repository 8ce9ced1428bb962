"""fa: attention computed by fa-daemon, from PyTorch, CuPy and NumPy arrays.

    import fa
    out = fa.scaled_dot_product_attention(q, k, v, is_causal=True)   # [B, H, S, D], PyTorch's
    out, lse = fa.flash_attn_func(q, k, v, causal=True, return_lse=True)  # [B, S, H, D]
    out = fa.flash_attn_func(q, k, v, causal=True, window_size=(4095, 0), softcap=50.0)
    out = fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)  # packed
    out = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens,
                                     block_table=pages, causal=True)  # decode, paged cache
    out.sum().backward()   # PyTorch tensors with requires_grad: through fa's backward

Training: with PyTorch tensors that require grad, both functions are differentiable (the
backward runs in the daemon too), and torch.compile traces them (the custom ops fa::attn_fwd
and fa::attn_bwd, PyTorch >= 2.4). attn_fwd/attn_bwd and flash_attn_backward are the explicit
forward and backward calls for every array kind. The sliding window and softcap are
differentiable too; flash_attn_varlen_func and flash_attn_with_kvcache are forward-only.

CUDA arrays are used in place (their allocation registered once by CUDA IPC and cached); host
arrays are used in place when they live in fa's shared memory (fa.empty_host), and are copied
through a staging buffer otherwise (a FaCopyWarning says so once). Errors raise fa.FaError with
.status (the status name) and .detail (the daemon's detail text). python/README.md has the rules.
"""
import sys as _sys

from . import _abi, _attn, _infer
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
    """fa._torch when q, k, v are PyTorch tensors whose call needs autograd (one requires grad
    while grad mode is on) or is being traced by torch.compile (the plain call would be opaque
    to both), else None (the plain call serves it, a few us cheaper)."""
    global _torch_mod
    m = _torch_mod
    if m is None:
        torch = _sys.modules.get("torch")
        if torch is None or not isinstance(q, torch.Tensor):
            return None
        from . import _torch as m
        _torch_mod = m
    elif not isinstance(q, m.torch.Tensor):
        return None
    if (q.requires_grad or getattr(k, "requires_grad", False) or
            getattr(v, "requires_grad", False)) and m.torch.is_grad_enabled():
        return m
    return m if m._is_compiling() else None


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
                    window_size=_attn.NO_WINDOW, softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_attn_probs=False, *, return_lse=False, out=None,
                    precision=None, client=None, stream=None):
    """FlashAttention's flash_attn_func (same positional order), computed by fa-daemon.

    q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D] (GQA/MQA when Hq is a multiple of Hkv; any strides
    with D contiguous). causal: FlashAttention's bottom-right alignment (query i sees keys
    j <= i + Sk - Sq). Returns out [B, Sq, Hq, D]; with return_lse=True, (out, lse) where lse is
    FlashAttention's softmax_lse: float32 [B, Hq, Sq], natural log, -inf for a row that sees no
    key; return_attn_probs=True returns (out, lse, None) as FlashAttention does without dropout.
    window_size (left, right): sliding-window attention as FlashAttention's, query i sees keys
    j with i + Sk - Sq - left <= j <= i + Sk - Sq + right, -1 for an unbounded side; causal
    caps the right side at 0 (so causal is (-1, 0), Mistral's causal with (4095, 0)).
    softcap > 0: each scaled score s becomes softcap * tanh(s / softcap) (Gemma 2), 0 off.
    dropout_p != 0 and alibi_slopes raise FaNotSupportedError. precision, client, stream: as in
    scaled_dot_product_attention. Differentiable for PyTorch tensors that require grad (the
    gradient flows through out, with the window and softcap; lse is not differentiable, as in
    FlashAttention); deterministic=True (or torch.use_deterministic_algorithms(True)) makes
    the backward give the same bits on every run. Both backends compute a windowed or capped
    forward and backward (a GPU backend built before the backward had them raises
    FaNotSupportedError, FA_ENOTSUP)."""
    if dropout_p:
        raise _usage("FA_ENOTSUP", "dropout_p=%r: fa has no dropout" % dropout_p)
    # (the defaults checked by identity and type first: the hot path of a loop)
    window = (window_size if window_size is _attn.NO_WINDOW else
              _attn.window_size(window_size))
    cap = (0.0 if softcap.__class__ is float and softcap == 0.0 else
           _attn.softcap_value(softcap))
    if alibi_slopes is not None:
        raise _usage("FA_ENOTSUP", "alibi_slopes: not supported by fa")
    want = return_lse or return_attn_probs
    mask = _abi.FA_MASK_CAUSAL_BOTTOM_RIGHT if causal else _abi.FA_MASK_NONE
    prec = _abi.FA_PREC_DEFAULT if precision is None else _precision(precision)
    m = _autograd_module(q, k, v)
    if m is not None:
        _no_out_with_autograd(out, "flash_attn_func")
        o, lse = m.attention(q, k, v, bhsd=False, mask=mask, scale=softmax_scale,
                             precision=prec, want_lse=want, deterministic=deterministic,
                             client=client, stream=stream, window=window, softcap=cap)
    else:
        o, lse = _forward(q, k, v, bhsd=False, mask=mask, scale=softmax_scale, want_lse=want,
                          out=out, client=client, precision=prec, stream=stream,
                          window=window, softcap=cap)
    if return_attn_probs:
        return o, lse, None
    return (o, lse) if return_lse else o


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *,
                           return_lse=False, out=None, precision=None, client=None,
                           stream=None):
    """FlashAttention's flash_attn_varlen_func (same positional order), computed by fa-daemon:
    B sequences of different lengths packed along the token dimension. Forward only.

    q [total_q, Hq, D], k and v [total_k, Hkv, D] (any strides with D contiguous);
    cu_seqlens_q, cu_seqlens_k: int32 [B + 1] cumulative offsets (sequence b's queries are rows
    cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1), host or device memory whatever q's is; a
    sequence may be empty (no queries, or no keys: its rows get 0 and lse -inf). max_seqlen_q,
    max_seqlen_k: upper bounds of the lengths (checked by the daemon; 0 or None: found).
    causal (bottom-right per sequence), window_size, softcap: as in flash_attn_func, per
    sequence. Returns out [total_q, Hq, D]; with return_lse=True (out, lse), lse float32
    [Hq, total_q] (FlashAttention's varlen softmax_lse layout); return_attn_probs=True returns
    (out, lse, None). Rows of q past cu_seqlens_q[B] are neither read nor written (out's are
    left as allocated). Inputs that require grad raise FaNotSupportedError (no varlen
    backward in fa); so do dropout_p != 0, alibi_slopes and block_table (a paged cache: use
    flash_attn_with_kvcache). deterministic is accepted for FlashAttention's signature (it
    concerns a backward). The GPU backend serves every shape of it, the window and softcap
    included (prefill and decode kernels over packed sequences).
    stream: None (the default) waits for PyTorch's current stream and returns when out is
    written; "current" (or a stream) orders the call on that stream instead (fa's asynchronous
    mode, fa_attn_varlen_async): q, k, v, out, lse and both cu_seqlens must be CUDA tensors,
    read in stream order."""
    if dropout_p:
        raise _usage("FA_ENOTSUP", "dropout_p=%r: fa has no dropout" % dropout_p)
    if alibi_slopes is not None:
        raise _usage("FA_ENOTSUP", "alibi_slopes: not supported by fa")
    if block_table is not None:
        raise _usage("FA_ENOTSUP", "block_table: fa's varlen call takes packed keys; for a "
                     "paged KV cache use fa.flash_attn_with_kvcache")
    window = _attn.window_size(window_size)
    cap = _attn.softcap_value(softcap)
    _infer.refuse_autograd("flash_attn_varlen_func", (q, k, v))
    want = return_lse or return_attn_probs
    o, lse = _infer.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           scale=softmax_scale,
                           mask=_abi.FA_MASK_CAUSAL_BOTTOM_RIGHT if causal else
                           _abi.FA_MASK_NONE, window=window, softcap=cap, want_lse=want,
                           out=out, client=client, precision=_precision(precision),
                           stream=stream)
    if return_attn_probs:
        return o, lse, None
    return (o, lse) if return_lse else o


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, out=None, precision=None,
                            client=None, stream=None):
    """FlashAttention's flash_attn_with_kvcache (same positional order), computed by fa-daemon:
    decode and chunked prefill against a KV cache. Forward only.

    q [B, Sq, Hq, D]. The cache: contiguous k_cache, v_cache [B, max_seqlen, Hkv, D], or, with
    block_table (int32 [B, max_pages], vLLM's block table), paged pools [pages, page_size, Hkv,
    D] (page_size 16 to 256; key j of sequence b is row j % page_size of page
    block_table[b][j // page_size]). cache_seqlens: int32 [B] (or an int for all) keys already
    in each sequence's cache; None: the whole cache.
    k, v (optional, new tokens [B, Snew, Hkv, D]): written into the cache in place at positions
    cache_seqlens[b] .. + Snew - 1 (through block_table when paged) before attending, and
    attended to: each sequence sees cache_seqlens[b] + Snew keys. As in FlashAttention,
    cache_seqlens itself is NOT updated: add Snew to it before the next step. Shapes, dtypes,
    the lengths against the cache's capacity and the pages written are checked before anything
    is written.
    causal: query i sees keys j <= i + seqlen_k - Sq (its last query aligned with the last
    key); window_size and softcap as in flash_attn_func. Returns out [B, Sq, Hq, D]; with
    return_softmax_lse=True (out, lse), lse float32 [B, Hq, Sq].
    Inputs that require grad raise FaNotSupportedError (no backward); so do rotary_cos/sin,
    cache_batch_idx, cache_leftpad and alibi_slopes (apply rotary embeddings before the call).
    num_splits is accepted and ignored (fa's planner splits the keys).
    stream: None (the default) waits for PyTorch's current stream and returns when out is
    written; "current" (or a stream) orders the call on that stream (fa_attn_kvcache_async):
    every tensor on CUDA, cache_seqlens a CUDA int32 tensor (read in stream order, with
    block_table), and no k/v to append (the append reads the lengths on the host: append
    first, add Snew to cache_seqlens on the stream)."""
    for name, val in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                      ("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad),
                      ("alibi_slopes", alibi_slopes)):
        if val is not None:
            raise _usage("FA_ENOTSUP", "%s: not supported by fa%s" % (
                name, " (apply the rotary embedding to q and k before the call)"
                if name.startswith("rotary") else ""))
    window = _attn.window_size(window_size)
    cap = _attn.softcap_value(softcap)
    _infer.refuse_autograd("flash_attn_with_kvcache", (q, k_cache, v_cache, k, v))
    o, lse = _infer.kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                            scale=softmax_scale,
                            mask=_abi.FA_MASK_CAUSAL_BOTTOM_RIGHT if causal else
                            _abi.FA_MASK_NONE, window=window, softcap=cap,
                            want_lse=return_softmax_lse, out=out, client=client,
                            precision=_precision(precision), stream=stream)
    return (o, lse) if return_softmax_lse else o


def attn_fwd(q, k, v, *, layout="bshd", mask=MASK_NONE, scale=None, return_lse=False,
             out=None, lse=None, precision=None, client=None, stream=None,
             window_size=(-1, -1), softcap=0.0):
    """fa's forward as the C API has it, for every array kind: out (and, with return_lse,
    (out, lse)) for q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D] (layout "bshd"; "bhsd" takes
    [B, H, S, D]). mask: fa.MASK_NONE, MASK_CAUSAL_BOTTOM_RIGHT (FlashAttention's) or
    MASK_CAUSAL_TOP_LEFT (PyTorch's); scale None: 1/sqrt(D). out and lse (float32 [B, Hq, Sq]):
    written when given. window_size, softcap: as in flash_attn_func (the window aligned as the
    mask is: top-left under MASK_CAUSAL_TOP_LEFT, bottom-right otherwise). Not differentiable
    (see flash_attn_func); keep lse for attn_bwd."""
    o, lse_o = _forward(q, k, v, bhsd=_layout(layout), mask=_mask(mask), scale=scale,
                        want_lse=return_lse or lse is not None, out=out, lse_out=lse,
                        client=client, precision=_precision(precision), stream=stream,
                        window=_attn.window_size(window_size),
                        softcap=_attn.softcap_value(softcap))
    return (o, lse_o) if return_lse else o


def attn_bwd(q, k, v, o, dout, lse, *, layout="bshd", mask=MASK_NONE, scale=None,
             deterministic=False, dq=None, dk=None, dv=None, precision=None, client=None,
             stream=None, window_size=(-1, -1), softcap=0.0):
    """fa's backward as the C API has it (fa_attn_bwd), for every array kind: (dq, dk, dv), the
    gradients of the forward that took q, k, v and wrote o and lse, given dout = dL/do.
    q, k, v, layout, mask, scale, precision, window_size and softcap: exactly as that forward
    had them (a GPU backend without the window in its backward says FA_ENOTSUP); o and dout
    like q; lse float32 [B, Hq, Sq] (the forward's, run with return_lse=True: required).
    dq, dk, dv: written when given (each like q, k, v; sharing no byte with an input or each
    other), else allocated like q, k and v. With GQA/MQA dk and dv are summed over each query-
    head group. deterministic: the same bits on every run (FA_BWD_DETERMINISTIC). One dtype
    for all but lse; any strides with the head dim contiguous. Raises FaError."""
    return _backward(q, k, v, o, dout, lse, bhsd=_layout(layout), mask=_mask(mask),
                     scale=scale, deterministic=deterministic, dq=dq, dk=dk, dv=dv,
                     client=client, precision=_precision(precision), stream=stream,
                     window=_attn.window_size(window_size),
                     softcap=_attn.softcap_value(softcap))


def flash_attn_backward(dout, q, k, v, out, softmax_lse, dq=None, dk=None, dv=None, *,
                        softmax_scale=None, causal=False, deterministic=False, precision=None,
                        client=None, stream=None, window_size=(-1, -1), softcap=0.0):
    """The backward of flash_attn_func in FlashAttention's shapes and argument order
    (flash_attn's _flash_attn_backward without dropout and ALiBi): (dq, dk, dv) for
    q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D], the forward's out and softmax_lse
    (return_lse=True), dout like out; causal is bottom-right; window_size and softcap as the
    forward had them. As attn_bwd otherwise."""
    return _backward(q, k, v, out, dout, softmax_lse, bhsd=False,
                     mask=_abi.FA_MASK_CAUSAL_BOTTOM_RIGHT if causal else _abi.FA_MASK_NONE,
                     scale=softmax_scale, deterministic=deterministic, dq=dq, dk=dk, dv=dv,
                     client=client, precision=_precision(precision), stream=stream,
                     window=_attn.window_size(window_size),
                     softcap=_attn.softcap_value(softcap))


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
           "flash_attn_backward", "flash_attn_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache", "is_host_shared",
           "library_path", "library_version", "scaled_dot_product_attention",
           "set_default_client"]
