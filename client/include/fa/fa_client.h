/* fa_client.h - the client library of fa-daemon, the FlashAttention service.
 *
 * The public header of libfaclient, with fa_types.h (the version, statuses and enums) that it
 * includes. Everything not declared in the two is internal.
 *
 * Model: a process opens one fa_client (a connection to the daemon and a session on it), allocates
 * buffers that the daemon can reach (POSIX shared memory, or the caller's CUDA device memory),
 * describes tensors as (buffer, byte offset, dtype, shape, strides) and asks for attention.
 *
 * Threads: every function taking an fa_client is safe to call from several threads at once on the
 * same client; calls from different threads are in flight at the daemon at the same time (the
 * library keeps one socket per in-flight call). fa_client_close() must not race with other calls
 * on the same client. fa_buffer objects may be used by any thread; freeing one while a call that
 * uses it is in flight is a bug in the caller.
 *
 * Ownership: pointers passed in are borrowed for the duration of the call unless a declaration
 * says otherwise. Objects returned through `**out` are owned by the caller and released with the
 * matching _close/_free. On failure `*out` is set to NULL and there is nothing to release.
 */
#ifndef FA_CLIENT_H
#define FA_CLIENT_H

#include <stddef.h>
#include <stdint.h>

/* The version, FA_API, fa_status with fa_strerror()/fa_status_name()/fa_version_string(), and
 * the enums fa_dtype, fa_mask and fa_precision: shared with every part of fa, installed beside
 * this header. */
#include "fa_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An open connection and session with the daemon. Opaque. */
typedef struct fa_client fa_client;

/* A buffer the daemon can reach, registered with the daemon under a region id. Opaque. */
typedef struct fa_buffer fa_buffer;

/* Connect to the daemon at `addr` and open a session (HELLO).
 * addr: an nanomsg address such as "ipc:///run/fa-daemon/fa.sock", or NULL for the default: the
 * environment variable FA_SOCKET if set, else "$XDG_RUNTIME_DIR/fa-daemon/fa.sock" if
 * XDG_RUNTIME_DIR is set, else "/run/fa-daemon/fa.sock".
 * Returns FA_OK; FA_EINVAL (address too long for a Unix socket, or malformed), FA_EUNAVAIL (no
 * socket file, or one nobody listens on: at once; or no daemon answered within the timeout; when
 * the per-user default is missing and the system socket exists, the detail says to set
 * FA_SOCKET), FA_EPERM (the socket or its directory is open to a group this process is not in:
 * the detail names the group), FA_EVERSION, FA_ENOMEM, FA_ESYS. */
FA_API fa_status fa_client_open(fa_client **out, const char *addr);

/* Say BYE to the daemon (which frees the session's regions), close every socket, free `c`.
 * Buffers of this client must be freed first; any left are freed here. Safe on NULL. */
FA_API void fa_client_close(fa_client *c);

/* Timeout in milliseconds for each later call's round trip to the daemon; 0 waits forever.
 * The default is 30000, or FA_TIMEOUT_MS from the environment when set at open.
 * Returns FA_OK or FA_EINVAL (negative). */
FA_API fa_status fa_client_set_timeout(fa_client *c, int timeout_ms);

/* The daemon's epoch: a random number fixed for the daemon's lifetime. A change means the daemon
 * restarted and every registration was lost. Returns 0 on a NULL client. */
FA_API uint64_t fa_client_epoch(const fa_client *c);

/* Reconnect after the daemon restarted: open a new session and register every live buffer of this
 * client again (their region ids change, their memory and contents do not). Calls that return
 * FA_ESESSION can be retried after this returns FA_OK. Not safe while other calls on `c` run.
 * Returns the statuses of fa_client_open() and fa_buffer_alloc_host(). */
FA_API fa_status fa_client_reconnect(fa_client *c);

/* Round trip a PING. Returns FA_OK, FA_ETIMEDOUT, FA_EUNAVAIL, FA_ESESSION. */
FA_API fa_status fa_ping(fa_client *c);

/* The daemon's statistics as text, INFO-style: "# section" lines and "key:value" lines.
 * Writes at most `len` bytes including the terminating NUL into `buf` (truncating).
 * Returns FA_OK, FA_EINVAL (NULL or len == 0), or a transport status. */
FA_API fa_status fa_stats(fa_client *c, char *buf, size_t len);

