/* fa_transport.c - nanomsg REQ sockets to the daemon: a pool, one socket per in-flight call.
 *
 * The only file of fa that includes <nanomsg/nn.h> (libnng exports nn_* too: no binary may link
 * both, and keeping nanomsg behind these few functions lets the transport change alone).
 *
 * Why one cooked REQ socket per call: a cooked REQ socket carries one request at a time, and one
 * raw REQ socket multiplexing many requests silently lost replies in our measurements
 * (docs/research/ipc.md 3.2). Sockets are kept and reused; the pool grows on demand up to
 * FA_TRANSPORT_MAX_SOCKETS, and a call beyond that waits for a free socket within its deadline.
 *
 * nanomsg's sharp edges handled here:
 * - nn_connect is asynchronous: an absent daemon is not an error, just a reply that never comes.
 *   fa_client.c checks the socket file and uses a short HELLO timeout to report FA_EUNAVAIL.
 * - A cooked REQ socket re-sends its request every NN_REQ_RESEND_IVL (default 60 s) and after a
 *   reconnect. The daemon dedupes on (session, seq), but a re-send is pure waste, so the interval
 *   is kept above the call's timeout.
 * - After a timeout the reply may still arrive later: that socket is closed, never reused.
 * - A message above the receiver's NN_RCVMAXSIZE makes it drop the connection and REQ replays the
 *   message forever: the encoded size is checked before nanomsg sees it.
 * - Paths of 108..127 bytes abort inside nn_connect: fa_client.c refuses them first.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "fa_client_int.h"

/* Encode into a buffer on the stack first: every request of this protocol is a few hundred
 * bytes; only an oversized one (which is then refused) needs the heap. */
#define SMALL_MSG 4096
/* With no timeout, a request is still re-sent this often, in case a reply was dropped. */
#define RESEND_FOREVER_MS (10 * 60 * 1000)
/* Resend intervals are set this far beyond the call's deadline. */
#define RESEND_MARGIN_MS 60000

struct fa_tslot {
	int sock;
	int id;                         /* 0..FA_TRANSPORT_MAX_SOCKETS-1, unique among open sockets:
	                                 * the asynchronous mode's slot */
	int rcvtimeo, sndtimeo, resend; /* values last set, to skip redundant setsockopt calls */
	bool clean;                     /* no request outstanding: safe to reuse */
	struct fa_tslot *next;          /* in the idle list */
};

struct fa_transport {
	char url[FA_SOCK_PATH_MAX + 8]; /* "ipc://" + path */
	pthread_mutex_t lock;           /* guards the fields below */
	pthread_cond_t freed;           /* signalled when a socket is released */
	struct fa_tslot *idle;          /* sockets ready for reuse */
	int nopen;                      /* sockets open (idle + in use) */
	uint64_t ids;                   /* bit i: id i belongs to an open socket */
};

/* Prepare the pool; see fa_client_int.h. */
fa_status fa_transport_open(struct fa_transport **out, const char *path)
{
	struct fa_transport *t;
	pthread_condattr_t ca;

	*out = NULL;
	if (strlen(path) >= FA_SOCK_PATH_MAX)
		return fa__fail(FA_EINVAL, "socket path is %zu bytes; Unix sockets take at most %d",
		                strlen(path), FA_SOCK_PATH_MAX - 1);
	t = calloc(1, sizeof *t);
	if (t == NULL)
		return fa__fail(FA_ENOMEM, "no memory for the transport");
	snprintf(t->url, sizeof t->url, "ipc://%s", path);
	if (pthread_condattr_init(&ca) != 0) {
		free(t);
		return fa__fail(FA_ESYS, "pthread_condattr_init failed");
	}
	/* Deadlines are CLOCK_MONOTONIC: a wall-clock jump must not stretch or cut a wait. */
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (pthread_mutex_init(&t->lock, NULL) != 0 || pthread_cond_init(&t->freed, &ca) != 0) {
		pthread_condattr_destroy(&ca);
		free(t);
		return fa__fail(FA_ESYS, "pthread mutex or condition init failed");
	}
	pthread_condattr_destroy(&ca);
	*out = t;
	return FA_OK;
}

