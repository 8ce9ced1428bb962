/* clients.h - the CLIENTS reply (fa-ctl clients): one entry per open session, in increasing id
 * order, as redis's CLIENT LIST and MPS's get_client_list.
 *
 * Who sees what: a session of root or of the daemon's own uid sees every session (the operator);
 * any other sees only the sessions of its own uid. Redis keeps CLIENT LIST for its
 * administrators; here a user may still see their own processes, which helps them and tells
 * them nothing new, but never another user's pids, commands or buffer sizes. Loop thread only.
 */
#ifndef FA_DAEMON_CLIENTS_H
#define FA_DAEMON_CLIENTS_H

#include <stdbool.h>
#include <stdint.h>

#include "fa_proto.h"
#include "session.h"

/* May a peer of this uid see every session? (root or the daemon's own uid) */
bool clients_sees_all(uint32_t uid);

/* Fill rep->u.clients with the sessions `viewer` may see whose id is above `after`: at most
 * FA_PROTO_CLIENTS_MAX, the smallest ids first (a full reply means "ask again after the last").
 * Returns FA_OK or FA_ENOMEM (err says why). */
fa_status clients_list(const struct session_table *t, uint32_t viewer_uid, uint64_t after,
                       struct fa_proto_rep *rep, char *err, size_t errlen);

#endif /* FA_DAEMON_CLIENTS_H */
