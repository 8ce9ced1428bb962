/* log.h - the daemon's log: one line per event on stderr, subsystem first.
 *
 * Levels are syslog's numbers. Under systemd (stderr is the journal) each line is "<N>message",
 * which journald turns into the priority; elsewhere each line starts with a seconds.microseconds
 * timestamp and the level's name. One write(2) per line, so lines from worker threads never
 * interleave. Call through the macros: they test the level before any argument is formatted.
 */
#ifndef FA_DAEMON_LOG_H
#define FA_DAEMON_LOG_H

#include <stdbool.h>

#define FA_LOG_ERR 3     /* the daemon cannot go on, or lost something */
#define FA_LOG_WARNING 4 /* something is wrong but service continues */
#define FA_LOG_NOTICE 5  /* lifecycle: start, config, ready, sessions, shutdown (the default) */
#define FA_LOG_INFO 6    /* one line per request (-v) */
#define FA_LOG_DEBUG 7   /* everything else (-vv) */

/* The most verbose level written. Read by the macros; set by log_init. */
extern int log_level;

/* Set the level from the verbosity (0 notice, 1 info, 2 debug) and choose the line format:
 * journal ("<N>") when $JOURNAL_STREAM names our stderr, or when systemd started us
 * ($INVOCATION_ID) and stderr is not a terminal; timestamps otherwise. */
void log_init(int verbose);

/* Is the journal format in use? (For tests.) */
bool log_journal(void);

/* Write one line (a newline is added; a trailing one in fmt is not doubled). Thread-safe. */
void log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_AT(level, ...)                                                                         \
	do {                                                                                       \
		if ((level) <= log_level)                                                          \
			log_write((level), __VA_ARGS__);                                           \
	} while (0)
#define log_err(...) LOG_AT(FA_LOG_ERR, __VA_ARGS__)
#define log_warn(...) LOG_AT(FA_LOG_WARNING, __VA_ARGS__)
#define log_notice(...) LOG_AT(FA_LOG_NOTICE, __VA_ARGS__)
#define log_info(...) LOG_AT(FA_LOG_INFO, __VA_ARGS__)
#define log_debug(...) LOG_AT(FA_LOG_DEBUG, __VA_ARGS__)

#endif /* FA_DAEMON_LOG_H */
