/*
 * npy.c - reading and writing .npy preambles.
 *
 * The header is read by a small recursive-descent parser for the subset of
 * Python literals numpy writes: a dict of quoted string keys whose values are
 * a quoted string (descr), True/False (fortran_order) and a tuple of integers
 * (shape). Whitespace may appear between any two tokens. The parser works on
 * bytes: every string it accepts is ASCII, so latin-1 (1.0, 2.0) and UTF-8
 * (3.0) headers read alike. Every refusal names the key, value or byte offset
 * (counted from the start of the file) that broke the rules.
 */
#include "formats/npy.h"

#include <stdio.h>
#include <string.h>

#define REASON "BAD_NPY_HEADER"
#define MAGIC "\x93NUMPY"
#define MAGIC_LEN 6
#define ARRAY_ALIGN 64
#define GROWTH_DIGITS 21 /* numpy leaves room for shape[0] to grow to 21 digits */
#define STR_KEEP 32      /* longest string kept; no accepted string is longer */
#define SHOW_MAX 48      /* longest excerpt of input quoted in a message */

/* Where the parser stands in the header text. */
struct cursor {
	const char *p;
	const char *end;
	const char *file;  /* start of the file: offsets in messages count from it */
	struct ts_error *err;
};

/* A quoted string as read: its first STR_KEEP-1 bytes and its whole length. */
struct pystr {
	char s[STR_KEEP];
	size_t len;
};

/* Bad input, through the one helper (common/status.h). */
#define BAD(err, ...) ts_error_bad((err), REASON, "npy header", __VA_ARGS__)

static ts_status need_more(struct ts_error *err, size_t have, uint64_t need)
{
	ts_error_set(err, TS_UNAVAILABLE, "NEED_MORE_BYTES",
	             "npy header: need more bytes (have %zu, need %llu)", have,
	             (unsigned long long)need);
	ts_error_meta_u64(err, "need_bytes", need);
	return TS_UNAVAILABLE;
}

/* Quotes up to n bytes of s for a message: printable ASCII as is, the rest
 * as \xNN, cut short with "..." past SHOW_MAX. Returns buf. */
static const char *show(char *buf, size_t cap, const char *s, size_t n)
{
	size_t o = 0;

	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];

		if (o + 8 >= cap || i >= SHOW_MAX) {
			memcpy(buf + o, "...", 4);
			return buf;
		}
		if (ch >= 0x20 && ch < 0x7f && ch != '\\')
			buf[o++] = (char)ch;
		else
			o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", ch);
	}
	buf[o] = '\0';
	return buf;
}

static unsigned long long offset(const struct cursor *c)
{
	return (unsigned long long)(c->p - c->file);
}

static int peek(const struct cursor *c)
{
	return c->p < c->end ? (unsigned char)*c->p : -1;
}

