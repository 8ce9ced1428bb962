/* ring.c - per-session submission rings in the client's shared memory; see ring.h and
 * proto/fa_ring.h.
 *
 * Each ring has a thread: it waits for the client's sq_tail to move (spinning for spin_us after
 * work, then FUTEX_WAIT with daemon_sleeping set, so a busy daemon costs the client no
 * syscall), copies the new entries into the ring's private array and wakes the loop. The loop
 * hands each copy to on_recv and frees its place; replies come back through ring_reply. Two
 * bounds keep the thread from running ahead: at most FA_RING_ENTRIES copies the loop has not
 * taken, and at most FA_RING_ENTRIES entries without a completion (so the daemon never posts
 * over a completion the client may still be reading, whatever the client's own counters say:
 * the daemon never reads them).
 */
#include "ring.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fa_proto.h"
#include "fa_ring.h"
#include "idmap.h"
#include "log.h"
#include "region.h"
#include "util.h"

_Static_assert(FA_RING_ENTRIES <= FA_PROTO_MAX_SLOTS, "a ring entry can hold a words slot");

#define RING_HDR_MARK 3u          /* ipc_hdr.len of a ring's header: never an SP header's */
#define RING_SLEEP_MS 200         /* a sleeping thread looks at its stop flag this often */
#define RING_SIG_MAX 1024         /* rings the SIGBUS handler can know at once */
#define RING_PREWAKE_MAX 16       /* prewakes waiting for their time (more: done at once) */

/* One entry copied out of the shared memory. */
struct ring_msg {
	uint32_t len, tag;
	uint64_t t_copy;          /* when the thread copied it: the hop to the loop is measured */
	uint8_t msg[FA_RING_MSG_MAX];
};

struct ring {
	uint64_t id, session;
	uint32_t uid, pid;
	struct rings *t;
	struct region *region;    /* the mapping (a host region's checks and unlink) */
	struct fa_ring_hdr *hdr;  /* = region->base */
	pthread_t thread;
	bool thread_started;
	atomic_bool stop;
	atomic_int broken;        /* the SIGBUS handler replaced the pages, or counters were bad */
	atomic_bool queued;       /* on the table's pending list */
	bool broken_counted;      /* the loop counted it in ring_broken */
	struct ring *pending_next;
	/* The thread's: entries taken (copied). Read by the loop (acquire). */
	_Atomic uint32_t taken;
	/* The loop's: copies handed to on_recv, and completions posted. Read by the thread. */
	_Atomic uint32_t consumed;
	_Atomic uint32_t posted;
	uint32_t room_word;       /* futex: the thread waits here for room (the loop bumps it) */
	atomic_bool room_waiting; /* the thread sleeps on room_word: the loop must wake it */
	_Atomic uint64_t awake_until; /* the loop's: the thread polls at least until then (a
	                          * completion's client calls again soon; a prewake's job ends) */
	atomic_bool thread_sleeping; /* the thread sleeps on sq_tail (the daemon's own flag: the
	                          * header's daemon_sleeping is the client's to rewrite) */
	_Atomic uint64_t last_reply_ns; /* the loop's last completion, taken by the thread at the
	                          * next entry: the client's turnaround */
	int sig_index;            /* its place in the SIGBUS table, -1: none */
	struct fa_proto_req_memo memo; /* the loop's: its last request decoded (ring_req_memo) */
	struct ring_msg priv[FA_RING_ENTRIES];
};

struct rings {
	struct ring_params p;
	uv_async_t async;
	struct idmap by_id;       /* ring id -> ring */
	struct idmap by_session;  /* session id -> ring */
	pthread_mutex_t mu;       /* guards the pending list and the thread-side counters */
	struct ring *pending;
	struct ring_counters n;   /* loop-side counters; the thread-side ones are atomics below */
	_Atomic uint64_t entries, sleeps, hop_ns, turnaround_ns, turnarounds, polled;
	void (*done)(void *arg);
	void *done_arg;
	unsigned handles;         /* loop handles open (the async, the spin): the last close frees */
	/* The loop's poll after completions (loop_spin_us): a uv_idle, on until spin_until and
	 * while prewakes wait for their time. */
	uv_idle_t spin;
	bool spin_open, spin_on;
	atomic_bool loop_polling; /* the spin is on: a ring thread queues entries without a
	                          * uv_async, the spin's callback takes them (Dekker with it) */
	uint64_t spin_until;
	struct {
		uint64_t ring_id, at;
	} prewake[RING_PREWAKE_MAX];
	unsigned nprewake;
};

