/*
 * hash.h - the one byte hash: 64-bit FNV-1a, for table buckets and for the
 * debug seals of immutable values (storage/array.c).
 *
 * Not for anything an adversary chooses the keys of where collisions
 * matter (a bucket list stays correct, only slower).
 *
 * Thread-safety: pure.
 */
#ifndef TS_HASH_H
#define TS_HASH_H

#include <stddef.h>
#include <stdint.h>

#define TS_FNV1A_INIT 1469598103934665603ull

/* Folds n bytes at p into h (start from TS_FNV1A_INIT). */
static inline uint64_t ts_fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ull;
	return h;
}

#endif
