/* gpu_cuda.c - one device through the CUDA driver (common/fa_cu.h), the in-memory kernel cache
 * and the launch API fa_gpu_attn_fwd().
 *
 * The primary context is used (what the runtime and PyTorch use), so device pointers from other
 * libraries in the process work here.
 */
#include "fa_gpu.h"
#include "fa_cu.h"
#include "fa_err.h"
#include "fa_diskcache.h"
#include "fa_tune.h"
#include "fa_launch_memo.h"
#include "gpu_int.h"

#include <stddef.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef fa_cu_res curesult;
typedef fa_cu_dev cudev;
typedef fa_cu_ctx cuctx;
typedef fa_cu_mod cumod;
typedef fa_cu_func cufunc;
typedef fa_cu_event cuevent;
typedef fa_cu_pool cupool;
typedef fa_cu_stream custream;

enum {
	ATTR_SM_COUNT = FA_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
	ATTR_CC_MAJOR = FA_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
	ATTR_CC_MINOR = FA_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
	ATTR_SMEM_PER_SM = FA_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
	ATTR_REGS_PER_SM = FA_CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
	ATTR_SMEM_OPTIN = FA_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
	FUNC_ATTR_MAX_DYN_SMEM = FA_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
	POOL_ATTR_RELEASE_THRESHOLD = FA_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
};

/* Runs of fields both kernels' parameter blocks carry, in this order (ints and a float: no
 * padding, so embedding them leaves the blocks' layouts as the kernels declare them). */
struct fa_kdims {
	int B, Sq, Sk, Hq, Hkv, group; /* group = Hq / Hkv */
};
struct fa_kscale {
	float scale_log2; /* |scale| * log2(e) */
	int neg_scale;    /* scale < 0: the kernel negates Q (exactly) */
};

/* The sliding window and softcap (FA_WIN, FA_SOFTCAP), at the end of every forward kernel's
 * parameter block (ints and floats: no padding). Key j is visible to query i iff win_lo <= j - i
 * <= win_hi. */
struct fa_kmaskx {
	int win_lo, win_hi;
	float scale_cap; /* |scale| / softcap */
	float cap_log2;  /* softcap * log2(e) */
};

/* The kernel's parameter block: the same fields, order and types as struct fa_kparams in
 * attn_fwd.cu. */
struct fa_kparams {
	uint64_t q, k, v, o, lse;
	long long qs[3], ks[3], vs[3], os[3], ls[3];
	struct fa_kdims dims;
	struct fa_kscale sc;
	struct fa_kmaskx mx;
};
_Static_assert(sizeof(struct fa_kparams) == 208 && offsetof(struct fa_kparams, dims) == 160 &&
               offsetof(struct fa_kparams, sc) == 184 && offsetof(struct fa_kparams, mx) == 192,
               "kernel parameter block layout");

/* attn_fwd_sm90.cu's fa_wgparams and fa_wgprep (same order, same types). */
struct fa_wgparams {
	uint64_t q, o, lse;
	uint64_t kh, kl, vh, vl;
	long long qs[3], os[3], ls[3];
	struct fa_kdims dims;
	int skp;
	struct fa_kscale sc;
	struct fa_kmaskx mx;
};
_Static_assert(offsetof(struct fa_wgparams, dims) == 128 &&
               offsetof(struct fa_wgparams, skp) == 152 && offsetof(struct fa_wgparams, sc) == 156 &&
               offsetof(struct fa_wgparams, mx) == 164 && sizeof(struct fa_wgparams) == 184,
               "wgmma kernel parameter block layout");
struct fa_wgprep {
	uint64_t k, v;
	uint64_t kh, kl, vh, vl;
	long long ks[3], vs[3];
	int B, Sk, Hkv, skp;
};

/* attn_decode.cu's fa_dparams (same order, same types). */
struct fa_dparams {
	uint64_t q, k, v, o, lse;
	uint64_t po, pl; /* the partials: fp32 O [split][B][Hq][Sq][D] and their lse */
	long long qs[3], ks[3], vs[3], os[3], ls[3];
	struct fa_kdims dims;
	struct fa_kscale sc;
	int nsplit, split_keys, rows, nrc;
	struct fa_kmaskx mx;
	uint64_t cu_q, cu_k, seqlens_k, page_table; /* inference layouts (gpu_infer.c); 0: none */
	long long pt_cols;
	int kv, page_size; /* kv 0: dense */
};
_Static_assert(offsetof(struct fa_dparams, dims) == 176 && offsetof(struct fa_dparams, sc) == 200 &&
               offsetof(struct fa_dparams, nsplit) == 208 && offsetof(struct fa_dparams, mx) == 224 &&
               offsetof(struct fa_dparams, cu_q) == 240 &&
               offsetof(struct fa_dparams, kv) == 280 && sizeof(struct fa_dparams) == 288,
               "decode kernel parameter block layout");

/* One compiled specialisation. */
struct kcache_entry {
	struct fa_kernel_spec spec;
	cumod mod;
	cufunc fwd, cvt, cvt_flat;
	cufunc prep; /* wgmma paths: fa_wg_prep (K, V -> tile images); cvt and cvt_flat are 0; the
	              * fp32 wgmma backward: fa_bwd_wgprep */
	cufunc merge; /* decode paths: fa_decode_merge (fwd is fa_attn_decode); else 0 */
	cufunc bwd_pre, bwd_dq, bwd_kvs; /* backward paths: fwd is fa_bwd_main (gpu_bwd.c) */
};

struct fa_gpu {
	struct fa_cu_api cu; /* fa_cu's table, copied: it never changes once loaded */
	struct fa_nvrtc *nvrtc;
	cudev dev;
	cuctx ctx;
	int ordinal;
	char name[128];
	uint8_t uuid[16];
	int driver; /* cuDriverGetVersion */
	struct fa_device_model model;
	struct fa_kernel_settings ks; /* fa_gpu_open's, copied */
	struct fa_tune_table *tune; /* NULL: the planner's heuristic (fa_gpu_set_tune_table) */
	pthread_mutex_t lock; /* guards the cache and the counters */
	struct kcache_entry *cache;
	int ncache, capcache;
	struct fa_diskcache *disk; /* NULL: no disk cache */
	fa_gpu_log_fn log_fn;
	void *log_ctx;
	struct fa_gpu_cache_stats stats; /* under lock; kernels, disk_* filled by the reader */
	/* A repeat shape's plan and kernel (fa_launch_memo.h); off with FA_LAUNCH_MEMO=0 or
	 * fa_gpu_set_launch_memo (every launch plans, as before the memo). */
	struct fa_launch_memo memo;
	_Atomic bool memo_on;
};

/* A status for a driver error: faults that poison the context are FA_EDEVICE, like the rest. */
static fa_status cu_fail(const struct fa_gpu *g, curesult r, const char *what, char *err,
                         size_t errlen)
{
	(void)g;
	snprintf(err, errlen, "%s: CUDA error %d (%s)", what, r, fa_cu_errstr(r));
	return r == 2 ? FA_ENOMEM : FA_EDEVICE;
}

