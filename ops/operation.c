/*
 * operation.c - the operation registry: every operation listed in creation
 * order and by id (a common/registry.h map), a FIFO of pending ones, the worker threads that
 * run them, target claims, waiters and retention.
 *
 * Each listed operation sits on exactly one state list of its registry: the
 * queue (pending, not yet taken), the active list (taken by a worker or by a
 * cancel, not yet finished) or the finished list (in order of finishing,
 * which is what retention drops from). A target is claimed while its
 * operation is on the queue or the active list.
 *
 * Locks, in the order they nest: the registry's lock (lists, hash, claims,
 * counts), an operation's lock (state, times, outcome, waiters), its waking
 * mutex (held while its waiters are called). A state change holds both
 * locks, so the registry's counts agree with the states and a snapshot needs
 * only the operation's lock. Progress, totals and the cancel flag are
 * atomics. The registry holds one reference to each listed operation.
 */
#include "ops/operation.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/lock.h"
#include "common/registry.h"
#include "common/trace.h"
#include "common/units.h"

/* A result set on a worker is freed on whichever thread drops the
 * operation (docs/ARCHITECTURE.md's jansson rule). */
#if !JANSSON_THREAD_SAFE_REFCOUNT
#error "jansson without atomic reference counts (JANSSON_THREAD_SAFE_REFCOUNT)"
#endif

static void cond_init_monotonic(pthread_cond_t *c)
{
	pthread_condattr_t a;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(c, &a);
	pthread_condattr_destroy(&a);
}

struct waiter {
	struct waiter *next;
	void (*wake)(void *token);
	void *token;
};

enum where { WHERE_NONE = 0, WHERE_QUEUE, WHERE_ACTIVE, WHERE_FINISHED };

struct ts_operation {
	_Atomic uint32_t refs;
	char id[40];                        /* immutable */
	char kind[16];                      /* immutable */
	char target[136];                   /* immutable; "" when none */
	char unit[16];                      /* immutable */
	uint64_t create_ns;                 /* immutable: wall clock */
	uint64_t seq;                       /* immutable once listed: creation order */
	ts_op_fn *fn;                       /* immutable */
	void *arg;                          /* immutable; handed to release once */
	void (*release)(void *arg);         /* immutable */
	/* immutable; used only while the operation is unfinished, which the
	 * registry outlives */
	struct ts_op_registry *reg;

	_Atomic uint64_t done_units, total_units;
	_Atomic bool cancel;

	struct ts_mutex lk;
	pthread_cond_t finished_cv;         /* broadcast when state becomes final */
	pthread_mutex_t waking;             /* held while waiters are called */
	enum ts_op_state state;             /* guarded by: lk (and reg->lk to change) */
	uint64_t start_ns, end_ns;          /* guarded by: lk */
	struct ts_error error;              /* guarded by: lk */
	json_t *result;                     /* guarded by: lk; own reference */
	json_t *partial;                    /* guarded by: lk; own reference */
	json_t *details;                    /* guarded by: lk; own reference */
	struct waiter *waiters;             /* guarded by: lk */

	/* registry links, guarded by: reg->lk */
	enum where where;
	struct ts_operation *prev, *next;   /* on the state list `where` names */
	struct ts_operation *older, *newer; /* every listed operation */
	uint64_t end_mono;                  /* when it finished (for retention) */
};

struct oplist {
	struct ts_operation *head, *tail;
	size_t n;
};

struct ts_op_registry {
	struct ts_op_registry_config cfg;   /* immutable */
	uint64_t salt;                      /* immutable: mixed into ids */
	pthread_t *threads;                 /* immutable after new */
	int nthreads;                       /* immutable after new */

	struct ts_mutex lk;
	pthread_cond_t work;                /* pending work, or shutdown */
	struct oplist queue, active, finished;     /* guarded by: lk */
	struct ts_operation *oldest, *newest;      /* guarded by: lk */
	struct ts_registry ids;                    /* id -> listed op; guarded by: lk */
	uint64_t next_seq;                         /* guarded by: lk */
	uint64_t counts[TS_OP_CANCELLED + 1];      /* guarded by: lk */
	bool shutdown;                             /* guarded by: lk */
};

const char *ts_op_state_name(enum ts_op_state s)
{
	switch (s) {
	case TS_OP_PENDING: return "PENDING";
	case TS_OP_RUNNING: return "RUNNING";
	case TS_OP_SUCCEEDED: return "SUCCEEDED";
	case TS_OP_FAILED: return "FAILED";
	case TS_OP_CANCELLED: return "CANCELLED";
	}
	return "UNKNOWN";
}

