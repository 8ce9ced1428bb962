/* session.c - the session table, connection sets, region tables, reference counts. */
#include "session.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

/* An empty table with the limits; see session.h. */
void session_table_init(struct session_table *t, unsigned max_sessions, unsigned max_regions,
                        unsigned dedupe_slots)
{
	memset(t, 0, sizeof(*t));
	idmap_init(&t->map);
	t->max_sessions = max_sessions;
	t->max_regions = max_regions;
	t->dedupe_slots = dedupe_slots;
}

/* Close every open session; see session.h. */
void session_table_fini(struct session_table *t, bool unlink)
{
	void *val;

	while (idmap_first(&t->map, NULL, &val))
		session_close(t, val, unlink, "shutdown");
	idmap_fini(&t->map);
}

static void session_release_pipes(struct session *s);

/* A new session for the HELLO's peer, under a fresh random id. */
fa_status session_open(struct session_table *t, const struct ipc_peer *peer, const char *name,
                       struct session **out, char *err, size_t errlen)
{
	struct session *s;
	fa_status st;

	*out = NULL;
	if (session_count(t) >= t->max_sessions)
		return fa_err(err, errlen, FA_ELIMIT,
		              "the daemon has %u open sessions, its limit (--max-sessions)",
		              session_count(t));
	if ((s = calloc(1, sizeof(*s))) == NULL)
		return fa_err(err, errlen, FA_ENOMEM, "out of memory");
	s->uid = peer->uid;
	s->pid = peer->pid;
	s->opened_ms = util_unix_ms();
	snprintf(s->name, sizeof s->name, "%s", name ? name : "");
	s->refs = 1;
	s->open = true;
	s->table = t;
	idmap_init(&s->regions);
	if ((st = dedupe_init(&s->dedupe, t->dedupe_slots)) != FA_OK)
		goto out_free;
	do {
		if ((st = util_random_u64(&s->id)) != FA_OK) {
			fa_err(err, errlen, st, "no randomness for a session id");
			goto out_free;
		}
	} while (session_find(t, s->id) != NULL);
	if ((st = session_attach(s, peer)) != FA_OK ||
	    (st = idmap_put(&t->map, s->id, s)) != FA_OK) {
		fa_err(err, errlen, st, "out of memory");
		goto out_free;
	}
	t->opened_total++;
	log_notice("session %016" PRIx64 ": opened by pid %u uid %u (%s) on connection %u", s->id,
	           s->pid, s->uid, s->name[0] ? s->name : "unnamed", peer->pipe);
	*out = s;
	return FA_OK;

out_free:
	session_release_pipes(s);
	dedupe_fini(&s->dedupe);
	free(s->pipes);
	free(s);
	if (st == FA_ENOMEM)
		fa_err(err, errlen, st, "out of memory");
	return st;
}

/* The open session with this id, or NULL. */
struct session *session_find(const struct session_table *t, uint64_t id)
{
	return idmap_get(&t->map, id);
}

/* Whether the session has been used on this connection. */
bool session_has_pipe(const struct session *s, uint32_t pipe)
{
	for (unsigned i = 0; i < s->npipes; i++)
		if (s->pipes[i] == pipe)
			return true;
	return false;
}

/* Same uid and pid as the HELLO's peer, then remember the connection. */
fa_status session_attach(struct session *s, const struct ipc_peer *peer)
{
	/* Same uid AND pid: another process holding a leaked or guessed id gets "unknown". */
	if (peer->uid != s->uid || peer->pid != s->pid)
		return FA_ESESSION;
	if (session_has_pipe(s, peer->pipe))
		return FA_OK;
	if (s->npipes == s->pipes_cap) {
		unsigned cap = s->pipes_cap ? s->pipes_cap * 2 : 4;
		uint32_t *p = realloc(s->pipes, cap * sizeof(*p));
		if (p == NULL)
			return FA_ENOMEM;
		s->pipes = p;
		s->pipes_cap = cap;
	}
	s->pipes[s->npipes++] = peer->pipe;
	if (s->table != NULL && s->table->on_pipe != NULL)
		s->table->on_pipe(peer->pipe, true, s->table->on_pipe_arg);
	return FA_OK;
}