fa_status fa_gpu_open(struct fa_gpu **out, int ordinal, const struct fa_kernel_settings *ks,
                      char *err, size_t errlen)
{
	*out = NULL;
	struct fa_gpu *g = calloc(1, sizeof *g);
	if (!g)
		return FA_ENOMEM;
	g->ks = ks ? *ks : *fa_kernel_settings_default();
	pthread_mutex_init(&g->lock, NULL);
	fa_launch_memo_init(&g->memo);
	const char *memo_env = getenv("FA_LAUNCH_MEMO");
	atomic_store(&g->memo_on, !(memo_env && strcmp(memo_env, "0") == 0));
	fa_status st = fa_cu_load();
	if (st != FA_OK) {
		snprintf(err, errlen, "%s", fa_cu_why());
		goto fail;
	}
	g->cu = *fa_cu;
	curesult r;
	int count = 0;
	g->cu.DriverGetVersion(&g->driver);
	g->cu.DeviceGetCount(&count);
	if (ordinal < 0 || ordinal >= count) {
		snprintf(err, errlen, "no GPU %d: the driver sees %d device(s)", ordinal, count);
		st = FA_ENOGPU;
		goto fail;
	}
	g->ordinal = ordinal;
	g->cu.DeviceGet(&g->dev, ordinal);
	int maj = 0, min = 0, v = 0;
	g->cu.DeviceGetAttribute(&maj, ATTR_CC_MAJOR, g->dev);
	g->cu.DeviceGetAttribute(&min, ATTR_CC_MINOR, g->dev);
	g->cu.DeviceGetName(g->name, (int)sizeof g->name - 1, g->dev);
	g->cu.DeviceGetUuid(g->uuid, g->dev);
	g->model.name = g->name;
	g->model.sm = maj * 10 + min;
	g->cu.DeviceGetAttribute(&v, ATTR_SMEM_OPTIN, g->dev);
	g->model.smem_optin = (size_t)v;
	g->cu.DeviceGetAttribute(&v, ATTR_SMEM_PER_SM, g->dev);
	g->model.smem_per_sm = (size_t)v;
	g->cu.DeviceGetAttribute(&v, ATTR_REGS_PER_SM, g->dev);
	g->model.regs_per_sm = v;
	g->cu.DeviceGetAttribute(&v, ATTR_SM_COUNT, g->dev);
	g->model.sm_count = v;
	if (g->model.sm < 80) {
		snprintf(err, errlen, "GPU %d (%s) is sm_%d: the kernels need sm_80 or newer (cp.async, "
		         "bf16 mma.sync)", ordinal, g->name, g->model.sm);
		st = FA_ENOGPU;
		goto fail;
	}
	r = g->cu.DevicePrimaryCtxRetain(&g->ctx, g->dev);
	if (r != 0) {
		st = cu_fail(g, r, "cuDevicePrimaryCtxRetain", err, errlen);
		goto fail;
	}
	g->cu.CtxSetCurrent(g->ctx);
	/* Keep freed scratch (fp32 -> bf16 staging) in the pool instead of returning it at every
	 * synchronisation. */
	cupool pool = NULL;
	if (g->cu.DeviceGetDefaultMemPool(&pool, g->dev) == 0 && pool) {
		uint64_t thr = UINT64_MAX;
		g->cu.MemPoolSetAttribute(pool, POOL_ATTR_RELEASE_THRESHOLD, &thr);
	}
	st = fa_nvrtc_open(&g->nvrtc, &g->ks, err, errlen);
	if (st != FA_OK)
		goto fail;
	*out = g;
	return FA_OK;
fail:
	fa_gpu_close(g);
	return st;
}

void fa_gpu_close(struct fa_gpu *g)
{
	if (!g)
		return;
	if (g->ctx) {
		g->cu.CtxSetCurrent(g->ctx);
		for (int i = 0; i < g->ncache; i++)
			g->cu.ModuleUnload(g->cache[i].mod);
		g->cu.DevicePrimaryCtxRelease(g->dev);
	}
	free(g->cache);
	fa_diskcache_close(g->disk);
	fa_nvrtc_close(g->nvrtc);
	fa_launch_memo_destroy(&g->memo);
	pthread_mutex_destroy(&g->lock);
	free(g);
}

const struct fa_device_model *fa_gpu_model(const struct fa_gpu *g) { return &g->model; }
int fa_gpu_sm(const struct fa_gpu *g) { return g->model.sm; }
size_t fa_gpu_smem_optin(const struct fa_gpu *g) { return g->model.smem_optin; }
const char *fa_gpu_name(const struct fa_gpu *g) { return g->name; }
void fa_gpu_uuid(const struct fa_gpu *g, uint8_t uuid[16]) { memcpy(uuid, g->uuid, 16); }
int fa_gpu_driver_version(const struct fa_gpu *g) { return g->driver; }
const struct fa_kernel_settings *fa_gpu_settings(const struct fa_gpu *g) { return &g->ks; }

void fa_gpu_set_tune_table(struct fa_gpu *g, struct fa_tune_table *t)
{
	pthread_mutex_lock(&g->lock);
	g->tune = t;
	pthread_mutex_unlock(&g->lock);
	/* plans chosen under the old table (which may be closed and its address reused) */
	fa_launch_memo_clear(&g->memo);
}

void fa_gpu_set_launch_memo(struct fa_gpu *g, bool on)
{
	atomic_store(&g->memo_on, on);
	fa_launch_memo_clear(&g->memo);
}

void fa_gpu_launch_memo_stats(struct fa_gpu *g, struct fa_gpu_memo_stats *out)
{
	struct fa_launch_memo_stats st;
	fa_launch_memo_stats(&g->memo, &st);
	out->on = atomic_load(&g->memo_on);
	out->hits = st.hits;
	out->misses = st.misses;
	out->stale = st.stale;
	out->evictions = st.evictions;
}

/* The tuning table now and its generation (read before planning: a table that changes during
 * the planning leaves the plan with the older generation, so the next lookup plans again). */
static struct fa_tune_table *tune_now(struct fa_gpu *g, uint64_t *gen)
{
	pthread_mutex_lock(&g->lock);
	struct fa_tune_table *tt = g->tune;
	pthread_mutex_unlock(&g->lock);
	*gen = tt ? fa_tune_table_generation(tt) : 0;
	return tt;
}

/* The tile for d when the caller gave none: the tuning table's winner when there is a table and
 * the class is tuned and the tile fits this device, else the planner's first choice (a stale or
 * foreign table never breaks a launch: fa_tune_pick checks the tile against fa_plan's list).
 * fa_launch_plan_make (launch_memo.c) makes the same choice for the launches. */
static fa_status choose_tile(struct fa_gpu *g, const struct fa_attn_fwd_desc *d,
                             struct fa_tile *t, char *err, size_t errlen)
{
	uint64_t gen;
	struct fa_tune_table *tt = tune_now(g, &gen);
	if (tt)
		return fa_tune_pick(tt, &g->model, d, t, NULL, err, errlen);
	int n = 0;
	return fa_gpu_plan(g, d, t, 1, &n, err, errlen);
}

/* The context current on this thread only when it is not already: cuCtxGetCurrent reads the
 * thread's state, where cuCtxSetCurrent validates and swaps it on every call. */
fa_status fa_gpu_make_current(struct fa_gpu *g, char *err, size_t errlen)
{
	cuctx cur = NULL;
	if (g->cu.CtxGetCurrent(&cur) == 0 && cur == g->ctx)
		return FA_OK;
	curesult r = g->cu.CtxSetCurrent(g->ctx);
	return r ? cu_fail(g, r, "cuCtxSetCurrent", err, errlen) : FA_OK;
}

/* A line for the daemon's log (fa_gpu_set_log), stderr by default. */
static void gpu_log(const struct fa_gpu *g, int level, const char *msg)
{
	if (g->log_fn)
		g->log_fn(g->log_ctx, level, msg);
	else if (level <= 4) /* tests and benchmarks: problems only, not every compile */
		fprintf(stderr, "kernels: %s\n", msg);
}

/* Two specialisations compile to the same binary: every field the NVRTC options and the launch
 * depend on is equal. The planner's estimates in the tile (regs, blocks_per_sm, score) vary with
 * the problem's shape and say nothing about the binary, so they are not compared (comparing
 * them loaded the same kernel again for every new shape). */
