/* gpu_diskcache.c - the on-disk kernel cache (fa_diskcache.h) and the compile path that uses
 * it (fa_kernel_cubin), shared by the GPU launcher and offline precompilation.
 *
 * Why these choices: SHA-256 because the key decides which machine code runs (a collision
 * would silently run the wrong kernel; a 64-bit FNV is not collision resistant); one file per
 * entry with rename() because that is the only atomic publish POSIX gives across processes
 * without locks; a full-key header plus a payload checksum because a crash, a full disk or a
 * hand-copied file must never reach cuModuleLoadData (a bad cubin can fault the context).
 */
#include "fa_diskcache.h"
#include "fa_err.h"
#include "fa_bytes.h"
#include "fa_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fa_kernel_src.h"

static const uint8_t MAGIC[8] = {'F', 'A', 'K', 'C', 'U', 'B', 'I', 'N'};
#define TMP_PREFIX ".tmp."
#define TMP_STALE_S 600 /* a temporary file this old belongs to a writer that died */
#define PATH_CAP 4096

struct fa_diskcache {
	char path[PATH_CAP]; /* "<dir>/kernels" */
	uint64_t max_bytes;
};

static fa_status prune(struct fa_diskcache *dc, uint64_t max_bytes, const char *keep,
                       uint64_t *files, uint64_t *bytes, char *err, size_t errlen);

/* ---- SHA-256 ------------------------------------------------------------------------------- */

