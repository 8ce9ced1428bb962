/* bench_startup.c - how long a daemon takes to be READY, and what the first request of a new
 * kernel specialisation costs, with an empty and with a warm kernel cache (issue 4's benchmark
 * (c)). Prints figures; asserts only correctness.
 *
 * Three daemon starts share one --cache-dir: (1) an empty cache, (2) a warm restart, (3) a warm
 * restart again (the spread between 2 and 3 is the noise). Each start times READY (fork to the
 * READY=1 datagram), then one request of each of two shapes (a new specialisation each, on the
 * GPU), then the same shape again (the warm latency), and reads the kernel counters from STATS.
 * On the CPU backend there is nothing to compile: the figures then show the plain start-up.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa/fa_client.h"
#include "fa_case.h"
#include "fa_test.h"

#define RUNS 3

struct shape_result {
	double first_ms, second_ms;
};

struct run_result {
	double ready_ms;
	struct shape_result shape[2];
	uint64_t compiled, disk_loads;
	char backend[16];
};

/* One request of case c on a fresh buffer; returns its wall time in ms, or -1 on failure. */
static double one_request(fa_client *cl, const struct fa_case *c, uint64_t *rng, bool check)
{
	struct fa_case_layout l;
	fa_buffer *buf = NULL;
	fa_attn_fwd_args a;
	char why[256];
	double err = 0;

	fa_case_layout(c, &l);
	if (fa_buffer_alloc_host(cl, l.total, &buf) != FA_OK)
		return -1;
	fa_case_fill(c, &l, fa_buffer_data(buf), rng);
	fa_case_args(c, &l, buf, &a);
	uint64_t t0 = fa_test_now_us();
	fa_status st = fa_attn_fwd(cl, &a);
	double ms = (double)(fa_test_now_us() - t0) / 1000.0;
	if (st != FA_OK) {
		fprintf(stderr, "request failed: %s (%s)\n", fa_strerror(st), fa_last_error_detail());
		ms = -1;
	} else if (check && !fa_case_check(c, &l, fa_buffer_data(buf), &err, why, sizeof why)) {
		fprintf(stderr, "wrong result: %s\n", why);
		ms = -1;
	}
	fa_buffer_free(buf);
	return ms;
}

static int one_run(const char *cache_dir, struct run_result *r)
{
	const struct fa_case shapes[2] = {
		{.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 512, .Sk = 512, .Hq = 8, .Hkv = 8, .D = 128,
		 .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT},
		{.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 1, .Sk = 1024, .Hq = 16, .Hkv = 4, .D = 64},
	};
	struct fa_daemon d;
	fa_client *cl = NULL;
	uint64_t rng = 12345;
	char stats[16384];
	int rc = 1;

	memset(r, 0, sizeof(*r));
	uint64_t t0 = fa_test_now_us();
	if (daemon_start(&d, "--cache-dir", cache_dir, NULL) != 0) {
		fprintf(stderr, "daemon did not start\n");
		daemon_log_dump(&d, 40);
		daemon_cleanup(&d);
		return 1;
	}
	r->ready_ms = (double)(fa_test_now_us() - t0) / 1000.0;
	if (fa_client_open(&cl, d.url) != FA_OK)
		goto out;
	for (int i = 0; i < 2; i++) {
		r->shape[i].first_ms = one_request(cl, &shapes[i], &rng, true);
		r->shape[i].second_ms = one_request(cl, &shapes[i], &rng, false);
		if (r->shape[i].first_ms < 0 || r->shape[i].second_ms < 0)
			goto out;
	}
	if (fa_stats(cl, stats, sizeof stats) != FA_OK)
		goto out;
	fa_stats_u64(stats, "kernels_compiled", &r->compiled);
	fa_stats_u64(stats, "kernels_disk_loads", &r->disk_loads);
	if (!fa_stats_get(stats, "backend", r->backend, sizeof r->backend))
		strcpy(r->backend, "?");
	rc = 0;
out:
	fa_client_close(cl);
	if (daemon_stop(&d) != 0 && rc == 0) {
		fprintf(stderr, "daemon exit status %d\n", d.status);
		rc = 1;
	}
	daemon_cleanup(&d);
	return rc;
}

int main(void)
{
	char dir[64];
	struct run_result r[RUNS];
	static const char *const label[RUNS] = {"empty cache", "warm restart", "warm restart"};

	/* "Empty cache" must mean cold: NVRTC 12.9+ keeps its own cache of compiled programs
	 * where a driver is installed, which would serve a "new" specialisation compiled by an
	 * earlier run. The daemons started here inherit this. */
	setenv("CUDA_CACHE_DISABLE", "1", 1);
	if (fa_test_mkdir(dir, sizeof dir) != 0) {
		perror("mkdir");
		return 1;
	}
	for (int i = 0; i < RUNS; i++) {
		if (one_run(dir, &r[i]) != 0) {
			fa_test_rmdir(dir);
			return 1;
		}
	}
	fa_test_rmdir(dir);
	printf("daemon start-up and first requests (backend %s; shapes: A = bf16 B1 S512 H8 D128 "
	       "causal, B = fp16 decode Sq1 Sk1024 H16/4 D64; ms, wall clock through the client)\n",
	       r[0].backend);
	printf("%-14s %10s %10s %10s %10s %10s %10s %10s\n", "start", "READY", "A first", "A again",
	       "B first", "B again", "compiled", "disk");
	for (int i = 0; i < RUNS; i++)
		printf("%-14s %10.1f %10.2f %10.2f %10.2f %10.2f %10" PRIu64 " %10" PRIu64 "\n",
		       label[i], r[i].ready_ms, r[i].shape[0].first_ms, r[i].shape[0].second_ms,
		       r[i].shape[1].first_ms, r[i].shape[1].second_ms, r[i].compiled,
		       r[i].disk_loads);
	return 0;
}
