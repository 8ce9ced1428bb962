/* gpu_timing.c - how long each synchronous job kept its GPU busy, and how long the GPU sat idle
 * between two jobs of the worker's stream (issue 12 item 1: where the daemon loses speed).
 *
 * Timing events around each job of a batch, and one more after a batch's last job (two, used in
 * turn, so the previous batch's stays valid while the next batch records its own). They are
 * read after the job's own event completed (gpu_complete waited for it), so the hot path gains
 * two cuEventRecord calls per job and no host synchronisation. A gap is the time from the end
 * of the job before (on this stream) to the start of this one: within a batch it is launch
 * overhead; across batches it is the host's turn (hand-back, reply, the client's next request)
 * or simply no work. Gaps under GPU_GAP_SHORT_NS are counted apart: back-to-back traffic, which
 * the daemon should keep near zero; the longer ones are mostly an idle device. Worker jobs only
 * (inline runs and the asynchronous sessions' streams are not timed). */
#include "gpu_int.h"

#include <string.h>

#define GPU_GAP_SHORT_NS 2000000ull /* 2 ms: longer is an idle device, not a slow hand-off */

/* Events for the worker (its thread, context current); false when they cannot be had (the
 * timing is then off for this device, nothing else changes). */
static bool gpu_timing_ready(struct gpu_dev *d)
{
	struct gpu_timing *tm = &d->tm;

	if (tm->state != 0)
		return tm->state > 0;
	for (int i = 0; i < GPU_PIPE; i++)
		if (fa_cu->EventCreate(&tm->start[i], 0) != 0 ||
		    fa_cu->EventCreate(&tm->end[i], 0) != 0) {
			tm->state = -1;
			return false;
		}
	for (int i = 0; i < 2; i++)
		if (fa_cu->EventCreate(&tm->tail[i], 0) != 0) {
			tm->state = -1;
			return false;
		}
	tm->state = 1;
	return true;
}

void gpu_timing_start(struct gpu_dev *d, unsigned i, fa_cu_stream s)
{
	if (gpu_timing_ready(d))
		d->tm.ok[i] = fa_cu->EventRecord(d->tm.start[i], s) == 0;
}

void gpu_timing_end(struct gpu_dev *d, unsigned i, fa_cu_stream s)
{
	if (d->tm.state > 0 && d->tm.ok[i])
		d->tm.ok[i] = fa_cu->EventRecord(d->tm.end[i], s) == 0;
}

void gpu_timing_batch_end(struct gpu_dev *d, unsigned n, fa_cu_stream s)
{
	struct gpu_timing *tm = &d->tm;

	if (tm->state <= 0 || n == 0)
		return;
	tm->prev = tm->cur;
	tm->prev_valid = tm->cur_valid;
	tm->cur ^= 1;
	tm->cur_valid = fa_cu->EventRecord(tm->tail[tm->cur], s) == 0;
}

void gpu_timing_read(struct gpu_dev *d, unsigned i, struct backend_job *job)
{
	struct gpu_timing *tm = &d->tm;
	float ms = 0, gap = -1;

	if (tm->state <= 0 || !tm->ok[i])
		return;
	if (fa_cu->EventElapsedTime(&ms, tm->start[i], tm->end[i]) != 0)
		return;
	if (i > 0 && tm->ok[i - 1]) {
		if (fa_cu->EventElapsedTime(&gap, tm->end[i - 1], tm->start[i]) != 0)
			gap = -1;
	} else if (i == 0 && tm->prev_valid) {
		if (fa_cu->EventElapsedTime(&gap, tm->tail[tm->prev], tm->start[0]) != 0)
			gap = -1;
	}
	uint64_t ns = (uint64_t)((double)ms * 1e6);
	job->gpu_ns = ns;
	pthread_mutex_lock(&d->b->mu);
	tm->busy_ns += ns;
	tm->jobs++;
	if (gap >= 0) {
		uint64_t g = (uint64_t)((double)gap * 1e6);
		if (g < GPU_GAP_SHORT_NS) {
			tm->gap_short_ns += g;
			tm->gaps_short++;
			if (g > tm->gap_short_max_ns)
				tm->gap_short_max_ns = g;
		} else {
			tm->gap_long_ns += g;
			tm->gaps_long++;
		}
	}
	pthread_mutex_unlock(&d->b->mu);
}

void gpu_timing_fini(struct gpu_dev *d)
{
	struct gpu_timing *tm = &d->tm;

	for (int i = 0; i < GPU_PIPE; i++) {
		if (tm->start[i] != NULL)
			fa_cu->EventDestroy(tm->start[i]);
		if (tm->end[i] != NULL)
			fa_cu->EventDestroy(tm->end[i]);
	}
	for (int i = 0; i < 2; i++)
		if (tm->tail[i] != NULL)
			fa_cu->EventDestroy(tm->tail[i]);
	memset(tm, 0, sizeof *tm);
}
