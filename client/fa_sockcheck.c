/* fa_sockcheck.c - can this process reach a daemon at a socket path? Answers a user can act on,
 * at once, before nanomsg (which connects asynchronously: a missing, stale or forbidden socket
 * would only show as a reply that never comes).
 *
 * - missing: FA_EUNAVAIL; when the path is the per-user default and the system daemon's socket
 *   exists, the detail says to set FA_SOCKET to it;
 * - no permission (the socket file, or a directory on the way): FA_EPERM naming the group, by
 *   name, whose members may connect ("add yourself to group fa");
 * - stale (the file is there, nobody listens: a daemon that was killed): FA_EUNAVAIL at once,
 *   from one probe connect, instead of after the connect timeout.
 *
 * Whether somebody listens is read from /proc/net/unix first (no connection to a live daemon, so
 * its connection caps and counters see nothing); only a path the table does not list gets a
 * plain AF_UNIX connect, closed at once, which a live daemon sees as a connection closed before
 * its handshake (as its own start-up probe does to another daemon). Layer: with fa_util.c (calls
 * only it).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fa_client_int.h"

/* The name of group gid ("fa"), or its number when it has no name here. */
static void group_name(gid_t gid, char *out, size_t cap)
{
	char buf[4096];
	struct group gr, *res = NULL;

	if (getgrgid_r(gid, &gr, buf, sizeof buf, &res) == 0 && res != NULL)
		snprintf(out, cap, "%s", res->gr_name);
	else
		snprintf(out, cap, "%u", (unsigned)gid);
}

/* The detail for a path we may not use: the group that may, by name. */
static fa_status no_permission(const char *path, const char *what, const struct stat *sb)
{
	char grp[64];

	group_name(sb->st_gid, grp, sizeof grp);
	return fa__fail(FA_EPERM,
	                "no permission to connect to %s: %s is open to group %s only; add yourself "
	                "to group %s (usermod -aG %s $USER, then log in again) or ask the operator",
	                path, what, grp, grp, grp);
}

/* stat failed with EACCES: find the directory on the way that we may not search. */
static fa_status dir_forbidden(const char *path)
{
	char dir[FA_SOCK_PATH_MAX];
	struct stat sb;

	snprintf(dir, sizeof dir, "%s", path);
	for (char *slash = strrchr(dir, '/'); slash != NULL && slash != dir;
	     slash = strrchr(dir, '/')) {
		*slash = '\0';
		if (stat(dir, &sb) == 0 && faccessat(AT_FDCWD, dir, X_OK, AT_EACCESS) != 0 &&
		    errno == EACCES) {
			char what[FA_SOCK_PATH_MAX + 16];
			snprintf(what, sizeof what, "its directory %s", dir);
			return no_permission(path, what, &sb);
		}
	}
	return fa__fail(FA_EPERM, "no permission to reach %s: %s", path, strerror(EACCES));
}

/* Does this network namespace's socket table (/proc/net/unix) list a listening socket bound at
 * path? Reads the table only: no connection reaches the daemon. */
static bool listed_listening(const char *path)
{
	FILE *f = fopen("/proc/net/unix", "re");
	char line[4096 + 128];
	bool found = false;

	if (f == NULL)
		return false;
	while (!found && fgets(line, sizeof line, f) != NULL) {
		/* Num RefCount Protocol Flags Type St Inode Path */
		unsigned long flags;
		char p[4096];
		if (sscanf(line, "%*s %*s %*s %lx %*s %*s %*s %4095s", &flags, p) == 2 &&
		    (flags & 0x10000ul) != 0 && strcmp(p, path) == 0) /* __SO_ACCEPTCON */
			found = true;
	}
	fclose(f);
	return found;
}

/* Is anybody listening on the socket at path? false only for a refused connect (stale file).
 * The socket table answers first; only when it does not list the path (another network
 * namespace: a container's client of the host's daemon, or a path spelled differently) does one
 * probe connect decide, which a live daemon sees as a connection closed before its handshake. */
static bool someone_listens(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	bool live = true;

	if (listed_listening(path))
		return true;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return true; /* cannot tell: let the HELLO decide */
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	if (connect(fd, (const struct sockaddr *)&sa, sizeof sa) != 0 && errno == ECONNREFUSED)
		live = false; /* EAGAIN (a full backlog) or EACCES are not stale */
	close(fd);
	return live;
}

/* See fa_client_int.h. */
fa_status fa__socket_check(const char *path, bool user_default, bool probe)
{
	struct stat sb;

	if (stat(path, &sb) != 0) {
		int e = errno;
		if (e == EACCES)
			return dir_forbidden(path);
		if (e != ENOENT && e != ENOTDIR)
			return fa__fail(FA_EUNAVAIL, "cannot reach %s: %s", path, strerror(e));
		/* The system path is fixed; the tests move it (they may not create /run/fa-daemon). */
		const char *sys = getenv("FA_TEST_SYSTEM_SOCKET");
		if (sys == NULL || sys[0] == '\0')
			sys = FA_SYSTEM_SOCKET;
		if (user_default && strcmp(path, sys) != 0 && stat(sys, &sb) == 0 &&
		    S_ISSOCK(sb.st_mode))
			return fa__fail(FA_EUNAVAIL,
			                "no daemon socket at %s (the per-user default, from "
			                "XDG_RUNTIME_DIR), but the system daemon's socket %s exists: "
			                "set FA_SOCKET=%s to use it",
			                path, sys, sys);
		return fa__fail(FA_EUNAVAIL, "no daemon socket at %s; is fa-daemon running?", path);
	}
	if (!S_ISSOCK(sb.st_mode))
		return fa__fail(FA_EUNAVAIL, "%s is not a socket", path);
	/* connect() on a Unix socket needs write permission on its file. */
	if (faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) != 0 && errno == EACCES)
		return no_permission(path, "the socket", &sb);
	if (probe && !someone_listens(path))
		return fa__fail(FA_EUNAVAIL,
		                "%s exists but no daemon is listening on it (a daemon that was killed "
		                "left it behind); start fa-daemon, which replaces it",
		                path);
	return FA_OK;
}
