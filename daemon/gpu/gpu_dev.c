/* gpu_dev.c - one device opened and released: fa_gpu (driver, NVRTC, primary context, the
 * kernel disk cache), the worker's stream, the inline stream, the pipeline's events and the
 * canary; and how a device's UUID is written. */
#include "gpu_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

/* Release a device's resources (its worker has stopped). */
void gpu_dev_fini(struct gpu_dev *d)
{
	if (d->ctx != NULL) {
		fa_cu->CtxSetCurrent(d->ctx);
		if (d->scratch != 0)
			fa_cu->MemFree(d->scratch);
		if (d->canary_mem != 0)
			fa_cu->MemFree(d->canary_mem);
		for (int i = 0; i < GPU_PIPE; i++)
			if (d->pipe_ev[i] != NULL)
				fa_cu->EventDestroy(d->pipe_ev[i]);
		gpu_timing_fini(d);
		for (int i = 0; i < 2; i++)
			if (d->piece_ev[i] != NULL)
				fa_cu->EventDestroy(d->piece_ev[i]);
		if (d->inline_stream != NULL)
			fa_cu->StreamDestroy(d->inline_stream);
		if (d->stream != NULL)
			fa_cu->StreamDestroy(d->stream);
		fa_cu->DevicePrimaryCtxRelease(d->cudev);
	}
	runq_fini(&d->queue); /* empty: every job was handed back */
	fa_gpu_close(d->g);
	free(d->canary_ref);
	free(d->canary_out);
	memset(d, 0, sizeof(*d));
}

/* The kernels library's reports (disk-cache trouble, compile times) into the daemon's log. */
static void gpu_kernels_log(void *ctx, int level, const char *msg)
{
	(void)ctx;
	LOG_AT(level, "kernels: %s", msg);
}

/* Open one device: fa_gpu (driver, NVRTC, primary context, kernel disk cache), a stream. */
fa_status gpu_dev_open(struct gpu_backend *b, struct gpu_dev *d, int ordinal,
                       const struct config *cfg, char *err, size_t errlen)
{
	char why[256];
	fa_status st;
	fa_cu_res r;

	d->b = b;
	d->ordinal = ordinal;
	if ((st = fa_gpu_open(&d->g, ordinal, &cfg->kernels, err, errlen)) != FA_OK)
		return st;
	fa_gpu_set_log(d->g, gpu_kernels_log, NULL);
	/* A warm restart loads every kernel it compiled before from here; a cache that cannot be
	 * used only costs compile time, so it never stops the daemon. */
	if (cfg->cache_dir[0] != '\0' &&
	    fa_gpu_set_cache_dir(d->g, cfg->cache_dir, why, sizeof why) != FA_OK)
		log_warn("gpu: kernel disk cache off: %s", why);
	if ((st = fa_cu_load()) != FA_OK)
		return fa_err(err, errlen, st, "%s", fa_cu_why());
	fa_gpu_uuid(d->g, d->uuid);
	if ((r = fa_cu->DeviceGet(&d->cudev, ordinal)) != 0 ||
	    (r = fa_cu->DevicePrimaryCtxRetain(&d->ctx, d->cudev)) != 0) {
		d->ctx = NULL;
		return fa_err(err, errlen, FA_ENOGPU, "GPU %d: primary context: CUDA error %d (%s)",
		              ordinal, r, fa_cu_errstr(r));
	}
	fa_cu->CtxSetCurrent(d->ctx);
	if ((r = fa_cu->StreamCreate(&d->stream, FA_CU_STREAM_NON_BLOCKING)) != 0) {
		d->stream = NULL;
		return fa_err(err, errlen, FA_ENOGPU, "GPU %d: cuStreamCreate: CUDA error %d (%s)",
		              ordinal, r, fa_cu_errstr(r));
	}
	/* The inline stream gets the device's greatest priority (high-priority small jobs run on
	 * it beside a busy worker, gpu_loop.c); a driver that refuses leaves a plain stream. */
	int least = 0, greatest = 0;
	if (fa_cu->CtxGetStreamPriorityRange(&least, &greatest) == 0 && greatest < least &&
	    fa_cu->StreamCreateWithPriority(&d->inline_stream, FA_CU_STREAM_NON_BLOCKING,
	                                    greatest) == 0)
		d->inline_high = true;
	else
		d->inline_stream = NULL;
	if (d->inline_stream == NULL &&
	    (r = fa_cu->StreamCreate(&d->inline_stream, FA_CU_STREAM_NON_BLOCKING)) != 0) {
		/* only a latency optimisation: carry on without it */
		log_warn("gpu: GPU %d: no stream for small jobs on the loop: CUDA error %d (%s)",
		         ordinal, r, fa_cu_errstr(r));
		d->inline_stream = NULL;
		d->inline_high = false;
	}
	for (int i = 0; i < GPU_PIPE; i++)
		if ((r = fa_cu->EventCreate(&d->pipe_ev[i], FA_CU_EVENT_DISABLE_TIMING)) != 0) {
			d->pipe_ev[i] = NULL;
			return fa_err(err, errlen, FA_ENOGPU,
			              "GPU %d: cuEventCreate: CUDA error %d (%s)", ordinal, r,
			              fa_cu_errstr(r));
		}
	return gpu_canary_init(d, err, errlen);
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it. */
void gpu_uuid_text(const uint8_t u[16], char out[48])
{
	static const char hex[] = "0123456789abcdef";
	char *p = out;

	p += sprintf(p, "GPU-");
	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*p++ = '-';
		*p++ = hex[u[i] >> 4];
		*p++ = hex[u[i] & 15];
	}
	*p = '\0';
}