/* One session of the daemon, as fa_clients() lists it. */
typedef struct fa_client_info {
	uint64_t session;     /* the session's id */
	uint32_t pid;         /* the client's pid as the kernel reports the peer (SO_PEERCRED) */
	uint32_t pid_claimed; /* the pid the client claimed at open (differs across pid namespaces) */
	uint32_t uid;         /* the client's uid */
	char command[64];     /* the program's name as the client gave it, else /proc/<pid>/comm */
	uint32_t regions;     /* buffers registered */
	uint64_t bytes;       /* their bytes */
	uint32_t inflight;    /* attention calls accepted, not answered yet */
	uint64_t done;        /* requests served on the session */
	uint64_t since_ms;    /* when the session opened, Unix time in milliseconds */
} fa_client_info;

/* The daemon's sessions (this one too), in increasing id order: up to cap entries into out
 * (caller's array; may be NULL when cap is 0), the number the daemon listed into *n, which may
 * exceed cap (call again with a larger array). Root and the daemon's own user see every
 * session; any other user sees only the sessions of their own uid.
 * Returns FA_OK, FA_EINVAL (c or n NULL, out NULL with cap > 0), FA_ESESSION, FA_EPROTO (a
 * daemon older than the listing: "unknown op 30"), or a transport status. */
FA_API fa_status fa_clients(fa_client *c, fa_client_info *out, size_t cap, size_t *n);

/* Allocate `size` bytes of host memory in POSIX shared memory, map it here, and register it with
 * the daemon. The memory is zero-filled. The shared-memory object's group is set to the group of
 * the daemon's socket file (mode 0660), so a daemon running as another user in that group can map
 * it. Returns FA_OK, FA_EINVAL (size 0 or above the daemon's limit), FA_ESYS (shm_open, ftruncate
 * or mmap failed), FA_ELIMIT, FA_EPERM, or a transport status. */
FA_API fa_status fa_buffer_alloc_host(fa_client *c, size_t size, fa_buffer **out);

/* Register device memory that the caller allocated (cudaMalloc / cuMemAlloc, or a tensor of
 * PyTorch's default caching allocator) so the daemon's GPU backend reads and writes it in place,
 * with no copy: the library exports the allocation as a CUDA IPC handle, and the daemon opens it
 * once. [dptr, dptr + size) must lie inside one allocation; tensors are then addressed by byte
 * offsets from dptr, as for host buffers.
 * Ownership: the memory stays the caller's: fa_buffer_free() unregisters it but never frees it,
 * and the caller must call fa_buffer_free() BEFORE freeing the memory (the daemon may still map
 * it; freeing first is undefined behaviour in CUDA). fa_buffer_data() returns dptr.
 * Ordering: synchronous mode: finish the work that writes Q, K, V (cudaStreamSynchronize) before
 * fa_attn_fwd(); when it returns, O and lse are written and visible to later work.
 * Speed: give it allocations whose size is a multiple of 2 MiB (PyTorch's caching allocator's
 * large segments are): 8 imported cudaMalloc allocations of 64 MiB + 256 B, used in turn, ran
 * the attention kernel at 0.91x of local memory on an H200, the same rounded up to 2 MiB at
 * 1.00x (tests/bench/bench_ipcmem.c; daemon/RESULTS.md, 2026-12-03 16:53 UTC).
 * The CUDA driver (libcuda.so.1) is loaded on the first call; programs using only host buffers
 * never load it. fa_client_reconnect() registers the buffer again with the same handle.
 * Returns FA_OK; FA_EINVAL (NULL or size 0, not a CUDA device pointer, or the range leaves its
 * allocation), FA_ENOGPU (no CUDA driver: fa_last_error_detail() says why), FA_EIPC (memory that
 * legacy CUDA IPC cannot export: stream-ordered pools (cudaMallocAsync), managed memory, VMM
 * allocations (cuMemCreate, PyTorch's expandable_segments)), FA_ENOTSUP (the daemon has no GPU
 * backend, or serves another GPU), FA_ELIMIT, FA_ENOMEM, or a transport status. */
FA_API fa_status fa_buffer_register_device(fa_client *c, void *dptr, size_t size,
                                           fa_buffer **out);

/* Unregister the buffer from the daemon (after every kernel that used it finished), unmap it,
 * unlink the shared-memory object and free `b` (device buffers: unregister only; the memory is
 * the caller's and stays allocated). Safe on NULL. Returns FA_OK or the daemon's
 * status (the local resources are released either way). */
FA_API fa_status fa_buffer_free(fa_buffer *b);

/* The buffer's memory as mapped in this process (for a device buffer, the device pointer given
 * to fa_buffer_register_device). Valid until fa_buffer_free(). */
FA_API void *fa_buffer_data(const fa_buffer *b);

/* The buffer's size in bytes, as passed at allocation. */
FA_API size_t fa_buffer_size(const fa_buffer *b);

