/*
 * hostq.c - in-order queues and events for devices whose memory the host can
 * reach (sim and cpu): a worker thread per queue runs its jobs in order,
 * bound to the device's local CPUs where the topology decides so.
 *
 * A queue is a list of jobs (copy, host callback, event signal, event wait),
 * each numbered when submitted; the worker runs them one at a time, and
 * "completed" is the number of the last one it finished. An event counts its
 * records (generations); the signal job of generation g completes it up to g.
 * The event's outcome is that of its latest completed generation.
 *
 * Copy failures (only injected ones on sim: memcpy cannot fail) are sticky
 * until a sync clears them, as backend.h says: the queue keeps its first
 * failure; every event whose signal job runs after it reports it; a
 * ts_queue_sync returns it and clears the failures of the jobs it waited
 * for. A failure of an event a queue waited on becomes that queue's failure
 * at the wait job. Later jobs still run: a failure never stops the queue.
 *
 * Thread-safety: all entry points may be called from any thread. Lock order:
 * a device's queues_mu before a queue's mu; an event's mu before a queue's mu
 * (recording queues its signal job under the event's mu). The worker never
 * holds a queue's mu while it takes an event's.
 */
#include <assert.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fault.h"
#include "common/lock.h"
#include "common/units.h"
#include "device/backend.h"
#include "device/topology.h"

enum job_type {
	JOB_COPY,
	JOB_HOST_FN,
	JOB_SIGNAL,     /* completes an event generation */
	JOB_WAIT,       /* blocks the queue until an event generation completes */
};

struct hostev;

struct job {
	struct job *next;
	uint64_t seq;
	enum job_type type;
	union {
		struct {
			void *dst;
			const void *src;
			size_t n;
			enum ts_copy_kind kind;
			uint64_t flow;              /* trace flow from the operation, 0: none */
		} copy;
		struct {
			void (*fn)(void *arg);
			void *arg;
			const char *name;           /* static; its span's, NULL: "host work" */
		} host_fn;
		struct {
			struct hostev *ev;
			uint64_t gen;
		} event;
	} u;
};

#define SPARE_JOBS_MAX 64

struct hostq {
	struct ts_queue base;           /* first: device.c sees this */
	ts__hostq_copy_fn copy;         /* immutable */
	pthread_t worker;               /* immutable */
	struct ts_mutex mu;
	pthread_cond_t work_cv;         /* jobs queued, or stop */
	pthread_cond_t done_cv;         /* completed moved */
	struct job *head, *tail;        /* guarded by: mu */
	uint64_t submitted;             /* guarded by: mu; seq of the last job queued */
	uint64_t completed;             /* guarded by: mu; seq of the last job finished */
	bool stop;                      /* guarded by: mu */
	struct ts_error fault;          /* guarded by: mu; first failure not cleared */
	struct ts_error last_fault;     /* guarded by: mu; latest failure */
	uint64_t last_fault_seq;        /* guarded by: mu; its job, 0: none */
	struct job *spare;              /* guarded by: mu; recycled jobs */
	unsigned nspare;                /* guarded by: mu */
	struct job *reserved;           /* guarded by: mu; taken before spare, never failing */
	size_t nreserved;               /* guarded by: mu */
	size_t reserve;                 /* guarded by: mu; finished jobs refill it to this */
};

struct hostev {
	struct ts_event base;           /* first: device.c sees this */
	pthread_mutex_t mu;
	pthread_cond_t cv;              /* completed or users moved */
	uint64_t recorded;              /* guarded by: mu; generations recorded */
	uint64_t completed;             /* guarded by: mu; latest generation done */
	unsigned users;                 /* guarded by: mu; queued jobs naming it */
	struct ts_error outcome;        /* guarded by: mu; of generation completed */
};

static struct hostq *to_hostq(struct ts_queue *q)
{
	return (struct hostq *)q;
}

static struct hostev *to_hostev(struct ts_event *ev)
{
	return (struct hostev *)ev;
}

/* Copies a recorded failure into err unless err already holds one; returns
 * the status err now holds (or src's when err is NULL). */
static ts_status error_copy(struct ts_error *err, const struct ts_error *src)
{
	if (src->status == TS_OK)
		return TS_OK;
	if (!err)
		return src->status;
	if (err->status == TS_OK)
		*err = *src;
	return err->status;
}

