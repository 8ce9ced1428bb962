/* idmap.h - a hash map from nonzero 64-bit ids to pointers (sessions, regions, pipes).
 *
 * Open addressing with linear probing and backward-shift deletion: no tombstones, so a map that
 * sees millions of insert/delete pairs (sessions coming and going) never degrades. Key 0 is
 * reserved for "empty slot"; every id in the daemon is nonzero. Not thread-safe: the loop thread
 * owns every map.
 */
#ifndef FA_DAEMON_IDMAP_H
#define FA_DAEMON_IDMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_types.h"

struct idmap {
	uint64_t *keys; /* 0 = empty */
	void **vals;
	size_t cap;     /* power of two, or 0 before the first insert */
	size_t len;
};

/* An empty map (allocates nothing until the first insert). */
void idmap_init(struct idmap *m);

/* Free the map's own memory (not the values). The map is empty and reusable afterwards. */
void idmap_fini(struct idmap *m);

/* The value of key, or NULL. */
void *idmap_get(const struct idmap *m, uint64_t key);

/* Insert or replace. Returns FA_OK, FA_EINVAL (key 0 or val NULL) or FA_ENOMEM. */
fa_status idmap_put(struct idmap *m, uint64_t key, void *val);

/* Remove key; returns its value, or NULL when absent. */
void *idmap_del(struct idmap *m, uint64_t key);

/* Iterate: start with *pos = 0; each call returns true and sets *key / *val (either may be NULL)
 * until the end. Deleting the entry just returned may make the walk skip or repeat one entry; to
 * empty a map, take idmap_first in a loop instead. */
bool idmap_next(const struct idmap *m, size_t *pos, uint64_t *key, void **val);

/* Any one entry (false when empty). */
bool idmap_first(const struct idmap *m, uint64_t *key, void **val);

static inline size_t idmap_len(const struct idmap *m)
{
	return m->len;
}

#endif /* FA_DAEMON_IDMAP_H */