/* One tensor inside a registered buffer. Elements are addressed as
 *     data + offset + sizeof(dtype) * (i0*stride[0] + i1*stride[1] + i2*stride[2] + i3*stride[3])
 * For Q, K, V and O the dimensions are [B, S, H, D] (batch, sequence, head, head dim) and
 * stride[3] must be 1 (the head dim is contiguous); any other strides work, so both BSHD and
 * BHSD layouts are taken without copies.
 * Alignment: the offset and every stride in bytes must be multiples of the element size; for q,
 * k, v and o on the GPU backend (device buffers, and host buffers it stages) of 16 bytes as well,
 * the width of the kernels' vector loads (offset % 16 == 0, stride[0..2] * sizeof(dtype) % 16 == 0
 * where that dimension's size is > 1; lse needs its element size only): FA_EALIGN otherwise. cudaMalloc and fa_buffer_alloc_host return
 * memory aligned far beyond that; D a multiple of 8 makes every 16-bit layout's strides fit. */
typedef struct fa_tensor {
	fa_buffer *buf;    /* borrowed; NULL only for an absent optional tensor */
	uint64_t offset;   /* bytes from the start of the buffer */
	fa_dtype dtype;    /* element type */
	int64_t shape[4];  /* sizes, each >= 1 */
	int64_t stride[4]; /* in elements, each >= 0 */
} fa_tensor;

/* Forward attention: O = softmax(scale * Q K^T + mask) V, per batch and query head; query head h
 * uses key/value head h / (Hq / Hkv) (GQA, MQA).
 * q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D], o [B, Sq, Hq, D]: one dtype for all four.
 * lse: optional (lse.buf == NULL for none): fp32 [B, Hq, Sq, 1] logsumexp of each row's scaled,
 * masked scores (natural log), shape[3] = 1.
 * D is a multiple of 8 from 8 to 256. */
typedef struct fa_attn_fwd_args {
	fa_tensor q, k, v, o; /* as above */
	fa_tensor lse;        /* optional */
	double scale;         /* 0 means 1/sqrt(D) */
	fa_mask mask;         /* FA_MASK_NONE or a causal alignment */
	fa_precision precision; /* fp32 inputs only */
	/* Appended last (initialise the whole struct: = {0} or designated initialisers): the
	 * request's priority class, FA_PRIORITY_NORMAL (0) by default. The daemon starts queued
	 * work of a higher class first and, within a class, serves sessions in turn; high suits
	 * small latency-bound requests (on the GPU backend they also go to a high-priority CUDA
	 * stream), low batch work. A value outside fa_priority: FA_EINVAL. */
	fa_priority priority;
	/* Sliding window (Mistral; FlashAttention's window_size): when `window` is nonzero, query i
	 * sees keys j with i + a - window_left <= j <= i + a + window_right, where a = Sk - Sq (the
	 * bottom-right alignment, also for FA_MASK_NONE) or 0 under FA_MASK_CAUSAL_TOP_LEFT; a
	 * negative side is unbounded, and a causal mask caps the right side at 0. So causal is the
	 * window (-1, 0), and Mistral's is the causal mask with window_left = 4095. */
	int32_t window;
	int64_t window_left, window_right;
	/* Logit softcapping (Gemma 2): > 0 replaces each scaled score s by softcap * tanh(s /
	 * softcap) before the mask (lse is of the capped scores); 0 is off; finite, >= 0. */
	double softcap;
} fa_attn_fwd_args;

/* Compute forward attention in the daemon and return when O (and lse) are written.
 * Returns FA_OK; FA_EINVAL, FA_ESHAPE, FA_EDTYPE, FA_ERANGE, FA_EALIGN, FA_EOVERLAP, FA_EREGION
 * (arguments; nothing was computed and no output byte was written), FA_ENOFIT, FA_EBUSY,
 * FA_ETIMEDOUT (the result may still be written later), FA_ESESSION, FA_ECLOSED, FA_EDEVICE,
 * or a transport status. */
FA_API fa_status fa_attn_fwd(fa_client *c, const fa_attn_fwd_args *args);

