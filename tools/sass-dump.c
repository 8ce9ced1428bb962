/* sass-dump.c - compile a fixed list of kernel specialisations through the project's own NVRTC
 * layer (fa_kernel_spec_make, fa_nvrtc_compile: the options and sources the daemon uses) and
 * write one cubin per specialisation, so that two trees can be compared instruction for
 * instruction (tools/sass-diff.sh runs cuobjdump -sass on both). No GPU needed.
 *
 *   sass-dump OUTDIR [SUBSTRING]   cubins OUTDIR/<spec name>.cubin; SUBSTRING keeps the
 *                                  specialisations whose name contains it
 *   SASS_DUMP_LIST=1 sass-dump -   the list instead: name, source file, NVRTC options
 *   SASS_DUMP_PTX=1 sass-dump OUTDIR [SUBSTRING]
 *                                  the PTX instead, OUTDIR/<spec name>.ptx: the same source
 *                                  and options for the virtual target (compute_90a for
 *                                  sm_90a), no ptxas; identical PTX means identical SASS, and
 *                                  it needs no nvdisasm (compare with cmp)
 *   SASS_DUMP_USAGE=1 sass-dump OUTDIR [SUBSTRING]
 *                                  cubins, and ptxas' registers, spills and stack per kernel
 *
 * The list covers every path (mma.sync fp16, bf16, fp32 ieee / 3xtf32 / tf32 / bf16 staging;
 * wgmma tf32, 3xtf32, 16-bit two-stage and overlapped), padded and unpadded head dims, the three
 * masks, one to three stages, warp pairs, on sm_80, sm_89 and sm_90. The tiles are written out
 * here rather than asked of the planner, so that a planner change cannot change the list.
 * Built by `make sass-dump`; not part of `all`.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_gpu.h"
#include "fa_kernel_src.h"
#include "fa_planner.h"

struct job {
	struct fa_kernel_spec spec;
	char name[160];
	fa_status st;
	char err[2048];
};

static struct fa_nvrtc *nv;
static struct job *jobs;
static int njobs, next_job;
static const char *outdir;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* SASS_DUMP_PTX: NVRTC's own entry points, as the project's layer does not return PTX */
static struct {
	int (*create)(void **, const char *, const char *, int, const char *const *,
	              const char *const *);
	int (*compile)(void *, int, const char *const *);
	int (*log_size)(void *, size_t *);
	int (*log)(void *, char *);
	int (*ptx_size)(void *, size_t *);
	int (*ptx)(void *, char *);
	int (*destroy)(void **);
} ptxfn;
static bool want_ptx;

