/* fa_ctl_plan.c - `fa-ctl plan`: how much shared memory a shape needs and which tile is chosen,
 * offline for a named architecture (--arch sm_89) or for the real device (--device N, or no
 * --arch: the GPU if there is one).
 *
 *   fa-ctl plan --arch sm_89 --dtype fp32 --head-dim 128 --causal
 *
 * prints the chosen configuration, its shared memory against the limit, and the other candidates
 * that fit; exits 1 with the status and its detail when nothing fits. A head dim the kernels
 * never take (--head-dim 512) gets the daemon's own status and text (fa_check_head_dim), so the
 * offline answer is the one a request would get. --json prints the same as one JSON object.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_attn.h"
#include "fa_check.h"
#include "fa_ctl.h"
#include "fa_gpu.h"
#include "fa_planner.h"

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: fa-ctl plan [--arch sm_80|sm_86|sm_89|sm_90|sm_100|sm_120|h200...|--device N]\n"
	        "                   --dtype fp16|bf16|fp32 --head-dim D [--precision P]\n"
	        "                   [--causal|--causal-top-left] [--batch B --heads H --seq-q S\n"
	        "                   --seq-k S] [--window L,R] [--softcap C] [--backward] [--all]\n"
	        "                   [--json]\n"
	        "       fa-ctl plan ... --decode [--batch B] [--heads H] [--kv-heads H] [--seq-q S]\n"
	        "                   [--seq-k S | --cache-lens L,L,... [--page-size P]] [--json]\n"
	        "       fa-ctl plan ... --prefill --seq-q S --seq-k S [--batch B] [--heads H]\n"
	        "                   [--kv-heads H] [--page-size P] [--json]\n"
	        "  precision (fp32): 3xtf32 (default), ieee, tf32, bf16\n"
	        "  --causal is bottom-right aligned (FlashAttention >= 2.1); --causal-top-left is\n"
	        "  PyTorch's is_causal. Shape arguments, when given, let the ranking account for waves.\n"
	        "  --window L,R: a sliding window (fa_attn.h: query i sees keys from L before its\n"
	        "  diagonal to R after it; -1 leaves a side unbounded); --softcap C: logits capped\n"
	        "  to C tanh(s / C). Both choose no other tile (every kernel has them); the plan\n"
	        "  says which kernel serves them.\n"
	        "  --backward plans the backward pass (dQ, dK, dV): keys per block, query rows per\n"
	        "  step, warps, stages; its shared memory against the same opt-in limit.\n"
	        "  --all prints every fitting candidate (default: the best 10).\n"
	        "  --decode plans the split-KV decode kernel (few queries, long caches): its tile,\n"
	        "  the split of the keys and the grid; with --cache-lens, over a KV cache of those\n"
	        "  lengths (one a sequence; pages of --page-size tokens), ragged split included.\n"
	        "  --prefill plans the prefill kernel over varlen batches and KV caches (paged with\n"
	        "  --page-size) for the longest sequence's --seq-q and --seq-k, beside the dense tile.\n"
	        "  --json prints the plan as one JSON object on stdout (when nothing fits: the\n"
	        "  status and its detail, exit status 1 as without --json).\n"
	        "  Without --arch the real device is planned for (fa-ctl loads the CUDA driver).\n"
	        "  The daemon's kernel settings apply from the environment: FA_WGMMA, FA_WGMMA16,\n"
	        "  FA_WG_BC, FA_WG_STAGES, FA_WG_NWG, FA_NVRTC_EXTRA, FA_KERNEL_CACHE_MAX_MB, CUDA_HOME.\n");
}

static long parse_long(const char *s, const char *what, int *bad)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (*s == 0 || *end != 0 || v < 0) {
		fa_ctl_usage_error("plan", "bad %s '%s'", what, s);
		*bad = 1;
	}
	return v;
}

static const char *dtype_name(fa_dtype dt)
{
	return dt == FA_DTYPE_FP16 ? "fp16" : dt == FA_DTYPE_BF16 ? "bf16" : "fp32";
}

static const char *path_name(int path)
{
	return path == FA_KPATH_16       ? "16-bit mma.sync"
	       : path == FA_KPATH_BWD16  ? "backward 16-bit mma.sync"
	       : path == FA_KPATH_BWD32  ? "backward fp32 mma.sync"
	       : path == FA_KPATH_BWDWG16 ? "backward sm_90a wgmma 16-bit"
	       : path == FA_KPATH_32     ? "fp32 mma.sync"
	       : path == FA_KPATH_WG32X3 ? "sm_90a wgmma 3xtf32"
	       : path == FA_KPATH_WG16   ? "sm_90a wgmma 16-bit"
	                                 : "sm_90a wgmma tf32";
}

/* The source whose FA_WIN / FA_SOFTCAP specialisation serves a window or softcap on path. */
static const char *ext_kernel(int path)
{
	return path == FA_KPATH_BWDWG16             ? "attn_bwd_sm90.cu (the wgmma backward)"
	       : fa_kpath_is_bwd(path)              ? "attn_bwd.cu"
	       : fa_kpath_is_wg(path)               ? "attn_fwd_sm90.cu"
	       : fa_kpath_is_decode(path)           ? "attn_decode.cu"
	                                            : "attn_fwd.cu";
}

