"""The C ABI of libfaclient as ctypes sees it: every struct, enum and prototype the package uses.

This is the only module that mirrors fa_client.h and fa_types.h. tests/test_abi.py compiles a C
program against the headers that prints sizeof/offsetof of every struct below and the value of
every enum constant, and compares them with this module, so the mirror cannot drift silently.

Adding a field: append it to the struct's _fields_ in the header's order (the C structs only grow
at their end). Adding a call: one line in PROTOTYPES; a call the loaded library lacks is left
unbound (an older library), and the Python function that needs it says so.
"""
import ctypes as C

# ---- enums (fa_types.h) ----------------------------------------------------------------------
FA_DTYPE_FP16 = 1
FA_DTYPE_BF16 = 2
FA_DTYPE_FP32 = 3

FA_MASK_NONE = 0
FA_MASK_CAUSAL_BOTTOM_RIGHT = 1
FA_MASK_CAUSAL_TOP_LEFT = 2

FA_PREC_DEFAULT = 0
FA_PREC_IEEE = 1
FA_PREC_3XTF32 = 2
FA_PREC_TF32 = 3
FA_PREC_BF16 = 4

FA_PRIORITY_NORMAL = 0
FA_PRIORITY_HIGH = 1
FA_PRIORITY_LOW = 2

# Flags of fa_attn_bwd_args.flags (fa_client.h).
FA_BWD_DETERMINISTIC = 1 << 0

# The statuses by name; names and texts at run time come from the library (fa_status_name,
# fa_strerror), these numbers only let Python code name the ones it tests for.
FA_STATUS = {
    "FA_OK": 0, "FA_EINVAL": 1, "FA_ENOMEM": 2, "FA_EUNAVAIL": 3, "FA_ETIMEDOUT": 4,
    "FA_EPROTO": 5, "FA_EVERSION": 6, "FA_EBUSY": 7, "FA_ECLOSED": 8, "FA_ENOTSUP": 9,
    "FA_EDEVICE": 10, "FA_ESESSION": 11, "FA_EREGION": 12, "FA_ERANGE": 13, "FA_ESHAPE": 14,
    "FA_EALIGN": 15, "FA_EOVERLAP": 16, "FA_ETOOBIG": 17, "FA_ENOFIT": 18, "FA_EPERM": 19,
    "FA_ENOGPU": 20, "FA_ELIMIT": 21, "FA_ESYS": 22, "FA_EIPC": 23, "FA_EDTYPE": 24,
    "FA_EINTERNAL": 99,
}
globals().update(FA_STATUS)

# Every enum constant above, for the layout test.
ENUMS = dict(FA_STATUS, FA_DTYPE_FP16=FA_DTYPE_FP16, FA_DTYPE_BF16=FA_DTYPE_BF16,
             FA_DTYPE_FP32=FA_DTYPE_FP32, FA_MASK_NONE=FA_MASK_NONE,
             FA_MASK_CAUSAL_BOTTOM_RIGHT=FA_MASK_CAUSAL_BOTTOM_RIGHT,
             FA_MASK_CAUSAL_TOP_LEFT=FA_MASK_CAUSAL_TOP_LEFT, FA_PREC_DEFAULT=FA_PREC_DEFAULT,
             FA_PREC_IEEE=FA_PREC_IEEE, FA_PREC_3XTF32=FA_PREC_3XTF32, FA_PREC_TF32=FA_PREC_TF32,
             FA_PREC_BF16=FA_PREC_BF16, FA_PRIORITY_NORMAL=FA_PRIORITY_NORMAL,
             FA_PRIORITY_HIGH=FA_PRIORITY_HIGH, FA_PRIORITY_LOW=FA_PRIORITY_LOW,
             FA_BWD_DETERMINISTIC=FA_BWD_DETERMINISTIC)

# C enums are int-sized on every ABI the library is built for.
fa_status = C.c_int
fa_enum = C.c_int

# ---- structs (fa_client.h) -------------------------------------------------------------------
fa_buffer_p = C.c_void_p  # opaque fa_buffer *
fa_client_p = C.c_void_p  # opaque fa_client *


class fa_tensor(C.Structure):
    _fields_ = [
        ("buf", fa_buffer_p),
        ("offset", C.c_uint64),
        ("dtype", fa_enum),
        ("shape", C.c_int64 * 4),
        ("stride", C.c_int64 * 4),
    ]


