"""fa.empty_host: arrays that live in a registered shared-memory buffer, so the daemon reads and
writes them in place (no staging copy). One buffer (one daemon region) per call: allocate large
arrays and take views of them rather than many small ones (the daemon's default limit is 256
regions per session)."""
import ctypes as C
import sys

from . import _arrays
from ._client import _ArrayOwner, default_client
from ._errors import usage


def empty_host(shape, dtype="float32", *, client=None):
    """A new uninitialised C-contiguous array of `shape` in fa's shared memory.

    dtype: a NumPy dtype or name ("float16", "float32", "bfloat16" with ml_dtypes installed):
    returns a numpy.ndarray; or a torch dtype (torch.float16/bfloat16/float32): returns a CPU
    torch.Tensor. The memory is registered with `client`'s session (default: the process-wide
    client) and freed when the last array or view over it is gone. Raises FaError."""
    c = client if client is not None else default_client()
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise usage("FA_ESHAPE", "empty_host: negative size in %s" % (shape,))
    n = 1
    for s in shape:
        n *= s
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise usage("FA_EDTYPE", "empty_host: %s; fa takes float16, bfloat16, float32"
                        % dtype)
        nbytes = n * dtype.itemsize
        hb = c.host_buffer(max(nbytes, 1))
        mem = (C.c_uint8 * max(nbytes, 1)).from_address(hb.base)
        mem.fa_owner = hb  # the tensor keeps `mem`, which keeps the buffer
        t = torch.frombuffer(mem, dtype=torch.uint8)[:nbytes]
        return t.view(dtype).reshape(shape)
    try:
        import numpy as np
    except ImportError:
        raise usage("FA_ENOTSUP", "empty_host with a NumPy dtype needs NumPy") from None
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
        try:
            import ml_dtypes
        except ImportError:
            raise usage("FA_EDTYPE", "bfloat16 NumPy arrays need the ml_dtypes package (NumPy "
                        "has no bfloat16); use float16 or float32, or install ml_dtypes") \
                from None
        dtype = ml_dtypes.bfloat16
    dt = np.dtype(dtype)
    _arrays.numpy_dtype_code(dt, "empty_host")
    nbytes = n * dt.itemsize
    hb = c.host_buffer(max(nbytes, 1))
    owner = _ArrayOwner(hb, hb.base, (nbytes,), "|u1", [("", "|u1")])
    return np.asarray(owner).view(dt).reshape(shape)


def is_host_shared(x, *, client=None):
    """True when array `x` lies in one of `client`'s shared-memory buffers (used in place)."""
    c = client if client is not None else default_client()
    v = _arrays.view_of(x, "x")
    if v.kind != _arrays.HOST or min(v.strides, default=0) < 0:
        return False
    lo, hi = v.extent()
    return c._host_find(lo, hi) is not None


__all__ = ["empty_host", "is_host_shared"]
