/* idmap.c - open addressing, linear probing, backward-shift deletion, load factor <= 1/2. */
#include "idmap.h"

#include <stdlib.h>

#define IDMAP_MIN_CAP 16

/* Fibonacci hashing: session and region ids are random already, but the transport's connection
 * ids count up one by one (ipc.c), and this spreads those too. */
static size_t idmap_slot(const struct idmap *m, uint64_t key)
{
	return (size_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & (m->cap - 1);
}

/* An empty map; see idmap.h. */
void idmap_init(struct idmap *m)
{
	m->keys = NULL;
	m->vals = NULL;
	m->cap = 0;
	m->len = 0;
}

/* Free the arrays; the map is empty and reusable. */
void idmap_fini(struct idmap *m)
{
	free(m->keys);
	free(m->vals);
	idmap_init(m);
}

/* Probe from the home slot until the key or an empty slot. */
void *idmap_get(const struct idmap *m, uint64_t key)
{
	if (m->cap == 0 || key == 0)
		return NULL;
	for (size_t i = idmap_slot(m, key);; i = (i + 1) & (m->cap - 1)) {
		if (m->keys[i] == key)
			return m->vals[i];
		if (m->keys[i] == 0)
			return NULL;
	}
}

/* Place an entry known to be absent into a table with room. */
static void idmap_place(uint64_t *keys, void **vals, size_t cap, size_t slot, uint64_t key,
                        void *val)
{
	size_t i = slot;

	while (keys[i] != 0)
		i = (i + 1) & (cap - 1);
	keys[i] = key;
	vals[i] = val;
}

/* Double the capacity (16 at first) and re-place every entry. */
static fa_status idmap_grow(struct idmap *m)
{
	size_t cap = m->cap ? m->cap * 2 : IDMAP_MIN_CAP;
	uint64_t *keys = calloc(cap, sizeof(*keys));
	void **vals = calloc(cap, sizeof(*vals));

	if (keys == NULL || vals == NULL) {
		free(keys);
		free(vals);
		return FA_ENOMEM;
	}
	struct idmap next = {keys, vals, cap, m->len};
	for (size_t i = 0; i < m->cap; i++)
		if (m->keys[i] != 0)
			idmap_place(keys, vals, cap, idmap_slot(&next, m->keys[i]), m->keys[i],
			            m->vals[i]);
	free(m->keys);
	free(m->vals);
	*m = next;
	return FA_OK;
}

/* Replace in place, or insert after growing past half full. */
fa_status idmap_put(struct idmap *m, uint64_t key, void *val)
{
	if (key == 0 || val == NULL)
		return FA_EINVAL;
	if (m->cap != 0) {
		for (size_t i = idmap_slot(m, key); m->keys[i] != 0; i = (i + 1) & (m->cap - 1)) {
			if (m->keys[i] == key) {
				m->vals[i] = val;
				return FA_OK;
			}
		}
	}
	if ((m->len + 1) * 2 > m->cap) {
		fa_status st = idmap_grow(m);
		if (st != FA_OK)
			return st;
	}
	idmap_place(m->keys, m->vals, m->cap, idmap_slot(m, key), key, val);
	m->len++;
	return FA_OK;
}

/* Remove a key, closing the gap behind it. */
void *idmap_del(struct idmap *m, uint64_t key)
{
	size_t i, j;
	void *val;

	if (m->cap == 0 || key == 0)
		return NULL;
	for (i = idmap_slot(m, key); m->keys[i] != key; i = (i + 1) & (m->cap - 1))
		if (m->keys[i] == 0)
			return NULL;
	val = m->vals[i];
	/* Shift later members of the probe run back over the hole, so lookups never need
	 * tombstones: an entry moves to the hole when its home slot is not inside (i, j]. */
	for (j = (i + 1) & (m->cap - 1); m->keys[j] != 0; j = (j + 1) & (m->cap - 1)) {
		size_t home = idmap_slot(m, m->keys[j]);
		bool home_in_gap = i <= j ? (home > i && home <= j) : (home > i || home <= j);
		if (!home_in_gap) {
			m->keys[i] = m->keys[j];
			m->vals[i] = m->vals[j];
			i = j;
		}
	}
	m->keys[i] = 0;
	m->vals[i] = NULL;
	m->len--;
	return val;
}

/* The next occupied slot at or after *pos. */
bool idmap_next(const struct idmap *m, size_t *pos, uint64_t *key, void **val)
{
	for (; *pos < m->cap; (*pos)++) {
		if (m->keys[*pos] != 0) {
			if (key != NULL)
				*key = m->keys[*pos];
			if (val != NULL)
				*val = m->vals[*pos];
			(*pos)++;
			return true;
		}
	}
	return false;
}

/* Any entry, for emptying a map one by one. */
bool idmap_first(const struct idmap *m, uint64_t *key, void **val)
{
	size_t pos = 0;

	return m->len > 0 && idmap_next(m, &pos, key, val);
}
