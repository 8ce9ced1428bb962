/* region.h - client memory the daemon maps: host POSIX shared memory by name, or a CUDA IPC
 * handle of a device allocation (opened by the GPU backend, see backend.h's region_open).
 *
 * A client creates "/fa.<uid>.<pid>.<16 hex>" (mode 0660), registers it, and then names
 * (region id, byte offset) in requests. The daemon opens it only if the name has that shape, the
 * object's owner is the connection's peer uid and it is at least the declared size; it maps the
 * declared size shared and read-write.
 *
 * Lifetime: a region is reference-counted: one reference for the session's table, one for each
 * request that uses it. Unregistering or closing the session drops the table's reference; the
 * mapping goes away when the last request using it has finished (unmapping under a running
 * computation would fault). Whether the shm object is also unlinked is decided at close: yes when
 * the session ended (a killed client leaks nothing), no on UNREGISTER (the client unlinks its own)
 * and no on the daemon's clean shutdown (clients keep their objects and register them again with
 * the next daemon).
 *
 * A CUDA IPC region has no mapping of its own: base is the device address the backend's
 * cuIpcOpenMemHandle returned, and the backend's release hook closes it (the handle maps the
 * client's whole allocation, so size is the allocation's size and tensors sit at offsets in it).
 * A host region served by the GPU backend is pinned; the hook unpins it before the unmap.
 */
#ifndef FA_DAEMON_REGION_H
#define FA_DAEMON_REGION_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_types.h"
#include "fa_proto.h"

/* Which memory a region maps, the same for every registration of that memory: a client may
 * register one shm object or one CUDA allocation more than once (up to --max-regions), so the
 * overlap rule (validate.c) compares this and byte ranges in the memory, never region ids.
 * kind 0: not known yet (a CUDA IPC region before the backend opened it): such a region maps the
 * same memory as itself only. */
struct region_mem {
	uint8_t kind; /* FA_REGION_HOST_SHM or FA_REGION_CUDA_IPC, or 0 */
	uint64_t dev; /* host shm: the object's st_dev; CUDA IPC: 0 (the daemon's one address space) */
	uint64_t obj; /* host shm: the object's st_ino; CUDA IPC: the allocation's base address */
};

struct region {
	uint64_t id;        /* random, nonzero; set by the session that holds it */
	unsigned refs;
	uint8_t kind;       /* FA_REGION_HOST_SHM or FA_REGION_CUDA_IPC */
	bool unlink;        /* shm_unlink the object when the last reference goes */
	atomic_int broken;  /* pages vanished under a computation (the object shrank): unusable */
	void *base;         /* the mapping */
	uint64_t size;      /* bytes mapped = the size the client declared */
	char name[FA_PROTO_SHM_NAME_MAX];
	/* Set by the backend that serves the region (pinning, IPC mapping): the last reference
	 * calls it before anything else is released. */
	void (*release)(struct region *r);
	void *backend;      /* the backend's own, for release */
	int dev;            /* CUDA IPC regions: the backend's index of their GPU; -1 otherwise */
	struct region_mem mem; /* the memory mapped (fstat at open; the backend for CUDA IPC) */
	uint64_t mem_at;    /* the byte of that memory at which the region's byte 0 lies */
	bool uncounted;     /* not a buffer (a submission ring): outside region_count/bytes */
	bool words;         /* CUDA IPC: the session's asynchronous completion words
	                     * (FA_PROTO_WORDS_*), never a tensor's region */
};

/* Is `name` of the form "/fa.<uid>.<pid>.<16 hex digits>" (decimal uid and pid, no other '/')? */
bool region_name_valid(const char *name);

/* Open, check and map a host shm object for a peer. The reference count starts at 1.
 * Returns FA_OK; FA_EINVAL (bad name, size 0 or above max_bytes, not a regular file, no such
 * object), FA_EPERM (owned by another uid, or the daemon may not open it), FA_ERANGE (the object
 * is smaller than `size`), FA_ENOMEM, FA_ESYS; err says why in words a client can act on. */
fa_status region_open_shm(struct region **out, const char *name, uint64_t size, uint32_t peer_uid,
                          uint64_t max_bytes, char *err, size_t errlen);

/* region_open_shm without the name's pattern check (the caller checked its own pattern: the
 * submission rings' "/faring.<uid>.<pid>.<16 hex>", ring.c). Same statuses. */
fa_status region_map_shm(struct region **out, const char *name, uint64_t size, uint32_t peer_uid,
                         uint64_t max_bytes, char *err, size_t errlen);

/* A CUDA IPC region of `size` bytes (the client's whole allocation), not opened yet: base is NULL
 * until the backend's region_open sets it. The reference count starts at 1. Returns FA_OK;
 * FA_EINVAL (size 0 or above max_bytes), FA_ENOMEM. */
fa_status region_open_ipc(struct region **out, uint64_t size, uint64_t max_bytes, char *err,
                          size_t errlen);

/* Do a and b map the same memory (one region, or two registrations of one shm object or one
 * CUDA allocation)? Then their bytes are compared at mem_at + offset. */
bool region_same_mem(const struct region *a, const struct region *b);

/* Take / drop a reference. The last drop unmaps (and unlinks when r->unlink) and frees. */
void region_ref(struct region *r);
void region_unref(struct region *r);

/* The mapping is not a client buffer (a submission ring, ring.c): take it out of the totals
 * below. Once, right after the open. */
void region_uncount(struct region *r);

/* Process-wide totals of live mappings (the STATS "regions" and "region_bytes"). Loop thread. */
unsigned region_count(void);
uint64_t region_bytes(void);

#endif /* FA_DAEMON_REGION_H */
