"""Inference attention from Python arrays: variable-length batches (fa_attn_varlen,
FlashAttention's flash_attn_varlen_func) and attention against a contiguous or paged KV cache
(fa_attn_kvcache, flash_attn_with_kvcache, with its append of new keys done here).

Both are forward-only. The float tensors are resolved, staged and copied back as the dense
forward's (_attn.resolve); the int32 index tensors (sequence offsets, cache lengths, the page
table) are described as Views of 4-byte elements (dtype code FA_DTYPE_FP32 stands for "4 bytes"
there: resolve and staging only look at the element size) and may be in host or device memory,
whatever the float tensors' memory is, as fa_client.h allows.
"""
import ctypes as C
import numbers
import sys

from . import _abi, _arrays, _attn
from ._arrays import CUDA, HOST, View
from ._client import default_client
from ._errors import usage

_INDEX = _abi.packer(_abi.fa_index)
_I64 = _attn._INT64
_INT4 = _abi.FA_DTYPE_FP32  # the element-size stand-in of an int32 index View (see above)
_VARLEN_BYTES = C.sizeof(_abi.fa_attn_varlen_args) + _abi.ARGS_SLACK
_KVCACHE_BYTES = C.sizeof(_abi.fa_attn_kvcache_args) + _abi.ARGS_SLACK
# Page sizes a paged cache may have (kernels/fa_attn_infer.h FA_PAGE_SIZE_MIN/MAX): checked
# here too because the append writes the cache before the daemon sees the call.
PAGE_SIZE_MIN, PAGE_SIZE_MAX = 16, 256


def refuse_autograd(fn, arrays):
    """FA_ENOTSUP when PyTorch would need a gradient through these arrays: fa has no backward
    for varlen or KV-cache attention, and silently detaching would train on a wrong graph."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled():
        return
    for x in arrays:
        if isinstance(x, torch.Tensor) and x.requires_grad:
            raise usage("FA_ENOTSUP", "%s is forward-only (fa has no backward for it), but "
                        "its inputs require grad: call it under torch.no_grad() or "
                        "torch.inference_mode(), or pass detached tensors" % fn)


def _int32_view(x, name, dims):
    """The View of an int32 index array with `dims` dimensions (torch.Tensor, numpy.ndarray,
    __cuda_array_interface__ '<i4'). FA_EDTYPE for another dtype, FA_ESHAPE for another rank."""
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    v = None
    if torch is not None and isinstance(x, torch.Tensor):
        if x.dtype != torch.int32:
            raise usage("FA_EDTYPE", "%s: dtype %s; fa takes int32 (as FlashAttention does): "
                        "pass .to(torch.int32)" % (name, x.dtype))
        if not (x.is_cuda or x.is_cpu):
            raise usage("FA_ENOTSUP", "%s: a tensor on %s; fa takes CUDA and CPU tensors"
                        % (name, x.device))
        v = View(x, CUDA if x.is_cuda else HOST, "torch", x.data_ptr(), _INT4, tuple(x.shape),
                 tuple(x.stride()))
    elif np is not None and isinstance(x, np.ndarray):
        if x.dtype != np.int32:
            raise usage("FA_EDTYPE", "%s: NumPy dtype %s; fa takes int32: pass "
                        ".astype(np.int32)" % (name, x.dtype))
        if not x.flags.aligned:
            raise usage("FA_EALIGN", "%s: byte strides %s are not multiples of 4"
                        % (name, x.strides))
        v = View(x, HOST, "numpy", x.__array_interface__["data"][0], _INT4, x.shape,
                 tuple(s // 4 for s in x.strides), writeable=x.flags.writeable)
    else:
        cai = getattr(x, "__cuda_array_interface__", None)
        if cai is None:
            raise usage("FA_EINVAL", "%s: %s is not an int32 array fa takes (torch.Tensor, "
                        "numpy.ndarray or __cuda_array_interface__)" % (name, type(x).__name__))
        if cai["typestr"] != "<i4":
            raise usage("FA_EDTYPE", "%s: __cuda_array_interface__ typestr %r; fa takes int32 "
                        "('<i4')" % (name, cai["typestr"]))
        shape = tuple(cai["shape"])
        if cai.get("strides") is None:
            st, acc = [], 1
            for s in reversed(shape):
                st.append(acc)
                acc *= s
            strides = tuple(reversed(st))
        else:
            if any(s % 4 for s in cai["strides"]):
                raise usage("FA_EALIGN", "%s: byte strides %s are not multiples of 4"
                            % (name, tuple(cai["strides"])))
            strides = tuple(s // 4 for s in cai["strides"])
        v = View(x, CUDA, "cai", cai["data"][0] or 0, _INT4, shape, strides, -1,
                 cai.get("stream"))
    if len(v.shape) != dims:
        raise usage("FA_ESHAPE", "%s: %d dimensions %s; fa takes %s" % (
            name, len(v.shape), tuple(v.shape),
            "1: [batch + 1] offsets" if name.startswith("cu_") else
            "1: [batch]" if dims == 1 else "2: [batch, pages per sequence]"))
    if 0 in v.shape:
        raise usage("FA_ESHAPE", "%s: shape %s has no entries" % (name, tuple(v.shape)))
    return v


def _host_ints(x, name):
    """The values of an int32 array as a NumPy array (a copy from device memory)."""
    np = _attn._np()
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    get = getattr(x, "get", None)  # CuPy
    if get is None:
        raise usage("FA_ENOTSUP", "%s: appending new keys needs its values on the host; "
                    "pass a torch.Tensor, a NumPy array or a CuPy array" % name)
    return np.asarray(get())


def _as_lib(like, a):
    """NumPy int64 array `a` as an index array of `like`'s library and device (for fancy
    indexing into `like`)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.from_numpy(a).to(like.device)
    np = sys.modules["numpy"]
    if isinstance(like, np.ndarray):
        return a
    import importlib
    return importlib.import_module(type(like).__module__.split(".")[0]).asarray(a)


