/*
 * test_cpu_team.c - the CPU kernels' team (train/cpu_team.h): every piece
 * of every task runs exactly once and before the call returns, with tasks
 * back to back, from several threads at once, and with no team at all.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "tests/unit/unit.h"
#include "train/cpu_team.h"

#define MAXN 64

/* A task's record: how often each piece ran. */
struct tally {
	atomic_int ran[MAXN];
	int64_t n;
};

static void count_piece(const void *arg, int64_t i)
{
	struct tally *ta = (struct tally *)arg;

	ck_assert(i >= 0 && i < ta->n);
	atomic_fetch_add(&ta->ran[i], 1);
}

/* rounds tasks of 2..MAXN pieces back to back (short tasks: the helpers
 * are still waking from one when the next opens), each checked on return. */
static void tasks_back_to_back(struct ts__cpu_team *t, int rounds, unsigned seed)
{
	for (int r = 0; r < rounds; r++) {
		struct tally ta = {.n = 2 + (int64_t)(rand_r(&seed) % (MAXN - 1))};

		for (int i = 0; i < MAXN; i++)
			atomic_init(&ta.ran[i], 0);
		ts__cpu_team_for(t, ta.n, count_piece, &ta);
		for (int64_t i = 0; i < ta.n; i++)
			ck_assert_msg(atomic_load(&ta.ran[i]) == 1, "task %d: piece %lld of %lld ran %d "
			              "times", r, (long long)i, (long long)ta.n, atomic_load(&ta.ran[i]));
	}
}

START_TEST(test_every_piece_runs_once)
{
	struct ts__cpu_team *t = ts__cpu_team_new(8, NULL, NULL);

	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(ts__cpu_team_threads(t), 8);
	tasks_back_to_back(t, 20000, 1);
	ts__cpu_team_free(t);
}
END_TEST

struct caller {
	struct ts__cpu_team *t;
	unsigned seed;
};

static void *caller_main(void *arg)
{
	const struct caller *c = arg;

	tasks_back_to_back(c->t, 5000, c->seed);
	return NULL;
}

/* Several kernels' threads use one team: one has it, the others run their
 * pieces themselves; every task still runs whole. */
START_TEST(test_callers_at_once)
{
	struct ts__cpu_team *t = ts__cpu_team_new(3, NULL, NULL);
	struct caller c[3];
	pthread_t th[3];

	ck_assert_ptr_nonnull(t);
	for (int i = 0; i < 3; i++) {
		c[i] = (struct caller){.t = t, .seed = 7u + (unsigned)i};
		ck_assert_int_eq(pthread_create(&th[i], NULL, caller_main, &c[i]), 0);
	}
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	ts__cpu_team_free(t);
}
END_TEST

/* Pieces that each write their own slice of one output, as a product's
 * tiles do: the output is the single-threaded one. */
struct slices {
	double *out;
	int64_t per;
};

static void slice_piece(const void *arg, int64_t i)
{
	const struct slices *s = arg;

	for (int64_t e = i * s->per; e < (i + 1) * s->per; e++)
		s->out[e] = (double)e * 0.5 + 1.0;
}

START_TEST(test_pieces_write_their_own_elements)
{
	struct ts__cpu_team *t = ts__cpu_team_new(0, NULL, NULL);
	enum { N = 37, PER = 1000 };
	double *out = calloc(N * PER, sizeof *out);

	ck_assert_ptr_nonnull(out);
	for (int r = 0; r < 50; r++) {
		for (int64_t e = 0; e < N * PER; e++)
			out[e] = -1.0;
		ts__cpu_team_for(t, N, slice_piece, &(struct slices){.out = out, .per = PER});
		for (int64_t e = 0; e < N * PER; e++)
			ck_assert(out[e] == (double)e * 0.5 + 1.0);
	}
	free(out);
	ts__cpu_team_free(t);
}
END_TEST

/* No team (one thread): every piece on the caller, in order. */
START_TEST(test_no_team_runs_inline)
{
	ck_assert_ptr_null(ts__cpu_team_new(1, NULL, NULL));
	ck_assert_int_eq(ts__cpu_team_threads(NULL), 1);
	tasks_back_to_back(NULL, 100, 3);
	ts__cpu_team_free(NULL);
}
END_TEST

struct bound {
	pthread_mutex_t mu;
	pthread_t seen[8];
	int n;
};

static void record_bind(void *ctx, pthread_t helper)
{
	struct bound *b = ctx;

	pthread_mutex_lock(&b->mu);
	if (b->n < 8)
		b->seen[b->n] = helper;
	b->n++;
	pthread_mutex_unlock(&b->mu);
}

/* The bind hook gets every helper, once, and no other thread. */
START_TEST(test_bind_hook_gets_each_helper)
{
	struct bound b = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct ts__cpu_team *t = ts__cpu_team_new(4, record_bind, &b);

	ck_assert_ptr_nonnull(t);
	ck_assert_int_eq(b.n, ts__cpu_team_threads(t) - 1);
	ck_assert_int_eq(b.n, 3);
	for (int i = 0; i < b.n; i++) {
		ck_assert(!pthread_equal(b.seen[i], pthread_self()));
		for (int j = 0; j < i; j++)
			ck_assert(!pthread_equal(b.seen[i], b.seen[j]));
	}
	tasks_back_to_back(t, 1000, 5);
	ts__cpu_team_free(t);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("cpu_team");
	TCase *tc = tcase_create("team");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_every_piece_runs_once);
	tcase_add_test(tc, test_callers_at_once);
	tcase_add_test(tc, test_pieces_write_their_own_elements);
	tcase_add_test(tc, test_no_team_runs_inline);
	tcase_add_test(tc, test_bind_hook_gets_each_helper);
	suite_add_tcase(s, tc);
	return s;
}