/* Compute forward attention in the daemon, ordered on the caller's CUDA stream (asynchronous
 * mode; device buffers only). `stream` is a CUstream / cudaStream_t (NULL: the default stream of
 * the calling thread's current context). The call enqueues on `stream` a write of a completion
 * word (CUDA IPC memory of this process, one small buffer per context, registered on first use);
 * the daemon's stream waits for it before reading Q, K, V, so work already queued on `stream`
 * that writes them needs no synchronisation. It returns once the kernel is enqueued, after making
 * `stream` wait for the daemon's done word: later work on `stream` sees O and lse, and
 * cudaStreamSynchronize(stream) waits for them. The call itself does not wait for the GPU (a few
 * microseconds of host time besides the request's round trip).
 * Buffers must stay registered (and allocated), and the client open, until `stream` passed that
 * point. Works when the daemon runs as another user (memory handles open across users). Where a
 * GPU lacks 64-bit stream memory operations, or FA_ASYNC_EVENTS=1 was set at fa_client_open, the
 * call uses CUDA IPC events instead (~125 us more per call), which work only between processes of
 * one user: with another user's daemon that returns FA_EPERM; use fa_attn_fwd().
 * If `stream`'s inputs are not ready within the daemon's --async-wait-ms (60 s by default) of its
 * stream reaching the call, or the client dies with calls pending, the daemon releases its
 * stream: that call's O is undefined (the daemon logs it). After a daemon restart,
 * fa_client_reconnect() releases every wait of `stream` on the old daemon's calls.
 * Returns the statuses of fa_attn_fwd(), and FA_EPERM (IPC events and another user's daemon),
 * FA_ENOTSUP (the daemon has no GPU backend), FA_EINVAL (a host buffer, or `stream` is not a
 * stream of a live context), FA_ENOGPU (no CUDA driver here). On FA_EDEVICE after the enqueue
 * (the wait on the daemon's word or event could not be enqueued) the kernel still runs:
 * synchronise the device before reading O.
 * Through the submission ring (the default when the daemon serves rings; FA_RING=0 at
 * fa_client_open turns it off) the call does not wait for the daemon at all: it returns once
 * the request is in the ring and `stream` waits for the done word (a few microseconds). The
 * daemon checks the request afterwards, so, like CUDA's asynchronous errors, a refusal or a
 * failed kernel is reported later: by the next fa_attn_fwd_async() of this client, or by
 * fa_client_flush(), as that call's status with the failed call's detail (then cleared). The
 * failed call's done word is written all the same, so `stream` is not held; its O is
 * undefined. */
FA_API fa_status fa_attn_fwd_async(fa_client *c, const fa_attn_fwd_args *args, void *stream);

/* Wait until the daemon has finished every asynchronous call of this client that went through
 * the submission ring (their kernels are done), within the client's timeout, and return the
 * first failure among them since the last one reported (the sticky error, then cleared).
 * Without a ring (FA_RING=0, an older daemon) there is nothing to wait for: FA_OK.
 * Thread-safe. Returns FA_OK, a failed call's status (its detail as this thread's detail),
 * FA_ETIMEDOUT, FA_EUNAVAIL (the daemon stopped: the calls still out failed), FA_EINVAL. */
FA_API fa_status fa_client_flush(fa_client *c);

/* Flags of fa_attn_bwd_args.flags. */
enum {
	/* dQ deterministic: the same bits on every run, for the same inputs, daemon, device and
	 * kernel settings (the CPU backend is deterministic either way). On the GPU, whose default
	 * sums dQ with fp32 atomics, fp16 / bf16 / tf32 / the bf16 staging (and 3xtf32 on sm_90's
	 * wgmma kernel) sum it in fixed point, a row's scale taken from |dO|, |V| and |K| (8-14% of
	 * speed on an H200; an absolute error of 2^-28 of that scale, below those precisions' own);
	 * fp32 ieee / 3xtf32 elsewhere in a fixed order of fp32 adds. In fixed point a dQ row whose
	 * parts do not fit (a NaN or infinity in its inputs, or an lse that is not the forward's,
	 * its softmax summing past 8) comes out NaN, never as wrapped numbers. */
	FA_BWD_DETERMINISTIC = 1u << 0,
};

/* Backward attention: the gradients of the forward's O = softmax(scale * Q K^T + mask) V given
 * dO = dL/dO, for training. q, k, v, o, scale, mask and precision are exactly what fa_attn_fwd
 * took and wrote; lse is the forward's logsumexp output and is required (run the forward with
 * lse). Shapes: q, o, dout and dq [B, Sq, Hq, D]; k, v, dk and dv [B, Sk, Hkv, D]; lse fp32
 * [B, Hq, Sq, 1]; one dtype for all but lse; any strides with the head dim contiguous. With GQA
 * and MQA, dk and dv of a key/value head are summed over the query heads that share it. A row
 * that sees no key (a causal mask with Sq > Sk, bottom-right) gets dq = 0; a key no row sees
 * gets dk = dv = 0. dq, dk and dv are written whole and may share no byte with an input or with
 * each other (FA_EOVERLAP). */