/* The plan as text (stdout; the status on stderr when nothing fits). Returns the exit status. */
static int plan_print_text(const struct fa_device_model *model, bool real,
                           const struct fa_plan_req *r, fa_status st, const char *err,
                           const struct fa_tile *t, int n, int all)
{
	fa_precision prec = fa_prec_resolve(r->dtype, r->precision);
	printf("device:    %s (sm_%d), opt-in shared memory %zu bytes per block, %zu per SM%s\n",
	       model->name, model->sm, model->smem_optin, model->smem_per_sm,
	       real ? " (read from the GPU)" : "");
	printf("problem:   %s%s%s head dim %d, mask %s", dtype_name(r->dtype),
	       r->dtype == FA_DTYPE_FP32 ? " " : "", r->dtype == FA_DTYPE_FP32 ? fa_prec_name(prec) : "",
	       r->D, fa_mask_name(r->mask));
	if (r->Sq > 0)
		printf(", B=%lld H=%lld Sq=%lld Sk=%lld", (long long)r->B, (long long)r->H,
		       (long long)r->Sq, (long long)r->Sk);
	if (r->window)
		printf(", window (%lld, %lld)", (long long)r->window_left, (long long)r->window_right);
	if (r->softcap > 0)
		printf(", softcap %g", r->softcap);
	printf("\n");
	if (st != FA_OK)
		return fa_ctl_failure("plan", "%s: %s", fa_status_name(st), err);
	if (model->sm < 80)
		printf("note:      the kernels need sm_80 or newer (cp.async, bf16 mma.sync); sizes "
		       "below are what the tiles would need\n");
	char tb[48];
	fa_tile_format(&t[0], tb, sizeof tb);
	if (fa_kpath_is_bwd(t[0].path))
		printf("chosen:    %s  (backward: %d keys per block with K, V, dK, dV on chip, %d query "
		       "rows per step, %d warps, %d stage%s of Q and dO, %s path)\n", tb, t[0].bc,
		       t[0].br, t[0].nw, t[0].stages, t[0].stages == 1 ? "" : "s", path_name(t[0].path));
	else
		printf("chosen:    %s  (%d rows x %d keys per step, %d warps, %d row tiles per warp, %d "
		       "stages, %s path)\n", tb, t[0].br, t[0].bc, t[0].nw, t[0].rt, t[0].stages,
		       path_name(t[0].path));
	printf("shared:    %zu of %zu bytes (%.0f%%), ~%d registers/thread, %d block(s)/SM\n",
	       t[0].smem, model->smem_optin, 100.0 * (double)t[0].smem / (double)model->smem_optin,
	       t[0].regs, t[0].blocks_per_sm);
	if (r->window || r->softcap > 0)
		printf("served:    %s: the %s specialisation of %s\n",
		       r->window && r->softcap > 0 ? "window and softcap" : r->window ? "window"
		                                                                     : "softcap",
		       r->window && r->softcap > 0 ? "FA_WIN + FA_SOFTCAP"
		       : r->window                 ? "FA_WIN"
		                                   : "FA_SOFTCAP",
		       ext_kernel(t[0].path));
	int shown = all ? n : (n < 10 ? n : 10);
	printf("candidates that fit: %d%s\n", n, shown < n ? " (best 10; --all for every one)" : "");
	printf("  %-18s %10s %6s %5s %7s\n", "tile", "smem", "regs", "blk", "score");
	for (int i = 0; i < shown; i++) {
		fa_tile_format(&t[i], tb, sizeof tb);
		printf("  %-18s %10zu %6d %5d %7.3f%s\n", tb, t[i].smem, t[i].regs, t[i].blocks_per_sm,
		       t[i].score, i == 0 ? "  <- chosen" : "");
	}
	return FA_CTL_EXIT_OK;
}