static const uint32_t K256[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/* One 64-byte block. */
static void sha256_block(uint32_t h[8], const uint8_t *p)
{
	uint32_t w[64];
	for (int i = 0; i < 16; i++)
		w[i] = fa_get_be32(p + 4 * i);
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
	for (int i = 0; i < 64; i++) {
		uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
		uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
		k = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = b;
		b = a;
		a = t1 + t2;
	}
	h[0] += a;
	h[1] += b;
	h[2] += c;
	h[3] += d;
	h[4] += e;
	h[5] += f;
	h[6] += g;
	h[7] += k;
}

void fa_sha256_init(struct fa_sha256 *c)
{
	static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
	                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
	memcpy(c->h, h0, sizeof h0);
	c->len = 0;
	c->nbuf = 0;
}

void fa_sha256_update(struct fa_sha256 *c, const void *data, size_t n)
{
	const uint8_t *p = data;
	c->len += n;
	if (c->nbuf) {
		size_t take = 64 - c->nbuf < n ? 64 - c->nbuf : n;
		memcpy(c->buf + c->nbuf, p, take);
		c->nbuf += take;
		p += take;
		n -= take;
		if (c->nbuf < 64)
			return;
		sha256_block(c->h, c->buf);
		c->nbuf = 0;
	}
	for (; n >= 64; p += 64, n -= 64)
		sha256_block(c->h, p);
	memcpy(c->buf, p, n);
	c->nbuf = n;
}

void fa_sha256_final(struct fa_sha256 *c, uint8_t out[32])
{
	uint64_t bits = c->len * 8;
	uint8_t pad[72] = {0x80};
	size_t npad = (c->nbuf < 56 ? 56 : 120) - c->nbuf;
	fa_put_be64(pad + npad, bits);
	uint64_t keep = c->len;
	fa_sha256_update(c, pad, npad + 8);
	c->len = keep;
	for (int i = 0; i < 8; i++)
		fa_put_be32(out + 4 * i, c->h[i]);
}

void fa_sha256(const void *data, size_t n, uint8_t out[32])
{
	struct fa_sha256 c;
	fa_sha256_init(&c);
	fa_sha256_update(&c, data, n);
	fa_sha256_final(&c, out);
}

/* ---- keys ---------------------------------------------------------------------------------- */

static void hash_u64(struct fa_sha256 *c, uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	fa_sha256_update(c, b, sizeof b);
}

/* The key over the texts the compile reads (the source, then the header it includes), each
 * length-prefixed; one text hashes as fa_diskcache_key_make always did. */
static void key_make_texts(struct fa_diskcache_key *k, const char *const *txt, const size_t *len,
                           int ntxt, const struct fa_nvrtc_opts *o, int nvrtc_major,
                           int nvrtc_minor)
{
	static const char tag[] = "fa kernel cache";
	struct fa_sha256 c;
	fa_sha256_init(&c);
	fa_sha256_update(&c, tag, sizeof tag);
	hash_u64(&c, FA_DISKCACHE_FORMAT);
	for (int i = 0; i < ntxt; i++) {
		hash_u64(&c, len[i]);
		fa_sha256_update(&c, txt[i], len[i]);
	}
	hash_u64(&c, (uint64_t)(int64_t)nvrtc_major);
	hash_u64(&c, (uint64_t)(int64_t)nvrtc_minor);
	hash_u64(&c, (uint64_t)o->n);
	for (int i = 0; i < o->n && i < FA_NVRTC_MAX_OPTS; i++) {
		size_t l = strnlen(o->v[i], sizeof o->v[i]);
		hash_u64(&c, l);
		fa_sha256_update(&c, o->v[i], l);
	}
	fa_sha256_final(&c, k->b);
}

void fa_diskcache_key_make(struct fa_diskcache_key *k, const char *src, size_t srclen,
                           const struct fa_nvrtc_opts *o, int nvrtc_major, int nvrtc_minor)
{
	key_make_texts(k, &src, &srclen, 1, o, nvrtc_major, nvrtc_minor);
}

void fa_diskcache_key_for_spec(struct fa_diskcache_key *k, const struct fa_nvrtc *n,
                               const struct fa_kernel_spec *spec, struct fa_nvrtc_opts *o)
{
	struct fa_nvrtc_opts local;
	int major, minor;
	if (!o)
		o = &local;
	fa_nvrtc_options(n, spec, o);
	fa_nvrtc_version(n, &major, &minor);
	const char *txt[2];
	size_t len[2];
	fa_kernel_source(spec, &txt[0], &len[0]);
	txt[1] = fa_src_fa_device;
	len[1] = fa_src_fa_device_len;
	key_make_texts(k, txt, len, 2, o, major, minor);
}

void fa_diskcache_key_hex(const struct fa_diskcache_key *k, char out[33])
{
	static const char hex[] = "0123456789abcdef";
	for (int i = 0; i < 16; i++) {
		out[2 * i] = hex[k->b[i] >> 4];
		out[2 * i + 1] = hex[k->b[i] & 15];
	}
	out[32] = 0;
}

void fa_diskcache_entry_path(const struct fa_diskcache *dc, const struct fa_diskcache_key *k,
                             char *buf, size_t cap)
{
	char hex[33];
	fa_diskcache_key_hex(k, hex);
	snprintf(buf, cap, "%s/%s.cubin", dc->path, hex);
}

/* ---- small file helpers -------------------------------------------------------------------- */

/* Read exactly n bytes at off; -1 with errno, or -2 at an early end of file. */
static int pread_full(int fd, void *p, size_t n, off_t off)
{
	char *c = p;
	while (n) {
		ssize_t r = pread(fd, c, n, off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			return -2;
		c += r;
		n -= (size_t)r;
		off += r;
	}
	return 0;
}

static void put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t get_u64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* Header layout (little-endian): magic[8] format:u32 header_bytes:u32 key[32] payload_len:u64
 * payload_sha256[32] name[96] (NUL-padded, for people) created_unix_s:u64. */
enum { H_MAGIC = 0, H_FORMAT = 8, H_HDRLEN = 12, H_KEY = 16, H_LEN = 48, H_SUM = 56, H_NAME = 88,
       H_TIME = 184 };
_Static_assert(H_TIME + 8 == FA_DISKCACHE_HEADER_BYTES, "header layout");

/* mkdir -p with mode for every directory it creates. */
static int mkdir_p(const char *dir, mode_t mode)
{
	char p[PATH_CAP];
	size_t n = strlen(dir);
	if (n >= sizeof p) {
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(p, dir, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (p[i] != '/' && p[i] != 0)
			continue;
		char c = p[i];
		p[i] = 0;
		if (mkdir(p, mode) != 0 && errno != EEXIST)
			return -1;
		p[i] = c;
	}
	return 0;
}

/* A new temporary file in the cache directory, created exclusively. */
static int open_temp(const struct fa_diskcache *dc, const char *tag, char *tmp, size_t cap)
{
	static atomic_uint counter;
	for (int tries = 0; tries < 16; tries++) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		unsigned c = atomic_fetch_add(&counter, 1);
		snprintf(tmp, cap, "%s/" TMP_PREFIX "%s.%ld.%u.%09ld", dc->path, tag, (long)getpid(), c,
		         (long)ts.tv_nsec);
		int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0640);
		if (fd >= 0 || errno != EEXIST)
			return fd;
	}
	return -1;
}

/* ---- open / close -------------------------------------------------------------------------- */

fa_status fa_diskcache_open(struct fa_diskcache **out, const char *dir, uint64_t max_bytes,
                            char *err, size_t errlen)
{
	*out = NULL;
	if (!dir || !*dir) {
		return fa_err(err, errlen, FA_EINVAL, "kernel cache directory not set");
	}
	if (strlen(dir) > PATH_CAP - 128) {
		return fa_err(err, errlen, FA_EINVAL,
		              "kernel cache directory path too long (%zu bytes)", strlen(dir));
	}
	struct fa_diskcache *dc = calloc(1, sizeof *dc);
	if (!dc)
		return FA_ENOMEM;
	dc->max_bytes = max_bytes ? max_bytes : FA_DISKCACHE_DEFAULT_MAX_BYTES;
	size_t n = strlen(dir);
	while (n > 1 && dir[n - 1] == '/')
		n--;
	snprintf(dc->path, sizeof dc->path, "%.*s/kernels", (int)n, dir);

	struct stat st;
	int fd;
	char tmp[PATH_CAP];
	if (mkdir_p(dc->path, 0750) != 0) {
		snprintf(err, errlen, "kernel cache disabled: cannot create %s: %s", dc->path,
		         strerror(errno));
		goto fail_sys;
	}
	if (stat(dc->path, &st) != 0 || !S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "kernel cache disabled: %s is not a directory", dc->path);
		goto fail_sys;
	}
	if (st.st_mode & S_IWOTH) {
		snprintf(err, errlen, "kernel cache disabled: %s is writable by every user (mode %04o): "
		         "cubins from there would run in the daemon", dc->path,
		         (unsigned)(st.st_mode & 07777));
		free(dc);
		return FA_EPERM;
	}
	/* Creating a file is the only honest test (read-only mounts, ACLs, quotas, root). */
	fd = open_temp(dc, "probe", tmp, sizeof tmp);
	if (fd < 0) {
		snprintf(err, errlen, "kernel cache disabled: %s is not writable: %s", dc->path,
		         strerror(errno));
		goto fail_sys;
	}
	close(fd);
	unlink(tmp);
	char e2[256];
	prune(dc, 0, NULL, NULL, NULL, e2, sizeof e2); /* best effort: stale temporaries, the bound */
	*out = dc;
	return FA_OK;
fail_sys:
	free(dc);
	return FA_ESYS;
}