/* ---- futexes and the SIGBUS repair ------------------------------------------------------------ */

/* A shared futex (not FUTEX_PRIVATE: the word is in memory another process maps). */
static long ring_futex(uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
	return syscall(SYS_futex, word, op, val, ts, NULL, 0);
}

static struct {
	_Atomic uintptr_t base[RING_SIG_MAX];
	_Atomic size_t size[RING_SIG_MAX];
	atomic_int *broken[RING_SIG_MAX];
	struct sigaction old;
	bool installed;
} ring_sig;

/* Async-signal-safe: a fault inside a ring's mapping gets anonymous pages there (the client
 * shrank its object) and marks the ring broken; anything else goes to the handler that was in
 * force before. */
static void ring_sigbus(int sig, siginfo_t *si, void *ctx)
{
	uintptr_t a = (uintptr_t)si->si_addr;

	for (int i = 0; i < RING_SIG_MAX; i++) {
		uintptr_t base = atomic_load(&ring_sig.base[i]);
		size_t size = atomic_load(&ring_sig.size[i]);
		if (base == 0 || a < base || a - base >= size)
			continue;
		if (mmap((void *)base, size, PROT_READ | PROT_WRITE,
		         MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
			break;
		atomic_store(ring_sig.broken[i], 1);
		return; /* the access is retried on the new pages */
	}
	if (ring_sig.old.sa_flags & SA_SIGINFO) {
		ring_sig.old.sa_sigaction(sig, si, ctx);
	} else if (ring_sig.old.sa_handler != SIG_DFL && ring_sig.old.sa_handler != SIG_IGN) {
		ring_sig.old.sa_handler(sig);
	} else {
		signal(sig, SIG_DFL); /* the fault repeats and ends the process, as unhandled */
	}
}

static fa_status ring_sig_install(void)
{
	struct sigaction sa, old;

	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = ring_sigbus;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &old) != 0)
		return FA_ESYS;
	/* A second table (tests open several servers) must not chain to itself. */
	if (!(old.sa_flags & SA_SIGINFO) || old.sa_sigaction != ring_sigbus)
		ring_sig.old = old;
	ring_sig.installed = true;
	return FA_OK;
}

static int ring_sig_add(void *base, size_t size, atomic_int *broken)
{
	for (int i = 0; i < RING_SIG_MAX; i++) {
		if (atomic_load(&ring_sig.base[i]) != 0)
			continue;
		ring_sig.broken[i] = broken;
		atomic_store(&ring_sig.size[i], size);
		atomic_store(&ring_sig.base[i], (uintptr_t)base);
		return i;
	}
	return -1;
}

static void ring_sig_del(int i)
{
	if (i < 0)
		return;
	atomic_store(&ring_sig.base[i], 0);
	atomic_store(&ring_sig.size[i], 0);
}

/* ---- the ring thread -------------------------------------------------------------------------- */

static inline void ring_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static uint32_t ring_load(const uint32_t *w)
{
	return __atomic_load_n(w, __ATOMIC_SEQ_CST);
}

static void ring_store(uint32_t *w, uint32_t v)
{
	__atomic_store_n(w, v, __ATOMIC_SEQ_CST);
}

bool ring_old_daemon(void)
{
	static atomic_int old = -1;
	int v = atomic_load(&old);
	if (v < 0) {
		const char *e = getenv("FA_TEST_OLD_DAEMON");
		v = e != NULL && strcmp(e, "1") == 0;
		if (v == 1 && atomic_exchange(&old, v) < 0)
			log_warn("ring: FA_TEST_OLD_DAEMON=1: acting as the daemon before "
			         "asynchronous backward and inference calls (a test switch)");
		atomic_store(&old, v);
	}
	return v == 1;
}

