/*
 * sample.c - the next token from a row of logits (sample.h): greedy
 * argmax, or temperature and top-k sampling driven by a SplitMix64
 * counter, so a generation is reproducible from its seed.
 */
#include "train/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

double ts_sample_uniform(uint64_t seed, uint64_t i)
{
	return (double)(mix64(seed + (i + 1) * 0x9e3779b97f4a7c15ull) >> 11) * 0x1.0p-53;
}

static int argmax(const float *v, int n)
{
	int best = 0;

	for (int j = 1; j < n; j++)
		if (v[j] > v[best])
			best = j;
	return best;
}

static int cmp_desc(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return (x < y) - (x > y);
}

int ts_sample_next(const float *logits, int vocab, float temperature, int top_k, uint64_t seed,
                   uint64_t i, float *scratch)
{
	float kth = -INFINITY, zmax;
	double total = 0, u, acc = 0;
	int last = -1;

	if (temperature <= 0.0f || vocab < 2)
		return argmax(logits, vocab);
	for (int j = 0; j < vocab; j++)
		scratch[j] = logits[j] / temperature;
	zmax = scratch[argmax(scratch, vocab)];
	if (top_k > 0 && top_k < vocab) {
		float *sorted = malloc((size_t)vocab * sizeof *sorted);

		if (sorted) {
			memcpy(sorted, scratch, (size_t)vocab * sizeof *sorted);
			qsort(sorted, (size_t)vocab, sizeof *sorted, cmp_desc);
			kth = sorted[top_k - 1];
			free(sorted);
		} else {
			kth = zmax;     /* no memory to rank them: the most likely only */
		}
	}
	for (int j = 0; j < vocab; j++)
		if (scratch[j] >= kth)
			total += exp((double)scratch[j] - (double)zmax);
	u = ts_sample_uniform(seed, i) * total;
	for (int j = 0; j < vocab; j++) {
		if (!(scratch[j] >= kth))
			continue;
		acc += exp((double)scratch[j] - (double)zmax);
		last = j;
		if (acc > u)
			return j;
	}
	return last >= 0 ? last : argmax(logits, vocab);
}