bool ts_op_state_parse(const char *name, enum ts_op_state *out)
{
	for (int s = TS_OP_PENDING; name && s <= TS_OP_CANCELLED; s++) {
		if (strcmp(name, ts_op_state_name((enum ts_op_state)s)) == 0) {
			*out = (enum ts_op_state)s;
			return true;
		}
	}
	return false;
}

static bool state_final(enum ts_op_state s)
{
	return s == TS_OP_SUCCEEDED || s == TS_OP_FAILED || s == TS_OP_CANCELLED;
}

/* ---- references --------------------------------------------------------------- */

static void op_free(struct ts_operation *op)
{
	struct waiter *w = op->waiters;

	while (w) {
		struct waiter *next = w->next;

		free(w);
		w = next;
	}
	json_decref(op->result);
	json_decref(op->partial);
	json_decref(op->details);
	pthread_cond_destroy(&op->finished_cv);
	pthread_mutex_destroy(&op->waking);
	ts_mutex_destroy(&op->lk);
	free(op);
}

struct ts_operation *ts_operation_ref(struct ts_operation *op)
{
	if (op)
		atomic_fetch_add_explicit(&op->refs, 1, memory_order_relaxed);
	return op;
}

void ts_operation_unref(struct ts_operation *op)
{
	uint32_t was;

	if (!op)
		return;
	was = atomic_fetch_sub_explicit(&op->refs, 1, memory_order_acq_rel);
	assert(was > 0);     /* an unref without its reference */
	if (was == 1)
		op_free(op);
}

/* Drops the references of a chain linked through next (ops unlisted by
 * retention), outside every lock. */
static void unref_chain(struct ts_operation *op)
{
	while (op) {
		struct ts_operation *next = op->next;

		ts_operation_unref(op);
		op = next;
	}
}

const char *ts_operation_id(const struct ts_operation *op)
{
	return op->id;
}

/* ---- the registry's lists ------------------------------------------------------- */

static void oplist_push_locked(struct ts_op_registry *r, struct oplist *l,
                               struct ts_operation *op, enum where w)
{
	assert(ts_mutex_held(&r->lk) && op->where == WHERE_NONE);
	op->prev = l->tail;
	op->next = NULL;
	if (l->tail)
		l->tail->next = op;
	else
		l->head = op;
	l->tail = op;
	l->n++;
	op->where = w;
}

static struct oplist *list_of_locked(struct ts_op_registry *r, enum where w)
{
	assert(ts_mutex_held(&r->lk));
	switch (w) {
	case WHERE_QUEUE: return &r->queue;
	case WHERE_ACTIVE: return &r->active;
	case WHERE_FINISHED: return &r->finished;
	case WHERE_NONE: break;
	}
	return NULL;
}

/* Takes op off whichever state list holds it. */
static void oplist_remove_locked(struct ts_op_registry *r, struct ts_operation *op)
{
	struct oplist *l;

	assert(ts_mutex_held(&r->lk));
	l = list_of_locked(r, op->where);
	if (!l)
		return;
	if (op->prev)
		op->prev->next = op->next;
	else
		l->head = op->next;
	if (op->next)
		op->next->prev = op->prev;
	else
		l->tail = op->prev;
	l->n--;
	op->prev = op->next = NULL;
	op->where = WHERE_NONE;
}

/* Lists a new operation: by id, creation order, queue. Takes over one of
 * its references. Room for its id was reserved (ts_registry_reserve). */
static void insert_locked(struct ts_op_registry *r, struct ts_operation *op)
{
	ts_status st;

	assert(ts_mutex_held(&r->lk));
	st = ts_registry_put(&r->ids, op->id, op, NULL, NULL);
	assert(st == TS_OK);   /* a valid, unique id; room reserved */
	(void)st;
	op->older = r->newest;
	op->newer = NULL;
	if (r->newest)
		r->newest->newer = op;
	else
		r->oldest = op;
	r->newest = op;
	oplist_push_locked(r, &r->queue, op, WHERE_QUEUE);
	r->counts[TS_OP_PENDING]++;
}

/* Unlists a finished operation; the caller drops the registry's reference
 * (after unlocking). */
static void unlist_locked(struct ts_op_registry *r, struct ts_operation *op)
{
	struct ts_operation *listed;

	assert(ts_mutex_held(&r->lk) && op->where == WHERE_FINISHED);
	listed = ts_registry_remove(&r->ids, op->id);
	assert(listed == op);
	(void)listed;
	if (op->older)
		op->older->newer = op->newer;
	else
		r->oldest = op->newer;
	if (op->newer)
		op->newer->older = op->older;
	else
		r->newest = op->older;
	op->older = op->newer = NULL;
	oplist_remove_locked(r, op);
	r->counts[op->state]--;   /* final states change no more: no op lock needed */
}

