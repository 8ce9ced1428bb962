/* gpu_nvrtc.c - compiling kernel specialisations with NVRTC, loaded at run time.
 *
 * libnvrtc is dlopen'ed ($FA_CUDA_HOME/lib64 first, then the loader's path), never linked, so
 * programs start where CUDA is absent. The compile asks ptxas for its resource report
 * (--ptxas-options=-v) and parses it: the compile checks and the GPU launcher both read it.
 */
#include "fa_gpu.h"
#include "fa_err.h"
#include "fa_time.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef FA_CUDA_HOME
#define FA_CUDA_HOME "/usr/local/cuda"
#endif

#include "fa_kernel_src.h"

typedef int nvrtcResult_t;
typedef void *nvrtcProgram_t;

struct fa_nvrtc {
	void *lib;
	int major, minor;
	char extra[FA_KERNEL_SETTINGS_EXTRA_MAX]; /* FA_NVRTC_EXTRA, copied at open */
	nvrtcResult_t (*Version)(int *, int *);
	nvrtcResult_t (*CreateProgram)(nvrtcProgram_t *, const char *, const char *, int,
	                               const char *const *, const char *const *);
	nvrtcResult_t (*CompileProgram)(nvrtcProgram_t, int, const char *const *);
	nvrtcResult_t (*GetProgramLogSize)(nvrtcProgram_t, size_t *);
	nvrtcResult_t (*GetProgramLog)(nvrtcProgram_t, char *);
	nvrtcResult_t (*GetCUBINSize)(nvrtcProgram_t, size_t *);
	nvrtcResult_t (*GetCUBIN)(nvrtcProgram_t, char *);
	nvrtcResult_t (*DestroyProgram)(nvrtcProgram_t *);
	const char *(*GetErrorString)(nvrtcResult_t);
};

/* Try the toolkit's copy first (FA_CUDA_HOME), then the settings' CUDA_HOME, then whatever the
 * loader finds. */
fa_status fa_nvrtc_open(struct fa_nvrtc **out, const struct fa_kernel_settings *ks, char *err,
                        size_t errlen)
{
	if (!ks)
		ks = fa_kernel_settings_default();
	const char *home = ks->cuda_home;
	char path[512];
	const char *names[] = {NULL, NULL, "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
	char p1[FA_KERNEL_SETTINGS_PATH_MAX + 32];
	void *lib = NULL;
	*out = NULL;
	snprintf(path, sizeof path, "%s/lib64/libnvrtc.so.13", FA_CUDA_HOME);
	names[0] = path;
	if (home && *home) {
		snprintf(p1, sizeof p1, "%s/lib64/libnvrtc.so.13", home);
		names[1] = p1;
	}
	const char *last = "";
	for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) {
		if (!names[i])
			continue;
		lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (!lib)
			last = dlerror();
	}
	if (!lib) {
		return fa_err(err, errlen, FA_ENOGPU,
		              "NVRTC not found (%s/lib64/libnvrtc.so.13 nor on the loader path): %s",
		              FA_CUDA_HOME, last ? last : "");
	}
	struct fa_nvrtc *n = calloc(1, sizeof *n);
	if (!n) {
		dlclose(lib);
		return FA_ENOMEM;
	}
	n->lib = lib;
	snprintf(n->extra, sizeof n->extra, "%s", ks->nvrtc_extra);
#define SYM(field, name)                                                                        \
	do {                                                                                       \
		*(void **)&n->field = dlsym(lib, name);                                                \
		if (!n->field) {                                                                       \
			snprintf(err, errlen, "NVRTC lacks %s", name);                                     \
			dlclose(lib);                                                                      \
			free(n);                                                                           \
			return FA_ENOGPU;                                                                  \
		}                                                                                      \
	} while (0)
	SYM(Version, "nvrtcVersion");
	SYM(CreateProgram, "nvrtcCreateProgram");
	SYM(CompileProgram, "nvrtcCompileProgram");
	SYM(GetProgramLogSize, "nvrtcGetProgramLogSize");
	SYM(GetProgramLog, "nvrtcGetProgramLog");
	SYM(GetCUBINSize, "nvrtcGetCUBINSize");
	SYM(GetCUBIN, "nvrtcGetCUBIN");
	SYM(DestroyProgram, "nvrtcDestroyProgram");
	SYM(GetErrorString, "nvrtcGetErrorString");
#undef SYM
	n->Version(&n->major, &n->minor);
	*out = n;
	return FA_OK;
}

