/* fa_file.c - atomic publication of a file; see fa_file.h. */
#include "fa_file.h"

#include "fa_err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* All of n bytes, through EINTR and short writes. */
static int write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* See fa_file.h. */
fa_status fa_file_publish(int fd, const char *tmp, const char *path, const char *dir,
                          const struct iovec *parts, int nparts, const char *what, char *err,
                          size_t errlen)
{
	int rc = 0;

	for (int i = 0; i < nparts && rc == 0; i++)
		rc = write_all(fd, parts[i].iov_base, parts[i].iov_len);
	if (rc != 0 || fsync(fd) != 0) {
		int e = errno;
		close(fd);
		unlink(tmp);
		return fa_err(err, errlen, FA_ESYS, "%s: writing %s: %s", what, tmp, strerror(e));
	}
	if (close(fd) != 0 || rename(tmp, path) != 0) {
		int e = errno;
		unlink(tmp);
		return fa_err(err, errlen, FA_ESYS,
		              "%s: publishing %s: %s", what, path, strerror(e));
	}
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
	return FA_OK;
}