static ts_status job_oom(struct hostq *q, struct ts_error *err)
{
	return ts_error_oom(err, "%s: out of memory queueing work",
	                    q->base.dev->props.id);
}

/* ---- jobs ---------------------------------------------------------------- */

static struct job *job_get(struct hostq *q)
{
	struct job *j;

	/* a reserved job was allocated already: taking it cannot fail */
	ts_mutex_lock(&q->mu);
	j = q->reserved;
	if (j) {
		q->reserved = j->next;
		q->nreserved--;
	}
	ts_mutex_unlock(&q->mu);
	if (j) {
		memset(j, 0, sizeof *j);
		return j;
	}
	if (ts_fault_fire(TS_FAULT_ALLOC_HEAP))
		return NULL;
	ts_mutex_lock(&q->mu);
	j = q->spare;
	if (j) {
		q->spare = j->next;
		q->nspare--;
	}
	ts_mutex_unlock(&q->mu);
	if (!j)
		j = malloc(sizeof *j);
	if (j)
		memset(j, 0, sizeof *j);
	return j;
}

static void job_put_locked(struct hostq *q, struct job *j)
{
	assert(ts_mutex_held(&q->mu));
	if (q->nreserved < q->reserve) {
		j->next = q->reserved;
		q->reserved = j;
		q->nreserved++;
	} else if (q->nspare < SPARE_JOBS_MAX) {
		j->next = q->spare;
		q->spare = j;
		q->nspare++;
	} else {
		free(j);
	}
}

static void job_put(struct hostq *q, struct job *j)
{
	ts_mutex_lock(&q->mu);
	job_put_locked(q, j);
	ts_mutex_unlock(&q->mu);
}

/* Queues j at the end of q; it cannot fail once j exists. */
static void job_push(struct hostq *q, struct job *j)
{
	ts_mutex_lock(&q->mu);
	j->seq = ++q->submitted;
	j->next = NULL;
	if (q->tail)
		q->tail->next = j;
	else
		q->head = j;
	q->tail = j;
	pthread_cond_signal(&q->work_cv);
	ts_mutex_unlock(&q->mu);
}

/* ---- failures ------------------------------------------------------------ */

/* Job seq failed with e (or waited on an event that failed with e). */
static void fault_raise_locked(struct hostq *q, uint64_t seq,
                               const struct ts_error *e)
{
	assert(ts_mutex_held(&q->mu));
	if (q->fault.status == TS_OK)
		q->fault = *e;
	q->last_fault = *e;
	q->last_fault_seq = seq;
}

/* A sync that waited for every job up to target took the failure: clear it,
 * unless a job after target failed meanwhile (its failure stays). */
static void fault_clear_locked(struct hostq *q, uint64_t target)
{
	assert(ts_mutex_held(&q->mu));
	if (q->last_fault_seq > target) {
		q->fault = q->last_fault;
		return;
	}
	ts_error_clear(&q->fault);
	ts_error_clear(&q->last_fault);
	q->last_fault_seq = 0;
}

static void fault_raise(struct hostq *q, uint64_t seq, const struct ts_error *e)
{
	ts_mutex_lock(&q->mu);
	fault_raise_locked(q, seq, e);
	ts_mutex_unlock(&q->mu);
}

/* ---- the worker ---------------------------------------------------------- */

static void run_copy(struct hostq *q, struct job *j)
{
	struct ts_error e;
	bool traced = ts_trace_on(q->base.dev->trace);
	uint64_t t0 = traced ? ts_now_ns() : 0;

	ts_error_clear(&e);
	if (ts_fault_fire(TS_FAULT_COPY))
		ts_error_set(&e, TS_INTERNAL, "COPY_FAILED", "%s: copy of %zu bytes failed (injected)",
		             q->base.dev->props.id, j->u.copy.n);
	if (e.status != TS_OK ||
	    q->copy(q->base.dev, j->u.copy.dst, j->u.copy.src, j->u.copy.n,
	            j->u.copy.kind, &e) != TS_OK)
		fault_raise(q, j->seq, &e);
	if (traced)
		ts__queue_trace_span(&q->base, "copy", ts__copy_kind_name(j->u.copy.kind), t0,
		                     ts_now_ns(), j->u.copy.n, j->u.copy.flow);
	atomic_fetch_sub_explicit(&q->base.dev->copies_queued, 1, memory_order_relaxed);
}

