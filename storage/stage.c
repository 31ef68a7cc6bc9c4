/*
 * stage.c - writers, reads and run copies over host-visible and device
 * buffers, with per-device copy queues and pinned staging slots.
 */
#include "storage/stage.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/fault.h"
struct dev_queues {
	struct ts_device *dev;    /* immutable */
	struct ts_queue *h2d;     /* immutable; host->device and device->device */
	struct ts_queue *d2h;     /* immutable */
};

struct ts_stager {
	struct ts_memory *mem;    /* borrowed */
	_Atomic uint64_t moved[TS_MEM_KIND_COUNT][TS_MEM_KIND_COUNT];
	_Atomic uint64_t implicit;
	size_t n;
	struct dev_queues *q;     /* immutable after init */
};

struct slot {
	struct ts_buffer *buf;    /* pinned staging memory */
	struct ts_event *ev;      /* marks the slot's last copy */
	bool in_flight;
	size_t fill;
};

struct ts_writer {
	struct ts_stager *st;
	struct ts_buffer *dst;    /* own reference */
	uint64_t start, offset;
	struct dev_queues *dq;    /* NULL when dst is host-visible */
	struct slot slots[TS_STAGE_SLOTS];
	int cur;
	ts_status failed;
};

static void count(struct ts_stager *st, enum ts_memory_kind from, enum ts_memory_kind to,
                  uint64_t n)
{
	atomic_fetch_add_explicit(&st->moved[from][to], n, memory_order_relaxed);
}

static uint64_t runs_bytes(const struct ts_run *runs, size_t n)
{
	uint64_t b = 0;

	for (size_t i = 0; i < n; i++)
		b += runs[i].len;
	return b;
}

void ts_stager_totals(const struct ts_stager *st,
                      uint64_t bytes[TS_MEM_KIND_COUNT][TS_MEM_KIND_COUNT])
{
	for (int i = 0; i < TS_MEM_KIND_COUNT; i++)
		for (int j = 0; j < TS_MEM_KIND_COUNT; j++)
			bytes[i][j] = atomic_load_explicit(&((struct ts_stager *)st)->moved[i][j],
			                                   memory_order_relaxed);
}

void ts_stager_count_implicit(struct ts_stager *st, uint64_t bytes)
{
	atomic_fetch_add_explicit(&st->implicit, bytes, memory_order_relaxed);
}

uint64_t ts_stager_implicit(const struct ts_stager *st)
{
	return atomic_load_explicit(&((struct ts_stager *)st)->implicit, memory_order_relaxed);
}

static struct dev_queues *queues_for(struct ts_stager *st, struct ts_device *dev)
{
	for (size_t i = 0; i < st->n; i++)
		if (st->q[i].dev == dev)
			return &st->q[i];
	return NULL;
}

ts_status ts_stager_new(struct ts_device_set *set, struct ts_memory *mem,
                        struct ts_stager **out, struct ts_error *err)
{
	struct ts_stager *st = calloc(1, sizeof *st);
	size_t n = ts_device_set_count(set);
	ts_status s = TS_OK;

	if (!st || !(st->q = calloc(n, sizeof *st->q))) {
		free(st);
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY",
		                    "no memory for the stager");
	}
	st->mem = mem;
	for (size_t i = 0; i < n && s == TS_OK; i++) {
		st->q[i].dev = ts_device_set_at(set, i);
		s = ts_queue_new(st->q[i].dev, &st->q[i].h2d, err);
		if (s == TS_OK)
			s = ts_queue_new(st->q[i].dev, &st->q[i].d2h, err);
		st->n = i + 1;
	}
	if (s != TS_OK) {
		ts_stager_free(st);
		return s;
	}
	*out = st;
	return TS_OK;
}

void ts_stager_free(struct ts_stager *st)
{
	if (!st)
		return;
	for (size_t i = 0; i < st->n; i++) {
		if (st->q[i].h2d)
			ts_queue_free(st->q[i].h2d);
		if (st->q[i].d2h)
			ts_queue_free(st->q[i].d2h);
	}
	free(st->q);
	free(st);
}

