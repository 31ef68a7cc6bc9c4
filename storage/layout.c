/*
 * layout.c - splitting parent byte ranges into per-shard contiguous pieces.
 */
#include "storage/layout.h"

#include <stddef.h>
#include <string.h>

void ts_layout_init(struct ts_layout *l, int rank, const uint64_t *shape, size_t elem_size,
                    const struct ts_shard_box *boxes, int n)
{
	/* the shards past n are never read: only those in use are cleared */
	memset(l, 0, ts_layout_bytes(n));
	l->rank = rank + 1;
	for (int d = 0; d < rank; d++)
		l->shape[d] = shape[d];
	l->shape[rank] = elem_size;
	l->stride[rank] = 1;
	for (int d = rank - 1; d >= 0; d--)
		l->stride[d] = l->stride[d + 1] * l->shape[d + 1];
	l->nshards = n;
	for (int i = 0; i < n; i++) {
		for (int d = 0; d < rank; d++) {
			l->shard[i].start[d] = boxes[i].start[d];
			l->shard[i].stop[d] = boxes[i].start[d] + boxes[i].count[d];
		}
		l->shard[i].start[rank] = 0;
		l->shard[i].stop[rank] = elem_size;
		l->shard[i].stride[rank] = 1;
		for (int d = rank - 1; d >= 0; d--)
			l->shard[i].stride[d] = l->shard[i].stride[d + 1] *
			                        (l->shard[i].stop[d + 1] - l->shard[i].start[d + 1]);
		l->shard[i].primary = boxes[i].replica == 0;
	}
}

size_t ts_layout_bytes(int n)
{
	const struct ts_layout *l = NULL;

	return offsetof(struct ts_layout, shard) + (size_t)n * sizeof l->shard[0];
}

uint64_t ts_layout_shard_bytes(const struct ts_layout *l, int i)
{
	uint64_t n = 1;

	for (int d = 0; d < l->rank; d++)
		n *= l->shard[i].stop[d] - l->shard[i].start[d];
	return n;
}

static bool contains(const struct ts_layout *l, int s, const uint64_t *m)
{
	for (int d = 0; d < l->rank; d++)
		if (m[d] < l->shard[s].start[d] || m[d] >= l->shard[s].stop[d])
			return false;
	return true;
}

/*
 * Bytes from index m on that stay contiguous in shard s (and the parent):
 * to the end of the box along the innermost dimension k the box does not
 * span whole (or dimension 0), since every dimension inside k is whole and
 * so laid out alike in the parent and in the shard, wherever m starts.
 */
static uint64_t span_in(const struct ts_layout *l, int s, const uint64_t *m)
{
	int k = l->rank - 1;
	uint64_t inner = 0;

	while (k > 0 && l->shard[s].start[k] == 0 && l->shard[s].stop[k] == l->shape[k])
		k--;
	for (int d = k + 1; d < l->rank; d++)
		inner += m[d] * l->stride[d];
	return (l->shard[s].stop[k] - m[k]) * l->stride[k] - inner;
}

static uint64_t local_of(const struct ts_layout *l, int s, const uint64_t *m)
{
	uint64_t off = 0;

	for (int d = 0; d < l->rank; d++)
		off += (m[d] - l->shard[s].start[d]) * l->shard[s].stride[d];
	return off;
}

ts_status ts_layout_split(const struct ts_layout *l, uint64_t off, uint64_t len,
                          bool primary_only,
                          ts_status (*fn)(const struct ts_piece *pc, void *arg,
                                          struct ts_error *err),
                          void *arg, struct ts_error *err)
{
	uint64_t m[TS_MAX_RANK + 1], end = off + len;

	while (off < end) {
		uint64_t rest = off, step = 0;
		bool found = false;

		for (int d = 0; d < l->rank; d++) {
			m[d] = rest / l->stride[d];
			rest %= l->stride[d];
		}
		for (int s = 0; s < l->nshards; s++) {
			struct ts_piece pc;

			if ((primary_only && !l->shard[s].primary) || !contains(l, s, m))
				continue;
			step = span_in(l, s, m);
			if (step > end - off)
				step = end - off;
			pc = (struct ts_piece){.shard = s, .local = local_of(l, s, m), .parent = off,
			                       .len = step};
			ts_status st = fn(&pc, arg, err);

			if (st != TS_OK)
				return st;
			found = true;
			if (primary_only)
				break;
		}
		if (!found)
			return ts_error_set(err, TS_INTERNAL, "LAYOUT_HOLE",
			                    "byte %llu of the array lies in no shard",
			                    (unsigned long long)off);
		off += step;
	}
	return TS_OK;
}
