/* test_attn_bwd.c - the backward pass end to end through a real daemon on the CPU backend:
 * gradients from several client processes at once against the float64 oracle on odd shapes
 * (Sq != Sk, GQA and MQA, every mask, fp16/bf16/fp32, BSHD and BHSD, padded rows), outputs
 * poisoned first; the deterministic flag; and the bad-input catalogue of the backward, through
 * the API and as raw requests past the client's checks, each with its status and detail and
 * nothing written. At the end the daemon exits 0 on SIGTERM with a clean log.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <msgpack.h>

#include "fa_bwd_case.h"
#include "fa_integ.h"
#include "fa_raw.h"

#define SHM_SIZE (1u << 20) /* the raw session's region */
#define NPROCS 3            /* client processes computing at once */

static struct fa_daemon g_d;
static uint64_t g_rng = 0x5eed0bd5u;

/* The shapes every client process runs (each with its own random data). */
static const struct fa_case bwd_cases[] = {
	{.dtype = FA_DTYPE_FP32, .B = 2, .Sq = 17, .Sk = 33, .Hq = 4, .Hkv = 2, .D = 16},
	{.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 33, .Sk = 17, .Hq = 6, .Hkv = 2, .D = 24,
	 .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT, .bhsd = true}, /* 16 rows see no key */
	{.dtype = FA_DTYPE_FP16, .B = 2, .Sq = 9, .Sk = 40, .Hq = 3, .Hkv = 1, .D = 32,
	 .mask = FA_MASK_CAUSAL_TOP_LEFT, .scale = 0.3, .pad = 8}, /* MQA */
	{.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 1, .Sk = 65, .Hq = 4, .Hkv = 4, .D = 8,
	 .bhsd = true, .pad = 8, .precision = FA_PREC_IEEE}, /* one query row */
	{.dtype = FA_DTYPE_BF16, .B = 3, .Sq = 20, .Sk = 20, .Hq = 8, .Hkv = 2, .D = 64,
	 .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT},
	{.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 40, .Sk = 7, .Hq = 2, .Hkv = 2, .D = 40,
	 .mask = FA_MASK_CAUSAL_TOP_LEFT, .bhsd = true},
	{.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 31, .Sk = 29, .Hq = 4, .Hkv = 1, .D = 128,
	 .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT, .scale = -0.05},
	/* big enough for the CPU backend to cut it into 8 chunks of (batch, kv-head) pairs */
	{.dtype = FA_DTYPE_BF16, .B = 2, .Sq = 64, .Sk = 96, .Hq = 8, .Hkv = 4, .D = 64,
	 .mask = FA_MASK_CAUSAL_TOP_LEFT, .bhsd = true, .pad = 8},
};
#define NCASES (sizeof bwd_cases / sizeof bwd_cases[0])

/* The bound for the CPU backend against the oracle fed the O and lse it read: the gradients'
 * final rounding to the dtype, and no more. */
static double tight_tol(fa_dtype dt)
{
	return dt == FA_DTYPE_FP32 ? 1e-6 : dt == FA_DTYPE_BF16 ? 4e-3 : 1e-3;
}

/* One case: forward (o, lse) then backward through the daemon, then the check. */
static bool run_bwd_case(fa_client *c, fa_buffer **buf, const struct fa_case *cs, unsigned flags,
                         uint64_t *rng, double err[3], char *why, size_t whycap)
{
	struct fa_bwd_layout l;
	fa_attn_fwd_args fa;
	fa_attn_bwd_args ba;
	fa_bwd_layout(cs, &l);
	fa_status st = fa_integ_buffer(c, buf, l.total);
	if (st != FA_OK) {
		snprintf(why, whycap, "buffer of %zu: %s", l.total, fa_status_name(st));
		return false;
	}
	fa_bwd_fill(cs, &l, fa_buffer_data(*buf), rng);
	fa_bwd_args(cs, &l, *buf, flags, &fa, &ba);
	if ((st = fa_attn_fwd(c, &fa)) != FA_OK) {
		snprintf(why, whycap, "fa_attn_fwd: %s (%s)", fa_status_name(st), fa_last_error_detail());
		return false;
	}
	if ((st = fa_attn_bwd(c, &ba)) != FA_OK) {
		snprintf(why, whycap, "fa_attn_bwd: %s (%s)", fa_status_name(st), fa_last_error_detail());
		return false;
	}
	return fa_bwd_check(cs, &l, fa_buffer_data(*buf), tight_tol(cs->dtype), err, why, whycap);
}