/* The library stays loaded: NVRTC keeps C++ runtime state (its exception pool, thread-local
 * data) that is not released by dlclose, and unloading it while another fa_nvrtc handle or a
 * thread still uses it is undefined. dlopen counts references, so reopening is cheap. */
void fa_nvrtc_close(struct fa_nvrtc *n)
{
	if (!n)
		return;
	free(n);
}

void fa_nvrtc_version(const struct fa_nvrtc *n, int *major, int *minor)
{
	*major = n ? n->major : 0;
	*minor = n ? n->minor : 0;
}

/* fp32 staged as bf16 is a bf16 kernel reading fp32 Q and writing fp32; other fp32 precisions
 * read fp32. */
void fa_kernel_spec_make(struct fa_kernel_spec *s, int sm, fa_dtype dt, fa_precision prec, int D,
                         fa_mask mask, const struct fa_tile *tile)
{
	memset(s, 0, sizeof *s);
	s->sm = sm;
	s->D = D;
	s->mask = mask;
	s->tile = *tile;
	if (fa_kpath_is_decode(tile->path)) {
		/* attn_decode.cu reads and writes dt; its fp32 path is FFMA for every precision, so
		 * one binary serves them all */
		s->in = s->out = s->qin = dt;
		s->precision = FA_PREC_DEFAULT;
		s->tile.path = dt == FA_DTYPE_FP32 ? FA_KPATH_DEC32 : FA_KPATH_DEC16;
		s->tile.rt = 1;
		s->tile.smem = fa_decode_smem(&s->tile, D);
		return;
	}
	prec = fa_prec_resolve(dt, prec);
	if (dt == FA_DTYPE_FP32 && prec == FA_PREC_BF16) {
		s->in = FA_DTYPE_BF16;
		s->out = FA_DTYPE_FP32;
		s->qin = FA_DTYPE_FP32;
		s->precision = FA_PREC_DEFAULT;
	} else {
		s->in = dt;
		s->out = dt;
		s->qin = dt;
		s->precision = dt == FA_DTYPE_FP32 ? prec : FA_PREC_DEFAULT;
	}
	if (fa_kpath_is_bwd(tile->path)) {
		/* attn_bwd.cu: in = the tensor cores' type, qin = the global type of every tensor */
		s->qin = dt;
		if (tile->path == FA_KPATH_BWDWG16 && dt != FA_DTYPE_FP32) {
			/* attn_bwd_sm90.cu: 64 query rows, two Q/dO buffers; rt 2: FA_DET 1 (turns), 3:
			 * FA_DET 2 (fixed point); 64 keys a warpgroup, or above head dim 128 (the wide
			 * form) 64 keys for both */
			s->tile.rt = tile->rt == 2 || tile->rt == 3 ? tile->rt : 1;
			s->tile.br = 64;
			s->tile.stages = 2;
			s->tile.bc = D > 128 ? 64 : 16 * s->tile.nw;
			s->tile.smem = fa_bwd_tile_smem(&s->tile, D);
			return;
		}
		if (fa_kpath_is_bwdwg32(tile->path) && dt == FA_DTYPE_FP32 &&
		    (prec == FA_PREC_TF32 || prec == FA_PREC_3XTF32)) {
			/* attn_bwd_sm90_tf32.cu: one or two warpgroups on 64 keys, 32 or 64 query rows,
			 * two step buffers; the path follows the precision (its images) */
			s->tile.path = prec == FA_PREC_3XTF32 ? FA_KPATH_BWDWG32X3 : FA_KPATH_BWDWG32;
			/* 3: FA_DET 2 (tf32), 4: FA_DET 3 (3xtf32): the fixed-point deterministic dQ */
			s->tile.rt = tile->rt == 3 && prec == FA_PREC_TF32     ? 3
			             : tile->rt == 4 && prec == FA_PREC_3XTF32 ? 4
			                                                       : 1;
			s->tile.nw = tile->nw == 4 ? 4 : 8;
			s->tile.bc = 64;
			s->tile.br = tile->br == 64 && prec == FA_PREC_TF32 ? 64 : 32;
			s->tile.stages = 2;
			s->tile.smem = fa_bwd_tile_smem(&s->tile, D);
			return;
		}
		s->tile.path = s->in == FA_DTYPE_FP32 ? FA_KPATH_BWD32 : FA_KPATH_BWD16;
		/* 2: the deterministic dQ by turns (FA_DET 1); 3: in fixed point (FA_DET 2), where
		 * the precision is not fp32 ieee / 3xtf32 */
		const bool fixed_ok = !(s->in == FA_DTYPE_FP32 && prec != FA_PREC_TF32);
		/* 4: in 64-bit fixed point (FA_DET 3), fp32 only (the fp32 wgmma backward's passes) */
		const bool fixed64_ok = s->in == FA_DTYPE_FP32;
		s->tile.rt = tile->rt == 3   ? (fixed_ok ? 3 : 2)
		             : tile->rt == 4 ? (fixed64_ok ? 4 : 2)
		             : tile->rt == 2 ? 2
		                             : 1;
		s->tile.stages = tile->stages == 2 ? 2 : 1;
		s->tile.smem = fa_bwd_tile_smem(&s->tile, D);
		return;
	}
	if (fa_kpath_is_wg(tile->path) && s->in == FA_DTYPE_FP32 &&
	    (s->precision == FA_PREC_TF32 || s->precision == FA_PREC_3XTF32))
		s->tile.path = s->precision == FA_PREC_3XTF32 ? FA_KPATH_WG32X3 : FA_KPATH_WG32;
	else if (fa_kpath_is_wg(tile->path) && s->in != FA_DTYPE_FP32) {
		s->tile.path = FA_KPATH_WG16;
		if (dt == FA_DTYPE_FP32) /* the wgmma kernel converts Q, K and V itself */
			s->qin = FA_DTYPE_FP32;
	}
	else
		s->tile.path = s->in == FA_DTYPE_FP32 ? FA_KPATH_32 : FA_KPATH_16;
	s->tile.br = 16 * s->tile.nw * s->tile.rt;
	s->tile.smem = fa_tile_smem(&s->tile, D);
}

