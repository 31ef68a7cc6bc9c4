/*
 * fuzz_lease_stream.c - libFuzzer target: a lease connection's byte stream
 * with frames pipelined back to back (server/lease_proto.c's
 * ts_lease_frame_next, then ts_lease_parse on each frame), as the service
 * reads it: into a buffer of one largest frame (4 + TS_LEASE_FRAME_MAX),
 * in pieces of any size, the served frames dropped from its front before
 * each read. The first input byte seeds the piece sizes; the rest is the
 * stream. The frames cut this way are the ones cut from the whole stream
 * at once - the same count, payloads and order - and the stream ends the
 * same way (a partial frame or an unreadable length); a full buffer always
 * holds a whole frame or an unreadable length, so a reader never waits
 * forever; nothing reads outside what was received; every refused request
 * renders as a google.rpc.Status.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "handlers/api.h"
#include "server/lease_proto.h"

#define CAP (4 + TS_LEASE_FRAME_MAX)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct cut {
	size_t at, len;
};

/* The frames of the whole stream cut at once, into *out (up to max); the
 * count; the state it ends in, in *end. */
static size_t cut_all(const uint8_t *s, size_t n, struct cut *out, size_t max,
                      enum ts_lease_frame_state *end)
{
	size_t at = 0, k = 0;
	struct ts_lease_frame f;
	struct ts_error err;

	ts_error_clear(&err);
	while ((*end = ts_lease_frame_next(s + at, n - at, &f, &err)) == TS_LEASE_FRAME_WHOLE) {
		if ((const uint8_t *)f.payload != s + at + 4 || f.size != 4 + f.len ||
		    f.len == 0 || f.len > TS_LEASE_FRAME_MAX || f.size > n - at)
			abort();
		if (k < max)
			out[k] = (struct cut){at + 4, f.len};
		k++;
		at += f.size;
	}
	return k;
}

static void parse(const char *payload, size_t len)
{
	struct ts_lease_req rq;
	struct ts_error err;
	char *copy = malloc(len);

	if (!copy)
		return;
	memcpy(copy, payload, len);      /* exactly len bytes: reads past them trip ASan */
	ts_error_clear(&err);
	if (ts_lease_parse(copy, len, &rq, &err) != TS_OK) {
		json_t *j = ts_error_to_json(&err, 0);

		if (!j || err.status != TS_INVALID_ARGUMENT || !err.message[0])
			abort();
		json_decref(j);
	}
	free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	enum ts_lease_frame_state end_all, st = TS_LEASE_FRAME_MORE;
	struct cut cuts[512];
	uint8_t *buf;
	uint32_t rng;
	size_t nall, got = 0, start = 0, have = 0, fed = 0;

	if (size < 1)
		return 0;
	rng = data[0] * 2654435761u + 1;
	data++;
	size--;
	nall = cut_all(data, size, cuts, 512, &end_all);
	buf = malloc(CAP);
	if (!buf)
		return 0;
	for (;;) {
		struct ts_lease_frame f;
		struct ts_error err;
		size_t piece;

		ts_error_clear(&err);
		st = ts_lease_frame_next(buf + start, have - start, &f, &err);
		if (st == TS_LEASE_FRAME_WHOLE) {
			if (got < 512 && (f.len != cuts[got].len ||
			                  memcmp(f.payload, data + cuts[got].at, f.len) != 0))
				abort();
			parse(f.payload, f.len);
			got++;
			start += f.size;
			continue;
		}
		if (st == TS_LEASE_FRAME_BAD || fed == size)
			break;
		/* drop what was served, then read a piece (as conn_read) */
		memmove(buf, buf + start, have - start);
		have -= start;
		start = 0;
		if (have == CAP)
			abort();                /* full, and yet no frame: a reader would hang */
		rng = rng * 1103515245u + 12345u;
		piece = 1 + (rng >> 8) % (rng & 0x100 ? 7 : 70000);
		if (piece > CAP - have)
			piece = CAP - have;
		if (piece > size - fed)
			piece = size - fed;
		memcpy(buf + have, data + fed, piece);
		have += piece;
		fed += piece;
	}
	if (got != nall || st != end_all)
		abort();
	free(buf);
	return 0;
}
