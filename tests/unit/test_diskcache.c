/* test_diskcache.c - the on-disk kernel cache (kernels/fa_diskcache.h): round trip of a real
 * NVRTC cubin, what the key depends on, rejection (and removal) of bad files, atomic stores by
 * concurrent processes, an unusable directory, the size bound, precompilation. No GPU needed.
 *
 * NVRTC compiles three small kernels in all (sm_80 bf16 D=64: once in setup, once for
 * precompilation, once with a cache broken after opening); without NVRTC the cases that only
 * store bytes run on a synthetic payload and the compile cases are skipped with the reason.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fa_diskcache.h"
#include "fa_gpu.h"
#include "fa_test.h"

static struct fa_nvrtc *nv;
static char nv_err[512];
static struct fa_kernel_spec spec;  /* sm_80 bf16 D=64, the planner's first tile */
static void *payload;               /* its cubin, or synthetic bytes without NVRTC */
static size_t payload_size;
static char root[64];               /* /tmp/fa-XXXXXX, one subdirectory per test */
static int ndirs;

/* ---- helpers ------------------------------------------------------------------------------- */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	chmod(p, 0700); /* a test may have left a directory unwritable */
	remove(p);
	return 0;
}

static void rm_tree(const char *p)
{
	nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh, not yet existing cache directory under root. */
static void fresh_dir(char *out, size_t cap)
{
	snprintf(out, cap, "%s/c%d", root, ndirs++);
}

static struct fa_diskcache *open_ok(const char *dir, uint64_t max)
{
	struct fa_diskcache *dc = NULL;
	char err[512];
	fa_status st = fa_diskcache_open(&dc, dir, max, err, sizeof err);
	if (st != FA_OK)
		fail_msg("fa_diskcache_open(%s): %s: %s", dir, fa_status_name(st), err);
	return dc;
}

/* A synthetic key: the spec's key with one byte changed (for cases needing several entries). */
static void key_n(struct fa_diskcache_key *k, int n)
{
	fa_diskcache_key_for_spec(k, nv, &spec, NULL);
	k->b[0] ^= (uint8_t)(n + 1);
}

static void store_ok(struct fa_diskcache *dc, const struct fa_diskcache_key *k)
{
	char err[512];
	fa_status st = fa_diskcache_store(dc, k, "test", payload, payload_size, err, sizeof err);
	if (st != FA_OK)
		fail_msg("store: %s: %s", fa_status_name(st), err);
}

/* Number of files in dir whose name starts with prefix ("" for all, dot files included). */
static int count_files(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *de;
	if (!d)
		return -1;
	while ((de = readdir(d)) != NULL)
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
		    strncmp(de->d_name, prefix, strlen(prefix)) == 0)
			n++;
	closedir(d);
	return n;
}

static bool exists(const char *p)
{
	struct stat sb;
	return lstat(p, &sb) == 0;
}

static void set_mtime(const char *p, time_t t)
{
	struct timespec ts[2] = {{t, 0}, {t, 0}};
	assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
}

/* ---- setup --------------------------------------------------------------------------------- */

