/*
 * fuzz_safetensors.c - libFuzzer target: arbitrary bytes through the
 * safetensors length and header parser. A header that parses must tile its
 * data buffer in order; building a header from its tensors and metadata must
 * give one that parses back to the same tensors at the same offsets.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_tiling(const struct ts_st_header *h)
{
	uint64_t at = 0, nbytes;

	for (size_t i = 0; i < h->ntensors; i++) {
		const struct ts_st_tensor *t = &h->tensors[i];

		if (!t->name || t->begin != at || t->end < t->begin ||
		    !ts_shape_nbytes(t->rank, t->shape, t->dtype, &nbytes) || t->end - t->begin != nbytes)
			abort();
		at = t->end;
	}
	if (at != h->data_len)
		abort();
}

static bool same_tensor(const struct ts_st_tensor *a, const struct ts_st_tensor *b)
{
	return strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->rank == b->rank &&
	       memcmp(a->shape, b->shape, sizeof(uint64_t) * (size_t)a->rank) == 0 &&
	       a->begin == b->begin && a->end == b->end;
}

/* Tensors in offset order laid out again land at the same offsets. */
static void check_rebuild(const struct ts_st_header *h)
{
	struct ts_st_tensor *copy = malloc(sizeof *copy * (h->ntensors ? h->ntensors : 1));
	struct ts_st_header back;
	struct ts_error err;
	char *out = NULL;
	size_t out_len = 0;
	uint64_t n;

	if (!copy)
		return;
	memcpy(copy, h->tensors, sizeof *copy * h->ntensors);
	ts_error_clear(&err);
	if (ts_st_build_header(copy, h->ntensors, h->metadata, &out, &out_len, &err) != TS_OK)
		abort();
	if (out_len % 8 != 0 || ts_st_header_len(out, &n, &err) != TS_OK || 8 + n != out_len)
		abort();
	if (ts_st_parse_header(out + 8, (size_t)n, &back, &err) != TS_OK)
		abort();
	if (back.ntensors != h->ntensors || back.data_len != h->data_len ||
	    (h->metadata == NULL) != (back.metadata == NULL) ||
	    (h->metadata && !json_equal(h->metadata, back.metadata)))
		abort();
	for (size_t i = 0; i < h->ntensors; i++)
		if (!same_tensor(&copy[i], &h->tensors[i]) || !same_tensor(&back.tensors[i], &h->tensors[i]))
			abort();
	ts_st_header_release(&back);
	free(out);
	free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ts_st_header h;
	struct ts_error err;
	uint64_t n;

	ts_error_clear(&err);
	if (ts_st_parse_buffer(data, size, &h, &err) == TS_OK) {
		check_tiling(&h);
		if (8 + h.header_len + h.data_len != size)
			abort();
		ts_st_header_release(&h);
	} else if (err.status == TS_OK || !err.message[0]) {
		abort();
	}
	if (size < 8)
		return 0;
	ts_error_clear(&err);
	if (ts_st_header_len(data, &n, &err) != TS_OK || n > size - 8)
		return 0;
	if (ts_st_parse_header((const char *)data + 8, (size_t)n, &h, &err) != TS_OK)
		return 0;
	check_tiling(&h);
	ts_st_check_total(&h, size, &err);
	check_rebuild(&h);
	ts_st_header_release(&h);
	return 0;
}
