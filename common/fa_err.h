/* fa_err.h - statuses inside fa: the detail text of a failure, and whether a number is a status.
 *
 * Every "format the reason into the caller's buffer and return the status" in fa goes through
 * fa_err(), so error paths read `return fa_err(err, errlen, FA_ERANGE, "q: ...", ...)`. Internal:
 * compiled into every program and, hidden, into libfaclient.
 */
#ifndef FA_ERR_H
#define FA_ERR_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_types.h"

/* snprintf the reason into buf, which may be NULL or 0 bytes; never overflows, always terminates
 * (truncating). Returns st. Thread-safe; never allocates. */
fa_status fa_err(char *buf, size_t len, fa_status st, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* fa_err with a va_list, for helpers that forward their own arguments. Returns st. */
fa_status fa_verr(char *buf, size_t len, fa_status st, const char *fmt, va_list ap)
	__attribute__((format(printf, 4, 0)));

/* Whether a number is a status of this version (FA_STATUS_MAP): the reply decoder rejects
 * others. */
bool fa_status_known(int64_t code);

#endif /* FA_ERR_H */