static bool spec_same(const struct fa_kernel_spec *a, const struct fa_kernel_spec *b)
{
	return a->sm == b->sm && a->in == b->in && a->out == b->out && a->qin == b->qin &&
	       a->precision == b->precision && a->D == b->D && a->mask == b->mask &&
	       a->tile.path == b->tile.path && a->tile.nw == b->tile.nw &&
	       a->tile.rt == b->tile.rt && a->tile.br == b->tile.br && a->tile.bc == b->tile.bc &&
	       a->tile.stages == b->tile.stages && a->tile.smem == b->tile.smem &&
	       a->window == b->window && a->softcap == b->softcap && a->layout == b->layout;
}

/* The compiled function for a specialisation: from the in-memory cache, else a cubin from
 * fa_kernel_cubin (the disk cache, or NVRTC) loaded as a module, with the opt-in dynamic
 * shared-memory attribute raised to the tile's need. A cubin from disk and a fresh one take the
 * same path from here on, so the GPU tests exercise the disk cache's load too. */
static fa_status get_kernel_try(struct fa_gpu *g, const struct fa_kernel_spec *s,
                                struct kcache_entry **out, bool retry, char *err, size_t errlen)
{
	fa_status st = FA_OK;
	pthread_mutex_lock(&g->lock);
	for (int i = 0; i < g->ncache; i++)
		if (spec_same(&g->cache[i].spec, s)) {
			*out = &g->cache[i];
			g->stats.mem_hits++;
			pthread_mutex_unlock(&g->lock);
			return FA_OK;
		}
	pthread_mutex_unlock(&g->lock);
	/* Compile without the lock (seconds); two threads may race to compile the same
	 * specialisation: the second one's module is dropped below. */
	void *cubin = NULL;
	size_t sz = 0;
	struct fa_cubin_info info;
	st = fa_kernel_cubin(g->nvrtc, g->disk, s, &cubin, &sz, &info, err, errlen);
	char name[96];
	fa_kernel_spec_name(s, name, sizeof name);
	pthread_mutex_lock(&g->lock);
	g->stats.disk_errors += (uint64_t)info.disk_errors;
	g->stats.disk_stores += info.stored;
	g->stats.disk_loads += info.from_disk;
	if (info.compiled) {
		g->stats.compiled++;
		g->stats.compile_ms_total += info.compile_ms;
		g->stats.compile_ms_last = info.compile_ms;
		snprintf(g->stats.compile_last, sizeof g->stats.compile_last, "%s", name);
	}
	pthread_mutex_unlock(&g->lock);
	if (info.disk_errors)
		gpu_log(g, 4, info.disk_msg);
	if (st != FA_OK)
		return st;
	if (info.compiled) {
		char line[256];
		snprintf(line, sizeof line, "compiled %s in %.0f ms (%d registers)%s", name,
		         info.compile_ms, info.usage.regs, info.stored ? ", stored on disk" : "");
		gpu_log(g, 6, line);
	}
	struct kcache_entry e;
	memset(&e, 0, sizeof e);
	e.spec = *s;
	curesult r = g->cu.ModuleLoadData(&e.mod, cubin);
	free(cubin);
	if (r && info.from_disk && g->disk && retry) {
		/* A whole, checksummed cubin the driver still refuses (written by a buggy build, or
		 * a driver change): drop it and compile afresh, once. */
		char line[512], e2[256];
		snprintf(line, sizeof line, "kernel cache: the driver refused the cached cubin of %s "
		         "(CUDA error %d, %s): removed, recompiling", name, r, fa_cu_errstr(r));
		gpu_log(g, 4, line);
		fa_diskcache_remove(g->disk, &info.key, e2, sizeof e2);
		pthread_mutex_lock(&g->lock);
		g->stats.disk_errors++;
		pthread_mutex_unlock(&g->lock);
		return get_kernel_try(g, s, out, false, err, errlen);
	}
	if (r)
		return cu_fail(g, r, "cuModuleLoadData", err, errlen);
	e.cvt = e.cvt_flat = e.prep = e.merge = e.bwd_pre = e.bwd_dq = e.bwd_kvs = 0;
	bool wg = fa_kpath_is_wg(s->tile.path), dec = fa_kpath_is_decode(s->tile.path);
	if (fa_kpath_is_bwd(s->tile.path)) {
		/* attn_bwd_sm90.cu and attn_bwd_sm90_tf32.cu have the main pass only (gpu_bwd.c
		 * takes pre and dq from attn_bwd.cu's module of the same shape); the latter also its
		 * images' pass, fa_bwd_wgprep */
		const bool own = s->tile.path != FA_KPATH_BWDWG16 && !fa_kpath_is_bwdwg32(s->tile.path);
		if ((r = g->cu.ModuleGetFunction(&e.fwd, e.mod, "fa_bwd_main")) ||
		    (own && (r = g->cu.ModuleGetFunction(&e.bwd_pre, e.mod, "fa_bwd_pre"))) ||
		    (own && (r = g->cu.ModuleGetFunction(&e.bwd_dq, e.mod, "fa_bwd_dq"))) ||
		    (own && (r = g->cu.ModuleGetFunction(&e.bwd_kvs, e.mod, "fa_bwd_kvscale"))) ||
		    (fa_kpath_is_bwdwg32(s->tile.path) &&
		     (r = g->cu.ModuleGetFunction(&e.prep, e.mod, "fa_bwd_wgprep"))) ||
		    (r = g->cu.FuncSetAttribute(e.fwd, FUNC_ATTR_MAX_DYN_SMEM, (int)s->tile.smem))) {
			st = cu_fail(g, r, "loading fa_bwd_main", err, errlen);
			g->cu.ModuleUnload(e.mod);
			return st;
		}
	} else if (dec) {
		if ((r = g->cu.ModuleGetFunction(&e.fwd, e.mod, "fa_attn_decode")) ||
		    (r = g->cu.ModuleGetFunction(&e.merge, e.mod, "fa_decode_merge")) ||
		    (r = g->cu.FuncSetAttribute(e.fwd, FUNC_ATTR_MAX_DYN_SMEM, (int)s->tile.smem))) {
			st = cu_fail(g, r, "loading fa_attn_decode", err, errlen);
			g->cu.ModuleUnload(e.mod);
			return st;
		}
	} else if ((r = g->cu.ModuleGetFunction(&e.fwd, e.mod, "fa_attn_fwd")) ||
	    (wg && (r = g->cu.ModuleGetFunction(&e.prep, e.mod, "fa_wg_prep"))) ||
	    (!wg && (r = g->cu.ModuleGetFunction(&e.cvt, e.mod, "fa_cvt_f32_bf16"))) ||
	    (!wg && (r = g->cu.ModuleGetFunction(&e.cvt_flat, e.mod, "fa_cvt_f32_bf16_flat"))) ||
	    (r = g->cu.FuncSetAttribute(e.fwd, FUNC_ATTR_MAX_DYN_SMEM, (int)s->tile.smem))) {
		st = cu_fail(g, r, "loading fa_attn_fwd", err, errlen);
		g->cu.ModuleUnload(e.mod);
		return st;
	}
	pthread_mutex_lock(&g->lock);
	for (int i = 0; i < g->ncache; i++)
		if (spec_same(&g->cache[i].spec, s)) {
			*out = &g->cache[i];
			pthread_mutex_unlock(&g->lock);
			g->cu.ModuleUnload(e.mod);
			return FA_OK;
		}
	if (!g->cache) {
		/* Entries are handed out by pointer, so the table never moves: one fixed allocation. */
		g->cache = calloc(4096, sizeof *g->cache);
		g->capcache = g->cache ? 4096 : 0;
	}
	if (g->ncache == g->capcache) {
		snprintf(err, errlen, "kernel cache full (%d specialisations)", g->capcache);
		st = g->cache ? FA_ENOMEM : FA_ENOMEM;
		pthread_mutex_unlock(&g->lock);
		g->cu.ModuleUnload(e.mod);
		return st;
	}
	g->cache[g->ncache] = e;
	*out = &g->cache[g->ncache++];
	pthread_mutex_unlock(&g->lock);
	return FA_OK;
}