static int setup(void **state)
{
	(void)state;
	if (fa_test_mkdir(root, sizeof root) != 0)
		return -1;
	const struct fa_device_model *dev = fa_device_model_find("sm_80");
	struct fa_plan_req r;
	memset(&r, 0, sizeof r);
	r.dtype = FA_DTYPE_BF16;
	r.D = 64;
	r.mask = FA_MASK_NONE;
	struct fa_tile t;
	int n = 0;
	char err[2048];
	if (!dev || fa_plan(dev, &r, &t, 1, &n, err, sizeof err) != FA_OK || n < 1)
		return -1;
	fa_kernel_spec_make(&spec, dev->sm, FA_DTYPE_BF16, FA_PREC_DEFAULT, 64, FA_MASK_NONE, &t);
	if (fa_nvrtc_open(&nv, NULL, nv_err, sizeof nv_err) != FA_OK)
		nv = NULL;
	if (nv) {
		struct fa_kernel_usage u;
		if (fa_nvrtc_compile(nv, &spec, &payload, &payload_size, &u, err, sizeof err) != FA_OK) {
			fprintf(stderr, "setup: %s\n", err);
			return -1;
		}
		printf("NVRTC cubin of %zu bytes in %.2f s\n", payload_size, u.compile_s);
	} else {
		printf("NVRTC not available (%s): a synthetic payload stands in for the cubin\n", nv_err);
		uint64_t seed = 42;
		payload_size = 40000;
		payload = malloc(payload_size);
		if (!payload)
			return -1;
		fa_fill_bytes(payload, payload_size, &seed);
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fa_nvrtc_close(nv);
	free(payload);
	if (!getenv("FA_TEST_KEEP"))
		rm_tree(root);
	return 0;
}

/* ---- tests --------------------------------------------------------------------------------- */

static void test_sha256_matches_the_fips_vectors(void **state)
{
	(void)state;
	static const struct {
		size_t n;
		const char *hex;
	} v[] = {
		{0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{56, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
		{1027, "32b377390e072c37cfeb9bb327d8825616819a76b0ad3749e16fe22e53afbdfc"},
	};
	uint8_t msg[1027];
	for (int i = 0; i < 1024; i++)
		msg[i] = (uint8_t)i;
	memcpy(msg + 1024, "xyz", 3);
	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
		const uint8_t *m = msg;
		if (v[i].n == 3)
			m = (const uint8_t *)"abc";
		else if (v[i].n == 56)
			m = (const uint8_t *)"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
		/* in pieces of 1, 63 and the rest, to exercise the buffering */
		struct fa_sha256 c;
		uint8_t out[32];
		char hex[65];
		fa_sha256_init(&c);
		size_t a = v[i].n < 1 ? v[i].n : 1, b = v[i].n - a < 63 ? v[i].n - a : 63;
		fa_sha256_update(&c, m, a);
		fa_sha256_update(&c, m + a, b);
		fa_sha256_update(&c, m + a + b, v[i].n - a - b);
		fa_sha256_final(&c, out);
		for (int j = 0; j < 32; j++)
			snprintf(hex + 2 * j, 3, "%02x", out[j]);
		assert_string_equal(hex, v[i].hex);
	}
}

static void test_diskcache_round_trip_returns_the_stored_cubin(void **state)
{
	(void)state;
	char dir[128], path[256], err[512], hex[33];
	fresh_dir(dir, sizeof dir);
	struct fa_diskcache *dc = open_ok(dir, 0);
	struct stat sb;
	assert_int_equal(stat(fa_diskcache_path(dc), &sb), 0);
	assert_int_equal(sb.st_mode & 0777 & ~0022u, 0750 & ~0022u);
	struct fa_diskcache_key k;
	fa_diskcache_key_for_spec(&k, nv, &spec, NULL);

	void *data = NULL;
	size_t size = 0;
	bool hit = true;
	assert_int_equal(fa_diskcache_load(dc, &k, &data, &size, &hit, err, sizeof err), FA_OK);
	assert_false(hit);
	assert_null(data);

	char name[128];
	fa_kernel_spec_name(&spec, name, sizeof name);
	assert_int_equal(fa_diskcache_store(dc, &k, name, payload, payload_size, err, sizeof err),
	                 FA_OK);
	fa_diskcache_key_hex(&k, hex);
	snprintf(path, sizeof path, "%s/kernels/%s.cubin", dir, hex);
	assert_true(exists(path));
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal((size_t)sb.st_size, FA_DISKCACHE_HEADER_BYTES + payload_size);
	assert_int_equal(count_files(fa_diskcache_path(dc), ".tmp."), 0);

	assert_int_equal(fa_diskcache_load(dc, &k, &data, &size, &hit, err, sizeof err), FA_OK);
	assert_true(hit);
	assert_int_equal(size, payload_size);
	assert_memory_equal(data, payload, size);
	free(data);

	/* A second handle (a restarted daemon) finds it too. */
	struct fa_diskcache *dc2 = open_ok(dir, 0);
	assert_int_equal(fa_diskcache_load(dc2, &k, &data, &size, &hit, err, sizeof err), FA_OK);
	assert_true(hit);
	free(data);
	fa_diskcache_close(dc2);
	fa_diskcache_close(dc);
}

static void test_diskcache_key_changes_with_source_options_arch_and_version(void **state)
{
	(void)state;
	struct fa_nvrtc_opts o, o2;
	struct fa_diskcache_key base, k;
	const char src[] = "__global__ void f() {}";
	fa_nvrtc_options(nv, &spec, &o);
	fa_diskcache_key_make(&base, src, sizeof src - 1, &o, 13, 0);

	fa_diskcache_key_make(&k, src, sizeof src - 1, &o, 13, 0);
	assert_memory_equal(&k, &base, sizeof k); /* deterministic */

	char src2[sizeof src];
	memcpy(src2, src, sizeof src);
	src2[5] ^= 1;
	fa_diskcache_key_make(&k, src2, sizeof src - 1, &o, 13, 0);
	assert_memory_not_equal(&k, &base, sizeof k); /* source */

	fa_diskcache_key_make(&k, src, sizeof src - 1, &o, 13, 1);
	assert_memory_not_equal(&k, &base, sizeof k); /* NVRTC minor */
	fa_diskcache_key_make(&k, src, sizeof src - 1, &o, 12, 0);
	assert_memory_not_equal(&k, &base, sizeof k); /* NVRTC major */

	/* every single option */
	for (int i = 0; i < o.n; i++) {
		o2 = o;
		o2.v[i][strlen(o2.v[i]) - 1] ^= 1;
		fa_diskcache_key_make(&k, src, sizeof src - 1, &o2, 13, 0);
		assert_memory_not_equal(&k, &base, sizeof k);
	}
	/* arch, head dim, tile: through the real option builder */
	struct fa_kernel_spec s2 = spec;
	s2.sm = 86;
	fa_nvrtc_options(nv, &s2, &o2);
	fa_diskcache_key_make(&k, src, sizeof src - 1, &o2, 13, 0);
	assert_memory_not_equal(&k, &base, sizeof k);
	s2 = spec;
	s2.D = 128;
	fa_nvrtc_options(nv, &s2, &o2);
	fa_diskcache_key_make(&k, src, sizeof src - 1, &o2, 13, 0);
	assert_memory_not_equal(&k, &base, sizeof k);
	s2 = spec;
	s2.tile.stages = spec.tile.stages == 2 ? 3 : 2;
	fa_nvrtc_options(nv, &s2, &o2);
	fa_diskcache_key_make(&k, src, sizeof src - 1, &o2, 13, 0);
	assert_memory_not_equal(&k, &base, sizeof k);

	/* option boundaries count: {"-DA", "B"} is not {"-DAB"} */
	struct fa_nvrtc_opts a = {.n = 2}, b = {.n = 1};
	strcpy(a.v[0], "-DA");
	strcpy(a.v[1], "B");
	strcpy(b.v[0], "-DAB");
	struct fa_diskcache_key ka, kb;
	fa_diskcache_key_make(&ka, src, sizeof src - 1, &a, 13, 0);
	fa_diskcache_key_make(&kb, src, sizeof src - 1, &b, 13, 0);
	assert_memory_not_equal(&ka, &kb, sizeof ka);

	/* FA_NVRTC_EXTRA (the settings NVRTC was opened with) is part of the options, hence of the
	 * key of the real source; so is the header the sources include */
	struct fa_diskcache_key plain, extra;
	fa_diskcache_key_for_spec(&plain, nv, &spec, NULL);
	const char *src1;
	size_t src1len;
	fa_kernel_source(&spec, &src1, &src1len);
	fa_nvrtc_options(nv, &spec, &o2);
	int major = 0, minor = 0;
	fa_nvrtc_version(nv, &major, &minor);
	fa_diskcache_key_make(&k, src1, src1len, &o2, major, minor);
	assert_memory_not_equal(&k, &plain, sizeof k); /* the header counts */
	if (!nv) {
		printf("NVRTC not available: the FA_NVRTC_EXTRA key check needs an NVRTC handle\n");
		return;
	}
	struct fa_kernel_settings ks = FA_KERNEL_SETTINGS_INIT;
	char e[256];
	assert_int_equal(fa_kernel_settings_set(&ks, "FA_NVRTC_EXTRA", "-DFA_FOLD=0", e, sizeof e),
	                 FA_OK);
	struct fa_nvrtc *nx = NULL;
	assert_int_equal(fa_nvrtc_open(&nx, &ks, e, sizeof e), FA_OK);
	fa_diskcache_key_for_spec(&extra, nx, &spec, &o2);
	fa_nvrtc_close(nx);
	assert_memory_not_equal(&plain, &extra, sizeof plain);
	assert_string_equal(o2.v[o2.n - 1], "-DFA_FOLD=0");
	fa_diskcache_key_for_spec(&k, nv, &spec, NULL);
	assert_memory_equal(&k, &plain, sizeof k);
}

/* Store the spec's entry, damage its file with `damage`, and check that a load rejects it
 * with FA_EPROTO and the reason, removes it, and that the next load is a plain miss. */
static void check_rejected(void (*damage)(const char *path, struct fa_diskcache *dc),
                           const char *reason)
{
	char dir[128], path[256], err[512];
	fresh_dir(dir, sizeof dir);
	struct fa_diskcache *dc = open_ok(dir, 0);
	struct fa_diskcache_key k;
	fa_diskcache_key_for_spec(&k, nv, &spec, NULL);
	store_ok(dc, &k);
	fa_diskcache_entry_path(dc, &k, path, sizeof path);
	damage(path, dc);

	void *data = (void *)1;
	size_t size = 1;
	bool hit = true;
	err[0] = 0;
	assert_int_equal(fa_diskcache_load(dc, &k, &data, &size, &hit, err, sizeof err), FA_EPROTO);
	assert_false(hit);
	assert_null(data);
	printf("rejected: %s\n", err);
	assert_non_null(strstr(err, reason));
	assert_non_null(strstr(err, "removed"));
	assert_false(exists(path));
	assert_int_equal(fa_diskcache_load(dc, &k, &data, &size, &hit, err, sizeof err), FA_OK);
	assert_false(hit);
	fa_diskcache_close(dc);
}

static void truncate_file(const char *path, struct fa_diskcache *dc)
{
	(void)dc;
	assert_int_equal(truncate(path, FA_DISKCACHE_HEADER_BYTES + (off_t)payload_size / 2), 0);
}

static void flip_payload_byte(const char *path, struct fa_diskcache *dc)
{
	(void)dc;
	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	uint8_t c;
	off_t off = FA_DISKCACHE_HEADER_BYTES + (off_t)payload_size / 3;
	assert_int_equal(pread(fd, &c, 1, off), 1);
	c ^= 0x10;
	assert_int_equal(pwrite(fd, &c, 1, off), 1);
	close(fd);
}

static void break_magic(const char *path, struct fa_diskcache *dc)
{
	(void)dc;
	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, "ELF", 3, 0), 3);
	close(fd);
}

