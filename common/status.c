/*
 * status.c - names, HTTP numbers and errno translation for ts_status, and the
 * first-error-wins ts_error recorder.
 *
 * A message always keeps its own words: when it is too long for
 * TS_ERROR_MESSAGE_MAX, the quoted subjects in it ('...', the client's text
 * by the house style) are cut first, each to no fewer than
 * TS__QUOTE_KEEP bytes and an ellipsis, longest first; only a message still
 * too long after that is cut at its end.
 */
#include "status.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"
#include "common/utf8.h"

static const struct {
	ts_status st;
	const char *name;
	int http;
} status_table[] = {
#define TS__STATUS_ROW(sym, name, grpc, http) {TS_##sym, name, http},
	TS_STATUS_MAP(TS__STATUS_ROW)
#undef TS__STATUS_ROW
};

#define STATUS_COUNT (sizeof status_table / sizeof status_table[0])

const char *ts_status_name(ts_status st)
{
	for (size_t i = 0; i < STATUS_COUNT; i++)
		if (status_table[i].st == st)
			return status_table[i].name;
	return "UNKNOWN";
}

int ts_status_http(ts_status st)
{
	for (size_t i = 0; i < STATUS_COUNT; i++)
		if (status_table[i].st == st)
			return status_table[i].http;
	return 500;
}

ts_status ts_status_from_errno(int err)
{
	switch (err) {
	case 0:
		return TS_OK;
	case ENOMEM:
	case ENOSPC:
	case EMFILE:
	case ENFILE:
	case EDQUOT:
		return TS_RESOURCE_EXHAUSTED;
	case ENOENT:
	case ENOTDIR:
		return TS_NOT_FOUND;
	case EACCES:
	case EPERM:
	case EROFS:
		return TS_PERMISSION_DENIED;
	case EEXIST:
		return TS_ALREADY_EXISTS;
	case EINVAL:
	case ENAMETOOLONG:
	case EISDIR:
		return TS_INVALID_ARGUMENT;
	case EAGAIN:
	case EBUSY:
		return TS_UNAVAILABLE;
	case ETIMEDOUT:
		return TS_DEADLINE_EXCEEDED;
	case ECANCELED:
		return TS_CANCELLED;
	case EFBIG:
	case EOVERFLOW:
	case ERANGE:
		return TS_OUT_OF_RANGE;
	default:
		return TS_INTERNAL;
	}
}

/* What a cleared error reads as; the rest of the buffers is never read past
 * their terminators and nmeta (and zeroing all of them cost a small
 * request 600 instructions: it is cleared three times on the way). */
void ts_error_clear(struct ts_error *err)
{
	err->status = TS_OK;
	err->reason[0] = '\0';
	err->message[0] = '\0';
	err->nmeta = 0;
}

/* ---- fitting a message ----------------------------------------------------- */

#define TS__QUOTE_KEEP 24               /* bytes of a cut quoted text kept */
#define TS__QUOTES_MAX 16               /* quoted texts looked at in one message */

/* A quoted text s[at, at + len) and how many of its bytes are kept. */
struct quote {
	size_t at, len, keep;
	bool cut;
};

static bool word_char(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* The quoted texts of s: a ' that follows no letter or digit opens one (an
 * apostrophe, as in "array's", does not); the next ' that no letter or
 * digit follows closes it. */
static int find_quotes(const char *s, size_t n, struct quote *q)
{
	int nq = 0;

	for (size_t i = 0; i < n && nq < TS__QUOTES_MAX; i++) {
		size_t j;

		if (s[i] != '\'' || (i > 0 && word_char(s[i - 1])))
			continue;
		for (j = i + 1; j < n; j++)
			if (s[j] == '\'' && (j + 1 == n || !word_char(s[j + 1])))
				break;
		if (j >= n)
			break;
		q[nq++] = (struct quote){.at = i + 1, .len = j - i - 1, .keep = j - i - 1};
		i = j;
	}
	return nq;
}

static size_t shown(const struct quote *q)
{
	return q->cut ? q->keep + 3 : q->len;
}

/* Cuts the quoted texts of s (n bytes), longest first, until s fits in
 * cap - 1 bytes or none can be cut further; writes the result to dst (cap
 * bytes, terminated; cut at its end, on a character boundary, when still
 * too long). */
static void fit_message(char *dst, size_t cap, const char *s, size_t n)
{
	struct quote q[TS__QUOTES_MAX];
	int nq = find_quotes(s, n, q);
	size_t len = n, o = 0, from = 0;

	while (len > cap - 1) {
		struct quote *big = NULL;
		size_t want, keep;

		for (int i = 0; i < nq; i++)
			if (shown(&q[i]) > TS__QUOTE_KEEP + 3 && (!big || shown(&q[i]) > shown(big)))
				big = &q[i];
		if (!big)
			break;
		want = shown(big) - (len - (cap - 1));
		keep = want > TS__QUOTE_KEEP + 3 ? want - 3 : TS__QUOTE_KEEP;
		keep = (size_t)ts_utf8_prefix(s + big->at, big->len, keep);
		len -= shown(big) - (keep + 3);
		big->keep = keep;
		big->cut = true;
	}
	for (int i = 0; i < nq && o < cap - 1; i++) {
		size_t k;

		if (!q[i].cut)
			continue;
		k = q[i].at + q[i].keep - from;
		k = k < cap - 1 - o ? k : cap - 1 - o;
		memcpy(dst + o, s + from, k);
		o += k;
		k = cap - 1 - o < 3 ? cap - 1 - o : 3;
		memcpy(dst + o, "...", k);
		o += k;
		from = q[i].at + q[i].len;
	}
	if (o < cap - 1) {
		size_t k = n - from < cap - 1 - o ? n - from : cap - 1 - o;

		memcpy(dst + o, s + from, k);
		o += k;
	}
	dst[o] = '\0';
	if (len > cap - 1)
		ts_utf8_trim(dst);              /* cut on a character boundary */
}

