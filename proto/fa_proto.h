/* fa_proto.h - the wire contract between libfaclient and fa-daemon.
 *
 * Every message is one msgpack map with short string keys; `v` (protocol version) and `op` are in
 * every message. PROTOCOL.md documents each message, key and status. This file is pure C: no I/O.
 *
 * Bump FA_PROTO_VERSION on any change to a message. Never renumber an op; retired numbers stay
 * retired (tmux's rule).
 */
#ifndef FA_PROTO_H
#define FA_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_types.h" /* fa_status, fa_dtype, fa_mask, fa_precision */

#define FA_PROTO_VERSION 1

/* Hard limits of the decoder: a message larger than FA_PROTO_MAX_MSG, nested deeper than
 * FA_PROTO_MAX_DEPTH, or declaring a container or string longer than the bytes left is rejected
 * before msgpack-c sees it (msgpack-c trusts declared sizes: a 5-byte message made it reserve
 * 4 GiB). */
#define FA_PROTO_MAX_MSG 65536
#define FA_PROTO_MAX_DEPTH 8

#define FA_PROTO_SHM_NAME_MAX 64  /* incl. NUL; names are "/fa.<...>" with no other '/' */
#define FA_PROTO_IPC_HANDLE_LEN 64 /* cudaIpcMemHandle_t, cudaIpcEventHandle_t */
#define FA_PROTO_MAX_SLOTS 64      /* asynchronous mode: slots per session (client sockets) */
/* Asynchronous mode's completion words (PROTOCOL.md 4.3): a CUDA IPC region registered with
 * "wds" holds, for slot k, the 64-bit "ready" word at byte 16 k (the client's stream writes the
 * call's "wq" into it after the work that writes Q, K, V) and the "done" word at 16 k + 8 (the
 * daemon's stream writes "wq" into it after O). The region has at least this many bytes. */
#define FA_PROTO_WORDS_BYTES (FA_PROTO_MAX_SLOTS * 16)
#define FA_PROTO_WORDS_READY(slot) ((uint64_t)(slot) * 16u)
#define FA_PROTO_WORDS_DONE(slot) ((uint64_t)(slot) * 16u + 8u)
#define FA_PROTO_UUID_LEN 16
#define FA_PROTO_DETAIL_MAX 256    /* incl. NUL */
#define FA_PROTO_STATS_MAX 16384   /* incl. NUL */
#define FA_PROTO_NAME_MAX 64       /* client name in HELLO, incl. NUL */
#define FA_PROTO_CLIENTS_MAX 128   /* entries in one CLIENTS reply: a full one means "ask again
                                    * with after = the last id" */

/* Operations, grouped by tens. The reply to a request carries the request's op. */
enum fa_op {
	FA_OP_HELLO = 1,       /* open a session */
	FA_OP_BYE = 2,         /* close the session, free its regions */
	FA_OP_PING = 3,        /* liveness */
	FA_OP_STATS = 4,       /* INFO-style statistics text */
	FA_OP_REGISTER = 10,   /* register a buffer as a region */
	FA_OP_UNREGISTER = 11, /* unregister a region */
	FA_OP_ATTN_FWD = 20,   /* forward attention */
	FA_OP_ATTN_BWD = 21,   /* backward attention: dQ, dK, dV */
	/* 22 is reserved for the backward pass */
	FA_OP_ATTN_VARLEN = 23,  /* forward over packed sequences of different lengths */
	FA_OP_ATTN_KVCACHE = 24, /* forward against a KV cache, contiguous or paged */
	/* 25 is reserved for the inference ops */
	FA_OP_CLIENTS = 30,    /* the sessions, one entry each (fa-ctl clients) */
	/* 50-54: the submission ring (fa_ring.h) */
	FA_OP_RING_OPEN = 50,  /* map the session's submission ring: u.reg's shm_name and size
	                        * (kind unused); the reply's u.reg.region is the ring's id */
};