/* Put r on the loop's list (once) and wake the loop. */
static void ring_queue(struct ring *r)
{
	struct rings *t = r->t;

	if (!atomic_exchange(&r->queued, true)) {
		pthread_mutex_lock(&t->mu);
		r->pending_next = t->pending;
		t->pending = r;
		pthread_mutex_unlock(&t->mu);
	}
	/* Dekker with rings_spin_cb's store of loop_polling and look at the pending list: a
	 * polling loop takes the entry on its next turn, without the eventfd's write and read. */
	atomic_thread_fence(memory_order_seq_cst);
	if (!atomic_load(&t->loop_polling))
		uv_async_send(&t->async);
	else
		atomic_fetch_add(&t->polled, 1);
}

/* Mark the ring dead for a protocol violation; the loop closes nothing (the session goes on
 * over the socket), the thread stops. */
static void ring_break(struct ring *r, const char *why, uint32_t a, uint32_t b)
{
	atomic_store(&r->broken, 1);
	ring_store(&r->hdr->dead, FA_RING_DEAD_PROTOCOL);
	log_info("ring %016" PRIx64 " (session %016" PRIx64 ", pid %u): %s (%u, %u); closed, the "
	         "session goes on over the socket", r->id, r->session, r->pid, why, a, b);
	ring_queue(r); /* the loop counts it */
}

