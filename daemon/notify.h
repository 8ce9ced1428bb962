/* notify.h - the systemd readiness protocol, by hand (no libsystemd): one datagram to the socket
 * named by $NOTIFY_SOCKET ("/path", or "@name" for an abstract socket).
 *
 * The daemon sends "READY=1" once its socket is bound, "STOPPING=1" when it starts shutting down
 * and "STATUS=..." lines a human reads in `systemctl status`. Tests listen on their own
 * NOTIFY_SOCKET to know when the daemon is ready, without sleeping.
 */
#ifndef FA_DAEMON_NOTIFY_H
#define FA_DAEMON_NOTIFY_H

#include "fa_types.h"

/* Send `state` (newline-separated assignments). FA_OK also when $NOTIFY_SOCKET is unset (not
 * under systemd: nothing to do); FA_EINVAL when it is malformed or too long; FA_ESYS when the
 * datagram could not be sent (errno set). */
fa_status notify_send(const char *state);

/* printf-style notify_send. */
fa_status notify_sendf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* FA_DAEMON_NOTIFY_H */