/* Bits of the ATTN_BWD request's flags ("fl"); any other bit is FA_EPROTO. */
#define FA_PROTO_BWD_DETERMINISTIC 1u /* dQ summed in a fixed order: the same bits every run */
#define FA_PROTO_BWD_FLAGS FA_PROTO_BWD_DETERMINISTIC /* every known bit */

/* Kinds of registered memory. Values travel on the wire. */
enum fa_region_kind {
	FA_REGION_HOST_SHM = 1, /* POSIX shared memory, by name */
	FA_REGION_CUDA_IPC = 2, /* a cudaIpcMemHandle_t of a whole device allocation */
};

/* Which engine serves attention (in HELLO's reply). */
enum fa_backend_kind {
	FA_BACKEND_CPU = 1,
	FA_BACKEND_GPU = 2,
};

/* A tensor on the wire: a region of the session, a byte offset, dtype, 4 sizes and 4 strides in
 * elements (as fa_tensor in the client's fa_client.h). */
struct fa_proto_tensor {
	uint64_t region;   /* region id from REGISTER; 0 = absent (only for the optional lse) */
	uint64_t offset;   /* bytes */
	uint8_t dtype;     /* enum fa_dtype */
	int64_t shape[4];
	int64_t stride[4];
};

/* One session in a CLIENTS reply. */
struct fa_proto_client {
	uint64_t session;             /* its id */
	uint32_t pid;                 /* the peer's pid as the kernel says (SO_PEERCRED) */
	uint32_t pid_claimed;         /* the pid HELLO claimed (differs: a pid namespace, a liar) */
	uint32_t uid;                 /* the peer's uid (SO_PEERCRED) */
	char cmd[FA_PROTO_NAME_MAX];  /* HELLO's name, else /proc/<pid>/comm, else "" */
	uint32_t regions;             /* registered buffers */
	uint64_t bytes;               /* their bytes */
	uint32_t inflight;            /* attention requests accepted, not answered yet */
	uint64_t done;                /* requests served on the session */
	uint64_t since_ms;            /* when HELLO opened it, Unix time in milliseconds */
};

/* An int32 index tensor on the wire (sequence offsets, cache lengths, a page table): a region of
 * the session, a byte offset, 2 sizes and 2 strides in elements; a vector is [n, 1]. */
struct fa_proto_index {
	uint64_t region;   /* region id; 0 = absent (only for the optional ones) */
	uint64_t offset;   /* bytes */
	int64_t shape[2];
	int64_t stride[2];
};

/* The sliding window and softcap of a forward-type request and of ATTN_BWD (keys "wl", "wr",
 * "cap", all optional: absent is off, as before they existed). */
struct fa_proto_window {
	bool window;                       /* "wl" and "wr" present */
	int64_t window_left, window_right; /* < 0: unbounded */
	double softcap;                    /* >= 0, 0 = off ("cap" absent) */
};