typedef struct fa_attn_bwd_args {
	fa_tensor q, k, v, o;   /* the forward's inputs and output: only read */
	fa_tensor dout;         /* dL/dO, like o: only read */
	fa_tensor lse;          /* required: the forward's lse, only read */
	fa_tensor dq, dk, dv;   /* written: like q, k and v */
	double scale;           /* 0 means 1/sqrt(D), as in the forward */
	fa_mask mask;           /* the forward's */
	fa_precision precision; /* fp32 inputs only, as in the forward */
	unsigned flags;         /* FA_BWD_* bits; 0 for none */
	fa_priority priority;   /* the scheduling class, as fa_attn_fwd_args.priority (0: normal);
	                         * training steps beside a latency-bound service suit LOW */
	/* The forward's sliding window and softcap, exactly as in fa_attn_fwd_args (zero: off). A
	 * row whose window holds no key gets dq = 0; with softcap, dS passes through the cap's
	 * derivative 1 - tanh^2(s / softcap). */
	int32_t window;
	int64_t window_left, window_right;
	double softcap;
} fa_attn_bwd_args;

/* Compute the backward pass in the daemon and return when dq, dk and dv are written.
 * The arguments are checked as fa_attn_fwd's are, here first and again by the daemon; lse
 * missing (lse.buf == NULL) is FA_EINVAL, lse of another shape FA_ESHAPE, unknown flag bits
 * FA_EINVAL. Thread-safe as every call on a client; the tensors' buffers are borrowed for the
 * call.
 * Returns FA_OK; FA_EINVAL, FA_ESHAPE, FA_EDTYPE, FA_ERANGE, FA_EALIGN, FA_EOVERLAP, FA_EREGION
 * (arguments; nothing was computed and no output byte was written), FA_ENOTSUP (the daemon's
 * GPU backend has no backward kernels for this), FA_ENOFIT, FA_EBUSY, FA_ETIMEDOUT (the
 * gradients may still be written later), FA_ESESSION, FA_ECLOSED, FA_EDEVICE, or a transport
 * status. */
FA_API fa_status fa_attn_bwd(fa_client *c, const fa_attn_bwd_args *args);

/* The backward pass ordered on the caller's CUDA stream (asynchronous mode; device buffers
 * only), exactly as fa_attn_fwd_async orders the forward: the daemon's stream waits for the
 * work already queued on `stream` (which writes q, k, v, o, dout and lse: a forward enqueued
 * by fa_attn_fwd_async on the same stream included), and `stream` waits for the daemon's done
 * word before later work reads dq, dk and dv. Returns once the call is enqueued (through the
 * submission ring: published, a few microseconds, nothing waited for); buffers must stay
 * registered until `stream` passed that point. Completion words, so it works with a daemon of
 * another user, and it keeps its place among this client's ring calls (no flush).
 * Through the ring a refusal or a failed kernel is reported later, as fa_attn_fwd_async's: by
 * the next asynchronous call of this client, or by fa_client_flush() (the sticky error); the
 * failed call's done word is written all the same, its gradients are undefined.
 * Where fa_attn_fwd_async uses CUDA IPC events (no 64-bit stream memory operations,
 * FA_ASYNC_EVENTS=1) or the daemon predates the backward's completion words, it travels by the
 * socket with IPC events (~125 us more): it then first waits for this client's ring calls still
 * out (as fa_client_flush does, their failure returned here), and works with same-user daemons
 * only (FA_EPERM otherwise).
 * Thread-safe. Returns the statuses of fa_attn_bwd(), and those fa_attn_fwd_async() adds: FA_EPERM
 * (IPC events and another user's daemon), FA_ENOTSUP (no GPU backend), FA_EINVAL (a host buffer,
 * or `stream` is not a stream of a live context), FA_ENOGPU (no CUDA driver here), an earlier
 * ring call's failure (sticky). */
FA_API fa_status fa_attn_bwd_async(fa_client *c, const fa_attn_bwd_args *args, void *stream);
/* fp16 (IEEE binary16) and bf16 (bfloat16) from and to float, for filling and reading tensors
 * from C: round to nearest, ties to even; infinities, subnormals and NaN (kept quiet) as IEEE 754
 * says; the same results as the daemon's CPU reference. Pure: any thread. */
FA_API uint16_t fa_fp16_from_float(float f);
FA_API float fa_float_from_fp16(uint16_t h);
FA_API uint16_t fa_bf16_from_float(float f);
FA_API float fa_float_from_bf16(uint16_t h);

/* An int32 index tensor in a registered buffer: sequence offsets, cache lengths, a page table.
 * Element (i, j) is the int32 at data + offset + 4 * (i * stride[0] + j * stride[1]); a vector
 * of n entries is shape {n, 1}. offset must be a multiple of 4. The daemon copies it out of the
 * buffer once, checks every entry it will use, and computes from its copy: rewriting the buffer
 * while the call runs changes nothing. */
