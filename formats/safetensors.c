/*
 * safetensors.c - reading, validating and writing safetensors headers.
 *
 * jansson parses the JSON (rejecting duplicate keys and bad UTF-8); this file
 * then checks each tensor entry on its own, sorts the tensors by offset and
 * checks that they tile the data buffer, so the first problem found is
 * reported with the tensor it belongs to. The writer builds the same JSON
 * with jansson and pads it like the reference writer.
 */
#include "formats/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REASON "BAD_SAFETENSORS_HEADER"
#define LEN_BYTES 8
#define NAME_SHOW 64 /* bytes of a tensor name quoted in a message */

/* Bad input, through the one helper (common/status.h). */
#define BAD(err, ...) ts_error_bad((err), REASON, "safetensors header", __VA_ARGS__)

/* Out of memory, through the one helper; the format is a string literal. */
#define OUT_OF_MEMORY(err, ...) \
	ts_error_oom((err), "safetensors header: out of memory for " __VA_ARGS__)

/* A tensor name (valid UTF-8) for a message: control bytes as \xNN, cut at a
 * character boundary with "..." past NAME_SHOW bytes. Returns buf, which
 * holds at least NAME_SHOW * 4 + 4 bytes. */
static const char *show_name(char *buf, const char *name)
{
	size_t o = 0, i = 0;

	for (; name[i] && i < NAME_SHOW; i++) {
		unsigned char ch = (unsigned char)name[i];

		if (ch < 0x20 || ch == 0x7f || ch == '\\')
			o += (size_t)sprintf(buf + o, "\\x%02x", ch);
		else
			buf[o++] = (char)ch;
	}
	if (name[i]) {
		/* back off to the start of a character, then mark the cut */
		while (o > 0 && ((unsigned char)buf[o - 1] & 0xc0) == 0x80)
			o--;
		if (o > 0 && ((unsigned char)buf[o - 1] & 0xc0) == 0xc0)
			o--;
		memcpy(buf + o, "...", 3);
		o += 3;
	}
	buf[o] = '\0';
	return buf;
}

#define NAME_BUF (NAME_SHOW * 4 + 8)

/* "[2, 3]" for messages, cut short past cap. */
static const char *show_shape(char *buf, size_t cap, int rank, const uint64_t *shape)
{
	size_t o = (size_t)snprintf(buf, cap, "[");

	for (int i = 0; i < rank && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%llu", i ? ", " : "",
		                      (unsigned long long)shape[i]);
	if (o < cap)
		snprintf(buf + o, cap - o, "]");
	return buf;
}

ts_status ts_st_header_len(const void *first8, uint64_t *n, struct ts_error *err)
{
	const unsigned char *b = first8;
	uint64_t v = 0;

	for (int i = LEN_BYTES - 1; i >= 0; i--)
		v = v << 8 | b[i];
	/* the value is not shown: for a file that is not safetensors it would
	 * spell out the file's first 8 bytes */
	if (v > TS_ST_HEADER_MAX)
		return BAD(err, "the header length in the first 8 bytes exceeds the %llu-byte limit "
		           "(is it a safetensors file?)", TS_ST_HEADER_MAX);
	*n = v;
	return TS_OK;
}

/* A JSON integer in [0, 2^63) into *out; false otherwise. */
static bool get_u64(const json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}

/* The JSON value, briefly, for a message ("-3", "1.5", "a string"). */
static const char *show_value(char *buf, size_t cap, const json_t *v)
{
	if (json_is_integer(v))
		snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
	else if (json_is_real(v))
		snprintf(buf, cap, "%g", json_real_value(v));
	else if (json_is_string(v))
		snprintf(buf, cap, "a string");
	else if (json_is_array(v))
		snprintf(buf, cap, "an array");
	else if (json_is_object(v))
		snprintf(buf, cap, "an object");
	else if (json_is_boolean(v))
		snprintf(buf, cap, "%s", json_is_true(v) ? "true" : "false");
	else
		snprintf(buf, cap, "null");
	return buf;
}

static ts_status parse_dtype(const char *nm, const json_t *v, struct ts_st_tensor *t,
                             struct ts_error *err)
{
	char shown[NAME_BUF];

	if (!json_is_string(v))
		return BAD(err, "tensor '%s': dtype must be a string", nm);
	if (!ts_dtype_from_safetensors(json_string_value(v), &t->dtype))
		return BAD(err, "tensor '%s': unknown dtype '%s'", nm,
		           show_name(shown, json_string_value(v)));
	return TS_OK;
}