void fa_kernel_spec_mask_ext(struct fa_kernel_spec *s, const struct fa_attn_fwd_desc *d)
{
	s->window = fa_attn_window_active(d);
	s->softcap = d->softcap > 0;
}

static const char *short_dt(fa_dtype d)
{
	return d == FA_DTYPE_FP16 ? "fp16" : d == FA_DTYPE_BF16 ? "bf16" : "fp32";
}

/* " win", " cap": the window and softcap specialisations (nothing for the others, so their
 * names, hence the sass-dump files and log lines, stay as they were). */
static void name_ext(const struct fa_kernel_spec *s, char *buf, size_t len)
{
	size_t n = strlen(buf);
	if (s->window && n < len)
		n += (size_t)snprintf(buf + n, len - n, " win");
	if (s->softcap && n < len)
		snprintf(buf + n, len - n, " cap");
}

void fa_kernel_spec_name(const struct fa_kernel_spec *s, char *buf, size_t len)
{
	char tb[48];
	fa_tile_format(&s->tile, tb, sizeof tb);
	/* Q read as fp32 by a 16-bit kernel: "bf16+q32" */
	bool q32 = s->qin == FA_DTYPE_FP32 && s->in != FA_DTYPE_FP32;
	if (fa_kpath_is_bwd(s->tile.path)) { /* "sm90 bwd fp32 3xtf32 d128 causal-br kv64 q32 w8" */
		snprintf(buf, len, "sm%d bwd %s%s%s%s d%d %s %s%s", s->sm, short_dt(s->qin),
		         s->in != s->qin ? " staged-bf16" : "", s->in == FA_DTYPE_FP32 ? " " : "",
		         s->in == FA_DTYPE_FP32 ? fa_prec_name(s->precision) : "", s->D,
		         s->mask == FA_MASK_NONE ? "nomask" : s->mask == FA_MASK_CAUSAL_TOP_LEFT ? "causal-tl" : "causal-br",
		         tb + 4, s->tile.rt == 2   ? " det"
		                 : s->tile.rt == 3 ? " det-fixed"
		                 : s->tile.rt == 4 ? " det-fixed64"
		                                   : "");
		if ((s->tile.path == FA_KPATH_BWDWG16 || fa_kpath_is_bwdwg32(s->tile.path)) &&
		    strlen(buf) < len)
			snprintf(buf + strlen(buf), len - strlen(buf), " wgmma");
		name_ext(s, buf, len);
		return;
	}
	const bool p32 = s->in == FA_DTYPE_FP32 && !fa_kpath_is_decode(s->tile.path);
	snprintf(buf, len, "sm%d %s%s>%s%s%s d%d %s %s%s", s->sm, short_dt(s->in), q32 ? "+q32" : "",
	         short_dt(s->out), p32 ? " " : "", p32 ? fa_prec_name(s->precision) : "", s->D,
	         s->mask == FA_MASK_NONE ? "nomask" : s->mask == FA_MASK_CAUSAL_TOP_LEFT ? "causal-tl" : "causal-br",
	         tb, s->layout == FA_KLAYOUT_SEQ ? " varlen" : s->layout == FA_KLAYOUT_PAGED ? " paged" : "");
	name_ext(s, buf, len);
}

