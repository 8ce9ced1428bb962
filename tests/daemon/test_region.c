/* test_region.c - shm regions: the name pattern, and the owner, size and existence checks on
 * real shm objects; unlink on close only when asked. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "dtest.h"
#include "log.h"
#include "region.h"

static void test_region_name_pattern(void **state)
{
	(void)state;
	assert_true(region_name_valid("/fa.1000.4242.0123456789abcdef"));
	assert_true(region_name_valid("/fa.0.1.ABCDEF0123456789"));
	assert_false(region_name_valid("fa.1000.4242.0123456789abcdef"));   /* no slash */
	assert_false(region_name_valid("/fb.1000.4242.0123456789abcdef"));
	assert_false(region_name_valid("/fa.1000.4242.0123456789abcde"));   /* 15 hex */
	assert_false(region_name_valid("/fa.1000.4242.0123456789abcdef0")); /* 17 hex */
	assert_false(region_name_valid("/fa.1000.4242.0123456789abcdeg"));
	assert_false(region_name_valid("/fa..4242.0123456789abcdef"));
	assert_false(region_name_valid("/fa.10a0.4242.0123456789abcdef"));
	assert_false(region_name_valid("/fa.1000.4242/0123456789abcdef"));
	assert_false(region_name_valid("/fa.1000.4242.01234567/9abcdef"));
	assert_false(region_name_valid("/fa.12345678901.1.0123456789abcdef")); /* 11 digits */
	assert_false(region_name_valid("/fa.1000.4242.0123456789abcdef/"));
	assert_false(region_name_valid("/../fa.1.1.0123456789abcdef"));
	assert_false(region_name_valid(""));
}

static void test_region_maps_a_clients_object(void **state)
{
	char name[FA_PROTO_SHM_NAME_MAX], err[256];
	struct region *r;
	unsigned n0 = region_count();
	uint64_t b0 = region_bytes();
	(void)state;

	assert_int_equal(dtest_shm_create(name, 8192), 0);
	assert_int_equal(region_open_shm(&r, name, 4096, getuid(), UINT64_MAX, err, sizeof err),
	                 FA_OK);
	assert_int_equal(region_count(), n0 + 1);
	assert_true(region_bytes() == b0 + 4096);
	/* Shared: what the daemon writes the client sees. */
	((char *)r->base)[100] = 42;
	int fd = shm_open(name, O_RDONLY, 0);
	char c = 0;
	assert_int_equal(pread(fd, &c, 1, 100), 1);
	assert_int_equal(c, 42);
	close(fd);
	/* Unregistering unmaps but leaves the object to its owner. */
	region_unref(r);
	assert_int_equal(region_count(), n0);
	assert_true(dtest_shm_exists(name));
	shm_unlink(name);
}

static void test_region_unlinks_only_when_the_session_died(void **state)
{
	char name[FA_PROTO_SHM_NAME_MAX], err[256];
	struct region *r;
	(void)state;

	assert_int_equal(dtest_shm_create(name, 4096), 0);
	assert_int_equal(region_open_shm(&r, name, 4096, getuid(), UINT64_MAX, err, sizeof err),
	                 FA_OK);
	region_ref(r); /* a running request */
	r->unlink = true;
	region_unref(r); /* the session's reference */
	assert_true(dtest_shm_exists(name)); /* still mapped by the request */
	region_unref(r);
	assert_false(dtest_shm_exists(name));
}

static void test_region_refuses_bad_names_sizes_and_missing_objects(void **state)
{
	char name[FA_PROTO_SHM_NAME_MAX], err[256];
	struct region *r;
	(void)state;

	assert_int_equal(region_open_shm(&r, "/etc/passwd", 16, getuid(), UINT64_MAX, err,
	                                 sizeof err),
	                 FA_EINVAL);
	assert_non_null(strstr(err, "is not of the form /fa.<uid>.<pid>.<16 hex digits>"));
	assert_null(r);

	assert_int_equal(region_open_shm(&r, "/fa.1.2.0000000000000000", 16, getuid(), UINT64_MAX,
	                                 err, sizeof err),
	                 FA_EINVAL);
	assert_non_null(strstr(err, "does not exist"));

	assert_int_equal(dtest_shm_create(name, 4096), 0);
	assert_int_equal(region_open_shm(&r, name, 0, getuid(), UINT64_MAX, err, sizeof err),
	                 FA_EINVAL);
	assert_non_null(strstr(err, "size is 0"));
	assert_int_equal(region_open_shm(&r, name, 4096, getuid(), 1024, err, sizeof err),
	                 FA_EINVAL);
	assert_non_null(strstr(err, "--max-region-bytes"));
	/* Smaller than declared: the daemon would fault reading past its end. */
	assert_int_equal(region_open_shm(&r, name, 8192, getuid(), UINT64_MAX, err, sizeof err),
	                 FA_ERANGE);
	assert_non_null(strstr(err, "has 4096 bytes, the registration declares 8192"));
	shm_unlink(name);
}

static void test_region_refuses_another_uids_object(void **state)
{
	char name[FA_PROTO_SHM_NAME_MAX], err[256];
	struct region *r;
	(void)state;

	assert_int_equal(dtest_shm_create(name, 4096), 0);
	/* The object is ours; a connection from another uid must not reach it. */
	assert_int_equal(region_open_shm(&r, name, 4096, getuid() + 1, UINT64_MAX, err, sizeof err),
	                 FA_EPERM);
	assert_non_null(strstr(err, "belongs to uid"));
	assert_null(r);
	shm_unlink(name);

	if (getuid() != 0) {
		print_message("skip part: chown of a shm object needs root\n");
		return;
	}
	/* Root's view: an object owned by nobody, requested by a root connection. */
	assert_int_equal(dtest_shm_create(name, 4096), 0);
	int fd = shm_open(name, O_RDWR, 0);
	assert_true(fd >= 0);
	assert_int_equal(fchown(fd, 65534, 65534), 0);
	close(fd);
	assert_int_equal(region_open_shm(&r, name, 4096, 0, UINT64_MAX, err, sizeof err), FA_EPERM);
	assert_non_null(strstr(err, "belongs to uid 65534, not to the connection's uid 0"));
	shm_unlink(name);
}

static void test_region_does_not_follow_links(void **state)
{
	char name[FA_PROTO_SHM_NAME_MAX], target[FA_PROTO_SHM_NAME_MAX], lpath[128], tpath[128];
	char err[256];
	struct region *r;
	(void)state;

	assert_int_equal(dtest_shm_create(target, 4096), 0);
	assert_int_equal(dtest_shm_create(name, 16), 0);
	shm_unlink(name);
	snprintf(lpath, sizeof lpath, "/dev/shm%s", name);
	snprintf(tpath, sizeof tpath, "/dev/shm%s", target);
	if (symlink(tpath, lpath) != 0) {
		shm_unlink(target);
		skip();
	}
	assert_int_equal(region_open_shm(&r, name, 4096, getuid(), UINT64_MAX, err, sizeof err),
	                 FA_EPERM);
	unlink(lpath);
	shm_unlink(target);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_region_name_pattern),
		cmocka_unit_test(test_region_maps_a_clients_object),
		cmocka_unit_test(test_region_unlinks_only_when_the_session_died),
		cmocka_unit_test(test_region_refuses_bad_names_sizes_and_missing_objects),
		cmocka_unit_test(test_region_refuses_another_uids_object),
		cmocka_unit_test(test_region_does_not_follow_links),
	};
	log_level = FA_LOG_ERR;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