class fa_attn_fwd_args(C.Structure):
    _fields_ = [
        ("q", fa_tensor),
        ("k", fa_tensor),
        ("v", fa_tensor),
        ("o", fa_tensor),
        ("lse", fa_tensor),
        ("scale", C.c_double),
        ("mask", fa_enum),
        ("precision", fa_enum),
        # appended in 0.2 (fa_client.h), zero = today's behaviour: the priority class, the
        # sliding window and softcap
        ("priority", fa_enum),
        ("window", C.c_int32),
        ("window_left", C.c_int64),
        ("window_right", C.c_int64),
        ("softcap", C.c_double),
    ]


class fa_attn_bwd_args(C.Structure):
    _fields_ = [
        ("q", fa_tensor),
        ("k", fa_tensor),
        ("v", fa_tensor),
        ("o", fa_tensor),
        ("dout", fa_tensor),
        ("lse", fa_tensor),
        ("dq", fa_tensor),
        ("dk", fa_tensor),
        ("dv", fa_tensor),
        ("scale", C.c_double),
        ("mask", fa_enum),
        ("precision", fa_enum),
        ("flags", C.c_uint),
        ("priority", fa_enum),
        # appended (fa_client.h), zero = off: the forward's sliding window and softcap
        ("window", C.c_int32),
        ("window_left", C.c_int64),
        ("window_right", C.c_int64),
        ("softcap", C.c_double),
    ]


class fa_index(C.Structure):
    _fields_ = [
        ("buf", fa_buffer_p),
        ("offset", C.c_uint64),
        ("shape", C.c_int64 * 2),
        ("stride", C.c_int64 * 2),
    ]


class fa_attn_varlen_args(C.Structure):
    _fields_ = [
        ("q", fa_tensor),
        ("k", fa_tensor),
        ("v", fa_tensor),
        ("o", fa_tensor),
        ("lse", fa_tensor),
        ("cu_seqlens_q", fa_index),
        ("cu_seqlens_k", fa_index),
        ("max_seqlen_q", C.c_int64),
        ("max_seqlen_k", C.c_int64),
        ("scale", C.c_double),
        ("mask", fa_enum),
        ("precision", fa_enum),
        ("window", C.c_int32),
        ("window_left", C.c_int64),
        ("window_right", C.c_int64),
        ("softcap", C.c_double),
    ]


class fa_attn_kvcache_args(C.Structure):
    _fields_ = [
        ("q", fa_tensor),
        ("k", fa_tensor),
        ("v", fa_tensor),
        ("o", fa_tensor),
        ("lse", fa_tensor),
        ("cache_seqlens", fa_index),
        ("page_table", fa_index),
        ("cu_seqlens_q", fa_index),
        ("max_seqlen_q", C.c_int64),
        ("scale", C.c_double),
        ("mask", fa_enum),
        ("precision", fa_enum),
        ("window", C.c_int32),
        ("window_left", C.c_int64),
        ("window_right", C.c_int64),
        ("softcap", C.c_double),
    ]


# Prepared calls (fa_client.h: fa_prepare, fa_prepared_call).
FA_PREPARED_FWD = 1
FA_PREPARED_BWD = 2
FA_PREPARED_VARLEN = 3
FA_PREPARED_KVCACHE = 4
FA_PREPARED_MAX_TENSORS = 12
FA_PLACE_SYNC_STREAM = 1 << 0
FA_PLACE_ASYNC = 1 << 1
ENUMS.update(FA_PREPARED_FWD=FA_PREPARED_FWD, FA_PREPARED_BWD=FA_PREPARED_BWD,
             FA_PREPARED_VARLEN=FA_PREPARED_VARLEN, FA_PREPARED_KVCACHE=FA_PREPARED_KVCACHE,
             FA_PREPARED_MAX_TENSORS=FA_PREPARED_MAX_TENSORS,
             FA_PLACE_SYNC_STREAM=FA_PLACE_SYNC_STREAM, FA_PLACE_ASYNC=FA_PLACE_ASYNC)


class fa_placement(C.Structure):
    _fields_ = [
        ("stream", C.c_void_p),
        ("flags", C.c_uint32),
        ("moved", C.c_int32),
        ("buf", fa_buffer_p * FA_PREPARED_MAX_TENSORS),
        ("addr", C.c_uint64 * FA_PREPARED_MAX_TENSORS),
    ]


# Every mirrored struct, for the layout test: (C type name, ctypes class).
STRUCTS = [("fa_tensor", fa_tensor), ("fa_attn_fwd_args", fa_attn_fwd_args),
           ("fa_attn_bwd_args", fa_attn_bwd_args), ("fa_index", fa_index),
           ("fa_attn_varlen_args", fa_attn_varlen_args),
           ("fa_attn_kvcache_args", fa_attn_kvcache_args), ("fa_placement", fa_placement)]

# Args structs are handed to the library inside a zeroed block this much larger than the mirror:
# a library newer than this mirror (fields appended at the end, whose zero is their default)
# then reads zeros, never this process's unrelated memory.
ARGS_SLACK = 256

