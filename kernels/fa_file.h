/* fa_file.h - publishing a file atomically, for the kernels' on-disk state (the cubin cache and
 * the tuning table): readers, other daemons and a crash see the old file or the new one, never a
 * torn one. */
#ifndef FA_FILE_H
#define FA_FILE_H

#include <stddef.h>
#include <sys/uio.h>

#include "fa_types.h"

/* Write the nparts pieces to fd (a temporary file the caller created with O_EXCL in dir), fsync
 * it, close it, rename tmp over path and fsync dir. The fsync comes before the rename: otherwise a
 * crash can publish the name with no data behind it. fd is closed either way; on failure tmp is
 * removed and err says "<what>: writing <tmp>: ..." or "<what>: publishing <path>: ...".
 * Returns FA_OK or FA_ESYS. */
fa_status fa_file_publish(int fd, const char *tmp, const char *path, const char *dir,
                          const struct iovec *parts, int nparts, const char *what, char *err,
                          size_t errlen);

#endif /* FA_FILE_H */