void fa_diskcache_close(struct fa_diskcache *dc)
{
	free(dc);
}

const char *fa_diskcache_path(const struct fa_diskcache *dc)
{
	return dc->path;
}

/* ---- load ---------------------------------------------------------------------------------- */

/* Remove a bad entry, unless another process already replaced it with a new file (same name,
 * another inode): that one is probably good. */
static void remove_bad(const char *path, const struct stat *seen)
{
	struct stat now;
	if (lstat(path, &now) == 0 && now.st_dev == seen->st_dev && now.st_ino == seen->st_ino)
		unlink(path);
}

fa_status fa_diskcache_load(struct fa_diskcache *dc, const struct fa_diskcache_key *k, void **data,
                            size_t *size, bool *hit, char *err, size_t errlen)
{
	char path[PATH_CAP + 64];
	uint8_t h[FA_DISKCACHE_HEADER_BYTES];
	struct stat st;
	const char *why = NULL;
	char whybuf[160];
	uint8_t *buf = NULL;
	int rc;

	*data = NULL;
	*size = 0;
	*hit = false;
	fa_diskcache_entry_path(dc, k, path, sizeof path);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		if (errno == ENOENT)
			return FA_OK;
		if (errno == ELOOP) {
			/* A symlink under a cubin's name: never followed, removed. */
			unlink(path);
			return fa_err(err, errlen, FA_EPROTO,
			              "kernel cache entry %s: a symbolic link; removed", path);
		}
		return fa_err(err, errlen, FA_ESYS,
		              "kernel cache entry %s: cannot open: %s", path, strerror(errno));
	}
	if (fstat(fd, &st) != 0) {
		snprintf(err, errlen, "kernel cache entry %s: fstat: %s", path, strerror(errno));
		close(fd);
		return FA_ESYS;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "kernel cache entry %s: not a regular file; left alone", path);
		close(fd);
		return FA_ESYS;
	}
	if (st.st_size < FA_DISKCACHE_HEADER_BYTES) {
		snprintf(whybuf, sizeof whybuf, "truncated (%lld bytes, the header alone is %d)",
		         (long long)st.st_size, FA_DISKCACHE_HEADER_BYTES);
		why = whybuf;
		goto bad;
	}
	if ((rc = pread_full(fd, h, sizeof h, 0)) != 0) {
		if (rc == -2) {
			why = "truncated while reading";
			goto bad;
		}
		snprintf(err, errlen, "kernel cache entry %s: read: %s", path, strerror(errno));
		close(fd);
		return FA_ESYS;
	}
	uint64_t len = get_u64(h + H_LEN);
	if (memcmp(h + H_MAGIC, MAGIC, sizeof MAGIC) != 0) {
		why = "not a kernel cache file (wrong magic)";
	} else if (get_u32(h + H_FORMAT) != FA_DISKCACHE_FORMAT ||
	           get_u32(h + H_HDRLEN) != FA_DISKCACHE_HEADER_BYTES) {
		snprintf(whybuf, sizeof whybuf, "format %u (header %u bytes), this build reads %d",
		         get_u32(h + H_FORMAT), get_u32(h + H_HDRLEN), FA_DISKCACHE_FORMAT);
		why = whybuf;
	} else if (memcmp(h + H_KEY, k->b, sizeof k->b) != 0) {
		why = "holds another key's cubin";
	} else if (len == 0 || len > FA_DISKCACHE_MAX_PAYLOAD ||
	           len != (uint64_t)st.st_size - FA_DISKCACHE_HEADER_BYTES) {
		snprintf(whybuf, sizeof whybuf, "truncated or padded: the header says %llu bytes of "
		         "cubin, the file has %lld", (unsigned long long)len,
		         (long long)st.st_size - FA_DISKCACHE_HEADER_BYTES);
		why = whybuf;
	}
	if (why)
		goto bad;
	buf = malloc((size_t)len);
	if (!buf) {
		close(fd);
		return FA_ENOMEM;
	}
	if ((rc = pread_full(fd, buf, (size_t)len, FA_DISKCACHE_HEADER_BYTES)) != 0) {
		if (rc == -2) {
			why = "truncated while reading";
			goto bad;
		}
		snprintf(err, errlen, "kernel cache entry %s: read: %s", path, strerror(errno));
		free(buf);
		close(fd);
		return FA_ESYS;
	}
	uint8_t sum[32];
	fa_sha256(buf, (size_t)len, sum);
	if (memcmp(sum, h + H_SUM, sizeof sum) != 0) {
		why = "checksum mismatch (corrupt cubin)";
		goto bad;
	}
	/* Least recently used, by mtime: a load counts as a use. Fails harmlessly when read-only. */
	futimens(fd, NULL);
	close(fd);
	*data = buf;
	*size = (size_t)len;
	*hit = true;
	return FA_OK;