static void run_signal(struct hostq *q, struct job *j)
{
	struct hostev *ev = j->u.event.ev;
	struct ts_error outcome;

	ts_mutex_lock(&q->mu);
	outcome = q->fault;
	ts_mutex_unlock(&q->mu);

	pthread_mutex_lock(&ev->mu);
	if (j->u.event.gen > ev->completed) {
		ev->completed = j->u.event.gen;
		ev->outcome = outcome;
	}
	ev->users--;
	pthread_cond_broadcast(&ev->cv);
	pthread_mutex_unlock(&ev->mu);
}

static void run_wait(struct hostq *q, struct job *j)
{
	struct hostev *ev = j->u.event.ev;
	struct ts_error outcome;

	pthread_mutex_lock(&ev->mu);
	while (ev->completed < j->u.event.gen)
		pthread_cond_wait(&ev->cv, &ev->mu);
	outcome = ev->outcome;
	ev->users--;
	pthread_cond_broadcast(&ev->cv);
	pthread_mutex_unlock(&ev->mu);
	if (outcome.status != TS_OK)
		fault_raise(q, j->seq, &outcome);
}

/* Host functions are the compute of sim and cpu devices (kernels, GEMMs). */
static void run_host_fn(struct hostq *q, struct job *j)
{
	bool traced = ts_trace_on(q->base.dev->trace);
	uint64_t t0 = traced ? ts_now_ns() : 0;

	j->u.host_fn.fn(j->u.host_fn.arg);
	if (traced)
		ts__queue_trace_span(&q->base, "compute",
		                     j->u.host_fn.name ? j->u.host_fn.name : "host work", t0,
		                     ts_now_ns(), 0, 0);
}

static void *worker_main(void *arg)
{
	struct hostq *q = arg;
	struct job *j;

	ts_mutex_lock(&q->mu);
	for (;;) {
		while (!q->head && !q->stop)
			ts_mutex_wait(&q->mu, &q->work_cv, NULL);
		j = q->head;
		if (!j)
			break;          /* stopping, and nothing is left */
		q->head = j->next;
		if (!q->head)
			q->tail = NULL;
		ts_mutex_unlock(&q->mu);

		switch (j->type) {
		case JOB_COPY:
			run_copy(q, j);
			break;
		case JOB_HOST_FN:
			run_host_fn(q, j);
			break;
		case JOB_SIGNAL:
			run_signal(q, j);
			break;
		case JOB_WAIT:
			run_wait(q, j);
			break;
		}

		ts_mutex_lock(&q->mu);
		q->completed = j->seq;
		job_put_locked(q, j);
		pthread_cond_broadcast(&q->done_cv);
	}
	ts_mutex_unlock(&q->mu);
	return NULL;
}

/* Blocks until every job submitted so far has completed; mu held. Returns
 * the seq of the last of them. */
static uint64_t wait_drained_locked(struct hostq *q)
{
	uint64_t target;

	assert(ts_mutex_held(&q->mu));
	target = q->submitted;
	while (q->completed < target)
		ts_mutex_wait(&q->mu, &q->done_cv, NULL);
	return target;
}

/* ---- queues -------------------------------------------------------------- */

static void hostq_destroy(struct hostq *q)
{
	struct job *j;

	while ((j = q->spare) != NULL) {
		q->spare = j->next;
		free(j);
	}
	while ((j = q->reserved) != NULL) {
		q->reserved = j->next;
		free(j);
	}
	pthread_cond_destroy(&q->done_cv);
	pthread_cond_destroy(&q->work_cv);
	ts_mutex_destroy(&q->mu);
	free(q);
}

ts_status ts__hostq_new(struct ts_device *dev, ts__hostq_copy_fn copy,
                        struct ts_queue **out, struct ts_error *err)
{
	struct hostq *q;
	sigset_t all, old;
	char name[16];
	ts_status st = TS_RESOURCE_EXHAUSTED;
	int rc = 0;

	*out = NULL;
	q = calloc(1, sizeof *q);
	if (!q)
		goto out_oom;
	if (ts_mutex_init(&q->mu) != 0)
		goto out_free;
	if (pthread_cond_init(&q->work_cv, NULL) != 0)
		goto out_mutex;
	if (pthread_cond_init(&q->done_cv, NULL) != 0)
		goto out_work_cv;
	q->base.dev = dev;
	q->copy = copy;

