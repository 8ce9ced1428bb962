/* fa_ring.c - the client's side of the session's submission ring (proto/fa_ring.h): calls
 * without a socket round trip.
 *
 * A call encodes its request straight into the next submission entry, publishes it with one
 * store of sq_tail and makes a FUTEX_WAKE only when the daemon's ring thread says it sleeps.
 * A synchronous call then waits for its completion: it polls cq_tail for spin_us, then one
 * waiting thread sleeps on the cq_tail futex (client_sleeping set, so the daemon knows to wake
 * it) and the others on a condition variable. An asynchronous call returns once its entry is
 * published; its completion (posted when its kernel finished) is read by whichever call next
 * looks at the ring, and a failure is kept as the client's sticky error (fa_client.h).
 *
 * Flow control: at most FA_RING_ENTRIES calls between publishing and reading the completion, so
 * a submission entry is never rewritten before the daemon copied it and a completion entry
 * never before this side read it. Layer: above fa_transport.c and fa_util.c, below fa_call.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fa_client_int.h"
#include "fa_ring.h"
#include "fa_proto_memo.h"

#define RING_POLL_MS 100 /* a sleeping waiter looks at the daemon's socket this often */
/* How long a waiter polls after the daemon woke it before its completion came (its prewake,
 * sent about --prewake-us before the job's expected end; the estimate is the shape's last GPU
 * time, within 1-2% of a kernel's): long enough for a late estimate of a ~50 ms prefill, and
 * only after such a wake (FA_RING_SPIN_US 0 turns it off with the rest of the polling). */
#define RING_WOKEN_SPIN_NS 1000000ull

struct fa_ring_wait {
	bool used, done, abandoned, async;
	uint32_t len;
	struct fa_tslot *slot;              /* async: the socket slot whose id is the words slot */
	fa_ring_lost_fn lost;               /* async: how to release the done word on a failure */
	void *lost_arg;
	int lost_slot;
	uint64_t lost_seq;
	uint8_t msg[FA_RING_MSG_MAX];
};

struct fa_ring {
	char name[FA_PROTO_SHM_NAME_MAX];
	char path[FA_SOCK_PATH_MAX];        /* the daemon's socket: gone = the daemon stopped */
	struct fa_transport *tr;
	struct fa_ring_hdr *hdr;
	uint64_t id;
	uint64_t spin_ns;
	pthread_mutex_t mu;                 /* everything below */
	pthread_cond_t cv;
	uint32_t sq_tail, cq_head;
	unsigned outstanding;               /* published, completion not read */
	unsigned async_outstanding;
	bool sleeper;                       /* a thread sleeps on the futex */
	bool woken;                         /* the sleeper's: the daemon woke it before its
	                                     * completion (a prewake): poll longer next */
	bool dead;
	fa_status sticky;                   /* the first failed asynchronous call's status */
	char sticky_detail[FA_PROTO_DETAIL_MAX];
	uint64_t calls, wakes;              /* for FA_DEBUG */
	struct fa_proto_req_memo enc;       /* the last request encoded (a repeat: its bytes) */
	struct fa_ring_wait w[FA_RING_ENTRIES];
};

static long futex(uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
	return syscall(SYS_futex, word, op, val, ts, NULL, 0);
}

static uint32_t ld(const uint32_t *w)
{
	return __atomic_load_n(w, __ATOMIC_SEQ_CST);
}

static void st32(uint32_t *w, uint32_t v)
{
	__atomic_store_n(w, v, __ATOMIC_SEQ_CST);
}

/* ---- the mapping ------------------------------------------------------------------------------ */