/* Close one socket and free its slot. */
static void slot_close(struct fa_tslot *s)
{
	if (s == NULL)
		return;
	if (s->sock >= 0)
		nn_close(s->sock);
	free(s);
}

/* Close the idle sockets; see fa_client_int.h. */
void fa_transport_drop_idle(struct fa_transport *t)
{
	struct fa_tslot *list;

	if (t == NULL)
		return;
	pthread_mutex_lock(&t->lock);
	list = t->idle;
	t->idle = NULL;
	for (struct fa_tslot *s = list; s != NULL; s = s->next)
		t->nopen--;
	pthread_cond_broadcast(&t->freed);
	pthread_mutex_unlock(&t->lock);
	while (list != NULL) {
		struct fa_tslot *next = list->next;
		slot_close(list);
		list = next;
	}
}

/* Close everything; see fa_client_int.h. */
void fa_transport_close(struct fa_transport *t)
{
	if (t == NULL)
		return;
	fa_transport_drop_idle(t);
	if (t->nopen != 0)
		fa__debug("fa: transport closed with %d sockets still in use", t->nopen);
	pthread_cond_destroy(&t->freed);
	pthread_mutex_destroy(&t->lock);
	free(t);
}

/* The status for a nanomsg errno, with the detail naming what failed. */
static fa_status nn_fail(const char *what, int err)
{
	switch (err) {
	case ETIMEDOUT:
		return fa__fail(FA_ETIMEDOUT, "%s: timed out", what);
	case ETERM:
		return fa__fail(FA_ECLOSED, "%s: nanomsg is terminating", what);
	case ENOMEM:
		return fa__fail(FA_ENOMEM, "%s: %s", what, nn_strerror(err));
	default:
		return fa__fail(FA_ESYS, "%s: %s", what, nn_strerror(err));
	}
}

/* Set an int option unless it already has that value. */
static fa_status slot_setopt(struct fa_tslot *s, int level, int opt, int *cached, int value,
                             const char *name)
{
	if (*cached == value)
		return FA_OK;
	if (nn_setsockopt(s->sock, level, opt, &value, sizeof value) < 0)
		return nn_fail(name, errno);
	*cached = value;
	return FA_OK;
}

/* A new REQ socket connected (asynchronously) to the daemon's address. */
static fa_status slot_open(struct fa_transport *t, struct fa_tslot **out)
{
	struct fa_tslot *s;
	fa_status st;

	*out = NULL;
	s = calloc(1, sizeof *s);
	if (s == NULL)
		return fa__fail(FA_ENOMEM, "no memory for a socket");
	s->rcvtimeo = s->sndtimeo = -1; /* nanomsg's defaults */
	s->resend = 60000;
	s->clean = true;
	s->sock = nn_socket(AF_SP, NN_REQ);
	if (s->sock < 0) {
		st = nn_fail("nn_socket", errno);
		free(s);
		return st;
	}
	st = slot_setopt(s, NN_REQ, NN_REQ_RESEND_IVL, &s->resend, RESEND_FOREVER_MS,
	                 "NN_REQ_RESEND_IVL");
	if (st == FA_OK && nn_connect(s->sock, t->url) < 0)
		st = nn_fail(t->url, errno);
	if (st != FA_OK) {
		slot_close(s);
		return st;
	}
	*out = s;
	return FA_OK;
}

