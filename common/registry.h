/*
 * registry.h - the one name -> object map: a vector of (name, value) entries
 * kept sorted by name (strcmp order), looked up by binary search and listed
 * in name order from a cursor, a page at a time.
 *
 * Every keyed registry of the daemon is one of these inside its owner: the
 * array catalog (storage/array.c), the operations by id (ops/operation.c),
 * the saved shardings (storage/sharding.c) and the models (train/model.c).
 *
 * Invariants: names are valid names (common/name.h: ts_name_valid), at most
 * one entry per name, entries in strictly increasing name order. The map
 * owns only its vector: a name is borrowed from its value (it must stay
 * valid and unchanged while the entry holds it, normally a field of the
 * value), and values stay the owner's (the map never frees or references
 * one).
 *
 * Thread-safety: none of its own; the lock stays with the owner, which holds
 * it (read for get, seek, at and list; write for put, reserve and remove).
 */
#ifndef TS_REGISTRY_H
#define TS_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

struct ts_registry_entry {
	const char *name;   /* borrowed from value */
	void *value;
};

/* An embedded value: ts_registry_init, ts_registry_release. */
struct ts_registry {
	struct ts_registry_entry *v;   /* private; sorted by name */
	size_t n, cap;                 /* private */
};

/* An empty map; allocates nothing. */
void ts_registry_init(struct ts_registry *r);

/* Frees the vector (not the values, which the owner drops first); r is
 * empty again. */
void ts_registry_release(struct ts_registry *r);

/* Number of entries. */
size_t ts_registry_count(const struct ts_registry *r);

/* The value named name (borrowed), or NULL (also for a NULL name). */
void *ts_registry_get(const struct ts_registry *r, const char *name);

/* Makes room for `more` new entries, so that as many puts of new names
 * cannot fail for memory. Fails RESOURCE_EXHAUSTED (OUT_OF_MEMORY); each
 * call is a heap failure point (common/fault.h), whether or not it grows. */
ts_status ts_registry_reserve(struct ts_registry *r, size_t more, struct ts_error *err);

/*
 * Enters value under name (borrowed from value, see above). A name already
 * present has its value replaced: the previous value goes to *old (NULL when
 * the name was new), and with old == NULL a present name is refused
 * (ALREADY_EXISTS, reason NAME_EXISTS) and nothing changes. Fails
 * INVALID_ARGUMENT (BAD_NAME) for a name ts_name_valid refuses and
 * RESOURCE_EXHAUSTED (OUT_OF_MEMORY) when the vector must grow and cannot
 * (never after a ts_registry_reserve that covers it: then no failure point
 * either); on failure nothing changes.
 */
ts_status ts_registry_put(struct ts_registry *r, const char *name, void *value, void **old,
                          struct ts_error *err);

/* Takes name out; returns its value (now the caller's to drop), or NULL. */
void *ts_registry_remove(struct ts_registry *r, const char *name);

/* The index of the first entry whose name sorts after `after` (NULL: 0);
 * ts_registry_count when none does. */
size_t ts_registry_seek(const struct ts_registry *r, const char *after);

/* The value of the i-th entry in name order (i < ts_registry_count),
 * borrowed. */
void *ts_registry_at(const struct ts_registry *r, size_t i);

/*
 * A page in name order: the values after the name `after` (NULL: from the
 * first) that keep accepts (keep NULL: all), at most limit of them, into out
 * (room for limit values, or for ts_registry_count when that is fewer;
 * borrowed values). Returns how many; *more (may be NULL) says whether
 * another accepted value lies past the page.
 */
size_t ts_registry_list(const struct ts_registry *r, const char *after, size_t limit,
                        bool (*keep)(const void *value, void *arg), void *arg, void **out,
                        bool *more);

#endif
