/* fa_shm.c - host buffers: POSIX shared memory that the daemon maps by name.
 *
 * The name is "/fa.<uid>.<pid>.<16 hex random>": the daemon only opens names of that pattern
 * whose object is owned by the connection's peer uid, so the name says whose it is and the random
 * part keeps other processes from guessing it. The object gets mode 0660 and the group of the
 * daemon's socket file, so a daemon running as another user in that group can map it.
 *
 * The daemon shm_unlink()s the objects of a session that ends (BYE, or the client died), so a
 * SIGKILLed client leaks nothing; fa_buffer_free unlinks too (ENOENT is fine).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fa_client_int.h"

/* Attempts at a fresh name before giving up (a collision of 64 random bits means a broken RNG). */
#define NAME_TRIES 8

/* Is gid the effective group or a supplementary group of this process? */
static bool in_group(gid_t gid)
{
	gid_t small[64], *list = small;
	int n;
	bool found = false;

	if (gid == getegid())
		return true;
	n = getgroups(0, NULL);
	if (n <= 0)
		return false;
	if (n > 64 && (list = malloc((size_t)n * sizeof *list)) == NULL)
		return false;
	n = getgroups(n, list);
	for (int i = 0; i < n && !found; i++)
		found = list[i] == gid;
	if (list != small)
		free(list);
	return found;
}

/* A new object's name: "/fa.<uid>.<pid>.<16 hex from getrandom>". */
static fa_status random_name(char name[FA_PROTO_SHM_NAME_MAX])
{
	uint64_t r;
	ssize_t n;

	do
		n = getrandom(&r, sizeof r, 0);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof r)
		return fa__fail(FA_ESYS, "getrandom: %s", n < 0 ? strerror(errno) : "short read");
	snprintf(name, FA_PROTO_SHM_NAME_MAX, "/fa.%u.%d.%016" PRIx64, (unsigned)geteuid(),
	         (int)getpid(), r);
	return FA_OK;
}

/* Give the object the socket file's group when it differs from ours and we may (we are in it, or
 * root); the daemon then maps it through the group bits. Failing to is not fatal: a daemon of our
 * own uid needs no group. */
static fa_status set_group(fa_client *c, int fd, const char *name)
{
	gid_t gid;

	if (!fa__socket_gid(c, &gid) || gid == getegid())
		return FA_OK;
	if (geteuid() != 0 && !in_group(gid))
		return FA_OK;
	if (fchown(fd, (uid_t)-1, gid) == 0)
		return FA_OK;
	if (errno == EPERM) {
		fa__debug("fa: %s: cannot give it group %u (EPERM); the daemon may not map it", name,
		          (unsigned)gid);
		return FA_OK;
	}
	return fa__fail(FA_ESYS, "fchown %s to group %u: %s", name, (unsigned)gid, strerror(errno));
}

/* Create a new object of `size` bytes: a fresh name, mode 0660, the socket's group, its pages
 * reserved. Returns the open fd in *fd, the name in name; on failure nothing is left behind. */
static fa_status object_create(fa_client *c, size_t size, char name[FA_PROTO_SHM_NAME_MAX],
                               int *fd)
{
	fa_status st;
	int err;

	*fd = -1;
	for (int i = 0; i < NAME_TRIES && *fd < 0; i++) {
		if ((st = random_name(name)) != FA_OK)
			return st;
		*fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0660);
		if (*fd < 0 && errno != EEXIST)
			return fa__fail(FA_ESYS, "shm_open %s: %s", name, strerror(errno));
	}
	if (*fd < 0)
		return fa__fail(FA_ESYS, "shm_open: %d random names all existed", NAME_TRIES);

	st = set_group(c, *fd, name);
	/* The umask may have cleared the group bits that shm_open was asked for. */
	if (st == FA_OK && fchmod(*fd, 0660) != 0)
		st = fa__fail(FA_ESYS, "fchmod %s: %s", name, strerror(errno));
	if (st == FA_OK && ftruncate(*fd, (off_t)size) != 0)
		st = fa__fail(FA_ESYS, "ftruncate %s to %zu bytes: %s", name, size, strerror(errno));
	if (st == FA_OK) {
		/* Reserve the pages now: a full /dev/shm is then a status here, not a SIGBUS at the
		 * first write to the mapping, in this process or in the daemon. */
		do
			err = posix_fallocate(*fd, 0, (off_t)size);
		while (err == EINTR);
		if (err == ENOSPC || err == ENOMEM)
			st = fa__fail(FA_ENOMEM, "no room for %zu bytes in /dev/shm (%s)", size,
			              strerror(err));
		else if (err != 0 && err != EOPNOTSUPP && err != ENOSYS && err != EINVAL)
			st = fa__fail(FA_ESYS, "posix_fallocate %s: %s", name, strerror(err));
	}
	if (st != FA_OK) {
		close(*fd);
		*fd = -1;
		shm_unlink(name);
	}
	return st;
}

/* Record the object's identity (device, inode), to notice later whether a name still refers to
 * it. */
