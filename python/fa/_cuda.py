"""The few CUDA driver calls the package makes itself, through ctypes on libcuda.so.1.

Loaded on the first CUDA array only, so host-only programs never touch the driver. One query per
device array and call: cuPointerGetAttributes gives the allocation's base, size and the driver's
process-wide unique buffer id, which is what the registration cache (_client.py) keys and
validates on. A call that reuses a prebuilt argument block (_fast.py) asks for the buffer id
alone (one cuPointerGetAttribute per allocation). Memory CUDA IPC cannot export is classified
and copied through a cuMemAlloc staging buffer (_devstage.py) with the calls at the end.
"""
import ctypes as C
import threading

# CUpointer_attribute values (cuda.h; tests/test_abi.py checks them when cuda.h is installed).
CU_POINTER_ATTRIBUTE_CONTEXT = 1
CU_POINTER_ATTRIBUTE_BUFFER_ID = 7
CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10
CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17
ATTRIBUTES = {"CU_POINTER_ATTRIBUTE_CONTEXT": CU_POINTER_ATTRIBUTE_CONTEXT,
              "CU_POINTER_ATTRIBUTE_BUFFER_ID": CU_POINTER_ATTRIBUTE_BUFFER_ID,
              "CU_POINTER_ATTRIBUTE_IS_MANAGED": CU_POINTER_ATTRIBUTE_IS_MANAGED,
              "CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL": CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
              "CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE":
                  CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
              "CU_POINTER_ATTRIBUTE_RANGE_START_ADDR": CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
              "CU_POINTER_ATTRIBUTE_RANGE_SIZE": CU_POINTER_ATTRIBUTE_RANGE_SIZE,
              "CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE": CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE}

# Why an allocation cannot be exported by CUDA IPC (Driver.not_exportable_cause).
CAUSE_MANAGED = "managed memory (cudaMallocManaged)"
CAUSE_POOL = "a stream-ordered pool (cudaMallocAsync, torch.cuda.MemPool)"
CAUSE_VMM = ("a VMM allocation (cuMemCreate: PyTorch's PYTORCH_CUDA_ALLOC_CONF="
             "expandable_segments:True) or other memory legacy CUDA IPC cannot export")

_lock = threading.Lock()
_cu = None
_local = threading.local()