/*
 * Retention: unlists finished operations past keep_finished or older than
 * keep_ns, oldest first. Returns them chained through next, each still with
 * the registry's reference, to be dropped after unlocking (unref_chain).
 */
static struct ts_operation *prune_locked(struct ts_op_registry *r)
{
	uint64_t now = ts_now_ns();
	struct ts_operation *dropped = NULL, **tail = &dropped;

	assert(ts_mutex_held(&r->lk));
	while (r->finished.head) {
		struct ts_operation *op = r->finished.head;
		bool too_many = r->finished.n > r->cfg.keep_finished;
		bool too_old = r->cfg.keep_ns && now - op->end_mono > r->cfg.keep_ns;

		if (!too_many && !too_old)
			break;
		unlist_locked(r, op);
		*tail = op;
		tail = &op->next;
	}
	return dropped;
}

/* The pending or running operation claiming target, or NULL. */
static struct ts_operation *claim_holder_locked(struct ts_op_registry *r, const char *target)
{
	const struct oplist *lists[2] = {&r->queue, &r->active};

	assert(ts_mutex_held(&r->lk));
	if (!target || !*target)
		return NULL;
	for (int i = 0; i < 2; i++)
		for (struct ts_operation *op = lists[i]->head; op; op = op->next)
			if (strcmp(op->target, target) == 0)
				return op;
	return NULL;
}

/* Changes op's state (both locks held) and the registry's counts. */
static void set_state_locked(struct ts_op_registry *r, struct ts_operation *op,
                             enum ts_op_state s)
{
	assert(ts_mutex_held(&r->lk) && ts_mutex_held(&op->lk));
	r->counts[op->state]--;
	r->counts[s]++;
	op->state = s;
}

/* ---- finishing ------------------------------------------------------------------- */

/* b - a on the wall clock, 0 when it stepped back. */
static uint64_t wall_since(uint64_t a, uint64_t b)
{
	return b > a ? b - a : 0;
}

/* The final state and error of a run that returned st with err (pure; op
 * is read only for its immutable id). */
static enum ts_op_state outcome_of(const struct ts_operation *op, ts_status st,
                                   const struct ts_error *err, struct ts_error *out)
{
	ts_error_clear(out);
	if (st == TS_OK)
		return TS_OP_SUCCEEDED;
	if (st == TS_CANCELLED) {
		ts_error_set(out, TS_CANCELLED, "OPERATION_CANCELLED", "operation %s was cancelled",
		             op->id);
		return TS_OP_CANCELLED;
	}
	if (err && err->status != TS_OK)
		*out = *err;
	else
		ts_error_set(out, st, "OPERATION_FAILED", "operation %s failed", op->id);
	return TS_OP_FAILED;
}

/* Records an outcome found by outcome_of; a run that did not succeed keeps
 * no result. */
static void record_outcome_locked(struct ts_op_registry *r, struct ts_operation *op,
                                  enum ts_op_state state, const struct ts_error *error)
{
	assert(ts_mutex_held(&op->lk));
	if (state != TS_OP_SUCCEEDED) {
		json_decref(op->result);
		op->result = NULL;
	}
	set_state_locked(r, op, state);
	op->error = *error;
}

/* Hands the end of op to the registry's hook, before op shows as done, so
 * that whoever sees it done also sees it counted. */
static void report_end(struct ts_op_registry *r, struct ts_operation *op,
                       enum ts_op_state state, const struct ts_error *error, uint64_t end_ns)
{
	struct ts_op_end end;
	uint64_t start_ns;

	if (!r->cfg.ended)
		return;
	ts_mutex_lock(&op->lk);
	start_ns = op->start_ns;
	ts_mutex_unlock(&op->lk);
	end = (struct ts_op_end){
		.id = op->id, .kind = op->kind, .target = op->target, .unit = op->unit,
		.state = state,
		.done_units = atomic_load(&op->done_units),
		.total_units = atomic_load(&op->total_units),
		.run_ns = start_ns ? wall_since(start_ns, end_ns) : 0,
		.queued_ns = wall_since(op->create_ns, start_ns ? start_ns : end_ns),
		.error = state == TS_OP_SUCCEEDED ? NULL : error,
	};
	r->cfg.ended(r->cfg.ended_cls, &end);
}

/*
 * Finishes an operation taken off the queue (on the active list), after its
 * release ran: reports its end to the hook, records the outcome, frees its
 * target, wakes its waiters once and applies retention. The caller holds a
 * reference to op.
 */