def _view4(v, lead):
    """A View of a 3-dimensional v with one leading dimension of size 1 (fa's batch of one
    packed batch) — for tensors when lead, for lse [Hq, total_q] as [1, Hq, total_q]."""
    return View(v.obj, v.kind, v.lib, v.ptr, v.dtype, (1,) + tuple(v.shape),
                (0,) + tuple(v.strides), v.device, v.stream, v.keep, v.writeable) if lead else v


def _float_views(arrays, names, dims):
    views = []
    for x, n in zip(arrays, names):
        vw = _arrays.view_of(x, n)
        if len(vw.shape) != dims:
            raise usage("FA_ESHAPE", "%s: %d dimensions %s; fa takes %d: %s" % (
                n, len(vw.shape), tuple(vw.shape), dims,
                "[total_tokens, heads, head_dim]" if dims == 3 else
                "[batch, seq, heads, head_dim]"))
        views.append(vw)
    vq = views[0]
    for vw, n in zip(views[1:], names[1:]):
        if vw.kind != vq.kind:
            raise usage("FA_EINVAL", "q is %s memory but %s is %s memory: pass all on one "
                        "device" % (vq.kind, n, vw.kind))
        if vw.dtype != vq.dtype:
            raise usage("FA_EDTYPE", "q is %s but %s is %s: one dtype for q, k, v and out" % (
                _arrays._DTYPE_NAMES[vq.dtype], n, _arrays._DTYPE_NAMES[vw.dtype]))
    return views


def _outputs(vq, out, lse_out, out_shape, lse_shape, want_lse):
    """(out, its View, lse or None, its View or None), allocated like q when not given."""
    if out is None:
        out = _arrays.empty_like(vq, out_shape, vq.dtype, "out")
    vo = _arrays.view_of(out, "out")
    if vo.kind != vq.kind:
        raise usage("FA_EINVAL", "out is %s memory but q is %s memory" % (vo.kind, vq.kind))
    if not vo.writeable:
        raise usage("FA_EINVAL", "out is read-only")
    if tuple(vo.shape) != tuple(out_shape):
        raise usage("FA_ESHAPE", "out: shape %s; the call writes %s" % (
            tuple(vo.shape), tuple(out_shape)))
    if not want_lse:
        return out, vo, None, None
    lse = lse_out if lse_out is not None else _arrays.empty_like(
        vq, lse_shape, _abi.FA_DTYPE_FP32, "lse")
    vl = _arrays.view_of(lse, "lse")
    if tuple(vl.shape) != tuple(lse_shape) or vl.dtype != _abi.FA_DTYPE_FP32 or \
            vl.kind != vq.kind or not vl.writeable:
        raise usage("FA_ESHAPE", "lse must be writable float32 %s %s memory"
                    % (list(lse_shape), vq.kind))
    return out, vo, lse, vl


