/* fa_demo.c - the whole system at work: a daemon on a private socket, four client processes at
 * once doing attention on different kinds of shapes, every result checked against the float64
 * reference, and a table of what each saw. Every tenth request each client also takes a training
 * step: the forward with lse, then the backward pass (fa_attn_bwd), its gradients checked against
 * the float64 oracle.
 *
 *   fa_demo [--dir DIR] [--clients N] [--requests M] [--seed S]
 *
 * Started by `make demo` through tests/demo/run-demo.sh, which makes DIR with mktemp -d. The
 * daemon is $FA_BUILD/fa-daemon (default build/). Exits non-zero on any wrong result, failed call
 * or unclean daemon exit.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fa_bwd_case.h"
#include "fa_integ.h"

#define MAX_CLIENTS 16
#define MAX_REQUESTS 10000

/* What one client process reports to the parent, followed by `requests` latencies (doubles). */
struct report {
	int requests;     /* calls made */
	int wrong;        /* calls that failed or gave a wrong result */
	double max_err;   /* largest relative error seen */
	double call_s;    /* sum of the calls' round-trip times */
	double flops;     /* total floating-point operations asked for */
	int bwd_steps;    /* backward passes made (every tenth request) */
	int bwd_wrong;    /* of those, failed or wrong */
	double bwd_max_err; /* largest relative error of dq, dk, dv */
	double bwd_call_s;  /* the backward calls' round-trip times */
};

/* The training step of client `proc`: a small problem of its kind's dtype and mask. */
static void bwd_profile_case(int proc, uint64_t *rng, struct fa_case *c)
{
	static const fa_dtype dts[] = {FA_DTYPE_BF16, FA_DTYPE_FP16, FA_DTYPE_FP32, FA_DTYPE_BF16};
	static const fa_mask masks[] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT,
	                                FA_MASK_CAUSAL_TOP_LEFT, FA_MASK_CAUSAL_BOTTOM_RIGHT};
	*c = (struct fa_case){.dtype = dts[proc % 4], .B = 1, .Sq = fa_rand_range(rng, 16, 64),
	                      .Sk = fa_rand_range(rng, 16, 64), .Hq = 4, .Hkv = 2, .D = 64,
	                      .mask = masks[proc % 4], .bhsd = proc % 2 == 1};
}

/* One training step: forward (o, lse) and backward in buf, timed, checked; into r. */
static void bwd_step(fa_client *c, fa_buffer **buf, int proc, uint64_t *rng, struct report *r)
{
	struct fa_case cs;
	struct fa_bwd_layout l;
	fa_attn_fwd_args fa;
	fa_attn_bwd_args ba;
	char why[256] = "", desc[256];
	double err[3] = {0};
	bwd_profile_case(proc, rng, &cs);
	fa_bwd_layout(&cs, &l);
	fa_status st = fa_integ_buffer(c, buf, l.total);
	if (st == FA_OK) {
		fa_bwd_fill(&cs, &l, fa_buffer_data(*buf), rng);
		fa_bwd_args(&cs, &l, *buf, 0, &fa, &ba);
		st = fa_attn_fwd(c, &fa);
	}
	if (st == FA_OK) {
		uint64_t t0 = fa_test_now_us();
		st = fa_attn_bwd(c, &ba);
		r->bwd_call_s += (double)(fa_test_now_us() - t0) * 1e-6;
	}
	r->bwd_steps++;
	if (st != FA_OK)
		snprintf(why, sizeof why, "%s (%s)", fa_status_name(st), fa_last_error_detail());
	if (st != FA_OK || !fa_bwd_check(&cs, &l, fa_buffer_data(*buf), 0, err, why, sizeof why)) {
		r->bwd_wrong++;
		fa_case_describe(&cs, desc, sizeof desc);
		fprintf(stderr, "client %d backward WRONG: %s\n    %s\n", proc, why, desc);
	}
	for (int i = 0; i < 3; i++)
		if (err[i] > r->bwd_max_err)
			r->bwd_max_err = err[i];
}