static fa_status get_kernel(struct fa_gpu *g, const struct fa_kernel_spec *s,
                            struct kcache_entry **out, char *err, size_t errlen)
{
	return get_kernel_try(g, s, out, true, err, errlen);
}

/* gpu_int.h: the backward launcher's kernels through the same caches. */
fa_status fa_gpu_bwd_kernels(struct fa_gpu *g, const struct fa_kernel_spec *s,
                             struct fa_gpu_bwd_funcs *f, char *err, size_t errlen)
{
	struct kcache_entry *ke = NULL;
	if (!fa_kpath_is_bwd(s->tile.path))
		return fa_err(err, errlen, FA_EINTERNAL, "fa_gpu_bwd_kernels: not a backward tile");
	fa_status st = get_kernel(g, s, &ke, err, errlen);
	if (st != FA_OK)
		return st;
	f->pre = ke->bwd_pre;
	f->main = ke->fwd;
	f->dq = ke->bwd_dq;
	f->kvs = ke->bwd_kvs;
	f->prep = ke->prep;
	return FA_OK;
}

fa_status fa_gpu_set_cache_dir(struct fa_gpu *g, const char *dir, char *err, size_t errlen)
{
	const unsigned long long mb = g->ks.kernel_cache_max_mb;
	const uint64_t max = mb > 0 && mb < (1ull << 40) ? (uint64_t)mb << 20 : 0;
	struct fa_diskcache *dc = NULL;
	fa_status st = FA_OK;
	if (dir && *dir)
		st = fa_diskcache_open(&dc, dir, max, err, errlen);
	pthread_mutex_lock(&g->lock);
	struct fa_diskcache *old = g->disk;
	g->disk = dc;
	pthread_mutex_unlock(&g->lock);
	fa_diskcache_close(old);
	return st;
}

void fa_gpu_set_log(struct fa_gpu *g, fa_gpu_log_fn fn, void *ctx)
{
	g->log_fn = fn;
	g->log_ctx = ctx;
}

void fa_gpu_cache_stats(const struct fa_gpu *g, struct fa_gpu_cache_stats *out)
{
	struct fa_gpu *mg = (struct fa_gpu *)g; /* the lock is not part of the value */
	pthread_mutex_lock(&mg->lock);
	*out = g->stats;
	out->kernels = (uint64_t)g->ncache;
	out->disk_enabled = g->disk != NULL;
	if (g->disk)
		snprintf(out->disk_dir, sizeof out->disk_dir, "%s", fa_diskcache_path(g->disk));
	pthread_mutex_unlock(&mg->lock);
}

fa_status fa_gpu_plan(struct fa_gpu *g, const struct fa_attn_fwd_desc *d, struct fa_tile *out,
                      int max, int *n, char *err, size_t errlen)
{
	struct fa_plan_req r;
	fa_plan_req_from_desc(d, &r);
	r.ks = &g->ks;
	return fa_plan(&g->model, &r, out, max, n, err, errlen);
}

/* Alignment the kernels need (common/fa_check.h): FA_KERNEL_ALIGN-byte pointers and strides. */
static fa_status check_align(const char *name, CUdeviceptr p, const int64_t *stride,
                             const int64_t *shape, size_t es, char *err, size_t errlen)
{
	if (p % FA_KERNEL_ALIGN) {
		return fa_err(err, errlen, FA_EALIGN,
		              "%s: device pointer 0x%llx is not %d-byte aligned", name,
		              (unsigned long long)p, FA_KERNEL_ALIGN);
	}
	return fa_check_stride_align(name, shape, stride, es, FA_KERNEL_ALIGN, err, errlen);
}

/* The wgmma paths (attn_fwd_sm90.cu): fa_wg_prep writes K and V, rounded to tf32 (and their
 * remainders for 3xtf32), as the attention kernel's shared-memory tile images into scratch
 * allocated in stream order; then the attention kernel; the scratch is freed in stream order.
 * 16-bit (fp16, bf16, fp32 staged as bf16: the prep converts K and V, the kernel Q): 2 images of
 * 16-bit elements, head dim padded to 16. fp32: rounds to tf32.
 * Scratch: 2 (tf32) or 4 (3xtf32) images of B * Hkv * skp * D floats, skp = Sk rounded up to
 * the tile's keys per step. */
static struct fa_kdims kdims_of(const struct fa_attn_fwd_desc *d)
{
	return (struct fa_kdims){(int)d->B, (int)d->Sq, (int)d->Sk, (int)d->Hq, (int)d->Hkv,
	                         (int)(d->Hq / d->Hkv)};
}

static struct fa_kscale kscale_of(const struct fa_attn_fwd_desc *d)
{
	return (struct fa_kscale){(float)(fabs(d->scale) * 1.4426950408889634), d->scale < 0};
}

/* The window as the range of j - i with the mask folded in (fa_attn_window_diffs, the backward's
 * rule too), int-sized for Sq, Sk < 2^30 (the grid check), and the softcap's constants. */
static struct fa_kmaskx kmaskx_of(const struct fa_attn_fwd_desc *d)
{
	int64_t lo, hi;
	fa_attn_window_diffs(d, &lo, &hi);
	struct fa_kmaskx m = {(int)lo, (int)hi, 0.f, 0.f};
	if (d->softcap > 0) {
		m.scale_cap = (float)(fabs(d->scale) / d->softcap);
		m.cap_log2 = (float)(d->softcap * 1.4426950408889634);
	}
	return m;
}

/* The window over an inference layout (attn_fwd.cu FA_LAYOUT with FA_WIN, attn_decode.cu
 * FA_LAYOUT): the sides as given, since the range of j - i is each sequence's own (the kernels
 * resolve it per sequence: fa_seq_window, fa_device.cuh); negative = unbounded, values past
 * 2^31 - 1 clamped (they bound nothing: a sequence has below 2^31 - 1 queries and keys together).
 * Softcap as kmaskx_of. */
static struct fa_kmaskx kmaskx_sides_of(const struct fa_attn_fwd_desc *d)
{
	struct fa_kmaskx m = kmaskx_of(d);
	const int64_t l = d->window ? d->window_left : -1, r = d->window ? d->window_right : -1;
	m.win_lo = l < 0 ? -1 : l > INT32_MAX ? INT32_MAX : (int)l;
	m.win_hi = r < 0 ? -1 : r > INT32_MAX ? INT32_MAX : (int)r;
	return m;
}