static void op_finish(struct ts_op_registry *r, struct ts_operation *op, ts_status st,
                      const struct ts_error *err)
{
	struct ts_operation *dropped;
	struct waiter *w;
	struct ts_error outcome;
	enum ts_op_state state = outcome_of(op, st, err, &outcome);
	uint64_t end_ns = ts_wall_ns();

	report_end(r, op, state, &outcome, end_ns);
	ts_mutex_lock(&r->lk);
	ts_mutex_lock(&op->lk);
	oplist_remove_locked(r, op);
	record_outcome_locked(r, op, state, &outcome);
	op->end_ns = end_ns;
	op->end_mono = ts_now_ns();
	oplist_push_locked(r, &r->finished, op, WHERE_FINISHED);
	w = op->waiters;
	op->waiters = NULL;
	pthread_cond_broadcast(&op->finished_cv);
	/* taken before the waiter list leaves the lock: an unwait that no
	 * longer finds its waiter waits for the calls below to end */
	pthread_mutex_lock(&op->waking);
	ts_mutex_unlock(&op->lk);
	dropped = prune_locked(r);
	ts_mutex_unlock(&r->lk);
	while (w) {
		struct waiter *next = w->next;

		w->wake(w->token);
		free(w);
		w = next;
	}
	pthread_mutex_unlock(&op->waking);
	unref_chain(dropped);
}

/* The operation's span on its worker's track when a trace records. */
static void trace_span(struct ts_trace *t, const struct ts_operation *op, uint64_t t0)
{
	char label[TS_TRACE_NAME_MAX];
	uint32_t tid;

	if (!ts_trace_on(t))
		return;
	tid = ts_trace_thread();
	snprintf(label, sizeof label, "%.15s %.31s", op->kind, op->target);
	ts_trace_name_process(t, 0, "tstaged");
	ts_trace_name_track(t, 0, tid, "operations");
	ts_trace_span(t, 0, tid, "operation", NULL, label, t0, ts_now_ns(), op->seq, 0);
}

/* Runs (or, when cancelled before it started, skips) the work of an operation
 * the caller took to the active list with a reference, then finishes it and
 * drops that reference. */
static void op_run(struct ts_op_registry *r, struct ts_operation *op, bool start)
{
	struct ts_error err;
	ts_status st = TS_CANCELLED;
	uint64_t t0 = ts_now_ns();

	ts_error_clear(&err);
	if (start) {
		ts_trace_op_enter(op->seq);
		st = op->fn(op, op->arg, &err);
		ts_trace_op_leave();
		trace_span(r->cfg.trace, op, t0);
	}
	if (op->release)
		op->release(op->arg);
	op_finish(r, op, st, &err);
	ts_operation_unref(op);
}

/* Takes the head of the queue to the active list, with a reference for the
 * worker; starts it unless cancellation came first. Returns whether to run
 * the work. */
static bool take_locked(struct ts_op_registry *r, struct ts_operation *op)
{
	bool start;

	assert(ts_mutex_held(&r->lk));
	oplist_remove_locked(r, op);
	oplist_push_locked(r, &r->active, op, WHERE_ACTIVE);
	ts_operation_ref(op);
	ts_mutex_lock(&op->lk);
	start = !atomic_load(&op->cancel);
	if (start) {
		set_state_locked(r, op, TS_OP_RUNNING);
		op->start_ns = ts_wall_ns();
	}
	ts_mutex_unlock(&op->lk);
	return start;
}

static void *worker_main(void *arg)
{
	struct ts_op_registry *r = arg;

	ts_mutex_lock(&r->lk);
	for (;;) {
		struct ts_operation *op;
		bool start;

		while (!r->shutdown && !r->queue.head)
			ts_mutex_wait(&r->lk, &r->work, NULL);
		op = r->queue.head;
		if (!op)
			break;
		start = take_locked(r, op);
		ts_mutex_unlock(&r->lk);
		op_run(r, op, start);
		ts_mutex_lock(&r->lk);
	}
	ts_mutex_unlock(&r->lk);
	return NULL;
}

/* ---- the registry ------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
	/* splitmix64's finaliser: a bijection, so distinct inputs give distinct ids */
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

static void registry_destroy(struct ts_op_registry *r)
{
	pthread_cond_destroy(&r->work);
	ts_mutex_destroy(&r->lk);
	ts_registry_release(&r->ids);
	free(r->threads);
	free(r);
}

ts_status ts_op_registry_new(const struct ts_op_registry_config *cfg,
                             struct ts_op_registry **out, struct ts_error *err)
{
	struct ts_op_registry *r;
	int rc = 0;

