/* session.h - sessions: one per client process (per fa_client), opened by HELLO.
 *
 * A session has a random 64-bit id, is bound to the peer uid and pid of the connection that said
 * HELLO, and may be used from any other connection of that same process (the client library
 * keeps one socket per in-flight call). It remembers the connections ("pipes") it has been used
 * on; it ends on BYE or when the last of them closes. It owns its regions and its dedupe ring.
 *
 * Reference counts: the table holds one reference while the session is open; each request in
 * flight holds one, so a session closed under running requests is freed only when they finish
 * (their replies still go through its dedupe ring, then to a connection that may be gone).
 * Loop thread only.
 */
#ifndef FA_DAEMON_SESSION_H
#define FA_DAEMON_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "dedupe.h"
#include "fa_proto.h"
#include "idmap.h"
#include "ipc.h"
#include "region.h"

struct session_table;

struct session {
	uint64_t id;
	uint32_t uid, pid;             /* the peer that opened it */
	char name[FA_PROTO_NAME_MAX];  /* program name the client gave, for logs */
	unsigned refs;
	bool open;                     /* false once closed; freed when refs reach 0 */
	uint32_t *pipes;               /* connections used by this session */
	unsigned npipes, pipes_cap;
	struct idmap regions;          /* region id -> struct region* */
	uint64_t regions_gen;          /* bumped whenever regions changes (validate's memo) */
	void *validate_memo;           /* validate_attn_fwd_memo's (validate.c), malloc'd, or NULL */
	unsigned inflight;             /* ATTN_FWD requests accepted, not yet answered */
	struct dedupe dedupe;
	uint64_t requests;             /* requests served, for the closing log line */
	uint32_t pid_claimed;          /* the pid HELLO claimed (CLIENTS lists it beside pid) */
	uint64_t opened_ms;            /* when it opened, Unix time in ms (CLIENTS) */
	bool warned;                   /* a client error was logged at warning already */
	void *backend_state;           /* the backend's (async streams and events), or NULL */
	struct session_table *table;
};

typedef void (*session_close_fn)(struct session *s, void *arg);
/* A session started using connection `pipe` (used), or an open session that used it closed
 * (!used; not called for the connection's own close). Once per session and connection each. */
typedef void (*session_pipe_fn)(uint32_t pipe, bool used, void *arg);

struct session_table {
	struct idmap map;              /* session id -> struct session* (open sessions only) */
	unsigned max_sessions;
	unsigned max_regions;          /* per session */
	unsigned dedupe_slots;         /* ring entries per session */
	uint64_t opened_total;
	session_close_fn on_close;     /* called as a session closes, before its regions go */
	void *on_close_arg;
	session_close_fn on_free;      /* called when a session's last reference goes */
	void *on_free_arg;
	session_pipe_fn on_pipe;       /* connections taken up and let go (may be NULL) */
	void *on_pipe_arg;
};

/* An empty table. dedupe_slots must exceed the per-session in-flight limit. */
void session_table_init(struct session_table *t, unsigned max_sessions, unsigned max_regions,
                        unsigned dedupe_slots);

/* Close every open session (regions unlinked or not, per `unlink`) and free the table's memory.
 * Sessions still referenced by requests are freed when those finish. */
void session_table_fini(struct session_table *t, bool unlink);

/* Open a session for the peer of a HELLO. Returns FA_OK, FA_ELIMIT (--max-sessions reached),
 * FA_ENOMEM or FA_ESYS (no randomness); err says why. */
fa_status session_open(struct session_table *t, const struct ipc_peer *peer, const char *name,
                       struct session **out, char *err, size_t errlen);

/* The open session with this id, or NULL. */
struct session *session_find(const struct session_table *t, uint64_t id);

/* A request on this session arrived from `peer`: check it is the same process (uid and pid) and
 * remember its connection. Returns FA_OK, FA_ESESSION (another process: as if unknown) or
 * FA_ENOMEM. */
fa_status session_attach(struct session *s, const struct ipc_peer *peer);

/* Does the session use this connection? */
bool session_has_pipe(const struct session *s, uint32_t pipe);

/* A connection closed: forget it in every session that used it, and close the sessions that have
 * no connection left (their regions unlinked). Returns how many sessions closed. */
unsigned session_pipe_closed(struct session_table *t, uint32_t pipe);

/* Close an open session: out of the table at once (its id becomes unknown), queued work
 * cancelled through on_close, regions released (unlinked when `unlink`), the table's
 * reference dropped. `why` is for the log ("bye", "connection closed", "shutdown"). */
void session_close(struct session_table *t, struct session *s, bool unlink, const char *why);

void session_ref(struct session *s);
void session_unref(struct session *s);

/* Add a mapped region (the table takes the caller's reference) under a new random id, written to
 * r->id. Returns FA_OK, FA_ELIMIT (--max-regions) or FA_ENOMEM/FA_ESYS; on failure the caller
 * still owns r. */
fa_status session_region_add(struct session *s, struct region *r, char *err, size_t errlen);

/* The region with this id in this session, or NULL. */
struct region *session_region_find(const struct session *s, uint64_t id);

/* Unregister: forget the id and drop the table's reference (the object is not unlinked: the
 * client unlinks its own). Returns FA_OK or FA_EREGION. */
fa_status session_region_remove(struct session *s, uint64_t id);

static inline unsigned session_count(const struct session_table *t)
{
	return (unsigned)idmap_len(&t->map);
}

#endif /* FA_DAEMON_SESSION_H */
