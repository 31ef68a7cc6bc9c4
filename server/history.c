/*
 * history.c - rings of samples at fixed resolutions, their folds, the
 * sampler thread and the ?since= / ?step= parser (history.h).
 *
 * Each ring is a circular table of rows (a time and nseries values); a
 * coarser ring's row is built in an accumulator over one whole step of
 * wall-clock seconds and written when a sample of a later step arrives. One
 * mutex guards the rings: the sampler holds it to write one row, a reader
 * to copy a range.
 */
#include "server/history.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/lock.h"
#include "common/units.h"

const struct ts_history_level ts_history_levels[TS_HISTORY_LEVELS] = {
	{1, 900},       /* 15 minutes */
	{10, 1080},     /* 3 hours */
};

#define NS 1000000000ull

struct ring {
	uint32_t step_s;
	uint32_t cap;
	size_t head;             /* next row written */
	size_t count;            /* rows held, <= cap */
	uint64_t *times;         /* cap */
	uint64_t *values;        /* cap x nseries */
	/* the fold of the step in progress (coarser rings) */
	uint64_t *acc;           /* nseries */
	uint64_t acc_step;       /* wall seconds / step_s */
	uint64_t acc_t;          /* the time of its last sample */
	bool acc_any;
};

struct ts_history {
	size_t nseries;                      /* immutable */
	enum ts_history_fold *fold;          /* immutable; nseries */
	struct ts_mutex mu;
	struct ring rings[TS_HISTORY_LEVELS];   /* guarded by: mu */
	size_t bytes;                        /* immutable */
	/* the sampler */
	ts_history_sample_fn *sample;        /* immutable */
	void *cls;
	uint64_t interval_ns;
	uint64_t *scratch;                   /* the sampler's own */
	struct ts_mutex stop_mu;
	pthread_cond_t stop_cv;
	bool stop;                           /* guarded by: stop_mu */
	bool started;
	pthread_t thread;
	_Atomic uint64_t samples;            /* taken by the sampler */
	_Atomic uint64_t cpu_ns;             /* the sampler's CPU time taking them */
};

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NS + (uint64_t)ts.tv_nsec;
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * NS + (uint64_t)ts.tv_nsec;
}

static void *sampler_main(void *arg)
{
	struct ts_history *h = arg;
	uint64_t next = mono_ns();

	ts_mutex_lock(&h->stop_mu);
	while (!h->stop) {
		struct timespec until;
		uint64_t cpu = thread_cpu_ns();

		ts_mutex_unlock(&h->stop_mu);
		h->sample(h->cls, h->scratch);
		ts_history_add(h, ts_wall_ns(), h->scratch);
		atomic_fetch_add_explicit(&h->cpu_ns, thread_cpu_ns() - cpu, memory_order_relaxed);
		atomic_fetch_add_explicit(&h->samples, 1, memory_order_relaxed);
		next += h->interval_ns;
		if (next < mono_ns())   /* fell behind (a suspended process): no burst */
			next = mono_ns() + h->interval_ns;
		until.tv_sec = (time_t)(next / NS);
		until.tv_nsec = (long)(next % NS);
		ts_mutex_lock(&h->stop_mu);
		while (!h->stop && mono_ns() < next)
			ts_mutex_wait(&h->stop_mu, &h->stop_cv, &until);
	}
	ts_mutex_unlock(&h->stop_mu);
	return NULL;
}

static bool ring_alloc(struct ring *r, const struct ts_history_level *lv, size_t nseries,
                       bool fold)
{
	r->step_s = lv->step_s;
	r->cap = lv->rows;
	r->times = calloc(lv->rows, sizeof *r->times);
	r->values = calloc((size_t)lv->rows * nseries, sizeof *r->values);
	r->acc = fold ? calloc(nseries, sizeof *r->acc) : NULL;
	return r->times && r->values && (!fold || r->acc);
}

ts_status ts_history_new(const struct ts_history_config *cfg, struct ts_history **out,
                         struct ts_error *err)
{
	struct ts_history *h;
	pthread_condattr_t ca;

