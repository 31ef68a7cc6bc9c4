/*
 * test_operation.c - Check suite "operation": the operation registry run by
 * real worker threads: outcomes (result, failure, cancellation before and
 * while running, after finishing), target claims, progress atomics, waiters
 * woken exactly once and unwait racing the finish, blocking with a timeout,
 * retention by count and by age, listing, freeing a busy registry, and many
 * concurrent submitters; then the JSON rendering and the handlers of
 * handlers/operations.c, called with hand-made ts_calls (over HTTP no
 * operation can be created yet).
 *
 * Work functions never assert (they run on worker threads): they record what
 * they saw in their struct job, and the test thread checks it. A gate lets a
 * test hold a worker inside an operation until it opens the gate.
 */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/units.h"
#include "handlers/handlers.h"
#include "handlers/operations.h"
#include "ops/operation.h"
#include "tests/unit/unit.h"

#define SEC 1000000000ull
#define MS 1000000ull

/* ---- helpers -------------------------------------------------------------------------- */

/* A door the test opens; work waits at it. */
struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool open;
	int entered;
};

static void gate_init(struct gate *g)
{
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	g->open = false;
	g->entered = 0;
}

static void gate_open(struct gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->open = true;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* Waits until n works have entered the gate. */
static void gate_wait_entered(struct gate *g, int n)
{
	pthread_mutex_lock(&g->mu);
	while (g->entered < n)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

static void gate_pass(struct gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->entered++;
	pthread_cond_broadcast(&g->cv);
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

struct holding;

/* What one operation's work saw and did. */
struct job {
	struct gate *gate;            /* waited at when set */
	_Atomic int ran;
	_Atomic int released;
	_Atomic int cancel_seen;
	_Atomic int go;               /* work_racing starts when set */
	uint64_t progress;            /* units added by work_ok */
	struct holding *hold;         /* for hold_cb */
};

static void job_release(void *arg)
{
	struct job *j = arg;

	atomic_fetch_add(&j->released, 1);
}

/* Succeeds with {"n": 42} after reporting progress (and passing the gate). */
static ts_status work_ok(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct job *j = arg;

	atomic_fetch_add(&j->ran, 1);
	if (j->gate)
		gate_pass(j->gate);
	ts_operation_progress_add(op, j->progress);
	ts_operation_set_result(op, json_pack("{s:i}", "n", 42));
	return TS_OK;
}

/* Fails with NOT_FOUND, after setting a result that must be dropped. */
static ts_status work_fail(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct job *j = arg;

	atomic_fetch_add(&j->ran, 1);
	if (j->gate)
		gate_pass(j->gate);
	ts_operation_set_result(op, json_pack("{s:b}", "stale", 1));
	return ts_error_set(err, TS_NOT_FOUND, "ARRAY_NOT_FOUND", "array 'x' not found");
}

/* Fails with DATA_LOSS after recording what it did so far. */
static ts_status work_fail_partial(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct job *j = arg;

	atomic_fetch_add(&j->ran, 1);
	ts_operation_set_partial(op, json_pack("{s:i}", "steps", 1));
	ts_operation_set_partial(op, json_pack("{s:i}", "steps", 2));
	return ts_error_set(err, TS_DATA_LOSS, "STEP_FAILED", "step 3 failed");
}

/* Fails without explaining itself. */
static ts_status work_fail_silent(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct job *j = arg;

	atomic_fetch_add(&j->ran, 1);
	return TS_DATA_LOSS;
}

/* Runs until cancelled (passing the gate first when set), then says so. */
static ts_status work_until_cancelled(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct job *j = arg;

	atomic_fetch_add(&j->ran, 1);
	if (j->gate)
		gate_pass(j->gate);
	while (!ts_operation_cancelled(op)) {
		ts_operation_progress_add(op, 1);
		usleep(200);
	}
	atomic_fetch_add(&j->cancel_seen, 1);
	return TS_CANCELLED;
}

static struct ts_op_registry *registry(int workers, size_t keep, uint64_t keep_ns)
{
	struct ts_op_registry_config cfg = {.workers = workers, .keep_finished = keep,
	                                    .keep_ns = keep_ns};
	struct ts_op_registry *r = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_op_registry_new(&cfg, &r, &err) == TS_OK, "registry: %s", err.message);
	return r;
}

static struct ts_operation *submit(struct ts_op_registry *r, const char *target,
                                   ts_op_fn *fn, struct job *j)
{
	struct ts_operation *op = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_op_submit(r, "put", target, 100, "bytes", fn, j, job_release, &op,
	                           &err) == TS_OK, "submit: %s", err.message);
	ck_assert_ptr_nonnull(op);
	return op;
}

static enum ts_op_state state_of(const struct ts_operation *op)
{
	struct ts_op_snapshot s;
	enum ts_op_state st;

	ts_operation_snapshot(op, &s);
	st = s.state;
	ts_op_snapshot_release(&s);
	return st;
}

/* Polls until op reaches state (the worker picks it up asynchronously). */
static void await_state(const struct ts_operation *op, enum ts_op_state want)
{
	uint64_t deadline = ts_now_ns() + 10 * SEC;

	while (state_of(op) != want) {
		ck_assert_msg(ts_now_ns() < deadline, "operation %s stuck in %s, want %s",
		              ts_operation_id(op), ts_op_state_name(state_of(op)),
		              ts_op_state_name(want));
		usleep(500);
	}
}

/* Polls until *v reaches want, at most 10 s. */
static void await_int(_Atomic int *v, int want)
{
	uint64_t deadline = ts_now_ns() + 10 * SEC;

	while (atomic_load(v) < want) {
		ck_assert_msg(ts_now_ns() < deadline, "counter at %d, want %d", atomic_load(v), want);
		usleep(200);
	}
}

/* A waiter's token: how many times it was woken. */
struct wake_count {
	_Atomic int wakes;
};

static void wake_counter(void *token)
{
	struct wake_count *w = token;

	atomic_fetch_add(&w->wakes, 1);
}

static bool id_well_formed(const char *id)
{
	if (strncmp(id, "op-", 3) != 0 || strlen(id) != 19)
		return false;
	for (int i = 3; i < 19; i++)
		if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f')))
			return false;
	return true;
}

/* ---- outcomes ---------------------------------------------------------------------------- */

START_TEST(test_succeeds_with_result)
{
	struct ts_op_registry *r = registry(2, 100, 0);
	struct job j = {.progress = 100};
	struct ts_operation *op = submit(r, "w1", work_ok, &j), *again;
	struct ts_op_snapshot s;

	ck_assert_msg(id_well_formed(ts_operation_id(op)), "id %s", ts_operation_id(op));
	ck_assert(ts_operation_block(op, 10 * SEC));
	ts_operation_snapshot(op, &s);
	ck_assert_int_eq(s.state, TS_OP_SUCCEEDED);
	ck_assert(s.done);
	ck_assert_str_eq(s.kind, "put");
	ck_assert_str_eq(s.target, "w1");
	ck_assert_str_eq(s.unit, "bytes");
	ck_assert_uint_eq(s.done_units, 100);
	ck_assert_uint_eq(s.total_units, 100);
	ck_assert_int_eq(s.error.status, TS_OK);
	ck_assert_ptr_nonnull(s.result);
	ck_assert_int_eq(json_integer_value(json_object_get(s.result, "n")), 42);
	ck_assert(s.create_ns > 0 && s.start_ns >= s.create_ns && s.end_ns >= s.start_ns);
	ts_op_snapshot_release(&s);
	ck_assert_int_eq(atomic_load(&j.ran), 1);
	ck_assert_int_eq(atomic_load(&j.released), 1);
	again = ts_op_get(r, ts_operation_id(op));
	ck_assert_ptr_eq(again, op);
	ts_operation_unref(again);
	ck_assert_ptr_null(ts_op_get(r, "op-0000000000000000"));
	ck_assert_ptr_null(ts_op_get(r, NULL));
	ts_operation_unref(op);
	ts_op_registry_free(r);
}
END_TEST

/* A run that fails keeps the last partial result it stored (not its
 * result), and a snapshot owns its copy. */
START_TEST(test_failure_keeps_the_partial_result)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct job j = {0}, k = {0};
	struct ts_operation *op = submit(r, NULL, work_fail_partial, &j);
	struct ts_operation *op2 = submit(r, NULL, work_fail, &k);
	struct ts_op_snapshot s, s2;

	ck_assert(ts_operation_block(op, 10 * SEC));
	ts_operation_snapshot(op, &s);
	ts_operation_snapshot(op, &s2);
	ck_assert_int_eq(s.state, TS_OP_FAILED);
	ck_assert_int_eq(s.error.status, TS_DATA_LOSS);
	ck_assert_ptr_null(s.result);
	ck_assert_ptr_nonnull(s.partial);
	ck_assert_int_eq(json_integer_value(json_object_get(s.partial, "steps")), 2);
	ck_assert_ptr_ne(s.partial, s2.partial);
	ts_op_snapshot_release(&s);
	ck_assert_ptr_null(s.partial);
	ck_assert_int_eq(json_integer_value(json_object_get(s2.partial, "steps")), 2);
	ts_op_snapshot_release(&s2);
	/* a run that stored none has none */
	ck_assert(ts_operation_block(op2, 10 * SEC));
	ts_operation_snapshot(op2, &s);
	ck_assert_ptr_null(s.partial);
	ts_op_snapshot_release(&s);
	ts_operation_unref(op);
	ts_operation_unref(op2);
	ts_op_registry_free(r);
}
END_TEST