	*out = NULL;
	if (cfg->workers < 1 || cfg->workers > 1024)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WORKERS",
		                    "operation workers %d is not in 1..1024", cfg->workers);
	r = calloc(1, sizeof *r);
	if (!r)
		return ts_error_oom(err, "no memory for the operation registry");
	r->cfg = *cfg;
	if (getrandom(&r->salt, sizeof r->salt, GRND_NONBLOCK) != (ssize_t)sizeof r->salt)
		r->salt = mix64(ts_wall_ns() ^ (uint64_t)(uintptr_t)r);
	ts_mutex_init(&r->lk);
	cond_init_monotonic(&r->work);
	ts_registry_init(&r->ids);
	r->threads = calloc((size_t)cfg->workers, sizeof *r->threads);
	if (!r->threads) {
		registry_destroy(r);
		return ts_error_oom(err, "no memory for the operation registry");
	}
	for (; r->nthreads < cfg->workers; r->nthreads++) {
		rc = pthread_create(&r->threads[r->nthreads], NULL, worker_main, r);
		if (rc)
			break;
	}
	if (rc) {
		int failed = r->nthreads + 1;

		ts_op_registry_free(r);   /* joins the workers that started */
		return ts_error_set(err, ts_status_from_errno(rc), "THREAD_CREATE",
		                    "cannot start operation worker %d of %d: %s", failed,
		                    cfg->workers, strerror(rc));
	}
	*out = r;
	return TS_OK;
}

void ts_op_registry_free(struct ts_op_registry *r)
{
	if (!r)
		return;
	/* flag everything; then cancel the queue here, one by one (a worker
	 * that takes one first skips its work, seeing the flag) */
	ts_mutex_lock(&r->lk);
	r->shutdown = true;
	for (struct ts_operation *op = r->queue.head; op; op = op->next)
		atomic_store(&op->cancel, true);
	for (struct ts_operation *op = r->active.head; op; op = op->next)
		atomic_store(&op->cancel, true);
	pthread_cond_broadcast(&r->work);
	while (r->queue.head) {
		struct ts_operation *op = r->queue.head;
		bool start = take_locked(r, op);

		ts_mutex_unlock(&r->lk);
		op_run(r, op, start);
		ts_mutex_lock(&r->lk);
	}
	ts_mutex_unlock(&r->lk);
	for (int i = 0; i < r->nthreads; i++)
		pthread_join(r->threads[i], NULL);
	/* nothing runs now: drop the registry's references */
	for (struct ts_operation *op = r->oldest, *next; op; op = next) {
		next = op->newer;
		ts_operation_unref(op);
	}
	registry_destroy(r);
}

/* ---- submitting and finding ----------------------------------------------------------- */

static ts_status check_word(const char *what, const char *s, size_t cap, bool empty_ok,
                            struct ts_error *err)
{
	size_t n = s ? strlen(s) : 0;

	if (!empty_ok && n == 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPERATION",
		                    "operation %s is empty", what);
	if (n >= cap)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPERATION",
		                    "operation %s '%.40s...' is longer than %zu bytes", what, s,
		                    cap - 1);
	return TS_OK;
}

static struct ts_operation *op_new(struct ts_op_registry *r, const char *kind,
                                   const char *target, uint64_t total, const char *unit,
                                   ts_op_fn *fn, void *arg, void (*release)(void *arg))
{
	struct ts_operation *op = calloc(1, sizeof *op);

	if (!op)
		return NULL;
	atomic_init(&op->refs, 1);
	snprintf(op->kind, sizeof op->kind, "%s", kind);
	snprintf(op->target, sizeof op->target, "%s", target ? target : "");
	snprintf(op->unit, sizeof op->unit, "%s", unit && *unit ? unit : "bytes");
	op->create_ns = ts_wall_ns();
	op->fn = fn;
	op->arg = arg;
	op->release = release;
	op->reg = r;
	atomic_init(&op->done_units, 0);
	atomic_init(&op->total_units, total);
	atomic_init(&op->cancel, false);
	ts_mutex_init(&op->lk);
	cond_init_monotonic(&op->finished_cv);
	pthread_mutex_init(&op->waking, NULL);
	op->state = TS_OP_PENDING;
	ts_error_clear(&op->error);
	return op;
}

/* ts_op_submit_holding; here: the work runs on the calling thread before
 * this returns (no worker is woken). */
