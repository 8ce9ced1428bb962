"""Reading a DLPack capsule (the DLManagedTensor it holds) with ctypes, without consuming it.

The capsule stays named "dltensor" and is kept referenced while its memory is used, so the
producer's capsule destructor releases the tensor when the capsule goes away (the protocol's
rule for a capsule that was never consumed).
"""
import ctypes as C

kDLCPU, kDLCUDA, kDLCUDAHost = 1, 2, 3
kDLInt, kDLUInt, kDLFloat, kDLBfloat = 0, 1, 2, 4


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32),
                ("dtype", DLDataType), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


_get = C.pythonapi.PyCapsule_GetPointer
_get.restype = C.c_void_p
_get.argtypes = [C.py_object, C.c_char_p]


def read(capsule):
    """(data address, device type, device id, (code, bits, lanes), shape, strides in elements)
    of a "dltensor" capsule. Raises ValueError for a consumed or foreign capsule."""
    try:
        p = _get(capsule, b"dltensor")
    except Exception as e:  # ValueError from the C API for another name
        raise ValueError("not an unconsumed DLPack capsule (%s)" % e) from None
    t = DLTensor.from_address(p)  # DLManagedTensor starts with its DLTensor
    n = t.ndim
    shape = tuple(t.shape[i] for i in range(n))
    if t.strides:
        strides = tuple(t.strides[i] for i in range(n))
    else:  # NULL: compact row-major
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    return ((t.data or 0) + t.byte_offset, t.device.device_type, t.device.device_id,
            (t.dtype.code, t.dtype.bits, t.dtype.lanes), shape, strides)
