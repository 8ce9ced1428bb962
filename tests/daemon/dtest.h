/* dtest.h - what the daemon's unit tests share: real POSIX shm objects named the way clients name
 * them, and a session table with a peer that looks like this process. Header-only (static
 * functions): each test program is one .c file. */
#ifndef FA_DTEST_H
#define FA_DTEST_H

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "ipc.h"
#include "region.h"
#include "session.h"

/* Create "/fa.<uid>.<pid>.<16 hex>" of `size` bytes, mode 0660. Returns 0 and fills name. */
static inline int dtest_shm_create(char name[FA_PROTO_SHM_NAME_MAX], size_t size)
{
	uint64_t r = 0;

	if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
		return -1;
	snprintf(name, FA_PROTO_SHM_NAME_MAX, "/fa.%u.%d.%016" PRIx64, (unsigned)getuid(),
	         (int)getpid(), r);
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0660);
	if (fd < 0)
		return -1;
	int rc = ftruncate(fd, (off_t)size);
	close(fd);
	return rc;
}

/* Does the shm object still exist? */
static inline int dtest_shm_exists(const char *name)
{
	int fd = shm_open(name, O_RDONLY, 0);
	if (fd < 0)
		return 0;
	close(fd);
	return 1;
}

/* This process as a connection's peer. */
static inline struct ipc_peer dtest_peer(uint32_t pipe)
{
	struct ipc_peer p = {.pipe = pipe, .uid = (uint32_t)getuid(), .pid = (uint32_t)getpid()};
	return p;
}

/* A dense row-major tensor [a, b, c, d] of dtype dt at byte offset off of region r. */
static inline void dtest_tensor(struct fa_proto_tensor *t, const struct region *r, uint64_t off,
                                fa_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d)
{
	t->region = r->id;
	t->offset = off;
	t->dtype = (uint8_t)dt;
	t->shape[0] = a;
	t->shape[1] = b;
	t->shape[2] = c;
	t->shape[3] = d;
	t->stride[3] = 1;
	t->stride[2] = d;
	t->stride[1] = c * d;
	t->stride[0] = b * c * d;
}

/* A region of `size` bytes in session s, backed by a real shm object (unlinked when the
 * session closes, like a dead client's). Returns the region or NULL. */
static inline struct region *dtest_region(struct session *s, size_t size)
{
	char name[FA_PROTO_SHM_NAME_MAX], err[256];
	struct region *r;

	if (dtest_shm_create(name, size) != 0)
		return NULL;
	if (region_open_shm(&r, name, size, s->uid, UINT64_MAX, err, sizeof err) != FA_OK) {
		fprintf(stderr, "dtest_region: %s\n", err);
		shm_unlink(name);
		return NULL;
	}
	if (session_region_add(s, r, err, sizeof err) != FA_OK) {
		r->unlink = true;
		region_unref(r);
		return NULL;
	}
	return r;
}

#endif /* FA_DTEST_H */