/* A request, decoded. Which union member is valid depends on op. */
struct fa_proto_req {
	uint32_t v;       /* protocol version */
	uint32_t op;      /* enum fa_op */
	uint64_t session; /* 0 in HELLO; the session id everywhere else */
	uint64_t seq;     /* client's sequence number, unique per session; replies echo it */
	union {
		struct {
			uint32_t pid;                  /* the client's pid, as it claims (logs only) */
			char name[FA_PROTO_NAME_MAX];  /* program name, for logs and stats; may be "" */
		} hello;
		struct {
			uint8_t kind;                                  /* enum fa_region_kind */
			uint64_t size;                                 /* bytes the client will address */
			char shm_name[FA_PROTO_SHM_NAME_MAX];          /* FA_REGION_HOST_SHM */
			uint8_t ipc_handle[FA_PROTO_IPC_HANDLE_LEN];   /* FA_REGION_CUDA_IPC */
			uint8_t gpu_uuid[FA_PROTO_UUID_LEN];           /* FA_REGION_CUDA_IPC */
			bool words; /* "wds": completion words (CUDA_IPC only), see FA_PROTO_WORDS_* */
		} reg;
		struct {
			uint64_t region;
		} unreg;
		struct {
			struct fa_proto_tensor q, k, v, o;
			struct fa_proto_tensor lse; /* lse.region == 0: not wanted */
			double scale;               /* 0 = 1/sqrt(D) */
			uint8_t mask;               /* enum fa_mask */
			uint8_t precision;          /* enum fa_precision */
			/* Asynchronous mode ("slot" present): the reply comes when the kernel is
			 * enqueued and carries the daemon's event; one daemon event per (session,
			 * slot), so a client reuses a slot only after waiting on its last event. */
			bool async;
			uint32_t slot;              /* < FA_PROTO_MAX_SLOTS */
			bool has_event;             /* the daemon's stream waits on event first */
			uint8_t event[FA_PROTO_IPC_HANDLE_LEN]; /* the client's cudaIpcEventHandle_t */
			uint8_t priority;           /* enum fa_priority; key "pri", absent = normal */
			struct fa_proto_window win; /* optional keys; zero: off */
			/* Or completion words (both or neither; with slot, without event): the
			 * daemon's stream waits for ready[slot] >= words_seq before the kernel and
			 * writes done[slot] = words_seq after it. */
			uint64_t words_region;      /* "wrg": a region registered with words; 0: none */
			uint64_t words_seq;         /* "wq": > 0 */
		} fwd;
		/* ATTN_BWD: the forward's tensors and settings (o and lse are inputs here, lse is
		 * required), the upstream gradient dout, the gradients dq, dk, dv written; async
		 * fields as the forward's. */
		struct {
			struct fa_proto_tensor q, k, v, o, lse, dout; /* inputs */
			struct fa_proto_tensor dq, dk, dv;            /* outputs */
			double scale;               /* 0 = 1/sqrt(D) */
			uint8_t mask;               /* enum fa_mask */
			uint8_t precision;          /* enum fa_precision */
			uint32_t flags;             /* FA_PROTO_BWD_* bits */
			uint8_t priority;           /* enum fa_priority; key "pri", absent = normal */
			bool async;
			uint32_t slot;              /* < FA_PROTO_MAX_SLOTS */
			bool has_event;
			uint8_t event[FA_PROTO_IPC_HANDLE_LEN];
			struct fa_proto_window win; /* optional keys, as the forward's; zero: off */
			uint64_t words_region;      /* "wrg", "wq": completion words, as the forward's */
			uint64_t words_seq;
		} bwd;
		struct {
			uint64_t after; /* only sessions with a larger id ("after", optional: 0) */
		} clients;
		/* ATTN_VARLEN: q, o [1, total_q, Hq, D], k, v [1, total_k, Hkv, D], cu_q and cu_k
		 * [B + 1, 1]. ATTN_KVCACHE: k, v a cache [B, rows, Hkv, D] or, with page_table
		 * [B, pages per sequence], pools [pages, page size, Hkv, D]; cache_len [B, 1]; q, o
		 * dense [B, Sq, Hq, D] or, with cu_q, packed. Asynchronous ("slot") only with
		 * completion words ("wrg", "wq": no IPC events for these ops). */
		struct {
			struct fa_proto_tensor q, k, v, o;
			struct fa_proto_tensor lse;        /* region 0: not wanted */
			struct fa_proto_index cu_q, cu_k;  /* KVCACHE: cu_q optional, cu_k unused */
			struct fa_proto_index cache_len;   /* KVCACHE */
			struct fa_proto_index page_table;  /* KVCACHE, optional */
			uint64_t max_q, max_k;             /* 0: the daemon finds them */
			double scale;
			uint8_t mask;
			uint8_t precision;
			struct fa_proto_window win;
			bool async;                        /* "slot" present */
			uint32_t slot;                     /* < FA_PROTO_MAX_SLOTS */
			uint64_t words_region;             /* "wrg": required with slot */
			uint64_t words_seq;                /* "wq": > 0 */
		} infer;
	} u;
};