/* One tile as a JSON object (the backward's: "rows" are query rows per step, "keys" the keys a
 * block owns). */
static void tile_json(const struct fa_tile *t)
{
	char tb[48];
	fa_tile_format(t, tb, sizeof tb);
	printf("{\"tile\": ");
	fa_ctl_json_string(stdout, tb);
	printf(", \"rows\": %d, \"keys\": %d, \"warps\": %d, \"row_tiles_per_warp\": %d, "
	       "\"stages\": %d, \"path\": ", t->br, t->bc, t->nw, t->rt, t->stages);
	fa_ctl_json_string(stdout, path_name(t->path));
	printf(", \"smem_bytes\": %zu, \"registers\": %d, \"blocks_per_sm\": %d, \"score\": %.6g}",
	       t->smem, t->regs, t->blocks_per_sm, t->score);
}

/* The plan as one JSON object on stdout (also when nothing fits: "status" and "detail"; the
 * status text on stderr too, as without --json). Returns the exit status. */
static int plan_print_json(const struct fa_device_model *model, bool real,
                           const struct fa_plan_req *r, fa_status st, const char *err,
                           const struct fa_tile *t, int n, int all, bool backward)
{
	fa_precision prec = fa_prec_resolve(r->dtype, r->precision);
	printf("{\n  \"device\": {\"name\": ");
	fa_ctl_json_string(stdout, model->name);
	printf(", \"sm\": %d, \"smem_optin_bytes\": %zu, \"smem_per_sm_bytes\": %zu, "
	       "\"real\": %s},\n", model->sm, model->smem_optin, model->smem_per_sm,
	       real ? "true" : "false");
	printf("  \"problem\": {\"pass\": \"%s\", \"dtype\": \"%s\", \"precision\": ",
	       backward ? "backward" : "forward", dtype_name(r->dtype));
	if (r->dtype == FA_DTYPE_FP32)
		fa_ctl_json_string(stdout, fa_prec_name(prec));
	else
		printf("null");
	printf(", \"head_dim\": %d, \"mask\": ", r->D);
	fa_ctl_json_string(stdout, fa_mask_name(r->mask));
	if (r->window)
		printf(", \"window\": [%lld, %lld]", (long long)r->window_left,
		       (long long)r->window_right);
	else
		printf(", \"window\": null");
	if (r->softcap > 0)
		printf(", \"softcap\": %.17g", r->softcap);
	else
		printf(", \"softcap\": null");
	if (r->Sq > 0)
		printf(", \"B\": %lld, \"H\": %lld, \"Sq\": %lld, \"Sk\": %lld", (long long)r->B,
		       (long long)r->H, (long long)r->Sq, (long long)r->Sk);
	printf("},\n  \"status\": \"%s\"", fa_status_name(st));
	if (st != FA_OK) {
		printf(",\n  \"detail\": ");
		fa_ctl_json_string(stdout, err);
		printf("\n}\n");
		return fa_ctl_failure("plan", "%s: %s", fa_status_name(st), err);
	}
	printf(",\n  \"chosen\": ");
	tile_json(&t[0]);
	printf(",\n  \"smem_fraction\": %.4f", (double)t[0].smem / (double)model->smem_optin);
	if (r->window || r->softcap > 0) {
		printf(",\n  \"window_softcap_kernel\": ");
		fa_ctl_json_string(stdout, ext_kernel(t[0].path));
	}
	int shown = all ? n : (n < 10 ? n : 10);
	printf(",\n  \"candidates_fit\": %d,\n  \"candidates\": [", n);
	for (int i = 0; i < shown; i++) {
		printf(i == 0 ? "\n    " : ",\n    ");
		tile_json(&t[i]);
	}
	printf("\n  ]\n}\n");
	return FA_CTL_EXIT_OK;
}