START_TEST(test_failure_keeps_the_error)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct job j = {0}, k = {0};
	struct ts_operation *op = submit(r, NULL, work_fail, &j);
	struct ts_operation *op2 = submit(r, NULL, work_fail_silent, &k);
	struct ts_op_snapshot s;

	ck_assert(ts_operation_block(op, 10 * SEC));
	ts_operation_snapshot(op, &s);
	ck_assert_int_eq(s.state, TS_OP_FAILED);
	ck_assert(s.done);
	ck_assert_str_eq(s.target, "");
	ck_assert_int_eq(s.error.status, TS_NOT_FOUND);
	ck_assert_str_eq(s.error.reason, "ARRAY_NOT_FOUND");
	ck_assert_str_eq(s.error.message, "array 'x' not found");
	ck_assert_ptr_null(s.result);
	ts_op_snapshot_release(&s);
	ck_assert_int_eq(atomic_load(&j.released), 1);

	ck_assert(ts_operation_block(op2, 10 * SEC));
	ts_operation_snapshot(op2, &s);
	ck_assert_int_eq(s.state, TS_OP_FAILED);
	ck_assert_int_eq(s.error.status, TS_DATA_LOSS);
	ck_assert_ptr_nonnull(strstr(s.error.message, ts_operation_id(op2)));
	ts_op_snapshot_release(&s);
	ts_operation_unref(op);
	ts_operation_unref(op2);
	ts_op_registry_free(r);
}
END_TEST

START_TEST(test_cancel_while_pending)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct gate g;
	struct job first = {.gate = &g}, second = {0};
	struct ts_operation *a, *b;
	struct wake_count wc = {0};
	struct ts_op_snapshot s;
	struct ts_error err;
	char want[128];

	gate_init(&g);
	a = submit(r, "a", work_ok, &first);
	gate_wait_entered(&g, 1);          /* the only worker is busy with a */
	b = submit(r, "b", work_ok, &second);
	ck_assert_int_eq(state_of(b), TS_OP_PENDING);
	ck_assert(ts_operation_wait(b, wake_counter, &wc));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_operation_cancel(b, &err), TS_OK);
	/* cancelled at once, on this thread: no worker was free */
	ts_operation_snapshot(b, &s);
	ck_assert_int_eq(s.state, TS_OP_CANCELLED);
	ck_assert(s.done);
	ck_assert_uint_eq(s.start_ns, 0);
	ck_assert(s.end_ns > 0);
	ck_assert_int_eq(s.error.status, TS_CANCELLED);
	snprintf(want, sizeof want, "operation %s was cancelled", s.id);
	ck_assert_str_eq(s.error.message, want);
	ts_op_snapshot_release(&s);
	ck_assert_int_eq(atomic_load(&second.ran), 0);
	ck_assert_int_eq(atomic_load(&second.released), 1);
	ck_assert_int_eq(atomic_load(&wc.wakes), 1);
	/* its claim on "b" is gone */
	{
		struct job third = {0};
		struct ts_operation *c = submit(r, "b", work_ok, &third);

		gate_open(&g);
		ck_assert(ts_operation_block(c, 10 * SEC));
		ck_assert_int_eq(state_of(c), TS_OP_SUCCEEDED);
		ts_operation_unref(c);
	}
	ck_assert(ts_operation_block(a, 10 * SEC));
	ck_assert_int_eq(state_of(a), TS_OP_SUCCEEDED);
	ck_assert_int_eq(atomic_load(&second.ran), 0);
	ck_assert_int_eq(atomic_load(&second.released), 1);
	ts_operation_unref(a);
	ts_operation_unref(b);
	ts_op_registry_free(r);
}
END_TEST

/* Records the thread its work ran on. */
struct ran_on {
	struct job j;
	pthread_t thread;
};

static ts_status work_note_thread(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct ran_on *w = arg;

	w->thread = pthread_self();
	return work_ok(op, &w->j, err);
}

/* ts_op_submit_here runs the work on the caller's thread before it returns,
 * with its release, result and end as a worker's run gives, while the only
 * worker is busy and another operation waits in the queue (which it leaves
 * there); a claimed target refuses it as ts_op_submit does, its arg still
 * the caller's. */
START_TEST(test_submit_here_runs_on_the_caller)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct gate g;
	struct job busy = {.gate = &g}, queued = {0}, refused = {0};
	struct ran_on here = {0};
	struct ts_operation *a, *b, *q, *c = NULL;
	struct ts_op_snapshot snap;
	struct ts_error err;

	gate_init(&g);
	a = submit(r, "a", work_ok, &busy);
	gate_wait_entered(&g, 1);          /* the only worker is busy with a */
	q = submit(r, "q", work_ok, &queued);
	ts_error_clear(&err);
	ck_assert_msg(ts_op_submit_here(r, "put", "b", 100, "bytes", work_note_thread, &here,
	                                job_release, &b, &err) == TS_OK,
	              "submit_here: %s", err.message);
	ck_assert(pthread_equal(here.thread, pthread_self()));
	ck_assert_int_eq(atomic_load(&here.j.ran), 1);
	ck_assert_int_eq(atomic_load(&here.j.released), 1);
	ts_operation_snapshot(b, &snap);
	ck_assert_int_eq(snap.state, TS_OP_SUCCEEDED);
	ck_assert(snap.done && snap.start_ns > 0 && snap.end_ns >= snap.start_ns);
	ck_assert_int_eq(json_integer_value(json_object_get(snap.result, "n")), 42);
	ts_op_snapshot_release(&snap);
	ck_assert_int_eq(state_of(q), TS_OP_PENDING);   /* still the worker's to run */
	ck_assert_int_eq(atomic_load(&queued.ran), 0);
	/* the target a holds refuses another, which never runs nor is released */
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_submit_here(r, "put", "a", 100, "bytes", work_ok, &refused,
	                                   job_release, &c, &err),
	                 TS_ABORTED);
	ck_assert_str_eq(err.reason, "TARGET_BUSY");
	ck_assert_ptr_null(c);
	ck_assert_int_eq(atomic_load(&refused.ran), 0);
	ck_assert_int_eq(atomic_load(&refused.released), 0);
	gate_open(&g);
	ck_assert(ts_operation_block(a, 10 * SEC));
	ck_assert(ts_operation_block(q, 10 * SEC));
	ck_assert_int_eq(state_of(q), TS_OP_SUCCEEDED);
	ck_assert_int_eq(atomic_load(&queued.ran), 1);
	ts_operation_unref(a);
	ts_operation_unref(b);
	ts_operation_unref(q);
	ts_op_registry_free(r);
}
END_TEST