static fa_status launch_wg(struct fa_gpu *g, const struct kcache_entry *ke,
                           const struct fa_kernel_spec *spec, const struct fa_attn_fwd_desc *d,
                           CUdeviceptr q, CUdeviceptr k, CUdeviceptr v, CUdeviceptr o,
                           CUdeviceptr lse, CUstream s, char *err, size_t errlen)
{
	const bool x3 = spec->tile.path == FA_KPATH_WG32X3, w16 = spec->tile.path == FA_KPATH_WG16;
	const int64_t skp = (d->Sk + spec->tile.bc - 1) / spec->tile.bc * spec->tile.bc;
	const int64_t dp = w16 ? (d->D + 15) / 16 * 16 : d->D; /* the images' padded head dim */
	const size_t img = (size_t)(d->B * d->Hkv * skp * dp) * (w16 ? 2 : 4);
	const size_t imga = (img + 255) / 256 * 256;
	CUdeviceptr scratch = 0;
	curesult r = g->cu.MemAllocAsync(&scratch, imga * (x3 ? 4 : 2), (custream)s);
	if (r)
		return cu_fail(g, r, "cuMemAllocAsync (K/V tile images)", err, errlen);

	struct fa_wgprep pp;
	memset(&pp, 0, sizeof pp);
	pp.k = k;
	pp.v = v;
	pp.kh = scratch;
	pp.vh = scratch + imga;
	pp.kl = x3 ? scratch + 2 * imga : 0;
	pp.vl = x3 ? scratch + 3 * imga : 0;
	for (int i = 0; i < 3; i++) {
		pp.ks[i] = d->k_stride[i];
		pp.vs[i] = d->v_stride[i];
	}
	pp.B = (int)d->B;
	pp.Sk = (int)d->Sk;
	pp.Hkv = (int)d->Hkv;
	pp.skp = (int)skp;
	/* fa_wg_prep: a thread per 8 keys x 16 bytes of the head dim (skp: a multiple of 16) */
	int64_t chunks = d->B * d->Hkv * (skp / 8) * (dp / (w16 ? 8 : 4));
	int64_t blocks = (chunks + 255) / 256;
	if (blocks > 8 * 1024)
		blocks = 8 * 1024;
	void *pargs[] = {&pp};
	r = g->cu.LaunchKernel(ke->prep, (unsigned)blocks, 1, 1, 256, 1, 1, 0, (custream)s, pargs,
	                       NULL);
	if (r == 0) {
		struct fa_wgparams p;
		memset(&p, 0, sizeof p);
		p.q = q;
		p.o = o;
		p.lse = lse;
		p.kh = pp.kh;
		p.kl = pp.kl;
		p.vh = pp.vh;
		p.vl = pp.vl;
		for (int i = 0; i < 3; i++) {
			p.qs[i] = d->q_stride[i];
			p.os[i] = d->o_stride[i];
			p.ls[i] = d->lse_stride[i];
		}
		p.dims = kdims_of(d);
		p.skp = (int)skp;
		p.sc = kscale_of(d);
		p.mx = kmaskx_of(d);
		unsigned gx = (unsigned)((d->Sq + spec->tile.br - 1) / spec->tile.br);
		void *args[] = {&p};
		r = g->cu.LaunchKernel(ke->fwd, gx, (unsigned)d->Hq, (unsigned)d->B,
		                       (unsigned)(32 * spec->tile.nw), 1, 1, (unsigned)spec->tile.smem,
		                       (custream)s, args, NULL);
	}
	g->cu.MemFreeAsync(scratch, (custream)s);
	if (r)
		return cu_fail(g, r, "launching fa_wg_prep / fa_attn_fwd (wgmma)", err, errlen);
	return FA_OK;
}

static fa_status launch_cvt(struct fa_gpu *g, cufunc f, CUdeviceptr src, const int64_t *st,
                            int64_t B, int64_t S, int64_t H, int64_t D, CUdeviceptr dst,
                            CUstream s, char *err, size_t errlen)
{
	long long sb = st[0], ss = st[1], sh = st[2];
	int Si = (int)S, Hi = (int)H, Di = (int)D;
	long long nq = (long long)(B * S * H * D / 4);
	unsigned blocks = (unsigned)((nq + 255) / 256);
	if (blocks > 132u * 32u)
		blocks = 132u * 32u;
	void *args[] = {&src, &sb, &ss, &sh, &Si, &Hi, &Di, &dst, &nq};
	curesult r = g->cu.LaunchKernel(f, blocks, 1, 1, 256, 1, 1, 0, (custream)s, args, NULL);
	return r ? cu_fail(g, r, "launching fa_cvt_f32_bf16", err, errlen) : FA_OK;
}

/* Whether a [B, S, H, D] tensor (head dim contiguous) fills exactly the B*S*H*D elements from
 * its first one: its dimensions of size > 1, ordered by stride, each step over the one before
 * (BSHD, BHSD, any order without gaps). Such a tensor converts as one flat range, and the copy
 * keeps its strides (multiples of D, so of 16 bytes in bf16). */
static bool fills_range(const int64_t *shape, const int64_t *stride, int64_t D)
{
	int64_t sz[3], st[3];
	int n = 0;
	for (int i = 0; i < 3; i++)
		if (shape[i] > 1) {
			int j = n++;
			for (; j > 0 && st[j - 1] > stride[i]; j--) {
				st[j] = st[j - 1];
				sz[j] = sz[j - 1];
			}
			st[j] = stride[i];
			sz[j] = shape[i];
		}
	int64_t want = D;
	for (int i = 0; i < n; i++) {
		if (st[i] != want)
			return false;
		want *= sz[i];
	}
	return true;
}

/* K and V, both filling their ranges, in one launch: 8 elements per thread and step, enough
 * blocks for every SM to keep loads in flight (the grid-stride loop takes the rest). */
static fa_status launch_cvt_flat(struct fa_gpu *g, cufunc f, CUdeviceptr k, CUdeviceptr kd,
                                 CUdeviceptr v, CUdeviceptr vd, int64_t n, CUstream s,
                                 char *err, size_t errlen)
{
	long long n8 = (long long)(n / 8);
	unsigned blocks = (unsigned)((n8 + 255) / 256);
	if (blocks > 132u * 64u)
		blocks = 132u * 64u;
	void *args[] = {&k, &kd, &v, &vd, &n8};
	curesult r = g->cu.LaunchKernel(f, blocks, 2, 1, 256, 1, 1, 0, (custream)s, args, NULL);
	return r ? cu_fail(g, r, "launching fa_cvt_f32_bf16_flat", err, errlen) : FA_OK;
}

/* The decode path (attn_decode.cu, planner_decode.c): one launch of fa_attn_decode over (split,
 * kv head x row chunk, batch), and with more than one split the partials in stream-ordered
 * scratch from the device's memory pool (kept by the pool: fa_gpu_open raised its release
 * threshold, so repeated decodes reuse the same memory) merged by fa_decode_merge, one warp per
 * output row; the scratch is freed in stream order after the merge. */
static void decode_spec(const struct fa_gpu *g, const struct fa_attn_fwd_desc *d,
                        const struct fa_decode_plan *dp, const struct fa_gpu_decode_layout *lay,
                        struct fa_kernel_spec *spec)
{
	fa_kernel_spec_make(spec, g->model.sm, d->dtype, d->precision, (int)d->D, d->mask,
	                    &dp->tile);
	fa_kernel_spec_mask_ext(spec, d);
	/* a window over a layout resolves per sequence: its own specialisation (attn_decode.cu
	 * FA_LAYOUT), so that the other decodes, over layouts or not, keep their kernel */
	if (lay && spec->window)
		spec->layout = FA_KLAYOUT_SEQ;
}