/* Read "<n> bytes stack frame, <n> bytes spill stores, <n> bytes spill loads" and "Used <n>
 * registers" for the entry fa_attn_fwd from ptxas' verbose log. */
void fa_kernel_source(const struct fa_kernel_spec *s, const char **src, size_t *len)
{
	bool wg = fa_kpath_is_wg(s->tile.path);
	if (s->tile.path == FA_KPATH_BWDWG16) {
		*src = fa_src_attn_bwd_sm90;
		*len = fa_src_attn_bwd_sm90_len;
		return;
	}
	if (fa_kpath_is_bwdwg32(s->tile.path)) {
		*src = fa_src_attn_bwd_sm90_tf32;
		*len = fa_src_attn_bwd_sm90_tf32_len;
		return;
	}
	if (fa_kpath_is_bwd(s->tile.path)) {
		*src = fa_src_attn_bwd;
		*len = fa_src_attn_bwd_len;
		return;
	}
	if (fa_kpath_is_decode(s->tile.path)) {
		*src = fa_src_attn_decode;
		*len = fa_src_attn_decode_len;
		return;
	}
	*src = wg ? fa_src_attn_fwd_sm90 : fa_src_attn_fwd;
	*len = wg ? fa_src_attn_fwd_sm90_len : fa_src_attn_fwd_len;
}

/* entry: the main kernel's name (fa_attn_fwd, or fa_attn_decode on the decode paths) */
static void parse_usage(const char *log, const char *entry, struct fa_kernel_usage *u)
{
	char want[64];
	u->regs = u->stack = u->spill_stores = u->spill_loads = -1;
	u->serialized = strstr(log, "wgmma.mma_async instructions are serialized") != NULL;
	snprintf(want, sizeof want, "Function properties for %s", entry);
	const char *p = strstr(log, want);
	if (!p)
		return;
	const char *q = strstr(p, "bytes stack frame");
	if (q) {
		const char *r = q;
		while (r > p && r[-1] == ' ')
			r--;
		while (r > p && r[-1] >= '0' && r[-1] <= '9')
			r--;
		u->stack = atoi(r);
		sscanf(q, "bytes stack frame, %d bytes spill stores, %d bytes spill loads",
		       &u->spill_stores, &u->spill_loads);
	}
	q = strstr(p, "Used ");
	if (q)
		sscanf(q, "Used %d registers", &u->regs);
}