bad:
	free(buf);
	close(fd);
	remove_bad(path, &st);
	return fa_err(err, errlen, FA_EPROTO, "kernel cache entry %s: %s; removed", path, why);
}

/* ---- store --------------------------------------------------------------------------------- */

fa_status fa_diskcache_store(struct fa_diskcache *dc, const struct fa_diskcache_key *k,
                             const char *name, const void *data, size_t size, char *err,
                             size_t errlen)
{
	char path[PATH_CAP + 64], tmp[PATH_CAP + 128], hex[33];
	uint8_t h[FA_DISKCACHE_HEADER_BYTES];

	if (size == 0 || size > FA_DISKCACHE_MAX_PAYLOAD) {
		return fa_err(err, errlen, FA_EINVAL,
		              "kernel cache: refusing to store a cubin of %zu bytes", size);
	}
	memset(h, 0, sizeof h);
	memcpy(h + H_MAGIC, MAGIC, sizeof MAGIC);
	put_u32(h + H_FORMAT, FA_DISKCACHE_FORMAT);
	put_u32(h + H_HDRLEN, FA_DISKCACHE_HEADER_BYTES);
	memcpy(h + H_KEY, k->b, sizeof k->b);
	put_u64(h + H_LEN, size);
	fa_sha256(data, size, h + H_SUM);
	if (name)
		strncpy((char *)h + H_NAME, name, H_TIME - H_NAME - 1);
	put_u64(h + H_TIME, (uint64_t)time(NULL));

	fa_diskcache_key_hex(k, hex);
	fa_diskcache_entry_path(dc, k, path, sizeof path);
	int fd = open_temp(dc, hex, tmp, sizeof tmp);
	if (fd < 0) {
		return fa_err(err, errlen, FA_ESYS,
		              "kernel cache: cannot create a file in %s: %s", dc->path,
		              strerror(errno));
	}
	struct iovec parts[2] = {{h, sizeof h}, {(void *)data, size}};
	fa_status st = fa_file_publish(fd, tmp, path, dc->path, parts, 2, "kernel cache", err,
	                               errlen);
	if (st != FA_OK)
		return st;
	/* Pruning problems do not undo the store; the next store tries again. */
	char keepname[40], e2[256];
	snprintf(keepname, sizeof keepname, "%s.cubin", hex);
	prune(dc, 0, keepname, NULL, NULL, e2, sizeof e2);
	return FA_OK;
}