START_TEST(test_cancel_while_running)
{
	struct ts_op_registry *r = registry(2, 100, 0);
	struct gate g;
	struct job j = {.gate = &g};
	struct ts_operation *op;
	struct ts_op_snapshot s;
	struct ts_error err;

	gate_init(&g);
	gate_open(&g);
	op = submit(r, "w", work_until_cancelled, &j);
	await_state(op, TS_OP_RUNNING);
	gate_wait_entered(&g, 1);
	ck_assert(!ts_operation_cancelled(op));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_operation_cancel(op, &err), TS_OK);
	ck_assert(ts_operation_cancelled(op));
	/* twice is fine while it winds down */
	ts_operation_cancel(op, &err);
	ck_assert(ts_operation_block(op, 10 * SEC));
	ts_operation_snapshot(op, &s);
	ck_assert_int_eq(s.state, TS_OP_CANCELLED);
	ck_assert(s.start_ns > 0);
	ck_assert_int_eq(s.error.status, TS_CANCELLED);
	ck_assert_ptr_null(s.result);
	ts_op_snapshot_release(&s);
	ck_assert_int_eq(atomic_load(&j.cancel_seen), 1);
	ck_assert_int_eq(atomic_load(&j.released), 1);
	ts_operation_unref(op);
	ts_op_registry_free(r);
}
END_TEST

START_TEST(test_cancel_after_finish_refused)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct job j = {0};
	struct ts_operation *op = submit(r, "w", work_ok, &j);
	struct ts_error err;
	char want[128];

	ck_assert(ts_operation_block(op, 10 * SEC));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_operation_cancel(op, &err), TS_FAILED_PRECONDITION);
	snprintf(want, sizeof want, "operation %s has already finished", ts_operation_id(op));
	ck_assert_str_eq(err.message, want);
	ck_assert(!ts_operation_cancelled(op));
	ck_assert_int_eq(state_of(op), TS_OP_SUCCEEDED);
	ts_operation_unref(op);
	ts_op_registry_free(r);
}
END_TEST

/* ---- targets and arguments --------------------------------------------------------------- */

START_TEST(test_target_claims)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct gate g;
	struct job a = {.gate = &g}, b = {0}, c = {0}, d = {0}, refused = {0};
	struct ts_operation *opa, *opb, *opc, *opd, *none = (void *)1;
	struct ts_error err;
	char want[200];

	gate_init(&g);
	opa = submit(r, "w1", work_ok, &a);
	gate_wait_entered(&g, 1);
	/* running holder */
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_submit(r, "copy", "w1", 0, NULL, work_ok, &refused, job_release,
	                              &none, &err), TS_ABORTED);
	ck_assert_ptr_null(none);
	ck_assert_str_eq(err.reason, "TARGET_BUSY");
	snprintf(want, sizeof want, "array 'w1' has operation %s in flight", ts_operation_id(opa));
	ck_assert_str_eq(err.message, want);
	/* pending holder */
	opb = submit(r, "w2", work_ok, &b);
	ck_assert_int_eq(state_of(opb), TS_OP_PENDING);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_submit(r, "copy", "w2", 0, NULL, work_ok, &refused, job_release,
	                              NULL, &err), TS_ABORTED);
	snprintf(want, sizeof want, "array 'w2' has operation %s in flight", ts_operation_id(opb));
	ck_assert_str_eq(err.message, want);
	/* no target claims nothing */
	opc = submit(r, NULL, work_ok, &c);
	opd = submit(r, "", work_ok, &d);
	gate_open(&g);
	ck_assert(ts_operation_block(opa, 10 * SEC));
	ck_assert(ts_operation_block(opb, 10 * SEC));
	ck_assert(ts_operation_block(opc, 10 * SEC));
	ck_assert(ts_operation_block(opd, 10 * SEC));
	ck_assert_int_eq(atomic_load(&refused.ran), 0);
	ck_assert_int_eq(atomic_load(&refused.released), 0);   /* refused: arg stays ours */
	ts_operation_unref(opa);
	/* free again once finished */
	opa = submit(r, "w1", work_ok, &refused);
	ck_assert(ts_operation_block(opa, 10 * SEC));
	ck_assert_int_eq(state_of(opa), TS_OP_SUCCEEDED);
	ts_operation_unref(opa);
	ts_operation_unref(opb);
	ts_operation_unref(opc);
	ts_operation_unref(opd);
	ts_op_registry_free(r);
}
END_TEST

START_TEST(test_bad_arguments_refused)
{
	struct ts_op_registry_config cfg = {.workers = 0};
	struct ts_op_registry *r = (void *)1;
	struct ts_operation *op = NULL;
	struct job j = {0};
	struct ts_error err;
	char longname[200];

	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_registry_new(&cfg, &r, &err), TS_INVALID_ARGUMENT);
	ck_assert_ptr_null(r);
	r = registry(1, 10, 0);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_submit(r, "", NULL, 0, NULL, work_ok, &j, job_release, &op, &err),
	                 TS_INVALID_ARGUMENT);
	memset(longname, 'a', sizeof longname - 1);
	longname[sizeof longname - 1] = '\0';
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_submit(r, "put", longname, 0, NULL, work_ok, &j, job_release, &op,
	                              &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_submit(r, "put", NULL, 0, "a-unit-far-too-long", work_ok, &j,
	                              job_release, &op, &err), TS_INVALID_ARGUMENT);
	ck_assert_ptr_null(op);
	ck_assert_int_eq(atomic_load(&j.released), 0);
	ts_op_registry_free(r);
	ts_op_registry_free(NULL);
}
END_TEST

START_TEST(test_state_names)
{
	enum ts_op_state s;

	for (int i = TS_OP_PENDING; i <= TS_OP_CANCELLED; i++) {
		ck_assert(ts_op_state_parse(ts_op_state_name((enum ts_op_state)i), &s));
		ck_assert_int_eq(s, i);
	}
	ck_assert_str_eq(ts_op_state_name(TS_OP_RUNNING), "RUNNING");
	ck_assert(!ts_op_state_parse("running", &s));
	ck_assert(!ts_op_state_parse("", &s));
	ck_assert(!ts_op_state_parse(NULL, &s));
}
END_TEST

/* ---- progress ---------------------------------------------------------------------------- */

struct adder {
	struct ts_operation *op;
	int n;
};

static void *add_progress(void *arg)
{
	struct adder *a = arg;

	for (int i = 0; i < a->n; i++) {
		ts_operation_progress_add(a->op, 3);
		if (i % 64 == 0) {
			struct ts_op_snapshot s;

			ts_operation_snapshot(a->op, &s);   /* readers never wait */
			ts_op_snapshot_release(&s);
		}
	}
	return NULL;
}

START_TEST(test_progress_is_atomic)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct gate g;
	struct job j = {.gate = &g};
	struct ts_operation *op;
	struct ts_op_snapshot s;
	pthread_t t[4];
	struct adder a;

	gate_init(&g);
	op = submit(r, "w", work_ok, &j);
	gate_wait_entered(&g, 1);
	a = (struct adder){.op = op, .n = 20000};
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, add_progress, &a);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	ts_operation_snapshot(op, &s);
	ck_assert_uint_eq(s.done_units, 4ull * 20000 * 3);
	ck_assert_uint_eq(s.total_units, 100);
	ck_assert_int_eq(s.state, TS_OP_RUNNING);
	ck_assert(!s.done);
	ts_op_snapshot_release(&s);
	ts_operation_progress_set(op, 7);
	ts_operation_total_set(op, 1000);
	ts_operation_snapshot(op, &s);
	ck_assert_uint_eq(s.done_units, 7);
	ck_assert_uint_eq(s.total_units, 1000);
	ts_op_snapshot_release(&s);
	gate_open(&g);
	ck_assert(ts_operation_block(op, 10 * SEC));
	ts_operation_unref(op);
	ts_op_registry_free(r);
}
END_TEST

