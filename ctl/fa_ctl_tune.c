/* fa_ctl_tune.c - `fa-ctl tune`: pre-tune shapes on the local GPU into the daemon's tuning table.
 *
 *   fa-ctl tune --dtype bf16 --head-dim 128 --seq 4096 [--causal] [--gqa 4]
 *   fa-ctl tune --shapes FILE      (one shape a line, the same options without "--")
 *
 * Runs in-process (like the benchmark: fa_gpu_open, no daemon needed). Each shape's class
 * (fa_tune.h: dtype, precision, head dim, mask, log2 buckets of Sq, Sk and the GQA ratio) is
 * tuned on the shape given (B and H default to the class's representative ones), the table is
 * saved into "<cache dir>/tuning/" where the daemon loads it at start, and a table of heuristic
 * vs tuned times is printed. Exit 2 for a usage error, 1 without a GPU (fa_gpu_open's reason on
 * stderr) or when a shape fails.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_ctl.h"
#include "fa_gpu.h"
#include "fa_tune.h"

#define MAX_SHAPES 256

struct shape {
	struct fa_attn_fwd_desc d;
};

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: fa-ctl tune [--device N] [--cache-dir DIR] [--candidates N] [--runs N]\n"
	        "                   (--shapes FILE | SHAPE)\n"
	        "  SHAPE: --dtype fp16|bf16|fp32 --head-dim D --seq S [--seq-k S] [--causal|\n"
	        "         --causal-top-left] [--gqa RATIO] [--precision P] [--batch B] [--heads H]\n"
	        "  --shapes FILE: one SHAPE a line (options with or without \"--\"; # comments)\n"
	        "  --cache-dir: the daemon's (default $CACHE_DIRECTORY, $XDG_CACHE_HOME/fa-daemon,\n"
	        "  ~/.cache/fa-daemon, /var/cache/fa-daemon); the table goes to DIR/tuning/.\n"
	        "  Runs on the local GPU, no daemon needed; a running daemon reads the table at its\n"
	        "  next start.\n");
}

/* The daemon's default (daemon/config.c). */
static void default_cache_dir(char *out, size_t len)
{
	const char *c = getenv("CACHE_DIRECTORY"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
	if (c && *c) {
		/* systemd may list several, colon-separated: the first is ours */
		snprintf(out, len, "%.*s", (int)strcspn(c, ":"), c);
	} else if (x && *x) {
		snprintf(out, len, "%s/fa-daemon", x);
	} else if (h && *h) {
		snprintf(out, len, "%s/.cache/fa-daemon", h);
	} else {
		snprintf(out, len, "/var/cache/fa-daemon");
	}
}

static bool parse_i64(const char *s, int64_t *v)
{
	char *end;
	long long x = strtoll(s, &end, 10);
	if (!*s || *end || x < 1)
		return false;
	*v = x;
	return true;
}

/* A non-negative int option's value (--device; --candidates and --runs, where 0 is the
 * default), or false. */
static bool parse_count(const char *s, int *v)
{
	char *end;
	errno = 0;
	long x = strtol(s, &end, 10);
	if (!*s || *end || errno != 0 || x < 0 || x > INT_MAX)
		return false;
	*v = (int)x;
	return true;
}

/* One shape from argv-style options (getopt_long, from optind 1... of argv). */
static int parse_shape(int argc, char **argv, struct shape *sh, const char *where)
{
	static const struct option opts[] = {
		{"dtype", required_argument, NULL, 't'},   {"head-dim", required_argument, NULL, 'd'},
		{"seq", required_argument, NULL, 's'},     {"seq-k", required_argument, NULL, 'k'},
		{"causal", no_argument, NULL, 'c'},        {"causal-top-left", no_argument, NULL, 'C'},
		{"gqa", required_argument, NULL, 'g'},     {"precision", required_argument, NULL, 'p'},
		{"batch", required_argument, NULL, 'B'},   {"heads", required_argument, NULL, 'H'},
		{NULL, 0, NULL, 0},
	};
	struct fa_tune_key k = {0};
	int64_t D = 0, S = 0, Sk = 0, gqa = 1, B = 0, H = 0;
	bool have_dt = false;
	int c;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		bool ok = true;
		switch (c) {
		case 't': ok = have_dt = fa_dtype_parse(optarg, &k.dtype); break;
		case 'd': ok = parse_i64(optarg, &D); break;
		case 's': ok = parse_i64(optarg, &S); break;
		case 'k': ok = parse_i64(optarg, &Sk); break;
		case 'c': k.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT; break;
		case 'C': k.mask = FA_MASK_CAUSAL_TOP_LEFT; break;
		case 'g': ok = parse_i64(optarg, &gqa); break;
		case 'p': ok = fa_prec_parse(optarg, &k.precision); break;
		case 'B': ok = parse_i64(optarg, &B); break;
		case 'H': ok = parse_i64(optarg, &H); break;
		default: ok = false;
		}
		if (!ok) {
			fprintf(stderr, "fa-ctl: tune: %s: bad or unknown option \"%s\"\n", where,
			        argv[optind - 1]);
			return -1;
		}
	}
	if (optind < argc || !have_dt || D <= 0 || S <= 0) {
		fprintf(stderr, "fa-ctl: tune: %s: a shape needs --dtype, --head-dim and --seq\n", where);
		return -1;
	}
	if (D > FA_ATTN_MAX_HEAD_DIM || gqa > 1024 || S > (1 << 24) || Sk > (1 << 24)) {
		fprintf(stderr, "fa-ctl: tune: %s: head dim, sequence or GQA ratio out of range\n", where);
		return -1;
	}
	/* the class's representative problem, then the shape's own sizes */
	k.D = (int)D;
	k.precision = fa_prec_resolve(k.dtype, k.precision);
	k.gqa_log2 = 0;
	while (((int64_t)2 << k.gqa_log2) <= gqa)
		k.gqa_log2++;
	fa_tune_key_desc(&k, &sh->d);
	struct fa_attn_fwd_desc *d = &sh->d;
	d->Sq = S;
	d->Sk = Sk ? Sk : S;
	if (H) {
		if (H % gqa) {
			fprintf(stderr, "fa-ctl: tune: %s: --heads %lld is not a multiple of --gqa %lld\n",
			        where, (long long)H, (long long)gqa);
			return -1;
		}
		d->Hq = H;
	} else {
		d->Hq = d->Hkv * gqa;
	}
	d->Hkv = d->Hq / gqa;
	d->B = B ? B : (16384 / S < 1 ? 1 : 16384 / S > 64 ? 64 : 16384 / S);
	d->q_stride[2] = D;
	d->q_stride[1] = d->Hq * D;
	d->q_stride[0] = d->Sq * d->Hq * D;
	d->k_stride[2] = D;
	d->k_stride[1] = d->Hkv * D;
	d->k_stride[0] = d->Sk * d->Hkv * D;
	memcpy(d->v_stride, d->k_stride, sizeof d->v_stride);
	memcpy(d->o_stride, d->q_stride, sizeof d->o_stride);
	d->lse_stride[2] = 1;
	d->lse_stride[1] = d->Sq;
	d->lse_stride[0] = d->Hq * d->Sq;
	char err[256];
	if (fa_attn_fwd_check(d, err, sizeof err) != FA_OK) {
		fprintf(stderr, "fa-ctl: tune: %s: %s\n", where, err);
		return -1;
	}
	return 0;
}