/* Take a socket; see fa_client_int.h. */
fa_status fa_transport_acquire(struct fa_transport *t, int64_t deadline_ns, struct fa_tslot **out)
{
	fa_status st;

	*out = NULL;
	pthread_mutex_lock(&t->lock);
	for (;;) {
		if (t->idle != NULL) {
			struct fa_tslot *s = t->idle;
			t->idle = s->next;
			s->next = NULL;
			pthread_mutex_unlock(&t->lock);
			*out = s;
			return FA_OK;
		}
		if (t->nopen < FA_TRANSPORT_MAX_SOCKETS) {
			/* Count it before creating it outside the lock, so the cap holds. */
			t->nopen++;
			int id = __builtin_ctzll(~t->ids); /* nopen < 64: a free id exists */
			t->ids |= UINT64_C(1) << id;
			pthread_mutex_unlock(&t->lock);
			st = slot_open(t, out);
			if (st == FA_OK)
				(*out)->id = id;
			if (st != FA_OK) {
				pthread_mutex_lock(&t->lock);
				t->ids &= ~(UINT64_C(1) << id);
				t->nopen--;
				pthread_cond_signal(&t->freed);
				pthread_mutex_unlock(&t->lock);
			}
			return st;
		}
		if (deadline_ns == 0) {
			pthread_cond_wait(&t->freed, &t->lock);
		} else {
			struct timespec ts = {.tv_sec = deadline_ns / 1000000000,
			                      .tv_nsec = deadline_ns % 1000000000};
			if (pthread_cond_timedwait(&t->freed, &t->lock, &ts) == ETIMEDOUT &&
			    t->idle == NULL && t->nopen >= FA_TRANSPORT_MAX_SOCKETS) {
				pthread_mutex_unlock(&t->lock);
				return fa__fail(FA_ETIMEDOUT,
				                "all %d sockets of this client stayed busy until the timeout",
				                FA_TRANSPORT_MAX_SOCKETS);
			}
		}
	}
}

/* Give a socket back; see fa_client_int.h. */
void fa_transport_release(struct fa_transport *t, struct fa_tslot *s)
{
	if (s == NULL)
		return;
	pthread_mutex_lock(&t->lock);
	if (s->clean) {
		s->next = t->idle;
		t->idle = s;
		s = NULL;
	} else {
		t->nopen--;
		t->ids &= ~(UINT64_C(1) << s->id);
	}
	pthread_cond_signal(&t->freed);
	pthread_mutex_unlock(&t->lock);
	slot_close(s); /* a socket that may still receive a stale reply is never reused */
}

/* The socket's slot id; see fa_client_int.h. */
int fa_transport_slot_id(const struct fa_tslot *s)
{
	return s->id;
}

/* Milliseconds left until deadline_ns, at least 1; -1 (nanomsg: forever) for no deadline; 0 when
 * the deadline has passed. */
static int ms_left(int64_t deadline_ns)
{
	int64_t left;

	if (deadline_ns == 0)
		return -1;
	left = deadline_ns - (int64_t)fa_now_ns();
	if (left <= 0)
		return 0;
	left = (left + 999999) / 1000000;
	return left > INT_MAX ? INT_MAX : (int)left;
}

/* Set the socket's send and receive timeouts and its resend interval for the time left. */
static fa_status slot_arm(struct fa_tslot *s, int left)
{
	fa_status st;
	int resend = RESEND_FOREVER_MS;

	if (left > 0 && left > RESEND_FOREVER_MS - RESEND_MARGIN_MS)
		resend = left > INT_MAX - RESEND_MARGIN_MS ? INT_MAX : left + RESEND_MARGIN_MS;
	/* Only raise the interval: a lower one set earlier would re-send before this deadline. */
	if (resend < s->resend)
		resend = s->resend;
	if ((st = slot_setopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &s->sndtimeo, left,
	                      "NN_SNDTIMEO")) != FA_OK ||
	    (st = slot_setopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &s->rcvtimeo, left,
	                      "NN_RCVTIMEO")) != FA_OK ||
	    (st = slot_setopt(s, NN_REQ, NN_REQ_RESEND_IVL, &s->resend, resend,
	                      "NN_REQ_RESEND_IVL")) != FA_OK)
		return st;
	return FA_OK;
}

/* Encode req into small (SMALL_MSG bytes) or, when larger, into *heap (allocated here). */
static fa_status encode(const struct fa_proto_req *req, unsigned char *small, void **heap,
                        const void **buf, size_t *len)
{
	fa_status st;

	*heap = NULL;
	st = fa_proto_encode_req(req, small, SMALL_MSG, len);
	if (st == FA_OK) {
		*buf = small;
		return FA_OK;
	}
	if (st == FA_ETOOBIG) {
		*heap = malloc(FA_PROTO_MAX_MSG);
		if (*heap == NULL)
			return fa__fail(FA_ENOMEM, "no memory to encode a request");
		st = fa_proto_encode_req(req, *heap, FA_PROTO_MAX_MSG, len);
		*buf = *heap;
	}
	if (st == FA_ETOOBIG)
		return fa__fail(FA_ETOOBIG, "%s request is larger than the protocol's %d bytes",
		                fa_proto_op_name(req->op), FA_PROTO_MAX_MSG);
	if (st != FA_OK)
		return fa__fail(st, "%s request could not be encoded (a field out of range)",
		                fa_proto_op_name(req->op));
	return FA_OK;
}