static void *ring_thread(void *arg)
{
	struct ring *r = arg;
	struct fa_ring_hdr *h = r->hdr;
	uint64_t spin_ns = (uint64_t)r->t->p.spin_us * 1000u;
	uint64_t last_work = fa_now_ns();
	sigset_t all;

	/* Signals are the main thread's (uv_signal); SIGBUS is synchronous and must stay. */
	sigfillset(&all);
	sigdelset(&all, SIGBUS);
	sigdelset(&all, SIGSEGV);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	while (!atomic_load(&r->stop)) {
		if (atomic_load(&r->broken)) {
			ring_store(&h->dead, FA_RING_DEAD_PROTOCOL);
			ring_queue(r);
			break;
		}
		uint32_t taken = atomic_load_explicit(&r->taken, memory_order_relaxed);
		uint32_t tail = ring_load(&h->sq_tail);
		uint32_t avail = tail - taken;
		if (avail > FA_RING_ENTRIES) {
			ring_break(r, "the submission tail is impossible (tail, entries taken)", tail,
			           taken);
			break;
		}
		if (avail == 0) {
			uint64_t now = fa_now_ns();
			if (now - last_work < spin_ns || now < atomic_load(&r->awake_until)) {
				ring_pause();
				continue;
			}
			ring_store(&h->daemon_sleeping, 1);
			/* Dekker with the client's store of sq_tail and load of daemon_sleeping: one
			 * of the two sides sees the other's write. */
			if (ring_load(&h->sq_tail) != taken) {
				ring_store(&h->daemon_sleeping, 0);
				continue;
			}
			atomic_fetch_add(&r->t->sleeps, 1);
			struct timespec ts = {0, RING_SLEEP_MS * 1000000L};
			atomic_store(&r->thread_sleeping, true);
			ring_futex(&h->sq_tail, FUTEX_WAIT, taken, &ts);
			atomic_store(&r->thread_sleeping, false);
			ring_store(&h->daemon_sleeping, 0);
			last_work = fa_now_ns();
			continue;
		}
		/* Room: copies the loop has not taken, entries without a completion. */
		uint32_t consumed = atomic_load(&r->consumed), posted = atomic_load(&r->posted);
		uint32_t room = FA_RING_ENTRIES - (taken - consumed);
		uint32_t room_cq = FA_RING_ENTRIES - (taken - posted);
		if (room_cq < room)
			room = room_cq;
		if (room == 0) {
			uint32_t seen = __atomic_load_n(&r->room_word, __ATOMIC_SEQ_CST);
			atomic_store(&r->room_waiting, true);
			if (atomic_load(&r->consumed) == consumed && atomic_load(&r->posted) == posted) {
				struct timespec ts = {0, RING_SLEEP_MS * 1000000L};
				syscall(SYS_futex, &r->room_word, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
			}
			atomic_store(&r->room_waiting, false);
			continue;
		}
		if (avail > room)
			avail = room;
		uint64_t now = fa_now_ns();
		/* a completion to the client's next entry: what a synchronous client adds between
		 * two calls (its wake-up, its own work); idle clients (10 ms or more) not counted */
		uint64_t lr = atomic_exchange(&r->last_reply_ns, 0);
		if (lr != 0 && now > lr && now - lr < 10000000ull) {
			atomic_fetch_add(&r->t->turnaround_ns, now - lr);
			atomic_fetch_add(&r->t->turnarounds, 1);
		}
		for (uint32_t i = 0; i < avail; i++) {
			const struct fa_ring_sqe *e = fa_ring_sqe_at(h, taken + i);
			struct ring_msg *m = &r->priv[(taken + i) % FA_RING_ENTRIES];
			/* Read the length once; the bytes are copied before anyone decodes them. */
			uint32_t len = __atomic_load_n(&e->len, __ATOMIC_RELAXED);
			m->tag = __atomic_load_n(&e->tag, __ATOMIC_RELAXED);
			m->len = len <= FA_RING_MSG_MAX ? len : 0;
			memcpy(m->msg, e->msg, m->len);
			m->t_copy = now;
		}
		taken += avail;
		atomic_store_explicit(&r->taken, taken, memory_order_release);
		ring_store(&h->sq_head, taken);
		atomic_fetch_add(&r->t->entries, avail);
		ring_queue(r);
		last_work = fa_now_ns();
	}
	return NULL;
}

/* ---- the loop's side -------------------------------------------------------------------------- */

static void rings_spin_cb(uv_idle_t *h);
static void ring_async_cb(uv_async_t *a);

/* Keep the loop polling until at least `until` (loop_spin_us on). */
static void rings_spin_until(struct rings *t, uint64_t until)
{
	if (!t->spin_open)
		return;
	if (until > t->spin_until)
		t->spin_until = until;
	if (!t->spin_on) {
		t->spin_on = true;
		atomic_store(&t->loop_polling, true);
		uv_idle_start(&t->spin, rings_spin_cb);
	}
}

/* Entries the ring threads queued (a look under the table's mutex). */
static bool rings_pending(struct rings *t)
{
	pthread_mutex_lock(&t->mu);
	bool any = t->pending != NULL;
	pthread_mutex_unlock(&t->mu);
	return any;
}

/* Wake r's thread if it sleeps on sq_tail: it then polls spin_us for the client's next entry.
 * A wake that just misses it (it falls asleep after the look) only leaves the client's own
 * FUTEX_WAKE to do, as without this. */
static void ring_wake_thread(struct rings *t, struct ring *r, uint64_t until)
{
	/* Before the wake: a thread about to sleep sees it and polls on. Without it the thread
	 * fell asleep between a completion and the client's next entry whenever its own window
	 * (--ring-spin-us from its last entry or wake) ended first, and the client paid a
	 * FUTEX_WAKE and the thread's wake-up: a large synchronous client's next entry came
	 * 100-170 us after its completion on the H200 (daemon/RESULTS.md 2026-12-03). */
	if (until > atomic_load(&r->awake_until))
		atomic_store(&r->awake_until, until);
	if (atomic_load(&r->thread_sleeping)) {
		ring_futex(&r->hdr->sq_tail, FUTEX_WAKE, INT_MAX, NULL);
		t->n.thread_wakes++;
	}
}

/* A prewake's time came: the client, if it sleeps on its completion, and the ring thread. */
static void ring_prewake_now(struct rings *t, uint64_t ring_id)
{
	struct ring *r = idmap_get(&t->by_id, ring_id);

	if (r == NULL || atomic_load(&r->broken))
		return;
	if (ring_load(&r->hdr->client_sleeping)) {
		ring_futex(&r->hdr->cq_tail, FUTEX_WAKE, INT_MAX, NULL);
		t->n.prewake_client_wakes++;
	}
	ring_wake_thread(t, r, fa_now_ns() + RING_PREWAKE_LEAD_NS +
	                           (uint64_t)t->p.loop_spin_us * 1000u);
}

/* The loop's poll: prewakes whose time came; stops when none waits and spin_until passed. */
static void rings_spin_cb(uv_idle_t *h)
{
	struct rings *t = h->data;
	uint64_t now = fa_now_ns();

	if (rings_pending(t)) /* queued while the loop polls: no uv_async was sent */
		ring_async_cb(&t->async);
	for (unsigned i = 0; i < t->nprewake;) {
		if (t->prewake[i].at > now) {
			i++;
			continue;
		}
		uint64_t id = t->prewake[i].ring_id;
		t->prewake[i] = t->prewake[--t->nprewake];
		ring_prewake_now(t, id);
	}
	if (t->nprewake == 0 && now >= t->spin_until) {
		t->spin_on = false;
		uv_idle_stop(&t->spin);
		/* from now on the threads send a uv_async; an entry queued before they could see
		 * that is taken here (the other half of ring_queue's Dekker) */
		atomic_store(&t->loop_polling, false);
		atomic_thread_fence(memory_order_seq_cst);
		if (rings_pending(t))
			ring_async_cb(&t->async);
	}
}

void ring_prewake(struct rings *t, const struct ipc_hdr *h, uint64_t end_ns)
{
	uint64_t id;
	struct ring *r;

	if (t == NULL || t->p.loop_spin_us == 0 || !ring_hdr_is(h))
		return;
	memcpy(&id, h->b, 8);
	if ((r = idmap_get(&t->by_id, id)) == NULL || atomic_load(&r->broken))
		return;
	t->n.prewakes++;
	uint64_t now = fa_now_ns();
	uint64_t at = end_ns > RING_PREWAKE_LEAD_NS ? end_ns - RING_PREWAKE_LEAD_NS : 0;
	if (at <= now || t->nprewake == RING_PREWAKE_MAX || !t->spin_open) {
		ring_prewake_now(t, id);
	} else {
		t->prewake[t->nprewake].ring_id = id;
		t->prewake[t->nprewake].at = at;
		t->nprewake++;
	}
	rings_spin_until(t, (end_ns > now ? end_ns : now) + (uint64_t)t->p.loop_spin_us * 1000u);
}

/* The loop freed a copy or posted a completion: wake the thread if it waits for room. */
static void ring_room(struct ring *r)
{
	__atomic_add_fetch(&r->room_word, 1, __ATOMIC_SEQ_CST);
	if (atomic_load(&r->room_waiting))
		syscall(SYS_futex, &r->room_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void ring_hdr_make(struct ipc_hdr *h, const struct ring *r, uint32_t tag)
{
	memset(h, 0, sizeof *h);
	h->len = RING_HDR_MARK;
	memcpy(h->b, &r->id, 8);
	memcpy(h->b + 8, &r->session, 8);
	memcpy(h->b + 16, &tag, 4);
}

bool ring_hdr_is(const struct ipc_hdr *h)
{
	return h->len == RING_HDR_MARK;
}

struct fa_proto_req_memo *ring_req_memo(struct rings *t, const struct ipc_hdr *h)
{
	uint64_t id;
	struct ring *r;

	if (t == NULL || !ring_hdr_is(h))
		return NULL;
	memcpy(&id, h->b, 8);
	r = idmap_get(&t->by_id, id);
	return r != NULL ? &r->memo : NULL;
}

uint64_t ring_hdr_session(const struct ipc_hdr *h)
{
	uint64_t s;

	memcpy(&s, h->b + 8, 8);
	return s;
}

/* Hand the copies of one ring to on_recv, in order. */
static void ring_drain(struct rings *t, struct ring *r)
{
	uint32_t taken = atomic_load_explicit(&r->taken, memory_order_acquire);
	uint32_t c = atomic_load(&r->consumed);
	struct ipc_peer peer = {.pipe = 0, .uid = r->uid, .pid = r->pid};

	if (atomic_load(&r->broken) && !r->broken_counted) {
		r->broken_counted = true;
		t->n.broken++;
	}

	while (c != taken && idmap_get(&t->by_id, r->id) == r) {
		struct ring_msg *m = &r->priv[c % FA_RING_ENTRIES];
		struct ipc_hdr hdr;
		ring_hdr_make(&hdr, r, m->tag);
		atomic_fetch_add(&t->hop_ns, fa_now_ns() - m->t_copy);
		/* on_recv may close the session (and this ring): the id check above stops us. */
		uint64_t id = r->id;
		c++;
		atomic_store(&r->consumed, c);
		t->p.on_recv(t->p.arg, &peer, &hdr, m->msg, m->len);
		if (idmap_get(&t->by_id, id) != r)
			return;
		ring_room(r);
	}
}

static void ring_async_cb(uv_async_t *a)
{
	struct rings *t = a->data;

	pthread_mutex_lock(&t->mu);
	struct ring *list = t->pending;
	t->pending = NULL;
	pthread_mutex_unlock(&t->mu);
	while (list != NULL) {
		struct ring *r = list;
		list = r->pending_next;
		r->pending_next = NULL;
		atomic_store(&r->queued, false); /* before the drain: new entries queue it again */
		ring_drain(t, r);
	}
}

fa_status rings_open(struct rings **out, const struct ring_params *p, char *err, size_t errlen)
{
	struct rings *t;

	*out = NULL;
	if ((t = calloc(1, sizeof *t)) == NULL)
		return fa_err(err, errlen, FA_ENOMEM, "no memory for the ring table");
	t->p = *p;
	idmap_init(&t->by_id);
	idmap_init(&t->by_session);
	if (pthread_mutex_init(&t->mu, NULL) != 0) {
		free(t);
		return fa_err(err, errlen, FA_ESYS, "pthread_mutex_init failed");
	}
	if (ring_sig_install() != FA_OK) {
		pthread_mutex_destroy(&t->mu);
		free(t);
		return fa_err(err, errlen, FA_ESYS, "installing the rings' SIGBUS handler: %s",
		              strerror(errno));
	}
	if (uv_async_init(p->loop, &t->async, ring_async_cb) != 0) {
		pthread_mutex_destroy(&t->mu);
		free(t);
		return fa_err(err, errlen, FA_ESYS, "uv_async_init failed");
	}
	t->async.data = t;
	t->handles = 1;
	/* only latency: without it the loop sleeps between completions, as it always did */
	if (uv_idle_init(p->loop, &t->spin) == 0) {
		t->spin.data = t;
		t->spin_open = true;
		t->handles++;
	}
	*out = t;
	return FA_OK;
}

/* Stop and free one ring (loop thread). */
static void ring_free(struct rings *t, struct ring *r)
{
	idmap_del(&t->by_id, r->id);
	idmap_del(&t->by_session, r->session);
	if (r->thread_started) {
		atomic_store(&r->stop, true);
		/* Wake it wherever it sleeps: the client's word (our mapping too) and the room. */
		ring_futex(&r->hdr->sq_tail, FUTEX_WAKE, INT_MAX, NULL);
		__atomic_add_fetch(&r->room_word, 1, __ATOMIC_SEQ_CST);
		syscall(SYS_futex, &r->room_word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
		pthread_join(r->thread, NULL);
	}
	pthread_mutex_lock(&t->mu);
	for (struct ring **pp = &t->pending; *pp != NULL; pp = &(*pp)->pending_next) {
		if (*pp == r) {
			*pp = r->pending_next;
			break;
		}
	}
	pthread_mutex_unlock(&t->mu);
	if (!atomic_load(&r->broken))
		ring_store(&r->hdr->dead, FA_RING_DEAD_CLOSED);
	else if (!r->broken_counted)
		t->n.broken++;
	ring_sig_del(r->sig_index);
	r->region->unlink = true;
	region_unref(r->region);
	t->n.open--;
	free(r);
}

static void rings_closed(uv_handle_t *h)
{
	struct rings *t = h->data;
	void (*done)(void *) = t->done;
	void *arg = t->done_arg;

	if (--t->handles > 0)
		return;
	idmap_fini(&t->by_id);
	idmap_fini(&t->by_session);
	pthread_mutex_destroy(&t->mu);
	free(t);
	if (done != NULL)
		done(arg);
}

void rings_close(struct rings *t, void (*done)(void *arg), void *arg)
{
	uint64_t key;
	void *val;

	if (t == NULL)
		return;
	while (idmap_first(&t->by_id, &key, &val))
		ring_free(t, val);
	t->done = done;
	t->done_arg = arg;
	if (t->spin_open) {
		uv_idle_stop(&t->spin);
		atomic_store(&t->loop_polling, false);
		uv_close((uv_handle_t *)&t->spin, rings_closed);
	}
	uv_close((uv_handle_t *)&t->async, rings_closed);
}

fa_status ring_open(struct rings *t, uint64_t session, uint32_t uid, uint32_t pid,
                    const char *name, uint64_t size, uint64_t *id, char *err, size_t errlen)
{
	struct region *rg;
	struct ring *r;
	fa_status st;

	*id = 0;
	if (idmap_get(&t->by_session, session) != NULL)
		return fa_err(err, errlen, FA_ELIMIT, "the session has a ring already (one each)");
	if (t->n.open >= t->p.max_rings)
		return fa_err(err, errlen, FA_ELIMIT,
		              "%u rings are open, this daemon's limit (--max-rings): calls go by "
		              "the socket", t->n.open);
	if (size != FA_RING_BYTES)
		return fa_err(err, errlen, FA_ERANGE,
		              "a ring of layout %d is %d bytes; RING_OPEN declares %" PRIu64,
		              FA_RING_LAYOUT, FA_RING_BYTES, size);
	/* "/faring." + a host buffer's "<uid>.<pid>.<16 hex>": not a buffer's name, so tools
	 * and tests that count a process' buffers by name do not count its ring. */
	char as_buffer[FA_PROTO_SHM_NAME_MAX];
	if (strncmp(name, FA_RING_NAME_PREFIX, strlen(FA_RING_NAME_PREFIX)) != 0 ||
	    snprintf(as_buffer, sizeof as_buffer, "/fa.%s",
	             name + strlen(FA_RING_NAME_PREFIX)) >= (int)sizeof as_buffer ||
	    !region_name_valid(as_buffer))
		return fa_err(err, errlen, FA_EINVAL,
		              "ring name '%.64s' is not of the form %s<uid>.<pid>.<16 hex digits>",
		              name, FA_RING_NAME_PREFIX);
	if ((st = region_map_shm(&rg, name, size, uid, t->p.max_bytes, err, errlen)) != FA_OK)
		return st;
	region_uncount(rg); /* a ring, not a buffer: STATS' regions count buffers */
	struct fa_ring_hdr *h = rg->base;
	/* One read of each: the client may rewrite them, and they are never read again. */
	uint32_t magic = ring_load(&h->magic), layout = ring_load(&h->layout);
	uint32_t entries = ring_load(&h->entries), ebytes = ring_load(&h->entry_bytes);
	if (magic != FA_RING_MAGIC || layout != FA_RING_LAYOUT || entries != FA_RING_ENTRIES ||
	    ebytes != FA_RING_ENTRY_BYTES) {
		region_unref(rg);
		return fa_err(err, errlen, FA_EINVAL,
		              "ring %s: header says magic %08x layout %u, %u entries of %u bytes; "
		              "this daemon serves magic %08x layout %d, %d entries of %d bytes",
		              name, magic, layout, entries, ebytes, FA_RING_MAGIC, FA_RING_LAYOUT,
		              FA_RING_ENTRIES, FA_RING_ENTRY_BYTES);
	}
	if ((r = calloc(1, sizeof *r)) == NULL) {
		region_unref(rg);
		return fa_err(err, errlen, FA_ENOMEM, "no memory for a ring");
	}
	r->t = t;
	r->session = session;
	r->uid = uid;
	r->pid = pid;
	r->region = rg;
	r->hdr = h;
	/* The counters start where the client's are (a fresh ring: 0; anything else is its
	 * business): the daemon's own counters are what bound it. */
	uint32_t tail = ring_load(&h->sq_tail);
	atomic_store(&r->taken, tail);
	atomic_store(&r->consumed, tail);
	atomic_store(&r->posted, tail);
	ring_store(&h->cq_tail, tail);
	ring_store(&h->sq_head, tail);
	ring_store(&h->dead, FA_RING_LIVE);
	ring_store(&h->features, ring_old_daemon() ? 0 : FA_RING_FEATURES);
	r->sig_index = ring_sig_add(rg->base, (size_t)rg->size, &r->broken);
	do {
		if ((st = util_random_u64(&r->id)) != FA_OK)
			break;
	} while (r->id == 0 || idmap_get(&t->by_id, r->id) != NULL);
	if (st == FA_OK && (idmap_put(&t->by_id, r->id, r) != FA_OK ||
	                    idmap_put(&t->by_session, session, r) != FA_OK))
		st = FA_ENOMEM;
	if (st == FA_OK && pthread_create(&r->thread, NULL, ring_thread, r) != 0)
		st = FA_ESYS;
	if (st != FA_OK) {
		idmap_del(&t->by_id, r->id);
		idmap_del(&t->by_session, session);
		ring_sig_del(r->sig_index);
		region_unref(rg);
		free(r);
		return fa_err(err, errlen, st, "cannot start the ring (%s)", fa_status_name(st));
	}
	r->thread_started = true;
	t->n.open++;
	t->n.opened++;
	*id = r->id;
	log_info("session %016" PRIx64 ": ring %016" PRIx64 " on %s", session, r->id, name);
	return FA_OK;
}

void ring_close_session(struct rings *t, uint64_t session)
{
	struct ring *r;

	if (t != NULL && (r = idmap_get(&t->by_session, session)) != NULL)
		ring_free(t, r);
}

void ring_reply(struct rings *t, const struct ipc_hdr *h, const void *buf, size_t len)
{
	uint64_t id;
	uint32_t tag;
	struct ring *r;

	memcpy(&id, h->b, 8);
	memcpy(&tag, h->b + 16, 4);
	if (t == NULL || (r = idmap_get(&t->by_id, id)) == NULL || atomic_load(&r->broken)) {
		if (t != NULL)
			t->n.dropped++;
		return;
	}
	uint32_t at = atomic_load(&r->posted);
	struct fa_ring_cqe *e = fa_ring_cqe_at(r->hdr, at);
	if (len <= FA_RING_MSG_MAX) {
		memcpy(e->msg, buf, len);
		e->len = (uint32_t)len;
	} else {
		e->len = 0;
	}
	e->tag = tag;
	atomic_store(&r->posted, at + 1);
	atomic_store(&r->last_reply_ns, fa_now_ns());
	/* Dekker with the client's store of client_sleeping and load of cq_tail. */
	ring_store(&r->hdr->cq_tail, at + 1);
	t->n.completions++;
	if (ring_load(&r->hdr->client_sleeping)) {
		ring_futex(&r->hdr->cq_tail, FUTEX_WAKE, INT_MAX, NULL);
		t->n.client_wakes++;
	}
	ring_room(r);
	/* A synchronous client answers its completion with its next entry tens of microseconds
	 * later: the ring thread and the loop are kept awake for it (no FUTEX_WAKE from the
	 * client, no eventfd wake of a sleeping loop on the way). */
	if (t->p.loop_spin_us > 0) {
		uint64_t until = fa_now_ns() + (uint64_t)t->p.loop_spin_us * 1000u;
		ring_wake_thread(t, r, until);
		rings_spin_until(t, until);
	}
}

void ring_counters(const struct rings *t, struct ring_counters *out)
{
	memset(out, 0, sizeof *out);
	if (t == NULL)
		return;
	*out = t->n;
	out->entries = atomic_load(&((struct rings *)t)->entries);
	out->sleeps = atomic_load(&((struct rings *)t)->sleeps);
	out->hop_ns = atomic_load(&((struct rings *)t)->hop_ns);
	out->turnaround_ns = atomic_load(&((struct rings *)t)->turnaround_ns);
	out->turnarounds = atomic_load(&((struct rings *)t)->turnarounds);
	out->polled = atomic_load(&((struct rings *)t)->polled);
}