/* A bare option name in a shapes file ("seq 4096" means "--seq 4096"). */
static bool is_opt_name(const char *s)
{
	static const char *names[] = {"dtype", "head-dim", "seq", "seq-k", "causal",
	                              "causal-top-left", "gqa", "precision", "batch", "heads"};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (strcmp(s, names[i]) == 0)
			return true;
	return false;
}

/* --shapes FILE: each line split on blanks, "--" added where missing. */
static int read_shapes(const char *path, struct shape *sh, int *n)
{
	FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
	if (!f) {
		fprintf(stderr, "fa-ctl: tune: %s: %s\n", path, strerror(errno));
		return -1;
	}
	char line[1024];
	int lineno = 0, rc = 0;
	while (rc == 0 && fgets(line, sizeof line, f)) {
		lineno++;
		char *hash = strchr(line, '#');
		if (hash)
			*hash = 0;
		char *av[64], bufs[64][128];
		int ac = 1;
		av[0] = "tune";
		for (char *save = NULL, *tok = strtok_r(line, " \t\r\n", &save); tok && ac < 64;
		     tok = strtok_r(NULL, " \t\r\n", &save)) {
			snprintf(bufs[ac], sizeof bufs[ac], "%s%s", is_opt_name(tok) ? "--" : "", tok);
			av[ac] = bufs[ac];
			ac++;
		}
		if (ac == 1)
			continue;
		if (*n >= MAX_SHAPES) {
			fprintf(stderr, "fa-ctl: tune: %s: more than %d shapes\n", path, MAX_SHAPES);
			rc = -1;
			break;
		}
		char where[1100];
		snprintf(where, sizeof where, "%s:%d", path, lineno);
		if (parse_shape(ac, av, &sh[*n], where) != 0)
			rc = -1;
		else
			(*n)++;
	}
	if (f != stdin)
		fclose(f);
	return rc;
}