typedef struct fa_index {
	fa_buffer *buf;    /* borrowed; NULL only for an absent optional index */
	uint64_t offset;   /* bytes from the start of the buffer */
	int64_t shape[2];  /* sizes, each >= 1 */
	int64_t stride[2]; /* in elements, each >= 0 */
} fa_index;

/* Variable-length batch (FlashAttention's flash_attn_varlen_func): B sequences of different
 * lengths packed along the token dimension, described by cumulative offsets. Sequence b's queries
 * are rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q and o, its keys rows [cu_seqlens_k[b],
 * cu_seqlens_k[b + 1]) of k and v; a sequence may have no queries, or no keys (its rows get
 * O = 0, lse = -inf). Masks and the window apply per sequence with its own lengths (causal
 * bottom-right aligns its last query with its last key). Rows of q and o past cu_seqlens_q[B]
 * (padding) are neither read nor written.
 * q, o [1, total_q, Hq, D], k, v [1, total_k, Hkv, D]: one dtype, head dim contiguous.
 * cu_seqlens_q, cu_seqlens_k: [B + 1, 1] each: start >= 0, never decreasing, end within total_q
 * (total_k). lse: optional fp32 [1, Hq, total_q, 1].
 * max_seqlen_q, max_seqlen_k: an upper bound of the lengths (checked), or 0: the daemon finds it.
 * The other fields as fa_attn_fwd_args's. */
typedef struct fa_attn_varlen_args {
	fa_tensor q, k, v, o;
	fa_tensor lse;                      /* optional */
	fa_index cu_seqlens_q, cu_seqlens_k;
	int64_t max_seqlen_q, max_seqlen_k; /* 0: found from the offsets */
	double scale;                       /* 0 means 1/sqrt(D) */
	fa_mask mask;
	fa_precision precision;
	int32_t window;                     /* as in fa_attn_fwd_args */
	int64_t window_left, window_right;
	double softcap;
} fa_attn_varlen_args;

/* Forward attention over a variable-length batch, in the daemon (synchronous). Returns the
 * statuses of fa_attn_fwd() (not the asynchronous mode's); a bad offset is FA_EINVAL with the
 * entry in the detail ("cu_seqlens_q[3] = 17 is below cu_seqlens_q[2] = 20: offsets must not
 * decrease"), and nothing is written. FA_ENOTSUP: the daemon's backend does not serve it (the GPU
 * backend serves decode shapes, at most 16 queries per sequence, where its build has no prefill
 * kernel over these layouts). The index tensors may be in host or device buffers. */
FA_API fa_status fa_attn_varlen(fa_client *c, const fa_attn_varlen_args *args);

/* Attention against a KV cache (FlashAttention's flash_attn_with_kvcache without appending new
 * keys: write them into the cache first and count them in cache_seqlens). Sequence b attends to
 * the first cache_seqlens[b] keys of its cache; causal masks and the window align its last query
 * with its last cached key (query i of Sq sees keys j <= i + cache_seqlens[b] - Sq).
 * Keys: without page_table, k and v are a contiguous cache [B, rows, Hkv, D] and
 * cache_seqlens[b] <= rows; with page_table (vLLM's block table, int32 [B, pages per sequence]),
 * k and v are pools [pages, page_size, Hkv, D] with page_size 16 to 256, key j of sequence b is
 * row j % page_size of page page_table[b][j / page_size], cache_seqlens[b] <= page_size * pages
 * per sequence, and every page a sequence uses must be in [0, pages) (entries past its last page
 * are not read; pages may be shared between sequences).
 * Queries: without cu_seqlens_q, q and o are dense [B, Sq, Hq, D] and lse [B, Hq, Sq, 1]; with
 * it (int32 [B + 1, 1]), packed as fa_attn_varlen's, lse [1, Hq, total_q, 1], max_seqlen_q as
 * there. cache_seqlens: int32 [B, 1], each >= 0 (0: the rows get O = 0, lse = -inf). */
typedef struct fa_attn_kvcache_args {
	fa_tensor q, k, v, o;
	fa_tensor lse;                      /* optional */
	fa_index cache_seqlens;
	fa_index page_table;                /* optional: a paged cache */
	fa_index cu_seqlens_q;              /* optional: packed queries */
	int64_t max_seqlen_q;               /* with cu_seqlens_q; 0: found from the offsets */
	double scale;
	fa_mask mask;
	fa_precision precision;
	int32_t window;                     /* as in fa_attn_fwd_args */
	int64_t window_left, window_right;
	double softcap;
} fa_attn_kvcache_args;