def _call(c, fn_name, nbytes, cls, tensors, indexes, scale, mask, precision, window,
          softcap, scalars, stream=None):
    """Resolve, pack and make one call: synchronous (stream None), or asynchronous on the
    stream `stream` names ("current", a stream; fa_attn_*_async: every tensor and index
    table in device memory, else the library's FA_EINVAL says which). tensors: (field, View,
    name, is_lse) of q, k, v, o and lse (in fa's 4-dimensional order already); indexes:
    (field, View, name); scalars: (field, value) int64 fields."""
    lib = c._lib
    from . import _lib
    fn = getattr(lib, fn_name, None)
    if fn is None:
        raise usage("FA_ENOTSUP", "the loaded libfaclient (%s, %s) has no %s: it predates "
                    "the inference calls; install a newer one"
                    % (lib.fa_version_string().decode(), _lib.path(), fn_name))
    fn_async = getattr(lib, fn_name + "_async", None)
    if stream is not None and fn_async is None:
        raise usage("FA_ENOTSUP", "the loaded libfaclient (%s, %s) has no %s_async: it "
                    "predates the asynchronous inference calls; pass stream=None or install "
                    "a newer one" % (lib.fa_version_string().decode(), _lib.path(), fn_name))
    entries = [(f, v, n, lse, True) for f, v, n, lse in tensors] + \
              [(f, v, n, False, False) for f, v, n in indexes]
    groups = {}
    for i, e in enumerate(entries):
        groups.setdefault(e[1].kind, []).append(i)
    where = [None] * len(entries)
    backs, keep = [], []
    for kind, idx in groups.items():
        views = [entries[i][1] for i in idx]
        names = [entries[i][2] for i in idx]
        res, back, k = _attn.resolve(c, views, names, ("out", "lse"), kind,
                                     stream if kind == CUDA else None, views[0])
        if kind == HOST and back:
            # A staged output starts as the caller's array: rows the daemon does not write
            # (varlen padding) keep their contents, as they do unstaged.
            np = _attn._np()
            for staged, ptr, shape, strides, itemsize in back:
                np.copyto(staged, _attn._raw(np, ptr, shape, strides, itemsize))
        for j, i in enumerate(idx):
            where[i] = res[j]
        backs.append(back)
        keep.append(k)
    a = _attn._args_block(nbytes)
    for (field, vw, n, is_lse, is_tensor), w in zip(entries, where):
        if is_tensor:
            _attn.pack_tensor(a, field, vw, w, False, is_lse)
        else:
            sh = tuple(vw.shape) + (1,) * (2 - len(vw.shape))
            st = tuple(vw.strides) + (1,) * (2 - len(vw.strides))
            _INDEX.pack_into(a, field, w[0], w[1], *sh, *st)
    for field, value in scalars:
        _I64.pack_into(a, field, value)
    _attn._DOUBLE.pack_into(a, cls.scale.offset, float(scale) if scale else 0.0)
    _attn._INT.pack_into(a, cls.mask.offset, mask)
    _attn._INT.pack_into(a, cls.precision.offset, precision)
    _attn.pack_window(a, cls, window, softcap)
    if stream is None:
        c._call(fn, C.addressof(a), what=None)
    else:
        vq = entries[0][1]
        _attn.call(c, C.addressof(a), vq.kind, stream, vq, fn, fn_async, any(backs))
    for back in backs:
        _attn.copy_back(back)
    del keep


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, scale, mask,
           window, softcap, want_lse, out=None, lse_out=None, client=None,
           precision=_abi.FA_PREC_DEFAULT, stream=None):
    """(out [total_q, Hq, Dv], lse float32 [Hq, total_q] or None) for packed q [total_q, Hq,
    D], k and v [total_k, Hkv, D] and int32 offsets [B + 1]. Raises FaError."""
    c = client if client is not None else default_client()
    vq, vk, vv = _float_views((q, k, v), ("q", "k", "v"), 3)
    vcq = _int32_view(cu_seqlens_q, "cu_seqlens_q", 1)
    vck = _int32_view(cu_seqlens_k, "cu_seqlens_k", 1)
    if vcq.shape != vck.shape:
        raise usage("FA_ESHAPE", "cu_seqlens_q has %d entries and cu_seqlens_k %d: both are "
                    "[batch + 1]" % (vcq.shape[0], vck.shape[0]))
    total_q, hq = vq.shape[0], vq.shape[1]
    out, vo, lse, vl = _outputs(vq, out, lse_out, (total_q, hq, vv.shape[2]), (hq, total_q),
                                want_lse)
    F = _abi.fa_attn_varlen_args
    tensors = [(F.q.offset, _view4(vq, True), "q", False),
               (F.k.offset, _view4(vk, True), "k", False),
               (F.v.offset, _view4(vv, True), "v", False),
               (F.o.offset, _view4(vo, True), "out", False)]
    if vl is not None:
        tensors.append((F.lse.offset, _view4(vl, True), "lse", True))
    indexes = [(F.cu_seqlens_q.offset, vcq, "cu_seqlens_q"),
               (F.cu_seqlens_k.offset, vck, "cu_seqlens_k")]
    scalars = [(F.max_seqlen_q.offset, _max_seqlen(max_seqlen_q, "max_seqlen_q")),
               (F.max_seqlen_k.offset, _max_seqlen(max_seqlen_k, "max_seqlen_k"))]
    _call(c, "fa_attn_varlen", _VARLEN_BYTES, F, tensors, indexes, scale, mask, precision,
          window, softcap, scalars, stream)
    return out, lse