/* ---- waiting ----------------------------------------------------------------------------- */

START_TEST(test_waiters_woken_once)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct gate g;
	struct job j = {.gate = &g};
	struct ts_operation *op;
	struct wake_count w[3] = {0};

	gate_init(&g);
	op = submit(r, "w", work_ok, &j);
	for (int i = 0; i < 3; i++)
		ck_assert(ts_operation_wait(op, wake_counter, &w[i]));
	ts_operation_unwait(op, wake_counter, &w[1]);
	/* unwaiting what was never registered is harmless */
	ts_operation_unwait(op, wake_counter, &j);
	gate_open(&g);
	ck_assert(ts_operation_block(op, 10 * SEC));
	await_int(&w[0].wakes, 1);
	await_int(&w[2].wakes, 1);
	usleep(20000);
	ck_assert_int_eq(atomic_load(&w[0].wakes), 1);
	ck_assert_int_eq(atomic_load(&w[1].wakes), 0);
	ck_assert_int_eq(atomic_load(&w[2].wakes), 1);
	/* finished: nothing registers, nothing is called */
	ck_assert(!ts_operation_wait(op, wake_counter, &w[1]));
	ts_operation_unwait(op, wake_counter, &w[1]);
	ck_assert_int_eq(atomic_load(&w[1].wakes), 0);
	ts_operation_unref(op);
	ts_op_registry_free(r);
}
END_TEST

/* A waiter that checks it is never called after its unwait returned. */
struct racer {
	_Atomic int wakes;
	_Atomic int inside;           /* wake is running */
	_Atomic int dead;             /* unwait returned */
	_Atomic int violations;
};

static void racer_wake(void *token)
{
	struct racer *x = token;

	atomic_store(&x->inside, 1);
	if (atomic_load(&x->dead))
		atomic_fetch_add(&x->violations, 1);
	for (volatile int i = 0; i < 200; i++)
		;
	if (atomic_load(&x->dead))
		atomic_fetch_add(&x->violations, 1);
	atomic_fetch_add(&x->wakes, 1);
	atomic_store(&x->inside, 0);
}

static ts_status work_quick(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct job *j = arg;
	int spin = atomic_fetch_add(&j->ran, 1) % 7;

	for (volatile int i = 0; i < spin * 50; i++)
		;
	return TS_OK;
}

/* Waits for the test's go, then ends after a varying short spin. */
static ts_status work_racing(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct job *j = arg;
	int spin = (int)(ts_now_ns() % 13);

	while (!atomic_load(&j->go))
		sched_yield();
	for (volatile int i = 0; i < spin * 60; i++)
		;
	return TS_OK;
}

START_TEST(test_unwait_races_finish)
{
	struct ts_op_registry *r = registry(2, 16, 0);
	int n = 3000, woken = 0;

	for (int i = 0; i < n; i++) {
		struct job j = {0};
		struct racer x = {0};
		struct ts_operation *op = submit(r, NULL, work_racing, &j);

		/* registered before the work can end, then raced against it */
		ck_assert(ts_operation_wait(op, racer_wake, &x));
		atomic_store(&j.go, 1);
		for (uint64_t until = ts_now_ns() + (uint64_t)(i % 41) * 5000; ts_now_ns() < until;)
			;
		ts_operation_unwait(op, racer_wake, &x);
		ck_assert_int_eq(atomic_load(&x.inside), 0);
		atomic_store(&x.dead, 1);
		ck_assert(ts_operation_block(op, 10 * SEC));
		ck_assert_int_le(atomic_load(&x.wakes), 1);
		woken += atomic_load(&x.wakes);
		ck_assert_int_eq(atomic_load(&x.violations), 0);
		ck_assert_int_eq(atomic_load(&j.released), 1);   /* release runs before done */
		ts_operation_unref(op);
		/* x and j go out of scope here: a late call would touch a dead frame */
	}
	fprintf(stderr, "unwait race: %d of %d woken before their unwait\n", woken, n);
	ts_op_registry_free(r);
}
END_TEST

START_TEST(test_block_times_out)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct gate g;
	struct job j = {.gate = &g};
	struct ts_operation *op;
	uint64_t t0;

	gate_init(&g);
	op = submit(r, "w", work_ok, &j);
	t0 = ts_now_ns();
	ck_assert(!ts_operation_block(op, 50 * MS));
	ck_assert_uint_ge(ts_now_ns() - t0, 50 * MS);
	ck_assert(!ts_operation_block(op, 0));
	gate_open(&g);
	ck_assert(ts_operation_block(op, UINT64_MAX));
	ck_assert(ts_operation_block(op, 0));
	ts_operation_unref(op);
	ts_op_registry_free(r);
}
END_TEST

/* ---- retention and listing --------------------------------------------------------------- */

static void run_to_end(struct ts_op_registry *r, struct job *j, struct ts_operation **keep)
{
	struct ts_operation *op = submit(r, NULL, work_ok, j);

	ck_assert(ts_operation_block(op, 10 * SEC));
	await_int(&j->released, 1);
	if (keep)
		*keep = op;
	else
		ts_operation_unref(op);
}

START_TEST(test_retention_by_count)
{
	struct ts_op_registry *r = registry(1, 3, 0);
	struct job j[6] = {0};
	struct ts_operation *first, **ops;
	struct ts_op_snapshot s;
	uint64_t counts[TS_OP_CANCELLED + 1];
	struct ts_error err;
	char first_id[40];
	size_t n;

	run_to_end(r, &j[0], &first);
	snprintf(first_id, sizeof first_id, "%s", ts_operation_id(first));
	for (int i = 1; i < 6; i++)
		run_to_end(r, &j[i], NULL);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_list(r, -1, 100, &ops, &n, &err), TS_OK);
	ck_assert_uint_eq(n, 3);
	ts_op_list_free(ops, n);
	ck_assert_ptr_null(ts_op_get(r, first_id));
	/* dropped by the registry, still alive for its holder */
	ts_operation_snapshot(first, &s);
	ck_assert_int_eq(s.state, TS_OP_SUCCEEDED);
	ck_assert_str_eq(s.id, first_id);
	ts_op_snapshot_release(&s);
	ts_op_counts(r, counts);
	ck_assert_uint_eq(counts[TS_OP_SUCCEEDED], 3);
	ck_assert_uint_eq(counts[TS_OP_PENDING] + counts[TS_OP_RUNNING], 0);
	ts_operation_unref(first);
	ts_op_registry_free(r);
}
END_TEST

/* Resuming a listing after an operation: the older ones, page by page,
 * whatever was removed meanwhile; more says whether any remain. */
START_TEST(test_list_before_pages)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct job j[5] = {0};
	struct ts_operation *op[5], **ops;
	struct ts_error err;
	bool more;
	size_t n;

	for (int i = 0; i < 5; i++)
		run_to_end(r, &j[i], &op[i]);
	for (int i = 1; i < 5; i++)
		ck_assert_uint_gt(ts_operation_seq(op[i]), ts_operation_seq(op[i - 1]));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_list_before(r, -1, 0, 2, &ops, &n, &more, &err), TS_OK);
	ck_assert_uint_eq(n, 2);
	ck_assert(more);
	ck_assert_ptr_eq(ops[0], op[4]);
	ck_assert_ptr_eq(ops[1], op[3]);
	ts_op_list_free(ops, n);
	/* op[2] goes; the page after op[3] starts at op[1] */
	ck_assert_int_eq(ts_op_remove(r, op[2], &err), TS_OK);
	ck_assert_int_eq(ts_op_list_before(r, -1, ts_operation_seq(op[3]), 2, &ops, &n, &more,
	                                   &err), TS_OK);
	ck_assert_uint_eq(n, 2);
	ck_assert(!more);
	ck_assert_ptr_eq(ops[0], op[1]);
	ck_assert_ptr_eq(ops[1], op[0]);
	ts_op_list_free(ops, n);
	/* after a removed operation, as after a listed one */
	ck_assert_int_eq(ts_op_list_before(r, -1, ts_operation_seq(op[2]), 10, &ops, &n, &more,
	                                   &err), TS_OK);
	ck_assert_uint_eq(n, 2);
	ts_op_list_free(ops, n);
	ck_assert_int_eq(ts_op_list_before(r, TS_OP_FAILED, 0, 10, &ops, &n, &more, &err), TS_OK);
	ck_assert_uint_eq(n, 0);
	ck_assert(!more);
	ts_op_list_free(ops, n);
	for (int i = 0; i < 5; i++)
		ts_operation_unref(op[i]);
	ts_op_registry_free(r);
}
END_TEST

