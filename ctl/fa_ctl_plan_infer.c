/* fa_ctl_plan_infer.c - `fa-ctl plan --decode`: the decode kernel's plan for a shape, dense or
 * over a KV cache with given lengths (contiguous, or paged with --page-size), as the GPU would
 * launch it (kernels/planner_decode.c, planner_infer.c): the tile, the split of the keys, the
 * grid and the merge pass's scratch; for ragged lengths also the split of the longest sequence's
 * dense plan, which the ragged rule replaces. `fa-ctl plan --prefill`: the prefill kernel's tile
 * over the inference layouts (kernels/gpu_fwd_infer.c's fa_plan_fwd_infer), against the dense
 * tile of the same shape (a paged cache takes a tile that leaves registers for its lookups).
 *
 *   fa-ctl plan --arch h200 --dtype bf16 --head-dim 128 --decode --batch 16 --heads 32 \
 *       --kv-heads 8 --seq-k 8192
 *   fa-ctl plan --arch h200 --dtype bf16 --head-dim 128 --decode --heads 32 --kv-heads 8 \
 *       --cache-lens 3502,119,7034,... --page-size 16
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_ctl.h"
#include "fa_err.h"
#include "fa_gpu_infer.h"
#include "fa_infer_route.h"

/* "a,b,c" into lens (malloc'd); the count, or -1 with the message printed. */
static int64_t parse_lens(const char *s, int32_t **lens)
{
	int64_t n = 1;
	for (const char *p = s; *p; p++)
		n += *p == ',';
	*lens = malloc(sizeof(int32_t) * (size_t)n);
	if (*lens == NULL)
		return -1;
	const char *p = s;
	for (int64_t i = 0; i < n; i++) {
		char *end;
		long v = strtol(p, &end, 10);
		if (end == p || v < 0 || v > INT32_MAX / 2 || (*end != ',' && *end != '\0')) {
			fa_ctl_usage_error("plan", "bad --cache-lens '%s': comma-separated lengths >= 0",
			                   s);
			free(*lens);
			*lens = NULL;
			return -1;
		}
		(*lens)[i] = (int32_t)v;
		p = end + (*end == ',');
	}
	return n;
}

