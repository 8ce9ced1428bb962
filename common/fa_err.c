/* fa_err.c - the one error-text helper. */
#include "fa_err.h"

#include <stdio.h>

/* Format the reason into buf (when there is room) and hand back the status. */
fa_status fa_verr(char *buf, size_t len, fa_status st, const char *fmt, va_list ap)
{
	if (buf != NULL && len > 0)
		vsnprintf(buf, len, fmt, ap);
	return st;
}

/* fa_verr with its own arguments. */
fa_status fa_err(char *buf, size_t len, fa_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fa_verr(buf, len, st, fmt, ap);
	va_end(ap);
	return st;
}