/* Another key's (valid) file copied under this key's name. */
static void other_keys_file(const char *path, struct fa_diskcache *dc)
{
	struct fa_diskcache_key k2;
	char p2[256];
	key_n(&k2, 7);
	store_ok(dc, &k2);
	fa_diskcache_entry_path(dc, &k2, p2, sizeof p2);
	assert_int_equal(rename(p2, path), 0);
}

static void test_diskcache_rejects_and_removes_a_truncated_file(void **state)
{
	(void)state;
	check_rejected(truncate_file, "truncated");
}

static void test_diskcache_rejects_and_removes_a_flipped_payload_byte(void **state)
{
	(void)state;
	check_rejected(flip_payload_byte, "checksum mismatch");
}

static void test_diskcache_rejects_and_removes_a_wrong_magic(void **state)
{
	(void)state;
	check_rejected(break_magic, "wrong magic");
}

static void test_diskcache_rejects_and_removes_another_keys_file_under_this_name(void **state)
{
	(void)state;
	check_rejected(other_keys_file, "another key");
}

static void test_diskcache_concurrent_writers_leave_one_valid_file(void **state)
{
	(void)state;
	char dir[128], err[512];
	fresh_dir(dir, sizeof dir);
	struct fa_diskcache *dc = open_ok(dir, 0);
	struct fa_diskcache_key k;
	fa_diskcache_key_for_spec(&k, nv, &spec, NULL);
	pid_t pids[4];
	for (int i = 0; i < 4; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			/* Each child: its own handle (another daemon), 25 stores racing the others and
			 * loads in between that must never see a torn file. */
			struct fa_diskcache *c = NULL;
			char e[512];
			if (fa_diskcache_open(&c, dir, 0, e, sizeof e) != FA_OK)
				_exit(2);
			for (int j = 0; j < 25; j++) {
				void *d = NULL;
				size_t n = 0;
				bool hit;
				if (fa_diskcache_store(c, &k, "race", payload, payload_size, e, sizeof e))
					_exit(3);
				if (fa_diskcache_load(c, &k, &d, &n, &hit, e, sizeof e) != FA_OK || !hit ||
				    n != payload_size || memcmp(d, payload, n) != 0)
					_exit(4);
				free(d);
			}
			fa_diskcache_close(c);
			_exit(0);
		}
	}
	for (int i = 0; i < 4; i++)
		assert_int_equal(fa_test_waitpid(pids[i], fa_test_ms(20000)), 0);
	assert_int_equal(count_files(fa_diskcache_path(dc), ""), 1);
	void *data = NULL;
	size_t size = 0;
	bool hit = false;
	assert_int_equal(fa_diskcache_load(dc, &k, &data, &size, &hit, err, sizeof err), FA_OK);
	assert_true(hit);
	assert_int_equal(size, payload_size);
	assert_memory_equal(data, payload, size);
	free(data);
	fa_diskcache_close(dc);
}

