/*
 * fuzz_index.c - libFuzzer target for index expressions: the first bytes
 * choose a small parent (rank 0..4, sizes 0..7, element size 1..8), the rest
 * is the expression. A failure must come with a known code, reason and
 * message; a selection must walk as runs inside the parent whose bytes add
 * up to elems * elem_size and whose number is ts_selection_nruns().
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_failure(const struct ts_error *err, ts_status st)
{
	if (st != err->status || !err->message[0])
		abort();
	if (st == TS_OUT_OF_RANGE ? strcmp(err->reason, "INDEX_OUT_OF_RANGE") != 0
	                          : st != TS_INVALID_ARGUMENT || strcmp(err->reason, "BAD_INDEX") != 0)
		abort();
}

static void check_runs(const struct ts_selection *s, size_t elem, uint64_t parent_bytes)
{
	struct ts_run_iter it;
	uint64_t off, len, total = 0, nruns = 0, out_elems = 1, c_off, c_len;

	for (int i = 0; i < s->out_rank; i++)
		out_elems *= s->out_shape[i];
	if (out_elems != ts_selection_elems(s))
		abort();
	ts_run_iter_init(&it, s, elem);
	while (ts_run_iter_next(&it, &off, &len)) {
		if (len == 0 || off > parent_bytes || len > parent_bytes - off)
			abort();
		total += len;
		nruns++;
	}
	if (total != ts_selection_elems(s) * elem || nruns != ts_selection_nruns(s, elem))
		abort();
	if (ts_selection_contiguous(s, elem, &c_off, &c_len) != (nruns <= 1) ||
	    (nruns <= 1 && c_len != total))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint64_t shape[4], parent = 1;
	struct ts_selection s;
	struct ts_error err;
	size_t elem, head;
	int rank;
	char *expr;
	ts_status st;

	if (size < 1)
		return 0;
	rank = data[0] % 5;
	elem = (size_t)1 << ((data[0] >> 3) % 4);
	head = 1 + (size_t)rank;
	if (size < head)
		return 0;
	for (int i = 0; i < rank; i++) {
		shape[i] = data[1 + i] % 8;
		parent *= shape[i];
	}
	expr = malloc(size - head + 1);
	if (!expr)
		return 0;
	memcpy(expr, data + head, size - head);
	expr[size - head] = '\0';
	ts_error_clear(&err);
	st = ts_index_parse(expr, rank, shape, &s, &err);
	if (st != TS_OK)
		check_failure(&err, st);
	else
		check_runs(&s, elem, parent * elem);
	free(expr);
	return 0;
}