/* The session lets go of the connections it still lists (those that did not close). */
static void session_release_pipes(struct session *s)
{
	struct session_table *t = s->table;

	for (unsigned i = 0; t != NULL && t->on_pipe != NULL && i < s->npipes; i++)
		t->on_pipe(s->pipes[i], false, t->on_pipe_arg);
	s->npipes = 0;
}

/* Forget a closed connection in every session; close those left with none. */
unsigned session_pipe_closed(struct session_table *t, uint32_t pipe)
{
	struct session **gone = NULL;
	unsigned ngone = 0, cap = 0;
	size_t pos = 0;
	void *val;

	/* A scan of every session: connections close far less often than requests arrive, and
	 * this keeps no pipe -> sessions index to maintain. Close after the walk (closing edits
	 * the map being walked). */
	while (idmap_next(&t->map, &pos, NULL, &val)) {
		struct session *s = val;
		for (unsigned i = 0; i < s->npipes; i++) {
			if (s->pipes[i] != pipe)
				continue;
			s->pipes[i] = s->pipes[--s->npipes];
			if (s->npipes == 0) {
				if (ngone == cap) {
					unsigned ncap = cap ? cap * 2 : 4;
					struct session **g = realloc(gone, ncap * sizeof(*g));
					if (g == NULL)
						break; /* stays open until the table closes */
					gone = g;
					cap = ncap;
				}
				gone[ngone++] = s;
			}
			break;
		}
	}
	for (unsigned i = 0; i < ngone; i++)
		session_close(t, gone[i], true, "connection closed");
	free(gone);
	return ngone;
}

/* Close an open session; see session.h. */
void session_close(struct session_table *t, struct session *s, bool unlink, const char *why)
{
	void *val;

	if (!s->open)
		return;
	s->open = false;
	idmap_del(&t->map, s->id);
	log_notice("session %016" PRIx64 ": closed (%s) after %" PRIu64 " requests, %zu regions, "
	           "%u in flight",
	           s->id, why, s->requests, idmap_len(&s->regions), s->inflight);
	if (t->on_close != NULL)
		t->on_close(s, t->on_close_arg);
	session_release_pipes(s);
	while (idmap_first(&s->regions, NULL, &val)) {
		struct region *r = val;
		idmap_del(&s->regions, r->id);
		s->regions_gen++;
		r->unlink = unlink;
		region_unref(r);
	}
	idmap_fini(&s->regions);
	session_unref(s);
}

/* One more holder (a request in flight). */
void session_ref(struct session *s)
{
	s->refs++;
}

/* One holder less; the last frees the session. */
void session_unref(struct session *s)
{
	if (--s->refs > 0)
		return;
	if (s->table != NULL && s->table->on_free != NULL)
		s->table->on_free(s, s->table->on_free_arg);
	dedupe_fini(&s->dedupe);
	idmap_fini(&s->regions);
	free(s->validate_memo);
	free(s->pipes);
	free(s);
}

/* Give a region a fresh random id in this session, within the limit. */
fa_status session_region_add(struct session *s, struct region *r, char *err, size_t errlen)
{
	fa_status st;

	if (idmap_len(&s->regions) >= s->table->max_regions)
		return fa_err(err, errlen, FA_ELIMIT,
		              "the session has %zu regions, its limit (--max-regions)",
		              idmap_len(&s->regions));
	do {
		if ((st = util_random_u64(&r->id)) != FA_OK)
			return fa_err(err, errlen, st, "no randomness for a region id");
	} while (idmap_get(&s->regions, r->id) != NULL);
	if ((st = idmap_put(&s->regions, r->id, r)) != FA_OK)
		return fa_err(err, errlen, st, "out of memory");
	s->regions_gen++;
	return FA_OK;
}

/* The region of this session with this id, or NULL. */
struct region *session_region_find(const struct session *s, uint64_t id)
{
	return idmap_get(&s->regions, id);
}

/* Unregister a region; the client keeps (and unlinks) its object. */
fa_status session_region_remove(struct session *s, uint64_t id)
{
	struct region *r = idmap_del(&s->regions, id);

	if (r == NULL)
		return FA_EREGION;
	s->regions_gen++;
	r->unlink = false;
	region_unref(r);
	return FA_OK;
}
