/* clients.c - the CLIENTS reply; see clients.h. */
#include "clients.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "region.h"
#include "util.h"

bool clients_sees_all(uint32_t uid)
{
	return uid == 0 || uid == (uint32_t)geteuid();
}

static int clients_by_id(const void *a, const void *b)
{
	uint64_t x = (*(const struct session *const *)a)->id;
	uint64_t y = (*(const struct session *const *)b)->id;
	return x < y ? -1 : x > y;
}

/* A session's command: the name HELLO gave, else the kernel's for its pid (the pid from
 * SO_PEERCRED, in the daemon's pid namespace), else "". */
static void clients_command(const struct session *s, char out[FA_PROTO_NAME_MAX])
{
	char path[64];
	size_t n = 0;

	if (s->name[0] != '\0') {
		snprintf(out, FA_PROTO_NAME_MAX, "%s", s->name);
		return;
	}
	snprintf(path, sizeof path, "/proc/%u/comm", s->pid);
	FILE *f = fopen(path, "re");
	if (f != NULL) {
		n = fread(out, 1, FA_PROTO_NAME_MAX - 1, f);
		fclose(f);
	}
	out[n] = '\0';
	out[strcspn(out, "\n")] = '\0';
}

fa_status clients_list(const struct session_table *t, uint32_t viewer_uid, uint64_t after,
                       struct fa_proto_rep *rep, char *err, size_t errlen)
{
	bool all = clients_sees_all(viewer_uid);
	size_t cap = idmap_len(&t->map), n = 0, pos = 0;
	struct session **v = NULL;
	uint64_t key;
	void *val;

	rep->u.clients.n = 0;
	if (cap == 0)
		return FA_OK;
	if ((v = malloc(cap * sizeof *v)) == NULL)
		return fa_err(err, errlen, FA_ENOMEM, "out of memory listing %zu sessions", cap);
	while (idmap_next(&t->map, &pos, &key, &val)) {
		struct session *s = val;
		if (s->id > after && (all || s->uid == viewer_uid) && n < cap)
			v[n++] = s;
	}
	qsort(v, n, sizeof *v, clients_by_id);
	if (n > FA_PROTO_CLIENTS_MAX)
		n = FA_PROTO_CLIENTS_MAX;
	for (size_t i = 0; i < n; i++) {
		const struct session *s = v[i];
		struct fa_proto_client *c = &rep->u.clients.c[i];
		size_t rpos = 0;
		uint64_t rid;
		void *r;

		memset(c, 0, sizeof *c);
		c->session = s->id;
		c->pid = s->pid;
		c->pid_claimed = s->pid_claimed;
		c->uid = s->uid;
		clients_command(s, c->cmd);
		while (idmap_next(&s->regions, &rpos, &rid, &r)) {
			c->regions++;
			c->bytes += ((const struct region *)r)->size;
		}
		c->inflight = s->inflight;
		c->done = s->requests;
		c->since_ms = s->opened_ms;
	}
	rep->u.clients.n = (uint32_t)n;
	free(v);
	return FA_OK;
}