class Driver:
    """libcuda.so.1 with the prototypes used here."""

    def __init__(self):
        lib = C.CDLL("libcuda.so.1")
        lib.cuInit.argtypes = [C.c_uint]
        lib.cuInit.restype = C.c_int
        r = lib.cuInit(0)
        if r != 0:
            raise OSError("cuInit failed with CUresult %d" % r)
        lib.cuPointerGetAttributes.argtypes = [C.c_uint, C.c_void_p, C.c_void_p, C.c_uint64]
        lib.cuPointerGetAttributes.restype = C.c_int
        lib.cuCtxSynchronize.argtypes = []
        lib.cuCtxSynchronize.restype = C.c_int
        lib.cuStreamSynchronize.argtypes = [C.c_void_p]
        lib.cuStreamSynchronize.restype = C.c_int
        # The hot path's calls: plain integers in, the result at a scratch address.
        lib.cuPointerGetAttribute.argtypes = [C.c_void_p, C.c_int, C.c_uint64]
        lib.cuPointerGetAttribute.restype = C.c_int
        self.stream_synchronize = lib.cuStreamSynchronize
        for name, args in (("cuMemAlloc_v2", [C.c_void_p, C.c_size_t]),
                           ("cuMemFree_v2", [C.c_uint64]),
                           ("cuMemcpyDtoDAsync_v2", [C.c_uint64, C.c_uint64, C.c_size_t,
                                                     C.c_void_p]),
                           ("cuCtxPushCurrent_v2", [C.c_void_p]),
                           ("cuCtxPopCurrent_v2", [C.c_void_p]),
                           ("cuDeviceGet", [C.c_void_p, C.c_int]),
                           ("cuDevicePrimaryCtxRetain", [C.c_void_p, C.c_int])):
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = C.c_int
        self.lib = lib

    def range_of(self, ptr):
        """(base, size, buffer id, device ordinal) of the allocation holding `ptr`; base 0 when
        `ptr` is no CUDA allocation. Thread-safe (per-thread scratch)."""
        q = getattr(_local, "q", None)
        if q is None:
            vals = (C.c_uint64 * 4)()
            attrs = (C.c_int * 4)(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                  CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                  CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
            # The driver writes each value at its own size (the ordinal is an int): zero first.
            ptrs = (C.c_void_p * 4)(*[C.addressof(vals) + 8 * i for i in range(4)])
            q = _local.q = (vals, attrs, ptrs)
        vals, attrs, ptrs = q
        C.memset(vals, 0, 32)
        r = self.lib.cuPointerGetAttributes(4, attrs, ptrs, ptr)
        if r != 0:
            return 0, 0, 0, -1
        return vals[0], vals[1], vals[2], vals[3] & 0xFFFFFFFF

    def buffer_id(self, ptr):
        """The driver's unique id of the allocation holding `ptr` (0 when it is none): equal to
        a registration's id exactly while that allocation is alive. Thread-safe."""
        s = getattr(_local, "id", None)
        if s is None:
            s = _local.id = (C.c_uint64 * 1)()
            _local.id_addr = C.addressof(s)
        s[0] = 0
        if self.lib.cuPointerGetAttribute(_local.id_addr, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr):
            return 0
        return s[0]

    def attribute(self, ptr, attr):
        """One pointer attribute as an unsigned integer (0 when the query fails)."""
        v = (C.c_uint64 * 1)()
        if self.lib.cuPointerGetAttribute(C.addressof(v), attr, ptr):
            return 0
        return v[0]

    def exportable(self, ptr):
        """Whether legacy CUDA IPC can export the allocation holding `ptr`."""
        return bool(self.attribute(ptr, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) & 0xFF)

    def not_exportable_cause(self, ptr):
        """CAUSE_MANAGED, CAUSE_POOL or CAUSE_VMM for memory CUDA IPC cannot export."""
        if self.attribute(ptr, CU_POINTER_ATTRIBUTE_IS_MANAGED) & 0xFF:
            return CAUSE_MANAGED
        if self.attribute(ptr, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE):
            return CAUSE_POOL
        return CAUSE_VMM

    def context_of(self, ptr, ordinal):
        """The context to allocate and copy in for memory at `ptr` on device `ordinal`: the
        pointer's own, else (VMM and pool memory have none) the device's primary context,
        retained for the life of the process. Raises OSError."""
        ctx = self.attribute(ptr, CU_POINTER_ATTRIBUTE_CONTEXT)
        if ctx:
            return ctx
        dev = C.c_int(0)
        out = C.c_void_p(0)
        r = self.lib.cuDeviceGet(C.addressof(dev), ordinal)
        if r == 0:
            r = self.lib.cuDevicePrimaryCtxRetain(C.addressof(out), dev.value)
        if r != 0:
            raise OSError("the primary context of GPU %d: CUresult %d" % (ordinal, r))
        return out.value

    def _in(self, ctx, fn, *args):
        r = self.lib.cuCtxPushCurrent_v2(ctx)
        if r != 0:
            return r
        try:
            return fn(*args)
        finally:
            popped = C.c_void_p(0)
            self.lib.cuCtxPopCurrent_v2(C.addressof(popped))

    def mem_alloc(self, ctx, size):
        """A cuMemAlloc allocation of `size` bytes in `ctx` (exportable by CUDA IPC): its
        address. Raises OSError."""
        p = C.c_uint64(0)
        r = self._in(ctx, self.lib.cuMemAlloc_v2, C.addressof(p), size)
        if r != 0:
            raise OSError("cuMemAlloc(%d bytes) failed with CUresult %d" % (size, r))
        return p.value

    def mem_free(self, ctx, ptr):
        self._in(ctx, self.lib.cuMemFree_v2, ptr)

    def copy_async(self, ctx, dst, src, nbytes, stream):
        """Device-to-device copy of nbytes on `stream` (a CUstream handle, 0 the default).
        Raises OSError."""
        r = self._in(ctx, self.lib.cuMemcpyDtoDAsync_v2, dst, src, nbytes, stream or None)
        if r != 0:
            raise OSError("cuMemcpyDtoDAsync(%d bytes) failed with CUresult %d" % (nbytes, r))

    def stream_sync(self, ctx, stream):
        """cuStreamSynchronize(stream) with ctx current. Raises OSError."""
        r = self._in(ctx, self.lib.cuStreamSynchronize, stream or None)
        if r != 0:
            raise OSError("cuStreamSynchronize failed with CUresult %d" % r)

    def synchronize(self, stream=None):
        r = (self.lib.cuCtxSynchronize() if stream is None
             else self.lib.cuStreamSynchronize(stream))
        if r != 0:
            raise OSError("CUDA synchronize failed with CUresult %d" % r)


def driver():
    """The Driver, loaded on first use. Raises OSError when there is no usable driver."""
    global _cu
    if _cu is None:
        with _lock:
            if _cu is None:
                _cu = Driver()
    return _cu
