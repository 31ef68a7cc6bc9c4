/*
 * place.c - where a schedule's temps live in their arenas, and the memory
 * analysis read from the placed schedule (place.h).
 *
 * Two placements are made per memory kind and the smaller kept: the online
 * best fit of the schedule's order (what an allocator walking the actions
 * would do), and the offline greedy one that knows every temp's lifetime
 * (XLA's heap simulator), tried in several orders. Either way no two temps
 * alive at the same time overlap, and every temp starts at a multiple of
 * TS_PLAN_ALIGN.
 */
#include "train/place.h"

#include <stdlib.h>
#include <string.h>


/*
 * An arena of one memory kind: holes between live temps, best fit, merged
 * when freed; `end` is the high-water mark (the arena's size).
 */
struct arena {
	struct hole {
		uint64_t off, len;
	} *h;
	int n, cap;
	uint64_t end;
};

static uint64_t align_up(uint64_t n)
{
	return (n + TS_PLAN_ALIGN - 1) / TS_PLAN_ALIGN * TS_PLAN_ALIGN;
}

/* What a temp of `bytes` takes in its arena: an empty one takes a unit. */
static uint64_t temp_len(uint64_t bytes)
{
	return align_up(bytes ? bytes : 1);
}

static bool arena_place(struct arena *ar, uint64_t bytes, uint64_t *off)
{
	uint64_t len = temp_len(bytes);
	int best = -1;

	for (int i = 0; i < ar->n; i++)
		if (ar->h[i].len >= len && (best < 0 || ar->h[i].len < ar->h[best].len))
			best = i;
	if (best >= 0) {
		*off = ar->h[best].off;
		ar->h[best].off += len;
		ar->h[best].len -= len;
		if (!ar->h[best].len) {
			memmove(&ar->h[best], &ar->h[best + 1], (size_t)(ar->n - best - 1) * sizeof *ar->h);
			ar->n--;
		}
		return true;
	}
	/* a hole at the top grows into the space above it */
	if (ar->n && ar->h[ar->n - 1].off + ar->h[ar->n - 1].len == ar->end) {
		*off = ar->h[ar->n - 1].off;
		ar->n--;
	} else {
		*off = ar->end;
	}
	ar->end = *off + len;
	return true;
}

static bool arena_free(struct arena *ar, uint64_t off, uint64_t bytes)
{
	uint64_t len = temp_len(bytes);
	int i = 0;

	while (i < ar->n && ar->h[i].off < off)
		i++;
	if (ar->n == ar->cap) {
		int cap = ar->cap ? ar->cap * 2 : 32;
		struct hole *g = realloc(ar->h, (size_t)cap * sizeof *g);

		if (!g)
			return false;
		ar->h = g;
		ar->cap = cap;
	}
	memmove(&ar->h[i + 1], &ar->h[i], (size_t)(ar->n - i) * sizeof *ar->h);
	ar->h[i] = (struct hole){off, len};
	ar->n++;
	if (i + 1 < ar->n && ar->h[i].off + ar->h[i].len == ar->h[i + 1].off) {
		ar->h[i].len += ar->h[i + 1].len;
		memmove(&ar->h[i + 1], &ar->h[i + 2], (size_t)(ar->n - i - 2) * sizeof *ar->h);
		ar->n--;
	}
	if (i > 0 && ar->h[i - 1].off + ar->h[i - 1].len == ar->h[i].off) {
		ar->h[i - 1].len += ar->h[i].len;
		memmove(&ar->h[i], &ar->h[i + 1], (size_t)(ar->n - i - 1) * sizeof *ar->h);
		ar->n--;
	}
	return true;
}

/* The top of the live temps of an arena: its end less a hole at the top. */
static uint64_t arena_top(const struct arena *ar)
{
	if (ar->n && ar->h[ar->n - 1].off + ar->h[ar->n - 1].len == ar->end)
		return ar->h[ar->n - 1].off;
	return ar->end;
}