	*out = NULL;
	if (cfg->nseries == 0 || cfg->nseries > (1u << 20))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_HISTORY",
		                    "a history needs 1 to 1048576 series, not %zu", cfg->nseries);
	h = calloc(1, sizeof *h);
	if (!h)
		return ts_error_oom(err, "no memory for the history");
	h->nseries = cfg->nseries;
	h->fold = calloc(cfg->nseries, sizeof *h->fold);
	h->scratch = calloc(cfg->nseries, sizeof *h->scratch);
	ts_mutex_init(&h->mu);
	ts_mutex_init(&h->stop_mu);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&h->stop_cv, &ca);
	pthread_condattr_destroy(&ca);
	if (!h->fold || !h->scratch)
		goto out_oom;
	memcpy(h->fold, cfg->fold, cfg->nseries * sizeof *h->fold);
	for (int l = 0; l < TS_HISTORY_LEVELS; l++) {
		if (!ring_alloc(&h->rings[l], &ts_history_levels[l], h->nseries, l > 0))
			goto out_oom;
		h->bytes += (size_t)ts_history_levels[l].rows * (1 + h->nseries) * sizeof(uint64_t);
	}
	h->sample = cfg->sample;
	h->cls = cfg->cls;
	h->interval_ns = (uint64_t)(cfg->interval_ms ? cfg->interval_ms : 1000) * 1000000ull;
	if (h->sample) {
		if (pthread_create(&h->thread, NULL, sampler_main, h) != 0) {
			ts_history_free(h);
			return ts_error_set(err, TS_INTERNAL, "THREAD",
			                    "cannot start the history's sampler thread");
		}
		h->started = true;
	}
	*out = h;
	return TS_OK;

out_oom:
	ts_history_free(h);
	return ts_error_oom(err, "no memory for the history's rings");
}

void ts_history_free(struct ts_history *h)
{
	if (!h)
		return;
	if (h->started) {
		ts_mutex_lock(&h->stop_mu);
		h->stop = true;
		pthread_cond_broadcast(&h->stop_cv);
		ts_mutex_unlock(&h->stop_mu);
		pthread_join(h->thread, NULL);
	}
	for (int l = 0; l < TS_HISTORY_LEVELS; l++) {
		free(h->rings[l].times);
		free(h->rings[l].values);
		free(h->rings[l].acc);
	}
	pthread_cond_destroy(&h->stop_cv);
	ts_mutex_destroy(&h->stop_mu);
	ts_mutex_destroy(&h->mu);
	free(h->scratch);
	free(h->fold);
	free(h);
}

static void ring_push_locked(struct ts_history *h, struct ring *r, uint64_t t,
                             const uint64_t *values)
{
	assert(ts_mutex_held(&h->mu));
	r->times[r->head] = t;
	memcpy(r->values + r->head * h->nseries, values, h->nseries * sizeof *values);
	r->head = (r->head + 1) % r->cap;
	if (r->count < r->cap)
		r->count++;
}

/* Folds one sample into a coarser ring, writing the step before when t
 * begins a new one. */
static void ring_fold_locked(struct ts_history *h, struct ring *r, uint64_t t,
                             const uint64_t *values)
{
	uint64_t step = t / NS / r->step_s;

	assert(ts_mutex_held(&h->mu));

	if (r->acc_any && step != r->acc_step) {
		ring_push_locked(h, r, r->acc_t, r->acc);
		r->acc_any = false;
	}
	for (size_t s = 0; s < h->nseries; s++) {
		if (!r->acc_any || h->fold[s] == TS_HISTORY_COUNTER || values[s] > r->acc[s])
			r->acc[s] = values[s];
	}
	r->acc_step = step;
	r->acc_t = t;
	r->acc_any = true;
}

void ts_history_add(struct ts_history *h, uint64_t t_ns, const uint64_t *values)
{
	ts_mutex_lock(&h->mu);
	ring_push_locked(h, &h->rings[0], t_ns, values);
	for (int l = 1; l < TS_HISTORY_LEVELS; l++)
		ring_fold_locked(h, &h->rings[l], t_ns, values);
	ts_mutex_unlock(&h->mu);
}

size_t ts_history_bytes(const struct ts_history *h)
{
	return h->bytes;
}

