/* fa_raw_ring.h - a submission ring (proto/fa_ring.h) made by hand on a raw session
 * (fa_raw.h): the shm object named as the client library names rings, RING_OPEN, entries pushed
 * and completions popped without libfaclient. For the tests that must put bytes in a ring the
 * client library would never write. Header-only; include it after <cmocka.h> (its steps assert).
 */
#ifndef FA_RAW_RING_H
#define FA_RAW_RING_H

#include <linux/futex.h>
#include <sys/syscall.h>

#include "fa_raw.h"
#include "fa_ring.h"

/* fa_raw_shm_create under a ring's name, FA_RING_BYTES long. 0 or -1. */
static inline int fa_raw_ring_shm_create(struct fa_raw_shm *m, uint64_t *rng)
{
	memset(m, 0, sizeof *m);
	snprintf(m->name, sizeof m->name, FA_RING_NAME_PREFIX "%u.%d.%016llx", (unsigned)getuid(),
	         (int)getpid(), (unsigned long long)fa_rand_next(rng));
	m->fd = shm_open(m->name, O_RDWR | O_CREAT | O_EXCL, 0660);
	if (m->fd < 0 || ftruncate(m->fd, FA_RING_BYTES) != 0)
		return -1;
	m->map = mmap(NULL, FA_RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	if (m->map == MAP_FAILED) {
		m->map = NULL;
		return -1;
	}
	m->size = FA_RING_BYTES;
	return 0;
}

/* A ring made by hand, opened by RING_OPEN on a raw session. */
struct fa_raw_ring {
	int s;
	uint64_t sid, seq, id;
	struct fa_raw_shm m;
	struct fa_ring_hdr *h;
	uint32_t tail, cq_head;
};

/* A raw session to url and a ring on it; RING_OPEN must answer `want` (id: the ring's region
 * on FA_OK). */
static inline void fa_raw_ring_open(struct fa_raw_ring *r, const char *url, uint64_t *rng,
                                    int want)
{
	struct fa_proto_rep rep;
	struct fa_proto_req req;

	memset(r, 0, sizeof *r);
	r->s = fa_raw_open(url, fa_test_ms(5000));
	assert_true(r->s >= 0);
	r->sid = fa_raw_hello(r->s, ++r->seq, &rep);
	assert_true(r->sid != 0);
	assert_int_equal(fa_raw_ring_shm_create(&r->m, rng), 0);
	r->h = r->m.map;
	r->h->magic = FA_RING_MAGIC;
	r->h->layout = FA_RING_LAYOUT;
	r->h->entries = FA_RING_ENTRIES;
	r->h->entry_bytes = FA_RING_ENTRY_BYTES;
	memset(&req, 0, sizeof req);
	req.op = FA_OP_RING_OPEN;
	req.session = r->sid;
	req.seq = ++r->seq;
	req.u.reg.size = FA_RING_BYTES;
	snprintf(req.u.reg.shm_name, sizeof req.u.reg.shm_name, "%s", r->m.name);
	int st = fa_raw_call(r->s, &req, &rep);
	if (st != want)
		printf("  RING_OPEN: %s: %s\n", fa_status_name((fa_status)st), rep.detail);
	assert_int_equal(st, want);
	r->id = st == FA_OK ? rep.u.reg.region : 0;
}

/* BYE, the socket closed, the object unlinked. */
static inline void fa_raw_ring_close(struct fa_raw_ring *r)
{
	struct fa_proto_rep rep;

	fa_raw_simple(r->s, FA_OP_BYE, r->sid, ++r->seq, &rep);
	nn_close(r->s);
	fa_raw_shm_destroy(&r->m);
}

/* Put `len` bytes in the next entry with tag, publish, wake the daemon's thread. */
static inline void fa_raw_ring_push(struct fa_raw_ring *r, const void *msg, uint32_t len,
                                    uint32_t tag)
{
	struct fa_ring_sqe *e = fa_ring_sqe_at(r->h, r->tail);
	e->len = len;
	e->tag = tag;
	memcpy(e->msg, msg, len < FA_RING_MSG_MAX ? len : FA_RING_MSG_MAX);
	__atomic_store_n(&r->h->sq_tail, ++r->tail, __ATOMIC_SEQ_CST);
	syscall(SYS_futex, &r->h->sq_tail, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* req encoded into the next entry. */
static inline void fa_raw_ring_push_req(struct fa_raw_ring *r, const struct fa_proto_req *req,
                                        uint32_t tag)
{
	unsigned char buf[FA_RING_MSG_MAX];
	size_t len;
	assert_int_equal(fa_proto_encode_req(req, buf, sizeof buf, &len), FA_OK);
	fa_raw_ring_push(r, buf, (uint32_t)len, tag);
}

/* The next completion within 5 s: its status (decoded), its tag in *tag; -1 when none came. */
static inline int fa_raw_ring_pop(struct fa_raw_ring *r, uint32_t *tag, struct fa_proto_rep *rep)
{
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(5000);
	while (__atomic_load_n(&r->h->cq_tail, __ATOMIC_SEQ_CST) == r->cq_head) {
		if (fa_test_now_ms() >= deadline)
			return -1;
		fa_test_sleep_ms(1);
	}
	const struct fa_ring_cqe *e = fa_ring_cqe_at(r->h, r->cq_head++);
	char err[256];
	*tag = e->tag;
	assert_true(e->len > 0 && e->len <= FA_RING_MSG_MAX);
	assert_int_equal(fa_proto_decode_rep(e->msg, e->len, rep, err, sizeof err), FA_OK);
	return rep->status;
}

#endif /* FA_RAW_RING_H */
