/*
 * stage.c - writers, reads and run copies over host-visible and device
 * buffers, with per-device copy queues and pinned staging slots. Which queue
 * carries a copy is decided in route() alone (see there).
 */
#include "storage/stage.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/copy.h"
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
	const struct ts_topology *topo; /* borrowed; immutable once shared; NULL: all peers */
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

/* dev's queues, or NULL for a device the stager was not made with. */
static struct dev_queues *queues_for(struct ts_stager *st, struct ts_device *dev)
{
	for (size_t i = 0; i < st->n; i++)
		if (st->q[i].dev == dev)
			return &st->q[i];
	return NULL;
}

static ts_status no_queues(const struct ts_device *dev, struct ts_error *err)
{
	return ts_error_set(err, TS_INTERNAL, "NO_QUEUES", "device '%s' has no copy queues here",
	                    dev ? ts_device_props(dev)->id : "?");
}

ts_status ts_stager_new(struct ts_device_set *set, struct ts_memory *mem,
                        struct ts_stager **out, struct ts_error *err)
{
	struct ts_stager *st = calloc(1, sizeof *st);
	size_t n = ts_device_set_count(set);
	ts_status s = TS_OK;

	if (!st || !(st->q = calloc(n, sizeof *st->q))) {
		free(st);
		return ts_error_oom(err, "no memory for the stager");
	}
	st->mem = mem;
	for (size_t i = 0; i < n && s == TS_OK; i++) {
		st->q[i].dev = ts_device_set_at(set, i);
		s = ts_queue_new(st->q[i].dev, &st->q[i].h2d, err);
		if (s == TS_OK)
			s = ts_queue_new(st->q[i].dev, &st->q[i].d2h, err);
		if (s == TS_OK) {
			ts_queue_set_label(st->q[i].h2d, "copy h2d");
			ts_queue_set_label(st->q[i].d2h, "copy d2h");
		}
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
		return ts_error_oom(err, "no memory for a writer");
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
		if (!w->dq)
			s = no_queues(dev, err);
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
		/* host memory that nothing reads before the upload ends */
		ts_copy_streaming((char *)ts_buffer_data(w->dst) + w->offset, p, n);
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

/* ---- routes: which queue carries a copy ------------------------------------- */

/*
 * Every copy between two ends goes the way route() says, and route() is the
 * only place that decides it:
 *
 *   HOST      both ends host-visible: memcpy on the calling thread;
 *   QUEUE     one device's queue reaches both ends: asynchronous copies on
 *             it, the destination's h2d queue when it reaches both, else the
 *             source's d2h queue. A queue reaches pinned host memory (on CUDA
 *             it is cudaHostAlloc'd portable: every GPU's streams may use it),
 *             its device's own memory, and the device memory of a peer of the
 *             same backend (CUDA peers through unified addressing; sim
 *             devices, whose memory is host memory). Pageable host memory is
 *             reached by no queue (CUDA would stage it synchronously);
 *   RING_H2D  pageable host -> device: through pinned slots on the device's
 *             h2d queue;
 *   RING_D2H  device -> pageable host: through pinned slots on the device's
 *             d2h queue;
 *   RING_D2D  device memory of two backends (a CUDA GPU and a sim device),
 *             or of two devices without peer access in the topology's
 *             matrix: no queue may reach both, so each slot is filled from the source
 *             on the source's d2h queue and emptied into the destination on
 *             the destination's h2d queue.
 *
 * So a copy with a CUDA end always runs on a stream of that GPU (or of its
 * peer for GPU <-> GPU), whose backend makes the GPU current first.
 */
enum route_kind {
	ROUTE_HOST = 0,
	ROUTE_QUEUE,
	ROUTE_RING_H2D,
	ROUTE_RING_D2H,
	ROUTE_RING_D2D,
};

struct route {
	enum route_kind kind;
	struct ts_queue *q;          /* QUEUE; the device end's queue of a ring; D2D: the source's */
	struct ts_queue *q2;         /* D2D: the destination's h2d queue */
	enum ts_copy_kind ck;        /* QUEUE */
	struct ts_device *slots_dev; /* rings: whose pinned space the slots come from */
};

/* Whether work on dev's queues may touch b directly; b NULL is the
 * caller's own (pageable) memory. */
static bool reaches(const struct ts_device *dev, const struct ts_buffer *b)
{
	if (!b)
		return false;
	if (ts_buffer_kind(b) == TS_MEM_PINNED_HOST)
		return true;
	if (ts_buffer_host_visible(b))
		return false;
	return ts_device_props(ts_buffer_device(b))->backend == ts_device_props(dev)->backend;
}

/* Whether the peer matrix lets sd's queues copy into dd's memory directly
 * (and dd's queues read sd's): both directions must allow it, since either
 * device's queue may carry the copy. */
static bool peers(const struct ts_stager *st, const struct ts_device *sd,
                  const struct ts_device *dd)
{
	const struct ts_topology_peer *a, *b;

	if (!st->topo || sd == dd)
		return true;
	a = ts_topology_peer_find(st->topo, ts_device_props(sd)->id, ts_device_props(dd)->id);
	b = ts_topology_peer_find(st->topo, ts_device_props(dd)->id, ts_device_props(sd)->id);
	return (!a || a->access) && (!b || b->access);
}

/* How bytes go from src to dst (NULL: the caller's host memory). INTERNAL
 * when a device end has no queues here (a device of another set). */
static ts_status route(struct ts_stager *st, const struct ts_buffer *dst,
                       const struct ts_buffer *src, struct route *r, struct ts_error *err)
{
	bool dh = !dst || ts_buffer_host_visible(dst), sh = ts_buffer_host_visible(src);
	struct ts_device *dd = dst ? ts_buffer_device(dst) : NULL, *sd = ts_buffer_device(src);
	/* device memory of two devices: directly only between peers */
	bool direct = dh || sh || peers(st, sd, dd);

	memset(r, 0, sizeof *r);
	if (!dh && !queues_for(st, dd))
		return no_queues(dd, err);
	if (!sh && !queues_for(st, sd))
		return no_queues(sd, err);
	if (dh && sh) {
		r->kind = ROUTE_HOST;
	} else if (!dh && direct && reaches(dd, dst) && reaches(dd, src)) {
		r->kind = ROUTE_QUEUE;
		r->q = queues_for(st, dd)->h2d;
		r->ck = sh ? TS_COPY_H2D : TS_COPY_D2D;
	} else if (!sh && direct && reaches(sd, src) && reaches(sd, dst)) {
		r->kind = ROUTE_QUEUE;
		r->q = queues_for(st, sd)->d2h;
		r->ck = dh ? TS_COPY_D2H : TS_COPY_D2D;
	} else if (sh) {
		r->kind = ROUTE_RING_H2D;
		r->q = queues_for(st, dd)->h2d;
		r->slots_dev = dd;
	} else if (dh) {
		r->kind = ROUTE_RING_D2H;
		r->q = queues_for(st, sd)->d2h;
		r->slots_dev = sd;
	} else {
		r->kind = ROUTE_RING_D2D;
		r->q = queues_for(st, sd)->d2h;
		r->q2 = queues_for(st, dd)->h2d;
		r->slots_dev = sd;
	}
	return TS_OK;
}

void ts_stager_set_topology(struct ts_stager *st, const struct ts_topology *t)
{
	st->topo = t;
}

enum ts_stage_path ts_stage_path_of(struct ts_stager *st, const struct ts_buffer *dst,
                                    const struct ts_buffer *src)
{
	struct route r;

	if (ts_buffer_host_visible(dst) || ts_buffer_host_visible(src) ||
	    ts_buffer_device(dst) == ts_buffer_device(src) || route(st, dst, src, &r, NULL) != TS_OK)
		return TS_STAGE_PATH_NONE;
	return r.kind == ROUTE_QUEUE ? TS_STAGE_PATH_PEER : TS_STAGE_PATH_STAGED;
}

/* ---- reads and run copies --------------------------------------------------- */

/* Queues every run on q as its own copy and waits once. */
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

/* ---- batches: runs cut into slot-sized pieces, pieces grouped into windows ---- */

/* One piece of a run: where it comes from and goes, how long. */
struct chunk {
	uint64_t src, dst, len;
};

/* Walks runs in pieces no longer than max. */
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

/*
 * A window: consecutive pieces whose source bytes are staged as one range
 * [lo, hi), so that a strided selection costs one copy per window instead of
 * one per element run. A piece joins the window when the range stays within
 * one staging slot and the piece lies at most TS_STAGE_GAP bytes from it:
 * bridging 64 KiB costs a few microseconds of bus time, about what one more
 * copy's fixed cost is, so a window never moves much more than the pieces
 * would have cost anyway. Pieces are replayed from (i, done) to place them.
 */
struct window {
	uint64_t lo, hi;
	size_t i, npieces;
	uint64_t done;
};

static bool next_window(const struct ts_run *runs, size_t n, size_t *i, uint64_t *done,
                        struct window *w)
{
	struct chunk c;

	w->i = *i;
	w->done = *done;
	if (!next_chunk(runs, n, i, done, TS_STAGE_SLOT, &c))
		return false;
	w->lo = c.src;
	w->hi = c.src + c.len;
	w->npieces = 1;
	for (;;) {
		size_t pi = *i;
		uint64_t pd = *done, lo, hi, gap;

		if (!next_chunk(runs, n, &pi, &pd, TS_STAGE_SLOT, &c))
			break;
		lo = c.src < w->lo ? c.src : w->lo;
		hi = c.src + c.len > w->hi ? c.src + c.len : w->hi;
		gap = c.src >= w->hi ? c.src - w->hi :
		      c.src + c.len <= w->lo ? w->lo - (c.src + c.len) : 0;
		if (hi - lo > TS_STAGE_SLOT || gap > TS_STAGE_GAP)
			break;
		w->lo = lo;
		w->hi = hi;
		w->npieces++;
		*i = pi;
		*done = pd;
	}
	return true;
}

/* The k-th piece of w, in order (k counts from 0 on each call sequence). */
struct window_walk {
	size_t i;
	uint64_t done;
};

static void window_walk_init(struct window_walk *ww, const struct window *w)
{
	ww->i = w->i;
	ww->done = w->done;
}

static void window_walk_next(struct window_walk *ww, const struct ts_run *runs, size_t n,
                             struct chunk *c)
{
	(void)next_chunk(runs, n, &ww->i, &ww->done, TS_STAGE_SLOT, c);
}

/* Number of windows, the widest one's span and the number of pieces. */
static void plan_windows(const struct ts_run *runs, size_t n, size_t *count, uint64_t *widest,
                         size_t *pieces)
{
	struct window w;
	size_t i = 0;
	uint64_t done = 0;

	*count = *pieces = 0;
	*widest = 0;
	while (next_window(runs, n, &i, &done, &w)) {
		(*count)++;
		*pieces += w.npieces;
		if (w.hi - w.lo > *widest)
			*widest = w.hi - w.lo;
	}
}

/* ---- staged copies through a ring of pinned slots ---------------------------- */

/*
 * Pageable memory cannot be the end of an asynchronous device copy, and a
 * GPU and a sim device share no queue, so such copies go through a ring of
 * pinned slots, one window per slot: for host->device, the CPU fills slot
 * k+1 while the queue empties slot k; for device->host, the queue fills slot
 * k+1 while the CPU empties slot k; for device->device, the source's queue
 * fills slot k+1 while the destination's empties slot k.
 */
struct ring {
	struct ts_buffer *buf[TS_STAGE_SLOTS];
	struct ts_event *ev[TS_STAGE_SLOTS];     /* on q: the slot's last fill or empty */
	struct ts_event *ev2[TS_STAGE_SLOTS];    /* D2D: on q2, the slot's last empty */
	struct window win[TS_STAGE_SLOTS];       /* what the slot holds (D2H) */
	bool busy[TS_STAGE_SLOTS], busy2[TS_STAGE_SLOTS];
	uint64_t size;
	int n;
};

static void ring_free(struct ring *r)
{
	for (int i = 0; i < r->n; i++) {
		if (r->ev[i])
			ts_event_free(r->ev[i]);
		if (r->ev2[i])
			ts_event_free(r->ev2[i]);
		ts_buffer_unref(r->buf[i]);
	}
	r->n = 0;
}

static ts_status ring_new(struct ts_stager *st, const struct route *rt, uint64_t size,
                          size_t windows, struct ring *r, struct ts_error *err)
{
	struct ts_space *pinned = ts_memory_find(st->mem, ts_device_props(rt->slots_dev)->id,
	                                         TS_MEM_PINNED_HOST);
	int want = windows < TS_STAGE_SLOTS ? (int)windows : TS_STAGE_SLOTS;
	ts_status s = TS_OK;

	memset(r, 0, sizeof *r);
	r->size = size ? size : 1;
	for (int i = 0; s == TS_OK && i < (want ? want : 1); i++) {
		r->n = i + 1;
		s = ts_buffer_new(pinned, r->size, &r->buf[i], err);
		if (s == TS_OK)
			s = ts_event_new(ts_queue_device(rt->q), &r->ev[i], err);
		if (s == TS_OK && rt->q2)
			s = ts_event_new(ts_queue_device(rt->q2), &r->ev2[i], err);
	}
	if (s != TS_OK)
		ring_free(r);
	return s;
}

/* Waits for slot k's work on q (and q2), keeping the first failure. */
static ts_status ring_wait(struct ring *r, int k, ts_status rc, struct ts_error *err)
{
	ts_status e;

	if (r->busy[k]) {
		e = ts_event_sync(r->ev[k], err);
		r->busy[k] = false;
		rc = rc == TS_OK ? e : rc;
	}
	if (r->busy2[k]) {
		e = ts_event_sync(r->ev2[k], err);
		r->busy2[k] = false;
		rc = rc == TS_OK ? e : rc;
	}
	return rc;
}

/* Queues the pieces of w from slot k (holding source bytes [w->lo, w->hi))
 * into d on q, and marks the slot with ev. */
static ts_status ring_empty_to_device(struct ring *r, int k, const struct window *w,
                                      const struct ts_run *runs, size_t n, char *d,
                                      struct ts_queue *q, struct ts_event *ev,
                                      struct ts_error *err)
{
	const char *slot = ts_buffer_data(r->buf[k]);
	struct window_walk ww;
	struct chunk c;
	ts_status s = TS_OK;

	window_walk_init(&ww, w);
	for (size_t p = 0; s == TS_OK && p < w->npieces; p++) {
		window_walk_next(&ww, runs, n, &c);
		s = ts_queue_copy(q, d + c.dst, slot + (c.src - w->lo), c.len, TS_COPY_H2D, err);
	}
	if (s == TS_OK)
		s = ts_event_record(ev, q, err);
	return s;
}

/* Copies the pieces of the window slot k holds out to host memory d. */
static void ring_empty_to_host(struct ring *r, int k, const struct ts_run *runs, size_t n,
                               char *d)
{
	const char *slot = ts_buffer_data(r->buf[k]);
	const struct window *w = &r->win[k];
	struct window_walk ww;
	struct chunk c;

	window_walk_init(&ww, w);
	for (size_t p = 0; p < w->npieces; p++) {
		window_walk_next(&ww, runs, n, &c);
		/* d is read by no one until the copy ends (common/copy.h): the
		 * stores go around the cache; the slot, read by the copy engine
		 * right after an H2D fill, takes plain stores there */
		ts_copy_streaming(d + c.dst, slot + (c.src - w->lo), c.len);
	}
}

/* Slot k, when it holds a finished device->host window, emptied into d. */
static ts_status ring_drain(struct ring *r, int k, const struct ts_run *runs, size_t n,
                            char *d, ts_status rc, struct ts_error *err)
{
	bool held = r->busy[k];

	rc = ring_wait(r, k, rc, err);
	if (held && rc == TS_OK)
		ring_empty_to_host(r, k, runs, n, d);
	return rc;
}

/* One window through slot k, for each kind of ring. */
static ts_status ring_step(struct ring *r, int k, const struct route *rt, const struct window *w,
                           const struct ts_run *runs, size_t n, char *d, const char *s,
                           struct ts_error *err)
{
	void *slot = ts_buffer_data(r->buf[k]);
	ts_status rc;

	switch (rt->kind) {
	case ROUTE_RING_H2D:
		memcpy(slot, s + w->lo, w->hi - w->lo);
		rc = ring_empty_to_device(r, k, w, runs, n, d, rt->q, r->ev[k], err);
		r->busy[k] = rc == TS_OK;
		return rc;
	case ROUTE_RING_D2H:
		rc = ts_queue_copy(rt->q, slot, s + w->lo, w->hi - w->lo, TS_COPY_D2H, err);
		if (rc == TS_OK)
			rc = ts_event_record(r->ev[k], rt->q, err);
		r->win[k] = *w;
		r->busy[k] = rc == TS_OK;
		return rc;
	case ROUTE_RING_D2D:
	default:
		rc = ts_queue_copy(rt->q, slot, s + w->lo, w->hi - w->lo, TS_COPY_D2H, err);
		if (rc == TS_OK)
			rc = ts_event_record(r->ev[k], rt->q, err);
		if (rc == TS_OK)
			rc = ts_event_sync(r->ev[k], err);  /* the two queues meet only here */
		if (rc == TS_OK)
			rc = ring_empty_to_device(r, k, w, runs, n, d, rt->q2, r->ev2[k], err);
		r->busy2[k] = rc == TS_OK;
		return rc;
	}
}

/*
 * Copies runs from s to d along a ring route and waits for all of it.
 * Returns RESOURCE_EXHAUSTED, before moving anything, when the pinned slots
 * cannot be had.
 */
static ts_status ring_copy(struct ts_stager *st, const struct route *rt, char *d,
                           const char *s, const struct ts_run *runs, size_t n,
                           struct ts_error *err)
{
	struct ring r;
	struct window w;
	size_t i = 0, windows, pieces;
	uint64_t done = 0, widest;
	int k = 0;
	ts_status rc;

	plan_windows(runs, n, &windows, &widest, &pieces);
	if (!windows)
		return TS_OK;
	rc = ring_new(st, rt, widest, windows, &r, err);
	if (rc != TS_OK)
		return rc;
	while (rc == TS_OK && next_window(runs, n, &i, &done, &w)) {
		/* the slot's previous window must be done (and, D2H, emptied) */
		rc = rt->kind == ROUTE_RING_D2H ? ring_drain(&r, k, runs, n, d, rc, err)
		                                : ring_wait(&r, k, rc, err);
		if (rc == TS_OK)
			rc = ring_step(&r, k, rt, &w, runs, n, d, s, err);
		k = (k + 1) % r.n;
	}
	for (int j = 0; j < r.n; j++) {
		int m = (k + j) % r.n;

		rc = rt->kind == ROUTE_RING_D2H ? ring_drain(&r, m, runs, n, d, rc, err)
		                                : ring_wait(&r, m, rc, err);
	}
	if (rc != TS_OK) {
		(void)ts_queue_sync(rt->q, NULL);     /* clear the failure for the next user */
		if (rt->q2)
			(void)ts_queue_sync(rt->q2, NULL);
	}
	ring_free(&r);
	return rc;
}

/* ---- the entry points -------------------------------------------------------- */

static void host_copy(char *d, const char *s, const struct ts_run *runs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		memcpy(d + runs[i].dst_offset, s + runs[i].src_offset, runs[i].len);
}

ts_status ts_stage_read_runs(struct ts_stager *st, struct ts_buffer *src,
                             const struct ts_run *runs, size_t n, void *dst,
                             struct ts_error *err)
{
	const char *s = ts_buffer_data(src);
	struct route rt;
	size_t windows, pieces;
	uint64_t widest;
	ts_status rc = check_runs(runs, n, ts_buffer_size(src), UINT64_MAX, err);

	if (rc != TS_OK)
		return rc;
	count(st, ts_buffer_kind(src), TS_MEM_UNPINNED_HOST, runs_bytes(runs, n));
	if ((rc = route(st, NULL, src, &rt, err)) != TS_OK)
		return rc;
	if (rt.kind == ROUTE_HOST) {
		host_copy(dst, s, runs, n);
		return TS_OK;
	}
	/*
	 * Runs that windows gather are staged (one copy per window); runs that
	 * no window gathers gain nothing from a slot, and go straight to dst as
	 * before (a device->pageable copy, which CUDA stages itself). Without
	 * pinned slots to spare, the direct way serves every read.
	 */
	plan_windows(runs, n, &windows, &widest, &pieces);
	if (windows < pieces) {
		struct ts_error tmp;

		ts_error_clear(&tmp);
		rc = ring_copy(st, &rt, dst, s, runs, n, &tmp);
		if (rc != TS_RESOURCE_EXHAUSTED || tmp.status != TS_RESOURCE_EXHAUSTED ||
		    strcmp(tmp.reason, "OUT_OF_MEMORY") != 0) {
			if (rc != TS_OK && err && err->status == TS_OK)
				*err = tmp;
			return rc;
		}
	}
	return copy_and_wait(rt.q, runs, n, dst, s, TS_COPY_D2H, err);
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
	char *d = ts_buffer_data(dst);
	const char *s = ts_buffer_data(src);
	struct route rt;
	ts_status rc = check_runs(runs, n, ts_buffer_size(src), ts_buffer_size(dst), err);

	if (rc != TS_OK)
		return rc;
	count(st, ts_buffer_kind(src), ts_buffer_kind(dst), runs_bytes(runs, n));
	if ((rc = route(st, dst, src, &rt, err)) != TS_OK)
		return rc;
	switch (rt.kind) {
	case ROUTE_HOST:
		/* into a new array's fresh pages through their file (a copy's
		 * destination is new memory: every page a fault and a zeroing
		 * otherwise, about half the time of a 1 GiB copy) */
		for (size_t i = 0; i < n; i++)
			ts_host_mem_fill(ts_buffer_device(dst), d + runs[i].dst_offset,
			                 s + runs[i].src_offset, runs[i].len);
		return TS_OK;
	case ROUTE_QUEUE:
		return copy_and_wait(rt.q, runs, n, d, s, rt.ck, err);
	default:
		return ring_copy(st, &rt, d, s, runs, n, err);
	}
}