fa_status fa__ring_create(struct fa_ring **out, const char *path, struct fa_transport *tr,
                          bool set_gid, gid_t gid)
{
	struct fa_ring *r;
	pthread_condattr_t ca;
	int fd = -1;

	*out = NULL;
	if ((r = calloc(1, sizeof *r)) == NULL)
		return fa__fail(FA_ENOMEM, "no memory for the submission ring");
	snprintf(r->path, sizeof r->path, "%s", path);
	r->tr = tr;
	const char *e = getenv("FA_RING_SPIN_US");
	/* Poll before sleeping (a tiny request's whole round trip, about 60 us on the H200 host)
	 * only where a core is likely free for the daemon meanwhile: on 2 busy cores polling for
	 * 50 us tripled a PING (measured; daemon/RESULTS.md). FA_RING_SPIN_US overrides. */
	unsigned long spin = sysconf(_SC_NPROCESSORS_ONLN) >= 4 ? 100 : 0;
	if (e != NULL && e[0] != '\0')
		spin = strtoul(e, NULL, 10);
	r->spin_ns = (uint64_t)(spin > 100000 ? 100000 : spin) * 1000u;
	for (int i = 0; i < 8 && fd < 0; i++) {
		uint64_t rnd;
		if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
			break;
		snprintf(r->name, sizeof r->name, FA_RING_NAME_PREFIX "%u.%d.%016" PRIx64,
		         (unsigned)geteuid(), (int)getpid(), rnd);
		fd = shm_open(r->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0660);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0) {
		free(r);
		return fa__fail(FA_ESYS, "shm_open for the ring: %s", strerror(errno));
	}
	/* The daemon maps it through the group bits when it runs as another user (fa_shm.c). */
	if (set_gid && fchown(fd, (uid_t)-1, gid) != 0)
		fa__debug("fa: ring %s: cannot give it group %u: %s", r->name, (unsigned)gid,
		          strerror(errno));
	void *base = MAP_FAILED;
	if (fchmod(fd, 0660) == 0 && ftruncate(fd, FA_RING_BYTES) == 0)
		base = mmap(NULL, FA_RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int err = errno;
	close(fd);
	if (base == MAP_FAILED) {
		shm_unlink(r->name);
		free(r);
		return fa__fail(FA_ESYS, "making the ring's %d bytes: %s", FA_RING_BYTES,
		                strerror(err));
	}
	r->hdr = base;
	r->hdr->magic = FA_RING_MAGIC;
	r->hdr->layout = FA_RING_LAYOUT;
	r->hdr->entries = FA_RING_ENTRIES;
	r->hdr->entry_bytes = FA_RING_ENTRY_BYTES;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (pthread_mutex_init(&r->mu, NULL) != 0 || pthread_cond_init(&r->cv, &ca) != 0) {
		pthread_condattr_destroy(&ca);
		munmap(base, FA_RING_BYTES);
		shm_unlink(r->name);
		free(r);
		return fa__fail(FA_ESYS, "pthread mutex or condition init failed");
	}
	pthread_condattr_destroy(&ca);
	*out = r;
	return FA_OK;
}

const char *fa__ring_name(const struct fa_ring *r)
{
	return r->name;
}

void fa__ring_set_id(struct fa_ring *r, uint64_t id)
{
	r->id = id;
}

/* ---- completions ------------------------------------------------------------------------------ */

/* An asynchronous call's completion (mu held): its slot goes back, a failure becomes sticky and
 * its done word is written here, so no stream waits for it for ever. */
static void ring_async_done(struct fa_ring *r, struct fa_ring_wait *w, fa_status st,
                            const char *detail)
{
	if (st != FA_OK) {
		if (w->lost != NULL)
			w->lost(w->lost_arg, w->lost_slot, w->lost_seq);
		if (r->sticky == FA_OK) {
			r->sticky = st;
			snprintf(r->sticky_detail, sizeof r->sticky_detail, "%s", detail);
		}
	}
	fa_transport_release(r->tr, w->slot);
	w->slot = NULL;
	w->used = false;
	r->async_outstanding--;
}

/* Read every posted completion (mu held). */
static void ring_reap(struct fa_ring *r)
{
	uint32_t tail = ld(&r->hdr->cq_tail);
	bool woke = false;

	while (r->cq_head != tail) {
		const struct fa_ring_cqe *e = fa_ring_cqe_at(r->hdr, r->cq_head);
		uint32_t tag = e->tag, len = e->len;
		r->cq_head++;
		r->outstanding--;
		if (tag >= FA_RING_ENTRIES || !r->w[tag].used || r->w[tag].done)
			continue; /* the daemon's bug; nothing waits for it */
		struct fa_ring_wait *w = &r->w[tag];
		if (len > FA_RING_MSG_MAX)
			len = 0;
		memcpy(w->msg, e->msg, len);
		w->len = len;
		if (w->async) {
			struct fa_proto_rep *rep = fa__rep_get();
			char err[FA_PROTO_DETAIL_MAX] = "";
			fa_status st = FA_EPROTO;
			const char *detail = "the daemon's completion of an asynchronous call did "
			                     "not decode";
			if (rep != NULL && len > 0 &&
			    fa_proto_decode_rep(w->msg, len, rep, err, sizeof err) == FA_OK) {
				st = (fa_status)rep->status;
				detail = rep->detail;
			}
			ring_async_done(r, w, st, detail);
			fa__rep_free(rep);
		} else if (w->abandoned) {
			w->used = false; /* its caller timed out and left */
		} else {
			w->done = true;
			woke = true;
		}
	}
	if (woke)
		pthread_cond_broadcast(&r->cv); /* its caller may wait on cv, not on the futex */
}

/* The daemon stopped serving the ring, or is gone (mu held): every asynchronous call still out
 * is released and failed; synchronous waiters see `dead`. */
static void ring_kill(struct fa_ring *r, fa_status st, const char *why)
{
	if (r->dead)
		return;
	r->dead = true;
	for (int i = 0; i < FA_RING_ENTRIES; i++) {
		struct fa_ring_wait *w = &r->w[i];
		if (w->used && w->async)
			ring_async_done(r, w, st, why);
		else if (w->used && w->abandoned)
			w->used = false;
	}
	fa__debug("fa: ring %016" PRIx64 ": %s", r->id, why);
	pthread_cond_broadcast(&r->cv);
}

static bool ring_daemon_gone(const struct fa_ring *r)
{
	struct stat sb;

	return stat(r->path, &sb) != 0 && (errno == ENOENT || errno == ENOTDIR);
}

/* Wait (mu held) until ready(r, arg), the ring dies or the deadline passes. */
static fa_status ring_wait(struct fa_ring *r, bool (*ready)(struct fa_ring *, int), int arg,
                           int64_t deadline)
{
	for (;;) {
		ring_reap(r);
		if (ready(r, arg))
			return FA_OK;
		uint32_t dead = ld(&r->hdr->dead);
		if (dead != 0)
			ring_kill(r, FA_ECLOSED, dead == FA_RING_DEAD_PROTOCOL
			                             ? "the daemon closed the ring (bad counters)"
			                             : "the daemon closed the ring (session closed)");
		if (r->dead)
			return fa__fail(FA_ECLOSED, "the daemon closed this session's submission ring");
		int64_t now = (int64_t)fa_now_ns();
		if (deadline != 0 && now >= deadline)
			return FA_ETIMEDOUT;
		int64_t until = now + RING_POLL_MS * 1000000LL;
		if (deadline != 0 && deadline < until)
			until = deadline;
		if (r->sleeper) {
			struct timespec ts = {.tv_sec = until / 1000000000, .tv_nsec = until % 1000000000};
			pthread_cond_timedwait(&r->cv, &r->mu, &ts);
			continue;
		}
		uint32_t seen = ld(&r->hdr->cq_tail);
		if (seen != r->cq_head)
			continue;
		r->sleeper = true;
		pthread_mutex_unlock(&r->mu);
		/* After a wake that brought no completion (the daemon's prewake: this call's job
		 * ends within about a prewake window) poll long enough to meet it awake: a
		 * sleeping thread's wake-up took 100-400 us on the H200 host, as long as the whole
		 * window (daemon/RESULTS.md 2026-12-03). */
		uint64_t spin = r->spin_ns;
		if (r->woken && spin > 0 && spin < RING_WOKEN_SPIN_NS)
			spin = RING_WOKEN_SPIN_NS;
		r->woken = false;
		uint64_t spin_end = fa_now_ns() + spin;
		while (ld(&r->hdr->cq_tail) == seen && fa_now_ns() < spin_end)
			;
		if (ld(&r->hdr->cq_tail) == seen) {
			/* Dekker with the daemon's store of cq_tail and load of client_sleeping. */
			st32(&r->hdr->client_sleeping, 1);
			if (ld(&r->hdr->cq_tail) == seen) {
				int64_t left = until - (int64_t)fa_now_ns();
				if (left > 0) {
					struct timespec ts = {left / 1000000000, left % 1000000000};
					/* 0: woken (FUTEX_WAKE), not timed out */
					if (futex(&r->hdr->cq_tail, FUTEX_WAIT, seen, &ts) == 0 &&
					    ld(&r->hdr->cq_tail) == seen)
						r->woken = true;
				}
			}
			st32(&r->hdr->client_sleeping, 0);
		}
		pthread_mutex_lock(&r->mu);
		r->sleeper = false;
		pthread_cond_broadcast(&r->cv);
		if (ld(&r->hdr->cq_tail) == seen && ring_daemon_gone(r))
			ring_kill(r, FA_EUNAVAIL, "the daemon's socket is gone: the daemon stopped");
		if (r->dead)
			return fa__fail(FA_EUNAVAIL, "no daemon socket at %s: the daemon stopped",
			                r->path);
	}
}

static bool ring_has_room(struct fa_ring *r, int arg)
{
	(void)arg;
	return r->outstanding < FA_RING_ENTRIES;
}

static bool ring_done(struct fa_ring *r, int tag)
{
	return r->w[tag].done;
}

static bool ring_async_below(struct fa_ring *r, int cap)
{
	return r->async_outstanding < (unsigned)cap;
}

fa_status fa__ring_async_room(struct fa_ring *r, int64_t deadline)
{
	fa_status st;

	pthread_mutex_lock(&r->mu);
	st = ring_wait(r, ring_async_below, FA_RING_ASYNC_MAX, deadline);
	pthread_mutex_unlock(&r->mu);
	if (st == FA_ECLOSED)
		st = FA_OK; /* dead: the call goes by the socket */
	if (st == FA_ETIMEDOUT)
		return fa__fail(FA_ETIMEDOUT, "%d asynchronous calls still unfinished at the "
		                "timeout", FA_RING_ASYNC_MAX);
	return st;
}

static bool ring_idle(struct fa_ring *r, int arg)
{
	(void)arg;
	return r->async_outstanding == 0;
}

/* ---- calls ------------------------------------------------------------------------------------ */

/* Reserve a waiter and publish req in the next entry (mu held). *taken false: it cannot go by
 * the ring (too large, or the ring is dead) and nothing was published. */
static fa_status ring_publish(struct fa_ring *r, const struct fa_proto_req *req, int64_t deadline,
                              bool *taken, int *tag)
{
	fa_status st;

	*taken = false;
	if (r->dead || ld(&r->hdr->dead) != 0)
		return FA_OK;
	if ((st = ring_wait(r, ring_has_room, 0, deadline)) != FA_OK)
		return st == FA_ECLOSED ? FA_OK : st; /* dead: the caller takes the socket */
	int t = -1;
	for (int i = 0; i < FA_RING_ENTRIES && t < 0; i++)
		if (!r->w[i].used)
			t = i;
	if (t < 0)
		return FA_OK; /* abandoned waiters hold every place: the socket */
	struct fa_ring_sqe *e = fa_ring_sqe_at(r->hdr, r->sq_tail);
	size_t len = 0;
	/* (a repeated call, the same but its seq: the last one's bytes, fa_proto_memo.h) */
	st = fa_proto_encode_req_memo(&r->enc, req, e->msg, FA_RING_MSG_MAX, &len);
	if (st == FA_ETOOBIG)
		return FA_OK;
	if (st != FA_OK)
		return fa__fail(st, "%s request could not be encoded (a field out of range)",
		                fa_proto_op_name(req->op));
	e->len = (uint32_t)len;
	e->tag = (uint32_t)t;
	struct fa_ring_wait *w = &r->w[t];
	memset(w, 0, offsetof(struct fa_ring_wait, msg));
	w->used = true;
	r->outstanding++;
	r->sq_tail++;
	/* Dekker with the ring thread's store of daemon_sleeping and load of sq_tail. */
	st32(&r->hdr->sq_tail, r->sq_tail);
	if (ld(&r->hdr->daemon_sleeping)) {
		futex(&r->hdr->sq_tail, FUTEX_WAKE, 1, NULL);
		r->wakes++;
	}
	r->calls++;
	*taken = true;
	*tag = t;
	return FA_OK;
}

fa_status fa__ring_call(struct fa_ring *r, const struct fa_proto_req *req,
                        struct fa_proto_rep *rep, int64_t deadline, bool *taken)
{
	char err[FA_PROTO_DETAIL_MAX];
	int tag = -1;
	fa_status st;

	pthread_mutex_lock(&r->mu);
	st = ring_publish(r, req, deadline, taken, &tag);
	if (st != FA_OK || !*taken) {
		pthread_mutex_unlock(&r->mu);
		return st;
	}
	st = ring_wait(r, ring_done, tag, deadline);
	struct fa_ring_wait *w = &r->w[tag];
	if (st != FA_OK) {
		if (w->used && !w->done)
			w->abandoned = true; /* freed when its completion comes */
		else
			w->used = false;
		pthread_mutex_unlock(&r->mu);
		if (st == FA_ETIMEDOUT)
			return fa__fail(FA_ETIMEDOUT, "no completion for %s (seq %" PRIu64 ") in the "
			                "submission ring before the timeout",
			                fa_proto_op_name(req->op), req->seq);
		return st;
	}
	uint32_t len = w->len;
	st = len == 0 ? FA_EPROTO : fa_proto_decode_rep(w->msg, len, rep, err, sizeof err);
	w->used = false;
	pthread_mutex_unlock(&r->mu);
	if (st == FA_EVERSION)
		return fa__fail(FA_EVERSION, "the daemon speaks protocol version %" PRIu32
		                ", this library %d", rep->v, FA_PROTO_VERSION);
	if (st != FA_OK)
		return fa__fail(FA_EPROTO, "bad completion for %s in the ring: %s",
		                fa_proto_op_name(req->op), len == 0 ? "empty" : err);
	if ((rep->op == req->op && rep->seq == req->seq) ||
	    (rep->op == 0 && rep->seq == 0 && rep->status != FA_OK))
		return FA_OK;
	return fa__fail(FA_EPROTO,
	                "completion for %s (seq %" PRIu64 ") answers %s (seq %" PRIu64 ")",
	                fa_proto_op_name(req->op), req->seq, fa_proto_op_name(rep->op), rep->seq);
}

fa_status fa__ring_submit_async(struct fa_ring *r, const struct fa_proto_req *req,
                                struct fa_tslot *slot, fa_ring_lost_fn lost, void *lost_arg,
                                int lost_slot, uint64_t lost_seq, int64_t deadline, bool *taken)
{
	int tag = -1;
	fa_status st;

	pthread_mutex_lock(&r->mu);
	st = ring_publish(r, req, deadline, taken, &tag);
	if (st == FA_OK && *taken) {
		struct fa_ring_wait *w = &r->w[tag];
		w->async = true;
		w->slot = slot;
		w->lost = lost;
		w->lost_arg = lost_arg;
		w->lost_slot = lost_slot;
		w->lost_seq = lost_seq;
		r->async_outstanding++;
		ring_reap(r); /* cheap; keeps finished calls from holding their slots */
	}
	pthread_mutex_unlock(&r->mu);
	return st;
}

fa_status fa__ring_sticky(struct fa_ring *r)
{
	fa_status st;

	pthread_mutex_lock(&r->mu);
	ring_reap(r);
	st = r->sticky;
	if (st != FA_OK)
		fa__fail(st, "an earlier asynchronous call failed: %s", r->sticky_detail);
	r->sticky = FA_OK;
	r->sticky_detail[0] = '\0';
	pthread_mutex_unlock(&r->mu);
	return st;
}

fa_status fa__ring_flush(struct fa_ring *r, int64_t deadline)
{
	fa_status st;

	pthread_mutex_lock(&r->mu);
	st = ring_wait(r, ring_idle, 0, deadline);
	pthread_mutex_unlock(&r->mu);
	if (st == FA_ECLOSED)
		st = FA_OK; /* what was out is failed into the sticky error */
	if (st == FA_ETIMEDOUT)
		return fa__fail(FA_ETIMEDOUT, "asynchronous calls still unfinished at the timeout");
	if (st != FA_OK)
		return st;
	return fa__ring_sticky(r);
}

bool fa__ring_live(struct fa_ring *r)
{
	return r != NULL && !r->dead && ld(&r->hdr->dead) == 0;
}

bool fa__ring_has(struct fa_ring *r, uint32_t features)
{
	return fa__ring_live(r) && (ld(&r->hdr->features) & features) == features;
}

void fa__ring_free(struct fa_ring *r)
{
	if (r == NULL)
		return;
	pthread_mutex_lock(&r->mu);
	ring_kill(r, FA_ECLOSED, "the client closed");
	pthread_mutex_unlock(&r->mu);
	fa__debug("fa: ring %016" PRIx64 ": %" PRIu64 " calls, %" PRIu64 " daemon wakes", r->id,
	          r->calls, r->wakes);
	munmap(r->hdr, FA_RING_BYTES);
	shm_unlink(r->name); /* the daemon unlinks it when the session ends; ENOENT is fine */
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
	free(r);
}