/* A client process: every case, twice, with its own data; the number of failures. */
static int client_main(int id)
{
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	uint64_t rng = 0x1000u + (uint64_t)id * 7919u;
	int bad = 0;
	if (fa_client_open(&c, g_d.url) != FA_OK) {
		fprintf(stderr, "client %d: cannot open: %s\n", id, fa_last_error_detail());
		return 100;
	}
	fa_client_set_timeout(c, fa_test_ms(60000));
	for (int round = 0; round < 2; round++)
		for (size_t i = 0; i < NCASES; i++) {
			char why[256], desc[256];
			double err[3] = {0};
			const struct fa_case *cs = &bwd_cases[(i + (size_t)id) % NCASES];
			unsigned flags = round == 1 ? FA_BWD_DETERMINISTIC : 0;
			fa_case_describe(cs, desc, sizeof desc);
			if (!run_bwd_case(c, &buf, cs, flags, &rng, err, why, sizeof why)) {
				fprintf(stderr, "client %d: %s\n    case: %s\n", id, why, desc);
				bad++;
			} else if (id == 0 && round == 0) {
				fprintf(stderr, "  %-70.70s dq %.2e dk %.2e dv %.2e\n", desc, err[0], err[1],
				        err[2]);
			}
		}
	fa_buffer_free(buf);
	fa_client_close(c);
	return bad;
}

/* ---- setup ----------------------------------------------------------------------------------- */