/* The options are built in one place so that the disk cache's key (gpu_diskcache.c) hashes
 * exactly what the compile is given, FA_NVRTC_EXTRA included. */
void fa_nvrtc_options(const struct fa_nvrtc *n, const struct fa_kernel_spec *s,
                      struct fa_nvrtc_opts *o)
{
	int k = 0;
	int in = s->in == FA_DTYPE_FP16 ? 1 : s->in == FA_DTYPE_BF16 ? 2 : 3;
	int out = s->out == FA_DTYPE_FP16 ? 1 : s->out == FA_DTYPE_BF16 ? 2 : 3;
	int qin = s->qin == FA_DTYPE_FP16 ? 1 : s->qin == FA_DTYPE_BF16 ? 2
	        : s->qin == FA_DTYPE_FP32 ? 3 : in;
	int prec = s->precision == FA_PREC_IEEE ? 1 : s->precision == FA_PREC_TF32 ? 3 : 2;
	/* attn_fwd_sm90.cu (wg): the "a" target for wgmma, warpgroups instead of warps and row
	 * tiles; its 16-bit kernel (w16) takes the element types, its fp32 one the precision */
	bool wg = fa_kpath_is_wg(s->tile.path), w16 = s->tile.path == FA_KPATH_WG16;

	memset(o, 0, sizeof *o);
	if (s->tile.path == FA_KPATH_BWDWG16) { /* attn_bwd_sm90.cu's parameters */
		snprintf(o->v[k++], sizeof o->v[0], "-arch=sm_%da", s->sm);
		snprintf(o->v[k++], sizeof o->v[0], "-std=c++17");
		snprintf(o->v[k++], sizeof o->v[0], "--ptxas-options=-v");
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_IN=%d", in);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_D=%d", s->D);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_NWG=%d", s->tile.nw / 4);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_BQ=%d", s->tile.br);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_MASK=%d", (int)s->mask);
		if (s->tile.rt == 2 || s->tile.rt == 3)
			snprintf(o->v[k++], sizeof o->v[0], "-DFA_DET=%d", s->tile.rt - 1);
		goto ext;
	}
	if (fa_kpath_is_bwdwg32(s->tile.path)) { /* attn_bwd_sm90_tf32.cu's parameters */
		snprintf(o->v[k++], sizeof o->v[0], "-arch=sm_%da", s->sm);
		snprintf(o->v[k++], sizeof o->v[0], "-std=c++17");
		snprintf(o->v[k++], sizeof o->v[0], "--ptxas-options=-v");
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_PREC=%d",
		         s->tile.path == FA_KPATH_BWDWG32X3 ? 2 : 3);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_D=%d", s->D);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_NWG=%d", s->tile.nw / 4);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_BQ=%d", s->tile.br);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_MASK=%d", (int)s->mask);
		if (s->tile.rt == 3 || s->tile.rt == 4)
			snprintf(o->v[k++], sizeof o->v[0], "-DFA_DET=%d", s->tile.rt - 1);
		goto ext;
	}
	if (fa_kpath_is_bwd(s->tile.path)) { /* attn_bwd.cu's parameters */
		snprintf(o->v[k++], sizeof o->v[0], "-arch=sm_%d", s->sm);
		snprintf(o->v[k++], sizeof o->v[0], "-std=c++17");
		snprintf(o->v[k++], sizeof o->v[0], "--ptxas-options=-v");
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_IN=%d", in);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_GIN=%d", qin);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_PREC=%d", prec);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_D=%d", s->D);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_NW=%d", s->tile.nw);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_BKV=%d", s->tile.bc);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_BQ=%d", s->tile.br);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_MASK=%d", (int)s->mask);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_STAGES=%d", s->tile.stages);
		if (s->tile.rt >= 2 && s->tile.rt <= 4)
			snprintf(o->v[k++], sizeof o->v[0], "-DFA_DET=%d", s->tile.rt - 1);
		goto ext;
	}
	if (fa_kpath_is_decode(s->tile.path)) { /* attn_decode.cu's macros */
		snprintf(o->v[k++], sizeof o->v[0], "-arch=sm_%d", s->sm);
		snprintf(o->v[k++], sizeof o->v[0], "-std=c++17");
		snprintf(o->v[k++], sizeof o->v[0], "--ptxas-options=-v");
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_IN=%d", in);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_D=%d", s->D);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_NW=%d", s->tile.nw);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_DR=%d", s->tile.br);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_STAGES=%d", s->tile.stages);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_MASK=%d", (int)s->mask);
		/* the window over an inference layout (its sides resolved per sequence): only
		 * there, so that every other decode's option list stays */
		if (s->layout != FA_KLAYOUT_DENSE && s->window)
			snprintf(o->v[k++], sizeof o->v[0], "-DFA_LAYOUT=1");
		goto ext;
	}
	snprintf(o->v[k++], sizeof o->v[0], wg ? "-arch=sm_%da" : "-arch=sm_%d", s->sm);
	snprintf(o->v[k++], sizeof o->v[0], "-std=c++17");
	snprintf(o->v[k++], sizeof o->v[0], "--ptxas-options=-v");
	if (!wg || w16)
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_IN=%d", in);
	if (w16)
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_QIN=%d", qin);
	if (!wg || w16)
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_OUT=%d", out);
	if (!w16)
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_PREC=%d", prec);
	snprintf(o->v[k++], sizeof o->v[0], "-DFA_D=%d", s->D);
	if (wg) {
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_NWG=%d", s->tile.nw / 4);
	} else {
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_NW=%d", s->tile.nw);
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_RT=%d", s->tile.rt);
	}
	snprintf(o->v[k++], sizeof o->v[0], "-DFA_BC=%d", s->tile.bc);
	snprintf(o->v[k++], sizeof o->v[0], "-DFA_STAGES=%d", s->tile.stages);
	snprintf(o->v[k++], sizeof o->v[0], "-DFA_MASK=%d", (int)s->mask);
	/* attn_fwd.cu: only where Q's type differs, so that the other option lists (and cache
	 * keys) stay */
	if (!wg && qin != in)
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_QIN=%d", qin);
	/* the inference layouts, likewise only where set (the dense option lists stay) */
	if (!wg && s->layout != FA_KLAYOUT_DENSE)
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_LAYOUT=%d", s->layout);
	/* the window and softcap specialisations: only where asked, so that the other option
	 * lists (and cache keys) stay */