/* The decode launch with its kernel loaded (spec: decode_spec's) and the context current. */
static fa_status launch_decode_ke(struct fa_gpu *g, const struct fa_attn_fwd_desc *d,
                                  const struct fa_decode_plan *dp,
                                  const struct fa_gpu_decode_layout *lay,
                                  const struct fa_kernel_spec *specp,
                                  const struct kcache_entry *ke, CUdeviceptr q, CUdeviceptr k,
                                  CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse, CUstream s,
                                  char *err, size_t errlen)
{
	const struct fa_kernel_spec spec = *specp;
	struct fa_dparams p;
	memset(&p, 0, sizeof p);
	p.q = q;
	p.k = k;
	p.v = v;
	p.o = o;
	p.lse = lse;
	for (int i = 0; i < 3; i++) {
		p.qs[i] = d->q_stride[i];
		p.ks[i] = d->k_stride[i];
		p.vs[i] = d->v_stride[i];
		p.os[i] = d->o_stride[i];
		p.ls[i] = d->lse_stride[i];
	}
	p.dims = kdims_of(d);
	p.sc = kscale_of(d);
	p.nsplit = dp->nsplit;
	p.split_keys = dp->split_keys;
	p.rows = dp->rows;
	p.nrc = dp->row_chunks;
	p.mx = kmaskx_of(d);
	if (lay) {
		if (spec.window)
			p.mx = kmaskx_sides_of(d);
		p.cu_q = lay->cu_q;
		p.cu_k = lay->cu_k;
		p.seqlens_k = lay->seqlens_k;
		p.page_table = lay->page_table;
		p.pt_cols = lay->pt_cols;
		p.kv = lay->kv;
		p.page_size = lay->page_size;
	}
	CUdeviceptr scratch = 0;
	curesult r;
	if (dp->nsplit > 1) {
		r = g->cu.MemAllocAsync(&scratch, dp->scratch, (custream)s);
		if (r)
			return cu_fail(g, r, "cuMemAllocAsync (decode partials)", err, errlen);
		p.po = scratch;
		p.pl = scratch + dp->scratch_lse;
	}
	void *args[] = {&p};
	r = g->cu.LaunchKernel(ke->fwd, (unsigned)dp->nsplit, (unsigned)(d->Hkv * dp->row_chunks),
	                       (unsigned)d->B, (unsigned)(32 * dp->tile.nw), 1, 1,
	                       (unsigned)spec.tile.smem, (custream)s, args, NULL);
	if (r == 0 && dp->nsplit > 1) {
		int64_t nrows = d->B * d->Hq * d->Sq;
		r = g->cu.LaunchKernel(ke->merge, (unsigned)((nrows + 3) / 4), 1, 1, 128, 1, 1, 0,
		                       (custream)s, args, NULL);
	}
	if (scratch)
		g->cu.MemFreeAsync(scratch, (custream)s);
	if (r)
		return cu_fail(g, r, "launching fa_attn_decode / fa_decode_merge", err, errlen);
	return FA_OK;
}

static fa_status launch_decode(struct fa_gpu *g, const struct fa_attn_fwd_desc *d,
                               const struct fa_decode_plan *dp,
                               const struct fa_gpu_decode_layout *lay, CUdeviceptr q,
                               CUdeviceptr k, CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse,
                               CUstream s, char *err, size_t errlen)
{
	struct fa_kernel_spec spec;
	fa_status st;
	decode_spec(g, d, dp, lay, &spec);
	if ((st = fa_gpu_make_current(g, err, errlen)))
		return st;
	struct kcache_entry *ke = NULL;
	if ((st = get_kernel(g, &spec, &ke, err, errlen)))
		return st;
	return launch_decode_ke(g, d, dp, lay, &spec, ke, q, k, v, o, lse, s, err, errlen);
}

/* gpu_int.h: the inference layouts' launch (gpu_fwd_infer.c plans and checks). The parameter
 * block is filled as fa_gpu_attn_fwd_tile fills it, from the same struct, so both kernels'
 * blocks stay one layout; the layout's own fields travel as the kernel's second parameter. */
fa_status fa_gpu_fwd_seq(struct fa_gpu *g, const struct fa_gpu_seq_launch *l, CUstream s,
                         char *err, size_t errlen)
{
	const struct fa_attn_fwd_desc *d = l->d;
	const struct fa_kernel_spec *spec = l->spec;
	if (spec->layout == FA_KLAYOUT_DENSE || fa_kpath_is_wg(spec->tile.path) ||
	    fa_kpath_is_decode(spec->tile.path) || fa_kpath_is_bwd(spec->tile.path))
		return fa_err(err, errlen, FA_EINTERNAL,
		              "fa_gpu_fwd_seq: not an inference-layout forward specialisation");
	struct kcache_entry *ke = NULL;
	fa_status st = get_kernel(g, spec, &ke, err, errlen);
	if (st != FA_OK)
		return st;
	struct fa_kparams p;
	memset(&p, 0, sizeof p);
	p.q = l->q;
	p.k = l->k;
	p.v = l->v;
	p.o = l->o;
	p.lse = l->lse;
	for (int i = 0; i < 3; i++) {
		p.qs[i] = d->q_stride[i];
		p.ks[i] = d->k_stride[i];
		p.vs[i] = d->v_stride[i];
		p.os[i] = d->o_stride[i];
		p.ls[i] = d->lse_stride[i];
	}
	p.dims = kdims_of(d);
	p.sc = kscale_of(d);
	p.mx = kmaskx_sides_of(d); /* the window's sides: each block resolves its sequence's */
	CUdeviceptr scratch = 0;
	if (d->dtype == FA_DTYPE_FP32 && spec->in == FA_DTYPE_BF16) {
		const int64_t *sh = l->kv_shape;
		const bool flat = fills_range(sh, d->k_stride, d->D) && fills_range(sh, d->v_stride, d->D);
		size_t nk = (size_t)(sh[0] * sh[1] * sh[2] * d->D);
		size_t bk = (nk * 2 + 255) / 256 * 256;
		curesult r = g->cu.MemAllocAsync(&scratch, 2 * bk, (custream)s);
		if (r)
			return cu_fail(g, r, "cuMemAllocAsync (bf16 staging)", err, errlen);
		CUdeviceptr dk = scratch, dv = scratch + bk;
		if (flat) {
			st = launch_cvt_flat(g, ke->cvt_flat, l->k, dk, l->v, dv, (int64_t)nk, s, err,
			                     errlen);
		} else {
			st = launch_cvt(g, ke->cvt, l->k, d->k_stride, sh[0], sh[1], sh[2], d->D, dk, s,
			                err, errlen);
			if (!st)
				st = launch_cvt(g, ke->cvt, l->v, d->v_stride, sh[0], sh[1], sh[2], d->D,
				                dv, s, err, errlen);
		}
		if (st) {
			g->cu.MemFreeAsync(scratch, (custream)s);
			return st;
		}
		p.k = dk;
		p.v = dv;
		if (!flat) {
			p.ks[0] = p.vs[0] = sh[1] * sh[2] * d->D;
			p.ks[1] = p.vs[1] = sh[2] * d->D;
			p.ks[2] = p.vs[2] = d->D;
		}
	}
	void *args[] = {&p, (void *)l->lparams};
	curesult r = g->cu.LaunchKernel(ke->fwd, l->grid_x, (unsigned)d->Hq, (unsigned)d->B,
	                                (unsigned)(32 * spec->tile.nw), 1, 1, (unsigned)spec->tile.smem,
	                                (custream)s, args, NULL);
	if (scratch)
		g->cu.MemFreeAsync(scratch, (custream)s);
	if (r)
		return cu_fail(g, r, "launching fa_attn_fwd (inference layout)", err, errlen);
	return FA_OK;
}

/* gpu_int.h: a decode launch over an inference layout (gpu_infer.c). */
fa_status fa_gpu_decode_launch(struct fa_gpu *g, const struct fa_attn_fwd_desc *d,
                               const struct fa_decode_plan *dp,
                               const struct fa_gpu_decode_layout *lay, CUdeviceptr q,
                               CUdeviceptr k, CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse,
                               CUstream s, char *err, size_t errlen)
{
	return launch_decode(g, d, dp, lay, q, k, v, o, lse, s, err, errlen);
}