int fa_ctl_plan_decode(const struct fa_device_model *model, bool real,
                       const struct fa_plan_req *r, int64_t hkv, const char *cache_lens,
                       int64_t page_size, bool json)
{
	struct fa_attn_infer_desc d;
	memset(&d, 0, sizeof d);
	struct fa_attn_fwd_desc *f = &d.fwd;
	int32_t *lens = NULL, *pt = NULL;
	f->dtype = r->dtype;
	f->precision = r->precision;
	f->mask = r->mask;
	f->D = r->D;
	f->scale = 1.0;
	f->Hq = r->H > 0 ? r->H : 32;
	f->Hkv = hkv > 0 ? hkv : f->Hq;
	f->Sq = r->Sq > 0 ? r->Sq : 1;
	f->B = r->B > 0 ? r->B : 1;
	int64_t maxk = r->Sk;
	if (cache_lens) {
		int64_t n = parse_lens(cache_lens, &lens);
		if (n < 0)
			return FA_CTL_EXIT_USAGE;
		if (r->B > 0 && r->B != n) {
			free(lens);
			return fa_ctl_usage_error("plan", "--batch %" PRId64 " but %" PRId64
			                          " --cache-lens", r->B, n);
		}
		f->B = n;
		for (int64_t b = 0; b < n; b++)
			maxk = lens[b] > maxk ? lens[b] : maxk;
	}
	if (maxk < 1) {
		free(lens);
		return fa_ctl_usage_error("plan", "--decode needs --seq-k or --cache-lens");
	}
	f->Sk = maxk;
	const int64_t D = f->D;
	int64_t q[3] = {f->Sq * f->Hq * D, f->Hq * D, D}, k[3] = {maxk * f->Hkv * D, f->Hkv * D, D};
	memcpy(f->q_stride, q, sizeof q);
	memcpy(f->o_stride, q, sizeof q);
	f->lse_stride[0] = f->Hq * f->Sq, f->lse_stride[1] = f->Sq, f->lse_stride[2] = 1;
	if (lens && page_size > 0) {
		d.kv = FA_KV_PAGED;
		d.page_size = page_size;
		d.pt_cols = (maxk + page_size - 1) / page_size;
		d.pages = f->B * d.pt_cols;
		pt = malloc(sizeof(int32_t) * (size_t)(d.pages > 0 ? d.pages : 1));
		for (int64_t i = 0; pt && i < d.pages; i++)
			pt[i] = (int32_t)i;
		d.page_table = pt;
		k[0] = page_size * f->Hkv * D;
	} else if (lens) {
		d.kv = FA_KV_CACHE;
		d.cache_rows = maxk;
	}
	d.seqlens_k = lens;
	memcpy(f->k_stride, k, sizeof k);
	memcpy(f->v_stride, k, sizeof k);

	char err[1024];
	struct fa_attn_fwd_desc pd = *f;
	struct fa_decode_plan p, dense;
	fa_status st = lens ? fa_attn_infer_check(&d, err, sizeof err)
	                    : fa_attn_fwd_check(f, err, sizeof err);
	if (st == FA_OK)
		st = lens ? fa_infer_plan_decode(model, &d, r->ks, &pd, &p, err, sizeof err)
		          : fa_plan_decode(model, f, r->ks, NULL, &p, err, sizeof err);
	if (st == FA_OK && lens)
		st = fa_plan_decode(model, &pd, r->ks, NULL, &dense, err, sizeof err);
	const char *layout = !lens ? "dense" : d.kv == FA_KV_PAGED ? "paged" : "cache";
	int rc = FA_CTL_EXIT_OK;
	char tb[48] = "";
	if (st == FA_OK)
		fa_tile_format(&p.tile, tb, sizeof tb);
	if (json) {
		printf("{\n  \"device\": {\"name\": ");
		fa_ctl_json_string(stdout, model->name);
		printf(", \"sm\": %d, \"sm_count\": %d, \"real\": %s},\n", model->sm, model->sm_count,
		       real ? "true" : "false");
		printf("  \"problem\": {\"pass\": \"decode\", \"layout\": \"%s\", \"dtype\": \"%s\", "
		       "\"head_dim\": %lld, \"mask\": ", layout, fa_dtype_name(f->dtype), (long long)D);
		fa_ctl_json_string(stdout, fa_mask_name(f->mask));
		printf(", \"B\": %lld, \"Hq\": %lld, \"Hkv\": %lld, \"Sq\": %lld, \"longest_Sk\": %lld",
		       (long long)f->B, (long long)f->Hq, (long long)f->Hkv, (long long)f->Sq,
		       (long long)maxk);
		if (d.kv == FA_KV_PAGED)
			printf(", \"page_size\": %lld", (long long)page_size);
		printf("},\n  \"status\": \"%s\"", fa_status_name(st));
		if (st != FA_OK) {
			printf(",\n  \"detail\": ");
			fa_ctl_json_string(stdout, err);
			printf("\n}\n");
		} else {
			printf(",\n  \"tile\": ");
			fa_ctl_json_string(stdout, tb);
			printf(", \"packed_rows\": %d, \"warps\": %d, \"stages\": %d, \"smem_bytes\": %zu, "
			       "\"registers\": %d, \"blocks_per_sm\": %d,\n  \"splits\": %d, "
			       "\"split_keys\": %d, \"grid\": [%d, %lld, %lld], \"merge_scratch_bytes\": %zu",
			       p.tile.br, p.tile.nw, p.tile.stages, p.tile.smem, p.tile.regs,
			       p.tile.blocks_per_sm, p.nsplit, p.split_keys, p.nsplit,
			       (long long)(f->Hkv * p.row_chunks), (long long)f->B, p.scratch);
			if (lens)
				printf(", \"longest_sequence_splits\": %d", dense.nsplit);
			printf("\n}\n");
		}
	} else {
		printf("device:    %s (sm_%d, %d SMs)%s\n", model->name, model->sm, model->sm_count,
		       real ? " (read from the GPU)" : "");
		printf("problem:   decode, %s %s head dim %lld, mask %s, B=%lld Hq=%lld Hkv=%lld "
		       "Sq=%lld, longest Sk=%lld", layout, fa_dtype_name(f->dtype), (long long)D,
		       fa_mask_name(f->mask), (long long)f->B, (long long)f->Hq, (long long)f->Hkv,
		       (long long)f->Sq, (long long)maxk);
		if (d.kv == FA_KV_PAGED)
			printf(", pages of %lld", (long long)page_size);
		printf("\n");
		if (st == FA_OK) {
			printf("tile:      %s  (%d packed rows = query x GQA member, 16 keys per step, %d "
			       "warps, %d stages), %zu bytes of shared memory, ~%d registers, %d "
			       "block(s)/SM\n", tb, p.tile.br, p.tile.nw, p.tile.stages, p.tile.smem,
			       p.tile.regs, p.tile.blocks_per_sm);
			printf("splits:    %d x %d keys, grid %d x %lld x %lld", p.nsplit, p.split_keys,
			       p.nsplit, (long long)(f->Hkv * p.row_chunks), (long long)f->B);
			if (p.nsplit > 1)
				printf(", merge pass over %zu bytes of partials", p.scratch);
			printf("\n");
			if (lens && dense.nsplit != p.nsplit)
				printf("ragged:    the longest sequence's dense plan would take %d split(s); "
				       "the lengths' cost model takes %d\n", dense.nsplit, p.nsplit);
		}
	}
	if (st != FA_OK)
		rc = fa_ctl_failure("plan", "%s: %s", fa_status_name(st), err);
	free(lens);
	free(pt);
	return rc;
}