ext:
	if (s->window)
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_WIN=1");
	if (s->softcap)
		snprintf(o->v[k++], sizeof o->v[0], "-DFA_SOFTCAP=1");
	/* Experiments only (tools/perf-variants.sh, kernels/PERF-NOTES.md): extra -D options from
	 * the settings' FA_NVRTC_EXTRA ("-DX=1 -DY=2"), at most 4, each cut to 47 bytes. They are
	 * part of the option list, hence of the disk cache's key. */
	const char *extra = n ? n->extra : "";
	int ne = 0;
	if (*extra) {
		const char *q = extra;
		while (*q && ne < 4 && k < FA_NVRTC_MAX_OPTS) {
			while (*q == ' ')
				q++;
			size_t len = strcspn(q, " ");
			if (len == 0)
				break;
			if (len >= sizeof o->v[0])
				len = sizeof o->v[0] - 1;
			memcpy(o->v[k], q, len);
			o->v[k++][len] = 0;
			ne++;
			q += strcspn(q, " ");
		}
	}
	o->n = k;
}

fa_status fa_nvrtc_compile(struct fa_nvrtc *n, const struct fa_kernel_spec *s, void **cubin,
                           size_t *cubin_size, struct fa_kernel_usage *usage, char *err,
                           size_t errlen)
{
	struct fa_nvrtc_opts o;
	fa_nvrtc_options(n, s, &o);
	return fa_nvrtc_compile_opts(n, s, &o, cubin, cubin_size, usage, err, errlen);
}

