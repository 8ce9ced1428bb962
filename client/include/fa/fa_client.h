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
 * daemon answered within the timeout), FA_EVERSION, FA_ENOMEM, FA_ESYS. */
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
 * BHSD layouts are taken without copies. */
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
 * synchronise the device before reading O. */
FA_API fa_status fa_attn_fwd_async(fa_client *c, const fa_attn_fwd_args *args, void *stream);

/* The detail text the daemon sent with the last failed call on this thread ("q: extent ends at
 * byte 4160, region has 4096"), or "" when it sent none. Static thread-local storage, valid until
 * the next call on this thread. Never NULL. */
FA_API const char *fa_last_error_detail(void);

#ifdef __cplusplus
}
#endif
#endif /* FA_CLIENT_H */