/* Receive the reply on s until the deadline; on FA_OK *msg (nanomsg's, nn_freemsg it) holds it. */
static fa_status recv_reply(struct fa_tslot *s, const struct fa_proto_req *req, int64_t start,
                            int64_t deadline_ns, void **msg, int *n)
{
	fa_status st;

	for (;;) {
		int left = ms_left(deadline_ns);
		if (left == 0)
			break;
		if ((st = slot_arm(s, left)) != FA_OK)
			return st;
		*msg = NULL;
		*n = nn_recv(s->sock, msg, NN_MSG, 0);
		if (*n >= 0)
			return FA_OK;
		if (errno == EINTR)
			continue; /* the request stays outstanding: wait again for the time left */
		if (errno != ETIMEDOUT)
			return nn_fail("nn_recv", errno);
	}
	return fa__fail(FA_ETIMEDOUT, "no reply to %s (seq %" PRIu64 ") within %" PRId64 " ms",
	                fa_proto_op_name(req->op), req->seq, ((int64_t)fa_now_ns() - start) / 1000000);
}

/* One round trip; see fa_client_int.h. */
fa_status fa_transport_roundtrip(struct fa_transport *t, struct fa_tslot *s,
                                 const struct fa_proto_req *req, struct fa_proto_rep *rep,
                                 int64_t deadline_ns)
{
	unsigned char small[SMALL_MSG];
	void *heap = NULL, *msg = NULL;
	const void *buf = NULL;
	char err[FA_PROTO_DETAIL_MAX];
	int64_t start = (int64_t)fa_now_ns();
	size_t len = 0;
	int n = 0, left;
	fa_status st;

	(void)t;
	st = encode(req, small, &heap, &buf, &len);
	if (st != FA_OK) {
		free(heap);
		return st; /* nothing was sent: the socket stays clean */
	}
	s->clean = false;
	left = ms_left(deadline_ns);
	if (left == 0) {
		free(heap);
		s->clean = true;
		return fa__fail(FA_ETIMEDOUT, "%s: the timeout passed before the request was sent",
		                fa_proto_op_name(req->op));
	}
	st = slot_arm(s, left);
	while (st == FA_OK && nn_send(s->sock, buf, len, 0) < 0) {
		if (errno == EINTR && ms_left(deadline_ns) != 0)
			continue;
		st = errno == EINTR ? fa__fail(FA_ETIMEDOUT, "%s: send timed out",
		                               fa_proto_op_name(req->op))
		                    : nn_fail("nn_send", errno);
	}
	free(heap);
	if (st != FA_OK)
		return st;

	st = recv_reply(s, req, start, deadline_ns, &msg, &n);
	if (st != FA_OK)
		return st; /* s stays unclean: a late reply may still come, so it will be closed */
	s->clean = true; /* the REQ socket has its reply: ready for the next request */

	err[0] = '\0';
	st = fa_proto_decode_rep(msg, (size_t)n, rep, err, sizeof err);
	nn_freemsg(msg);
	if (st == FA_EVERSION)
		return fa__fail(FA_EVERSION, "the daemon speaks protocol version %" PRIu32
		                ", this library %d", rep->v, FA_PROTO_VERSION);
	if (st != FA_OK)
		return fa__fail(st, "bad reply to %s: %s", fa_proto_op_name(req->op), err);
	if (rep->op == req->op && rep->seq == req->seq)
		return FA_OK;
	/* A daemon that could not decode the request answers with op 0 and seq 0. */
	if (rep->op == 0 && rep->seq == 0 && rep->status != FA_OK)
		return FA_OK;
	/* REQ sockets match replies to requests themselves, so this is a daemon bug; the socket cannot
	 * wait for another reply to this request, so the call fails. */
	s->clean = false;
	return fa__fail(FA_EPROTO,
	                "reply to %s (seq %" PRIu64 ") answers %s (seq %" PRIu64 "); discarded",
	                fa_proto_op_name(req->op), req->seq, fa_proto_op_name(rep->op), rep->seq);
}