/* Removing: a finished operation is no longer found nor counted, its
 * holders keep it; a running one is refused; twice is NOT_FOUND. */
START_TEST(test_remove_finished_only)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct gate g;
	struct job j = {0}, jr = {.gate = &g};
	struct ts_operation *done, *running;
	uint64_t counts[TS_OP_CANCELLED + 1];
	struct ts_error err;

	gate_init(&g);
	run_to_end(r, &j, &done);
	running = submit(r, "w", work_ok, &jr);
	gate_wait_entered(&g, 1);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_remove(r, running, &err), TS_FAILED_PRECONDITION);
	ck_assert_str_eq(err.reason, "OPERATION_RUNNING");
	ck_assert_ptr_nonnull(strstr(err.message, ts_operation_id(running)));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_remove(r, done, &err), TS_OK);
	ck_assert_ptr_null(ts_op_get(r, ts_operation_id(done)));
	ts_op_counts(r, counts);
	ck_assert_uint_eq(counts[TS_OP_SUCCEEDED], 0);
	ck_assert_int_eq(state_of(done), TS_OP_SUCCEEDED);
	ck_assert_int_eq(ts_op_remove(r, done, &err), TS_NOT_FOUND);
	gate_open(&g);
	ck_assert(ts_operation_block(running, 10 * SEC));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_remove(r, running, &err), TS_OK);
	ts_operation_unref(done);
	ts_operation_unref(running);
	ts_op_registry_free(r);
}
END_TEST

START_TEST(test_retention_keeps_none)
{
	struct ts_op_registry *r = registry(1, 0, 0);
	struct job j = {0};
	struct ts_operation *op, **ops;
	struct ts_error err;
	size_t n;

	run_to_end(r, &j, &op);
	ck_assert_ptr_null(ts_op_get(r, ts_operation_id(op)));
	ck_assert_int_eq(state_of(op), TS_OP_SUCCEEDED);
	ck_assert(!ts_operation_wait(op, wake_counter, &j));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_list(r, -1, 10, &ops, &n, &err), TS_OK);
	ck_assert_uint_eq(n, 0);
	ts_op_list_free(ops, n);
	ts_operation_unref(op);
	ts_op_registry_free(r);
}
END_TEST

START_TEST(test_retention_by_age)
{
	struct ts_op_registry *r = registry(1, 100, 60 * MS);
	struct job j[2] = {0};
	struct ts_operation **ops;
	uint64_t counts[TS_OP_CANCELLED + 1];
	struct ts_error err;
	size_t n;

	run_to_end(r, &j[0], NULL);
	run_to_end(r, &j[1], NULL);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_list(r, -1, 100, &ops, &n, &err), TS_OK);
	ck_assert_uint_eq(n, 2);
	ts_op_list_free(ops, n);
	usleep(150000);
	ck_assert_int_eq(ts_op_list(r, -1, 100, &ops, &n, &err), TS_OK);
	ck_assert_uint_eq(n, 0);
	ts_op_list_free(ops, n);
	ts_op_counts(r, counts);
	for (int i = 0; i <= TS_OP_CANCELLED; i++)
		ck_assert_uint_eq(counts[i], 0);
	ts_op_registry_free(r);
}
END_TEST

static void expect_list(struct ts_op_registry *r, int only, size_t limit,
                        struct ts_operation *const *want, size_t nwant)
{
	struct ts_operation **ops;
	struct ts_error err;
	size_t n;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_list(r, only, limit, &ops, &n, &err), TS_OK);
	ck_assert_uint_eq(n, nwant);
	for (size_t i = 0; i < n; i++)
		ck_assert_ptr_eq(ops[i], want[i]);
	ts_op_list_free(ops, n);
}

START_TEST(test_list_newest_first_by_state)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct gate g;
	struct job ja = {0}, jb = {0}, jc = {.gate = &g}, jd = {0};
	struct ts_operation *a, *b, *c, *d, **ops;
	uint64_t counts[TS_OP_CANCELLED + 1];
	struct ts_error err;
	size_t n;

	gate_init(&g);
	a = submit(r, "a", work_ok, &ja);
	ck_assert(ts_operation_block(a, 10 * SEC));
	b = submit(r, "b", work_fail, &jb);
	ck_assert(ts_operation_block(b, 10 * SEC));
	c = submit(r, "c", work_ok, &jc);
	gate_wait_entered(&g, 1);
	d = submit(r, "d", work_ok, &jd);
	expect_list(r, -1, 100, (struct ts_operation *[]){d, c, b, a}, 4);
	expect_list(r, -1, 2, (struct ts_operation *[]){d, c}, 2);
	expect_list(r, TS_OP_PENDING, 100, (struct ts_operation *[]){d}, 1);
	expect_list(r, TS_OP_RUNNING, 100, (struct ts_operation *[]){c}, 1);
	expect_list(r, TS_OP_SUCCEEDED, 100, (struct ts_operation *[]){a}, 1);
	expect_list(r, TS_OP_FAILED, 100, (struct ts_operation *[]){b}, 1);
	expect_list(r, TS_OP_CANCELLED, 100, NULL, 0);
	expect_list(r, -1, 0, NULL, 0);
	ts_op_counts(r, counts);
	ck_assert_uint_eq(counts[TS_OP_PENDING], 1);
	ck_assert_uint_eq(counts[TS_OP_RUNNING], 1);
	ck_assert_uint_eq(counts[TS_OP_SUCCEEDED], 1);
	ck_assert_uint_eq(counts[TS_OP_FAILED], 1);
	ck_assert_uint_eq(counts[TS_OP_CANCELLED], 0);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_list(r, 7, 10, &ops, &n, &err), TS_INVALID_ARGUMENT);
	gate_open(&g);
	ck_assert(ts_operation_block(d, 10 * SEC));
	ts_op_counts(r, counts);
	ck_assert_uint_eq(counts[TS_OP_SUCCEEDED], 3);
	ck_assert_uint_eq(counts[TS_OP_PENDING] + counts[TS_OP_RUNNING], 0);
	ts_operation_unref(a);
	ts_operation_unref(b);
	ts_operation_unref(c);
	ts_operation_unref(d);
	ts_op_registry_free(r);
}
END_TEST

/* ---- freeing a busy registry ------------------------------------------------------------- */

START_TEST(test_free_with_pending_and_running)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct gate g;
	struct job run = {.gate = &g}, pend[3] = {0};
	struct ts_operation *running, *pending[3];
	struct wake_count w[3] = {0};
	struct ts_op_snapshot s;
	struct ts_error err;

	gate_init(&g);
	gate_open(&g);
	running = submit(r, "r", work_until_cancelled, &run);
	gate_wait_entered(&g, 1);
	for (int i = 0; i < 3; i++) {
		pending[i] = submit(r, NULL, work_ok, &pend[i]);
		ck_assert(ts_operation_wait(pending[i], wake_counter, &w[i]));
	}
	ts_op_registry_free(r);
	/* everything ended, the references we hold still read */
	ts_operation_snapshot(running, &s);
	ck_assert_int_eq(s.state, TS_OP_CANCELLED);
	ts_op_snapshot_release(&s);
	ck_assert_int_eq(atomic_load(&run.released), 1);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(state_of(pending[i]), TS_OP_CANCELLED);
		ck_assert_int_eq(atomic_load(&pend[i].ran), 0);
		ck_assert_int_eq(atomic_load(&pend[i].released), 1);
		ck_assert_int_eq(atomic_load(&w[i].wakes), 1);
		ck_assert(ts_operation_block(pending[i], 0));
		ts_error_clear(&err);
		ck_assert_int_eq(ts_operation_cancel(pending[i], &err), TS_FAILED_PRECONDITION);
		ts_operation_unref(pending[i]);
	}
	ts_operation_unref(running);
}
END_TEST