/* What a launch of d runs, its kernel loaded and the context current: the caller's tile, else
 * the memo's plan of d's shape (fa_launch_memo.h), else the planners' choice, remembered. On a
 * memo hit the tuning table counts the pick as fa_tune_pick would have. */
static fa_status resolve_launch(struct fa_gpu *g, const struct fa_attn_fwd_desc *d,
                                const struct fa_tile *tile, struct fa_launch_plan *pl,
                                char *err, size_t errlen)
{
	fa_status st;
	struct fa_launch_key key;
	uint64_t gen = 0;
	struct fa_tune_table *tt = tile ? NULL : tune_now(g, &gen);
	const bool memo = !tile && atomic_load_explicit(&g->memo_on, memory_order_relaxed);
	if (memo) {
		fa_launch_key_make(d, &key);
		if (fa_launch_memo_get(&g->memo, &key, tt, gen, pl)) {
			if (pl->tuned)
				fa_tune_table_note(tt, &pl->tune_key, pl->tune_src);
			return fa_gpu_make_current(g, err, errlen);
		}
	}
	if ((st = fa_launch_plan_make(&g->model, &g->ks, tt, d, tile, pl, err, errlen)) != FA_OK)
		return st;
	if ((st = fa_gpu_make_current(g, err, errlen)))
		return st;
	struct kcache_entry *ke = NULL;
	if ((st = get_kernel(g, &pl->spec, &ke, err, errlen)))
		return st;
	pl->kernel = ke;
	if (memo)
		fa_launch_memo_put(&g->memo, &key, tt, gen, pl);
	return FA_OK;
}

fa_status fa_gpu_attn_fwd_tile(struct fa_gpu *g, const struct fa_attn_fwd_desc *d,
                               const struct fa_tile *tile, CUdeviceptr q, CUdeviceptr k,
                               CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse, CUstream s,
                               char *err, size_t errlen)
{
	fa_status st = fa_attn_fwd_check(d, err, errlen);
	if (st != FA_OK)
		return st;
	if (d->B > 65535 || d->Hq > 65535 || d->Sq > INT32_MAX / 2 || d->Sk > INT32_MAX / 2) {
		return fa_err(err, errlen, FA_ESHAPE,
		              "shape too large for the kernel's grid: B=%lld (max 65535), "
		              "Hq=%lld (max 65535), Sq=%lld, Sk=%lld (max 2^30)", (long long)d->B,
		              (long long)d->Hq, (long long)d->Sq, (long long)d->Sk);
	}
	size_t es = fa_dtype_size(d->dtype);
	int64_t qshape[3] = {d->B, d->Sq, d->Hq}, kshape[3] = {d->B, d->Sk, d->Hkv};
	if ((st = check_align("q", q, d->q_stride, qshape, es, err, errlen)) ||
	    (st = check_align("k", k, d->k_stride, kshape, es, err, errlen)) ||
	    (st = check_align("v", v, d->v_stride, kshape, es, err, errlen)) ||
	    (st = check_align("o", o, d->o_stride, qshape, es, err, errlen)))
		return st;
	if (lse % 4) {
		return fa_err(err, errlen, FA_EALIGN, "lse: device pointer is not 4-byte aligned");
	}
	struct fa_launch_plan pl;
	if ((st = resolve_launch(g, d, tile, &pl, err, errlen)))
		return st;
	const struct kcache_entry *ke = pl.kernel;
	if (pl.decode)
		return launch_decode_ke(g, d, &pl.dp, NULL, &pl.spec, ke, q, k, v, o, lse, s, err,
		                        errlen);
	const struct fa_kernel_spec spec = pl.spec;

	if (fa_kpath_is_wg(spec.tile.path))
		return launch_wg(g, ke, &spec, d, q, k, v, o, lse, s, err, errlen);

	struct fa_kparams p;
	memset(&p, 0, sizeof p);
	p.q = q;
	p.k = k;
	p.v = v;
	p.o = o;
	p.lse = lse;
	for (int i = 0; i < 3; i++) {
		p.qs[i] = d->q_stride[i];
		p.ks[i] = d->k_stride[i];
		p.vs[i] = d->v_stride[i];
		p.os[i] = d->o_stride[i];
		p.ls[i] = d->lse_stride[i];
	}
	p.dims = kdims_of(d);
	p.sc = kscale_of(d);
	p.mx = kmaskx_of(d);

	/* fp32 staged as bf16 (kernels/PERF-NOTES.md, "v6: bf16 staging"): K and V converted into
	 * bf16 scratch (stream-ordered; one flat pass keeping their strides where they fill their
	 * ranges, else dense BSHD), Q read as fp32 by the kernel itself (spec.qin), which writes
	 * fp32 O; the scratch is freed in stream order. (v5 converted Q here too: 0.92x of v6,
	 * retired; PERF-NOTES.md.) */
	CUdeviceptr scratch = 0;
	if (d->dtype == FA_DTYPE_FP32 && spec.in == FA_DTYPE_BF16) {
		const bool flat = fills_range(kshape, d->k_stride, d->D) &&
		                  fills_range(kshape, d->v_stride, d->D);
		size_t nk = (size_t)(d->B * d->Sk * d->Hkv * d->D);
		size_t bk = (nk * 2 + 255) / 256 * 256;
		curesult r = g->cu.MemAllocAsync(&scratch, 2 * bk, (custream)s);
		if (r)
			return cu_fail(g, r, "cuMemAllocAsync (bf16 staging)", err, errlen);
		CUdeviceptr dk = scratch, dv = scratch + bk;
		if (flat) {
			st = launch_cvt_flat(g, ke->cvt_flat, k, dk, v, dv, (int64_t)nk, s, err,
			                     errlen);
		} else {
			st = launch_cvt(g, ke->cvt, k, d->k_stride, d->B, d->Sk, d->Hkv, d->D, dk, s,
			                err, errlen);
			if (!st)
				st = launch_cvt(g, ke->cvt, v, d->v_stride, d->B, d->Sk, d->Hkv,
				                d->D, dv, s, err, errlen);
		}
		if (st) {
			g->cu.MemFreeAsync(scratch, (custream)s);
			return st;
		}
		p.k = dk;
		p.v = dv;
		if (!flat) {
			p.ks[0] = p.vs[0] = d->Sk * d->Hkv * d->D;
			p.ks[1] = p.vs[1] = d->Hkv * d->D;
			p.ks[2] = p.vs[2] = d->D;
		}
	}
	unsigned gx = (unsigned)((d->Sq + spec.tile.br - 1) / spec.tile.br);
	void *args[] = {&p};
	curesult r = g->cu.LaunchKernel(ke->fwd, gx, (unsigned)d->Hq, (unsigned)d->B,
	                                (unsigned)(32 * spec.tile.nw), 1, 1, (unsigned)spec.tile.smem,
	                                (custream)s, args, NULL);
	if (scratch)
		g->cu.MemFreeAsync(scratch, (custream)s);
	if (r)
		return cu_fail(g, r, "launching fa_attn_fwd", err, errlen);
	return FA_OK;
}

fa_status fa_gpu_prepare(struct fa_gpu *g, const struct fa_attn_fwd_desc *d,
                         const struct fa_tile *tile, char *err, size_t errlen)
{
	struct fa_tile t;
	fa_status st;
	if (tile) {
		t = *tile;
	} else if (fa_decode_wanted(&g->model, d, &g->ks)) {
		struct fa_decode_plan dp;
		if ((st = fa_plan_decode(&g->model, d, &g->ks, NULL, &dp, err, errlen)))
			return st;
		t = dp.tile;
	} else {
		if ((st = choose_tile(g, d, &t, err, errlen)))
			return st;
	}
	struct fa_kernel_spec spec;
	fa_kernel_spec_make(&spec, g->model.sm, d->dtype, d->precision, (int)d->D, d->mask, &t);
	fa_kernel_spec_mask_ext(&spec, d);
	if ((st = fa_gpu_make_current(g, err, errlen)))
		return st;
	struct kcache_entry *ke;
	return get_kernel(g, &spec, &ke, err, errlen);
}