static void test_diskcache_is_disabled_under_a_regular_file(void **state)
{
	(void)state;
	char file[128], dir[160], err[512];
	snprintf(file, sizeof file, "%s/plain-file", root);
	int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	close(fd);
	snprintf(dir, sizeof dir, "%s/cache", file);
	struct fa_diskcache *dc = (struct fa_diskcache *)1;
	err[0] = 0;
	assert_int_equal(fa_diskcache_open(&dc, dir, 0, err, sizeof err), FA_ESYS);
	assert_null(dc);
	printf("%s\n", err);
	assert_non_null(strstr(err, "kernel cache disabled"));
	assert_non_null(strstr(err, file));
}

static void test_diskcache_is_disabled_in_a_read_only_directory(void **state)
{
	(void)state;
	if (geteuid() == 0) {
		printf("skipped: running as root, which ignores directory modes (the regular-file "
		       "case covers the refusal)\n");
		skip();
	}
	char dir[128], kdir[160], err[512];
	fresh_dir(dir, sizeof dir);
	snprintf(kdir, sizeof kdir, "%s/kernels", dir);
	assert_int_equal(mkdir(dir, 0750), 0);
	assert_int_equal(mkdir(kdir, 0500), 0);
	struct fa_diskcache *dc = NULL;
	assert_int_equal(fa_diskcache_open(&dc, dir, 0, err, sizeof err), FA_ESYS);
	assert_null(dc);
	printf("%s\n", err);
	assert_non_null(strstr(err, "not writable"));
	chmod(kdir, 0700);
}