static void *open_later(void *arg)
{
	usleep(50000);
	gate_open(arg);
	return NULL;
}

START_TEST(test_free_waits_for_running_work)
{
	struct ts_op_registry *r = registry(2, 100, 0);
	struct gate g;
	struct job j = {.gate = &g};
	struct ts_operation *op;
	pthread_t t;

	gate_init(&g);
	op = submit(r, NULL, work_ok, &j);
	gate_wait_entered(&g, 1);
	pthread_create(&t, NULL, open_later, &g);
	ts_op_registry_free(r);        /* the work ignores the flag and succeeds */
	ck_assert_int_eq(state_of(op), TS_OP_SUCCEEDED);
	ck_assert_int_eq(atomic_load(&j.released), 1);
	pthread_join(t, NULL);
	ts_operation_unref(op);
}
END_TEST

/* ---- many submitters --------------------------------------------------------------------- */

#define SUBMITTERS 8
#define PER_SUBMITTER 250

struct submitter {
	struct ts_op_registry *r;
	int index;
	struct job jobs[PER_SUBMITTER];
	char ids[PER_SUBMITTER][40];
	int failures;
	int busy_seen;
};

static void *submit_many(void *arg)
{
	struct submitter *s = arg;
	struct ts_operation *ops[PER_SUBMITTER];

	for (int i = 0; i < PER_SUBMITTER; i++) {
		struct ts_error err;
		char target[32];

		ts_error_clear(&err);
		snprintf(target, sizeof target, "t%d-%d", s->index, i);
		s->jobs[i].progress = 1;
		if (ts_op_submit(s->r, "copy", target, 1, NULL, work_ok, &s->jobs[i], job_release,
		                 &ops[i], &err) != TS_OK) {
			s->failures++;
			ops[i] = NULL;
			continue;
		}
		snprintf(s->ids[i], sizeof s->ids[i], "%s", ts_operation_id(ops[i]));
		/* everyone also races for one hot target */
		ts_error_clear(&err);
		{
			struct ts_operation *hot = NULL;
			ts_status st = ts_op_submit(s->r, "copy", "hot", 1, NULL, work_quick,
			                            &s->jobs[i], NULL, &hot, &err);

			if (st == TS_ABORTED)
				s->busy_seen++;
			else if (st != TS_OK)
				s->failures++;
			if (hot && !ts_operation_block(hot, 10 * SEC))
				s->failures++;
			ts_operation_unref(hot);
		}
	}
	for (int i = 0; i < PER_SUBMITTER; i++) {
		if (ops[i] && !ts_operation_block(ops[i], 20 * SEC))
			s->failures++;
		ts_operation_unref(ops[i]);
	}
	return NULL;
}

static int cmp_ids(const void *a, const void *b)
{
	return strcmp(a, b);
}

START_TEST(test_many_concurrent_submitters)
{
	struct ts_op_registry *r = registry(4, 100000, 0);
	struct submitter *s = calloc(SUBMITTERS, sizeof *s);
	char (*ids)[40] = calloc(SUBMITTERS * PER_SUBMITTER, sizeof *ids);
	uint64_t counts[TS_OP_CANCELLED + 1], total = 0;
	pthread_t t[SUBMITTERS];

	for (int i = 0; i < SUBMITTERS; i++) {
		s[i].r = r;
		s[i].index = i;
		pthread_create(&t[i], NULL, submit_many, &s[i]);
	}
	for (int i = 0; i < SUBMITTERS; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < SUBMITTERS; i++) {
		ck_assert_int_eq(s[i].failures, 0);
		for (int k = 0; k < PER_SUBMITTER; k++) {
			ck_assert_int_eq(atomic_load(&s[i].jobs[k].released), 1);
			ck_assert(id_well_formed(s[i].ids[k]));
			memcpy(ids[i * PER_SUBMITTER + k], s[i].ids[k], 40);
		}
	}
	qsort(ids, SUBMITTERS * PER_SUBMITTER, sizeof *ids, cmp_ids);
	for (int i = 1; i < SUBMITTERS * PER_SUBMITTER; i++)
		ck_assert_str_ne(ids[i - 1], ids[i]);
	ts_op_counts(r, counts);
	for (int i = 0; i <= TS_OP_CANCELLED; i++)
		total += counts[i];
	ck_assert_uint_eq(counts[TS_OP_PENDING] + counts[TS_OP_RUNNING], 0);
	ck_assert_uint_eq(counts[TS_OP_FAILED] + counts[TS_OP_CANCELLED], 0);
	ck_assert_uint_ge(total, SUBMITTERS * PER_SUBMITTER);
	ts_op_registry_free(r);
	free(ids);
	free(s);
}
END_TEST

/* ---- rendering and handlers -------------------------------------------------------------- */

static bool rfc3339_utc_micros(const char *t)
{
	int y, mo, d, h, mi, sec;
	unsigned us;
	char z;

	return t && strlen(t) == 27 &&
	       sscanf(t, "%4d-%2d-%2dT%2d:%2d:%2d.%6u%c", &y, &mo, &d, &h, &mi, &sec, &us, &z) == 8 &&
	       z == 'Z' && y >= 2020;
}

/* An operation's metadata member (AIP-151: kind, state, progress... live
 * there). */
#define META(o) json_object_get((o), "metadata")

START_TEST(test_operation_json_shapes)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct gate g;
	struct job ja = {.gate = &g, .progress = 100}, jb = {0}, jc = {0};
	struct ts_operation *a, *b, *c;
	struct ts_error err;
	char name[64];
	json_t *o, *e;

	gate_init(&g);
	a = submit(r, "w1", work_ok, &ja);
	gate_wait_entered(&g, 1);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_submit(r, "step", NULL, 10, "steps", work_ok, &jb, job_release, &b,
	                              &err), TS_OK);
	/* running, with bytes */
	o = ts_h_operation_json(a);
	snprintf(name, sizeof name, "operations/%s", ts_operation_id(a));
	ck_assert_str_eq(json_string_value(json_object_get(o, "name")), name);
	ck_assert_str_eq(json_string_value(json_object_get(META(o), "id")), ts_operation_id(a));
	ck_assert_str_eq(json_string_value(json_object_get(META(o), "kind")), "put");
	ck_assert_str_eq(json_string_value(json_object_get(META(o), "target")), "w1");
	ck_assert_str_eq(json_string_value(json_object_get(META(o), "state")), "RUNNING");
	ck_assert(json_is_false(json_object_get(o, "done")));
	ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(META(o), "progress"),
	                                                    "bytes_total")), 100);
	ck_assert(json_is_integer(json_object_get(json_object_get(META(o), "progress"), "bytes_done")));
	ck_assert(rfc3339_utc_micros(json_string_value(json_object_get(META(o), "create_time"))));
	ck_assert(rfc3339_utc_micros(json_string_value(json_object_get(META(o), "start_time"))));
	ck_assert_ptr_null(json_object_get(META(o), "end_time"));
	ck_assert_ptr_null(json_object_get(o, "error"));
	ck_assert_ptr_null(json_object_get(o, "response"));
	json_decref(o);
	/* pending, with steps and no target */
	o = ts_h_operation_json(b);
	ck_assert_str_eq(json_string_value(json_object_get(META(o), "state")), "PENDING");
	ck_assert_ptr_null(json_object_get(META(o), "target"));
	ck_assert_ptr_null(json_object_get(META(o), "start_time"));
	ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(META(o), "progress"),
	                                                    "steps_total")), 10);
	ck_assert_ptr_null(json_object_get(json_object_get(META(o), "progress"), "bytes_total"));
	json_decref(o);
	/* cancelled: a google.rpc.Status */
	ck_assert_int_eq(ts_operation_cancel(b, &err), TS_OK);
	o = ts_h_operation_json(b);
	ck_assert(json_is_true(json_object_get(o, "done")));
	e = json_object_get(o, "error");
	ck_assert_int_eq(json_integer_value(json_object_get(e, "code")), 499);
	ck_assert_str_eq(json_string_value(json_object_get(e, "status")), "CANCELLED");
	ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(e, "message")),
	                             "was cancelled"));
	ck_assert(json_is_array(json_object_get(e, "details")));
	ck_assert_ptr_null(json_object_get(o, "response"));
	ck_assert(rfc3339_utc_micros(json_string_value(json_object_get(META(o), "end_time"))));
	json_decref(o);
	/* succeeded: the result */
	gate_open(&g);
	ck_assert(ts_operation_block(a, 10 * SEC));
	o = ts_h_operation_json(a);
	ck_assert_str_eq(json_string_value(json_object_get(META(o), "state")), "SUCCEEDED");
	ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o, "response"), "n")), 42);
	ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(META(o), "progress"),
	                                                    "bytes_done")), 100);
	ck_assert_ptr_null(json_object_get(o, "error"));
	json_decref(o);
	/* failed: the work's error */
	c = submit(r, NULL, work_fail, &jc);
	ck_assert(ts_operation_block(c, 10 * SEC));
	o = ts_h_operation_json(c);
	e = json_object_get(o, "error");
	ck_assert_int_eq(json_integer_value(json_object_get(e, "code")), 404);
	ck_assert_str_eq(json_string_value(json_object_get(e, "status")), "NOT_FOUND");
	ck_assert_str_eq(json_string_value(json_object_get(
	                     json_array_get(json_object_get(e, "details"), 0), "reason")),
	                 "ARRAY_NOT_FOUND");
	json_decref(o);
	ts_operation_unref(a);
	ts_operation_unref(b);
	ts_operation_unref(c);
	ts_op_registry_free(r);
}
END_TEST

