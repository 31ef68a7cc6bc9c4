/*
 * name.h - the names clients give what the daemon keeps: arrays, saved
 * shardings and models (and the owner and target labels built from them).
 *
 * A name is 1..TS_NAME_MAX-1 bytes of [A-Za-z0-9._-] whose first byte is a
 * letter or a digit: ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$. The rule lives on
 * the lowest floor so that every registry above (storage's catalog and
 * saved shardings, train's models) checks the same one without including
 * another registry's header.
 *
 * Thread-safety: pure functions.
 */
#ifndef TS_NAME_H
#define TS_NAME_H

#include <stdbool.h>

/* A name fits in char[TS_NAME_MAX + 1]; valid ones are shorter. */
#define TS_NAME_MAX 128

/* Whether name (may be NULL) is a valid name. */
bool ts_name_valid(const char *name);

#endif