void ts_history_sampler_stats(struct ts_history *h, uint64_t *samples, uint64_t *cpu_ns)
{
	*samples = atomic_load_explicit(&h->samples, memory_order_relaxed);
	*cpu_ns = atomic_load_explicit(&h->cpu_ns, memory_order_relaxed);
}

size_t ts_history_series(const struct ts_history *h)
{
	return h->nseries;
}

ts_status ts_history_read(struct ts_history *h, int level, uint64_t since_ns,
                          struct ts_history_slice *out, struct ts_error *err)
{
	struct ring *r;
	size_t n = 0, first;

	memset(out, 0, sizeof *out);
	if (level < 0 || level >= TS_HISTORY_LEVELS)
		level = TS_HISTORY_LEVELS - 1;
	r = &h->rings[level];
	out->level = level;
	out->step_s = r->step_s;
	out->nseries = h->nseries;
	/* at most every row: allocated before the lock, filled under it */
	out->times_ns = malloc(r->cap * sizeof *out->times_ns);
	out->values = malloc((size_t)r->cap * h->nseries * sizeof *out->values);
	if (!out->times_ns || !out->values) {
		ts_history_slice_release(out);
		return ts_error_oom(err, "no memory for a copy of the history");
	}
	ts_mutex_lock(&h->mu);
	/* the newest rows back to the first before since */
	while (n < r->count) {
		size_t i = (r->head + r->cap - 1 - n) % r->cap;

		if (r->times[i] < since_ns)
			break;
		n++;
	}
	first = (r->head + r->cap - n) % r->cap;
	for (size_t k = 0; k < n; k++) {
		size_t i = (first + k) % r->cap;

		out->times_ns[k] = r->times[i];
		memcpy(out->values + k * h->nseries, r->values + i * h->nseries,
		       h->nseries * sizeof *out->values);
	}
	ts_mutex_unlock(&h->mu);
	out->rows = n;
	return TS_OK;
}

void ts_history_slice_release(struct ts_history_slice *s)
{
	free(s->times_ns);
	free(s->values);
	s->times_ns = NULL;
	s->values = NULL;
	s->rows = 0;
}

/* ---- ?since= and ?step= ------------------------------------------------------- */

/* A duration: a non-negative decimal number, an optional unit s, m or h;
 * false on anything else or past 10 years. */
static bool parse_duration(const char *s, uint64_t *ns)
{
	double v = 0, frac = 0.1, mult = 1;
	bool digits = false;
	const char *p = s;

	for (; *p >= '0' && *p <= '9'; p++, digits = true) {
		v = v * 10 + (*p - '0');
		if (v > 1e12)
			return false;
	}
	if (*p == '.') {
		for (p++; *p >= '0' && *p <= '9'; p++, digits = true, frac /= 10)
			v += (*p - '0') * frac;
	}
	if (!digits)
		return false;
	if (*p == 's')
		p++;
	else if (*p == 'm')
		mult = 60, p++;
	else if (*p == 'h')
		mult = 3600, p++;
	if (*p)
		return false;
	v *= mult;
	if (v > 10.0 * 366 * 86400)
		return false;
	*ns = (uint64_t)llround(v * 1e9);
	return true;
}

/* Reads exactly n digits at *p into *v. */
static bool digits_n(const char **p, int n, int *v)
{
	*v = 0;
	for (int i = 0; i < n; i++, (*p)++) {
		if (**p < '0' || **p > '9')
			return false;
		*v = *v * 10 + (**p - '0');
	}
	return true;
}

static bool expect(const char **p, const char *one_of)
{
	if (!**p || !strchr(one_of, **p))
		return false;
	(*p)++;
	return true;
}

static int days_in_month(int y, int m)
{
	static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
	bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;

	return m == 2 && leap ? 29 : days[m - 1];
}

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian; Howard Hinnant's
 * days_from_civil). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
	int64_t era, yoe, doy, doe;

	y -= m <= 2;
	era = (y >= 0 ? y : y - 399) / 400;
	yoe = y - era * 400;
	doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - 719468;
}