/* ---- writer ---------------------------------------------------------------- */

ts_status ts_writer_new(struct ts_stager *st, struct ts_buffer *dst, uint64_t offset,
                        struct ts_writer **out, struct ts_error *err)
{
	struct ts_writer *w = ts_fault_calloc(1, sizeof *w);
	struct ts_device *dev = ts_buffer_device(dst);
	ts_status s = TS_OK;

	if (!w)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY",
		                    "no memory for a writer");
	w->st = st;
	w->dst = ts_buffer_ref(dst);
	w->start = w->offset = offset;
	if (!ts_buffer_host_visible(dst)) {
		struct ts_space *pinned = ts_memory_find(st->mem, ts_device_props(dev)->id,
		                                         TS_MEM_PINNED_HOST);
		uint64_t total = ts_buffer_size(dst) - offset;
		int nslots = total > TS_STAGE_SLOT ? TS_STAGE_SLOTS : 1;
		uint64_t slot = total < TS_STAGE_SLOT ? total : TS_STAGE_SLOT;

		w->dq = queues_for(st, dev);
		for (int i = 0; s == TS_OK && i < nslots; i++) {
			s = ts_buffer_new(pinned, slot ? slot : 1, &w->slots[i].buf, err);
			if (s == TS_OK)
				s = ts_event_new(dev, &w->slots[i].ev, err);
		}
	}
	if (s != TS_OK) {
		ts_writer_free(w);
		return s;
	}
	*out = w;
	return TS_OK;
}

/* Sends the current slot's bytes to the device and moves to the next slot. */
static ts_status writer_flush_slot(struct ts_writer *w, struct ts_error *err)
{
	struct slot *sl = &w->slots[w->cur];
	char *dst = (char *)ts_buffer_data(w->dst) + (w->offset - sl->fill);
	ts_status s;

	if (!sl->fill)
		return TS_OK;
	s = ts_queue_copy(w->dq->h2d, dst, ts_buffer_data(sl->buf), sl->fill, TS_COPY_H2D, err);
	if (s == TS_OK)
		s = ts_event_record(sl->ev, w->dq->h2d, err);
	if (s != TS_OK)
		return s;
	sl->in_flight = true;
	sl->fill = 0;
	w->cur = (w->cur + 1) % TS_STAGE_SLOTS;
	if (!w->slots[w->cur].buf)
		w->cur = 0;
	return TS_OK;
}

/* Makes the current slot writable: waits for its previous copy. */
static ts_status writer_slot_ready(struct ts_writer *w, struct ts_error *err)
{
	struct slot *sl = &w->slots[w->cur];
	ts_status s = TS_OK;

	if (sl->in_flight) {
		s = ts_event_sync(sl->ev, err);
		sl->in_flight = false;
	}
	return s;
}

ts_status ts_writer_write(struct ts_writer *w, const void *data, size_t n,
                          struct ts_error *err)
{
	const char *p = data;
	ts_status s;

	if (w->failed)
		return ts_error_set(err, w->failed, "WRITE_FAILED", "an earlier write failed");
	if (n > ts_buffer_size(w->dst) - w->offset)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "TOO_MANY_BYTES",
		                    "%llu bytes more than the array holds",
		                    (unsigned long long)(n - (ts_buffer_size(w->dst) - w->offset)));
	count(w->st, TS_MEM_UNPINNED_HOST, ts_buffer_kind(w->dst), n);
	if (!w->dq) {
		memcpy((char *)ts_buffer_data(w->dst) + w->offset, p, n);
		w->offset += n;
		return TS_OK;
	}
	while (n) {
		struct slot *sl = &w->slots[w->cur];
		size_t room, take;

		s = writer_slot_ready(w, err);
		if (s != TS_OK)
			goto out_fail;
		room = ts_buffer_size(sl->buf) - sl->fill;
		take = n < room ? n : room;
		memcpy((char *)ts_buffer_data(sl->buf) + sl->fill, p, take);
		sl->fill += take;
		w->offset += take;
		p += take;
		n -= take;
		if (sl->fill == ts_buffer_size(sl->buf)) {
			s = writer_flush_slot(w, err);
			if (s != TS_OK)
				goto out_fail;
		}
	}
	return TS_OK;