/* ---- prune --------------------------------------------------------------------------------- */

struct prune_ent {
	char name[40];
	uint64_t size;
	struct timespec mtime;
};

static int by_mtime(const void *a, const void *b)
{
	const struct prune_ent *x = a, *y = b;
	if (x->mtime.tv_sec != y->mtime.tv_sec)
		return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
	if (x->mtime.tv_nsec != y->mtime.tv_nsec)
		return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* "<32 lowercase hex>.cubin": the only names pruning may remove (besides stale temporaries). */
static bool is_entry_name(const char *n)
{
	if (strlen(n) != 38 || strcmp(n + 32, ".cubin") != 0)
		return false;
	for (int i = 0; i < 32; i++)
		if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f')))
			return false;
	return true;
}

static fa_status prune(struct fa_diskcache *dc, uint64_t max_bytes, const char *keep,
                       uint64_t *files, uint64_t *bytes, char *err, size_t errlen)
{
	if (!max_bytes)
		max_bytes = dc->max_bytes;
	DIR *d = opendir(dc->path);
	if (!d) {
		return fa_err(err, errlen, FA_ESYS,
		              "kernel cache: cannot list %s: %s", dc->path, strerror(errno));
	}
	int dfd = dirfd(d);
	struct prune_ent *v = NULL;
	size_t n = 0, cap = 0;
	uint64_t total = 0;
	time_t now = time(NULL);
	struct dirent *de;
	fa_status st = FA_OK;
	while ((de = readdir(d)) != NULL) {
		struct stat sb;
		bool tmp = strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0;
		if (!tmp && !is_entry_name(de->d_name))
			continue;
		if (fstatat(dfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(sb.st_mode))
			continue;
		if (tmp) {
			if (sb.st_mtime < now - TMP_STALE_S)
				unlinkat(dfd, de->d_name, 0);
			continue;
		}
		if (n == cap) {
			size_t nc = cap ? 2 * cap : 64;
			struct prune_ent *nv = realloc(v, nc * sizeof *v);
			if (!nv) {
				st = FA_ENOMEM;
				break;
			}
			v = nv;
			cap = nc;
		}
		snprintf(v[n].name, sizeof v[n].name, "%s", de->d_name);
		v[n].size = (uint64_t)sb.st_size;
		v[n].mtime = sb.st_mtim;
		total += v[n].size;
		n++;
	}
	if (st == FA_OK && total > max_bytes) {
		qsort(v, n, sizeof *v, by_mtime);
		size_t removed = 0;
		for (size_t i = 0; i < n && total > max_bytes; i++) {
			if (keep && strcmp(v[i].name, keep) == 0)
				continue;
			/* ENOENT: another daemon pruned it first; it is gone either way. */
			if (unlinkat(dfd, v[i].name, 0) == 0 || errno == ENOENT) {
				total -= v[i].size;
				removed++;
			}
		}
		n -= removed;
	}
	closedir(d);
	free(v);
	if (files)
		*files = n;
	if (bytes)
		*bytes = total;
	if (st == FA_ENOMEM)
		snprintf(err, errlen, "kernel cache: out of memory listing %s", dc->path);
	return st;
}

fa_status fa_diskcache_remove(struct fa_diskcache *dc, const struct fa_diskcache_key *k, char *err,
                              size_t errlen)
{
	char path[PATH_CAP + 64];
	fa_diskcache_entry_path(dc, k, path, sizeof path);
	if (unlink(path) != 0 && errno != ENOENT) {
		return fa_err(err, errlen, FA_ESYS,
		              "kernel cache: removing %s: %s", path, strerror(errno));
	}
	return FA_OK;
}

fa_status fa_diskcache_prune(struct fa_diskcache *dc, uint64_t max_bytes, uint64_t *files,
                             uint64_t *bytes, char *err, size_t errlen)
{
	return prune(dc, max_bytes, NULL, files, bytes, err, errlen);
}

/* ---- the compile path ---------------------------------------------------------------------- */

/* Append one line to info->disk_msg ("; " between lines). */
static void note(struct fa_cubin_info *info, const char *msg)
{
	size_t used = strlen(info->disk_msg);
	snprintf(info->disk_msg + used, sizeof info->disk_msg - used, "%s%s", used ? "; " : "", msg);
	info->disk_errors++;
}

fa_status fa_kernel_cubin(struct fa_nvrtc *n, struct fa_diskcache *dc,
                          const struct fa_kernel_spec *spec, void **cubin, size_t *size,
                          struct fa_cubin_info *info, char *err, size_t errlen)
{
	struct fa_nvrtc_opts o;
	struct fa_diskcache_key k;
	char e[600];
	fa_status st;

	memset(info, 0, sizeof *info);
	*cubin = NULL;
	*size = 0;
	/* The options hashed are the options compiled (FA_NVRTC_EXTRA from n's settings). */
	fa_diskcache_key_for_spec(&k, n, spec, &o);
	info->key = k;
	if (dc) {
		bool hit = false;
		st = fa_diskcache_load(dc, &k, cubin, size, &hit, e, sizeof e);
		if (st == FA_OK && hit) {
			info->from_disk = true;
			return FA_OK;
		}
		if (st != FA_OK)
			note(info, st == FA_ENOMEM ? "kernel cache: out of memory reading an entry" : e);
	}
	st = fa_nvrtc_compile_opts(n, spec, &o, cubin, size, &info->usage, err, errlen);
	if (st != FA_OK)
		return st;
	info->compiled = true;
	info->compile_ms = info->usage.compile_s * 1e3;
	if (dc) {
		char name[128];
		fa_kernel_spec_name(spec, name, sizeof name);
		if (fa_diskcache_store(dc, &k, name, *cubin, *size, e, sizeof e) == FA_OK)
			info->stored = true;
		else
			note(info, e);
	}
	return FA_OK;
}

fa_status fa_diskcache_precompile(struct fa_diskcache *dc, struct fa_nvrtc *n,
                                  const struct fa_kernel_spec *specs, int count, int *compiled,
                                  int *cached, char *err, size_t errlen)
{
	int nc = 0, nh = 0;
	fa_status st = FA_OK;
	for (int i = 0; i < count; i++) {
		struct fa_cubin_info info;
		void *cubin = NULL;
		size_t size = 0;
		st = fa_kernel_cubin(n, dc, &specs[i], &cubin, &size, &info, err, errlen);
		free(cubin);
		if (st != FA_OK)
			break;
		if (info.from_disk) {
			nh++;
		} else {
			nc++;
			if (!info.stored) {
				snprintf(err, errlen, "%s", info.disk_msg);
				st = FA_ESYS;
				break;
			}
		}
	}
	if (compiled)
		*compiled = nc;
	if (cached)
		*cached = nh;
	return st;
}
