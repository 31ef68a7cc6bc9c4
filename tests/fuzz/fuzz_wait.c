/*
 * fuzz_wait.c - libFuzzer target: the timeout of a :wait from any ?timeout=
 * text and any body. The answer is a timeout within 0..3600 s, or a
 * refusal with a message that renders as a google.rpc.Status in valid
 * UTF-8 whatever it echoes; nothing reads outside the body.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "handlers/handlers.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ts_error err;
	uint64_t ns = 0;
	size_t qlen;
	char *query = NULL, *body;
	json_t *j;

	if (size < 1)
		return 0;
	/* first byte: 0 no query, else the query's length (NUL-terminated copy) */
	qlen = data[0];
	if (qlen > size - 1)
		qlen = size - 1;
	if (data[0]) {
		query = malloc(qlen + 1);
		if (!query)
			return 0;
		memcpy(query, data + 1, qlen);
		query[qlen] = '\0';
	}
	/* the body exactly as long as it is: no terminator to lean on */
	body = malloc(size - 1 - qlen + 1);
	if (!body) {
		free(query);
		return 0;
	}
	memcpy(body, data + 1 + qlen, size - 1 - qlen);
	ts_error_clear(&err);
	if (ts_h_wait_timeout(query, body, size - 1 - qlen, &ns, &err) == TS_OK) {
		if (ns > 3600ull * 1000000000ull)
			abort();
	} else {
		const char *msg;
		char *text;

		if (!err.message[0])
			abort();
		/* whatever bytes it echoes, the error renders, as valid UTF-8 */
		j = ts_error_to_json(&err, 0);
		text = j ? json_dumps(j, JSON_COMPACT) : NULL;
		msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
		if (!text || !msg || ts_utf8_check(msg, strlen(msg), NULL) != TS_UTF8_OK)
			abort();
		free(text);
		json_decref(j);
	}
	free(body);
	free(query);
	return 0;
}