int fa_ctl_tune_main(int argc, char **argv)
{
	static struct shape shapes[MAX_SHAPES];
	int nshapes = 0, device = 0;
	char cache[4096] = "";
	const char *shapes_file = NULL;
	struct fa_tune_opts topts = {0};
	/* our own options first; everything else is one shape */
	char *rest[128];
	int nrest = 1;
	rest[0] = argv[0];
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool arg = i + 1 < argc;
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout);
			return FA_CTL_EXIT_OK;
		} else if (strcmp(a, "--device") == 0 && arg) {
			if (!parse_count(argv[++i], &device))
				return fa_ctl_usage_error("tune", "bad --device '%s'", argv[i]);
		} else if (strcmp(a, "--cache-dir") == 0 && arg) {
			snprintf(cache, sizeof cache, "%s", argv[++i]);
		} else if (strcmp(a, "--shapes") == 0 && arg) {
			shapes_file = argv[++i];
		} else if (strcmp(a, "--candidates") == 0 && arg) {
			if (!parse_count(argv[++i], &topts.candidates))
				return fa_ctl_usage_error("tune", "bad --candidates '%s'", argv[i]);
		} else if (strcmp(a, "--runs") == 0 && arg) {
			if (!parse_count(argv[++i], &topts.runs))
				return fa_ctl_usage_error("tune", "bad --runs '%s'", argv[i]);
		} else if (nrest < 127) {
			rest[nrest++] = argv[i];
		} else {
			return fa_ctl_usage_error("tune", "too many arguments");
		}
	}
	rest[nrest] = NULL;
	if (shapes_file && read_shapes(shapes_file, shapes, &nshapes) != 0)
		return FA_CTL_EXIT_USAGE;
	if (nrest > 1) {
		if (parse_shape(nrest, rest, &shapes[nshapes], "arguments") != 0) {
			usage(stderr);
			return FA_CTL_EXIT_USAGE;
		}
		nshapes++;
	}
	if (nshapes == 0) {
		fa_ctl_usage_error("tune", "no shape (--shapes FILE or --dtype, --head-dim, --seq)");
		usage(stderr);
		return FA_CTL_EXIT_USAGE;
	}
	if (!cache[0])
		default_cache_dir(cache, sizeof cache);

	char err[1024];
	struct fa_kernel_settings ks;
	if (fa_ctl_kernel_settings(&ks, "tune") != 0)
		return FA_CTL_EXIT_USAGE;
	struct fa_gpu *g = NULL;
	fa_status st = fa_gpu_open(&g, device, &ks, err, sizeof err);
	if (st != FA_OK) {
		fprintf(stderr, "fa-ctl: tune: no GPU: %s\n", err);
		return FA_CTL_EXIT_FAILURE;
	}
	/* compiled kernels land in the daemon's disk cache too: its first requests load them */
	if (fa_gpu_set_cache_dir(g, cache, err, sizeof err) != FA_OK)
		fprintf(stderr, "fa-ctl: tune: kernel disk cache off: %s\n", err);
	struct fa_tune_ident id;
	fa_tune_gpu_ident(g, &id);
	struct fa_tune_table *t = NULL;
	st = fa_tune_table_open(&t, cache, &id, fa_gpu_model(g), 0, err, sizeof err);
	if (st != FA_OK) {
		fprintf(stderr, "fa-ctl: tune: tuning table: %s\n", err);
		fa_gpu_close(g);
		return FA_CTL_EXIT_FAILURE;
	}
	struct fa_tune_stats ts;
	fa_tune_table_stats(t, &ts);
	printf("device: %s (sm_%d); table %s (%d entries%s%s)\n", fa_gpu_name(g), fa_gpu_sm(g),
	       fa_tune_table_path(t), ts.entries, ts.why[0] ? "; " : "", ts.why);
	struct fa_tune_ops ops;
	if ((st = fa_tune_gpu_ops_init(&ops, g, err, sizeof err)) != FA_OK) {
		fprintf(stderr, "fa-ctl: tune: %s\n", err);
		fa_tune_table_close(t);
		fa_gpu_close(g);
		return FA_CTL_EXIT_FAILURE;
	}
	printf("%-44s %-16s %10s  %-16s %10s %8s\n", "shape (class)", "heuristic", "us", "tuned",
	       "us", "speedup");
	int failed = 0;
	for (int i = 0; i < nshapes; i++) {
		const struct fa_attn_fwd_desc *d = &shapes[i].d;
		struct fa_tune_key k;
		char kb[96], sb[160], hb[48], bb[48];
		fa_tune_key_make(d, &k);
		fa_tune_key_format(&k, kb, sizeof kb);
		snprintf(sb, sizeof sb, "B%lld H%lld/%lld S%lld/%lld (%s)", (long long)d->B,
		         (long long)d->Hq, (long long)d->Hkv, (long long)d->Sq, (long long)d->Sk, kb);
		struct fa_tune_entry e;
		st = fa_tune_key(t, d, &ops, &topts, &e, err, sizeof err);
		if (st != FA_OK) {
			fprintf(stderr, "fa-ctl: tune: %s: %s: %s\n", sb, fa_status_name(st), err);
			failed++;
			continue;
		}
		fa_tile_format(&e.heur, hb, sizeof hb);
		fa_tile_format(&e.best, bb, sizeof bb);
		printf("%-44s %-16s %10.1f  %-16s %10.1f %7.2fx\n", sb, hb, e.heur_us, bb, e.best_us,
		       e.heur_us > 0 ? e.heur_us / e.best_us : 0.0);
	}
	fa_tune_gpu_ops_fini(&ops);
	st = fa_tune_table_save(t, err, sizeof err);
	if (st != FA_OK) {
		fprintf(stderr, "fa-ctl: tune: saving the table: %s\n", err);
		failed++;
	} else {
		printf("saved %s\n", fa_tune_table_path(t));
	}
	fa_tune_table_close(t);
	fa_gpu_close(g);
	return failed ? FA_CTL_EXIT_FAILURE : FA_CTL_EXIT_OK;
}
