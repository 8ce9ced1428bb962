"""The few CUDA driver calls the package makes itself, through ctypes on libcuda.so.1.

Loaded on the first CUDA array only, so host-only programs never touch the driver. One query per
device array and call: cuPointerGetAttributes gives the allocation's base, size and the driver's
process-wide unique buffer id, which is what the registration cache (_client.py) keys and
validates on.
"""
import ctypes as C
import threading

# CUpointer_attribute values (cuda.h; tests/test_abi.py checks them when cuda.h is installed).
CU_POINTER_ATTRIBUTE_BUFFER_ID = 7
CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
ATTRIBUTES = {"CU_POINTER_ATTRIBUTE_BUFFER_ID": CU_POINTER_ATTRIBUTE_BUFFER_ID,
              "CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL": CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
              "CU_POINTER_ATTRIBUTE_RANGE_START_ADDR": CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
              "CU_POINTER_ATTRIBUTE_RANGE_SIZE": CU_POINTER_ATTRIBUTE_RANGE_SIZE}

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