# ---- prototypes ------------------------------------------------------------------------------
P = C.POINTER
PROTOTYPES = {
    "fa_version_string": (C.c_char_p, []),
    "fa_status_name": (C.c_char_p, [fa_status]),
    "fa_strerror": (C.c_char_p, [fa_status]),
    "fa_last_error_detail": (C.c_char_p, []),
    "fa_client_open": (fa_status, [P(fa_client_p), C.c_char_p]),
    "fa_client_close": (None, [fa_client_p]),
    "fa_client_set_timeout": (fa_status, [fa_client_p, C.c_int]),
    "fa_client_epoch": (C.c_uint64, [fa_client_p]),
    "fa_client_reconnect": (fa_status, [fa_client_p]),
    "fa_ping": (fa_status, [fa_client_p]),
    "fa_stats": (fa_status, [fa_client_p, C.c_char_p, C.c_size_t]),
    "fa_buffer_alloc_host": (fa_status, [fa_client_p, C.c_size_t, P(fa_buffer_p)]),
    "fa_buffer_register_device": (fa_status, [fa_client_p, C.c_void_p, C.c_size_t,
                                              P(fa_buffer_p)]),
    "fa_buffer_free": (fa_status, [fa_buffer_p]),
    "fa_buffer_data": (C.c_void_p, [fa_buffer_p]),
    "fa_buffer_size": (C.c_size_t, [fa_buffer_p]),
    # The args pointer is passed as a plain address: the struct lives in a larger zeroed block.
    "fa_attn_fwd": (fa_status, [fa_client_p, C.c_void_p]),
    "fa_attn_fwd_async": (fa_status, [fa_client_p, C.c_void_p, C.c_void_p]),
    "fa_attn_bwd": (fa_status, [fa_client_p, C.c_void_p]),
    "fa_attn_bwd_async": (fa_status, [fa_client_p, C.c_void_p, C.c_void_p]),
    "fa_attn_varlen": (fa_status, [fa_client_p, C.c_void_p]),
    "fa_attn_kvcache": (fa_status, [fa_client_p, C.c_void_p]),
    "fa_attn_varlen_async": (fa_status, [fa_client_p, C.c_void_p, C.c_void_p]),
    "fa_attn_kvcache_async": (fa_status, [fa_client_p, C.c_void_p, C.c_void_p]),
    # (client, op, args, n, field, span, out): the arrays as ctypes arrays, once per plan
    "fa_prepare": (fa_status, [fa_client_p, fa_enum, C.c_void_p, C.c_uint,
                               P(C.c_uint32), P(C.c_uint64), P(C.c_void_p)]),
    "fa_prepared_free": (None, [C.c_void_p]),
    # the hot path: two plain addresses (the prepared call, its fa_placement)
    "fa_prepared_call": (fa_status, [C.c_void_p, C.c_void_p]),
}
REQUIRED = ("fa_version_string", "fa_status_name", "fa_strerror", "fa_last_error_detail",
            "fa_client_open", "fa_client_close", "fa_attn_fwd", "fa_buffer_alloc_host",
            "fa_buffer_free", "fa_buffer_data", "fa_buffer_size")


def bind(lib):
    """Set restype/argtypes of every prototype the library has; return the missing names."""
    missing = []
    for name, (res, args) in PROTOTYPES.items():
        fn = getattr(lib, name, None)
        if fn is None:
            missing.append(name)
            continue
        fn.restype = res
        fn.argtypes = args
    return missing


def packer(cls):
    """A struct.Struct that writes one `cls` (flat fields: pointers, integers, enums, doubles
    and arrays of them) at the ctypes offsets, padding included; values in field order with
    arrays flattened. Built from _fields_, so it follows the mirror."""
    import struct
    codes = {C.c_void_p: "Q", C.c_uint64: "Q", C.c_int64: "q", C.c_int: "i", C.c_uint: "I",
             C.c_double: "d", C.c_uint32: "I", C.c_int32: "i", C.c_float: "f"}
    fmt, pos = "<", 0
    for name, typ in cls._fields_:
        f = getattr(cls, name)
        if f.offset > pos:
            fmt += "%dx" % (f.offset - pos)
        if issubclass(typ, C.Array):
            fmt += "%d%s" % (typ._length_, codes[typ._type_])
        else:
            fmt += codes[typ]
        pos = f.offset + f.size
    if C.sizeof(cls) > pos:
        fmt += "%dx" % (C.sizeof(cls) - pos)
    s = struct.Struct(fmt)
    assert s.size == C.sizeof(cls), (fmt, s.size, C.sizeof(cls))
    return s