static void test_diskcache_refuses_a_directory_writable_by_everyone(void **state)
{
	(void)state;
	char dir[128], kdir[160], err[512];
	fresh_dir(dir, sizeof dir);
	snprintf(kdir, sizeof kdir, "%s/kernels", dir);
	assert_int_equal(mkdir(dir, 0750), 0);
	assert_int_equal(mkdir(kdir, 0750), 0);
	assert_int_equal(chmod(kdir, 0777), 0);
	struct fa_diskcache *dc = NULL;
	assert_int_equal(fa_diskcache_open(&dc, dir, 0, err, sizeof err), FA_EPERM);
	assert_null(dc);
	assert_non_null(strstr(err, "writable by every user"));
}

static void test_diskcache_prunes_least_recently_used_entries_beyond_the_bound(void **state)
{
	(void)state;
	char dir[128], p[4][256], err[512];
	fresh_dir(dir, sizeof dir);
	uint64_t entry = FA_DISKCACHE_HEADER_BYTES + payload_size;
	struct fa_diskcache *dc = open_ok(dir, entry * 5 / 2); /* room for two entries */
	struct fa_diskcache_key k[4];
	for (int i = 0; i < 4; i++) {
		key_n(&k[i], i);
		fa_diskcache_entry_path(dc, &k[i], p[i], sizeof p[i]);
	}
	store_ok(dc, &k[0]);
	set_mtime(p[0], 1000000000);
	store_ok(dc, &k[1]);
	set_mtime(p[1], 1000000100);
	/* Using entry 1 makes entry 0 the least recently used. */
	void *data = NULL;
	size_t size;
	bool hit;
	assert_int_equal(fa_diskcache_load(dc, &k[0], &data, &size, &hit, err, sizeof err), FA_OK);
	assert_true(hit);
	free(data);
	store_ok(dc, &k[2]);
	assert_true(exists(p[0]));
	assert_false(exists(p[1]));
	assert_true(exists(p[2]));
	store_ok(dc, &k[3]);
	assert_true(exists(p[3])); /* the entry just stored is never the one pruned */
	uint64_t files = 0, bytes = 0;
	assert_int_equal(fa_diskcache_prune(dc, 0, &files, &bytes, err, sizeof err), FA_OK);
	assert_int_equal(files, 2);
	assert_true(bytes <= entry * 5 / 2);
	/* An explicit bound of one byte empties it; files that are not entries stay. */
	char other[256];
	snprintf(other, sizeof other, "%s/README", fa_diskcache_path(dc));
	int fd = open(other, O_WRONLY | O_CREAT, 0640);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(fa_diskcache_prune(dc, 1, &files, &bytes, err, sizeof err), FA_OK);
	assert_int_equal(files, 0);
	assert_int_equal(bytes, 0);
	assert_int_equal(count_files(fa_diskcache_path(dc), ""), 1);
	assert_true(exists(other));
	fa_diskcache_close(dc);
}

