/*
 * fuzz_rows.c - libFuzzer target for the rows of axis 0 (:gather, :step):
 * the first two bytes choose the axis size (0..65535), the rest is parsed as
 * any JSON value and handed to ts_rows_parse. A refusal must carry one of
 * the documented reasons and a message naming the field; rows that parse
 * lie inside the axis, are at most TS_ROWS_MAX, and a list keeps its length.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_failure(ts_status st, const struct ts_error *err)
{
	static const char *const reasons[] = {"BAD_ROWS", "BAD_INDEX", "INDEX_OUT_OF_RANGE",
	                                      "OUT_OF_MEMORY"};
	bool known = false;

	if (st != err->status || !err->message[0])
		abort();
	for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++)
		known = known || strcmp(err->reason, reasons[i]) == 0;
	if (!known)
		abort();
	if (strcmp(err->reason, "BAD_ROWS") == 0 && !strstr(err->message, "fz"))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint64_t dim0, *rows = NULL;
	struct ts_error err;
	json_error_t jerr;
	json_t *j;
	size_t n = 0;
	ts_status st;

	if (size < 2)
		return 0;
	dim0 = (uint64_t)data[0] | (uint64_t)data[1] << 8;
	j = json_loadb((const char *)data + 2, size - 2, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
	if (!j)
		return 0;
	ts_error_clear(&err);
	st = ts_rows_parse(j, "fz", dim0, &rows, &n, &err);
	if (st != TS_OK) {
		check_failure(st, &err);
		if (rows)
			abort();
	} else {
		if (!rows || n > TS_ROWS_MAX || (json_is_array(j) && n != json_array_size(j)))
			abort();
		for (size_t i = 0; i < n; i++)
			if (rows[i] >= dim0)
				abort();
	}
	free(rows);
	json_decref(j);
	return 0;
}
