/* gpu_tune.c - background tuning: device 0's worker, while its queue is empty, starts the
 * tuning table's next wanted class and steps its tuner a slice at a time (fa_tune.h); the
 * candidates' kernels are compiled first by the compile threads (gpu_compile.c), so a step only
 * runs kernels and a client job waits at most one slice. */
#include "gpu_int.h"

#include <string.h>

#include "fault.h"
#include "log.h"

/* The tuner finished (worker, mutex NOT held): log the outcome, free it, have the table saved.
 * Returns whether a winner was stored. */
static bool gpu_tune_finish(struct gpu_backend *b, fa_status st, const char *why)
{
	struct fa_tune_entry e;
	int fails = 0;
	bool ok = fa_tuner_result(b->tuner, &e, &fails);

	if (ok) {
		char kb[96], hb[48], tb[48];
		fa_tune_key_format(&e.key, kb, sizeof kb);
		fa_tile_format(&e.heur, hb, sizeof hb);
		fa_tile_format(&e.best, tb, sizeof tb);
		log_notice("gpu: tuned %s: heuristic %s %.1f us, tuned %s %.1f us (%d candidates, "
		           "%d failed)", kb, hb, e.heur_us, tb, e.best_us, e.candidates, fails);
		char err[256];
		/* with compile threads, one of them saves (file I/O and fsync off the worker) */
		if (b->ncompile == 0 && fa_tune_table_save(b->tune, err, sizeof err) != FA_OK)
			log_warn("gpu: saving the tuning table: %s", err);
	} else {
		log_info("gpu: tuning a class stored nothing: %s", st != FA_OK ? why : "no result");
	}
	fa_tuner_free(b->tuner);
	b->tuner = NULL;
	return ok;
}

/* One idle turn of d's worker (mutex held, queue empty, not stopping): one tuning step, or
 * starting the next class. Returns true when it did something (the caller re-checks its queue:
 * a client job waits at most one step), false when there is nothing to do (the caller sleeps;
 * the compile threads wake it when a class' candidates are compiled). Never holds the mutex
 * across CUDA work. */
bool gpu_tune_turn_locked(struct gpu_dev *d)
{
	struct gpu_backend *b = d->b;
	char why[FA_PROTO_DETAIL_MAX];
	fa_status st;

	if (!b->tune_idle || d != &b->devs[0] || fault_marked(&b->base))
		return false;
	why[0] = '\0';
	if (b->tuner != NULL) {
		bool done = false;
		pthread_mutex_unlock(&b->mu);
		st = fa_tuner_step(b->tuner, GPU_TUNE_SLICE_US, &done, why, sizeof why);
		/* a timed candidate may have poisoned the context: the next client job would find
		 * it, but say so now */
		fa_cu_res r = st == FA_EDEVICE ? fa_cu->CtxSynchronize() : 0;
		bool ok = done && gpu_tune_finish(b, st, why);
		pthread_mutex_lock(&b->mu);
		if (r != 0 && fa_cu_sticky(r)) {
			gpu_fatal_locked(b, "the GPU faulted while tuning kernels in the background");
			return false;
		}
		if (done) {
			if (ok) {
				b->tuned++;
				b->tune_save = true;
				pthread_cond_broadcast(&b->compile_cv);
			} else {
				b->tune_failed++;
			}
		}
		return true;
	}
	if (b->tune_prepping) {
		if (b->tune_left > 0)
			return false; /* the compile threads wake us */
		b->tune_prepping = false;
		struct fa_attn_fwd_desc desc = b->tune_desc;
		pthread_mutex_unlock(&b->mu);
		st = fa_tuner_start(&b->tuner, b->tune, &desc, &b->tune_ops, NULL, why, sizeof why);
		if (st != FA_OK) {
			b->tuner = NULL;
			log_info("gpu: cannot tune a class: %s", why);
		}
		pthread_mutex_lock(&b->mu);
		if (st != FA_OK)
			b->tune_failed++;
		return true;
	}
	/* Plain CPU work (the table's own lock, the planner): fine under the mutex. */
	struct fa_tune_key k;
	if (!fa_tune_table_next_wanted(b->tune, &k))
		return false;
	int n = 0;
	fa_tune_key_desc(&k, &b->tune_desc);
	st = fa_gpu_plan(d->g, &b->tune_desc, b->tune_tiles, FA_TUNE_DEFAULT_CANDIDATES, &n, why,
	                 sizeof why);
	if (st != FA_OK || n <= 0) {
		b->tune_failed++;
		return true;
	}
	b->tune_ntiles = n;
	b->tune_next = 0;
	/* without compile threads the tuner's own prepare step compiles, on this thread */
	b->tune_left = b->ncompile > 0 ? n : 0;
	b->tune_prepping = true;
	pthread_cond_broadcast(&b->compile_cv);
	return true;
}

/* The tuning table (after the disk cache dir is set, before any thread uses the device): loaded
 * from <cache dir>/tuning, handed to fa_gpu so launches use tuned tiles. Failures only cost the
 * tuning: logged, and the heuristic serves. */
void gpu_tune_open(struct gpu_backend *b, const struct config *cfg)
{
	struct gpu_dev *d = &b->devs[0];
	struct fa_tune_ident id;
	struct fa_tune_stats ts;
	char why[256];

	fa_tune_gpu_ident(d->g, &id);
	if (fa_tune_table_open(&b->tune, cfg->cache_dir[0] != '\0' ? cfg->cache_dir : NULL, &id,
	                       fa_gpu_model(d->g), 0, why, sizeof why) != FA_OK) {
		log_warn("gpu: tuning table off: %s", why);
		b->tune = NULL;
		return;
	}
	fa_tune_table_stats(b->tune, &ts);
	log_notice("gpu: tuning table %s: %d entries loaded, %d corrupt lines skipped%s%s",
	           fa_tune_table_path(b->tune)[0] ? fa_tune_table_path(b->tune) : "(memory)",
	           ts.loaded, ts.corrupt, ts.why[0] ? "; " : "", ts.why);
	fa_gpu_set_tune_table(d->g, b->tune);
	if (strcmp(cfg->tune, "off") == 0)
		return;
	if (fa_tune_gpu_ops_init(&b->tune_ops, d->g, why, sizeof why) != FA_OK) {
		log_warn("gpu: background tuning off: %s", why);
		return;
	}
	b->tune_ops_ok = true;
	b->tune_idle = true;
}