static void test_diskcache_open_removes_stale_temporary_files_only(void **state)
{
	(void)state;
	char dir[128], kdir[160], stale[256], fresh[256];
	fresh_dir(dir, sizeof dir);
	struct fa_diskcache *dc = open_ok(dir, 0);
	fa_diskcache_close(dc);
	snprintf(kdir, sizeof kdir, "%s/kernels", dir);
	snprintf(stale, sizeof stale, "%s/.tmp.dead.1.2.3", kdir);
	snprintf(fresh, sizeof fresh, "%s/.tmp.live.1.2.3", kdir);
	for (int i = 0; i < 2; i++) {
		int fd = open(i ? fresh : stale, O_WRONLY | O_CREAT, 0640);
		assert_true(fd >= 0);
		close(fd);
	}
	set_mtime(stale, time(NULL) - 3600);
	dc = open_ok(dir, 0);
	assert_false(exists(stale));
	assert_true(exists(fresh)); /* a writer may be busy with it */
	fa_diskcache_close(dc);
}

static void test_precompile_fills_the_cache_and_a_second_run_compiles_nothing(void **state)
{
	(void)state;
	if (!nv) {
		printf("skipped: NVRTC not available: %s\n", nv_err);
		skip();
	}
	char dir[128], err[2048];
	fresh_dir(dir, sizeof dir);
	struct fa_diskcache *dc = open_ok(dir, 0);
	int compiled = -1, cached = -1;
	assert_int_equal(fa_diskcache_precompile(dc, nv, &spec, 1, &compiled, &cached, err,
	                                         sizeof err), FA_OK);
	assert_int_equal(compiled, 1);
	assert_int_equal(cached, 0);
	assert_int_equal(fa_diskcache_precompile(dc, nv, &spec, 1, &compiled, &cached, err,
	                                         sizeof err), FA_OK);
	assert_int_equal(compiled, 0);
	assert_int_equal(cached, 1);

	/* what the GPU's compile path does on a warm restart: load, no NVRTC */
	struct fa_diskcache *dc2 = open_ok(dir, 0);
	struct fa_cubin_info info;
	void *cubin = NULL;
	size_t size = 0;
	assert_int_equal(fa_kernel_cubin(nv, dc2, &spec, &cubin, &size, &info, err, sizeof err),
	                 FA_OK);
	assert_true(info.from_disk);
	assert_false(info.compiled);
	assert_int_equal(info.disk_errors, 0);
	assert_true(size > 0);
	free(cubin);
	fa_diskcache_close(dc2);
	fa_diskcache_close(dc);
}

