/* metrics_file.c - the periodic Prometheus textfile; see metrics_file.h. */
#include "metrics_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "util.h"

/* Ask for the text (growing the buffer up to 4 MiB) and write it. */
static void metrics_file_write(struct metrics_file *mf)
{
	size_t len = 0;
	for (;;) {
		if (mf->buf != NULL && (len = mf->text(mf->buf, mf->cap, mf->arg)) > 0)
			break;
		size_t cap = mf->cap ? mf->cap * 2 : 65536;
		char *nb = cap <= (4u << 20) ? realloc(mf->buf, cap) : NULL;
		if (nb == NULL) {
			if (mf->last_errno != ENOMEM)
				log_warn("metrics: no memory for the text of %s", mf->path);
			mf->last_errno = ENOMEM;
			return;
		}
		mf->buf = nb;
		mf->cap = cap;
	}
	if (metrics_write_file(mf->path, mf->buf, len) != 0) {
		if (errno != mf->last_errno)
			log_warn("metrics: cannot write %s: %s (retried every interval)", mf->path,
			         strerror(errno));
		mf->last_errno = errno;
		return;
	}
	if (mf->last_errno != 0)
		log_notice("metrics: writing %s again", mf->path);
	mf->last_errno = 0;
	mf->writes++;
}

static void metrics_file_tick(uv_timer_t *t)
{
	metrics_file_write(t->data);
}

fa_status metrics_file_start(struct metrics_file *mf, uv_loop_t *loop, const char *path,
                             unsigned interval_ms, metrics_text_fn text, void *arg, char *err,
                             size_t errlen)
{
	memset(mf, 0, sizeof *mf);
	if (path[0] == '\0' || strlen(path) >= sizeof mf->path)
		return fa_err(err, errlen, FA_EINVAL, "metrics file path is empty or too long");
	snprintf(mf->path, sizeof mf->path, "%s", path);
	mf->text = text;
	mf->arg = arg;
	if (uv_timer_init(loop, &mf->timer) != 0)
		return fa_err(err, errlen, FA_ESYS, "cannot create the metrics timer");
	mf->timer.data = mf;
	mf->open = true;
	metrics_file_write(mf);
	if (uv_timer_start(&mf->timer, metrics_file_tick, interval_ms, interval_ms) != 0)
		return fa_err(err, errlen, FA_ESYS, "cannot start the metrics timer");
	log_info("metrics: writing %s every %u ms", mf->path, interval_ms);
	return FA_OK;
}

static void metrics_file_closed(uv_handle_t *h)
{
	struct metrics_file *mf = h->data;
	free(mf->buf);
	mf->buf = NULL;
	if (mf->closed != NULL)
		mf->closed(mf->closed_arg);
}

void metrics_file_stop(struct metrics_file *mf, void (*closed)(void *arg), void *arg)
{
	if (!mf->open) {
		if (closed != NULL)
			closed(arg);
		return;
	}
	metrics_file_write(mf);
	uv_timer_stop(&mf->timer);
	mf->open = false;
	mf->closed = closed;
	mf->closed_arg = arg;
	uv_close((uv_handle_t *)&mf->timer, metrics_file_closed);
}