out_fail:
	w->failed = s;
	return s;
}

uint64_t ts_writer_offset(const struct ts_writer *w)
{
	return w->offset;
}

ts_status ts_writer_finish(struct ts_writer *w, struct ts_error *err)
{
	ts_status s = w->failed;

	if (s != TS_OK)
		return ts_error_set(err, s, "WRITE_FAILED", "an earlier write failed");
	if (!w->dq)
		return TS_OK;
	s = writer_flush_slot(w, err);
	for (int i = 0; i < TS_STAGE_SLOTS; i++) {
		if (!w->slots[i].in_flight)
			continue;
		ts_status e = ts_event_sync(w->slots[i].ev, err);

		w->slots[i].in_flight = false;
		if (s == TS_OK)
			s = e;
	}
	w->failed = s;
	return s;
}

void ts_writer_free(struct ts_writer *w)
{
	if (!w)
		return;
	for (int i = 0; i < TS_STAGE_SLOTS; i++) {
		if (w->slots[i].in_flight)
			(void)ts_event_sync(w->slots[i].ev, NULL);
		if (w->slots[i].ev)
			ts_event_free(w->slots[i].ev);
		ts_buffer_unref(w->slots[i].buf);
	}
	if (w->failed && w->dq)
		(void)ts_queue_sync(w->dq->h2d, NULL);   /* clear the failure for the next user */
	ts_buffer_unref(w->dst);
	free(w);
}

/* ---- reads and run copies --------------------------------------------------- */

/* Queues one copy and its event on q, then waits for it. */
static ts_status copy_and_wait(struct ts_queue *q, const struct ts_run *runs, size_t n,
                               char *dst, const char *src, enum ts_copy_kind kind,
                               struct ts_error *err)
{
	struct ts_event *ev = NULL;
	ts_status s = ts_event_new(ts_queue_device(q), &ev, err);

	for (size_t i = 0; s == TS_OK && i < n; i++)
		if (runs[i].len)
			s = ts_queue_copy(q, dst + runs[i].dst_offset, src + runs[i].src_offset,
			                  runs[i].len, kind, err);
	if (s == TS_OK)
		s = ts_event_record(ev, q, err);
	if (s == TS_OK)
		s = ts_event_sync(ev, err);
	if (s != TS_OK && ev)
		(void)ts_queue_sync(q, NULL);     /* nothing of ours queued; the failure cleared */
	if (ev)
		ts_event_free(ev);
	return s;
}


static ts_status check_runs(const struct ts_run *runs, size_t n, uint64_t src_size,
                            uint64_t dst_size, struct ts_error *err)
{
	for (size_t i = 0; i < n; i++)
		if (runs[i].src_offset > src_size || runs[i].len > src_size - runs[i].src_offset ||
		    runs[i].dst_offset > dst_size || runs[i].len > dst_size - runs[i].dst_offset)
			return ts_error_set(err, TS_OUT_OF_RANGE, "COPY_RANGE",
			                    "run %zu lies outside its buffers", i);
	return TS_OK;
}

ts_status ts_stage_read_runs(struct ts_stager *st, struct ts_buffer *src,
                             const struct ts_run *runs, size_t n, void *dst,
                             struct ts_error *err)
{
	const char *s = ts_buffer_data(src);
	ts_status rc = check_runs(runs, n, ts_buffer_size(src), UINT64_MAX, err);

	if (rc != TS_OK)
		return rc;
	count(st, ts_buffer_kind(src), TS_MEM_UNPINNED_HOST, runs_bytes(runs, n));
	if (ts_buffer_host_visible(src)) {
		for (size_t i = 0; i < n; i++)
			memcpy((char *)dst + runs[i].dst_offset, s + runs[i].src_offset, runs[i].len);
		return TS_OK;
	}
	return copy_and_wait(queues_for(st, ts_buffer_device(src))->d2h, runs, n, dst, s,
	                     TS_COPY_D2H, err);
}

/* ---- staged copies between pageable host memory and device memory ---------- */

