/*
 * cpu_team.c - the CPU kernels' team of threads (cpu_team.h).
 *
 * A task lives on its caller's stack: the pieces' function, their count and
 * the counter the threads take pieces from. The team holds a pointer to the
 * open task; a helper joins it (counted in the task's `inside`) only while
 * that pointer is set, and the caller, once the counter is spent, clears
 * the pointer and waits until every helper that joined has left. So a
 * helper never takes from a counter that is not its task's: an earlier
 * team kept one counter for every task and a helper's task in a field the
 * caller emptied when done, and a helper that woke late, read the emptied
 * task and still added to the counter could take a piece of the next task
 * and drop it (run nothing), leaving part of a kernel's output unwritten -
 * results that changed with the timing of threads.
 *
 * Thread-safety: the team's fields under mu (below), the task's counter
 * atomic, the rest immutable after _new.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "common/lock.h"
#include "train/cpu_team.h"

/* The most threads a team has. */
#define TEAM_MAX 64

struct team_task {
	ts__cpu_piece_fn fn;            /* immutable */
	const void *arg;                /* immutable */
	int64_t n;                      /* immutable */
	atomic_int_fast64_t next;       /* the next piece to take */
	int inside;                     /* guarded by: team mu; helpers joined, not yet left */
};

struct ts__cpu_team {
	struct ts_mutex mu;
	pthread_cond_t work_cv;         /* a task opened, or stop */
	pthread_cond_t done_cv;         /* the last helper left a closed task */
	struct team_task *task;         /* guarded by: mu; the open task, or NULL */
	uint64_t opened;                /* guarded by: mu; tasks opened so far */
	bool busy;                      /* guarded by: mu; a caller has the team */
	bool stop;                      /* guarded by: mu */
	int nhelpers;                   /* immutable after init */
	pthread_t helper[];             /* immutable after init */
};

/* Runs pieces of tk until its counter is spent. */
static void task_take(struct team_task *tk)
{
	for (int64_t i; (i = atomic_fetch_add(&tk->next, 1)) < tk->n;)
		tk->fn(tk->arg, i);
}

static void *helper_main(void *arg)
{
	struct ts__cpu_team *t = arg;
	uint64_t seen = 0;

	ts_mutex_lock(&t->mu);
	for (;;) {
		struct team_task *tk;

		while (!t->stop && (!t->task || t->opened == seen))
			ts_mutex_wait(&t->mu, &t->work_cv, NULL);
		if (t->stop)
			break;
		seen = t->opened;
		tk = t->task;
		tk->inside++;
		ts_mutex_unlock(&t->mu);
		task_take(tk);
		ts_mutex_lock(&t->mu);
		/* tk is alive: its caller waits for inside == 0 under mu */
		if (--tk->inside == 0 && t->task != tk)
			pthread_cond_signal(&t->done_cv);
	}
	ts_mutex_unlock(&t->mu);
	return NULL;
}

void ts__cpu_team_for(struct ts__cpu_team *t, int64_t n, ts__cpu_piece_fn fn, const void *arg)
{
	struct team_task tk = {.fn = fn, .arg = arg, .n = n};
	bool mine = false;

	atomic_init(&tk.next, 0);
	if (t && n >= 2) {
		ts_mutex_lock(&t->mu);
		mine = !t->busy;
		if (mine) {
			t->busy = true;
			t->task = &tk;
			t->opened++;
			pthread_cond_broadcast(&t->work_cv);
		}
		ts_mutex_unlock(&t->mu);
	}
	if (!mine) {
		for (int64_t i = 0; i < n; i++)
			fn(arg, i);
		return;
	}
	task_take(&tk);
	/* every piece is taken: close the task, then wait for the helpers still
	 * running one (a helper that had not joined now never will) */
	ts_mutex_lock(&t->mu);
	t->task = NULL;
	while (tk.inside > 0)
		ts_mutex_wait(&t->mu, &t->done_cv, NULL);
	t->busy = false;
	ts_mutex_unlock(&t->mu);
}

int ts__cpu_team_threads(const struct ts__cpu_team *t)
{
	return t ? t->nhelpers + 1 : 1;
}

void ts__cpu_team_free(struct ts__cpu_team *t)
{
	if (!t)
		return;
	ts_mutex_lock(&t->mu);
	t->stop = true;
	pthread_cond_broadcast(&t->work_cv);
	ts_mutex_unlock(&t->mu);
	for (int i = 0; i < t->nhelpers; i++)
		pthread_join(t->helper[i], NULL);
	pthread_cond_destroy(&t->done_cv);
	pthread_cond_destroy(&t->work_cv);
	ts_mutex_destroy(&t->mu);
	free(t);
}

struct ts__cpu_team *ts__cpu_team_new(int threads, ts__cpu_team_bind_fn bind, void *ctx)
{
	struct ts__cpu_team *t;

	if (threads <= 0) {
		cpu_set_t cpus;

		threads = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
	}
	if (threads > TEAM_MAX)
		threads = TEAM_MAX;
	if (threads < 2)
		return NULL;
	t = calloc(1, sizeof *t + (size_t)(threads - 1) * sizeof t->helper[0]);
	if (!t)
		return NULL;
	if (ts_mutex_init(&t->mu) != 0) {
		free(t);
		return NULL;
	}
	pthread_cond_init(&t->work_cv, NULL);
	pthread_cond_init(&t->done_cv, NULL);
	for (int i = 0; i < threads - 1; i++) {
		if (pthread_create(&t->helper[i], NULL, helper_main, t) != 0)
			break;
		if (bind)
			bind(ctx, t->helper[i]);
		t->nhelpers++;
	}
	if (t->nhelpers == 0) {
		ts__cpu_team_free(t);
		return NULL;
	}
	return t;
}