bool ts_parse_rfc3339(const char *s, uint64_t *ns)
{
	const char *p = s;
	int y, mo, d, hh, mi, ss, oh = 0, om = 0, sign = 0;
	uint64_t frac = 0, scale = NS;
	int64_t secs;

	if (!digits_n(&p, 4, &y) || !expect(&p, "-") || !digits_n(&p, 2, &mo) ||
	    !expect(&p, "-") || !digits_n(&p, 2, &d) || !expect(&p, "Tt ") ||
	    !digits_n(&p, 2, &hh) || !expect(&p, ":") || !digits_n(&p, 2, &mi) ||
	    !expect(&p, ":") || !digits_n(&p, 2, &ss))
		return false;
	if (mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, mo) || hh > 23 || mi > 59 ||
	    ss > 60)
		return false;
	if (*p == '.') {
		bool any = false;

		for (p++; *p >= '0' && *p <= '9'; p++, any = true) {
			if (scale > 1) {
				scale /= 10;
				frac += (uint64_t)(*p - '0') * scale;
			}
		}
		if (!any)
			return false;
	}
	if (*p == 'Z' || *p == 'z') {
		p++;
	} else if (*p == '+' || *p == '-') {
		sign = *p++ == '+' ? 1 : -1;
		if (!digits_n(&p, 2, &oh) || !expect(&p, ":") || !digits_n(&p, 2, &om) || oh > 23 ||
		    om > 59)
			return false;
	} else {
		return false;
	}
	if (*p)
		return false;
	if (ss == 60)          /* a leap second is the next one's start */
		ss = 59, frac = NS - 1;
	secs = days_from_civil(y, mo, d) * 86400 + hh * 3600 + mi * 60 + ss -
	       sign * (oh * 3600 + om * 60);
	if (secs < 0 || (uint64_t)secs >= UINT64_MAX / NS)   /* before 1970, after 2554 */
		return false;
	*ns = (uint64_t)secs * NS + frac;
	return true;
}

/* The first bytes of s for a message: at most 64, never half a UTF-8
 * character. */
static const char *cut(const char *s, char *buf, size_t cap)
{
	size_t n = strlen(s);

	if (n >= cap) {
		n = cap - 1;
		while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
			n--;
	}
	memcpy(buf, s, n);
	buf[n] = '\0';
	return buf;
}

static uint64_t span_ns(int level)
{
	return (uint64_t)ts_history_levels[level].step_s * ts_history_levels[level].rows * NS;
}

ts_status ts_history_query_parse(const char *since, const char *step, uint64_t now_ns,
                                 struct ts_history_query *q, struct ts_error *err)
{
	uint64_t v;
	bool have_since = false;
	char shown[65];

	q->level = 0;
	q->since_ns = 0;
	if (since) {
		if (ts_parse_rfc3339(since, &v)) {
			if (v > now_ns)
				return ts_error_bad(err, "BAD_SINCE", NULL,
				                    "since '%s' is in the future",
				                    cut(since, shown, sizeof shown));
			q->since_ns = v;
		} else if (parse_duration(since, &v)) {
			q->since_ns = v >= now_ns ? 0 : now_ns - v;
		} else {
			return ts_error_bad(err, "BAD_SINCE", NULL,
			                    "since '%s' is neither an RFC 3339 time "
			                    "(2026-12-03T14:00:00Z) nor seconds ago (600, 600s, 10m, 1h)",
			                    cut(since, shown, sizeof shown));
		}
		have_since = true;
	}
	if (step) {
		if (!parse_duration(step, &v) || v == 0)
			return ts_error_bad(err, "BAD_STEP", NULL,
			                    "step '%s' is not a positive duration (1s, 10s, 1m)",
			                    cut(step, shown, sizeof shown));
		q->level = TS_HISTORY_LEVELS - 1;
		for (int l = 0; l < TS_HISTORY_LEVELS; l++)
			if ((uint64_t)ts_history_levels[l].step_s * NS >= v) {
				q->level = l;
				break;
			}
	} else if (have_since) {
		q->level = TS_HISTORY_LEVELS - 1;
		for (int l = 0; l < TS_HISTORY_LEVELS; l++)
			if (now_ns - q->since_ns <= span_ns(l)) {
				q->level = l;
				break;
			}
	}
	if (!have_since)
		q->since_ns = now_ns > span_ns(q->level) ? now_ns - span_ns(q->level) : 0;
	return TS_OK;
}