/* Whether an UPDATE writes a device argument (in place) through operand i. */
static bool writes_device_arg(const struct ts_plan *p, int i)
{
	return i >= 0 && p->bufs[i].cls == TS_PB_ARGUMENT && p->bufs[i].kind == TS_MEM_DEVICE;
}

/* Marks the arguments a step updates into new memory or journals (plan.h),
 * and places the journaled ones in the journal. */
static void mark_versioned(struct ts_plan *p)
{
	int first = -1;
	bool copy_after = false;
	uint64_t at = 0;

	if (p->opt.type == TS_OPT_NONE)
		return;
	for (int i = 0; i < p->nactions; i++) {
		const struct ts_paction *a = &p->actions[i];

		if (first < 0 && a->op == TS_P_UPDATE &&
		    (writes_device_arg(p, a->a) || writes_device_arg(p, a->c) ||
		     writes_device_arg(p, a->d)))
			first = i;
		if (first >= 0 && a->op == TS_P_COPY)
			copy_after = true;
	}
	for (int i = 0; i < p->nbufs; i++) {
		struct ts_pbuf *bf = &p->bufs[i];

		if (bf->cls != TS_PB_ARGUMENT || !ts_role_state(bf->role))
			continue;
		bf->versioned = bf->kind != TS_MEM_DEVICE;
		bf->journaled = bf->kind == TS_MEM_DEVICE && copy_after;
		if (bf->journaled) {
			bf->offset = at;
			at += align_up(bf->bytes);
		}
	}
	p->host_journal_size_in_bytes = at;
}

/* A temp's life in the schedule, for the offline placement. */
struct life {
	int buf;
	int from, to;                /* ALLOC and FREE action indices */
	uint64_t len;                /* aligned */
};

static int by_size_desc(const void *x, const void *y)
{
	const struct life *a = x, *b = y;

	if (a->len != b->len)
		return a->len < b->len ? 1 : -1;
	return a->from - b->from;
}

static int by_life_desc(const void *x, const void *y)
{
	const struct life *a = x, *b = y;

	if (a->to - a->from != b->to - b->from)
		return (b->to - b->from) - (a->to - a->from);
	return by_size_desc(x, y);
}

static int by_area_desc(const void *x, const void *y)
{
	const struct life *a = x, *b = y;
	double ka = (double)a->len * (a->to - a->from), kb = (double)b->len * (b->to - b->from);

	if (ka != kb)
		return ka < kb ? 1 : -1;
	return by_size_desc(x, y);
}

static int by_start(const void *x, const void *y)
{
	const struct life *a = x, *b = y;

	return a->from != b->from ? a->from - b->from : by_size_desc(x, y);
}

static int by_end_desc(const void *x, const void *y)
{
	const struct life *a = x, *b = y;

	return a->to != b->to ? b->to - a->to : by_size_desc(x, y);
}

static int by_offset(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;

	return a < b ? -1 : a > b;
}

/* Most temps of a kind placed offline (greedy by size, O(n^2)); beyond,
 * the online best fit of the schedule's order. */
#define OFFLINE_MAX 4096

/*
 * Places the temps of one memory kind knowing every lifetime (greedy, as
 * XLA's heap simulator, in the given order: by size, by lifetime or by
 * both - the caller keeps the best), each in the gap between already
 * placed temps alive at the same time that fits it tightest, or in the
 * lowest that fits (first_fit). Returns the arena's size, or UINT64_MAX when it could not
 * allocate (the caller uses the online placement then).
 */