static void object_identity(fa_buffer *b, int fd)
{
	struct stat sb;

	if (fstat(fd, &sb) == 0) {
		b->u.shm.dev = (uint64_t)sb.st_dev;
		b->u.shm.ino = (uint64_t)sb.st_ino;
	}
}

/* REGISTER's fields for a host buffer. */
static void shm_describe(const fa_buffer *b, struct fa_proto_req *req)
{
	req->u.reg.kind = FA_REGION_HOST_SHM;
	req->u.reg.size = (uint64_t)b->size;
	snprintf(req->u.reg.shm_name, sizeof req->u.reg.shm_name, "%s", b->u.shm.name);
}

/* Does b's name still refer to b's object? */
static bool name_is_ours(const fa_buffer *b)
{
	struct stat sb;
	bool ours;
	int fd = shm_open(b->u.shm.name, O_RDONLY | O_CLOEXEC, 0);

	if (fd < 0)
		return false;
	ours = fstat(fd, &sb) == 0 && (uint64_t)sb.st_dev == b->u.shm.dev &&
	       (uint64_t)sb.st_ino == b->u.shm.ino;
	close(fd);
	return ours;
}

/* Before re-registration: keep the name when it still refers to our object; otherwise (or when
 * forced) copy the contents into a new object and map it over the old mapping's address
 * (MAP_FIXED replaces the pages in one step), so fa_buffer_data() stays valid. */
static fa_status shm_revive(fa_buffer *b, bool force)
{
	char name[FA_PROTO_SHM_NAME_MAX];
	const unsigned char *p = b->data;
	size_t done = 0;
	fa_status st;
	void *m;
	int fd;

	if (!force && name_is_ours(b))
		return FA_OK;
	if ((st = object_create(b->client, b->size, name, &fd)) != FA_OK)
		return st;
	while (done < b->size) {
		ssize_t n = pwrite(fd, p + done, b->size - done, (off_t)done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			st = fa__fail(FA_ESYS, "copying the buffer into %s: %s", name,
			              n < 0 ? strerror(errno) : "short write");
			break;
		}
		done += (size_t)n;
	}
	if (st == FA_OK) {
		m = mmap(b->data, b->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
		if (m == MAP_FAILED)
			st = fa__fail(FA_ESYS, "mmap %s over the old mapping: %s", name, strerror(errno));
	}
	if (st != FA_OK) {
		close(fd);
		shm_unlink(name);
		return st;
	}
	object_identity(b, fd);
	close(fd);
	if (force)
		shm_unlink(b->u.shm.name); /* ours and no longer mapped here; ENOENT is fine */
	fa__debug("fa: host buffer moved from %s to %s", b->u.shm.name, name);
	memcpy(b->u.shm.name, name, sizeof name);
	return FA_OK;
}

/* Unmap and unlink; the daemon may have unlinked the name already. */
static void shm_release(fa_buffer *b)
{
	if (b->data != NULL)
		munmap(b->data, b->size);
	b->data = NULL;
	if (b->u.shm.name[0] != '\0' && shm_unlink(b->u.shm.name) != 0 && errno != ENOENT)
		fa__debug("fa: shm_unlink %s: %s", b->u.shm.name, strerror(errno));
	b->u.shm.name[0] = '\0';
}

static const struct fa_buffer_ops shm_ops = {
	.kind = FA_REGION_HOST_SHM,
	.name = "host",
	.describe = shm_describe,
	.revive = shm_revive,
	.release = shm_release,
};

/* Host memory in POSIX shared memory, mapped and registered; see fa_client.h. */
FA_API fa_status fa_buffer_alloc_host(fa_client *c, size_t size, fa_buffer **out)
{
	fa_buffer *b;
	fa_status st;
	int fd;

	fa__detail_clear();
	if (out == NULL)
		return fa__fail(FA_EINVAL, "fa_buffer_alloc_host: out is NULL");
	*out = NULL;
	if (c == NULL)
		return fa__fail(FA_EINVAL, "fa_buffer_alloc_host: client is NULL");
	if (size == 0)
		return fa__fail(FA_EINVAL, "buffer size is 0");
	if (size > (size_t)INT64_MAX)
		return fa__fail(FA_EINVAL, "buffer size %zu is above the largest file size", size);
	b = calloc(1, sizeof *b);
	if (b == NULL)
		return fa__fail(FA_ENOMEM, "no memory for a buffer");
	b->client = c;
	b->ops = &shm_ops;
	b->size = size;
	if ((st = object_create(c, size, b->u.shm.name, &fd)) != FA_OK) {
		free(b);
		return st;
	}
	object_identity(b, fd);
	b->data = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd); /* the mapping keeps the object; reconnect reopens it by name */
	if (b->data == MAP_FAILED) {
		st = fa__fail(errno == ENOMEM ? FA_ENOMEM : FA_ESYS, "mmap %zu bytes of %s: %s", size,
		              b->u.shm.name, strerror(errno));
		b->data = NULL;
		shm_release(b);
		free(b);
		return st;
	}
	st = fa__buffer_register(c, b);
	if (st != FA_OK) {
		shm_release(b);
		free(b);
		return st;
	}
	*out = b;
	return FA_OK;
}