	/* The worker takes no signals: they belong to the daemon's main thread. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&q->worker, NULL, worker_main, q);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		st = ts_error_set(err, TS_RESOURCE_EXHAUSTED, "THREAD_LIMIT",
		                  "%s: cannot start a queue worker: %s",
		                  dev->props.id, strerror(rc));
		goto out_done_cv;
	}
	snprintf(name, sizeof name, "tsq-%.11s", dev->props.id);
	pthread_setname_np(q->worker, name);
	/* near the device's memory, where the topology says so */
	(void)ts_topology_bind_cpus(dev->topo, dev->props.id, TS_CPUBIND_COPY, q->worker);
	*out = &q->base;
	return TS_OK;

out_done_cv:
	pthread_cond_destroy(&q->done_cv);
out_work_cv:
	pthread_cond_destroy(&q->work_cv);
out_mutex:
	ts_mutex_destroy(&q->mu);
out_free:
	free(q);
	if (rc != 0)
		return st;
out_oom:
	return ts_error_oom(err, "%s: out of memory creating a queue", dev->props.id);
}

void ts__hostq_free(struct ts_queue *base)
{
	struct hostq *q = to_hostq(base);

	ts_mutex_lock(&q->mu);
	q->stop = true;
	pthread_cond_signal(&q->work_cv);
	ts_mutex_unlock(&q->mu);
	pthread_join(q->worker, NULL);   /* the worker drains the list first */
	hostq_destroy(q);
}

ts_status ts__hostq_reserve(struct ts_queue *base, size_t jobs, struct ts_error *err)
{
	struct hostq *q = to_hostq(base);
	struct job *list = NULL, *j;
	size_t have, n = 0;

	ts_mutex_lock(&q->mu);
	have = q->nreserved;
	if (jobs > q->reserve)
		q->reserve = jobs;
	ts_mutex_unlock(&q->mu);
	if (have >= jobs)
		return TS_OK;
	/* one failure point for the whole reservation, then plain allocations */
	if (ts_fault_fire(TS_FAULT_ALLOC_HEAP))
		return job_oom(q, err);
	for (; have + n < jobs; n++) {
		j = malloc(sizeof *j);
		if (!j)
			break;
		j->next = list;
		list = j;
	}
	if (have + n < jobs) {
		while ((j = list) != NULL) {
			list = j->next;
			free(j);
		}
		return job_oom(q, err);
	}
	ts_mutex_lock(&q->mu);
	while ((j = list) != NULL) {
		list = j->next;
		j->next = q->reserved;
		q->reserved = j;
		q->nreserved++;
	}
	ts_mutex_unlock(&q->mu);
	return TS_OK;
}

ts_status ts__hostq_copy(struct ts_queue *base, void *dst, const void *src,
                         size_t n, enum ts_copy_kind kind, struct ts_error *err)
{
	struct hostq *q = to_hostq(base);
	struct job *j = job_get(q);

	if (!j)
		return job_oom(q, err);
	j->type = JOB_COPY;
	j->u.copy.dst = dst;
	j->u.copy.src = src;
	j->u.copy.n = n;
	j->u.copy.kind = kind;
	j->u.copy.flow = ts_trace_flow_start(q->base.dev->trace);
	atomic_fetch_add_explicit(&q->base.dev->copies_queued, 1, memory_order_relaxed);
	job_push(q, j);
	return TS_OK;
}

ts_status ts__hostq_host_fn_named(struct ts_queue *base, void (*fn)(void *arg), void *arg,
                                  const char *name, struct ts_error *err)
{
	struct hostq *q = to_hostq(base);
	struct job *j = job_get(q);

	if (!j)
		return job_oom(q, err);
	j->type = JOB_HOST_FN;
	j->u.host_fn.fn = fn;
	j->u.host_fn.arg = arg;
	j->u.host_fn.name = name;
	job_push(q, j);
	return TS_OK;
}

ts_status ts__hostq_host_fn(struct ts_queue *base, void (*fn)(void *arg),
                            void *arg, struct ts_error *err)
{
	return ts__hostq_host_fn_named(base, fn, arg, NULL, err);
}

ts_status ts__hostq_wait_event(struct ts_queue *base, struct ts_event *evbase,
                               struct ts_error *err)
{
	struct hostq *q = to_hostq(base);
	struct hostev *ev = to_hostev(evbase);
	struct job *j = job_get(q);
	uint64_t gen;

