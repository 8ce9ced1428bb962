"""What the package accepts as a tensor, reduced to one description (View): where its memory is
(host or a CUDA device), the address of its first element, dtype, shape and strides in elements.

Recognised, in this order: torch.Tensor (CPU and CUDA), numpy.ndarray (bf16 through ml_dtypes'
bfloat16), objects with __cuda_array_interface__ (CuPy, Numba), objects with __dlpack__. torch
and numpy are looked up in sys.modules, never imported here: a program that does not use one
does not pay for it.
"""
import importlib
import sys

from . import _abi, _dlpack
from ._errors import usage

HOST, CUDA = "host", "cuda"
_DTYPE_NAMES = {_abi.FA_DTYPE_FP16: "float16", _abi.FA_DTYPE_BF16: "bfloat16",
                _abi.FA_DTYPE_FP32: "float32"}
_ITEMSIZE = {_abi.FA_DTYPE_FP16: 2, _abi.FA_DTYPE_BF16: 2, _abi.FA_DTYPE_FP32: 4}
_TYPESTR = {"<f2": _abi.FA_DTYPE_FP16, "<f4": _abi.FA_DTYPE_FP32}
_DL = {(_dlpack.kDLFloat, 16): _abi.FA_DTYPE_FP16, (_dlpack.kDLFloat, 32): _abi.FA_DTYPE_FP32,
       (_dlpack.kDLBfloat, 16): _abi.FA_DTYPE_BF16}


class View:
    """One array as fa sees it. strides are in elements and may be negative or zero; `obj` is
    the caller's object, `keep` whatever must stay alive while the memory is used."""
    __slots__ = ("obj", "kind", "lib", "ptr", "dtype", "shape", "strides", "device", "stream",
                 "keep", "writeable")

    def __init__(self, obj, kind, lib, ptr, dtype, shape, strides, device=-1, stream=None,
                 keep=None, writeable=True):
        self.obj, self.kind, self.lib, self.ptr, self.dtype = obj, kind, lib, ptr, dtype
        self.shape, self.strides, self.device, self.stream = shape, strides, device, stream
        self.keep, self.writeable = keep, writeable

    @property
    def itemsize(self):
        return _ITEMSIZE[self.dtype]

    def extent(self):
        """[lo, hi) byte addresses the elements span."""
        lo = hi = self.ptr
        for n, s in zip(self.shape, self.strides):
            if n == 0:
                return self.ptr, self.ptr
            d = (n - 1) * s * self.itemsize
            if d < 0:
                lo += d
            else:
                hi += d
        return lo, hi + self.itemsize


_TORCH_CODES = {}
_NP_CODES = {}  # numpy dtype -> fa dtype, filled as dtypes are seen (dtype.name is slow)


def _torch_dtype(t, name):
    if not _TORCH_CODES:
        torch = sys.modules["torch"]
        _TORCH_CODES.update({torch.float16: _abi.FA_DTYPE_FP16,
                             torch.bfloat16: _abi.FA_DTYPE_BF16,
                             torch.float32: _abi.FA_DTYPE_FP32})
    d = _TORCH_CODES.get(t.dtype)
    if d is None:
        raise usage("FA_EDTYPE", "%s: dtype %s; fa takes float16, bfloat16 and float32"
                    % (name, t.dtype))
    return d


def numpy_dtype_code(dt, name="array"):
    """fa's dtype for a NumPy dtype (ml_dtypes' bfloat16 is bf16)."""
    code = _NP_CODES.get(dt)
    if code is not None:
        return code
    if dt.name == "bfloat16" and dt.itemsize == 2:
        code = _abi.FA_DTYPE_BF16
    else:
        code = {"float16": _abi.FA_DTYPE_FP16, "float32": _abi.FA_DTYPE_FP32}.get(dt.name)
    if code is None or not dt.isnative:
        raise usage("FA_EDTYPE", "%s: NumPy dtype %s; fa takes float16, float32 and, with "
                    "ml_dtypes installed, ml_dtypes.bfloat16 (NumPy has no bfloat16 of its "
                    "own)" % (name, dt.str if code else dt))
    _NP_CODES[dt] = code
    return code