/* Forward attention against a KV cache, in the daemon (synchronous). Returns the statuses of
 * fa_attn_varlen(); a bad page index or length is FA_EINVAL naming the entry ("page_table[3][7]
 * = 912: the pools have 512 pages"), with nothing written. */
FA_API fa_status fa_attn_kvcache(fa_client *c, const fa_attn_kvcache_args *args);

/* fa_attn_varlen and fa_attn_kvcache ordered on the caller's CUDA stream (asynchronous mode), as
 * fa_attn_fwd_async orders the forward: the daemon's stream waits for the work already queued
 * on `stream` (which writes q, k, v and the index tables), and `stream` waits for the daemon's
 * done word before later work reads o and lse. The call returns once it is enqueued (through
 * the submission ring: published, a few microseconds, nothing waited for; else after the
 * socket's reply). Works with a daemon of another user (completion words).
 * Every tensor and every index table (cu_seqlens_q, cu_seqlens_k, cache_seqlens, page_table)
 * must be in a device buffer (fa_buffer_register_device), else FA_EINVAL: the daemon reads the
 * tables in `stream`'s order, so a table written by a kernel or copy queued on `stream` before
 * the call is what it reads (the daemon copies it, checks every entry as the synchronous call
 * does, and computes from its copy: rewriting it later changes nothing). A host table would need
 * a rule of its own (read when the call is made, not in stream order): copy it to the device on
 * the stream instead (cudaMemcpyAsync).
 * `args` and the index tables' fa_index descriptions are read before the call returns; buffers
 * must stay registered (and allocated) until `stream` passed the call.
 * Errors found after the enqueue (a bad table entry: FA_EINVAL naming it, as the synchronous
 * call's; a kernel's failure) are reported later, as fa_attn_fwd_async's: by the next
 * asynchronous call of this client or by fa_client_flush() (the sticky error, then cleared). The
 * failed call's done word is written all the same (`stream` is not held); nothing is launched
 * for a bad entry, o and lse keep what they held.
 * These calls need completion words: without them (a GPU without 64-bit stream memory
 * operations, FA_ASYNC_EVENTS=1, or a daemon older than these calls) they return FA_ENOTSUP and
 * the synchronous calls remain. A daemon on the CPU backend answers FA_ENOTSUP.
 * Thread-safe. Returns the statuses of fa_attn_varlen() (for the checks made before sending),
 * FA_ENOTSUP, FA_EINVAL (a host buffer or table, or `stream` is not a stream of a live
 * context), FA_ENOGPU (no CUDA driver here), an earlier ring call's failure (sticky). */
FA_API fa_status fa_attn_varlen_async(fa_client *c, const fa_attn_varlen_args *args,
                                      void *stream);
FA_API fa_status fa_attn_kvcache_async(fa_client *c, const fa_attn_kvcache_args *args,
                                       void *stream);

/* ---- prepared calls: one argument block, called again and again as its tensors move ---------
 *
 * A loop calling attention on arrays of the same shapes, strides and dtypes whose memory moves
 * between calls (an allocator's blocks: a training step, a serving loop, a binding for another
 * language) builds the argument block once (fa_prepare) and then gives, per call, only where each
 * tensor is now (fa_prepared_call). Before it calls, the library checks each place: the address
 * lies in the buffer given with the tensor's whole extent and, for a device buffer, the
 * buffer's allocation is still the one it registered (the driver's unique buffer id of the
 * address equals the one read at registration: an allocation freed and another made at the same
 * address has a new id), so a registration is trusted only while it is still that
 * allocation's. Then it writes each tensor's (buffer, offset) into a copy of the block and makes
 * the call, with the synchronous mode's wait for the producer's stream when asked: the checks,
 * the wait and the call in one library call. */

/* A prepared call: a copy of an argument block and which of its tensors each call places.
 * Immutable once made: any number of threads may call it at once. Opaque. */
typedef struct fa_prepared fa_prepared;

/* The call an argument block is for. */
typedef enum fa_prepared_op {
	FA_PREPARED_FWD = 1,     /* fa_attn_fwd_args: fa_attn_fwd, or fa_attn_fwd_async */
	FA_PREPARED_BWD = 2,     /* fa_attn_bwd_args: fa_attn_bwd, or fa_attn_bwd_async */
	FA_PREPARED_VARLEN = 3,  /* fa_attn_varlen_args: fa_attn_varlen (synchronous only) */
	FA_PREPARED_KVCACHE = 4, /* fa_attn_kvcache_args: fa_attn_kvcache (synchronous only) */
} fa_prepared_op;

/* The most tensors a prepared call places (the backward has 9). */
#define FA_PREPARED_MAX_TENSORS 12