static void skip_ws(struct cursor *c)
{
	while (c->p < c->end &&
	       (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r' || *c->p == '\f'))
		c->p++;
}

static bool is_word_char(int ch)
{
	return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
	       ch == '_' || ch == '.';
}

/* The token at the cursor (a run of word characters, or else one byte),
 * quoted for a message; "end of header" at the end. */
static const char *show_token(char *buf, size_t cap, const struct cursor *c)
{
	const char *q = c->p;

	if (q >= c->end) {
		snprintf(buf, cap, "end of header");
		return buf;
	}
	while (q < c->end && is_word_char((unsigned char)*q))
		q++;
	if (q == c->p)
		q++;
	buf[0] = '\'';
	show(buf + 1, cap - 2, c->p, (size_t)(q - c->p));
	strcat(buf, "'");
	return buf;
}

static const char *show_str(char *buf, size_t cap, const struct pystr *s)
{
	show(buf, cap, s->s, s->len < STR_KEEP ? s->len : STR_KEEP - 1);
	if (s->len >= STR_KEEP && strlen(buf) + 4 <= cap)
		strcat(buf, "...");
	return buf;
}

static bool str_is(const struct pystr *s, const char *lit)
{
	size_t n = strlen(lit);

	return s->len == n && n < STR_KEEP && memcmp(s->s, lit, n) == 0;
}

/* A Python string literal in either quote, without escapes. */
static ts_status parse_string(struct cursor *c, struct pystr *out)
{
	const char *start = c->p;
	char quote = *c->p++;

	out->len = 0;
	while (c->p < c->end && *c->p != quote && *c->p != '\n') {
		if (*c->p == '\\')
			return BAD(c->err, "escape sequence in the string at offset %llu is not supported",
			           (unsigned long long)(start - c->file));
		if (out->len < STR_KEEP - 1)
			out->s[out->len] = *c->p;
		out->len++;
		c->p++;
	}
	out->s[out->len < STR_KEEP ? out->len : STR_KEEP - 1] = '\0';
	if (peek(c) != quote)
		return BAD(c->err, "unterminated string starting at offset %llu",
		           (unsigned long long)(start - c->file));
	c->p++;
	return TS_OK;
}

/* One shape entry: an optionally signed decimal integer, optional 'L'. */
static ts_status parse_dim(struct cursor *c, int i, uint64_t *out)
{
	char tok[SHOW_MAX + 16];
	const char *start = c->p, *digits;
	bool neg = false, overflow = false;
	uint64_t v = 0;

	if (peek(c) == '-' || peek(c) == '+') {
		neg = *c->p == '-';
		c->p++;
		skip_ws(c);
	}
	digits = c->p;
	while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
		unsigned d = (unsigned)(*c->p - '0');

		if (v > (UINT64_MAX - d) / 10)
			overflow = true;
		else
			v = v * 10 + d;
		c->p++;
	}
	if (c->p > digits && (peek(c) == 'L' || peek(c) == 'l'))
		c->p++;
	if (c->p == start && c->p == c->end)
		return BAD(c->err, "shape entry %d is missing: the header ends", i);
	if (c->p == digits || is_word_char(peek(c))) {
		while (c->p < c->end && is_word_char((unsigned char)*c->p))
			c->p++;
		if (c->p == start)
			c->p++;      /* one non-word byte, which exists: start < end */
		return BAD(c->err, "shape entry %d ('%s') is not an integer", i,
		           show(tok, sizeof tok, start, (size_t)(c->p - start)));
	}
	if (neg && (v != 0 || overflow))
		return BAD(c->err, "shape entry %d is negative ('%s')", i,
		           show(tok, sizeof tok, start, (size_t)(c->p - start)));
	if (overflow)
		return BAD(c->err, "shape entry %d ('%s') does not fit in 64 bits", i,
		           show(tok, sizeof tok, start, (size_t)(c->p - start)));
	*out = v;
	return TS_OK;
}

/* A tuple of shape entries: "()", "(3,)", "(2, 3)", "(2, 3,)". */
static ts_status parse_shape(struct cursor *c, int *rank, uint64_t *shape)
{
	char tok[SHOW_MAX + 16];
	ts_status st;
	int n = 0;

	if (peek(c) == '[')
		return BAD(c->err, "shape must be a tuple, not a list");
	if (peek(c) != '(')
		return BAD(c->err, "shape must be a tuple, found %s", show_token(tok, sizeof tok, c));
	c->p++;
	skip_ws(c);
	if (peek(c) == ')') {
		c->p++;
		*rank = 0;
		return TS_OK;
	}
	for (;;) {
		if (n == TS_MAX_RANK)
			return BAD(c->err, "shape has more than %d entries (rank %d at offset %llu)",
			           TS_MAX_RANK, TS_MAX_RANK + 1, offset(c));
		st = parse_dim(c, n, &shape[n]);
		if (st != TS_OK)
			return st;
		n++;
		skip_ws(c);
		if (peek(c) == ',') {
			c->p++;
			skip_ws(c);
			if (peek(c) == ')')
				break;
			continue;
		}
		if (peek(c) == ')') {
			if (n == 1)
				return BAD(c->err, "shape (%llu) is not a tuple; a 1-d shape is written (%llu,)",
				           (unsigned long long)shape[0], (unsigned long long)shape[0]);
			break;
		}
		return BAD(c->err, "expected ',' or ')' after shape entry %d at offset %llu, found %s",
		           n - 1, offset(c), show_token(tok, sizeof tok, c));
	}
	c->p++;
	*rank = n;
	return TS_OK;
}

static ts_status parse_bool(struct cursor *c, bool *out)
{
	char tok[SHOW_MAX + 16];
	const char *start = c->p;
	size_t n;

	while (c->p < c->end && is_word_char((unsigned char)*c->p))
		c->p++;
	n = (size_t)(c->p - start);
	if (n == 4 && memcmp(start, "True", 4) == 0) {
		*out = true;
		return TS_OK;
	}
	if (n == 5 && memcmp(start, "False", 5) == 0) {
		*out = false;
		return TS_OK;
	}
	c->p = start;
	return BAD(c->err, "fortran_order must be True or False, found %s",
	           show_token(tok, sizeof tok, c));
}

static ts_status parse_descr(struct cursor *c, struct pystr *out)
{
	char tok[SHOW_MAX + 16];

	if (peek(c) == '[')
		return BAD(c->err, "descr is a list: structured dtypes are not supported");
	if (peek(c) != '\'' && peek(c) != '"')
		return BAD(c->err, "descr must be a string, found %s", show_token(tok, sizeof tok, c));
	return parse_string(c, out);
}

static const struct {
	const char code[3];
	enum ts_dtype dt;
} descr_kinds[] = {
	{"b1", TS_DT_BOOL},    {"i1", TS_DT_INT8},    {"u1", TS_DT_UINT8},
	{"i2", TS_DT_INT16},   {"u2", TS_DT_UINT16},  {"i4", TS_DT_INT32},
	{"u4", TS_DT_UINT32},  {"i8", TS_DT_INT64},   {"u8", TS_DT_UINT64},
	{"f2", TS_DT_FLOAT16}, {"f4", TS_DT_FLOAT32}, {"f8", TS_DT_FLOAT64},
};

/* Turns descr (and the caller's hint) into dtype and byte order. */
static ts_status decode_descr(const struct pystr *d, const enum ts_dtype *hint,
                              struct ts_npy_header *h, struct ts_error *err)
{
	char shown[SHOW_MAX + 16];
	const char *s = d->s;
	size_t n = d->len;
	char order = '=';

	show_str(shown, sizeof shown, d);
	if (n >= STR_KEEP)
		return BAD(err, "descr '%s' is not a supported dtype", shown);
	if (n > 0 && memchr("<>|=", s[0], 4)) {
		order = s[0];
		s++;
		n--;
	}
	if (n >= 1 && s[0] == 'O' && strspn(s + 1, "0123456789") == n - 1)
		return BAD(err, "descr '%s' is an object dtype, which is not supported", shown);
	if (n == 2 && memcmp(s, "V2", 2) == 0 && order != '>') {
		if (!hint)
			return BAD(err, "descr '%s' (bfloat16?) needs ?dtype=bfloat16", shown);
		if (*hint != TS_DT_BFLOAT16)
			return BAD(err, "descr '%s' (bfloat16?) needs ?dtype=bfloat16, not ?dtype=%s",
			           shown, ts_dtype_name(*hint) ? ts_dtype_name(*hint) : "?");
		h->dtype = TS_DT_BFLOAT16;
		h->big_endian = false;
		h->dtype_from_hint = true;
		return TS_OK;
	}
	for (size_t i = 0; i < sizeof descr_kinds / sizeof descr_kinds[0]; i++) {
		if (n != 2 || memcmp(s, descr_kinds[i].code, 2) != 0)
			continue;
		h->dtype = descr_kinds[i].dt;
		h->big_endian = order == '>' && ts_dtype_size(h->dtype) > 1;
		h->dtype_from_hint = false;
		if (hint && *hint != h->dtype)
			return BAD(err, "descr '%s' is %s but ?dtype=%s was asked for", shown,
			           ts_dtype_name(h->dtype),
			           ts_dtype_name(*hint) ? ts_dtype_name(*hint) : "?");
		return TS_OK;
	}
	return BAD(err, "descr '%s' is not a supported dtype", shown);
}

/* "(2, 3)" for messages, cut short past cap. */
static const char *show_shape(char *buf, size_t cap, int rank, const uint64_t *shape)
{
	size_t o = (size_t)snprintf(buf, cap, "(");

	for (int i = 0; i < rank && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%llu", i ? ", " : "",
		                      (unsigned long long)shape[i]);
	if (o < cap)
		snprintf(buf + o, cap - o, rank == 1 ? ",)" : ")");
	return buf;
}

/* One "key: value" pair; seen[] flags descr, fortran_order, shape. */
static ts_status parse_entry(struct cursor *c, bool seen[3], struct pystr *descr,
                             struct ts_npy_header *h)
{
	static const char *const keys[3] = {"descr", "fortran_order", "shape"};
	char tok[SHOW_MAX + 16];
	struct pystr key;
	ts_status st;
	int k;

	if (peek(c) != '\'' && peek(c) != '"')
		return BAD(c->err, "expected a quoted key at offset %llu, found %s", offset(c),
		           show_token(tok, sizeof tok, c));
	st = parse_string(c, &key);
	if (st != TS_OK)
		return st;
	for (k = 0; k < 3 && !str_is(&key, keys[k]); k++)
		;
	if (k == 3)
		return BAD(c->err, "unknown key '%s'", show_str(tok, sizeof tok, &key));
	if (seen[k])
		return BAD(c->err, "duplicate key '%s'", keys[k]);
	seen[k] = true;
	skip_ws(c);
	if (peek(c) != ':')
		return BAD(c->err, "expected ':' after key '%s' at offset %llu, found %s", keys[k],
		           offset(c), show_token(tok, sizeof tok, c));
	c->p++;
	skip_ws(c);
	if (k == 0)
		return parse_descr(c, descr);
	if (k == 1)
		return parse_bool(c, &h->fortran_order);
	return parse_shape(c, &h->rank, h->shape);
}

static ts_status parse_dict(struct cursor *c, const enum ts_dtype *hint, struct ts_npy_header *h)
{
	static const char *const keys[3] = {"descr", "fortran_order", "shape"};
	char tok[SHOW_MAX + 16], shp[SHOW_MAX + 16];
	bool seen[3] = {false, false, false};
	struct pystr descr = {{0}, 0};
	ts_status st;

	skip_ws(c);
	if (peek(c) != '{')
		return BAD(c->err, "header is not a dict literal (found %s at offset %llu)",
		           show_token(tok, sizeof tok, c), offset(c));
	c->p++;
	for (;;) {
		skip_ws(c);
		if (peek(c) == '}')
			break;
		if (peek(c) < 0)
			return BAD(c->err, "header dict is not closed");
		st = parse_entry(c, seen, &descr, h);
		if (st != TS_OK)
			return st;
		skip_ws(c);
		if (peek(c) == '}')
			break;
		if (peek(c) < 0)
			return BAD(c->err, "header dict is not closed");
		if (peek(c) != ',')
			return BAD(c->err, "expected ',' or '}' at offset %llu, found %s", offset(c),
			           show_token(tok, sizeof tok, c));
		c->p++;
	}
	c->p++;
	skip_ws(c);
	if (c->p != c->end)
		return BAD(c->err, "unexpected %s after the header dict at offset %llu",
		           show_token(tok, sizeof tok, c), offset(c));
	for (int k = 0; k < 3; k++)
		if (!seen[k])
			return BAD(c->err, "header has no '%s' key", keys[k]);
	st = decode_descr(&descr, hint, h, c->err);
	if (st != TS_OK)
		return st;
	if (!ts_shape_nbytes(h->rank, h->shape, h->dtype, &h->nbytes))
		return BAD(c->err, "shape %s of %s needs more than 2^64 bytes",
		           show_shape(shp, sizeof shp, h->rank, h->shape), ts_dtype_name(h->dtype));
	return TS_OK;
}

/* Bytes taken by the header-length field of a version. */
static size_t length_field(unsigned major)
{
	return major == 1 ? 2 : 4;
}

ts_status ts_npy_preamble(const void *buf, size_t len, uint64_t *data_offset,
                          struct ts_error *err)
{
	char tok[SHOW_MAX + 16];
	const unsigned char *b = buf;
	size_t lf;
	uint64_t hlen;

	if (memcmp(b, MAGIC, len < MAGIC_LEN ? len : MAGIC_LEN) != 0)
		return BAD(err, "bad magic '%s' (not an .npy file)",
		           show(tok, sizeof tok, buf, len < MAGIC_LEN ? len : MAGIC_LEN));
	if (len < MAGIC_LEN + 2)
		return need_more(err, len, MAGIC_LEN + 2);
	if (!((b[6] == 1 || b[6] == 2 || b[6] == 3) && b[7] == 0))
		return BAD(err, "unsupported version %u.%u (1.0, 2.0 and 3.0 are read)", b[6], b[7]);
	lf = length_field(b[6]);
	if (len < MAGIC_LEN + 2 + lf)
		return need_more(err, len, MAGIC_LEN + 2 + lf);
	hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8;
	if (lf == 4)
		hlen |= (uint64_t)b[10] << 16 | (uint64_t)b[11] << 24;
	if (MAGIC_LEN + 2 + lf + hlen > TS_NPY_PREAMBLE_MAX)
		return BAD(err, "header length %llu exceeds the %u-byte limit",
		           (unsigned long long)hlen, TS_NPY_PREAMBLE_MAX);
	*data_offset = MAGIC_LEN + 2 + lf + hlen;
	return TS_OK;
}

ts_status ts_npy_parse_header(const void *buf, size_t len, const enum ts_dtype *hint,
                              struct ts_npy_header *out, struct ts_error *err)
{
	struct ts_npy_header h;
	struct cursor c;
	uint64_t off;
	ts_status st;

	st = ts_npy_preamble(buf, len, &off, err);
	if (st != TS_OK)
		return st;
	if (len < off)
		return need_more(err, len, off);
	memset(&h, 0, sizeof h);
	h.data_offset = off;
	c.file = buf;
	c.p = c.file + MAGIC_LEN + 2 + length_field(((const unsigned char *)buf)[6]);
	c.end = c.file + off;
	c.err = err;
	st = parse_dict(&c, hint, &h);
	if (st != TS_OK)
		return st;
	*out = h;
	return TS_OK;
}

static size_t put(char *buf, size_t o, const char *s)
{
	size_t n = strlen(s);

	memcpy(buf + o, s, n);
	return o + n;
}

static size_t put_u64(char *buf, size_t o, uint64_t v)
{
	char tmp[24];
	int n = 0;

	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n)
		buf[o++] = tmp[--n];
	return o;
}