/*
 * Pageable memory cannot be the end of an asynchronous device copy (CUDA
 * would stage it synchronously, one piece at a time), so such copies go
 * through a ring of pinned slots: for host->device, the CPU fills slot k+1
 * while the copy queue empties slot k; for device->host, the queue fills
 * slot k+1 while the CPU empties slot k.
 */
struct ring {
	struct ts_buffer *buf[TS_STAGE_SLOTS];
	struct ts_event *ev[TS_STAGE_SLOTS];
	uint64_t size;
	int n;
};

static void ring_free(struct ring *r)
{
	for (int i = 0; i < r->n; i++) {
		if (r->ev[i])
			ts_event_free(r->ev[i]);
		ts_buffer_unref(r->buf[i]);
	}
}

static ts_status ring_new(struct ts_stager *st, struct ts_device *dev, uint64_t total,
                          struct ring *r, struct ts_error *err)
{
	struct ts_space *pinned = ts_memory_find(st->mem, ts_device_props(dev)->id,
	                                         TS_MEM_PINNED_HOST);
	ts_status s = TS_OK;

	memset(r, 0, sizeof *r);
	r->size = total < TS_STAGE_SLOT ? (total ? total : 1) : TS_STAGE_SLOT;
	for (int i = 0; s == TS_OK && i < TS_STAGE_SLOTS; i++) {
		r->n = i + 1;
		s = ts_buffer_new(pinned, r->size, &r->buf[i], err);
		if (s == TS_OK)
			s = ts_event_new(dev, &r->ev[i], err);
	}
	if (s != TS_OK) {
		ring_free(r);
		r->n = 0;
	}
	return s;
}

/* One chunk of a run: where it comes from and goes, how long. */
struct chunk {
	uint64_t src, dst, len;
};

/* Walks runs in chunks no longer than max. */
static bool next_chunk(const struct ts_run *runs, size_t n, size_t *i, uint64_t *done,
                       uint64_t max, struct chunk *c)
{
	while (*i < n && *done == runs[*i].len) {
		(*i)++;
		*done = 0;
	}
	if (*i == n)
		return false;
	c->src = runs[*i].src_offset + *done;
	c->dst = runs[*i].dst_offset + *done;
	c->len = runs[*i].len - *done < max ? runs[*i].len - *done : max;
	*done += c->len;
	return true;
}

static ts_status staged_h2d(struct ts_stager *st, struct ts_buffer *dst, const char *s,
                            const struct ts_run *runs, size_t n, struct ts_error *err)
{
	struct ts_queue *q = queues_for(st, ts_buffer_device(dst))->h2d;
	char *d = ts_buffer_data(dst);
	bool busy[TS_STAGE_SLOTS] = {false};
	struct ring r;
	struct chunk c;
	size_t i = 0;
	uint64_t done = 0;
	int k = 0;
	ts_status rc = ring_new(st, ts_buffer_device(dst), runs_bytes(runs, n), &r, err);

	while (rc == TS_OK && next_chunk(runs, n, &i, &done, r.size, &c)) {
		if (busy[k]) {
			rc = ts_event_sync(r.ev[k], err);
			busy[k] = false;
			if (rc != TS_OK)
				break;
		}
		memcpy(ts_buffer_data(r.buf[k]), s + c.src, c.len);
		rc = ts_queue_copy(q, d + c.dst, ts_buffer_data(r.buf[k]), c.len, TS_COPY_H2D, err);
		if (rc == TS_OK)
			rc = ts_event_record(r.ev[k], q, err);
		busy[k] = rc == TS_OK;
		k = (k + 1) % TS_STAGE_SLOTS;
	}
	for (int j = 0; j < r.n; j++) {
		ts_status e = busy[j] ? ts_event_sync(r.ev[j], err) : TS_OK;

		if (rc == TS_OK)
			rc = e;
	}
	if (rc != TS_OK && r.n)
		(void)ts_queue_sync(q, NULL);
	ring_free(&r);
	return rc;
}