/* The tile choose_tile would pick for d now, without counting the pick in the tuning table's
 * stats or remembering the class as wanted (fa_gpu_kernel_lookup is a query, not a launch). */
static fa_status peek_tile(struct fa_gpu *g, const struct fa_attn_fwd_desc *d, struct fa_tile *t,
                           char *err, size_t errlen)
{
	struct fa_tile c[FA_PLAN_MAX_CANDIDATES];
	int n = 0;
	if (fa_decode_wanted(&g->model, d, &g->ks)) { /* not tuned: the planner's tile */
		struct fa_decode_plan dp;
		fa_status st = fa_plan_decode(&g->model, d, &g->ks, NULL, &dp, err, errlen);
		if (st == FA_OK)
			*t = dp.tile;
		return st;
	}
	pthread_mutex_lock(&g->lock);
	struct fa_tune_table *tt = g->tune;
	pthread_mutex_unlock(&g->lock);
	fa_status st = fa_gpu_plan(g, d, c, tt ? FA_PLAN_MAX_CANDIDATES : 1, &n, err, errlen);
	if (st != FA_OK)
		return st;
	*t = c[0];
	struct fa_tune_key k;
	struct fa_tune_entry e;
	fa_tune_key_make(d, &k);
	if (tt && fa_tune_table_get(tt, &k, &e))
		for (int i = 0; i < n; i++)
			if (c[i].path == e.best.path && c[i].nw == e.best.nw && c[i].rt == e.best.rt &&
			    c[i].bc == e.best.bc && c[i].stages == e.best.stages) {
				*t = c[i];
				break;
			}
	return FA_OK;
}

fa_status fa_gpu_kernel_lookup(struct fa_gpu *g, const struct fa_attn_fwd_desc *d, bool *ready,
                               char *name, size_t namelen, char *err, size_t errlen)
{
	struct fa_tile t;
	*ready = false;
	if (namelen > 0)
		name[0] = '\0';
	/* a shape launched before under the same tuning state: its kernel is loaded (a loaded
	 * kernel stays loaded), and the memo has its specialisation; no planner run */
	if (atomic_load_explicit(&g->memo_on, memory_order_relaxed)) {
		uint64_t gen = 0;
		struct fa_tune_table *tt = tune_now(g, &gen);
		struct fa_launch_key key;
		struct fa_launch_plan pl;
		fa_launch_key_make(d, &key);
		if (fa_launch_memo_peek(&g->memo, &key, tt, gen, &pl)) {
			fa_kernel_spec_name(&pl.spec, name, namelen);
			*ready = true;
			return FA_OK;
		}
	}
	fa_status st = peek_tile(g, d, &t, err, errlen);
	if (st != FA_OK)
		return st;
	struct fa_kernel_spec spec;
	fa_kernel_spec_make(&spec, g->model.sm, d->dtype, d->precision, (int)d->D, d->mask, &t);
	fa_kernel_spec_mask_ext(&spec, d);
	fa_kernel_spec_name(&spec, name, namelen);
	pthread_mutex_lock(&g->lock);
	for (int i = 0; i < g->ncache && !*ready; i++)
		*ready = spec_same(&g->cache[i].spec, &spec);
	pthread_mutex_unlock(&g->lock);
	return FA_OK;
}

fa_status fa_gpu_attn_fwd(struct fa_gpu *g, const struct fa_attn_fwd_desc *d, CUdeviceptr q,
                          CUdeviceptr k, CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse, CUstream s,
                          char *err, size_t errlen)
{
	return fa_gpu_attn_fwd_tile(g, d, NULL, q, k, v, o, lse, s, err, errlen);
}

/* ---- helpers ------------------------------------------------------------------------------ */
fa_status fa_gpu_alloc(struct fa_gpu *g, size_t bytes, CUdeviceptr *p, char *err, size_t errlen)
{
	g->cu.CtxSetCurrent(g->ctx);
	curesult r = g->cu.MemAlloc(p, bytes ? bytes : 1);
	return r ? cu_fail(g, r, "cuMemAlloc", err, errlen) : FA_OK;
}

void fa_gpu_free(struct fa_gpu *g, CUdeviceptr p)
{
	if (p) {
		g->cu.CtxSetCurrent(g->ctx);
		g->cu.MemFree(p);
	}
}

fa_status fa_gpu_upload(struct fa_gpu *g, CUdeviceptr dst, const void *src, size_t bytes,
                        char *err, size_t errlen)
{
	g->cu.CtxSetCurrent(g->ctx);
	curesult r = g->cu.MemcpyHtoD(dst, src, bytes);
	return r ? cu_fail(g, r, "cuMemcpyHtoD", err, errlen) : FA_OK;
}

fa_status fa_gpu_download(struct fa_gpu *g, void *dst, CUdeviceptr src, size_t bytes, char *err,
                          size_t errlen)
{
	g->cu.CtxSetCurrent(g->ctx);
	curesult r = g->cu.MemcpyDtoH(dst, src, bytes);
	return r ? cu_fail(g, r, "cuMemcpyDtoH", err, errlen) : FA_OK;
}

fa_status fa_gpu_memset8(struct fa_gpu *g, CUdeviceptr dst, uint8_t value, size_t bytes,
                         char *err, size_t errlen)
{
	g->cu.CtxSetCurrent(g->ctx);
	curesult r = g->cu.MemsetD8(dst, value, bytes);
	return r ? cu_fail(g, r, "cuMemsetD8", err, errlen) : FA_OK;
}

fa_status fa_gpu_sync(struct fa_gpu *g, char *err, size_t errlen)
{
	g->cu.CtxSetCurrent(g->ctx);
	curesult r = g->cu.CtxSynchronize();
	return r ? cu_fail(g, r, "cuCtxSynchronize", err, errlen) : FA_OK;
}

struct fa_gpu_timer {
	cuevent a, b;
};

fa_status fa_gpu_timer_start(struct fa_gpu *g, CUstream s, struct fa_gpu_timer **out, char *err,
                             size_t errlen)
{
	struct fa_gpu_timer *t = calloc(1, sizeof *t);
	if (!t)
		return FA_ENOMEM;
	g->cu.CtxSetCurrent(g->ctx);
	curesult r;
	if ((r = g->cu.EventCreate(&t->a, 0)) || (r = g->cu.EventCreate(&t->b, 0)) ||
	    (r = g->cu.EventRecord(t->a, (custream)s))) {
		if (t->a)
			g->cu.EventDestroy(t->a);
		if (t->b)
			g->cu.EventDestroy(t->b);
		free(t);
		return cu_fail(g, r, "cuEvent", err, errlen);
	}
	*out = t;
	return FA_OK;
}

fa_status fa_gpu_timer_stop(struct fa_gpu *g, struct fa_gpu_timer *t, CUstream s, float *ms,
                            char *err, size_t errlen)
{
	curesult r;
	fa_status st = FA_OK;
	g->cu.CtxSetCurrent(g->ctx);
	if ((r = g->cu.EventRecord(t->b, (custream)s)) || (r = g->cu.EventSynchronize(t->b)) ||
	    (r = g->cu.EventElapsedTime(ms, t->a, t->b)))
		st = cu_fail(g, r, "cuEvent timing", err, errlen);
	g->cu.EventDestroy(t->a);
	g->cu.EventDestroy(t->b);
	free(t);
	return st;
}
