/*
 * fuzz_lease.c - libFuzzer target: the lease service's request parser
 * (server/lease_proto.c) on any frame payload. An accepted request is one
 * of the five ops with what that op needs (a valid array name, a rank within
 * TS_MAX_RANK and a shape whose bytes fit 64 bits, a lease id > 0); a
 * refused one carries a message that renders as a google.rpc.Status in
 * valid UTF-8. Nothing reads outside the payload, which has no terminator.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "handlers/api.h"
#include "server/lease_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ts_lease_req rq;
	struct ts_error err;
	uint64_t nbytes;
	char *buf = malloc(size ? size : 1);

	if (!buf)
		return 0;
	memcpy(buf, data, size);
	ts_error_clear(&err);
	if (ts_lease_parse(buf, size, &rq, &err) == TS_OK) {
		switch (rq.op) {
		case TS_LEASE_OP_CREATE:
			if (rq.rank < 0 || rq.rank > TS_MAX_RANK ||
			    !ts_shape_nbytes(rq.rank, rq.shape, rq.dtype, &nbytes))
				abort();
			/* fall through */
		case TS_LEASE_OP_LEASE:
			if (!ts_name_valid(rq.name))
				abort();
			break;
		case TS_LEASE_OP_PUBLISH:
		case TS_LEASE_OP_RELEASE:
			if (rq.lease == 0)
				abort();
			break;
		case TS_LEASE_OP_PING:
			break;
		default:
			abort();
		}
	} else {
		json_t *j = ts_error_to_json(&err, 0);
		const char *msg = json_string_value(json_object_get(json_object_get(j, "error"),
		                                                    "message"));

		if (!err.message[0] || err.status != TS_INVALID_ARGUMENT || !msg ||
		    ts_utf8_check(msg, strlen(msg), NULL) != TS_UTF8_OK)
			abort();
		json_decref(j);
	}
	free(buf);
	return 0;
}