/* Formats fmt into dst (cap bytes) as fit_message fits it. */
static void format_message(char *dst, size_t cap, const char *fmt, va_list ap)
{
	char buf[TS_ERROR_MESSAGE_MAX * 2];
	char *text = buf;
	va_list again;
	int n;

	va_copy(again, ap);
	n = vsnprintf(buf, sizeof buf, fmt, ap);
	if (n < 0) {
		n = 0;
		buf[0] = '\0';
	} else if ((size_t)n >= sizeof buf) {
		/* the whole text, so that the words after a long quote survive */
		text = malloc((size_t)n + 1);
		if (text)
			vsnprintf(text, (size_t)n + 1, fmt, again);
		else
			text = buf, n = (int)sizeof buf - 1;
	}
	va_end(again);
	fit_message(dst, cap, text, (size_t)n);
	if (text != buf)
		free(text);
}

ts_status ts_error_vset(struct ts_error *err, ts_status st, const char *reason,
                        const char *prefix, const char *fmt, va_list ap)
{
	size_t o = 0;

	if (!err)
		return st;
	if (err->status != TS_OK)
		return err->status;
	err->status = st;
	snprintf(err->reason, sizeof err->reason, "%s", reason ? reason : "");
	if (prefix) {
		int n = snprintf(err->message, sizeof err->message, "%s: ", prefix);

		o = n < 0 ? 0 : (size_t)n < sizeof err->message ? (size_t)n : sizeof err->message - 1;
	}
	format_message(err->message + o, sizeof err->message - o, fmt, ap);
	err->nmeta = 0;
	return st;
}

ts_status ts_error_set(struct ts_error *err, ts_status st, const char *reason,
                       const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	st = ts_error_vset(err, st, reason, NULL, fmt, ap);
	va_end(ap);
	return st;
}

ts_status ts_error_bad(struct ts_error *err, const char *reason, const char *prefix,
                       const char *fmt, ...)
{
	va_list ap;
	ts_status st;

	va_start(ap, fmt);
	st = ts_error_vset(err, TS_INVALID_ARGUMENT, reason, prefix, fmt, ap);
	va_end(ap);
	return st;
}

ts_status ts_error_voom(struct ts_error *err, const char *fmt, va_list ap)
{
	return ts_error_vset(err, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY", NULL, fmt, ap);
}

ts_status ts_error_oom(struct ts_error *err, const char *fmt, ...)
{
	va_list ap;
	ts_status st;

	va_start(ap, fmt);
	st = ts_error_voom(err, fmt, ap);
	va_end(ap);
	return st;
}

ts_status ts_error_oom_bytes(struct ts_error *err, const struct ts_oom_figures *f)
{
	char req[32], fr[32], lim[32], big[64] = "";
	bool known = f->largest != TS_ERROR_UNKNOWN_BYTES;

	if (err && err->status != TS_OK)
		return err->status;
	if (known) {
		char h[32];

		snprintf(big, sizeof big, " (largest free block %s)",
		         ts_format_bytes(h, sizeof h, f->largest));
	}
	ts_error_oom(err, "%s: cannot allocate %llu bytes (%s); %llu bytes (%s) free%s of %llu (%s)%s%s",
	             f->where, (unsigned long long)f->requested,
	             ts_format_bytes(req, sizeof req, f->requested),
	             (unsigned long long)f->free_bytes, ts_format_bytes(fr, sizeof fr, f->free_bytes),
	             big, (unsigned long long)f->limit, ts_format_bytes(lim, sizeof lim, f->limit),
	             f->cause ? ": " : "", f->cause ? f->cause : "");
	for (int i = 0; i < 2 && f->ids[i][0]; i++)
		ts_error_meta(err, f->ids[i][0], "%s", f->ids[i][1]);
	ts_error_meta_u64(err, "requested_bytes", f->requested);
	ts_error_meta_u64(err, "free_bytes", f->free_bytes);
	if (known)
		ts_error_meta_u64(err, "largest_free_block_bytes", f->largest);
	ts_error_meta_u64(err, "limit_bytes", f->limit);
	return TS_RESOURCE_EXHAUSTED;
}

void ts_error_meta(struct ts_error *err, const char *key, const char *fmt, ...)
{
	va_list ap;

	if (!err || err->nmeta >= TS_ERROR_META_MAX)
		return;
	snprintf(err->meta[err->nmeta].key, sizeof err->meta[0].key, "%s", key);
	va_start(ap, fmt);
	if (vsnprintf(err->meta[err->nmeta].value, sizeof err->meta[0].value, fmt, ap) >=
	    (int)sizeof err->meta[0].value)
		ts_utf8_trim(err->meta[err->nmeta].value);
	va_end(ap);
	err->nmeta++;
}

void ts_error_meta_u64(struct ts_error *err, const char *key, uint64_t v)
{
	ts_error_meta(err, key, "%llu", (unsigned long long)v);
}
