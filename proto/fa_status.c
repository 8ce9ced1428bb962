/* fa_status.c - the one table of status names and texts, and the library's version string.
 *
 * Everything here returns static storage and never allocates: these functions are called on error
 * paths, from any thread, including after malloc failed.
 */
#include <stdbool.h>

#include "fa_proto.h"

#define FA_STR2(x) #x
#define FA_STR(x) FA_STR2(x)

/* Returned for values not in the table (a newer peer, a cast of garbage). */
#define UNKNOWN_NAME "FA_UNKNOWN"
#define UNKNOWN_TEXT "unknown status"

/* The one table: number, enum name, text. Order follows the enum; numbers are never reused. */
static const struct status_entry {
	fa_status code;
	const char *name;
	const char *text;
} status_table[] = {
	{FA_OK, "FA_OK", "success"},
	{FA_EINVAL, "FA_EINVAL", "invalid argument"},
	{FA_ENOMEM, "FA_ENOMEM", "out of host memory"},
	{FA_EUNAVAIL, "FA_EUNAVAIL", "daemon not running or not reachable"},
	{FA_ETIMEDOUT, "FA_ETIMEDOUT", "no reply from the daemon within the timeout"},
	{FA_EPROTO, "FA_EPROTO", "malformed protocol message"},
	{FA_EVERSION, "FA_EVERSION", "protocol version mismatch between client and daemon"},
	{FA_EBUSY, "FA_EBUSY", "too many calls in flight on this session; retry later"},
	{FA_ECLOSED, "FA_ECLOSED", "daemon shutting down or client closed"},
	{FA_ENOTSUP, "FA_ENOTSUP", "not supported by this daemon"},
	{FA_EDEVICE, "FA_EDEVICE", "GPU fault while serving the request"},
	{FA_ESESSION, "FA_ESESSION", "unknown session (the daemon restarted?); reconnect"},
	{FA_EREGION, "FA_EREGION", "unknown region, or a region of another session"},
	{FA_ERANGE, "FA_ERANGE", "tensor extends outside its region"},
	{FA_ESHAPE, "FA_ESHAPE", "inconsistent or unsupported tensor shapes"},
	{FA_EALIGN, "FA_EALIGN", "offset or stride breaks the required alignment"},
	{FA_EOVERLAP, "FA_EOVERLAP", "output overlaps an input"},
	{FA_ETOOBIG, "FA_ETOOBIG", "message larger than the protocol limit"},
	{FA_ENOFIT, "FA_ENOFIT", "no tile configuration fits the device's shared memory"},
	{FA_EPERM, "FA_EPERM", "permission denied"},
	{FA_ENOGPU, "FA_ENOGPU", "no usable GPU or CUDA driver"},
	{FA_ELIMIT, "FA_ELIMIT", "session limit reached (regions or sessions)"},
	{FA_ESYS, "FA_ESYS", "operating-system call failed"},
	{FA_EIPC, "FA_EIPC", "memory not exportable by CUDA IPC"},
	{FA_EDTYPE, "FA_EDTYPE", "dtype mismatch or unsupported dtype"},
	{FA_EINTERNAL, "FA_EINTERNAL", "internal error in fa; please report it with the daemon's log"},
};

/* The entry for a code, or NULL. A linear scan: 26 entries, only on error paths. */
static const struct status_entry *status_find(long long code)
{
	for (size_t i = 0; i < sizeof status_table / sizeof status_table[0]; i++)
		if ((long long)status_table[i].code == code)
			return &status_table[i];
	return NULL;
}

/* Text for a status; fixed text for unknown values. */
const char *fa_strerror(fa_status st)
{
	const struct status_entry *e = status_find((long long)st);
	return e ? e->text : UNKNOWN_TEXT;
}

/* Enum name for a status; "FA_UNKNOWN" for unknown values. */
const char *fa_status_name(fa_status st)
{
	const struct status_entry *e = status_find((long long)st);
	return e ? e->name : UNKNOWN_NAME;
}

/* Whether a number is a status of this version (the reply decoder rejects others). */
bool fa_proto_status_known(int64_t code)
{
	return status_find((long long)code) != NULL;
}

/* "MAJOR.MINOR.PATCH", built at compile time from the header's macros. */
const char *fa_version_string(void)
{
	return FA_STR(FA_VERSION_MAJOR) "." FA_STR(FA_VERSION_MINOR) "." FA_STR(FA_VERSION_PATCH);
}