static ts_status parse_shape(const char *nm, const json_t *v, struct ts_st_tensor *t,
                             struct ts_error *err)
{
	char val[64];
	size_t i;
	json_t *d;

	if (!json_is_array(v))
		return BAD(err, "tensor '%s': shape must be an array", nm);
	if (json_array_size(v) > TS_MAX_RANK)
		return BAD(err, "tensor '%s': rank %zu exceeds the maximum of %d", nm,
		           json_array_size(v), TS_MAX_RANK);
	json_array_foreach(v, i, d) {
		if (!get_u64(d, &t->shape[i]))
			return BAD(err, "tensor '%s': shape entry %zu (%s) is not a non-negative integer",
			           nm, i, show_value(val, sizeof val, d));
	}
	t->rank = (int)json_array_size(v);
	return TS_OK;
}

static ts_status parse_offsets(const char *nm, const json_t *v, struct ts_st_tensor *t,
                               struct ts_error *err)
{
	char a[64], b[64];

	if (!json_is_array(v) || json_array_size(v) != 2)
		return BAD(err, "tensor '%s': data_offsets must be an array [begin, end]", nm);
	if (!get_u64(json_array_get(v, 0), &t->begin) || !get_u64(json_array_get(v, 1), &t->end))
		return BAD(err, "tensor '%s': data_offsets [%s, %s] are not non-negative integers", nm,
		           show_value(a, sizeof a, json_array_get(v, 0)),
		           show_value(b, sizeof b, json_array_get(v, 1)));
	return TS_OK;
}

/* One tensor entry, checked on its own; t->name is set only on success. */
static ts_status parse_tensor(const char *name, const json_t *v, struct ts_st_tensor *t,
                              struct ts_error *err)
{
	static const char *const fields[3] = {"dtype", "shape", "data_offsets"};
	char nm[NAME_BUF], shp[128];
	const json_t *f[3];
	const char *key;
	json_t *fv;
	uint64_t nbytes;
	ts_status st;

	show_name(nm, name);
	if (!json_is_object(v))
		return BAD(err, "tensor '%s' is not an object", nm);
	json_object_foreach((json_t *)v, key, fv) {
		if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets")) {
			char k[NAME_BUF];

			return BAD(err, "tensor '%s': unknown field '%s'", nm, show_name(k, key));
		}
	}
	for (int i = 0; i < 3; i++) {
		f[i] = json_object_get(v, fields[i]);
		if (!f[i])
			return BAD(err, "tensor '%s': missing field '%s'", nm, fields[i]);
	}
	memset(t, 0, sizeof *t);
	st = parse_dtype(nm, f[0], t, err);
	if (st == TS_OK)
		st = parse_shape(nm, f[1], t, err);
	if (st == TS_OK)
		st = parse_offsets(nm, f[2], t, err);
	if (st != TS_OK)
		return st;
	if (t->end < t->begin)
		return BAD(err, "tensor '%s': data_offsets [%llu, %llu] are reversed", nm,
		           (unsigned long long)t->begin, (unsigned long long)t->end);
	if (!ts_shape_nbytes(t->rank, t->shape, t->dtype, &nbytes))
		return BAD(err, "tensor '%s': %s shape %s needs more than 2^64 bytes", nm,
		           ts_dtype_safetensors(t->dtype), show_shape(shp, sizeof shp, t->rank, t->shape));
	if (t->end - t->begin != nbytes)
		return BAD(err, "tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but %s shape %s "
		           "needs %llu", nm, (unsigned long long)t->begin, (unsigned long long)t->end,
		           (unsigned long long)(t->end - t->begin), ts_dtype_safetensors(t->dtype),
		           show_shape(shp, sizeof shp, t->rank, t->shape), (unsigned long long)nbytes);
	t->name = strdup(name);
	if (!t->name)
		return OUT_OF_MEMORY(err, "the name of tensor '%s'", nm);
	return TS_OK;
}

/* "__metadata__": null, or an object whose values are all strings. */
static ts_status parse_metadata(const json_t *v, json_t **out, struct ts_error *err)
{
	char k[NAME_BUF], val[64];
	const char *key;
	json_t *mv;

	if (json_is_null(v))
		return TS_OK;
	if (!json_is_object(v))
		return BAD(err, "__metadata__ must be an object of strings, not %s",
		           show_value(val, sizeof val, v));
	json_object_foreach((json_t *)v, key, mv) {
		if (!json_is_string(mv))
			return BAD(err, "__metadata__ value of '%s' is %s, not a string",
			           show_name(k, key), show_value(val, sizeof val, mv));
	}
	*out = json_incref((json_t *)v);
	return TS_OK;
}

