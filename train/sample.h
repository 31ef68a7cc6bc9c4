/*
 * sample.h - the next token from a row of logits: greedy, or drawn with a
 * temperature and top-k from a seeded, counter-based generator.
 *
 * Greedy (temperature 0): the id of the largest logit, the lowest id among
 * equal ones (numpy's argmax). Sampling (temperature t > 0): z = logit / t
 * in float32; with 0 < top_k < vocab, every z below the top_k-th largest
 * is dropped (ties at that value are kept); p_j = exp(z_j - max z) / sum,
 * in double; u = (splitmix64(seed, i) >> 11) * 2^-53, uniform in [0, 1)
 * from the generation's token index i (0-based), splitmix64(S, i) =
 * mix64(S + (i + 1) * 0x9e3779b97f4a7c15) as the windows' offsets draw it;
 * the token is the lowest id j whose cumulative p_0 + ... + p_j exceeds
 * u (the last kept id when rounding leaves none). The same (logits, seed,
 * i) give the same token on every run and backend.
 *
 * Thread-safety: pure functions.
 */
#ifndef TS_SAMPLE_H
#define TS_SAMPLE_H

#include <stdint.h>

/* The next token of vocab logits (borrowed) as above; scratch holds vocab
 * floats (the caller's). */
int ts_sample_next(const float *logits, int vocab, float temperature, int top_k, uint64_t seed,
                   uint64_t i, float *scratch);

/* u of token index i: uniform in [0, 1). */
double ts_sample_uniform(uint64_t seed, uint64_t i);

#endif
