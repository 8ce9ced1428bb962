/* fa_types.h - what every part of fa shares: the version, the export macro, the status codes and
 * the enums that travel on the wire.
 *
 * Installed beside fa_client.h (which includes it) and included by proto/, kernels/, daemon/ and
 * client/ alike, so nothing outside the client needs the client's header for a type. Plain C, no
 * system headers.
 */
#ifndef FA_TYPES_H
#define FA_TYPES_H

#ifdef __cplusplus
extern "C" {
#endif

/* Library version. Same major = ABI compatible; a minor release only adds API. The Makefile reads
 * these three lines to name the shared object and to write libfaclient.pc. */
#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 1
#define FA_VERSION_PATCH 0

#if defined(__GNUC__)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

/* Status codes, shared by the API and the wire protocol: XX(name, number, text), written once.
 * The enum, fa_status_name() and fa_strerror() are generated from this list (common/fa_status.c),
 * as libuv's UV_ERRNO_MAP. 0 is success. The numbers are part of the ABI and of the protocol:
 * never renumber, never reuse a retired value; a new status is a protocol change. */
#define FA_STATUS_MAP(XX)                                                                          \
	XX(FA_OK, 0, "success")                                                                    \
	/* bad argument: NULL pointer, bad enum value, bad size */                                 \
	XX(FA_EINVAL, 1, "invalid argument (a NULL pointer, a bad enum value or a bad size)")     \
	XX(FA_ENOMEM, 2, "out of host memory")                                                     \
	XX(FA_EUNAVAIL, 3, "daemon not running or not reachable at the socket path")              \
	XX(FA_ETIMEDOUT, 4, "no reply from the daemon within the timeout")                        \
	XX(FA_EPROTO, 5,                                                                           \
	   "malformed protocol message (bad msgpack, a wrong type, a missing or unknown key)")     \
	XX(FA_EVERSION, 6, "protocol version mismatch between client and daemon")                 \
	/* the session's queue is full */                                                          \
	XX(FA_EBUSY, 7, "too many calls in flight on this session; retry after earlier ones complete") \
	XX(FA_ECLOSED, 8, "the daemon is shutting down, or the client was closed")                \
	/* a valid request this daemon cannot serve */                                             \
	XX(FA_ENOTSUP, 9, "not supported by this daemon (its backend or a feature)")              \
	XX(FA_EDEVICE, 10, "GPU fault while serving the request")                                 \
	/* the daemon restarted (new epoch): fa_client_reconnect() */                              \
	XX(FA_ESESSION, 11, "unknown session: the daemon restarted; reconnect")                   \
	XX(FA_EREGION, 12, "unknown region, or a region of another session")                      \
	XX(FA_ERANGE, 13, "a tensor's extent (offset, shape, strides) reaches outside its region") \
	/* B/H/D mismatch, Hq not a multiple of Hkv, D not a multiple of 8 or > 256, a zero or     \
	 * negative size, head dim not contiguous */                                               \
	XX(FA_ESHAPE, 14, "inconsistent or unsupported tensor shapes")                            \
	XX(FA_EALIGN, 15, "an offset or stride breaks the alignment the kernels need")            \
	XX(FA_EOVERLAP, 16, "the output overlaps an input")                                       \
	/* a message over FA_PROTO_MAX_MSG, or a request over --max-request-gflop */                \
	XX(FA_ETOOBIG, 17, "message or request too big (the protocol's size limit, the daemon's work limit)") \
	XX(FA_ENOFIT, 18, "no tile configuration fits the device's shared memory")                \
	/* foreign shared memory, CUDA IPC events across users */                                  \
	XX(FA_EPERM, 19, "permission denied")                                                     \
	XX(FA_ENOGPU, 20, "no usable GPU or CUDA driver")                                         \
	XX(FA_ELIMIT, 21, "a session limit reached (too many regions or sessions)")               \
	/* the detail text, or errno in the daemon's log, says which call */                       \
	XX(FA_ESYS, 22, "an operating-system call failed")                                        \
	/* stream-ordered pools (cudaMallocAsync), managed or VMM memory */                        \
	XX(FA_EIPC, 23, "memory not exportable by CUDA IPC")                                      \
	XX(FA_EDTYPE, 24, "dtypes of q, k, v and o disagree, or a dtype this call does not take")  \
	XX(FA_EINTERNAL, 99, "internal error in fa; please report it with the daemon's log")

#define FA_STATUS_ENUM_ENTRY(name, number, text) name = number,
typedef enum fa_status { FA_STATUS_MAP(FA_STATUS_ENUM_ENTRY) } fa_status;
#undef FA_STATUS_ENUM_ENTRY

/* Human-readable text for a status. Never NULL; static storage, never freed, thread-safe, never
 * allocates. An unknown value gives a fixed "unknown status" text. */
FA_API const char *fa_strerror(fa_status st);

/* The enum's name as a string ("FA_ERANGE"), for logs and tests. Never NULL, static storage;
 * "FA_UNKNOWN" for an unknown value. */
FA_API const char *fa_status_name(fa_status st);

/* The library's version, "MAJOR.MINOR.PATCH". Static storage. */
FA_API const char *fa_version_string(void);

/* Element types. Values travel on the wire: never renumber. */
typedef enum fa_dtype {
	FA_DTYPE_FP16 = 1, /* IEEE half */
	FA_DTYPE_BF16 = 2, /* bfloat16 */
	FA_DTYPE_FP32 = 3, /* IEEE single */
} fa_dtype;

/* Masks. Causal masks differ when Sq != Sk: bottom-right aligns the last query with the last key
 * (FlashAttention >= 2.1: query i sees keys j <= i + Sk - Sq); top-left aligns the first query with
 * the first key (PyTorch's is_causal: query i sees keys j <= i). A query row that sees no key gets
 * O = 0 and logsumexp = -inf. Values travel on the wire: never renumber. */
typedef enum fa_mask {
	FA_MASK_NONE = 0,
	FA_MASK_CAUSAL_BOTTOM_RIGHT = 1,
	FA_MASK_CAUSAL_TOP_LEFT = 2,
} fa_mask;

/* How fp32 inputs are multiplied; ignored for fp16 and bf16 (always fp32 accumulation).
 * Values travel on the wire: never renumber. */
typedef enum fa_precision {
	FA_PREC_DEFAULT = 0, /* FA_PREC_3XTF32 */
	FA_PREC_IEEE = 1,    /* fp32 FFMA: exact fp32 products, slowest */
	FA_PREC_3XTF32 = 2,  /* split tf32 on tensor cores: fp32-level error (<= 1e-5 relative) */
	FA_PREC_TF32 = 3,    /* one tf32 product: ~1e-3 relative error, fast */
	FA_PREC_BF16 = 4,    /* inputs staged as bf16: bf16-level error, fastest */
} fa_precision;

/* Priority classes of a request (fa_attn_fwd_args.priority, the wire's optional "pri" key; 0 when
 * absent). The daemon starts queued work of a higher class first; within a class the sessions
 * take turns (round-robin), so one client flooding its queue cannot starve another. Values
 * travel on the wire: never renumber. */
typedef enum fa_priority {
	FA_PRIORITY_NORMAL = 0, /* the default */
	FA_PRIORITY_HIGH = 1,   /* small latency-bound requests (decode steps): ahead of normal */
	FA_PRIORITY_LOW = 2,    /* batch work: only when nothing of the other classes waits */
} fa_priority;

#ifdef __cplusplus
}
#endif
#endif /* FA_TYPES_H */