int fa_ctl_plan_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"arch", required_argument, NULL, 'a'},
		{"device", required_argument, NULL, 'g'},
		{"dtype", required_argument, NULL, 't'},
		{"head-dim", required_argument, NULL, 'd'},
		{"precision", required_argument, NULL, 'p'},
		{"causal", no_argument, NULL, 'c'},
		{"causal-top-left", no_argument, NULL, 'C'},
		{"batch", required_argument, NULL, 'B'},
		{"heads", required_argument, NULL, 'H'},
		{"seq-q", required_argument, NULL, 'q'},
		{"seq-k", required_argument, NULL, 'k'},
		{"all", no_argument, NULL, 'A'},
		{"json", no_argument, NULL, 'j'},
		{"backward", no_argument, NULL, 'b'},
		{"decode", no_argument, NULL, 'D'},
		{"prefill", no_argument, NULL, 'F'},
		{"kv-heads", required_argument, NULL, 'K'},
		{"cache-lens", required_argument, NULL, 'L'},
		{"page-size", required_argument, NULL, 'P'},
		{"window", required_argument, NULL, 'W'},
		{"softcap", required_argument, NULL, 'S'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *arch = NULL;
	int device = -1, bad = 0, all = 0, json = 0, backward = 0, decode = 0, prefill = 0;
	int64_t hkv = 0, page_size = 0;
	const char *cache_lens = NULL;
	bool window = false;
	long long wl = -1, wr = -1;
	double softcap = 0;
	struct fa_kernel_settings ks;
	if (fa_ctl_kernel_settings(&ks, "plan") != 0)
		return 2;
	struct fa_plan_req r;
	memset(&r, 0, sizeof r);
	r.ks = &ks;
	r.dtype = 0;
	r.D = -1;
	optind = 1;
	opterr = 0; /* our own messages, with fa-ctl's prefix */
	int c;
	while ((c = getopt_long(argc, argv, ":a:g:t:d:p:cCB:H:q:k:AjbhDFK:L:P:W:S:", opts, NULL)) != -1) {
		switch (c) {
		case 'a': arch = optarg; break;
		case 'g': device = (int)parse_long(optarg, "device", &bad); break;
		case 't':
			if (strcmp(optarg, "fp16") == 0 || strcmp(optarg, "half") == 0)
				r.dtype = FA_DTYPE_FP16;
			else if (strcmp(optarg, "bf16") == 0 || strcmp(optarg, "bfloat16") == 0)
				r.dtype = FA_DTYPE_BF16;
			else if (strcmp(optarg, "fp32") == 0 || strcmp(optarg, "float") == 0 ||
			         strcmp(optarg, "float32") == 0)
				r.dtype = FA_DTYPE_FP32;
			else {
				fa_ctl_usage_error("plan", "unknown dtype '%s' (fp16, bf16, fp32)", optarg);
				bad = 1;
			}
			break;
		case 'd': r.D = (int)parse_long(optarg, "head dim", &bad); break;
		case 'p':
			if (!fa_prec_parse(optarg, &r.precision)) {
				fa_ctl_usage_error("plan", "unknown precision '%s' (ieee, 3xtf32, tf32, bf16)",
				                   optarg);
				bad = 1;
			}
			break;
		case 'c': r.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT; break;
		case 'C': r.mask = FA_MASK_CAUSAL_TOP_LEFT; break;
		case 'B': r.B = parse_long(optarg, "batch", &bad); break;
		case 'H': r.H = parse_long(optarg, "heads", &bad); break;
		case 'q': r.Sq = parse_long(optarg, "seq-q", &bad); break;
		case 'k': r.Sk = parse_long(optarg, "seq-k", &bad); break;
		case 'A': all = 1; break;
		case 'j': json = 1; break;
		case 'b': backward = 1; break;
		case 'D': decode = 1; break;
		case 'F': prefill = 1; break;
		case 'K': hkv = parse_long(optarg, "kv-heads", &bad); break;
		case 'L': cache_lens = optarg; break;
		case 'P': page_size = parse_long(optarg, "page-size", &bad); break;
		case 'W': {
			char tail;
			if (sscanf(optarg, "%lld,%lld%c", &wl, &wr, &tail) != 2 || wl < -1 || wr < -1) {
				fa_ctl_usage_error("plan", "bad window '%s' (L,R: keys before and after the "
				                   "diagonal, -1 unbounded)", optarg);
				bad = 1;
			}
			window = true;
			break;
		}
		case 'S': {
			char *end;
			softcap = strtod(optarg, &end);
			if (*optarg == 0 || *end != 0 || !(softcap >= 0) || softcap > 1e30) {
				fa_ctl_usage_error("plan", "bad softcap '%s' (a cap > 0; 0: off)", optarg);
				bad = 1;
			}
			break;
		}
		case 'h': usage(stdout); return FA_CTL_EXIT_OK;
		case ':':
			fa_ctl_usage_error("plan", "option '%s' needs a value", argv[optind - 1]);
			bad = 1;
			break;
		default:
			fa_ctl_usage_error("plan", "unknown option '%s'", argv[optind - 1]);
			bad = 1;
		}
	}
	if (!bad && optind < argc) {
		fa_ctl_usage_error("plan", "unexpected argument '%s'", argv[optind]);
		bad = 1;
	}
	if (!bad && (r.dtype == 0 || r.D < 0)) {
		fa_ctl_usage_error("plan", "--dtype and --head-dim are required");
		bad = 1;
	}
	if (!bad && prefill + decode + backward > 1) {
		fa_ctl_usage_error("plan", "--prefill, --decode and --backward plan different kernels: "
		                   "give one");
		bad = 1;
	}
	if (!bad && prefill && cache_lens) {
		fa_ctl_usage_error("plan", "--prefill plans for the longest sequence: give its "
		                   "--seq-q and --seq-k instead of --cache-lens");
		bad = 1;
	}
	if (bad) {
		usage(stderr);
		return FA_CTL_EXIT_USAGE;
	}
	/* as a call's descriptor reaches the planner (fa_plan_req_from_desc): a window only when it
	 * bounds a side, which needs the lengths; without them, when a side is given */
	if (window) {
		struct fa_attn_fwd_desc wd;
		memset(&wd, 0, sizeof wd);
		wd.window = true;
		wd.window_left = wl;
		wd.window_right = wr;
		wd.Sq = r.Sq;
		wd.Sk = r.Sk;
		r.window = r.Sq > 0 && r.Sk > 0 ? fa_attn_window_active(&wd) : wl >= 0 || wr >= 0;
		r.window_left = r.window ? wl : 0;
		r.window_right = r.window ? wr : 0;
	}
	r.softcap = softcap;

	struct fa_device_model model;
	struct fa_gpu *g = NULL;
	char err[1024];
	if (arch) {
		const struct fa_device_model *m = fa_device_model_find(arch);
		if (!m) {
			int n;
			const struct fa_device_model *ms = fa_device_models(&n);
			fprintf(stderr, "fa-ctl: plan: unknown architecture '%s'; known:", arch);
			for (int i = 0; i < n; i++)
				fprintf(stderr, " %s", ms[i].name);
			fprintf(stderr, "\n");
			return FA_CTL_EXIT_USAGE;
		}
		model = *m;
	} else {
		fa_status st = fa_gpu_open(&g, device < 0 ? 0 : device, &ks, err, sizeof err);
		if (st != FA_OK)
			return fa_ctl_failure("plan", "no device to plan for (%s); give --arch sm_XX to plan "
			                      "offline", err);
		model = *fa_gpu_model(g);
	}

	if (prefill) {
		int prc = fa_ctl_plan_prefill(&model, g != NULL, &r, hkv, page_size, json);
		fa_gpu_close(g);
		return prc;
	}
	if (decode) {
		int drc = fa_ctl_plan_decode(&model, g != NULL, &r, hkv, cache_lens, page_size, json);
		fa_gpu_close(g);
		return drc;
	}
	struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
	int n = 0;
	/* the rule every request meets first (the client library and the daemon check it before any
	 * planning), so a head dim no kernel takes gets the status and text a request would get */
	fa_status st = fa_check_head_dim(r.D, err, sizeof err);
	if (st == FA_OK)
		st = backward ? fa_plan_bwd(&model, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err)
		              : fa_plan(&model, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err);
	int rc = json ? plan_print_json(&model, g != NULL, &r, st, err, t, n, all, backward)
	              : plan_print_text(&model, g != NULL, &r, st, err, t, n, all);
	fa_gpu_close(g);
	return rc;
}
