/*
 * colocate.c - choosing an operation's device from its committed arrays and
 * moving the uncommitted ones there, counted.
 */
#include "storage/colocate.h"

#include <stdio.h>
#include <string.h>

#include "storage/move.h"

static struct ts_device *first_device(const struct ts_array *a)
{
	return ts_array_box(a, 0)->device;
}

/* Moves uncommitted a to dev (same memory kind); the moved version in *out. */
static ts_status move_implicitly(struct ts_catalog *cat, struct ts_stager *st,
                                 struct ts_memory *mem, struct ts_array *a,
                                 struct ts_device *dev, const char *holder,
                                 struct ts_array **out, struct ts_error *err)
{
	struct ts_move_spec spec = {.implicit = true, .holder = holder};
	struct ts_move *mv = NULL;
	ts_status s;

	ts_placement_single(&spec.placement, dev, ts_array_placement(a)->sharding.memory_kind, false);
	s = ts_move_new(mem, a, &spec, &mv, NULL, err);
	if (s == TS_OK)
		s = ts_move_run(mv, cat, st, NULL, NULL, NULL, err);
	if (s == TS_OK)
		*out = ts_array_ref(ts_move_result(mv));
	ts_move_free(mv);
	return s;
}

/* Whether two placements whose first devices agree go together: one of
 * them on that device alone, or meshes of the same devices in the same
 * order (however each splits its array: a model's replicated weights and
 * its sharded optimizer state). */
static bool same_devices(const struct ts_sharding *a, const struct ts_sharding *b)
{
	if (a->type == TS_SHARDING_SINGLE || b->type == TS_SHARDING_SINGLE)
		return true;
	if (a->mesh.ndevices != b->mesh.ndevices)
		return false;
	for (int k = 0; k < a->mesh.ndevices; k++)
		if (a->mesh.devices[k] != b->mesh.devices[k])
			return false;
	return true;
}

ts_status ts_colocate(struct ts_catalog *cat, struct ts_stager *st, struct ts_memory *mem,
                      struct ts_array **arrs, size_t n, struct ts_device *fallback,
                      const char *holder, struct ts_device **where, struct ts_error *err)
{
	const struct ts_array *anchor = NULL;

	for (size_t i = 0; i < n; i++) {
		const struct ts_placement *p = ts_array_placement(arrs[i]);

		if (!p->committed)
			continue;
		if (!anchor) {
			anchor = arrs[i];
			continue;
		}
		if (first_device(arrs[i]) != first_device(anchor) ||
		    !same_devices(&p->sharding, &ts_array_placement(anchor)->sharding))
			return ts_error_set(err, TS_FAILED_PRECONDITION, "COMMITTED_APART",
			                    "committed arrays '%s' (on %s) and '%s' (on %s) are on "
			                    "different devices; put one where the other is",
			                    ts_array_name(anchor), ts_device_props(first_device(anchor))->id,
			                    ts_array_name(arrs[i]),
			                    ts_device_props(first_device(arrs[i]))->id);
	}
	*where = anchor ? first_device(anchor) : fallback;
	for (size_t i = 0; i < n; i++) {
		struct ts_array *moved;
		ts_status s;

		if (ts_array_placement(arrs[i])->committed || first_device(arrs[i]) == *where ||
		    ts_array_nshards(arrs[i]) != 1)
			continue;
		s = move_implicitly(cat, st, mem, arrs[i], *where, holder, &moved, err);
		if (s != TS_OK)
			return s;
		ts_array_unref(arrs[i]);
		arrs[i] = moved;
	}
	return TS_OK;
}
