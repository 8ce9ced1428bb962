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
 * the daemon should keep near zero; the longer ones are mostly an idle device. The host time of
 * each job's enqueue is counted beside it: while the stream is idle the job's GPU time includes
 * it (the start event fires before the launch calls return), so "the kernel ran longer" and
 * "the launch took longer" can be told apart.
 *
 * The asynchronous sessions' streams (gpu_atiming_*): events around each kernel, after its wait
 * for the client's ready word passed, read by the session's thread once complete; a gap there
 * is the time from one call's kernel to the next one's start on the same stream, i.e. mostly
 * the client stream's turn (its wait for the done word, then its ready word for the next call).
 * Inline runs are not timed. */
#include "gpu_int.h"

#include <string.h>


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

void gpu_timing_enqueued(struct gpu_dev *d, uint64_t host_ns)
{
	pthread_mutex_lock(&d->b->mu);
	d->tm.enq_ns += host_ns;
	d->tm.enq_jobs++;
	pthread_mutex_unlock(&d->b->mu);
}

void gpu_timing_detected(struct gpu_dev *d, uint64_t late_ns)
{
	if (late_ns >= GPU_GAP_SHORT_NS) /* not a detection: the clocks disagree, or a stall */
		return;
	pthread_mutex_lock(&d->b->mu);
	d->tm.detect_ns += late_ns;
	d->tm.detects++;
	pthread_mutex_unlock(&d->b->mu);
}

/* ---- asynchronous streams ---------------------------------------------------------------- */

static bool gpu_atiming_ready(struct gpu_atiming *t)
{
	if (t->state != 0)
		return t->state > 0;
	t->pend = -1;
	for (int i = 0; i < GPU_ATIMING_SLOTS; i++)
		if (fa_cu->EventCreate(&t->a[i], 0) != 0 || fa_cu->EventCreate(&t->b[i], 0) != 0) {
			t->state = -1;
			return false;
		}
	t->state = 1;
	return true;
}

void gpu_atiming_start(struct gpu_atiming *t, fa_cu_stream s)
{
	t->jobs++;
	t->pend = -1;
	if (!gpu_atiming_ready(t))
		return;
	int j = (int)(t->rec % GPU_ATIMING_SLOTS);
	if (t->seq_of[j] != 0) /* every slot in flight (or held for the next gap): not timed */
		return;
	if (fa_cu->EventRecord(t->a[j], s) == 0)
		t->pend = j;
}

void gpu_atiming_end(struct gpu_atiming *t, fa_cu_stream s)
{
	int j = t->pend;

	t->pend = -1;
	if (j < 0 || fa_cu->EventRecord(t->b[j], s) != 0)
		return;
	t->seq_of[j] = t->jobs;
	t->rec++;
}

void gpu_atiming_read(struct gpu_atiming *t, struct gpu_dev *d)
{
	uint64_t busy = 0, n = 0, gap = 0, ngap = 0, gmax = 0;

	if (t->state <= 0)
		return;
	while (t->rd < t->rec) {
		int j = (int)(t->rd % GPU_ATIMING_SLOTS);
		float ms = 0, g = -1;
		fa_cu_res r = fa_cu->EventElapsedTime(&ms, t->a[j], t->b[j]);
		if (r == GPU_CU_NOT_READY)
			break;
		int prev = t->rd > 0 ? (int)((t->rd - 1) % GPU_ATIMING_SLOTS) : -1;
		if (r == 0) {
			busy += (uint64_t)((double)ms * 1e6);
			n++;
			/* a gap of 2 ms or more is an idle stream (the client sent nothing), not a
			 * hand-off between two calls: not counted, as for the worker's long gaps */
			if (prev >= 0 && t->seq_of[prev] != 0 && t->seq_of[prev] + 1 == t->seq_of[j] &&
			    fa_cu->EventElapsedTime(&g, t->b[prev], t->a[j]) == 0 && g >= 0 &&
			    (uint64_t)((double)g * 1e6) < GPU_GAP_SHORT_NS) {
				uint64_t gn = (uint64_t)((double)g * 1e6);
				gap += gn;
				ngap++;
				if (gn > gmax)
					gmax = gn;
			}
		}
		/* the pair before is no longer needed for a gap: its slot is free again; this one
		 * is held for the next pair's gap */
		if (prev >= 0)
			t->seq_of[prev] = 0;
		if (r != 0)
			t->seq_of[j] = 0;
		t->rd++;
	}
	if (n == 0)
		return;
	pthread_mutex_lock(&d->b->mu);
	d->tm.async_busy_ns += busy;
	d->tm.async_jobs += n;
	d->tm.async_gap_ns += gap;
	d->tm.async_gaps += ngap;
	if (gmax > d->tm.async_gap_max_ns)
		d->tm.async_gap_max_ns = gmax;
	pthread_mutex_unlock(&d->b->mu);
}

void gpu_atiming_fini(struct gpu_atiming *t)
{
	for (int i = 0; i < GPU_ATIMING_SLOTS; i++) {
		if (t->a[i] != NULL)
			fa_cu->EventDestroy(t->a[i]);
		if (t->b[i] != NULL)
			fa_cu->EventDestroy(t->b[i]);
	}
	memset(t, 0, sizeof *t);
}