def _max_seqlen(n, name):
    if n is None:
        return 0
    try:
        i = int(n)
    except (TypeError, ValueError):
        raise usage("FA_EINVAL", "%s=%r: an int (an upper bound of the lengths; 0 or None: "
                    "found from the offsets)" % (name, n)) from None
    if i != n or i < 0:
        raise usage("FA_EINVAL", "%s=%r: an int >= 0" % (name, n))
    return i


def kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, *, scale, mask,
            window, softcap, want_lse, out=None, lse_out=None, client=None,
            precision=_abi.FA_PREC_DEFAULT, stream=None):
    """(out [B, Sq, Hq, Dv], lse float32 [B, Hq, Sq] or None): q against the cache, after
    writing k_new/v_new [B, Snew, Hkv, D] (when given) into it at cache_seqlens. Every check
    the append depends on is made before anything is written. Raises FaError."""
    c = client if client is not None else default_client()
    names = ["q", "k_cache", "v_cache"]
    arrays = [q, k_cache, v_cache]
    if (k_new is None) != (v_new is None):
        raise usage("FA_EINVAL", "k and v: pass both new keys and new values, or neither")
    if k_new is not None:
        names += ["k", "v"]
        arrays += [k_new, v_new]
    views = _float_views(arrays, names, 4)
    vq, vkc, vvc = views[:3]
    B, Sq, Hq, D = vq.shape
    paged = block_table is not None
    if vkc.shape[:3] != vvc.shape[:3]:
        raise usage("FA_ESHAPE", "k_cache %s and v_cache %s: the same pages (or batch), "
                    "rows and heads" % (tuple(vkc.shape), tuple(vvc.shape)))
    Hkv = vkc.shape[2]
    if vkc.shape[3] != D:
        raise usage("FA_ESHAPE", "k_cache's head dim is %d and q's %d" % (vkc.shape[3], D))
    if Hkv == 0 or Hq % Hkv:
        raise usage("FA_ESHAPE", "q has %d heads and the cache %d: a multiple (GQA/MQA)"
                    % (Hq, Hkv))
    if paged:
        vbt = _int32_view(block_table, "block_table", 2)
        if vbt.shape[0] != B:
            raise usage("FA_ESHAPE", "block_table has %d rows and q a batch of %d"
                        % (vbt.shape[0], B))
        page_size = vkc.shape[1]
        if not PAGE_SIZE_MIN <= page_size <= PAGE_SIZE_MAX:
            raise usage("FA_ESHAPE", "k_cache: page size %d (its dimension 1); fa takes %d to "
                        "%d" % (page_size, PAGE_SIZE_MIN, PAGE_SIZE_MAX))
        capacity = vbt.shape[1] * page_size
    else:
        if vkc.shape[0] != B:
            raise usage("FA_ESHAPE", "k_cache has a batch of %d and q %d (a contiguous cache "
                        "is [batch, max_seqlen, heads, head_dim]; pass block_table for a "
                        "paged one)" % (vkc.shape[0], B))
        capacity = vkc.shape[1]
    seq_arr = None
    if cache_seqlens is None:
        seq_host = None  # the whole cache
    elif isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        seq_host = [int(cache_seqlens)] * B
    else:
        vsl = _int32_view(cache_seqlens, "cache_seqlens", 1)
        if vsl.shape[0] != B:
            raise usage("FA_ESHAPE", "cache_seqlens has %d entries and q a batch of %d"
                        % (vsl.shape[0], B))
        seq_arr, seq_host = cache_seqlens, None
    np = None
    snew = 0
    if k_new is not None:
        vkn, vvn = views[3:]
        snew = vkn.shape[1]
        if vkn.shape[:3] != (B, snew, Hkv) or vkn.shape[3] != D or \
                tuple(vvn.shape[:3]) != (B, snew, Hkv) or vvn.shape[3] != vvc.shape[3]:
            raise usage("FA_ESHAPE", "k %s and v %s: new tokens are [batch=%d, new, heads=%d, "
                        "head_dim] like the cache's" % (tuple(vkn.shape), tuple(vvn.shape),
                                                        B, Hkv))
        for d, n in ((D, "k"), (vvc.shape[3], "v")):  # the daemon's rule (fa_client.h), here
            if d % 8 or not 8 <= d <= 256:                # because the append comes first
                raise usage("FA_ESHAPE", "%s: head dim %d; fa takes multiples of 8 from 8 to "
                            "256" % (n, d))
        for vw, n in ((vkc, "k_cache"), (vvc, "v_cache")):
            if not vw.writeable:
                raise usage("FA_EINVAL", "%s is read-only: the new keys are written into it"
                            % n)
    if k_new is not None or cache_seqlens is None or seq_host is not None:
        np = _attn._np()
        if seq_host is None and seq_arr is not None:
            seq_host = _host_ints(seq_arr, "cache_seqlens")
        lens = (np.full(B, capacity, np.int64) if seq_host is None and cache_seqlens is None
                else np.asarray(seq_host, dtype=np.int64).reshape(B))
        if k_new is not None and cache_seqlens is None:
            raise usage("FA_EINVAL", "k and v without cache_seqlens: say where the new tokens "
                        "go (FlashAttention needs it too)")
        for b in range(B):
            if lens[b] < 0 or lens[b] + snew > capacity:
                raise usage("FA_EINVAL", "cache_seqlens[%d] = %d%s: the cache holds %d keys "
                            "per sequence" % (b, lens[b], " plus %d new" % snew if snew else
                                              "", capacity))
        total = (lens + snew).astype(np.int32)
        if k_new is not None:
            _append(np, k_cache, v_cache, k_new, v_new, lens, snew, block_table, paged,
                    vkc.shape[0] if paged else 0, vkc.shape[1] if paged else 0)
        seq_arr = np.ascontiguousarray(total)
    vsl = _int32_view(seq_arr, "cache_seqlens", 1)
    out, vo, lse, vl = _outputs(vq, out, lse_out, (B, Sq, Hq, vvc.shape[3]), (B, Hq, Sq),
                                want_lse)
    F = _abi.fa_attn_kvcache_args
    tensors = [(F.q.offset, vq, "q", False), (F.k.offset, vkc, "k_cache", False),
               (F.v.offset, vvc, "v_cache", False), (F.o.offset, vo, "out", False)]
    if vl is not None:
        tensors.append((F.lse.offset, vl, "lse", True))
    indexes = [(F.cache_seqlens.offset, vsl, "cache_seqlens")]
    if paged:
        indexes.append((F.page_table.offset, vbt, "block_table"))
    if stream is not None and (k_new is not None or seq_host is not None or
                               cache_seqlens is None):
        raise usage("FA_EINVAL", "stream=%r: the asynchronous KV-cache call reads "
                    "cache_seqlens in stream order from a device tensor; pass it as one and "
                    "append k/v into the cache yourself (this call's append reads the lengths "
                    "on the host)" % (stream,))
    _call(c, "fa_attn_kvcache", _KVCACHE_BYTES, F, tensors, indexes, scale, mask, precision,
          window, softcap, (), stream)
    return out, lse