START_TEST(test_reply_operation_codes)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct gate g;
	struct job j = {.gate = &g};
	struct ts_operation *op;
	struct ts_reply reply = {0};
	char loc[96];

	gate_init(&g);
	op = submit(r, "w", work_ok, &j);
	ts_h_reply_operation(&reply, op, false);
	ck_assert_int_eq(reply.kind, TS_REPLY_JSON);
	ck_assert_int_eq(reply.ok, TS_HTTP_ACCEPTED);
	snprintf(loc, sizeof loc, "/v1/operations/%s", ts_operation_id(op));
	ck_assert_int_eq(reply.nheaders, 1);
	ck_assert_str_eq(reply.headers[0].name, "Location");
	ck_assert_str_eq(reply.headers[0].value, loc);
	ts_reply_release(&reply);
	gate_open(&g);
	ck_assert(ts_operation_block(op, 10 * SEC));
	ts_h_reply_operation(&reply, op, true);
	ck_assert_int_eq(reply.ok, TS_HTTP_OK);
	ck_assert_int_eq(reply.nheaders, 0);
	ck_assert(json_is_true(json_object_get(reply.json, "done")));
	ts_reply_release(&reply);
	ts_operation_unref(op);
	ts_op_registry_free(r);
}
END_TEST

/* Query lookups of a hand-made call: conn is a NULL-terminated list of
 * "key=value" strings (or NULL). */
static const char *fake_lookup(void *conn, int where, const char *key)
{
	size_t n = strlen(key);

	for (const char *const *q = conn; q && *q; q++)
		if (where == TS_LOOKUP_QUERY && strncmp(*q, key, n) == 0 && (*q)[n] == '=')
			return *q + n + 1;
	return NULL;
}

static void call_handler(ts_handler_fn *fn, struct ts_op_registry *r, const char *id,
                         const char *const *query, struct ts_reply *reply)
{
	struct ts_core core = {.env.operations = r};
	struct ts_call call = {.core = &core, .method = "GET", .path = "/v1/operations",
	                       .conn = (void *)query, .lookup = fake_lookup};

	if (id) {
		call.nparams = 1;
		call.params[0].name = "operation";
		call.params[0].value = id;
	}
	memset(reply, 0, sizeof *reply);
	fn(&call, reply);
}

START_TEST(test_handlers_get_list_cancel)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct gate g;
	struct job ja = {.gate = &g}, jb = {0};
	struct ts_operation *a, *b;
	struct ts_reply reply;
	json_t *list;

	gate_init(&g);
	a = submit(r, "a", work_ok, &ja);
	gate_wait_entered(&g, 1);
	b = submit(r, "b", work_ok, &jb);

	call_handler(ts_h_operations_get, r, ts_operation_id(a), NULL, &reply);
	ck_assert_int_eq(reply.kind, TS_REPLY_JSON);
	ck_assert_str_eq(json_string_value(json_object_get(META(reply.json), "state")), "RUNNING");
	ts_reply_release(&reply);
	call_handler(ts_h_operations_get, r, "op-0000000000000000", NULL, &reply);
	ck_assert_int_eq(reply.kind, TS_REPLY_ERROR);
	ck_assert_int_eq(reply.error.status, TS_NOT_FOUND);
	ck_assert_str_eq(reply.error.reason, "OPERATION_NOT_FOUND");
	ts_reply_release(&reply);

	call_handler(ts_h_operations_list, r, NULL, NULL, &reply);
	list = json_object_get(reply.json, "operations");
	ck_assert_uint_eq(json_array_size(list), 2);
	ck_assert_str_eq(json_string_value(json_object_get(META(json_array_get(list, 0)), "id")),
	                 ts_operation_id(b));
	ts_reply_release(&reply);
	call_handler(ts_h_operations_list, r, NULL, (const char *const[]){"state=PENDING", NULL},
	             &reply);
	list = json_object_get(reply.json, "operations");
	ck_assert_uint_eq(json_array_size(list), 1);
	ck_assert_str_eq(json_string_value(json_object_get(META(json_array_get(list, 0)), "state")),
	                 "PENDING");
	ts_reply_release(&reply);
	call_handler(ts_h_operations_list, r, NULL, (const char *const[]){"page_size=1", NULL},
	             &reply);
	ck_assert_uint_eq(json_array_size(json_object_get(reply.json, "operations")), 1);
	ts_reply_release(&reply);
	call_handler(ts_h_operations_list, r, NULL, (const char *const[]){"state=nope", NULL},
	             &reply);
	ck_assert_int_eq(reply.kind, TS_REPLY_ERROR);
	ck_assert_str_eq(reply.error.reason, "BAD_STATE");
	ts_reply_release(&reply);

	/* cancel: pending now, then already finished */
	call_handler(ts_h_operations_cancel, r, ts_operation_id(b), NULL, &reply);
	ck_assert_int_eq(reply.kind, TS_REPLY_JSON);
	ck_assert_int_eq(reply.ok, TS_HTTP_OK);
	ck_assert_str_eq(json_string_value(json_object_get(META(reply.json), "state")), "CANCELLED");
	ts_reply_release(&reply);
	call_handler(ts_h_operations_cancel, r, ts_operation_id(b), NULL, &reply);
	ck_assert_int_eq(reply.kind, TS_REPLY_ERROR);
	ck_assert_int_eq(reply.error.status, TS_FAILED_PRECONDITION);
	ts_reply_release(&reply);
	call_handler(ts_h_operations_cancel, r, "op-0000000000000000", NULL, &reply);
	ck_assert_int_eq(reply.error.status, TS_NOT_FOUND);
	ts_reply_release(&reply);

	gate_open(&g);
	ck_assert(ts_operation_block(a, 10 * SEC));
	ts_operation_unref(a);
	ts_operation_unref(b);
	ts_op_registry_free(r);
}
END_TEST

/* ---- the suite --------------------------------------------------------------------------- */


/* What a hold callback saw, and what it answers. */
struct holding {
	char id[40];
	int calls;
	bool fail;
};

