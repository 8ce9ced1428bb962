/* test_interop.c - the wire protocol as a foreign client speaks it: nanomsg nn_* calls and the
 * msgpack-c packer only, no libfaclient call, key names as PROTOCOL.md gives them. Replies are
 * decoded with proto/'s fa_proto_decode_rep. If this test breaks, a client in another language
 * breaks too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <msgpack.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "fa_proto.h"
#include "fa_test.h"

static struct fa_daemon g_d;

static int setup(void **state)
{
	(void)state;
	if (daemon_start(&g_d, NULL) != 0) {
		daemon_log_dump(&g_d, 40);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	return daemon_finish(&g_d);
}

static void pack_key(msgpack_packer *pk, const char *k)
{
	msgpack_pack_str_with_body(pk, k, strlen(k));
}

/* Send the packed map, receive and decode the reply; returns the reply's status. */
static int roundtrip(int s, msgpack_sbuffer *sb, struct fa_proto_rep *rep)
{
	char err[256];
	void *buf = NULL;
	assert_int_equal(nn_send(s, sb->data, sb->size, 0), (int)sb->size);
	int n = nn_recv(s, &buf, NN_MSG, 0);
	assert_true(n > 0);
	fa_status st = fa_proto_decode_rep(buf, (size_t)n, rep, err, sizeof err);
	if (st != FA_OK)
		fprintf(stderr, "reply does not decode: %s\n", err);
	assert_int_equal(st, FA_OK);
	nn_freemsg(buf);
	return rep->status;
}

static void test_interop_plain_nanomsg_client_says_hello_ping_stats(void **state)
{
	(void)state;
	int s = nn_socket(AF_SP, NN_REQ);
	assert_true(s >= 0);
	int to = fa_test_ms(10000);
	assert_int_equal(nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof to), 0);
	assert_int_equal(nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &to, sizeof to), 0);
	assert_true(nn_connect(s, g_d.url) >= 0);

	msgpack_sbuffer sb;
	msgpack_packer pk;
	struct fa_proto_rep rep;

	/* HELLO {v, op, seq, pid, name} -> {sid, mm, mi, mr, be} */
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 5);
	pack_key(&pk, "v");
	msgpack_pack_uint32(&pk, FA_PROTO_VERSION);
	pack_key(&pk, "op");
	msgpack_pack_uint32(&pk, FA_OP_HELLO);
	pack_key(&pk, "seq");
	msgpack_pack_uint64(&pk, 1);
	pack_key(&pk, "pid");
	msgpack_pack_uint32(&pk, (uint32_t)getpid());
	pack_key(&pk, "name");
	msgpack_pack_str_with_body(&pk, "interop", 7);
	assert_int_equal(roundtrip(s, &sb, &rep), FA_OK);
	msgpack_sbuffer_destroy(&sb);
	assert_int_equal(rep.op, FA_OP_HELLO);
	assert_int_equal(rep.seq, 1);
	assert_true(rep.epoch != 0);
	uint64_t sid = rep.u.hello.session, epoch = rep.epoch;
	assert_true(sid != 0);
	assert_int_equal(rep.u.hello.max_msg, FA_PROTO_MAX_MSG);
	assert_true(rep.u.hello.max_inflight >= 1);
	assert_true(rep.u.hello.max_regions >= 1);
	assert_true(rep.u.hello.backend == FA_BACKEND_CPU || rep.u.hello.backend == FA_BACKEND_GPU);

	/* PING {v, op, seq, sid} */
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 4);
	pack_key(&pk, "v");
	msgpack_pack_uint32(&pk, FA_PROTO_VERSION);
	pack_key(&pk, "op");
	msgpack_pack_uint32(&pk, FA_OP_PING);
	pack_key(&pk, "seq");
	msgpack_pack_uint64(&pk, 2);
	pack_key(&pk, "sid");
	msgpack_pack_uint64(&pk, sid);
	assert_int_equal(roundtrip(s, &sb, &rep), FA_OK);
	msgpack_sbuffer_destroy(&sb);
	assert_int_equal(rep.op, FA_OP_PING);
	assert_int_equal(rep.seq, 2);
	assert_int_equal(rep.epoch, epoch);

	/* STATS {v, op, seq, sid} -> {txt}; a foreign packer may put the keys in any order */
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 4);
	pack_key(&pk, "sid");
	msgpack_pack_uint64(&pk, sid);
	pack_key(&pk, "seq");
	msgpack_pack_uint64(&pk, 3);
	pack_key(&pk, "op");
	msgpack_pack_uint8(&pk, FA_OP_STATS);
	pack_key(&pk, "v");
	msgpack_pack_uint8(&pk, FA_PROTO_VERSION);
	assert_int_equal(roundtrip(s, &sb, &rep), FA_OK);
	msgpack_sbuffer_destroy(&sb);
	assert_int_equal(rep.op, FA_OP_STATS);
	assert_int_equal(rep.seq, 3);
	uint64_t sessions;
	assert_true(fa_stats_u64(rep.u.stats.text, "sessions", &sessions));
	assert_true(sessions >= 1);
	char ep[32], want[32];
	assert_true(fa_stats_get(rep.u.stats.text, "epoch", ep, sizeof ep));
	snprintf(want, sizeof want, "%016llx", (unsigned long long)epoch);
	assert_string_equal(ep, want);

	/* BYE {v, op, seq, sid}; afterwards the session is unknown. */
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 4);
	pack_key(&pk, "v");
	msgpack_pack_uint32(&pk, FA_PROTO_VERSION);
	pack_key(&pk, "op");
	msgpack_pack_uint32(&pk, FA_OP_BYE);
	pack_key(&pk, "seq");
	msgpack_pack_uint64(&pk, 4);
	pack_key(&pk, "sid");
	msgpack_pack_uint64(&pk, sid);
	assert_int_equal(roundtrip(s, &sb, &rep), FA_OK);
	msgpack_sbuffer_destroy(&sb);

	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 4);
	pack_key(&pk, "v");
	msgpack_pack_uint32(&pk, FA_PROTO_VERSION);
	pack_key(&pk, "op");
	msgpack_pack_uint32(&pk, FA_OP_PING);
	pack_key(&pk, "seq");
	msgpack_pack_uint64(&pk, 5);
	pack_key(&pk, "sid");
	msgpack_pack_uint64(&pk, sid);
	assert_int_equal(roundtrip(s, &sb, &rep), FA_ESESSION);
	msgpack_sbuffer_destroy(&sb);
	assert_true(rep.detail[0] != '\0');
	assert_int_equal(rep.epoch, epoch);

	nn_close(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_interop_plain_nanomsg_client_says_hello_ping_stats),
	};
	if (getenv("FA_TEST_FILTER")) /* run only the tests matching a pattern */
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, setup, teardown);
}