/* Empties slot k into d when it holds a finished chunk. */
static ts_status ring_drain(struct ring *r, int k, bool *busy, const struct chunk *pending,
                           char *d, ts_status rc, struct ts_error *err)
{
	ts_status e;

	if (!busy[k])
		return rc;
	e = ts_event_sync(r->ev[k], err);
	busy[k] = false;
	if (rc == TS_OK && e == TS_OK)
		memcpy(d + pending[k].dst, ts_buffer_data(r->buf[k]), pending[k].len);
	return rc == TS_OK ? e : rc;
}

static ts_status staged_d2h(struct ts_stager *st, char *d, struct ts_buffer *src,
                            const struct ts_run *runs, size_t n, struct ts_error *err)
{
	struct ts_queue *q = queues_for(st, ts_buffer_device(src))->d2h;
	const char *s = ts_buffer_data(src);
	struct chunk pending[TS_STAGE_SLOTS];
	bool busy[TS_STAGE_SLOTS] = {false};
	struct ring r;
	struct chunk c;
	size_t i = 0;
	uint64_t done = 0;
	int k = 0;
	ts_status rc = ring_new(st, ts_buffer_device(src), runs_bytes(runs, n), &r, err);

	while (rc == TS_OK && next_chunk(runs, n, &i, &done, r.size, &c)) {
		rc = ring_drain(&r, k, busy, pending, d, rc, err);   /* the oldest chunk */
		if (rc != TS_OK)
			break;
		rc = ts_queue_copy(q, ts_buffer_data(r.buf[k]), s + c.src, c.len, TS_COPY_D2H, err);
		if (rc == TS_OK)
			rc = ts_event_record(r.ev[k], q, err);
		if (rc != TS_OK)
			break;
		pending[k] = c;
		busy[k] = true;
		k = (k + 1) % TS_STAGE_SLOTS;
	}
	for (int j = 0; j < TS_STAGE_SLOTS; j++)
		rc = ring_drain(&r, (k + j) % TS_STAGE_SLOTS, busy, pending, d, rc, err);
	if (rc != TS_OK && r.n)
		(void)ts_queue_sync(q, NULL);
	ring_free(&r);
	return rc;
}

ts_status ts_stage_read(struct ts_stager *st, struct ts_buffer *src, uint64_t offset,
                        void *dst, uint64_t len, struct ts_error *err)
{
	struct ts_run run = {.src_offset = offset, .dst_offset = 0, .len = len};

	return ts_stage_read_runs(st, src, &run, 1, dst, err);
}

ts_status ts_stage_copy_runs(struct ts_stager *st, struct ts_buffer *dst,
                             struct ts_buffer *src, const struct ts_run *runs,
                             size_t n, struct ts_error *err)
{
	bool dh = ts_buffer_host_visible(dst), sh = ts_buffer_host_visible(src);
	char *d = ts_buffer_data(dst);
	const char *s = ts_buffer_data(src);
	ts_status rc = check_runs(runs, n, ts_buffer_size(src), ts_buffer_size(dst), err);

	if (rc != TS_OK)
		return rc;
	count(st, ts_buffer_kind(src), ts_buffer_kind(dst), runs_bytes(runs, n));
	if (dh && sh) {
		for (size_t i = 0; i < n; i++)
			memcpy(d + runs[i].dst_offset, s + runs[i].src_offset, runs[i].len);
		return TS_OK;
	}
	if (sh && ts_buffer_kind(src) != TS_MEM_PINNED_HOST)
		return staged_h2d(st, dst, s, runs, n, err);
	if (sh)
		return copy_and_wait(queues_for(st, ts_buffer_device(dst))->h2d, runs, n, d, s,
		                     TS_COPY_H2D, err);
	if (dh && ts_buffer_kind(dst) != TS_MEM_PINNED_HOST)
		return staged_d2h(st, d, src, runs, n, err);
	if (dh)
		return copy_and_wait(queues_for(st, ts_buffer_device(src))->d2h, runs, n, d, s,
		                     TS_COPY_D2H, err);
	return copy_and_wait(queues_for(st, ts_buffer_device(dst))->h2d, runs, n, d, s,
	                     TS_COPY_D2D, err);
}