static ts_status submit(struct ts_op_registry *r, const char *kind, const char *target,
                        uint64_t total, const char *unit, ts_op_fn *fn, void *arg,
                        void (*release)(void *arg),
                        ts_status (*hold)(const char *id, void *arg, struct ts_error *err),
                        bool here, struct ts_operation **out, struct ts_error *err)
{
	struct ts_operation *op, *holder, *mine = NULL;
	bool start = false, wake = false;
	ts_status st;

	if (out)
		*out = NULL;
	if ((st = check_word("kind", kind, sizeof op->kind, false, err)) != TS_OK ||
	    (st = check_word("target", target, sizeof op->target, true, err)) != TS_OK ||
	    (st = check_word("unit", unit, sizeof op->unit, true, err)) != TS_OK)
		return st;
	if (!fn)
		return ts_error_set(err, TS_INTERNAL, "BAD_OPERATION", "operation has no work");
	op = op_new(r, kind, target, total, unit, fn, arg, release);
	if (!op)
		return ts_error_oom(err, "no memory for a %s operation", kind);
	ts_mutex_lock(&r->lk);
	if (r->shutdown) {
		st = ts_error_set(err, TS_UNAVAILABLE, "SHUTTING_DOWN",
		                  "operations are shutting down; %s not started", kind);
		goto out_unlock;
	}
	holder = claim_holder_locked(r, op->target);
	if (holder) {
		st = ts_error_set(err, TS_ABORTED, "TARGET_BUSY",
		                  "array '%s' has operation %s in flight", op->target, holder->id);
		ts_error_meta(err, "operation", "%s", holder->id);
		goto out_unlock;
	}
	op->seq = ++r->next_seq;
	snprintf(op->id, sizeof op->id, "op-%016" PRIx64, mix64(op->seq ^ r->salt));
	if (ts_registry_reserve(&r->ids, 1, NULL) != TS_OK) {
		st = ts_error_oom(err, "no memory for a %s operation", kind);
		goto out_unlock;
	}
	if (hold && (st = hold(op->id, arg, err)) != TS_OK)
		goto out_unlock;
	insert_locked(r, op);   /* the registry's reference */
	if (out)
		*out = ts_operation_ref(op);
	if (here) {
		start = take_locked(r, op);   /* as a worker takes the queue's head */
		mine = op;
	} else {
		wake = true;
	}
	op = NULL;
out_unlock:
	ts_mutex_unlock(&r->lk);
	/* signalled once the lock is free: a worker woken while it is held
	 * would only go back to sleep on it, and be woken again by the unlock
	 * (two switches where one does; the worker finds the queue under the
	 * lock, so no wake is lost) */
	if (wake)
		pthread_cond_signal(&r->work);
	if (op)
		op_free(op);   /* never listed: its arg stays the caller's */
	if (mine)
		op_run(r, mine, start);
	return st;
}

ts_status ts_op_submit(struct ts_op_registry *r, const char *kind, const char *target,
                       uint64_t total, const char *unit, ts_op_fn *fn, void *arg,
                       void (*release)(void *arg), struct ts_operation **out,
                       struct ts_error *err)
{
	return submit(r, kind, target, total, unit, fn, arg, release, NULL, false, out, err);
}

ts_status ts_op_submit_holding(struct ts_op_registry *r, const char *kind, const char *target,
                               uint64_t total, const char *unit, ts_op_fn *fn, void *arg,
                               void (*release)(void *arg),
                               ts_status (*hold)(const char *id, void *arg, struct ts_error *err),
                               struct ts_operation **out, struct ts_error *err)
{
	return submit(r, kind, target, total, unit, fn, arg, release, hold, false, out, err);
}

ts_status ts_op_submit_here(struct ts_op_registry *r, const char *kind, const char *target,
                            uint64_t total, const char *unit, ts_op_fn *fn, void *arg,
                            void (*release)(void *arg), struct ts_operation **out,
                            struct ts_error *err)
{
	return submit(r, kind, target, total, unit, fn, arg, release, NULL, true, out, err);
}

struct ts_operation *ts_op_get(struct ts_op_registry *r, const char *id)
{
	struct ts_operation *op, *dropped;

	if (!id)
		return NULL;
	ts_mutex_lock(&r->lk);
	dropped = prune_locked(r);
	op = ts_operation_ref(ts_registry_get(&r->ids, id));
	ts_mutex_unlock(&r->lk);
	unref_chain(dropped);
	return op;
}

ts_status ts_op_list(struct ts_op_registry *r, int only, size_t limit,
                     struct ts_operation ***out, size_t *n, struct ts_error *err)
{
	return ts_op_list_before(r, only, 0, limit, out, n, NULL, err);
}

ts_status ts_op_list_before(struct ts_op_registry *r, int only, uint64_t before, size_t limit,
                            struct ts_operation ***out, size_t *n, bool *more,
                            struct ts_error *err)
{
	struct ts_operation **ops = NULL, *dropped, *op;
	ts_status st = TS_OK;
	size_t k = 0;

