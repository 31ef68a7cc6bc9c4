/*
 * registry.c - the sorted name -> value vector (registry.h).
 */
#include "common/registry.h"

#include <stdlib.h>
#include <string.h>

#include "common/fault.h"
#include "common/name.h"

void ts_registry_init(struct ts_registry *r)
{
	r->v = NULL;
	r->n = r->cap = 0;
}

void ts_registry_release(struct ts_registry *r)
{
	free(r->v);
	ts_registry_init(r);
}

size_t ts_registry_count(const struct ts_registry *r)
{
	return r->n;
}

/* Index of name, or where it would go (*found false). */
static size_t find(const struct ts_registry *r, const char *name, bool *found)
{
	size_t lo = 0, hi = r->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(r->v[mid].name, name);

		if (c == 0) {
			*found = true;
			return mid;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*found = false;
	return lo;
}

void *ts_registry_get(const struct ts_registry *r, const char *name)
{
	bool found;
	size_t at;

	if (!name)
		return NULL;
	at = find(r, name, &found);
	return found ? r->v[at].value : NULL;
}

ts_status ts_registry_reserve(struct ts_registry *r, size_t more, struct ts_error *err)
{
	size_t cap = r->cap ? r->cap : 16;
	struct ts_registry_entry *v;

	if (ts_fault_fire(TS_FAULT_ALLOC_HEAP))
		goto out_nomem;
	if (more <= r->cap - r->n)
		return TS_OK;
	while (cap - r->n < more)
		if (cap > SIZE_MAX / 2 / sizeof *v)
			goto out_nomem;
		else
			cap *= 2;
	v = realloc(r->v, cap * sizeof *v);
	if (!v)
		goto out_nomem;
	r->v = v;
	r->cap = cap;
	return TS_OK;
out_nomem:
	return ts_error_oom(err, "no memory for %zu more registry entries", more);
}

ts_status ts_registry_put(struct ts_registry *r, const char *name, void *value, void **old,
                          struct ts_error *err)
{
	bool found;
	size_t at;
	ts_status st;

	if (!ts_name_valid(name))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_NAME",
		                    "name '%s' is invalid: it must match "
		                    "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", name ? name : "");
	at = find(r, name, &found);
	if (found && !old)
		return ts_error_set(err, TS_ALREADY_EXISTS, "NAME_EXISTS", "'%s' already exists",
		                    name);
	if (old)
		*old = found ? r->v[at].value : NULL;
	if (found) {
		r->v[at].name = name;
		r->v[at].value = value;
		return TS_OK;
	}
	if (r->n == r->cap && (st = ts_registry_reserve(r, 1, err)) != TS_OK)
		return st;
	memmove(&r->v[at + 1], &r->v[at], (r->n - at) * sizeof *r->v);
	r->v[at].name = name;
	r->v[at].value = value;
	r->n++;
	return TS_OK;
}

void *ts_registry_remove(struct ts_registry *r, const char *name)
{
	bool found;
	size_t at;
	void *value;

	if (!name)
		return NULL;
	at = find(r, name, &found);
	if (!found)
		return NULL;
	value = r->v[at].value;
	memmove(&r->v[at], &r->v[at + 1], (r->n - at - 1) * sizeof *r->v);
	r->n--;
	return value;
}

size_t ts_registry_seek(const struct ts_registry *r, const char *after)
{
	bool found;
	size_t at;

	if (!after)
		return 0;
	at = find(r, after, &found);
	return found ? at + 1 : at;
}

void *ts_registry_at(const struct ts_registry *r, size_t i)
{
	return i < r->n ? r->v[i].value : NULL;
}

size_t ts_registry_list(const struct ts_registry *r, const char *after, size_t limit,
                        bool (*keep)(const void *value, void *arg), void *arg, void **out,
                        bool *more)
{
	size_t k = 0, i = ts_registry_seek(r, after);

	if (more)
		*more = false;
	for (; i < r->n; i++) {
		if (keep && !keep(r->v[i].value, arg))
			continue;
		if (k == limit) {
			if (more)
				*more = true;
			break;
		}
		out[k++] = r->v[i].value;
	}
	return k;
}