static int setup(void **state)
{
	(void)state;
	if (daemon_start(&g_d, "--threads", "3", NULL) != 0) {
		daemon_log_dump(&g_d, 40);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	int failed = 0;
	int st = daemon_stop(&g_d);
	if (st != 0) {
		fprintf(stderr, "teardown: daemon exit status %d, want 0\n", st);
		daemon_log_dump(&g_d, 40);
		failed |= 1;
	}
	if (!daemon_log_clean(&g_d))
		failed |= 2;
	daemon_cleanup(&g_d);
	return failed ? -1 : 0;
}

/* ---- gradients ------------------------------------------------------------------------------- */

/* NPROCS processes at once, each every case with and without the deterministic flag: dQ, dK, dV
 * right, padding untouched, and the daemon counted every backward pass. Runs first: this
 * process holds no client while it forks. */
static void test_attn_bwd_gradients_match_the_reference_from_several_processes(void **state)
{
	(void)state;
	char text[16384];
	uint64_t before = 0, after = 0;
	assert_int_equal(fa_integ_stats(g_d.url, text, sizeof text), FA_OK);
	assert_true(fa_stats_u64(text, "bwd_total", &before));
	pid_t pid[NPROCS];
	fflush(stderr);
	for (int i = 0; i < NPROCS; i++) {
		pid[i] = fork();
		assert_true(pid[i] >= 0);
		if (pid[i] == 0)
			_exit(client_main(i));
	}
	int bad = 0;
	for (int i = 0; i < NPROCS; i++) {
		int code = fa_test_waitpid(pid[i], fa_test_ms(240000));
		if (code != 0) {
			fprintf(stderr, "client %d ended with %d\n", i, code);
			if (code < 0)
				kill(pid[i], SIGKILL);
			bad++;
		}
	}
	assert_int_equal(bad, 0);
	assert_int_equal(fa_integ_stats(g_d.url, text, sizeof text), FA_OK);
	assert_true(fa_stats_u64(text, "bwd_total", &after));
	assert_int_equal(after - before, NPROCS * 2 * NCASES);
}

/* The deterministic flag: the same inputs twice give the same bits (outputs poisoned again in
 * between); the CPU backend gives those bits without the flag too. */
static void test_attn_bwd_deterministic_flag_gives_identical_bits(void **state)
{
	(void)state;
	/* 4 (batch, kv-head) pairs of ~1.1M multiply-adds: 4 chunks on the 3 workers */
	const struct fa_case cs = {.dtype = FA_DTYPE_BF16, .B = 2, .Sq = 45, .Sk = 38, .Hq = 8,
	                           .Hkv = 2, .D = 64, .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT};
	struct fa_bwd_layout l;
	fa_attn_fwd_args fa;
	fa_attn_bwd_args ba;
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	char why[256];
	fa_bwd_layout(&cs, &l);
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	fa_client_set_timeout(c, fa_test_ms(60000));
	assert_int_equal(fa_buffer_alloc_host(c, l.total, &buf), FA_OK);
	char *data = fa_buffer_data(buf);
	fa_bwd_fill(&cs, &l, data, &g_rng);
	fa_bwd_args(&cs, &l, buf, FA_BWD_DETERMINISTIC, &fa, &ba);
	assert_int_equal(fa_attn_fwd(c, &fa), FA_OK);
	size_t grads = l.total - l.dq_off; /* dq, dk, dv and their padding */
	unsigned char *first = malloc(grads);
	assert_non_null(first);
	for (int run = 0; run < 3; run++) {
		fa_case_poison_dt(data + l.dq_off, cs.dtype, (size_t)l.f.q_span);
		fa_case_poison_dt(data + l.dk_off, cs.dtype, (size_t)l.f.kv_span);
		fa_case_poison_dt(data + l.dv_off, cs.dtype, (size_t)l.f.kv_span);
		ba.flags = run == 2 ? 0 : FA_BWD_DETERMINISTIC;
		assert_int_equal(fa_attn_bwd(c, &ba), FA_OK);
		if (run == 0) {
			assert_true(fa_bwd_check(&cs, &l, data, tight_tol(cs.dtype), NULL, why,
			                         sizeof why));
			memcpy(first, data + l.dq_off, grads);
		} else {
			assert_memory_equal(first, data + l.dq_off, grads);
		}
	}
	free(first);
	fa_buffer_free(buf);
	fa_client_close(c);
}

/* ---- bad input ------------------------------------------------------------------------------- */

/* A small good problem: fp16, GQA, causal, Sq != Sk. */
static void small_case(struct fa_case *cs, struct fa_bwd_layout *l)
{
	*cs = (struct fa_case){.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 16, .Sk = 24, .Hq = 4,
	                       .Hkv = 2, .D = 64, .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT};
	fa_bwd_layout(cs, l);
}

struct bad_case {
	const char *name;
	fa_status want;
	const char *needle; /* in the detail */
	bool raw;           /* also as a raw request (false: the encoder cannot express it) */
	void (*mutate)(fa_attn_bwd_args *a, const struct fa_bwd_layout *l, size_t region_size);
};

#define MUT(fn) static void fn(fa_attn_bwd_args *a, const struct fa_bwd_layout *l, size_t n)
#define UNUSED_MUT ((void)a, (void)l, (void)n)

MUT(mut_no_lse) { UNUSED_MUT; a->lse.buf = NULL; }
MUT(mut_lse_short) { UNUSED_MUT; a->lse.shape[2] -= 1; }
MUT(mut_lse_bshd) { UNUSED_MUT; a->lse.shape[1] = a->q.shape[1], a->lse.shape[2] = a->q.shape[2]; }
MUT(mut_lse_fp16) { UNUSED_MUT; a->lse.dtype = FA_DTYPE_FP16; }
MUT(mut_dq_bf16) { UNUSED_MUT; a->dq.dtype = FA_DTYPE_BF16; }
MUT(mut_dout_fp32) { UNUSED_MUT; a->dout.dtype = FA_DTYPE_FP32; }
MUT(mut_dk_short) { UNUSED_MUT; a->dk.shape[1] -= 1; }
MUT(mut_dout_heads) { UNUSED_MUT; a->dout.shape[2] = 2; }
MUT(mut_dv_past_end) { (void)l; a->dv.offset = n - 64; }
MUT(mut_dq_offset_past) { (void)l; a->dq.offset = n + 4096; }
MUT(mut_dq_strided_head_dim) { UNUSED_MUT; a->dq.stride[3] = 2; }
MUT(mut_dk_negative_stride) { UNUSED_MUT; a->dk.stride[1] = -1; }
MUT(mut_dq_odd_offset) { UNUSED_MUT; a->dq.offset += 1; }
MUT(mut_d12)
{
	UNUSED_MUT;
	fa_tensor *t[] = {&a->q, &a->k, &a->v, &a->o, &a->dout, &a->dq, &a->dk, &a->dv};
	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
		t[i]->shape[3] = 12;
}
MUT(mut_flags) { UNUSED_MUT; a->flags = 2; }
MUT(mut_priority) { UNUSED_MUT; a->priority = (fa_priority)3; }
MUT(mut_mask) { UNUSED_MUT; a->mask = (fa_mask)7; }
MUT(mut_dq_on_q) { (void)n; a->dq.offset = l->f.q_off; }
MUT(mut_dk_on_o) { (void)n; a->dk.offset = l->f.o_off; }
MUT(mut_dv_on_lse) { (void)n; a->dv.offset = l->f.lse_off; }
MUT(mut_dq_on_dout) { (void)n; a->dq.offset = l->do_off + 128; }
MUT(mut_dk_on_v) { (void)n; a->dk.offset = l->f.v_off; }
MUT(mut_dv_on_dk) { (void)n; a->dv.offset = l->dk_off; }
MUT(mut_dk_on_dq) { (void)n; a->dk.offset = l->dq_off; }

static const struct bad_case bad_cases[] = {
	{"lse missing", FA_EINVAL, "lse: no buffer", false, mut_no_lse},
	{"lse one row short", FA_ESHAPE, "lse: shape", true, mut_lse_short},
	{"lse laid out [B, Sq, Hq, 1]", FA_ESHAPE, "lse: shape", true, mut_lse_bshd},
	{"lse is fp16", FA_EDTYPE, "lse: dtype must be fp32", true, mut_lse_fp16},
	{"dq is bf16 while q is fp16", FA_EDTYPE, "dq: dtype bf16 differs from q's fp16", true,
	 mut_dq_bf16},
	{"dout is fp32", FA_EDTYPE, "dout: dtype fp32", true, mut_dout_fp32},
	{"dk shorter than k", FA_ESHAPE, "dk: shape", true, mut_dk_short},
	{"dout of two heads", FA_ESHAPE, "dout: shape", true, mut_dout_heads},
	{"dv past the buffer's end", FA_ERANGE, "dv: extent ends at byte", true, mut_dv_past_end},
	{"dq's offset past the buffer", FA_ERANGE, "dq: extent ends at byte", true,
	 mut_dq_offset_past},
	{"dq's head dim strided", FA_ESHAPE, "dq: stride[3] is 2", true, mut_dq_strided_head_dim},
	{"dk's stride negative", FA_EINVAL, "dk: stride[1] is -1", false, mut_dk_negative_stride},
	{"dq's offset odd for fp16", FA_EALIGN, "dq: offset", true, mut_dq_odd_offset},
	{"head dim 12", FA_ESHAPE, "head dim 12", true, mut_d12},
	{"unknown flag bits", FA_EINVAL, "flags 0x2", false, mut_flags},
	{"priority 3", FA_EINVAL, "priority 3 is not a priority class", false, mut_priority},
	{"mask 7", FA_EINVAL, "mask 7", false, mut_mask},
	{"dq is q", FA_EOVERLAP, "dq overlaps q", true, mut_dq_on_q},
	{"dk on o", FA_EOVERLAP, "dk overlaps o", true, mut_dk_on_o},
	{"dv on lse", FA_EOVERLAP, "dv overlaps lse", true, mut_dv_on_lse},
	{"dq inside dout", FA_EOVERLAP, "dq overlaps dout", true, mut_dq_on_dout},
	{"dk on v", FA_EOVERLAP, "dk overlaps v", true, mut_dk_on_v},
	{"dv is dk", FA_EOVERLAP, "dv overlaps dk", true, mut_dv_on_dk},
	{"dk is dq", FA_EOVERLAP, "dk overlaps dq", true, mut_dk_on_dq},
};
#define NBAD (sizeof bad_cases / sizeof bad_cases[0])

/* Every bad case through the API: its status, its detail, not a byte written; then the client
 * still computes right. */
static void test_attn_bwd_bad_input_through_api_gets_status_and_detail(void **state)
{
	(void)state;
	struct fa_case cs;
	struct fa_bwd_layout l;
	fa_attn_fwd_args fa;
	fa_attn_bwd_args ba;
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	char why[256];
	int wrong = 0;
	small_case(&cs, &l);
	size_t n = l.total;
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	fa_client_set_timeout(c, fa_test_ms(30000));
	assert_int_equal(fa_buffer_alloc_host(c, n, &buf), FA_OK);
	n = fa_buffer_size(buf);
	char *data = fa_buffer_data(buf);
	unsigned char *before = malloc(n);
	assert_non_null(before);
	fa_bwd_fill(&cs, &l, data, &g_rng);
	fa_bwd_args(&cs, &l, buf, 0, &fa, &ba);
	assert_int_equal(fa_attn_fwd(c, &fa), FA_OK);
	for (size_t i = 0; i < NBAD; i++) {
		fa_bwd_args(&cs, &l, buf, 0, &fa, &ba);
		bad_cases[i].mutate(&ba, &l, n);
		memcpy(before, data, n);
		fa_status st = fa_attn_bwd(c, &ba);
		const char *det = fa_last_error_detail();
		bool same = !memcmp(before, data, n);
		if (st != bad_cases[i].want || !strstr(det, bad_cases[i].needle) || !same) {
			fprintf(stderr, "api: %s: got %s, want %s with '%s'; detail '%s'%s\n",
			        bad_cases[i].name, fa_status_name(st), fa_status_name(bad_cases[i].want),
			        bad_cases[i].needle, det, same ? "" : "; THE BUFFER WAS WRITTEN");
			wrong++;
		}
	}
	free(before);
	assert_int_equal(wrong, 0);
	/* NULL arguments. */
	assert_int_equal(fa_attn_bwd(NULL, &ba), FA_EINVAL);
	assert_int_equal(fa_attn_bwd(c, NULL), FA_EINVAL);
	assert_non_null(strstr(fa_last_error_detail(), "args is NULL"));
	/* And the client still works. */
	fa_bwd_args(&cs, &l, buf, 0, &fa, &ba);
	assert_int_equal(fa_attn_bwd(c, &ba), FA_OK);
	assert_true(fa_bwd_check(&cs, &l, data, tight_tol(cs.dtype), NULL, why, sizeof why));
	fa_buffer_free(buf);
	fa_client_close(c);
}

/* ---- raw requests: the daemon's own checks ----------------------------------------------------- */

static int g_raw = -1;
static uint64_t g_sid, g_rid, g_seq = 5000;
static struct fa_raw_shm g_shm;

/* An ATTN_BWD of the raw session from API arguments, every tensor in region rid. */
static void raw_bwd_req(const fa_attn_bwd_args *a, uint64_t rid, struct fa_proto_req *req)
{
	memset(req, 0, sizeof *req);
	req->op = FA_OP_ATTN_BWD;
	req->session = g_sid;
	req->seq = g_seq++;
	fa_raw_tensor(&a->q, rid, &req->u.bwd.q);
	fa_raw_tensor(&a->k, rid, &req->u.bwd.k);
	fa_raw_tensor(&a->v, rid, &req->u.bwd.v);
	fa_raw_tensor(&a->o, rid, &req->u.bwd.o);
	fa_raw_tensor(&a->lse, rid, &req->u.bwd.lse);
	fa_raw_tensor(&a->dout, rid, &req->u.bwd.dout);
	fa_raw_tensor(&a->dq, rid, &req->u.bwd.dq);
	fa_raw_tensor(&a->dk, rid, &req->u.bwd.dk);
	fa_raw_tensor(&a->dv, rid, &req->u.bwd.dv);
	req->u.bwd.scale = a->scale;
	req->u.bwd.mask = (uint8_t)a->mask;
	req->u.bwd.precision = (uint8_t)a->precision;
	req->u.bwd.flags = a->flags & FA_BWD_DETERMINISTIC ? FA_PROTO_BWD_DETERMINISTIC : 0;
}

/* The raw session: its own connection, session and shm region (the good problem's O and lse
 * computed in it by a forward pass). */
static void raw_open(struct fa_case *cs, struct fa_bwd_layout *l, fa_attn_bwd_args *ba)
{
	struct fa_proto_rep rep;
	struct fa_proto_req req;
	fa_attn_fwd_args fa;
	g_raw = fa_raw_open(g_d.url, fa_test_ms(20000));
	assert_true(g_raw >= 0);
	g_sid = fa_raw_hello(g_raw, g_seq++, &rep);
	assert_true(g_sid != 0);
	assert_int_equal(fa_raw_shm_create(&g_shm, SHM_SIZE, &g_rng), 0);
	assert_int_equal(fa_raw_register(g_raw, g_sid, g_seq++, g_shm.name, SHM_SIZE, &g_rid, &rep),
	                 FA_OK);
	small_case(cs, l);
	fa_bwd_fill(cs, l, g_shm.map, &g_rng);
	fa_bwd_args(cs, l, FA_RAW_BUF, 0, &fa, ba);
	fa_raw_fwd_req(&fa, g_sid, g_seq++, g_rid, &req);
	assert_int_equal(fa_raw_call(g_raw, &req, &rep), FA_OK);
}

static void raw_close(void)
{
	nn_close(g_raw);
	g_raw = -1;
	fa_raw_shm_destroy(&g_shm);
}

/* A raw request that must be refused with want, the detail holding both needles, the region
 * left unwritten. */
static bool raw_refused_unwritten(const char *what, const struct fa_proto_req *req, int want,
                                  const char *needle, const char *needle2)
{
	struct fa_proto_rep rep;
	unsigned char *before = malloc(SHM_SIZE);
	assert_non_null(before);
	memcpy(before, g_shm.map, SHM_SIZE);
	int st = fa_raw_call(g_raw, req, &rep);
	bool same = !memcmp(before, g_shm.map, SHM_SIZE);
	free(before);
	bool ok = st == want && strstr(rep.detail, needle) && strstr(rep.detail, needle2) && same;
	if (!ok)
		fprintf(stderr, "raw: %s: got %d %s, want %s with '%s' and '%s'; detail '%s'%s\n", what,
		        st, st >= 0 ? fa_status_name((fa_status)st) : "",
		        fa_status_name((fa_status)want), needle, needle2, st >= 0 ? rep.detail : "",
		        same ? "" : "; THE REGION WAS WRITTEN");
	return ok;
}

/* The raw-expressible bad cases past the client's checks: the daemon's validation gives the same
 * status and detail, and writes nothing. */
static void test_attn_bwd_bad_input_reaches_daemon_checks(void **state)
{
	(void)state;
	struct fa_case cs;
	struct fa_bwd_layout l;
	fa_attn_bwd_args good, a;
	struct fa_proto_req req;
	struct fa_proto_rep rep;
	char why[256];
	int wrong = 0;
	raw_open(&cs, &l, &good);
	for (size_t i = 0; i < NBAD; i++) {
		if (!bad_cases[i].raw)
			continue;
		a = good;
		bad_cases[i].mutate(&a, &l, SHM_SIZE);
		raw_bwd_req(&a, g_rid, &req);
		if (!raw_refused_unwritten(bad_cases[i].name, &req, bad_cases[i].want,
		                           bad_cases[i].needle, ""))
			wrong++;
	}
	assert_int_equal(wrong, 0);
	/* The good request computes right on the same session. */
	raw_bwd_req(&good, g_rid, &req);
	assert_int_equal(fa_raw_call(g_raw, &req, &rep), FA_OK);
	assert_true(fa_bwd_check(&cs, &l, g_shm.map, tight_tol(cs.dtype), NULL, why, sizeof why));
	raw_close();
}

/* One shm object registered twice: a gradient through the second registration at an input's
 * (or another gradient's) bytes in the first is one memory: FA_EOVERLAP naming both regions,
 * nothing written; the gradients through the second registration at their own bytes compute
 * right. */
static void test_attn_bwd_overlap_through_a_second_registration_gets_eoverlap(void **state)
{
	(void)state;
	struct fa_case cs;
	struct fa_bwd_layout l;
	fa_attn_bwd_args good;
	struct fa_proto_req req;
	struct fa_proto_rep rep;
	uint64_t rid2 = 0;
	char needle[96], why[256];
	raw_open(&cs, &l, &good);
	assert_int_equal(fa_raw_register(g_raw, g_sid, g_seq++, g_shm.name, SHM_SIZE, &rid2, &rep),
	                 FA_OK);
	assert_true(rid2 != 0 && rid2 != g_rid);

	raw_bwd_req(&good, g_rid, &req);
	req.u.bwd.dq.region = rid2;
	req.u.bwd.dq.offset = req.u.bwd.q.offset;
	snprintf(needle, sizeof needle, "dq overlaps q: regions %016llx and %016llx",
	         (unsigned long long)rid2, (unsigned long long)g_rid);
	assert_true(raw_refused_unwritten("dq at q's bytes through rid2", &req, FA_EOVERLAP, needle,
	                                  "map the same memory"));

	raw_bwd_req(&good, g_rid, &req);
	req.u.bwd.dv.region = rid2;
	req.u.bwd.dv.offset = req.u.bwd.lse.offset;
	assert_true(raw_refused_unwritten("dv at lse's bytes through rid2", &req, FA_EOVERLAP,
	                                  "dv overlaps lse: regions", "map the same memory"));

	raw_bwd_req(&good, g_rid, &req);
	req.u.bwd.dk.region = rid2;
	req.u.bwd.dv.offset = req.u.bwd.dk.offset; /* dv (first) and dk (second): one memory */
	assert_true(raw_refused_unwritten("dv at dk's bytes, dk through rid2", &req, FA_EOVERLAP,
	                                  "dv overlaps dk: regions", "map the same memory"));

	/* Every gradient through the second registration at its own bytes: legal, and right. */
	raw_bwd_req(&good, g_rid, &req);
	req.u.bwd.dq.region = req.u.bwd.dk.region = req.u.bwd.dv.region = rid2;
	assert_int_equal(fa_raw_call(g_raw, &req, &rep), FA_OK);
	assert_true(fa_bwd_check(&cs, &l, g_shm.map, tight_tol(cs.dtype), NULL, why, sizeof why));
	raw_close();
}

/* A request packed by hand without its lse: the decoder refuses it (lse is required on the wire),
 * naming the key; an asynchronous backward on the CPU backend gets FA_ENOTSUP. Nothing written. */
static void pk_str(msgpack_packer *pk, const char *s)
{
	msgpack_pack_str_with_body(pk, s, strlen(s));
}

static void pk_tensor(msgpack_packer *pk, const char *key, const struct fa_proto_tensor *t)
{
	pk_str(pk, key);
	msgpack_pack_map(pk, 5);
	pk_str(pk, "r");
	msgpack_pack_uint64(pk, t->region);
	pk_str(pk, "o");
	msgpack_pack_uint64(pk, t->offset);
	pk_str(pk, "t");
	msgpack_pack_uint64(pk, t->dtype);
	pk_str(pk, "sh");
	msgpack_pack_array(pk, 4);
	for (int i = 0; i < 4; i++)
		msgpack_pack_int64(pk, t->shape[i]);
	pk_str(pk, "st");
	msgpack_pack_array(pk, 4);
	for (int i = 0; i < 4; i++)
		msgpack_pack_int64(pk, t->stride[i]);
}

static void test_attn_bwd_missing_lse_on_the_wire_and_async_on_cpu_are_refused(void **state)
{
	(void)state;
	struct fa_case cs;
	struct fa_bwd_layout l;
	fa_attn_bwd_args good;
	struct fa_proto_req req;
	struct fa_proto_rep rep;
	raw_open(&cs, &l, &good);
	raw_bwd_req(&good, g_rid, &req);

	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 16);
	pk_str(&pk, "v"), msgpack_pack_uint64(&pk, FA_PROTO_VERSION);
	pk_str(&pk, "op"), msgpack_pack_uint64(&pk, FA_OP_ATTN_BWD);
	pk_str(&pk, "seq"), msgpack_pack_uint64(&pk, req.seq);
	pk_str(&pk, "sid"), msgpack_pack_uint64(&pk, g_sid);
	pk_tensor(&pk, "tq", &req.u.bwd.q);
	pk_tensor(&pk, "tk", &req.u.bwd.k);
	pk_tensor(&pk, "tv", &req.u.bwd.v);
	pk_tensor(&pk, "to", &req.u.bwd.o);
	pk_tensor(&pk, "tdo", &req.u.bwd.dout);
	pk_tensor(&pk, "tdq", &req.u.bwd.dq);
	pk_tensor(&pk, "tdk", &req.u.bwd.dk);
	pk_tensor(&pk, "tdv", &req.u.bwd.dv);
	pk_str(&pk, "scale"), msgpack_pack_double(&pk, 0.0);
	pk_str(&pk, "mask"), msgpack_pack_uint64(&pk, req.u.bwd.mask);
	pk_str(&pk, "prec"), msgpack_pack_uint64(&pk, 0);
	pk_str(&pk, "fl"), msgpack_pack_uint64(&pk, 0);
	unsigned char *before = malloc(SHM_SIZE);
	assert_non_null(before);
	memcpy(before, g_shm.map, SHM_SIZE);
	int st = fa_raw_call_bytes(g_raw, sb.data, sb.size, &rep);
	msgpack_sbuffer_destroy(&sb);
	if (st != FA_EPROTO || !strstr(rep.detail, "missing key 'lse'"))
		fprintf(stderr, "no lse: got %d, detail '%s'\n", st, st >= 0 ? rep.detail : "");
	assert_int_equal(st, FA_EPROTO);
	assert_non_null(strstr(rep.detail, "missing key 'lse' in a ATTN_BWD request"));
	assert_memory_equal(before, g_shm.map, SHM_SIZE);
	free(before);

	raw_bwd_req(&good, g_rid, &req);
	req.u.bwd.async = true;
	req.u.bwd.slot = 3;
	assert_true(raw_refused_unwritten("asynchronous on the CPU backend", &req, FA_ENOTSUP,
	                                  "asynchronous mode needs the GPU backend", ""));
	raw_close();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_attn_bwd_gradients_match_the_reference_from_several_processes),
		cmocka_unit_test(test_attn_bwd_deterministic_flag_gives_identical_bits),
		cmocka_unit_test(test_attn_bwd_bad_input_through_api_gets_status_and_detail),
		cmocka_unit_test(test_attn_bwd_bad_input_reaches_daemon_checks),
		cmocka_unit_test(test_attn_bwd_overlap_through_a_second_registration_gets_eoverlap),
		cmocka_unit_test(test_attn_bwd_missing_lse_on_the_wire_and_async_on_cpu_are_refused),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