	*out = NULL;
	*n = 0;
	if (more)
		*more = false;
	if (only < -1 || only > TS_OP_CANCELLED)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_STATE",
		                    "operation state %d is not one of the five", only);
	ts_mutex_lock(&r->lk);
	dropped = prune_locked(r);
	if (limit > ts_registry_count(&r->ids))
		limit = ts_registry_count(&r->ids);
	ops = malloc((limit ? limit : 1) * sizeof *ops);
	if (!ops) {
		st = ts_error_oom(err, "no memory to list %zu operations", limit);
		goto out_unlock;
	}
	/* newest first: sequence numbers fall along the older links */
	for (op = r->newest; op && before && op->seq >= before; op = op->older)
		;
	for (; op; op = op->older) {
		/* a state changes only under the registry's lock too */
		if (only >= 0 && op->state != (enum ts_op_state)only)
			continue;
		if (k == limit) {
			if (more)
				*more = true;
			break;
		}
		ops[k++] = ts_operation_ref(op);
	}
	*out = ops;
	*n = k;
out_unlock:
	ts_mutex_unlock(&r->lk);
	unref_chain(dropped);
	return st;
}

ts_status ts_op_remove(struct ts_op_registry *r, struct ts_operation *op, struct ts_error *err)
{
	ts_status st = TS_OK;
	bool listed;

	ts_mutex_lock(&r->lk);
	listed = ts_registry_get(&r->ids, op->id) == op;
	if (!listed) {
		st = ts_error_set(err, TS_NOT_FOUND, "OPERATION_NOT_FOUND",
		                  "operation '%s' not found", op->id);
	} else if (op->where != WHERE_FINISHED) {
		st = ts_error_set(err, TS_FAILED_PRECONDITION, "OPERATION_RUNNING",
		                  "operation '%s' has not finished; cancel it, or wait for it, "
		                  "before deleting it", op->id);
		ts_error_meta(err, "operation", "%s", op->id);
	} else {
		unlist_locked(r, op);
	}
	ts_mutex_unlock(&r->lk);
	if (listed && st == TS_OK)
		ts_operation_unref(op);   /* the registry's reference */
	return st;
}

uint64_t ts_operation_seq(const struct ts_operation *op)
{
	return op->seq;
}

void ts_op_list_free(struct ts_operation **ops, size_t n)
{
	for (size_t i = 0; i < n; i++)
		ts_operation_unref(ops[i]);
	free(ops);
}

void ts_op_counts(struct ts_op_registry *r, uint64_t *counts)
{
	struct ts_operation *dropped;

	ts_mutex_lock(&r->lk);
	dropped = prune_locked(r);
	memcpy(counts, r->counts, sizeof r->counts);
	ts_mutex_unlock(&r->lk);
	unref_chain(dropped);
}

/* ---- an operation ----------------------------------------------------------------------- */

void ts_operation_progress_add(struct ts_operation *op, uint64_t units)
{
	atomic_fetch_add_explicit(&op->done_units, units, memory_order_relaxed);
}

void ts_operation_progress_set(struct ts_operation *op, uint64_t units)
{
	atomic_store_explicit(&op->done_units, units, memory_order_relaxed);
}

void ts_operation_total_set(struct ts_operation *op, uint64_t total)
{
	atomic_store_explicit(&op->total_units, total, memory_order_relaxed);
}

bool ts_operation_cancelled(const struct ts_operation *op)
{
	return atomic_load_explicit(&op->cancel, memory_order_acquire);
}

/* Cancels a pending operation now unless a worker took it meanwhile (which
 * then sees the flag and skips the work). */
static void cancel_pending(struct ts_op_registry *r, struct ts_operation *op)
{
	bool mine = false;

	ts_mutex_lock(&r->lk);
	if (op->where == WHERE_QUEUE) {
		oplist_remove_locked(r, op);
		oplist_push_locked(r, &r->active, op, WHERE_ACTIVE);
		ts_operation_ref(op);
		mine = true;
	}
	ts_mutex_unlock(&r->lk);
	if (mine)
		op_run(r, op, false);
}

ts_status ts_operation_cancel(struct ts_operation *op, struct ts_error *err)
{
	enum ts_op_state s;

	ts_mutex_lock(&op->lk);
	s = op->state;
	if (!state_final(s))
		atomic_store_explicit(&op->cancel, true, memory_order_release);
	ts_mutex_unlock(&op->lk);
	if (state_final(s))
		return ts_error_set(err, TS_FAILED_PRECONDITION, "OPERATION_FINISHED",
		                    "operation %s has already finished", op->id);
	if (s == TS_OP_PENDING)
		cancel_pending(op->reg, op);
	return TS_OK;
}

void ts_operation_set_result(struct ts_operation *op, json_t *result)
{
	json_t *old;

	/* the operation's alone (docs/ARCHITECTURE.md's jansson rule) */
	assert(!result || result->refcount == 1);
	ts_mutex_lock(&op->lk);
	old = op->result;
	op->result = result;
	ts_mutex_unlock(&op->lk);
	json_decref(old);
}

