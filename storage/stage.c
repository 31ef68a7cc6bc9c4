/*
 * stage.c - writers, reads and run copies over host-visible and device
 * buffers, with per-device copy queues and pinned staging slots.
 */
#include "storage/stage.h"

#include <stdlib.h>
#include <string.h>

struct dev_queues {
	struct ts_device *dev;    /* immutable */
	struct ts_queue *h2d;     /* immutable; host->device and device->device */
	struct ts_queue *d2h;     /* immutable */
};

struct ts_stager {
	struct ts_memory *mem;    /* borrowed */
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
	struct ts_writer *w = calloc(1, sizeof *w);
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
	else if (ev)
		(void)ts_queue_sync(q, NULL);     /* nothing of ours may still be queued */
	if (ev)
		ts_event_free(ev);
	return s;
}

ts_status ts_stage_read(struct ts_stager *st, struct ts_buffer *src, uint64_t offset,
                        void *dst, uint64_t len, struct ts_error *err)
{
	struct ts_run run = {.src_offset = offset, .dst_offset = 0, .len = len};
	struct dev_queues *dq;

	if (offset > ts_buffer_size(src) || len > ts_buffer_size(src) - offset)
		return ts_error_set(err, TS_OUT_OF_RANGE, "READ_RANGE", "read past the end of a buffer");
	if (ts_buffer_host_visible(src)) {
		memcpy(dst, (const char *)ts_buffer_data(src) + offset, len);
		return TS_OK;
	}
	dq = queues_for(st, ts_buffer_device(src));
	return copy_and_wait(dq->d2h, &run, 1, dst, ts_buffer_data(src), TS_COPY_D2H, err);
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
	if (ts_buffer_host_visible(src)) {
		for (size_t i = 0; i < n; i++)
			memcpy((char *)dst + runs[i].dst_offset, s + runs[i].src_offset, runs[i].len);
		return TS_OK;
	}
	return copy_and_wait(queues_for(st, ts_buffer_device(src))->d2h, runs, n, dst, s,
	                     TS_COPY_D2H, err);
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
	if (dh && sh) {
		for (size_t i = 0; i < n; i++)
			memcpy(d + runs[i].dst_offset, s + runs[i].src_offset, runs[i].len);
		return TS_OK;
	}
	if (sh)
		return copy_and_wait(queues_for(st, ts_buffer_device(dst))->h2d, runs, n, d, s,
		                     TS_COPY_H2D, err);
	if (dh)
		return copy_and_wait(queues_for(st, ts_buffer_device(src))->d2h, runs, n, d, s,
		                     TS_COPY_D2H, err);
	return copy_and_wait(queues_for(st, ts_buffer_device(dst))->h2d, runs, n, d, s,
	                     TS_COPY_D2D, err);
}
