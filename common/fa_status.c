/* fa_status.c - status names and texts, generated from FA_STATUS_MAP (fa_types.h), and the
 * library's version string.
 *
 * Everything here returns static storage and never allocates: these functions are called on error
 * paths, from any thread, including after malloc failed.
 */
#include "fa_err.h"

#define FA_STR2(x) #x
#define FA_STR(x) FA_STR2(x)

/* Returned for values not in the map (a newer peer, a cast of garbage). */
#define UNKNOWN_NAME "FA_UNKNOWN"
#define UNKNOWN_TEXT "unknown status"

/* Text for a status; fixed text for unknown values. */
const char *fa_strerror(fa_status st)
{
	switch (st) {
#define FA_STATUS_TEXT_CASE(name, number, text) \
	case name: return text;
		FA_STATUS_MAP(FA_STATUS_TEXT_CASE)
#undef FA_STATUS_TEXT_CASE
	}
	return UNKNOWN_TEXT;
}

/* Enum name for a status; "FA_UNKNOWN" for unknown values. */
const char *fa_status_name(fa_status st)
{
	switch (st) {
#define FA_STATUS_NAME_CASE(name, number, text) \
	case name: return #name;
		FA_STATUS_MAP(FA_STATUS_NAME_CASE)
#undef FA_STATUS_NAME_CASE
	}
	return UNKNOWN_NAME;
}

/* Whether a number is a status of this version; see fa_err.h. */
bool fa_status_known(int64_t code)
{
	switch (code) {
#define FA_STATUS_KNOWN_CASE(name, number, text) \
	case number: return true;
		FA_STATUS_MAP(FA_STATUS_KNOWN_CASE)
#undef FA_STATUS_KNOWN_CASE
	}
	return false;
}

/* "MAJOR.MINOR.PATCH", built at compile time from the header's macros. */
const char *fa_version_string(void)
{
	return FA_STR(FA_VERSION_MAJOR) "." FA_STR(FA_VERSION_MINOR) "." FA_STR(FA_VERSION_PATCH);
}
