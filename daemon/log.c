/* log.c - format one line and write it with one write(2). */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

int log_level = FA_LOG_NOTICE;
static bool log_use_journal;

/* Does $JOURNAL_STREAM ("dev:inode") name the file behind stderr? systemd sets it for services
 * whose stderr goes to the journal; a child that redirected stderr inherits a stale value. */
static bool log_stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (js == NULL || sscanf(js, "%llu:%llu", &dev, &ino) != 2 ||
	    fstat(STDERR_FILENO, &st) != 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* Level from -v, format from the environment; see log.h. */
void log_init(int verbose)
{
	log_level = verbose >= 2 ? FA_LOG_DEBUG : verbose == 1 ? FA_LOG_INFO : FA_LOG_NOTICE;
	log_use_journal = log_stderr_is_journal() ||
	                  (getenv("INVOCATION_ID") != NULL && !isatty(STDERR_FILENO));
}

/* Whether lines carry the "<N>" journal prefix. */
bool log_journal(void)
{
	return log_use_journal;
}

/* The level's word in the timestamped format. */
static const char *log_level_name(int level)
{
	switch (level) {
	case FA_LOG_ERR: return "error";
	case FA_LOG_WARNING: return "warning";
	case FA_LOG_NOTICE: return "notice";
	case FA_LOG_INFO: return "info";
	default: return "debug";
	}
}

/* Format one line into a stack buffer and write it whole. */
void log_write(int level, const char *fmt, ...)
{
	char line[1024];
	size_t n;
	int saved = errno; /* callers log then look at errno */
	va_list ap;

	if (log_use_journal) {
		n = (size_t)snprintf(line, sizeof line, "<%d>", level);
	} else {
		struct timeval tv;
		gettimeofday(&tv, NULL);
		n = (size_t)snprintf(line, sizeof line, "%lld.%06ld %s ", (long long)tv.tv_sec,
		                     (long)tv.tv_usec, log_level_name(level));
	}
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
	va_end(ap);
	if (m > 0)
		n += (size_t)m < sizeof line - n - 1 ? (size_t)m : sizeof line - n - 2;
	while (n > 0 && line[n - 1] == '\n')
		n--;
	line[n++] = '\n';
	for (size_t off = 0; off < n;) {
		ssize_t w = write(STDERR_FILENO, line + off, n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		off += (size_t)w;
	}
	errno = saved;
}