static uint64_t place_offline(struct ts_plan *p, enum ts_memory_kind kind,
                              int (*order)(const void *, const void *), bool first_fit,
                              uint64_t shuffle)
{
	struct life *v = NULL;
	uint64_t *busy = NULL, end = 0;
	int n = 0, *live_at = calloc((size_t)p->nbufs + 1, sizeof *live_at);

	if (!live_at)
		return UINT64_MAX;
	for (int i = 0; i < p->nbufs; i++)
		live_at[i] = -1;
	v = malloc(((size_t)p->nbufs + 1) * sizeof *v);
	if (!v)
		goto out_fail;
	for (int i = 0; i < p->nactions; i++) {
		const struct ts_paction *a = &p->actions[i];
		const struct ts_pbuf *bf;

		if ((a->op != TS_P_ALLOC && a->op != TS_P_FREE) || a->a < 0)
			continue;
		bf = &p->bufs[a->a];
		if (bf->kind != kind)
			continue;
		if (a->op == TS_P_ALLOC) {
			live_at[a->a] = n;
			v[n++] = (struct life){a->a, i, p->nactions, temp_len(bf->bytes)};
		} else if (live_at[a->a] >= 0) {
			v[live_at[a->a]].to = i;
		}
	}
	if (n > OFFLINE_MAX)
		goto out_fail;
	qsort(v, (size_t)n, sizeof *v, order);
	/* a seeded perturbation of the order: swaps of neighbours */
	for (int k = 0; shuffle && k + 1 < n; k++) {
		shuffle = shuffle * 6364136223846793005ull + 1442695040888963407ull;
		if ((shuffle >> 61) == 0) {
			struct life t = v[k];

			v[k] = v[k + 1];
			v[k + 1] = t;
		}
	}
	busy = malloc(((size_t)n + 1) * 2 * sizeof *busy);
	if (!busy)
		goto out_fail;
	for (int k = 0; k < n; k++) {
		uint64_t best = UINT64_MAX, best_gap = UINT64_MAX, at = 0;
		int m = 0;

		/* the placed temps alive with this one, by offset: [off, end) pairs */
		for (int j = 0; j < k; j++)
			if (v[j].from < v[k].to && v[k].from < v[j].to) {
				busy[2 * m] = p->bufs[v[j].buf].offset;
				busy[2 * m + 1] = v[j].len;
				m++;
			}
		qsort(busy, (size_t)m, 2 * sizeof *busy, by_offset);
		for (int j = 0; j <= m; j++) {
			uint64_t stop = j < m ? busy[2 * j] : UINT64_MAX;

			if (stop > at && stop - at >= v[k].len && stop - at - v[k].len < best_gap &&
			    !(first_fit && best != UINT64_MAX)) {
				best = at;
				best_gap = stop - at - v[k].len;
			}
			if (j < m && busy[2 * j] + busy[2 * j + 1] > at)
				at = busy[2 * j] + busy[2 * j + 1];
		}
		p->bufs[v[k].buf].offset = best;
		if (best + v[k].len > end)
			end = best + v[k].len;
	}
	free(busy);
	free(v);
	free(live_at);
	return end;

out_fail:
	free(v);
	free(live_at);
	return UINT64_MAX;
}

/* A timeline point: the live device bytes after action a. */
static bool add_point(struct ts_plan *p, int *cap, const struct ts_paction *a, uint64_t live)
{
	if (p->npoints == *cap) {
		int ncap = *cap ? *cap * 2 : 128;
		void *g = realloc(p->points, (size_t)ncap * sizeof *p->points);

		if (!g)
			return false;
		p->points = g;
		*cap = ncap;
	}
	p->points[p->npoints].phase = a->phase;
	p->points[p->npoints].layer = a->layer;
	p->points[p->npoints].live = live;
	p->npoints++;
	return true;
}

/*
 * The online placement: each temp placed best fit when the schedule
 * allocates it, as an allocator walking the actions would. Sets the
 * arenas' sizes and the timeline (the top of the live device temps above
 * base_dev after each change), and peak[k] to the most aligned bytes live
 * at once in arena k (0 device, 1 pinned_host): no placement does better.
 */