def view_of(x, name):
    """The View of `x`. Raises FaError FA_EINVAL/FA_EDTYPE for what it cannot take."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        dt = _TORCH_CODES.get(x.dtype) or _torch_dtype(x, name)
        if x.is_cuda:
            return View(x, CUDA, "torch", x.data_ptr(), dt, tuple(x.shape), x.stride())
        if not x.is_cpu:
            raise usage("FA_ENOTSUP", "%s: a tensor on %s; fa takes CUDA and CPU tensors"
                        % (name, x.device))
        return View(x, HOST, "torch", x.data_ptr(), dt, tuple(x.shape), x.stride())
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        dt = _NP_CODES.get(x.dtype) or numpy_dtype_code(x.dtype, name)
        isz = x.itemsize
        fl = x.flags
        if not fl.aligned:  # strides (or the address) not multiples of the element size
            raise usage("FA_EALIGN", "%s: byte strides %s are not multiples of the element "
                        "size %d" % (name, x.strides, isz))
        return View(x, HOST, "numpy", x.__array_interface__["data"][0], dt, x.shape,
                    tuple([s // isz for s in x.strides]), writeable=fl.writeable)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        return _view_cai(x, cai, name)
    if hasattr(x, "__dlpack__"):
        return _view_dlpack(x, name)
    raise usage("FA_EINVAL", "%s: %s is not an array fa takes (torch.Tensor, numpy.ndarray, "
                "__cuda_array_interface__ or DLPack)" % (name, type(x).__name__))


def _view_cai(x, cai, name):
    ts = cai["typestr"]
    dt = _TYPESTR.get(ts)
    if dt is None:
        if hasattr(x, "__dlpack__"):  # bf16 has no typestr of its own; DLPack names it
            return _view_dlpack(x, name)
        raise usage("FA_EDTYPE", "%s: __cuda_array_interface__ typestr %r; fa takes '<f2' and "
                    "'<f4' (bfloat16 through DLPack)" % (name, ts))
    isz = _ITEMSIZE[dt]
    shape = tuple(cai["shape"])
    if cai.get("strides") is None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    else:
        bs = cai["strides"]
        if any(s % isz for s in bs):
            raise usage("FA_EALIGN", "%s: byte strides %s are not multiples of the element "
                        "size %d" % (name, tuple(bs), isz))
        strides = tuple(s // isz for s in bs)
    ptr, readonly = cai["data"]
    return View(x, CUDA, "cai", ptr or 0, dt, shape, strides, -1, cai.get("stream"),
                writeable=not readonly)


def _view_dlpack(x, name):
    try:
        dev_type, dev_id = x.__dlpack_device__()
    except AttributeError:
        dev_type, dev_id = None, None
    kw = {"stream": -1} if dev_type == _dlpack.kDLCUDA else {}  # we synchronise ourselves
    try:
        cap = x.__dlpack__(**kw)
    except TypeError:
        cap = x.__dlpack__()
    ptr, dev_type, dev_id, (code, bits, lanes), shape, strides = _dlpack.read(cap)
    dt = _DL.get((code, bits)) if lanes == 1 else None
    if dt is None:
        raise usage("FA_EDTYPE", "%s: DLPack dtype (code %d, %d bits, %d lanes); fa takes "
                    "float16, bfloat16 and float32" % (name, code, bits, lanes))
    if dev_type in (_dlpack.kDLCPU, _dlpack.kDLCUDAHost):
        return View(x, HOST, "dlpack", ptr, dt, shape, strides, keep=cap)
    if dev_type == _dlpack.kDLCUDA:
        return View(x, CUDA, "dlpack", ptr, dt, shape, strides, dev_id, keep=cap)
    raise usage("FA_ENOTSUP", "%s: DLPack device type %d; fa takes CPU and CUDA memory"
                % (name, dev_type))


def empty_like(v, shape, dtype_code, name):
    """A new array of `shape` (and fa dtype) from the same library and device as View v, laid
    out like v when shape is v's. Raises FaError when the library offers no allocator."""
    x = v.obj
    if v.lib == "torch":
        torch = sys.modules["torch"]
        td = {_abi.FA_DTYPE_FP16: torch.float16, _abi.FA_DTYPE_BF16: torch.bfloat16,
              _abi.FA_DTYPE_FP32: torch.float32}[dtype_code]
        if tuple(shape) == tuple(x.shape) and td == x.dtype:
            return torch.empty_like(x)
        return torch.empty(shape, dtype=td, device=x.device)
    if v.lib == "numpy":
        np = sys.modules["numpy"]
        if tuple(shape) == x.shape and dtype_code == v.dtype:
            return np.empty_like(x)
        return np.empty(shape, dtype=np.float32 if dtype_code == _abi.FA_DTYPE_FP32 else x.dtype)
    want = _DTYPE_NAMES[dtype_code]
    ns = getattr(x, "__array_namespace__", None)
    if ns is not None:
        xp = ns()
        return xp.empty(tuple(shape), dtype=getattr(xp, want),
                        device=getattr(x, "device", None))
    root = type(x).__module__.split(".")[0]
    try:
        mod = importlib.import_module(root)
        return mod.empty(tuple(shape), dtype=want)  # CuPy, NumPy-like modules
    except Exception:
        raise usage("FA_EINVAL", "%s: cannot allocate an output like a %s.%s; pass out="
                    % (name, root, type(x).__name__)) from None