/* Prepare calls of `op` on `args`, the whole struct op names (read: sizeof that struct), filled
 * as for the call itself. n (1 to FA_PREPARED_MAX_TENSORS) tensors are placed by each call:
 * field[i] is the byte offset in the struct of one of its fa_tensor or fa_index members
 * (offsetof(fa_attn_fwd_args, q), ...; each at most once), span[i] (> 0) how many bytes from
 * its first element the tensor's elements reach (a place where they would leave the buffer is
 * refused). Members not listed go as prepared: an absent optional tensor stays absent (buf NULL).
 * Everything else in the block is checked by every call, as the call itself checks it.
 * `c` must outlive the prepared call's calls (not its fa_prepared_free). All arrays are copied.
 * Returns FA_OK with *out (release it with fa_prepared_free), FA_EINVAL (a NULL pointer, an
 * unknown op, n out of range, a field that is not a tensor member of op's struct or is listed
 * twice, a span of 0), FA_ENOMEM. */
FA_API fa_status fa_prepare(fa_client *c, fa_prepared_op op, const void *args, unsigned n,
                            const uint32_t *field, const uint64_t *span, fa_prepared **out);

/* Free a prepared call. Safe on NULL; needs no live client. */
FA_API void fa_prepared_free(fa_prepared *p);

/* Bits of fa_placement.flags. */
enum {
	/* Synchronous call, after cuStreamSynchronize(stream): the work queued on `stream` that
	 * writes the inputs is finished before the daemon reads them (the synchronous mode's rule,
	 * kept here after the places are checked). */
	FA_PLACE_SYNC_STREAM = 1u << 0,
	/* The asynchronous call (fa_attn_fwd_async, fa_attn_bwd_async, fa_attn_varlen_async,
	 * fa_attn_kvcache_async) ordered on `stream`; not with FA_PLACE_SYNC_STREAM. */
	FA_PLACE_ASYNC = 1u << 1,
};

/* Where the tensors of one prepared call are now, and how to call: the caller's, one per call
 * in flight (the library reads it, and writes only `moved`). */
typedef struct fa_placement {
	void *stream;   /* a CUstream / cudaStream_t for FA_PLACE_SYNC_STREAM and FA_PLACE_ASYNC
	                 * (NULL: the current context's default stream); else unused */
	uint32_t flags; /* FA_PLACE_* bits; 0: the plain synchronous call */
	int32_t moved;  /* written: -1, or the index of the first tensor not where a place may
	                 * be (then nothing was sent): resolve it anew (its allocation's
	                 * registration is stale: fa_buffer_free it, register again) */
	/* The prepared tensors' places, in fa_prepare's order (two arrays, so that a binding
	 * writes each in one go): */
	fa_buffer *buf[FA_PREPARED_MAX_TENSORS]; /* borrowed: registered buffers of the prepared
	                                          * call's client */
	uint64_t addr[FA_PREPARED_MAX_TENSORS];  /* each tensor's first element, in its buffer's
	                                          * memory as fa_buffer_data() addresses it (a
	                                          * host mapping, or a device address) */
} fa_placement;

/* One call of `p` with tensor i at pl->addr[i] in pl->buf[i], i < n. Each place is checked in
 * order, before anything else: the address at or after fa_buffer_data(buf) with span bytes
 * inside the buffer, and a device buffer's allocation still the registered one (one driver
 * query per buffer and call).
 * The first that fails sets pl->moved to its index and returns FA_ERANGE (outside the buffer)
 * or FA_EREGION (the allocation is no longer the registered one), sending nothing and waiting
 * for no stream. Then the stream wait (FA_PLACE_SYNC_STREAM) and the call of p's op, whose
 * status and detail are returned, with pl->moved = -1. Thread-safe (the block is patched in a
 * copy on this thread's stack).
 * Returns FA_OK, the moved place's FA_ERANGE or FA_EREGION, FA_EINVAL (p or pl NULL, a NULL
 * buffer, unknown flags or a mode op does not have), FA_EREGION (a buffer of another client,
 * moved = -1), FA_ENOGPU and FA_EDEVICE (the stream wait: no driver, or cuStreamSynchronize
 * failed: the detail has the CUDA error), and every status of the op's call. */
FA_API fa_status fa_prepared_call(const fa_prepared *p, fa_placement *pl);

/* The detail text the daemon sent with the last failed call on this thread ("q: extent ends at
 * byte 4160, region has 4096"), or "" when it sent none. Static thread-local storage, valid until
 * the next call on this thread. Never NULL. */
FA_API const char *fa_last_error_detail(void);

#ifdef __cplusplus
}
#endif
#endif /* FA_CLIENT_H */