/* The kinds of work the four clients do. */
static const char *const profile_names[] = {"decode bf16 GQA4", "prefill fp16 causal",
                                            "fp32 bhsd causal-tl", "random mix"};

/* A case of client `proc`'s kind. */
static void profile_case(int proc, uint64_t *rng, struct fa_case *c)
{
	static const int64_t dims32[] = {40, 128};
	memset(c, 0, sizeof *c);
	switch (proc % 4) {
	case 0: /* one new token against a KV cache */
		*c = (struct fa_case){.dtype = FA_DTYPE_BF16, .B = fa_rand_range(rng, 1, 4), .Sq = 1,
		                      .Sk = fa_rand_range(rng, 64, 1024), .Hq = 8, .Hkv = 2, .D = 128,
		                      .lse = true};
		break;
	case 1: /* a prompt, causal, bottom-right */
		c->dtype = FA_DTYPE_FP16;
		c->B = 1;
		c->Sq = c->Sk = fa_rand_range(rng, 32, 192);
		c->Hq = c->Hkv = 4;
		c->D = 64;
		c->mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
		break;
	case 2: /* fp32, [B, H, S, D] memory, PyTorch's causal alignment */
		c->dtype = FA_DTYPE_FP32;
		c->precision = FA_PREC_IEEE;
		c->B = 1;
		c->Sq = fa_rand_range(rng, 16, 96);
		c->Sk = fa_rand_range(rng, 16, 160);
		c->Hq = 4;
		c->Hkv = 1;
		c->D = dims32[fa_rand_range(rng, 0, 1)];
		c->mask = FA_MASK_CAUSAL_TOP_LEFT;
		c->bhsd = true;
		c->lse = true;
		break;
	default:
		fa_case_random(c, rng, 192, 3e6);
		break;
	}
}

/* One client process: M requests, each timed and then checked. Writes its report to fd. */
static int client_main(int proc, const char *url, int requests, uint64_t seed, int fd)
{
	struct report r;
	double *lat = calloc((size_t)requests, sizeof *lat);
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	uint64_t rng = seed * 1000003u + (uint64_t)proc;
	memset(&r, 0, sizeof r);
	if (!lat || fa_client_open(&c, url) != FA_OK) {
		fprintf(stderr, "client %d: cannot connect: %s\n", proc, fa_last_error_detail());
		return 2;
	}
	for (int i = 0; i < requests; i++) {
		struct fa_case cs;
		struct fa_case_layout l;
		fa_attn_fwd_args a;
		char why[256], desc[256];
		double err = 0;
		profile_case(proc, &rng, &cs);
		fa_case_layout(&cs, &l);
		fa_status st = fa_integ_buffer(c, &buf, l.total);
		if (st == FA_OK) {
			fa_case_fill(&cs, &l, fa_buffer_data(buf), &rng);
			fa_case_args(&cs, &l, buf, &a);
			uint64_t t0 = fa_test_now_us();
			st = fa_attn_fwd(c, &a);
			lat[i] = (double)(fa_test_now_us() - t0);
		}
		r.requests++;
		r.call_s += lat[i] * 1e-6;
		r.flops += fa_case_flops(&cs);
		bool ok = st == FA_OK &&
		          fa_case_check(&cs, &l, fa_buffer_data(buf), &err, why, sizeof why);
		if (st != FA_OK)
			snprintf(why, sizeof why, "%s (%s)", fa_status_name(st), fa_last_error_detail());
		if (!ok) {
			r.wrong++;
			fa_case_describe(&cs, desc, sizeof desc);
			fprintf(stderr, "client %d request %d WRONG: %s\n    %s\n", proc, i, why, desc);
		}
		if (err > r.max_err)
			r.max_err = err;
		if (i % 10 == 0)
			bwd_step(c, &buf, proc, &rng, &r);
	}
	fa_buffer_free(buf);
	fa_client_close(c);
	fa_test_write_all(fd, &r, sizeof r);
	fa_test_write_all(fd, lat, (size_t)requests * sizeof *lat);
	free(lat);
	return r.wrong || r.bwd_wrong ? 1 : 0;
}

