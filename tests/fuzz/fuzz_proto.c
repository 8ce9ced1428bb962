/* fuzz_proto.c - libFuzzer target for the wire decoder (built by `make fuzz` with clang).
 *
 * Each input goes through fa_proto_prescan(), fa_proto_decode_req() and fa_proto_decode_rep().
 * Besides crashes and sanitizer reports, it aborts when an invariant breaks:
 * - a decoder returns a status outside its contract, or an unterminated detail text;
 * - a decoder accepts bytes the pre-scan rejected, or over FA_PROTO_MAX_MSG without FA_ETOOBIG;
 * - the decode memo (fa_proto_memo.h, kept across inputs) gives another status, text or struct
 *   than the decoder, or the encode memo other bytes than the encoder;
 * - the reply shortcut (fa_proto_rep_fast.h) gives another status, text or struct than the
 *   general decoder, or other bytes than the general encoder;
 * - a decoded message does not re-encode, or decoding the re-encoding gives a different struct, or
 *   encoding that again gives different bytes (the encoder is canonical).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_proto.h"
#include "fa_proto_memo.h"
#include "fa_proto_rep_fast.h"
#include "proto_equal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Static: the reply struct is 16 KiB and the buffers 64 KiB each. */
static struct fa_proto_req req, req2;
static struct fa_proto_rep rep, rep2, rep3;
static unsigned char buf1[FA_PROTO_MAX_MSG], buf2[FA_PROTO_MAX_MSG];
static char err[FA_PROTO_DETAIL_MAX], err2[FA_PROTO_DETAIL_MAX];
static struct fa_proto_req_memo memo; /* across inputs: a corpus shares prefixes */
static struct fa_proto_req_memo enc_memo;

/* Abort with a reason (libFuzzer saves the input as a crash artifact). */
static void die(const char *what, fa_status st)
{
	fprintf(stderr, "fuzz_proto: %s (status %s, detail \"%s\")\n", what, fa_status_name(st),
	        err);
	abort();
}

/* The statuses a decoder may return, and its detail text must be a terminated string. */
static void check_status(fa_status st, size_t size)
{
	if (st != FA_OK && st != FA_EPROTO && st != FA_EVERSION && st != FA_ETOOBIG &&
	    st != FA_ENOMEM)
		die("status outside the contract", st);
	if ((size > FA_PROTO_MAX_MSG) != (st == FA_ETOOBIG))
		die("FA_ETOOBIG iff the input is over the limit", st);
	if (!memchr(err, '\0', sizeof err))
		die("unterminated detail", st);
	if (st != FA_OK && err[0] == '\0')
		die("failure without a detail", st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t len1 = 0, len2 = 0;
	fa_status pre, st;

	memset(err, 0x55, sizeof err);
	pre = fa_proto_prescan(data, size, err, sizeof err);
	check_status(pre, size);

	/* Requests. */
	memset(err, 0x55, sizeof err);
	st = fa_proto_decode_req(data, size, &req, err, sizeof err);
	check_status(st, size);
	if (st == FA_OK) {
		if (pre != FA_OK)
			die("request decoded although the pre-scan failed", pre);
		if (req.v != FA_PROTO_VERSION)
			die("decoded request of another version", st);
		if ((st = fa_proto_encode_req(&req, buf1, sizeof buf1, &len1)) != FA_OK)
			die("decoded request does not re-encode", st);
		if ((st = fa_proto_decode_req(buf1, len1, &req2, err, sizeof err)) != FA_OK)
			die("re-encoded request does not decode", st);
		if (!proto_req_equal(&req, &req2))
			die("request round trip differs", st);
		if ((st = fa_proto_encode_req(&req2, buf2, sizeof buf2, &len2)) != FA_OK)
			die("second request encoding fails", st);
		if (len1 != len2 || memcmp(buf1, buf2, len1) != 0)
			die("request encodings differ", st);
		/* the encode memo (kept across inputs) writes the encoder's bytes, for this seq
		 * and a neighbour's */
		for (int k = 0; k < 2; k++) {
			req2.seq = req.seq + (uint64_t)k;
			if ((st = fa_proto_encode_req(&req2, buf1, sizeof buf1, &len1)) != FA_OK ||
			    (st = fa_proto_encode_req_memo(&enc_memo, &req2, buf2, sizeof buf2,
			                                   &len2)) != FA_OK)
				die("the encode memo refuses what the encoder takes", st);
			if (len1 != len2 || memcmp(buf1, buf2, len1) != 0)
				die("the encode memo's bytes differ from the encoder's", st);
		}
	} else if (st == FA_EVERSION && req.v == FA_PROTO_VERSION) {
		die("FA_EVERSION with our own version", st);
	}
	{
		fa_status sm = fa_proto_decode_req_memo(&memo, data, size, &req2, err2, sizeof err2);
		if (sm != st || (st == FA_OK ? !proto_req_equal(&req, &req2) : strcmp(err, err2) != 0))
			die("the decode memo differs from the decoder", sm);
	}

	/* Replies. */
	memset(err, 0x55, sizeof err);
	st = fa_proto_decode_rep(data, size, &rep, err, sizeof err);
	check_status(st, size);
	if (st == FA_OK) {
		if (pre != FA_OK)
			die("reply decoded although the pre-scan failed", pre);
		if ((st = fa_proto_encode_rep(&rep, buf1, sizeof buf1, &len1)) != FA_OK)
			die("decoded reply does not re-encode", st);
		if ((st = fa_proto_decode_rep(buf1, len1, &rep2, err, sizeof err)) != FA_OK)
			die("re-encoded reply does not decode", st);
		if (!proto_rep_equal(&rep, &rep2))
			die("reply round trip differs", st);
		if ((st = fa_proto_encode_rep(&rep2, buf2, sizeof buf2, &len2)) != FA_OK)
			die("second reply encoding fails", st);
		if (len1 != len2 || memcmp(buf1, buf2, len1) != 0)
			die("reply encodings differ", st);
		if ((st = fa_proto_encode_rep_general(&rep2, buf2, sizeof buf2, &len2)) != FA_OK ||
		    len1 != len2 || memcmp(buf1, buf2, len1) != 0)
			die("the reply shortcut's bytes differ from the general encoder's", st);
	} else if (st == FA_EVERSION && rep.v == FA_PROTO_VERSION) {
		die("FA_EVERSION with our own version", st);
	}
	{
		fa_status sg = fa_proto_decode_rep(data, size, &rep2, err, sizeof err);
		fa_status sf = fa_proto_decode_rep_general(data, size, &rep3, err2, sizeof err2);
		if (sg != sf || (sg == FA_OK ? !proto_rep_equal(&rep2, &rep3) : strcmp(err, err2) != 0))
			die("the reply shortcut differs from the general decoder", sg);
	}
	return 0;
}
