/* gpu_compile.c - the compile threads: a job whose kernel is not loaded waits in the compile
 * table (compile_pool.h) while one of these prepares it (NVRTC or the disk cache, without mu),
 * so the GPU worker never compiles while other clients' jobs wait behind it. With nothing
 * waiting they compile tuning candidates and save the tuning table (lowest priority). */
#include "gpu_int.h"

#include "log.h"

/* A compile thread: prepare the oldest waiting specialisation, then move its jobs to the worker
 * (or answer them with the compile's failure); with nothing waiting, compile a tuning candidate
 * or save the tuning table (lowest priority: one unit at a time, so a client's compile waits for
 * at most one unit on each thread). */
void *gpu_compiler(void *arg)
{
	struct gpu_backend *b = arg;
	char err[FA_PROTO_DETAIL_MAX];

	/* fa_gpu_prepare makes the right context current itself; this covers anything else */
	fa_cu->CtxSetCurrent(b->devs[0].ctx);
	pthread_mutex_lock(&b->mu);
	for (;;) {
		struct compile_wait *w = NULL;
		int ti = -1;
		bool save = false;
		while (!b->stopping && (w = compile_table_take(&b->waiting)) == NULL) {
			if (b->tune_prepping && b->tune_next < b->tune_ntiles) {
				ti = b->tune_next++;
				break;
			}
			if (b->tune_save) {
				b->tune_save = false;
				save = true;
				break;
			}
			pthread_cond_wait(&b->compile_cv, &b->mu);
		}
		if (w == NULL && ti < 0 && !save)
			break; /* stopping */
		struct fa_attn_fwd_desc desc = w != NULL ? w->desc : b->tune_desc;
		/* jobs compile for their device; tuning candidates for device 0 */
		struct gpu_dev *d = &b->devs[w != NULL && w->dev >= 0 ? w->dev : 0];
		struct fa_tile tile;
		if (ti >= 0)
			tile = b->tune_tiles[ti];
		pthread_mutex_unlock(&b->mu);

		fa_status st = FA_OK;
		err[0] = '\0';
		if (save)
			st = fa_tune_table_save(b->tune, err, sizeof err);
		else
			st = fa_gpu_prepare(d->g, &desc, ti >= 0 ? &tile : NULL, err, sizeof err);

		pthread_mutex_lock(&b->mu);
		if (save) {
			if (st != FA_OK)
				log_warn("gpu: saving the tuning table: %s", err);
			continue;
		}
		if (ti >= 0) {
			/* a candidate that fails is dropped by the tuner's own prepare step */
			if (--b->tune_left == 0)
				pthread_cond_broadcast(&b->cv);
			continue;
		}
		b->compiles++;
		if (st != FA_OK)
			b->compiles_failed++;
		struct backend_job *job = compile_table_finish(&b->waiting, w);
		bool woke = false;
		while (job != NULL) {
			struct backend_job *next = job->next;
			if (b->stopping) {
				/* the worker may be gone: never queue behind it now */
				gpu_finish_locked(b, job, FA_ECLOSED, "the daemon is shutting down");
				woke = true;
			} else if (st == FA_OK || st == FA_EDEVICE) {
				/* FA_EDEVICE: the worker retries and classifies the driver's error
				 * (a lost context is the fatal path) exactly as before the pool */
				if (gpu_queue_locked(d, job) != FA_OK) {
					b->fwd_failed++;
					gpu_finish_locked(b, job, FA_ENOMEM,
					                  "out of memory queueing the request");
					woke = true;
				}
			} else {
				b->fwd_failed++;
				gpu_finish_locked(b, job, st, err);
				woke = true;
			}
			job = next;
		}
		pthread_cond_broadcast(&b->cv);
		if (woke)
			uv_async_send(&b->async);
	}
	pthread_mutex_unlock(&b->mu);
	return NULL;
}