size_t ts_npy_write_header(char *buf, size_t cap, enum ts_dtype dt, int rank,
                           const uint64_t *shape)
{
	/* 50 fixed bytes + 32 entries of 20 digits and ", " + 21 growth spaces */
	char dict[1024];
	const char *descr = ts_dtype_npy_descr(dt);
	size_t n = 0, hlen, lf = 2, pad, total;

	if (!descr || rank < 0 || rank > TS_MAX_RANK || (rank > 0 && !shape))
		return 0;
	n = put(dict, n, "{'descr': '");
	n = put(dict, n, descr);
	n = put(dict, n, "', 'fortran_order': False, 'shape': (");
	for (int i = 0; i < rank; i++) {
		if (i)
			n = put(dict, n, ", ");
		n = put_u64(dict, n, shape[i]);
	}
	n = put(dict, n, rank == 1 ? ",), }" : "), }");
	if (rank > 0) {
		size_t digits = put_u64(dict, n, shape[0]) - n;

		memset(dict + n, ' ', GROWTH_DIGITS - digits);
		n += GROWTH_DIGITS - digits;
	}
	hlen = n + 1; /* the '\n' */
	pad = ARRAY_ALIGN - (MAGIC_LEN + 2 + lf + hlen) % ARRAY_ALIGN;
	if (hlen + pad > 0xffff) {
		lf = 4;
		pad = ARRAY_ALIGN - (MAGIC_LEN + 2 + lf + hlen) % ARRAY_ALIGN;
	}
	total = MAGIC_LEN + 2 + lf + hlen + pad;
	if (!buf || cap < total)
		return 0;
	memcpy(buf, MAGIC, MAGIC_LEN);
	buf[6] = lf == 2 ? 1 : 2;
	buf[7] = 0;
	for (size_t i = 0; i < lf; i++)
		buf[8 + i] = (char)(((hlen + pad) >> (8 * i)) & 0xff);
	memcpy(buf + MAGIC_LEN + 2 + lf, dict, n);
	memset(buf + MAGIC_LEN + 2 + lf + n, ' ', pad);
	buf[total - 1] = '\n';
	return total;
}