static int by_offsets(const void *a, const void *b)
{
	const struct ts_st_tensor *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* The sorted tensors must tile [0, data_len) with no gap and no overlap. */
static ts_status check_layout(struct ts_st_header *h, struct ts_error *err)
{
	char a[NAME_BUF], b[NAME_BUF];
	uint64_t at = 0;

	for (size_t i = 0; i < h->ntensors; i++) {
		const struct ts_st_tensor *t = &h->tensors[i], *prev = i ? t - 1 : NULL;

		if (!prev && t->begin != 0)
			return BAD(err, "tensor '%s' begins at %llu: the first tensor must begin at 0",
			           show_name(a, t->name), (unsigned long long)t->begin);
		if (prev && t->begin > at)
			return BAD(err, "gap of %llu bytes between tensor '%s' (ends at %llu) and "
			           "tensor '%s' (begins at %llu)", (unsigned long long)(t->begin - at),
			           show_name(a, prev->name), (unsigned long long)at,
			           show_name(b, t->name), (unsigned long long)t->begin);
		if (prev && t->begin < at)
			return BAD(err, "tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap",
			           show_name(a, prev->name), (unsigned long long)prev->begin,
			           (unsigned long long)prev->end, show_name(b, t->name),
			           (unsigned long long)t->begin, (unsigned long long)t->end);
		at = t->end;
	}
	h->data_len = at;
	return TS_OK;
}

ts_status ts_st_parse_header(const char *json, size_t n, struct ts_st_header *out,
                             struct ts_error *err)
{
	struct ts_st_header h;
	json_error_t jerr;
	json_t *root, *v;
	const char *key;
	size_t cap;
	ts_status st = TS_OK;

	memset(&h, 0, sizeof h);
	if (n > TS_ST_HEADER_MAX)
		return BAD(err, "header length %zu exceeds the %llu-byte limit", n, TS_ST_HEADER_MAX);
	if (n == 0 || json[0] != '{')
		return BAD(err, "header does not start with '{'");
	root = json_loadb(json, n, JSON_REJECT_DUPLICATES, &jerr);
	/* jansson leaves the text empty when it cannot even start for lack of memory */
	if (!root && (json_error_code(&jerr) == json_error_out_of_memory || !jerr.text[0]))
		return OUT_OF_MEMORY(err, "the JSON of a %zu-byte header", n);
	if (!root)
		return BAD(err, "header is not valid JSON: %s (byte %d)", jerr.text, jerr.position);
	if (!json_is_object(root)) {
		st = BAD(err, "header is not a JSON object");
		goto out_root;
	}
	h.header_len = n;
	cap = json_object_size(root);
	h.tensors = calloc(cap ? cap : 1, sizeof *h.tensors);
	if (!h.tensors) {
		st = OUT_OF_MEMORY(err, "a table of %zu tensors", cap);
		goto out_root;
	}
	json_object_foreach(root, key, v) {
		if (strcmp(key, "__metadata__") == 0)
			st = parse_metadata(v, &h.metadata, err);
		else if ((st = parse_tensor(key, v, &h.tensors[h.ntensors], err)) == TS_OK)
			h.ntensors++;
		if (st != TS_OK)
			goto out_release;
	}
	qsort(h.tensors, h.ntensors, sizeof *h.tensors, by_offsets);
	st = check_layout(&h, err);
	if (st != TS_OK)
		goto out_release;
	*out = h;
	goto out_root;
out_release:
	ts_st_header_release(&h);
out_root:
	json_decref(root);
	return st;
}

void ts_st_header_release(struct ts_st_header *h)
{
	if (!h)
		return;
	for (size_t i = 0; i < h->ntensors; i++)
		free(h->tensors[i].name);
	free(h->tensors);
	json_decref(h->metadata);
	memset(h, 0, sizeof *h);
}

ts_status ts_st_check_total(const struct ts_st_header *h, uint64_t total_len,
                            struct ts_error *err)
{
	uint64_t want = LEN_BYTES + h->header_len;
	ts_status st;

	if (h->data_len > UINT64_MAX - want) {
		st = BAD(err, "header describes %llu data bytes, more than any file holds",
		         (unsigned long long)h->data_len);
		goto out_meta;
	}
	want += h->data_len;
	if (total_len == want)
		return TS_OK;
	if (total_len < want)
		st = BAD(err, "file is truncated: %llu bytes, but 8 + %llu (header) + %llu (data) = %llu "
		         "are needed", (unsigned long long)total_len, (unsigned long long)h->header_len,
		         (unsigned long long)h->data_len, (unsigned long long)want);
	else
		st = BAD(err, "%llu trailing bytes: file is %llu bytes, but 8 + %llu (header) + %llu "
		         "(data) = %llu", (unsigned long long)(total_len - want),
		         (unsigned long long)total_len, (unsigned long long)h->header_len,
		         (unsigned long long)h->data_len, (unsigned long long)want);
out_meta:
	ts_error_meta_u64(err, "expected_bytes", want);
	ts_error_meta_u64(err, "actual_bytes", total_len);
	return st;
}

ts_status ts_st_parse_buffer(const void *buf, size_t len, struct ts_st_header *out,
                             struct ts_error *err)
{
	struct ts_st_header h;
	uint64_t n = 0;
	ts_status st;

	if (len < LEN_BYTES)
		return BAD(err, "file is %zu bytes, too short for the 8-byte header length", len);
	st = ts_st_header_len(buf, &n, err);
	if (st != TS_OK)
		return st;
	if (n > len - LEN_BYTES)
		return BAD(err, "the header length in the first 8 bytes exceeds the %zu bytes that "
		           "follow it", len - LEN_BYTES);
	st = ts_st_parse_header((const char *)buf + LEN_BYTES, (size_t)n, &h, err);
	if (st != TS_OK)
		return st;
	st = ts_st_check_total(&h, len, err);
	if (st != TS_OK) {
		ts_st_header_release(&h);
		return st;
	}
	*out = h;
	return TS_OK;
}

/* Strict UTF-8 (no overlong forms, surrogates or code points past
 * U+10FFFF), as jansson requires of object keys. */
static bool utf8_valid(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	while (*p) {
		unsigned c = *p, n, cp;

		if (c < 0x80) {
			p++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			n = 1, cp = c & 0x1f;
		else if (c >= 0xe0 && c <= 0xef)
			n = 2, cp = c & 0x0f;
		else if (c >= 0xf0 && c <= 0xf4)
			n = 3, cp = c & 0x07;
		else
			return false;
		for (unsigned i = 1; i <= n; i++) {
			if ((p[i] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (p[i] & 0x3f);
		}
		if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
		    (n == 3 && (cp < 0x10000 || cp > 0x10ffff)))
			return false;
		p += n + 1;
	}
	return true;
}

/* Checks one tensor for the writer and returns its byte count in *nbytes. */
static ts_status check_for_build(const struct ts_st_tensor *t, size_t i, uint64_t *nbytes,
                                 struct ts_error *err)
{
	char nm[NAME_BUF], shp[128];

	if (!t->name)
		return BAD(err, "tensor %zu has no name", i);
	show_name(nm, t->name);
	if (strcmp(t->name, "__metadata__") == 0)
		return BAD(err, "tensor %zu: the name '__metadata__' is reserved", i);
	if (!utf8_valid(t->name))
		return BAD(err, "tensor %zu: name '%s' is not valid UTF-8", i, nm);
	if (!ts_dtype_safetensors(t->dtype))
		return BAD(err, "tensor '%s': dtype %d is not a known dtype", nm, (int)t->dtype);
	if (t->rank < 0 || t->rank > TS_MAX_RANK)
		return BAD(err, "tensor '%s': rank %d is outside [0, %d]", nm, t->rank, TS_MAX_RANK);
	for (int d = 0; d < t->rank; d++)
		if (t->shape[d] > (uint64_t)INT64_MAX)
			return BAD(err, "tensor '%s': shape entry %d (%llu) exceeds 2^63 - 1", nm, d,
			           (unsigned long long)t->shape[d]);
	if (!ts_shape_nbytes(t->rank, t->shape, t->dtype, nbytes))
		return BAD(err, "tensor '%s': %s shape %s needs more than 2^64 bytes", nm,
		           ts_dtype_safetensors(t->dtype), show_shape(shp, sizeof shp, t->rank, t->shape));
	return TS_OK;
}

/* {"dtype": ..., "shape": [...], "data_offsets": [begin, end]}, or NULL. */
static json_t *tensor_entry(const struct ts_st_tensor *t, uint64_t begin, uint64_t end)
{
	json_t *shape = json_array();

	for (int d = 0; shape && d < t->rank; d++)
		if (json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) != 0) {
			json_decref(shape);
			return NULL;
		}
	if (!shape)
		return NULL;
	return json_pack("{s:s, s:o, s:[I, I]}", "dtype", ts_dtype_safetensors(t->dtype),
	                 "shape", shape, "data_offsets", (json_int_t)begin, (json_int_t)end);
}

static ts_status check_metadata_for_build(const json_t *metadata, struct ts_error *err)
{
	char k[NAME_BUF], val[64];
	const char *key;
	json_t *mv;

	if (!json_is_object(metadata))
		return BAD(err, "__metadata__ must be an object of strings, not %s",
		           show_value(val, sizeof val, metadata));
	json_object_foreach((json_t *)metadata, key, mv) {
		if (!json_is_string(mv))
			return BAD(err, "__metadata__ value of '%s' is %s, not a string",
			           show_name(k, key), show_value(val, sizeof val, mv));
	}
	return TS_OK;
}

/* Wraps the JSON text as length + text + space padding to a multiple of 8. */
static ts_status frame(const char *text, size_t n, size_t ntensors, char **out,
                       size_t *out_len, struct ts_error *err)
{
	size_t padded = n + (LEN_BYTES - n % LEN_BYTES) % LEN_BYTES;
	char *buf = malloc(LEN_BYTES + padded);

	if (!buf)
		return OUT_OF_MEMORY(err, "a %zu-byte header of %zu tensors", LEN_BYTES + padded, ntensors);
	for (int i = 0; i < LEN_BYTES; i++)
		buf[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
	memcpy(buf + LEN_BYTES, text, n);
	memset(buf + LEN_BYTES + n, ' ', padded - n);
	*out = buf;
	*out_len = LEN_BYTES + padded;
	return TS_OK;
}

ts_status ts_st_build_header(struct ts_st_tensor *tensors, size_t n, const json_t *metadata,
                             char **out, size_t *out_len, struct ts_error *err)
{
	char nm[NAME_BUF];
	json_t *root, *entry;
	char *text = NULL;
	uint64_t at = 0, nbytes;
	ts_status st = TS_OK;

	root = json_object();
	if (!root)
		return OUT_OF_MEMORY(err, "a header of %zu tensors", n);
	if (metadata) {
		st = check_metadata_for_build(metadata, err);
		if (st != TS_OK)
			goto out_root;
		if (json_object_set_new(root, "__metadata__", json_deep_copy(metadata)) != 0) {
			st = OUT_OF_MEMORY(err, "a copy of __metadata__");
			goto out_root;
		}
	}
	for (size_t i = 0; i < n; i++) {
		st = check_for_build(&tensors[i], i, &nbytes, err);
		if (st != TS_OK)
			goto out_root;
		show_name(nm, tensors[i].name);
		if (json_object_get(root, tensors[i].name)) {
			st = BAD(err, "duplicate tensor name '%s'", nm);
			goto out_root;
		}
		if (nbytes > (uint64_t)INT64_MAX - at) {
			st = BAD(err, "tensor '%s': data_offsets would pass 2^63 - 1", nm);
			goto out_root;
		}
		entry = tensor_entry(&tensors[i], at, at + nbytes);
		if (!entry) {
			st = OUT_OF_MEMORY(err, "the entry of tensor '%s'", nm);
			goto out_root;
		}
		if (json_object_set_new(root, tensors[i].name, entry) != 0) {
			st = OUT_OF_MEMORY(err, "the entry of tensor '%s'", nm);
			goto out_root;
		}
		at += nbytes;
	}
	text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	if (!text) {
		st = OUT_OF_MEMORY(err, "the text of a header of %zu tensors", n);
		goto out_root;
	}
	st = frame(text, strlen(text), n, out, out_len, err);
	if (st != TS_OK)
		goto out_text;
	at = 0;
	for (size_t i = 0; i < n; i++) {
		ts_shape_nbytes(tensors[i].rank, tensors[i].shape, tensors[i].dtype, &nbytes);
		tensors[i].begin = at;
		tensors[i].end = at += nbytes;
	}
out_text:
	free(text);
out_root:
	json_decref(root);
	return st;
}