static ts_status hold_cb(const char *id, void *arg, struct ts_error *err)
{
	struct job *j = arg;
	struct holding *h = j->hold;

	h->calls++;
	snprintf(h->id, sizeof h->id, "%s", id);
	if (h->fail)
		return ts_error_set(err, TS_ABORTED, "ARRAY_HELD", "held by someone else");
	return TS_OK;
}

/* The hold runs once, with the id the operation gets, before it can run; a
 * failed hold submits nothing and leaves arg the caller's. */
START_TEST(test_submit_holding_runs_the_hold_first)
{
	struct ts_op_registry *r = registry(1, 100, 0);
	struct holding ok = {.fail = false}, no = {.fail = true};
	struct job a = {.hold = &ok}, b = {.hold = &no};
	struct ts_operation *op = NULL, *none = (void *)1;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_submit_holding(r, "step", "m", 1, "steps", work_ok, &a, job_release,
	                                      hold_cb, &op, &err), TS_OK);
	ck_assert_int_eq(ok.calls, 1);
	ck_assert_str_eq(ok.id, ts_operation_id(op));
	ck_assert(ts_operation_block(op, 10 * SEC));
	ck_assert_int_eq(atomic_load(&a.ran), 1);
	ck_assert_int_eq(atomic_load(&a.released), 1);
	ck_assert_int_eq(ts_op_submit_holding(r, "step", "m", 1, "steps", work_ok, &b, job_release,
	                                      hold_cb, &none, &err), TS_ABORTED);
	ck_assert_str_eq(err.reason, "ARRAY_HELD");
	ck_assert_ptr_null(none);
	ck_assert_int_eq(no.calls, 1);
	ck_assert_ptr_null(ts_op_get(r, no.id));     /* never listed */
	ck_assert_int_eq(atomic_load(&b.ran), 0);
	ck_assert_int_eq(atomic_load(&b.released), 0);
	ts_operation_unref(op);
	ts_op_registry_free(r);
}
END_TEST

/* ---- the end hook ---------------------------------------------------------------------- */

/* What the registry's ended hook saw (called on worker threads: it only
 * records, under a lock, for the test thread to check). */
struct ends {
	pthread_mutex_t mu;
	int n;
	struct {
		char id[40], kind[16], target[136], reason[64];
		enum ts_op_state state;
		uint64_t done, total, run_ns;
	} e[8];
};

static void record_end(void *cls, const struct ts_op_end *end)
{
	struct ends *x = cls;

	pthread_mutex_lock(&x->mu);
	if (x->n < 8) {
		snprintf(x->e[x->n].id, sizeof x->e[0].id, "%s", end->id);
		snprintf(x->e[x->n].kind, sizeof x->e[0].kind, "%s", end->kind);
		snprintf(x->e[x->n].target, sizeof x->e[0].target, "%s", end->target);
		snprintf(x->e[x->n].reason, sizeof x->e[0].reason, "%s",
		         end->error ? end->error->reason : "");
		x->e[x->n].state = end->state;
		x->e[x->n].done = end->done_units;
		x->e[x->n].total = end->total_units;
		x->e[x->n].run_ns = end->run_ns;
	}
	x->n++;
	pthread_mutex_unlock(&x->mu);
}

/* The hook runs once per operation, before its waiters wake, with its kind,
 * outcome, units and error: succeeded, failed, and cancelled while pending
 * (never run: no running time). */
START_TEST(test_ended_hook_once_per_operation)
{
	static struct ends x = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct ts_op_registry_config cfg = {.workers = 1, .keep_finished = 10,
	                                    .ended = record_end, .ended_cls = &x};
	struct ts_op_registry *r = NULL;
	struct gate g;
	struct job ok = {.progress = 100}, bad = {0}, held = {0}, queued = {0};
	struct ts_operation *a, *b, *c, *d;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_op_registry_new(&cfg, &r, &err), TS_OK);
	a = submit(r, "t1", work_ok, &ok);
	ck_assert(ts_operation_block(a, 10 * SEC));
	/* the hook ran before the waiter woke */
	ck_assert_int_eq(x.n, 1);
	b = submit(r, NULL, work_fail, &bad);
	ck_assert(ts_operation_block(b, 10 * SEC));
	ck_assert_int_eq(x.n, 2);
	gate_init(&g);
	held.gate = &g;
	c = submit(r, NULL, work_ok, &held);
	gate_wait_entered(&g, 1);
	d = submit(r, "t2", work_ok, &queued);     /* behind c on the one worker */
	ck_assert_int_eq(ts_operation_cancel(d, &err), TS_OK);
	gate_open(&g);
	ck_assert(ts_operation_block(c, 10 * SEC));
	ck_assert(ts_operation_block(d, 10 * SEC));
	ts_op_registry_free(r);

	ck_assert_int_eq(x.n, 4);
	ck_assert_str_eq(x.e[0].id, ts_operation_id(a));
	ck_assert_str_eq(x.e[0].kind, "put");
	ck_assert_str_eq(x.e[0].target, "t1");
	ck_assert_int_eq(x.e[0].state, TS_OP_SUCCEEDED);
	ck_assert_uint_eq(x.e[0].done, 100);
	ck_assert_uint_eq(x.e[0].total, 100);
	ck_assert_str_eq(x.e[0].reason, "");
	ck_assert_int_eq(x.e[1].state, TS_OP_FAILED);
	ck_assert_str_eq(x.e[1].reason, "ARRAY_NOT_FOUND");
	ck_assert_str_eq(x.e[1].target, "");
	/* d was cancelled while c still ran: d ends first */
	ck_assert_str_eq(x.e[2].id, ts_operation_id(d));
	ck_assert_int_eq(x.e[2].state, TS_OP_CANCELLED);
	ck_assert_str_eq(x.e[2].reason, "OPERATION_CANCELLED");
	ck_assert_uint_eq(x.e[2].run_ns, 0);
	ck_assert_str_eq(x.e[3].id, ts_operation_id(c));
	ck_assert_int_eq(x.e[3].state, TS_OP_SUCCEEDED);
	ck_assert_int_eq(atomic_load(&queued.ran), 0);
	ts_operation_unref(a);
	ts_operation_unref(b);
	ts_operation_unref(c);
	ts_operation_unref(d);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("operation");
	TCase *tc;

	tc = tcase_create("outcomes");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_succeeds_with_result);
	tcase_add_test(tc, test_failure_keeps_the_error);
	tcase_add_test(tc, test_failure_keeps_the_partial_result);
	tcase_add_test(tc, test_cancel_while_pending);
	tcase_add_test(tc, test_submit_here_runs_on_the_caller);
	tcase_add_test(tc, test_cancel_while_running);
	tcase_add_test(tc, test_cancel_after_finish_refused);
	tcase_add_test(tc, test_target_claims);
	tcase_add_test(tc, test_submit_holding_runs_the_hold_first);
	tcase_add_test(tc, test_bad_arguments_refused);
	tcase_add_test(tc, test_state_names);
	tcase_add_test(tc, test_progress_is_atomic);
	suite_add_tcase(s, tc);

	tc = tcase_create("waiting");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_waiters_woken_once);
	tcase_add_test(tc, test_unwait_races_finish);
	tcase_add_test(tc, test_block_times_out);
	suite_add_tcase(s, tc);

	tc = tcase_create("registry");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_retention_by_count);
	tcase_add_test(tc, test_retention_keeps_none);
	tcase_add_test(tc, test_list_before_pages);
	tcase_add_test(tc, test_remove_finished_only);
	tcase_add_test(tc, test_retention_by_age);
	tcase_add_test(tc, test_list_newest_first_by_state);
	tcase_add_test(tc, test_free_with_pending_and_running);
	tcase_add_test(tc, test_free_waits_for_running_work);
	tcase_add_test(tc, test_many_concurrent_submitters);
	tcase_add_test(tc, test_ended_hook_once_per_operation);
	suite_add_tcase(s, tc);

	tc = tcase_create("rendering");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_operation_json_shapes);
	tcase_add_test(tc, test_reply_operation_codes);
	tcase_add_test(tc, test_handlers_get_list_cancel);
	suite_add_tcase(s, tc);
	return s;
}