static ts_status place_online(struct ts_plan *p, uint64_t base_dev, uint64_t *peak)
{
	struct arena dev = {0}, host = {0};
	uint64_t live[2] = {0, 0};
	ts_status st = TS_OK;
	int cap = 0;

	for (int i = 0; i < p->nactions && st == TS_OK; i++) {
		const struct ts_paction *a = &p->actions[i];
		struct ts_pbuf *bf;
		int k;

		if (a->op != TS_P_ALLOC && a->op != TS_P_FREE)
			continue;
		bf = &p->bufs[a->a];
		k = bf->kind == TS_MEM_DEVICE ? 0 : 1;
		if (a->op == TS_P_ALLOC)
			live[k] += temp_len(bf->bytes);
		else
			live[k] -= temp_len(bf->bytes);
		if (live[k] > peak[k])
			peak[k] = live[k];
		if (a->op == TS_P_ALLOC)
			arena_place(k ? &host : &dev, bf->bytes, &bf->offset);
		else if (!arena_free(k ? &host : &dev, bf->offset, bf->bytes))
			st = TS_RESOURCE_EXHAUSTED;
		if (st == TS_OK && k == 0 && !add_point(p, &cap, a, base_dev + arena_top(&dev)))
			st = TS_RESOURCE_EXHAUSTED;
	}
	free(dev.h);
	free(host.h);
	p->temp_size_in_bytes = dev.end;
	p->host_temp_size_in_bytes = host.end;
	return st;
}

/*
 * Places the temps of arena k (0 device, 1 pinned_host) offline in each
 * order and keeps the placement that makes the arena smallest, if smaller
 * than the one it has: the plain orders, then seeded perturbations while
 * the arena is above the live peak and the plan small enough to afford
 * them. saved is scratch of nbufs offsets. Returns whether it moved any.
 */
#define PERTURBATIONS 48

static bool place_kind(struct ts_plan *p, int k, uint64_t peak, uint64_t *saved)
{
	static const enum ts_memory_kind kinds[2] = {TS_MEM_DEVICE, TS_MEM_PINNED_HOST};
	static int (*const orders[])(const void *, const void *) = {
		by_size_desc, by_life_desc, by_area_desc, by_start, by_end_desc};
	const size_t norders = 2 * sizeof orders / sizeof orders[0];
	uint64_t *extent = k ? &p->host_temp_size_in_bytes : &p->temp_size_in_bytes, e;
	bool moved = false;

	for (size_t o = 0; o < norders + (p->nbufs <= 1024 ? PERTURBATIONS : 0); o++) {
		if (o >= norders && *extent <= peak)
			break;
		for (int i = 0; i < p->nbufs; i++)
			saved[i] = p->bufs[i].offset;
		e = place_offline(p, kinds[k], orders[(o / 2) % (norders / 2)], o % 2,
		                  o < norders ? 0 : (uint64_t)o);
		if (e < *extent) {
			*extent = e;
			moved = true;
			continue;
		}
		for (int i = 0; i < p->nbufs; i++)
			if (p->bufs[i].cls == TS_PB_TEMP && p->bufs[i].kind == kinds[k])
				p->bufs[i].offset = saved[i];
	}
	return moved;
}

/* Reads the timeline's points again from the device temps' offsets: the
 * top of the live temps above base_dev after each change. */
static ts_status reread_points(struct ts_plan *p, uint64_t base_dev)
{
	int *live = malloc(((size_t)p->nbufs + 1) * sizeof *live), nlive = 0, pt = 0;
	uint64_t top = 0;

	if (!live)
		return TS_RESOURCE_EXHAUSTED;
	for (int i = 0; i < p->nactions && pt < p->npoints; i++) {
		const struct ts_paction *a = &p->actions[i];
		const struct ts_pbuf *bf;
		uint64_t endb;

		if ((a->op != TS_P_ALLOC && a->op != TS_P_FREE) || a->a < 0)
			continue;
		bf = &p->bufs[a->a];
		if (bf->kind != TS_MEM_DEVICE)
			continue;
		endb = bf->offset + temp_len(bf->bytes);
		if (a->op == TS_P_ALLOC) {
			live[nlive++] = a->a;
			if (endb > top)
				top = endb;
		} else {
			for (int j = 0; j < nlive; j++)
				if (live[j] == a->a) {
					live[j] = live[--nlive];
					break;
				}
			if (endb == top) {
				top = 0;
				for (int j = 0; j < nlive; j++) {
					const struct ts_pbuf *o = &p->bufs[live[j]];
					uint64_t e2 = o->offset + temp_len(o->bytes);

					if (e2 > top)
						top = e2;
				}
			}
		}
		p->points[pt++].live = base_dev + top;
	}
	free(live);
	return TS_OK;
}