static void test_kernel_cubin_compiles_when_the_cache_breaks_after_open(void **state)
{
	(void)state;
	if (!nv) {
		printf("skipped: NVRTC not available: %s\n", nv_err);
		skip();
	}
	char dir[128], kdir[160], err[2048];
	fresh_dir(dir, sizeof dir);
	struct fa_diskcache *dc = open_ok(dir, 0);
	/* kernels/ replaced by a regular file: every read and write fails, even for root. */
	snprintf(kdir, sizeof kdir, "%s/kernels", dir);
	assert_int_equal(rmdir(kdir), 0);
	int fd = open(kdir, O_WRONLY | O_CREAT, 0640);
	assert_true(fd >= 0);
	close(fd);
	struct fa_cubin_info info;
	void *cubin = NULL;
	size_t size = 0;
	assert_int_equal(fa_kernel_cubin(nv, dc, &spec, &cubin, &size, &info, err, sizeof err),
	                 FA_OK);
	assert_true(info.compiled);
	assert_false(info.from_disk);
	assert_false(info.stored);
	assert_int_equal(info.disk_errors, 2);
	printf("disk: %s\n", info.disk_msg);
	assert_non_null(strstr(info.disk_msg, kdir));
	assert_true(size > 0);
	free(cubin);
	fa_diskcache_close(dc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sha256_matches_the_fips_vectors),
		cmocka_unit_test(test_diskcache_round_trip_returns_the_stored_cubin),
		cmocka_unit_test(test_diskcache_key_changes_with_source_options_arch_and_version),
		cmocka_unit_test(test_diskcache_rejects_and_removes_a_truncated_file),
		cmocka_unit_test(test_diskcache_rejects_and_removes_a_flipped_payload_byte),
		cmocka_unit_test(test_diskcache_rejects_and_removes_a_wrong_magic),
		cmocka_unit_test(test_diskcache_rejects_and_removes_another_keys_file_under_this_name),
		cmocka_unit_test(test_diskcache_concurrent_writers_leave_one_valid_file),
		cmocka_unit_test(test_diskcache_is_disabled_under_a_regular_file),
		cmocka_unit_test(test_diskcache_is_disabled_in_a_read_only_directory),
		cmocka_unit_test(test_diskcache_refuses_a_directory_writable_by_everyone),
		cmocka_unit_test(test_diskcache_prunes_least_recently_used_entries_beyond_the_bound),
		cmocka_unit_test(test_diskcache_open_removes_stale_temporary_files_only),
		cmocka_unit_test(test_precompile_fills_the_cache_and_a_second_run_compiles_nothing),
		cmocka_unit_test(test_kernel_cubin_compiles_when_the_cache_breaks_after_open),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