int fa_ctl_plan_prefill(const struct fa_device_model *model, bool real,
                        const struct fa_plan_req *r, int64_t hkv, int64_t page_size, bool json)
{
	if (r->Sq < 1 || r->Sk < 1)
		return fa_ctl_usage_error("plan", "--prefill needs --seq-q and --seq-k (the longest "
		                          "sequence's query and key counts)");
	if (page_size != 0 && (page_size < FA_PAGE_SIZE_MIN || page_size > FA_PAGE_SIZE_MAX))
		return fa_ctl_usage_error("plan", "--page-size %" PRId64 ": pages hold %d to %d tokens",
		                          page_size, FA_PAGE_SIZE_MIN, FA_PAGE_SIZE_MAX);
	struct fa_attn_fwd_desc f;
	memset(&f, 0, sizeof f);
	f.dtype = r->dtype;
	f.precision = r->precision;
	f.mask = r->mask;
	f.D = r->D;
	f.scale = 1.0;
	f.B = r->B > 0 ? r->B : 1;
	f.Hq = r->H > 0 ? r->H : 32;
	f.Hkv = hkv > 0 ? hkv : f.Hq;
	f.Sq = r->Sq;
	f.Sk = r->Sk;
	const int layout = page_size > 0 ? FA_KLAYOUT_PAGED : FA_KLAYOUT_SEQ;
	const char *lname = page_size > 0 ? "paged cache" : "sequences of their own lengths";
	char err[1024] = "";
	struct fa_kernel_spec spec;
	struct fa_tile dense[FA_PLAN_MAX_CANDIDATES];
	int nd = 0;
	fa_status st = fa_check_head_dim(r->D, err, sizeof err);
	if (st == FA_OK)
		st = fa_plan_fwd_infer(model, r->ks, &f, f.Sq, f.Sk, layout, &spec, err, sizeof err);
	if (st == FA_OK && spec.tile.smem > model->smem_optin) {
		char tb[48];
		fa_tile_format(&spec.tile, tb, sizeof tb);
		st = fa_err(err, sizeof err, FA_ENOFIT,
		            "tile %s needs %zu bytes of shared memory, %s allows %zu", tb,
		            spec.tile.smem, model->name, model->smem_optin);
	}
	/* the dense kernel's choice for the same shape, mma.sync only as the layouts' */
	struct fa_kernel_settings ks = r->ks ? *r->ks : *fa_kernel_settings_default();
	ks.wgmma = false;
	struct fa_plan_req dr = *r;
	dr.ks = &ks;
	dr.B = f.B;
	dr.H = f.Hq;
	if (st == FA_OK && fa_plan(model, &dr, dense, FA_PLAN_MAX_CANDIDATES, &nd, err,
	                           sizeof err) != FA_OK)
		nd = 0;
	char tb[48] = "", dtb[48] = "";
	if (st == FA_OK)
		fa_tile_format(&spec.tile, tb, sizeof tb);
	if (nd > 0)
		fa_tile_format(&dense[0], dtb, sizeof dtb);
	const size_t extra = st == FA_OK ? fa_klayout_smem(&spec.tile, layout) : 0;
	if (json) {
		printf("{\n  \"device\": {\"name\": ");
		fa_ctl_json_string(stdout, model->name);
		printf(", \"sm\": %d, \"sm_count\": %d, \"real\": %s},\n", model->sm, model->sm_count,
		       real ? "true" : "false");
		printf("  \"problem\": {\"pass\": \"prefill\", \"layout\": \"%s\", \"dtype\": "
		       "\"%s\", \"head_dim\": %lld, \"mask\": ", page_size > 0 ? "paged" : "varlen",
		       fa_dtype_name(f.dtype), (long long)f.D);
		fa_ctl_json_string(stdout, fa_mask_name(f.mask));
		printf(", \"B\": %lld, \"Hq\": %lld, \"Hkv\": %lld, \"longest_Sq\": %lld, "
		       "\"longest_Sk\": %lld", (long long)f.B, (long long)f.Hq, (long long)f.Hkv,
		       (long long)f.Sq, (long long)f.Sk);
		if (page_size > 0)
			printf(", \"page_size\": %lld", (long long)page_size);
		printf("},\n  \"status\": \"%s\"", fa_status_name(st));
		if (st != FA_OK) {
			printf(",\n  \"detail\": ");
			fa_ctl_json_string(stdout, err);
		} else {
			printf(",\n  \"tile\": ");
			fa_ctl_json_string(stdout, tb);
			printf(", \"smem_bytes\": %zu, \"layout_smem_bytes\": %zu, \"registers\": %d, "
			       "\"smem_limit\": %zu", spec.tile.smem, extra, spec.tile.regs,
			       model->smem_optin);
			if (nd > 0) {
				printf(",\n  \"dense_tile\": ");
				fa_ctl_json_string(stdout, dtb);
			}
		}
		printf("\n}\n");
	} else {
		printf("device:    %s (sm_%d, %d SMs)%s\n", model->name, model->sm, model->sm_count,
		       real ? " (read from the GPU)" : "");
		printf("problem:   prefill over %s, %s head dim %lld, mask %s, B=%lld Hq=%lld Hkv=%lld, "
		       "longest Sq=%lld Sk=%lld", lname, fa_dtype_name(f.dtype), (long long)f.D,
		       fa_mask_name(f.mask), (long long)f.B, (long long)f.Hq, (long long)f.Hkv,
		       (long long)f.Sq, (long long)f.Sk);
		if (page_size > 0)
			printf(", pages of %lld", (long long)page_size);
		printf("\n");
		if (st == FA_OK) {
			printf("tile:      %s (mma.sync), %zu bytes of shared memory of %zu", tb,
			       spec.tile.smem, model->smem_optin);
			if (extra)
				printf(" (%zu of them the page row table)", extra);
			printf(", ~%d registers\n", spec.tile.regs);
			if (nd > 0 && strcmp(dtb, tb) != 0)
				printf("dense:     the same shape as one dense batch takes %s%s\n", dtb,
				       page_size > 0 ? "; the paged kernel needs registers for its page "
				                       "lookups, so it takes a tile that leaves them" : "");
		}
	}
	if (st != FA_OK)
		return fa_ctl_failure("plan", "%s: %s", fa_status_name(st), err);
	return FA_CTL_EXIT_OK;
}