/* Keeps, per memory kind, the smaller of the online placement and the
 * offline one; when the device's changes, the timeline follows it. */
static ts_status place_better(struct ts_plan *p, uint64_t base_dev, const uint64_t *peak)
{
	uint64_t *saved = malloc(((size_t)p->nbufs + 1) * sizeof *saved);
	bool moved_dev;

	if (!saved)
		return TS_RESOURCE_EXHAUSTED;
	moved_dev = place_kind(p, 0, peak[0], saved);
	place_kind(p, 1, peak[1], saved);
	free(saved);
	return moved_dev ? reread_points(p, base_dev) : TS_OK;
}

/* The argument, output, alias and version sizes (plan.h) of p's buffers. */
static void count_buffers(struct ts_plan *p)
{
	p->argument_size_in_bytes = p->output_size_in_bytes = p->alias_size_in_bytes = 0;
	p->host_argument_size_in_bytes = p->host_output_size_in_bytes = 0;
	p->host_alias_size_in_bytes = 0;
	p->host_version_size_in_bytes = 0;
	for (int i = 0; i < p->nbufs; i++) {
		const struct ts_pbuf *bf = &p->bufs[i];
		bool isdev = bf->kind == TS_MEM_DEVICE;
		bool updated = p->opt.type != TS_OPT_NONE && ts_role_state(bf->role);

		if (bf->cls == TS_PB_ARGUMENT) {
			*(isdev ? &p->argument_size_in_bytes : &p->host_argument_size_in_bytes) += bf->bytes;
			if (bf->versioned)
				p->host_version_size_in_bytes += bf->bytes;
			else if (updated)
				*(isdev ? &p->alias_size_in_bytes : &p->host_alias_size_in_bytes) += bf->bytes;
		} else if (bf->cls == TS_PB_OUTPUT) {
			*(isdev ? &p->output_size_in_bytes : &p->host_output_size_in_bytes) += bf->bytes;
		}
	}
}

/* The bytes p's copies move from the host to the device and back. */
static void count_copies(struct ts_plan *p)
{
	p->h2d_bytes = p->d2h_bytes = 0;
	for (int i = 0; i < p->nactions; i++) {
		const struct ts_paction *a = &p->actions[i];
		bool to_dev, from_dev;

		if (a->op != TS_P_COPY)
			continue;
		to_dev = p->bufs[a->a].kind == TS_MEM_DEVICE;
		from_dev = p->bufs[a->b].kind == TS_MEM_DEVICE;
		if (to_dev && !from_dev)
			p->h2d_bytes += a->bytes;
		else if (!to_dev && from_dev)
			p->d2h_bytes += a->bytes;
	}
}

ts_status ts__plan_analyse(struct ts_plan *p)
{
	uint64_t base_dev, live_peak[2] = {0, 0};
	ts_status st;

	p->host_journal_size_in_bytes = 0;
	mark_versioned(p);
	count_buffers(p);
	count_copies(p);
	base_dev = p->argument_size_in_bytes + p->output_size_in_bytes;
	st = place_online(p, base_dev, live_peak);
	if (st == TS_OK)
		st = place_better(p, base_dev, live_peak);
	p->peak_device_bytes = base_dev + p->temp_size_in_bytes;
	return st;
}