	if (!j)
		return job_oom(q, err);
	pthread_mutex_lock(&ev->mu);
	gen = ev->recorded;
	if (gen == 0 || (ev->completed >= gen && ev->outcome.status == TS_OK)) {
		/* Never recorded, or already complete without failure: nothing
		 * to wait for. */
		pthread_mutex_unlock(&ev->mu);
		job_put(q, j);
		return TS_OK;
	}
	ev->users++;
	pthread_mutex_unlock(&ev->mu);
	j->type = JOB_WAIT;
	j->u.event.ev = ev;
	j->u.event.gen = gen;
	job_push(q, j);
	return TS_OK;
}

ts_status ts__hostq_sync(struct ts_queue *base, struct ts_error *err)
{
	struct hostq *q = to_hostq(base);
	struct ts_error fault;
	uint64_t target;

	ts_mutex_lock(&q->mu);
	target = wait_drained_locked(q);
	fault = q->fault;
	fault_clear_locked(q, target);
	ts_mutex_unlock(&q->mu);
	return error_copy(err, &fault);
}

ts_status ts__hostq_device_sync(struct ts_device *dev, struct ts_error *err)
{
	pthread_mutex_lock(&dev->queues_mu);
	for (struct ts_queue *base = dev->queues; base; base = base->next) {
		struct hostq *q = to_hostq(base);

		ts_mutex_lock(&q->mu);
		wait_drained_locked(q);
		ts_mutex_unlock(&q->mu);
	}
	pthread_mutex_unlock(&dev->queues_mu);
	return TS_OK;
}

/* ---- events -------------------------------------------------------------- */

ts_status ts__hostev_new(struct ts_device *dev, struct ts_event **out,
                         struct ts_error *err)
{
	struct hostev *ev = calloc(1, sizeof *ev);

	*out = NULL;
	if (!ev)
		goto out_oom;
	if (pthread_mutex_init(&ev->mu, NULL) != 0)
		goto out_free;
	if (pthread_cond_init(&ev->cv, NULL) != 0)
		goto out_mutex;
	ev->base.dev = dev;
	*out = &ev->base;
	return TS_OK;

out_mutex:
	pthread_mutex_destroy(&ev->mu);
out_free:
	free(ev);
out_oom:
	return ts_error_oom(err, "%s: out of memory creating an event", dev->props.id);
}

void ts__hostev_free(struct ts_event *base)
{
	struct hostev *ev = to_hostev(base);

	/* Queued signal and wait jobs still name it: let them finish. */
	pthread_mutex_lock(&ev->mu);
	while (ev->users > 0)
		pthread_cond_wait(&ev->cv, &ev->mu);
	pthread_mutex_unlock(&ev->mu);
	pthread_cond_destroy(&ev->cv);
	pthread_mutex_destroy(&ev->mu);
	free(ev);
}

ts_status ts__hostev_record(struct ts_event *evbase, struct ts_queue *base,
                            struct ts_error *err)
{
	struct hostq *q = to_hostq(base);
	struct hostev *ev = to_hostev(evbase);
	struct job *j = job_get(q);

	if (!j)
		return job_oom(q, err);
	j->type = JOB_SIGNAL;
	j->u.event.ev = ev;
	/* Numbering and queueing under ev->mu, so that whoever sees generation
	 * g (a wait) finds its signal job already queued: a wait queued on the
	 * same queue can never come before the signal it waits for. */
	pthread_mutex_lock(&ev->mu);
	j->u.event.gen = ++ev->recorded;
	ev->users++;
	job_push(q, j);
	pthread_mutex_unlock(&ev->mu);
	return TS_OK;
}

bool ts__hostev_done(struct ts_event *base)
{
	struct hostev *ev = to_hostev(base);
	bool done;

	pthread_mutex_lock(&ev->mu);
	done = ev->completed >= ev->recorded;
	pthread_mutex_unlock(&ev->mu);
	return done;
}

ts_status ts__hostev_sync(struct ts_event *base, struct ts_error *err)
{
	struct hostev *ev = to_hostev(base);
	struct ts_error outcome;
	uint64_t target;

	pthread_mutex_lock(&ev->mu);
	target = ev->recorded;
	while (ev->completed < target)
		pthread_cond_wait(&ev->cv, &ev->mu);
	outcome = ev->outcome;
	pthread_mutex_unlock(&ev->mu);
	return error_copy(err, &outcome);
}