def _append(np, k_cache, v_cache, k_new, v_new, lens, snew, block_table, paged, pages,
            page_size):
    """Write the new tokens into the cache at rows lens[b] .. lens[b] + snew - 1 of sequence b
    (through block_table when paged), with the arrays' own indexing. Page indices are checked
    first: nothing is written when one is outside the pools."""
    if snew == 0:
        return
    B = lens.shape[0]
    pos = lens[:, None] + np.arange(snew, dtype=np.int64)[None, :]  # [B, Snew]
    if paged:
        bt = np.asarray(_host_ints(block_table, "block_table"), dtype=np.int64)
        page = np.take_along_axis(bt, pos // page_size, axis=1)
        bad = np.argwhere((page < 0) | (page >= pages))
        if bad.size:
            b, t = bad[0]
            raise usage("FA_EINVAL", "block_table[%d][%d] = %d: the pools have %d pages" % (
                b, pos[b, t] // page_size, page[b, t], pages))
        i0, i1 = page, pos % page_size
    else:
        i0, i1 = np.repeat(np.arange(B, dtype=np.int64)[:, None], snew, axis=1), pos
    # (k_new[b, t] -> cache[i0[b, t], i1[b, t]]; sequences sharing a page write distinct rows
    # unless the caller's table aliases them, as FlashAttention's append would)
    a0, a1 = _as_lib(k_cache, i0), _as_lib(k_cache, i1)
    k_cache[a0, a1] = k_new
    v_cache[a0, a1] = v_new