/* Copies one C-order row: count elements taken stride bytes apart. */
static void gather(unsigned char *d, const unsigned char *s, size_t size, uint64_t count,
                   uint64_t stride)
{
	switch (size) {
	case 1:
		for (uint64_t j = 0; j < count; j++, s += stride)
			*d++ = *s;
		return;
	case 2:
		for (uint64_t j = 0; j < count; j++, d += 2, s += stride)
			memcpy(d, s, 2);
		return;
	case 4:
		for (uint64_t j = 0; j < count; j++, d += 4, s += stride)
			memcpy(d, s, 4);
		return;
	case 8:
		for (uint64_t j = 0; j < count; j++, d += 8, s += stride)
			memcpy(d, s, 8);
		return;
	default:
		for (uint64_t j = 0; j < count; j++, d += size, s += stride)
			memcpy(d, s, size);
		return;
	}
}

void ts_npy_fortran_to_c(void *dst, const void *src, size_t elem_size, int rank,
                         const uint64_t *shape)
{
	uint64_t fstride[TS_MAX_RANK], idx[TS_MAX_RANK], n = 1, off = 0, inner;
	unsigned char *d = dst;
	int k;

	for (k = 0; k < rank; k++) {
		fstride[k] = n;
		idx[k] = 0;
		n *= shape[k];
	}
	if (n == 0)
		return;
	if (rank <= 1) {
		memcpy(dst, src, n * elem_size);
		return;
	}
	inner = shape[rank - 1];
	for (;;) {
		gather(d, (const unsigned char *)src + off * elem_size, elem_size, inner,
		       fstride[rank - 1] * elem_size);
		d += inner * elem_size;
		for (k = rank - 2; k >= 0; k--) {
			off += fstride[k];
			if (++idx[k] < shape[k])
				break;
			off -= fstride[k] * shape[k];
			idx[k] = 0;
		}
		if (k < 0)
			return;
	}
}