static void usage(const char *argv0)
{
	fprintf(stderr, "usage: %s [--dir DIR] [--clients N] [--requests M] [--seed S]\n", argv0);
}

int main(int argc, char **argv)
{
	const char *dir = NULL;
	int nclients = 4, requests = 100;
	uint64_t seed = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--dir") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--clients") && i + 1 < argc)
			nclients = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--requests") && i + 1 < argc)
			requests = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
			seed = strtoull(argv[++i], NULL, 10);
		else {
			usage(argv[0]);
			return 2;
		}
	}
	if (nclients < 1 || nclients > MAX_CLIENTS || requests < 1 || requests > MAX_REQUESTS) {
		usage(argv[0]);
		return 2;
	}

	/* The daemon, on a socket in DIR (or a private directory of its own). */
	struct fa_daemon d;
	char sock[FA_TEST_PATH_MAX];
	int r;
	if (dir) {
		if ((size_t)snprintf(sock, sizeof sock, "%s/fa.sock", dir) >= sizeof sock) {
			fprintf(stderr, "fa_demo: --dir path too long for a socket\n");
			return 2;
		}
		r = daemon_start_at(&d, sock, NULL);
	} else {
		r = daemon_start(&d, NULL);
	}
	if (r != 0) {
		fprintf(stderr, "fa_demo: the daemon did not start (%d, exit status %d)\n", r, d.status);
		daemon_log_dump(&d, 30);
		daemon_cleanup(&d);
		return 1;
	}
	char text[16384], backend[32] = "?", threads[32] = "?", version[32] = "?";
	uint64_t compute_us0 = 0, compute_us1 = 0;
	if (fa_integ_stats(d.url, text, sizeof text) == FA_OK) {
		fa_stats_get(text, "backend", backend, sizeof backend);
		fa_stats_get(text, "threads", threads, sizeof threads);
		fa_stats_get(text, "version", version, sizeof version);
		fa_stats_u64(text, "fwd_compute_us_total", &compute_us0);
	}
	printf("fa demo: fa-daemon %s (pid %d) on %s\n", version, (int)d.pid, d.sock);
	printf("backend: %s (%s threads); %d client processes x %d requests, checked against the "
	       "float64 reference\n\n",
	       backend, threads, nclients, requests);
	fflush(stdout);

	/* The clients, all at once. */
	pid_t pids[MAX_CLIENTS];
	int fds[MAX_CLIENTS];
	uint64_t t0 = fa_test_now_us();
	for (int p = 0; p < nclients; p++) {
		int pf[2];
		if (pipe(pf) != 0)
			return 1;
		fflush(stdout);
		fflush(stderr);
		pids[p] = fork();
		if (pids[p] < 0)
			return 1;
		if (pids[p] == 0) {
			close(pf[0]);
			_exit(client_main(p, d.url, requests, seed, pf[1]));
		}
		close(pf[1]);
		fds[p] = pf[0];
	}
	struct report rep[MAX_CLIENTS];
	double *all = calloc((size_t)nclients * (size_t)requests, sizeof *all);
	double *mine = calloc((size_t)requests, sizeof *mine);
	int failed = 0, nall = 0;
	for (int p = 0; p < nclients; p++) {
		memset(&rep[p], 0, sizeof rep[p]);
		int timeout = fa_test_ms(600000);
		if (fa_test_read_full(fds[p], &rep[p], sizeof rep[p], timeout) != 0 ||
		    fa_test_read_full(fds[p], all + nall, (size_t)requests * sizeof *all, timeout) != 0) {
			fprintf(stderr, "fa_demo: client %d sent no report\n", p);
			rep[p].wrong = requests;
			failed = 1;
		} else {
			nall += requests;
		}
		close(fds[p]);
		int code = fa_test_waitpid(pids[p], fa_test_ms(60000));
		if (code != 0) {
			fprintf(stderr, "fa_demo: client %d exited with %d\n", p, code);
			failed = 1;
		}
	}
	double wall_s = (double)(fa_test_now_us() - t0) * 1e-6;
	if (fa_integ_stats(d.url, text, sizeof text) == FA_OK)
		fa_stats_u64(text, "fwd_compute_us_total", &compute_us1);

	/* The table. */
	printf("%-4s %-22s %8s %10s %10s %12s %10s %9s\n", "proc", "workload", "requests", "p50 us",
	       "p99 us", "max rel err", "req/s", "GFLOP/s");
	int total_req = 0, total_wrong = 0;
	double total_flops = 0, max_err = 0;
	for (int p = 0; p < nclients; p++) {
		const struct report *x = &rep[p];
		memcpy(mine, all + (size_t)p * (size_t)requests, (size_t)requests * sizeof *mine);
		double p50 = fa_test_percentile(mine, (size_t)requests, 50);
		double p99 = fa_test_percentile(mine, (size_t)requests, 99);
		printf("%-4d %-22s %8d %10.0f %10.0f %12.2e %10.1f %9.3f%s\n", p, profile_names[p % 4],
		       x->requests, p50, p99, x->max_err, x->call_s > 0 ? x->requests / x->call_s : 0,
		       x->call_s > 0 ? x->flops / x->call_s * 1e-9 : 0,
		       x->wrong ? "  WRONG" : "");
		total_req += x->requests;
		total_wrong += x->wrong;
		total_flops += x->flops;
		if (x->max_err > max_err)
			max_err = x->max_err;
	}
	double p50 = fa_test_percentile(all, (size_t)nall, 50);
	double p99 = fa_test_percentile(all, (size_t)nall, 99);
	printf("%-4s %-22s %8d %10.0f %10.0f %12.2e %10.1f %9.3f\n", "all", "(wall clock)",
	       total_req, p50, p99, max_err, total_req / wall_s, total_flops / wall_s * 1e-9);
	int total_steps = 0;
	printf("\n%-4s %-22s %8s %12s %12s\n", "proc", "training step (bwd)", "steps", "mean us",
	       "max rel err");
	for (int p = 0; p < nclients; p++) {
		const struct report *x = &rep[p];
		static const char *const kinds[] = {"bf16 GQA2", "fp16 causal-br bhsd",
		                                    "fp32 causal-tl", "bf16 causal-br bhsd"};
		printf("%-4d %-22s %8d %12.0f %12.2e%s\n", p, kinds[p % 4], x->bwd_steps,
		       x->bwd_steps ? x->bwd_call_s / x->bwd_steps * 1e6 : 0, x->bwd_max_err,
		       x->bwd_wrong ? "  WRONG" : "");
		total_wrong += x->bwd_wrong;
		total_steps += x->bwd_steps;
	}
	printf("\nper process: rates over its own time in calls; all: over %.2f s of wall clock "
	       "with every client at once.\n",
	       wall_s);
	if (compute_us1 > compute_us0)
		printf("daemon compute time %.2f s: %.3f GFLOP/s on the %s backend.\n",
		       (double)(compute_us1 - compute_us0) * 1e-6,
		       total_flops / ((double)(compute_us1 - compute_us0) * 1e-6) * 1e-9, backend);
	free(all);
	free(mine);

	/* A clean stop. */
	int st = daemon_stop(&d);
	bool clean = daemon_log_clean(&d);
	printf("daemon stopped: exit status %d%s\n", st, clean ? "" : " (sanitizer report in its log)");
	if (st != 0)
		daemon_log_dump(&d, 30);
	daemon_cleanup(&d);
	if (dir)
		unlink(sock);
	if (total_wrong || failed || st != 0 || !clean) {
		printf("DEMO FAILED: %d wrong results\n", total_wrong);
		return 1;
	}
	printf("all %d results and %d training steps correct.\n", total_req, total_steps);
	return 0;
}
