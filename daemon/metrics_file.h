/* metrics_file.h - the Prometheus textfile: every interval, ask the owner for the exposition
 * text and write it atomically to a file (metrics_write_file), for node_exporter's textfile
 * collector (--collector.textfile.directory; the file must end in .prom). Off unless started.
 * A failed write is logged once per kind of failure (a warning), then retried every interval.
 * Loop thread only. */
#ifndef FA_DAEMON_METRICS_FILE_H
#define FA_DAEMON_METRICS_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include <uv.h>

#include "fa_types.h"

/* Fill buf (cap bytes) with the exposition text; return its length, 0 when it did not fit. */
typedef size_t (*metrics_text_fn)(char *buf, size_t cap, void *arg);

struct metrics_file {
	uv_timer_t timer;
	bool open;
	char path[4096];
	metrics_text_fn text;
	void *arg;
	char *buf;             /* the text, grown when it does not fit */
	size_t cap;
	int last_errno;        /* of the last failed write, 0 after a good one (log once) */
	unsigned long writes;  /* files written (tests, logs) */
	void (*closed)(void *arg);
	void *closed_arg;
};

/* Write the file now and then every interval_ms. Returns FA_OK, FA_EINVAL (an empty path, or a
 * path of 4096 bytes or more) or FA_ENOMEM / FA_ESYS (the timer); err says why. */
fa_status metrics_file_start(struct metrics_file *mf, uv_loop_t *loop, const char *path,
                             unsigned interval_ms, metrics_text_fn text, void *arg, char *err,
                             size_t errlen);

/* Write the file a last time, stop, and call closed(arg) once the timer is closed (at once
 * from the loop when it was never started). The file stays: a stopped daemon's last values. */
void metrics_file_stop(struct metrics_file *mf, void (*closed)(void *arg), void *arg);

#endif /* FA_DAEMON_METRICS_FILE_H */
