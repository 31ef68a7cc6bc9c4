/*
 * fuzz_history_query.c - libFuzzer target: ?since= and ?step= of GET
 * /v1/memory/history (server/history.h), the input split at its first NUL
 * into since and step (none: step absent). Each pair is accepted or
 * refused; a refusal is INVALID_ARGUMENT naming since or step, with a
 * message that is valid UTF-8 (when the input is) and renders as a google.rpc.Status; an
 * accepted one answers an existing ring and a start no later than now.
 * Whatever RFC 3339 text parses, formatted again, reads back the same.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"
#include "common/utf8.h"
#include "handlers/api.h"
#include "server/history.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NOW (1796300000ull * 1000000000ull)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 2);
	const char *since, *step = NULL;
	struct ts_history_query q;
	struct ts_error err;
	size_t first;
	uint64_t ns;
	bool utf8;

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = text[size + 1] = '\0';
	since = text;
	first = strlen(text);
	/* the server has checked a query value is UTF-8 before: then so is the
	 * message, cut or not */
	utf8 = ts_utf8_check(text, size, NULL) == TS_UTF8_OK ||
	       (first < size && ts_utf8_check(text, first, NULL) == TS_UTF8_OK &&
	        ts_utf8_check(text + first + 1, size - first - 1, NULL) == TS_UTF8_OK);
	if (first < size)
		step = text + first + 1;
	ts_error_clear(&err);
	if (ts_history_query_parse(since, step, NOW, &q, &err) == TS_OK) {
		if (q.level < 0 || q.level >= TS_HISTORY_LEVELS || q.since_ns > NOW)
			abort();
	} else {
		json_t *j;
		char *out;

		if (err.status != TS_INVALID_ARGUMENT || !err.message[0] ||
		    (strcmp(err.reason, "BAD_SINCE") != 0 && strcmp(err.reason, "BAD_STEP") != 0) ||
		    (utf8 && ts_utf8_check(err.message, strlen(err.message), NULL) != TS_UTF8_OK))
			abort();
		j = ts_error_to_json(&err, 0);
		out = j ? json_dumps(j, JSON_COMPACT) : NULL;
		if (!out)
			abort();
		free(out);
		json_decref(j);
	}
	if (ts_parse_rfc3339(since, &ns)) {   /* formats and reads back to the microsecond */
		char again[40];
		uint64_t ns2;

		if (ts_format_rfc3339(again, sizeof again, ns) &&
		    (!ts_parse_rfc3339(again, &ns2) || ns2 != ns / 1000 * 1000))
			abort();
	}
	free(text);
	return 0;
}