/* A reply, decoded. status != FA_OK replies carry detail and no op-specific part. */
struct fa_proto_rep {
	uint32_t v;
	uint32_t op;      /* the request's op; 0 when the request could not be decoded */
	int32_t status;   /* fa_status */
	uint64_t seq;     /* the request's seq; 0 when it could not be decoded */
	uint64_t epoch;   /* the daemon's epoch, in every reply */
	char detail[FA_PROTO_DETAIL_MAX]; /* why, for errors; "" otherwise */
	union {
		struct {
			uint64_t session;
			uint32_t max_msg;      /* bytes */
			uint32_t max_inflight; /* per session */
			uint32_t max_regions;  /* per session */
			uint8_t backend;       /* enum fa_backend_kind */
		} hello;
		struct {
			uint64_t region;
		} reg;
		/* ATTN_FWD's reply, and ATTN_BWD's, ATTN_VARLEN's and ATTN_KVCACHE's (the same keys). */
		struct {
			uint64_t compute_ns; /* time the backend spent on this request (async: 0) */
			bool async;          /* an asynchronous request's reply: event is set */
			uint8_t event[FA_PROTO_IPC_HANDLE_LEN]; /* the daemon's completion event */
		} fwd;
		struct {
			char text[FA_PROTO_STATS_MAX];
		} stats;
		struct {
			uint32_t n; /* entries used, <= FA_PROTO_CLIENTS_MAX, in increasing id order */
			struct fa_proto_client c[FA_PROTO_CLIENTS_MAX];
		} clients;
	} u;
};

/* Check the structure of untrusted bytes before any msgpack-c call: total size, nesting depth,
 * every declared length and count against the bytes left, exactly one top-level object that
 * consumes the whole buffer. Returns FA_OK, FA_ETOOBIG or FA_EPROTO (detail written to err). */
fa_status fa_proto_prescan(const void *buf, size_t len, char *err, size_t errlen);

/* Encode into buf (capacity cap); *len gets the encoded size (0 on failure). Never allocates.
 * `v` in the struct is ignored: this side's FA_PROTO_VERSION is written. Only the fields of the
 * struct's op are written (a failure reply: the header and detail; lse only when lse.region != 0).
 * Returns FA_OK, FA_ETOOBIG (does not fit in cap or in FA_PROTO_MAX_MSG) or FA_EINVAL (a NULL
 * pointer, or a field the decoder would reject: unknown op, enum out of range, region 0, negative
 * dimension, non-finite scale, a string not NUL-terminated inside its array, sid in HELLO). */
fa_status fa_proto_encode_req(const struct fa_proto_req *req, void *buf, size_t cap, size_t *len);
fa_status fa_proto_encode_rep(const struct fa_proto_rep *rep, void *buf, size_t cap, size_t *len);

/* Decode untrusted bytes: pre-scan, unpack, require every key the op needs with the right type and
 * range, reject unknown keys. On failure *out is zeroed except v, op (only a known op; 0 otherwise),
 * seq and, for requests, session when they could be read (so the daemon can address its error
 * reply), and err says why (err may be NULL). Returns FA_OK, FA_EPROTO, FA_EVERSION (v differs
 * from FA_PROTO_VERSION; out->v holds the peer's), FA_ETOOBIG, FA_ENOMEM (msgpack-c could not
 * allocate its objects: at most ~48 bytes per input byte) or FA_EINVAL (out is NULL). */
fa_status fa_proto_decode_req(const void *buf, size_t len, struct fa_proto_req *out, char *err,
                              size_t errlen);
fa_status fa_proto_decode_rep(const void *buf, size_t len, struct fa_proto_rep *out, char *err,
                              size_t errlen);

/* Name of an op for logs ("ATTN_FWD", "ATTN_BWD"); "UNKNOWN" for others. Static storage. */
const char *fa_proto_op_name(uint32_t op);

#endif /* FA_PROTO_H */
