/* notify.c - sd_notify(3) without libsystemd: a datagram to $NOTIFY_SOCKET. */
#include "notify.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* One datagram to $NOTIFY_SOCKET; see notify.h. */
fa_status notify_send(const char *state)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa;
	size_t len;
	socklen_t salen;

	if (path == NULL || *path == '\0')
		return FA_OK;
	len = strlen(path);
	if ((path[0] != '/' && path[0] != '@') || len >= sizeof(sa.sun_path))
		return FA_EINVAL;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, path, len);
	if (path[0] == '@') {
		/* An abstract name: the leading byte is NUL and the length is exact (no trailing
		 * NUL counted), as systemd does. */
		sa.sun_path[0] = '\0';
		salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
	} else {
		salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
	}

	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return FA_ESYS;
	ssize_t n;
	do {
		/* Never block the loop: a listener that stopped reading (its queue holds ~10
		 * datagrams) must not freeze the daemon; a lost status line is harmless, and
		 * systemd always reads. */
		n = sendto(fd, state, strlen(state), MSG_NOSIGNAL | MSG_DONTWAIT,
		           (struct sockaddr *)&sa, salen);
	} while (n < 0 && errno == EINTR);
	int saved = errno;
	close(fd);
	errno = saved;
	return n < 0 ? FA_ESYS : FA_OK;
}

/* notify_send with printf formatting. */
fa_status notify_sendf(const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	return notify_send(buf);
}
