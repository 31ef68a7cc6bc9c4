/*
 * fuzz_npy.c - libFuzzer target: arbitrary bytes through the .npy preamble
 * and header parser, without a hint and with a bfloat16 hint. A header that
 * parses must describe a consistent array, and writing it back must give a
 * 64-byte aligned preamble that parses to the same dtype and shape. Small
 * Fortran-order or big-endian payloads are also reordered and swapped, so the
 * sanitizers watch those loops too.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_rewrite(const struct ts_npy_header *h)
{
	char buf[TS_NPY_HEADER_MAX];
	struct ts_npy_header back;
	struct ts_error err;
	size_t n = ts_npy_write_header(buf, sizeof buf, h->dtype, h->rank, h->shape);

	if (n == 0 || n % 64 != 0 || buf[n - 1] != '\n')
		abort();
	ts_error_clear(&err);
	if (ts_npy_parse_header(buf, n, &h->dtype, &back, &err) != TS_OK)
		abort();
	if (back.dtype != h->dtype || back.rank != h->rank || back.nbytes != h->nbytes ||
	    back.data_offset != n || back.fortran_order || back.big_endian ||
	    memcmp(back.shape, h->shape, sizeof(uint64_t) * (size_t)h->rank) != 0)
		abort();
}

/* Reorders and swaps the payload when it is present and small. */
static void touch_payload(const struct ts_npy_header *h, const uint8_t *data, size_t size)
{
	size_t esz = ts_dtype_size(h->dtype);
	unsigned char *dst;

	if (h->nbytes == 0 || h->nbytes > 1 << 16 || size - h->data_offset < h->nbytes)
		return;
	dst = malloc(h->nbytes);
	if (!dst)
		return;
	if (h->fortran_order)
		ts_npy_fortran_to_c(dst, data + h->data_offset, esz, h->rank, h->shape);
	else
		memcpy(dst, data + h->data_offset, h->nbytes);
	if (h->big_endian)
		ts_byteswap(dst, h->nbytes / esz, esz);
	free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const enum ts_dtype bf16 = TS_DT_BFLOAT16;
	const enum ts_dtype *hints[2] = {NULL, &bf16};

	for (int i = 0; i < 2; i++) {
		struct ts_npy_header h;
		struct ts_error err;
		uint64_t off, nbytes;
		ts_status st;

		ts_error_clear(&err);
		st = ts_npy_preamble(data, size, &off, &err);
		if (st == TS_OK && (off < 10 || off > TS_NPY_PREAMBLE_MAX))
			abort();
		ts_error_clear(&err);
		st = ts_npy_parse_header(data, size, hints[i], &h, &err);
		if (st != TS_OK) {
			if (err.status != st || !err.message[0] || !err.reason[0])
				abort();
			continue;
		}
		if (h.rank < 0 || h.rank > TS_MAX_RANK || h.data_offset > size ||
		    (unsigned)h.dtype >= TS_DT_COUNT || (h.dtype_from_hint && !hints[i]) ||
		    !ts_shape_nbytes(h.rank, h.shape, h.dtype, &nbytes) || nbytes != h.nbytes)
			abort();
		check_rewrite(&h);
		touch_payload(&h, data, size);
	}
	return 0;
}