void ts_operation_set_partial(struct ts_operation *op, json_t *partial)
{
	json_t *old;

	/* the operation's alone, like its result */
	assert(!partial || partial->refcount == 1);
	ts_mutex_lock(&op->lk);
	old = op->partial;
	op->partial = partial;
	ts_mutex_unlock(&op->lk);
	json_decref(old);
}

void ts_operation_set_details(struct ts_operation *op, json_t *details)
{
	json_t *old;

	assert(!details || details->refcount == 1);
	ts_mutex_lock(&op->lk);
	old = op->details;
	op->details = details;
	ts_mutex_unlock(&op->lk);
	json_decref(old);
}

/* ---- waiting ------------------------------------------------------------------------------ */

bool ts_operation_wait(struct ts_operation *op, void (*wake)(void *token), void *token)
{
	struct waiter *w = malloc(sizeof *w);
	bool added = false;

	if (!w)
		return false;
	w->wake = wake;
	w->token = token;
	ts_mutex_lock(&op->lk);
	if (!state_final(op->state)) {
		w->next = op->waiters;
		op->waiters = w;
		added = true;
	}
	ts_mutex_unlock(&op->lk);
	if (!added)
		free(w);
	return added;
}

void ts_operation_unwait(struct ts_operation *op, void (*wake)(void *token), void *token)
{
	struct waiter *gone = NULL;

	ts_mutex_lock(&op->lk);
	for (struct waiter **pp = &op->waiters; *pp;) {
		struct waiter *w = *pp;

		if (w->wake == wake && w->token == token) {
			*pp = w->next;
			w->next = gone;
			gone = w;
		} else {
			pp = &w->next;
		}
	}
	ts_mutex_unlock(&op->lk);
	/* when the finisher took the list first, wait for its calls to end */
	pthread_mutex_lock(&op->waking);
	pthread_mutex_unlock(&op->waking);
	while (gone) {
		struct waiter *next = gone->next;

		free(gone);
		gone = next;
	}
}

bool ts_operation_block(struct ts_operation *op, uint64_t timeout_ns)
{
	uint64_t now = ts_now_ns(), cap = 100ull * 365 * 24 * 3600 * 1000000000ull;
	uint64_t until = now + (timeout_ns < cap ? timeout_ns : cap);
	struct timespec ts = {.tv_sec = (time_t)(until / 1000000000ull),
	                      .tv_nsec = (long)(until % 1000000000ull)};
	bool done;

	ts_mutex_lock(&op->lk);
	while (!state_final(op->state))
		if (ts_mutex_wait(&op->lk, &op->finished_cv, &ts) == ETIMEDOUT)
			break;
	done = state_final(op->state);
	ts_mutex_unlock(&op->lk);
	return done;
}

/* ---- rendering ------------------------------------------------------------------------------- */

void ts_operation_snapshot(const struct ts_operation *op, struct ts_op_snapshot *out)
{
	struct ts_operation *o = (struct ts_operation *)op;   /* its lock only */

	memset(out, 0, sizeof *out);
	snprintf(out->id, sizeof out->id, "%s", op->id);
	snprintf(out->kind, sizeof out->kind, "%s", op->kind);
	snprintf(out->target, sizeof out->target, "%s", op->target);
	snprintf(out->unit, sizeof out->unit, "%s", op->unit);
	out->create_ns = op->create_ns;
	ts_mutex_lock(&o->lk);
	out->state = op->state;
	out->start_ns = op->start_ns;
	out->end_ns = op->end_ns;
	out->error = op->error;
	/* copied: the snapshot's readers take and drop references on their own
	 * threads, and jansson's json_incref reads the count unsynchronised
	 * before its atomic increment (a race ThreadSanitizer reports); the
	 * result's own count is touched only by its owner, the operation */
	out->result = op->state == TS_OP_SUCCEEDED ? json_deep_copy(op->result) : NULL;
	out->partial = op->partial ? json_deep_copy(op->partial) : NULL;
	out->details = op->details ? json_deep_copy(op->details) : NULL;
	ts_mutex_unlock(&o->lk);
	out->done = state_final(out->state);
	out->done_units = atomic_load_explicit(&o->done_units, memory_order_relaxed);
	out->total_units = atomic_load_explicit(&o->total_units, memory_order_relaxed);
}

void ts_op_snapshot_release(struct ts_op_snapshot *s)
{
	json_decref(s->result);
	s->result = NULL;
	json_decref(s->partial);
	s->partial = NULL;
	json_decref(s->details);
	s->details = NULL;
}