static int ptx_open(void)
{
	void *lib = dlopen(FA_CUDA_HOME "/lib64/libnvrtc.so.13", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		lib = dlopen("libnvrtc.so.13", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return -1;
	*(void **)&ptxfn.create = dlsym(lib, "nvrtcCreateProgram");
	*(void **)&ptxfn.compile = dlsym(lib, "nvrtcCompileProgram");
	*(void **)&ptxfn.log_size = dlsym(lib, "nvrtcGetProgramLogSize");
	*(void **)&ptxfn.log = dlsym(lib, "nvrtcGetProgramLog");
	*(void **)&ptxfn.ptx_size = dlsym(lib, "nvrtcGetPTXSize");
	*(void **)&ptxfn.ptx = dlsym(lib, "nvrtcGetPTX");
	*(void **)&ptxfn.destroy = dlsym(lib, "nvrtcDestroyProgram");
	bool all = ptxfn.create && ptxfn.compile && ptxfn.log_size && ptxfn.log && ptxfn.ptx_size &&
	           ptxfn.ptx && ptxfn.destroy;
	return all ? 0 : -1;
}

/* The PTX of j's spec: fa_nvrtc_compile's source, header and options, with the real target
 * (-arch=sm_90a) made virtual (compute_90a) and ptxas' options dropped. */
static fa_status ptx_compile(struct job *j, char **ptx, size_t *len)
{
	struct fa_nvrtc_opts o;
	const char *opts[FA_NVRTC_MAX_OPTS];
	char arch[64];
	int k = 0;
	fa_nvrtc_options(nv, &j->spec, &o);
	for (int i = 0; i < o.n; i++) {
		if (strncmp(o.v[i], "--ptxas-options", 15) == 0)
			continue;
		if (strncmp(o.v[i], "-arch=sm_", 9) == 0) {
			snprintf(arch, sizeof arch, "-arch=compute_%s", o.v[i] + 9);
			opts[k++] = arch;
			continue;
		}
		opts[k++] = o.v[i];
	}
	const char *src;
	size_t srclen;
	fa_kernel_source(&j->spec, &src, &srclen);
	const char *const hdr[1] = {fa_src_fa_device}, *const hdr_name[1] = {FA_DEVICE_HEADER_NAME};
	void *prog = NULL;
	if (ptxfn.create(&prog, src,
	              fa_kpath_is_wg(j->spec.tile.path) ? "attn_fwd_sm90.cu" : "attn_fwd.cu", 1, hdr,
	              hdr_name) != 0) {
		snprintf(j->err, sizeof j->err, "nvrtcCreateProgram failed");
		return FA_EINTERNAL;
	}
	fa_status st = FA_OK;
	if (ptxfn.compile(prog, k, opts) != 0) {
		size_t ls = 0;
		ptxfn.log_size(prog, &ls);
		char *log = malloc(ls + 1);
		if (log) {
			log[0] = 0;
			ptxfn.log(prog, log);
			log[ls] = 0;
		}
		snprintf(j->err, sizeof j->err, "%.2000s", log ? log : "compile failed");
		free(log);
		st = FA_EINTERNAL;
	} else if (ptxfn.ptx_size(prog, len) != 0 || !(*ptx = malloc(*len)) ||
	           ptxfn.ptx(prog, *ptx) != 0) {
		snprintf(j->err, sizeof j->err, "no PTX");
		st = FA_EINTERNAL;
	}
	ptxfn.destroy(&prog);
	if (st == FA_OK && *len && (*ptx)[*len - 1] == 0)
		(*len)--; /* the size counts the NUL */
	return st;
}

/* The window and softcap specialisations of the next add() calls (their names end in "win",
 * "cap"; the default ones are named as before, so trees without them compare). */
static bool ext_win, ext_cap;

static void add(int sm, fa_dtype dt, fa_precision p, int D, fa_mask m, int path, int nw, int rt,
                int bc, int stages, const char *filter)
{
	struct fa_tile t;
	memset(&t, 0, sizeof t);
	t.path = path;
	t.nw = nw;
	t.rt = rt;
	t.bc = bc;
	t.stages = stages;
	if (fa_kpath_is_decode(path))
		t.br = rt; /* the decode tiles' packed rows per block */
	struct job *j = &jobs[njobs];
	memset(j, 0, sizeof *j);
	fa_kernel_spec_make(&j->spec, sm, dt, p, D, m, &t);
#ifdef FA_KERNEL_SPEC_MASK_EXT
	j->spec.window = ext_win;
	j->spec.softcap = ext_cap;
#endif
	fa_kernel_spec_name(&j->spec, j->name, sizeof j->name);
	for (char *c = j->name; *c; c++)
		if (*c == ' ' || *c == '>' || *c == '+')
			*c = *c == '>' ? '-' : '_';
	for (int i = 0; i < njobs; i++)
		if (strcmp(jobs[i].name, j->name) == 0)
			return;
	if (filter && !strstr(j->name, filter))
		return;
	njobs++;
}

static void *worker(void *arg)
{
	(void)arg;
	for (;;) {
		pthread_mutex_lock(&lock);
		int i = next_job++;
		pthread_mutex_unlock(&lock);
		if (i >= njobs)
			return NULL;
		struct job *j = &jobs[i];
		void *cubin = NULL;
		size_t sz = 0;
		if (want_ptx)
			j->st = ptx_compile(j, (char **)&cubin, &sz);
		else
		{
			struct fa_kernel_usage u;
			j->st = fa_nvrtc_compile(nv, &j->spec, &cubin, &sz, &u, j->err, sizeof j->err);
			if (j->st == FA_OK && getenv("SASS_DUMP_USAGE"))
				fprintf(stderr, "%s: %d registers, %d bytes spill stores, %d stack\n",
				        j->name, u.regs, u.spill_stores, u.stack);
		}
		if (j->st != FA_OK)
			continue;
		char path[4096];
		snprintf(path, sizeof path, "%s/%s.%s", outdir, j->name, want_ptx ? "ptx" : "cubin");
		FILE *f = fopen(path, "wb");
		if (!f || fwrite(cubin, 1, sz, f) != sz) {
			j->st = FA_ESYS;
			snprintf(j->err, sizeof j->err, "cannot write %.1800s", path);
		}
		if (f)
			fclose(f);
		free(cubin);
	}
}

int main(int argc, char **argv)
{
	char err[512];
	if (argc < 2) {
		fprintf(stderr, "usage: %s OUTDIR [SUBSTRING]\n", argv[0]);
		return 2;
	}
	outdir = argv[1];
	const char *filter = argc > 2 ? argv[2] : NULL;
	setenv("CUDA_CACHE_DISABLE", "1", 1); /* NVRTC's program cache would hide nothing, but costs */
#ifdef FA_KERNEL_SETTINGS_INIT /* the tree since the settings struct; before, its NVRTC read none */
	if (fa_nvrtc_open(&nv, NULL, err, sizeof err) != FA_OK) {
#else
	if (fa_nvrtc_open(&nv, err, sizeof err) != FA_OK) {
#endif
		fprintf(stderr, "sass-dump: %s\n", err);
		return 1;
	}
	jobs = calloc(4096, sizeof *jobs);
	if (!jobs)
		return 1;

	static const struct {
		fa_dtype dt;
		fa_precision p;
	} kinds[] = {{FA_DTYPE_FP16, FA_PREC_DEFAULT}, {FA_DTYPE_BF16, FA_PREC_DEFAULT},
	             {FA_DTYPE_FP32, FA_PREC_IEEE},    {FA_DTYPE_FP32, FA_PREC_3XTF32},
	             {FA_DTYPE_FP32, FA_PREC_TF32},    {FA_DTYPE_FP32, FA_PREC_BF16}};
	static const int sms[] = {80, 89, 90};
	static const int Ds[] = {8, 40, 64, 128, 256};
	/* mma.sync tiles: nw, rt, bc, stages */
	static const int mt[][4] = {{4, 1, 64, 2}, {4, 2, 64, 2}, {8, 1, 64, 2}, {4, 1, 32, 3},
	                            {2, 2, 128, 2}, {8, 1, 32, 2}, {4, 1, 64, 1}, {4, 2, 32, 3}};
	const int nmt = (int)(sizeof mt / sizeof mt[0]);
	int k = 0;
	for (int a = 0; a < 3; a++)
		for (int d = 0; d < 6; d++)
			for (int e = 0; e < 5; e++, k++) {
				const int *x = mt[k % nmt];
				int path = fa_plan_path(kinds[d].dt, kinds[d].p);
				/* ieee above d128: minutes of ptxas each, and a path the planner ranks last */
				if (kinds[d].p == FA_PREC_IEEE && Ds[e] > 128)
					continue;
				add(sms[a], kinds[d].dt, kinds[d].p, Ds[e], (fa_mask)(k % 3), path, x[0], x[1],
				    x[2], x[3], filter);
			}
	/* the warp pairs (d256 128x64 w8r1 s2) on every 16-bit kind and mask */
	for (int a = 0; a < 3; a += 2)
		for (int d = 0; d < 6; d++)
			for (int m = 0; m < 3; m++)
				if (kinds[d].dt != FA_DTYPE_FP32 || kinds[d].p == FA_PREC_BF16)
					add(sms[a], kinds[d].dt, kinds[d].p, 256, (fa_mask)m, FA_KPATH_16, 8, 1,
					    64, 2, filter);
	/* wgmma (sm_90a): tf32, 3xtf32 and 16-bit (fp16, bf16, fp32 staged); nwg 1-2, keys, stages
	 * (16-bit three stages = the overlapped loop) */
	static const int wt[][3] = {{2, 64, 2}, {1, 32, 2}, {2, 32, 3}, {1, 64, 3}, {2, 128, 2}, {2, 16, 2}};
	const int nwt = (int)(sizeof wt / sizeof wt[0]);
	static const int wDs[] = {40, 128, 256};
	k = 0;
	for (int d = 0; d < 6; d++) {
		if (kinds[d].dt == FA_DTYPE_FP32 && kinds[d].p == FA_PREC_IEEE)
			continue;
		bool w16 = kinds[d].dt != FA_DTYPE_FP32 || kinds[d].p == FA_PREC_BF16;
		for (int e = 0; e < 3; e++)
			for (int u = 0; u < 2; u++, k++) {
				const int *x = wt[k % nwt];
				if (x[1] == (w16 ? 16 : 128))
					x = wt[(k + 1) % nwt];
				if (kinds[d].p == FA_PREC_3XTF32 && wDs[e] > 128)
					continue;
				add(90, kinds[d].dt, kinds[d].p, wDs[e], (fa_mask)(k % 3), FA_KPATH_WG16,
				    4 * x[0], 1, x[1], x[2], filter);
			}
	}
	/* 3xtf32 above head dim 128 (attn_fwd_sm90.cu's X3S: one warpgroup, 16 keys, the half-tile
	 * ring): D = 256 with each mask, 136 and 200 (P V in a 128-column and a narrower part) */
	for (int m = 0; m < 3; m++)
		add(90, FA_DTYPE_FP32, FA_PREC_3XTF32, 256, (fa_mask)m, FA_KPATH_WG16, 4, 1, 16, 2, filter);
	add(90, FA_DTYPE_FP32, FA_PREC_3XTF32, 136, FA_MASK_CAUSAL_TOP_LEFT, FA_KPATH_WG16, 4, 1, 16, 2,
	    filter);
	add(90, FA_DTYPE_FP32, FA_PREC_3XTF32, 200, FA_MASK_NONE, FA_KPATH_WG16, 4, 1, 16, 2, filter);
#ifdef FA_KERNEL_SPEC_MASK_EXT
	ext_win = ext_cap = true; /* and with the window and softcap */
	add(90, FA_DTYPE_FP32, FA_PREC_3XTF32, 256, FA_MASK_NONE, FA_KPATH_WG16, 4, 1, 16, 2, filter);
	ext_win = ext_cap = false;
#endif
#ifdef FA_KERNEL_SPEC_MASK_EXT
	/* the sliding window and softcap (FA_WIN, FA_SOFTCAP): mma.sync (every kind, a pair tile),
	 * wgmma (tf32, 3xtf32, 16-bit two-stage and overlapped) and decode, each flag alone and
	 * both; then the decode kernels without them (their default PTX) */
	for (int x = 1; x < 4; x++) {
		ext_win = x & 1;
		ext_cap = x & 2;
		for (int d = 0; d < 6; d++) {
			int path = fa_plan_path(kinds[d].dt, kinds[d].p);
			add(90, kinds[d].dt, kinds[d].p, 128, (fa_mask)(x % 3), path, 4, 2, 64, 2, filter);
			add(90, kinds[d].dt, kinds[d].p, 64, (fa_mask)((x + 1) % 3), path, 4, 1, 32, 3,
			    filter);
			if (kinds[d].dt != FA_DTYPE_FP32 || kinds[d].p == FA_PREC_BF16)
				add(90, kinds[d].dt, kinds[d].p, 256, FA_MASK_NONE, FA_KPATH_16, 8, 1, 64,
				    2, filter);
			if (kinds[d].p != FA_PREC_IEEE) {
				add(90, kinds[d].dt, kinds[d].p, 128, (fa_mask)(x % 3), FA_KPATH_WG16, 8,
				    1, 64, 2, filter);
				add(90, kinds[d].dt, kinds[d].p, 64, FA_MASK_NONE, FA_KPATH_WG16, 4, 1, 64,
				    3, filter);
			}
		}
	}
	for (int x = 0; x < 4; x++) {
		ext_win = x & 1;
		ext_cap = x & 2;
		add(90, FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, (fa_mask)(x % 3), FA_KPATH_DEC16, 4, 16,
		    16, 3, filter);
		add(90, FA_DTYPE_FP16, FA_PREC_DEFAULT, 64, FA_MASK_NONE, FA_KPATH_DEC16, 2, 32, 16, 2,
		    filter);
		add(90, FA_DTYPE_FP32, FA_PREC_DEFAULT, 128, (fa_mask)((x + 1) % 3), FA_KPATH_DEC32, 4,
		    4, 16, 3, filter);
	}
	ext_win = ext_cap = false;
#endif

	/* SASS_DUMP_LIST=1: print "name<TAB>source<TAB>options" per specialisation, compile nothing */
	const char *ls = getenv("SASS_DUMP_LIST");
	if (ls && strcmp(ls, "1") == 0) {
		for (int i = 0; i < njobs; i++) {
			struct fa_nvrtc_opts o;
#ifdef FA_KERNEL_SETTINGS_INIT
			fa_nvrtc_options(nv, &jobs[i].spec, &o);
#else
			fa_nvrtc_options(&jobs[i].spec, &o);
#endif
			printf("%s\t%s", jobs[i].name,
			       fa_kpath_is_wg(jobs[i].spec.tile.path) ? "attn_fwd_sm90.cu" : "attn_fwd.cu");
			for (int q = 0; q < o.n; q++)
				printf("%s%s", q ? " " : "\t", o.v[q]);
			printf("\n");
		}
		fa_nvrtc_close(nv);
		free(jobs);
		return 0;
	}
	const char *wp = getenv("SASS_DUMP_PTX");
	want_ptx = wp && strcmp(wp, "1") == 0;
	if (want_ptx && ptx_open() != 0) {
		fprintf(stderr, "sass-dump: NVRTC (for PTX) not found\n");
		return 1;
	}
	int nth = 2;
	const char *e = getenv("SASS_DUMP_THREADS");
	if (e && atoi(e) > 0)
		nth = atoi(e);
	pthread_t th[16];
	for (int i = 0; i < nth && i < 16; i++)
		pthread_create(&th[i], NULL, worker, NULL);
	for (int i = 0; i < nth && i < 16; i++)
		pthread_join(th[i], NULL);
	int bad = 0;
	for (int i = 0; i < njobs; i++)
		if (jobs[i].st != FA_OK) {
			fprintf(stderr, "%s: %.400s\n", jobs[i].name, jobs[i].err);
			bad++;
		}
	printf("sass-dump: %d specialisations, %d failed\n", njobs, bad);
	fa_nvrtc_close(nv);
	free(jobs);
	return bad ? 1 : 0;
}