fa_status fa_nvrtc_compile_opts(struct fa_nvrtc *n, const struct fa_kernel_spec *s,
                                const struct fa_nvrtc_opts *o, void **cubin, size_t *cubin_size,
                                struct fa_kernel_usage *usage, char *err, size_t errlen)
{
	const char *opts[FA_NVRTC_MAX_OPTS];
	int k = o->n < FA_NVRTC_MAX_OPTS ? o->n : FA_NVRTC_MAX_OPTS;

	if (cubin)
		*cubin = NULL;
	if (cubin_size)
		*cubin_size = 0;
	for (int i = 0; i < k; i++)
		opts[i] = o->v[i];

	nvrtcProgram_t prog = NULL;
	const char *src;
	size_t srclen;
	fa_kernel_source(s, &src, &srclen);
	/* the shared device helpers: #include "fa_device.cuh" resolves to the embedded text */
	const char *const hdr[1] = {fa_src_fa_device}, *const hdr_name[1] = {FA_DEVICE_HEADER_NAME};
	const bool dec = fa_kpath_is_decode(s->tile.path);
	const bool bwd = fa_kpath_is_bwd(s->tile.path);
	nvrtcResult_t r = n->CreateProgram(&prog, src,
	                                   s->tile.path == FA_KPATH_BWDWG16 ? "attn_bwd_sm90.cu"
	                                   : fa_kpath_is_bwdwg32(s->tile.path) ? "attn_bwd_sm90_tf32.cu"
	                                   : bwd ? "attn_bwd.cu"
	                                   : dec ? "attn_decode.cu"
	                                   : fa_kpath_is_wg(s->tile.path) ? "attn_fwd_sm90.cu"
	                                                                  : "attn_fwd.cu",
	                                   1, hdr, hdr_name);
	if (r != 0) {
		return fa_err(err, errlen, FA_EINTERNAL,
		              "nvrtcCreateProgram: %s", n->GetErrorString(r));
	}
	uint64_t t0 = fa_now_ns();
	r = n->CompileProgram(prog, k, opts);
	double dt = 1e-9 * (double)(fa_now_ns() - t0);
	size_t lsz = 0;
	n->GetProgramLogSize(prog, &lsz);
	char *log = malloc(lsz + 1);
	if (!log) {
		n->DestroyProgram(&prog);
		return FA_ENOMEM;
	}
	log[0] = 0;
	if (lsz)
		n->GetProgramLog(prog, log);
	log[lsz] = 0;
	if (r != 0) {
		char name[128];
		fa_kernel_spec_name(s, name, sizeof name);
		snprintf(err, errlen, "NVRTC failed for %s: %s: %.1500s", name, n->GetErrorString(r), log);
		free(log);
		n->DestroyProgram(&prog);
		return FA_EINTERNAL;
	}
	if (usage) {
		parse_usage(log, bwd ? "fa_bwd_main" : dec ? "fa_attn_decode" : "fa_attn_fwd", usage);
		usage->compile_s = dt;
	}
	free(log);
	if (cubin) {
		size_t sz = 0;
		n->GetCUBINSize(prog, &sz);
		void *buf = malloc(sz ? sz : 1);
		if (!buf) {
			n->DestroyProgram(&prog);
			return FA_ENOMEM;
		}
		n->GetCUBIN(prog, buf);
		*cubin = buf;
		if (cubin_size)
			*cubin_size = sz;
	}
	n->DestroyProgram(&prog);
	return FA_OK;
}
