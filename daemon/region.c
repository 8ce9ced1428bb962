/* region.c - map a client's POSIX shm object after checking its name, owner and size; the
 * bookkeeping of CUDA IPC regions (the GPU backend opens and closes their handles). */
#include "region.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

static unsigned region_live;
static uint64_t region_live_bytes;

/* Consume 1..10 decimal digits. */
static bool region_digits(const char **p)
{
	const char *s = *p;
	int n = 0;

	while (*s >= '0' && *s <= '9' && n < 11) {
		s++;
		n++;
	}
	if (n == 0 || n > 10)
		return false;
	*p = s;
	return true;
}

/* "/fa." uid "." pid "." 16 hex digits, nothing else. */
bool region_name_valid(const char *name)
{
	const char *p = name;

	if (strncmp(p, "/fa.", 4) != 0)
		return false;
	p += 4;
	if (!region_digits(&p) || *p++ != '.' || !region_digits(&p) || *p++ != '.')
		return false;
	for (int i = 0; i < 16; i++, p++) {
		bool hex = (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') ||
		           (*p >= 'A' && *p <= 'F');
		if (!hex)
			return false;
	}
	return *p == '\0';
}

/* Open by name, check type, owner and size, map the declared size; see region.h. */
fa_status region_open_shm(struct region **out, const char *name, uint64_t size, uint32_t peer_uid,
                          uint64_t max_bytes, char *err, size_t errlen)
{
	*out = NULL;
	if (!region_name_valid(name))
		return fa_err(
		    err, errlen, FA_EINVAL,
		    "shm name '%.64s' is not of the form /fa.<uid>.<pid>.<16 hex digits>", name);
	return region_map_shm(out, name, size, peer_uid, max_bytes, err, errlen);
}

/* The checks after the name's and the mapping; see region.h. */
fa_status region_map_shm(struct region **out, const char *name, uint64_t size, uint32_t peer_uid,
                         uint64_t max_bytes, char *err, size_t errlen)
{
	struct region *r;
	struct stat st;
	void *base;
	int fd;

	*out = NULL;
	if (size == 0)
		return fa_err(err, errlen, FA_EINVAL, "region size is 0");
	if (size > max_bytes || size > (uint64_t)SIZE_MAX)
		return fa_err(err, errlen, FA_EINVAL,
		              "region size %" PRIu64 " is above this daemon's limit of %" PRIu64
		              " bytes (--max-region-bytes)",
		              size, max_bytes);
	/* O_NOFOLLOW: /dev/shm is world-writable; never follow a link planted there. */
	fd = shm_open(name, O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
	if (fd < 0) {
		int e = errno;
		if (e == ENOENT)
			return fa_err(err, errlen, FA_EINVAL, "shm object %s does not exist",
			              name);
		if (e == EACCES || e == EPERM || e == ELOOP)
			return fa_err(
			    err, errlen, FA_EPERM,
			    "the daemon may not open shm object %s read-write (%s); give "
			    "it mode 0660 and the socket's group",
			    name, strerror(e));
		return fa_err(err, errlen, FA_ESYS, "shm_open %s: %s", name, strerror(e));
	}
	if (fstat(fd, &st) != 0) {
		int e = errno;
		close(fd);
		return fa_err(err, errlen, FA_ESYS, "fstat %s: %s", name, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return fa_err(err, errlen, FA_EINVAL, "shm object %s is not a regular file",
		              name);
	}
	/* The connection's uid must own the memory: otherwise one client could make the daemon
	 * read or write another user's shared memory (a confused deputy). */
	if (st.st_uid != peer_uid) {
		close(fd);
		return fa_err(err, errlen, FA_EPERM,
		              "shm object %s belongs to uid %u, not to the connection's uid %u",
		              name, (unsigned)st.st_uid, (unsigned)peer_uid);
	}
	if ((uint64_t)st.st_size < size) {
		close(fd);
		return fa_err(err, errlen, FA_ERANGE,
		              "shm object %s has %" PRIu64
		              " bytes, the registration declares %" PRIu64,
		              name, (uint64_t)st.st_size, size);
	}
	base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int e = errno;
	close(fd); /* the mapping keeps the object alive */
	if (base == MAP_FAILED)
		return fa_err(err, errlen, e == ENOMEM ? FA_ENOMEM : FA_ESYS, "mmap %s (%" PRIu64
		              " bytes): %s", name, size, strerror(e));
	if ((r = calloc(1, sizeof(*r))) == NULL) {
		munmap(base, (size_t)size);
		return fa_err(err, errlen, FA_ENOMEM, "out of memory");
	}
	r->refs = 1;
	r->kind = FA_REGION_HOST_SHM;
	r->dev = -1;
	r->base = base;
	r->size = size;
	/* The mapping starts at the object's byte 0; a hard link or a second registration of the
	 * same object has the same (st_dev, st_ino). */
	r->mem = (struct region_mem){FA_REGION_HOST_SHM, (uint64_t)st.st_dev, (uint64_t)st.st_ino};
	r->mem_at = 0;
	snprintf(r->name, sizeof r->name, "%s", name);
	region_live++;
	region_live_bytes += size;
	*out = r;
	return FA_OK;
}

/* A CUDA IPC region, not opened yet; see region.h. */
fa_status region_open_ipc(struct region **out, uint64_t size, uint64_t max_bytes, char *err,
                          size_t errlen)
{
	struct region *r;

	*out = NULL;
	if (size == 0)
		return fa_err(err, errlen, FA_EINVAL, "region size is 0");
	if (size > max_bytes)
		return fa_err(err, errlen, FA_EINVAL,
		              "region size %" PRIu64 " is above this daemon's limit of %" PRIu64
		              " bytes (--max-region-bytes)",
		              size, max_bytes);
	if ((r = calloc(1, sizeof(*r))) == NULL)
		return fa_err(err, errlen, FA_ENOMEM, "out of memory");
	r->refs = 1;
	r->kind = FA_REGION_CUDA_IPC;
	r->dev = -1; /* the backend's region_open sets it */
	r->size = size;
	snprintf(r->name, sizeof r->name, "cuda-ipc");
	region_live++;
	region_live_bytes += size;
	*out = r;
	return FA_OK;
}

/* The same region, or identities that are known and equal. */
bool region_same_mem(const struct region *a, const struct region *b)
{
	if (a == b)
		return true;
	return a->mem.kind != 0 && a->mem.kind == b->mem.kind && a->mem.dev == b->mem.dev &&
	       a->mem.obj == b->mem.obj;
}

/* One more user of the mapping. */
void region_ref(struct region *r)
{
	r->refs++;
}

/* One user less; the last unmaps, unlinks when asked, and frees. */
void region_unref(struct region *r)
{
	if (--r->refs > 0)
		return;
	if (r->release != NULL)
		r->release(r); /* unpin, or close the IPC mapping: no job uses it any more */
	if (r->kind != FA_REGION_HOST_SHM) {
		region_live--;
		region_live_bytes -= r->size;
		free(r);
		return;
	}
	if (r->uncounted) {
		region_live++;
		region_live_bytes += r->size;
	}
	if (munmap(r->base, (size_t)r->size) != 0)
		log_err("region %016" PRIx64 ": munmap %s: %s", r->id, r->name, strerror(errno));
	/* A client in another uid's sticky /dev/shm entry cannot be unlinked by us (EPERM): that
	 * leak is the client's to clean, and ENOENT means it already did. */
	if (r->unlink && shm_unlink(r->name) != 0 && errno != ENOENT)
		log_info("region %016" PRIx64 ": shm_unlink %s: %s", r->id, r->name,
		         strerror(errno));
	region_live--;
	region_live_bytes -= r->size;
	free(r);
}

/* Out of the totals; see region.h. */
void region_uncount(struct region *r)
{
	if (r->uncounted)
		return;
	r->uncounted = true;
	region_live--;
	region_live_bytes -= r->size;
}

/* Live mappings. */
unsigned region_count(void)
{
	return region_live;
}

/* Bytes of live mappings. */
uint64_t region_bytes(void)
{
	return region_live_bytes;
}
