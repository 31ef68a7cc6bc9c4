/*
 * comm.c - collectives over several devices (device.h's ts_comm).
 *
 * The arguments are checked here once; a backend with collectives of its
 * own (CUDA: NCCL, cuda_comm.c) gets them through its ops, and the host
 * family (sim, cpu: device memory is host memory, every queue a worker
 * thread) gets the host's below: one job shared by a host function on each
 * rank's queue. Each rank's function waits until every rank's has started
 * (so every rank's earlier work is done), the last to arrive computes the
 * whole collective in rank order, and all of them return only then, so each
 * queue's later work sees the result. Sums run over ranks 0, 1, ... in that
 * order for each element: the same bits on every rank and in every run.
 *
 * All or nothing: the caller enqueues every rank's function while holding
 * the job's lock; a rank whose enqueue fails leaves the job marked failed
 * with the count of those enqueued, and they return without waiting for
 * one that will never come.
 *
 * Thread-safety: ts_comm is immutable after ts_comm_new; one collective at
 * a time per communicator (device.h). A host job is guarded by its mutex.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"

struct ts_comm {
	int n;
	struct ts_device *devs[TS_COMM_MAX];   /* borrowed; rank order */
	const struct ts__backend_ops *ops;
	void *ctx;                             /* the backend's (NULL: the host's) */
};

#define BAD(err, ...) ts_error_set((err), TS_INVALID_ARGUMENT, "BAD_COLLECTIVE", __VA_ARGS__)

ts_status ts_comm_new(struct ts_device *const *devs, int n, struct ts_comm **out,
                      struct ts_error *err)
{
	struct ts_comm *c;
	ts_status st;

	if (!out)
		return BAD(err, "communicator: no result");
	*out = NULL;
	if (!devs || n < 1 || n > TS_COMM_MAX)
		return BAD(err, "a communicator has 1..%d devices, not %d", TS_COMM_MAX, n);
	for (int r = 0; r < n; r++) {
		if (!devs[r])
			return BAD(err, "communicator: no device for rank %d", r);
		if (devs[r]->ops != devs[0]->ops)
			return BAD(err, "communicator: '%s' and '%s' are of different backends",
			           devs[0]->props.id, devs[r]->props.id);
		for (int k = 0; k < r; k++)
			if (devs[k] == devs[r])
				return BAD(err, "communicator: '%s' is ranks %d and %d",
				           devs[r]->props.id, k, r);
		if (ts_device_broken(devs[r]))
			return ts_error_set(err, TS_UNAVAILABLE, "DEVICE_BROKEN",
			                    "'%s' is broken", devs[r]->props.id);
	}
	c = calloc(1, sizeof *c);
	if (!c)
		return ts_error_oom(err, "out of memory making a communicator");
	c->n = n;
	memcpy(c->devs, devs, (size_t)n * sizeof *devs);
	c->ops = devs[0]->ops;
	if (c->ops->comm_new) {
		st = c->ops->comm_new(devs, n, &c->ctx, err);
		if (st != TS_OK) {
			free(c);
			return st;
		}
	}
	*out = c;
	return TS_OK;
}

void ts_comm_free(struct ts_comm *c)
{
	if (!c)
		return;
	if (c->ctx && c->ops->comm_free)
		c->ops->comm_free(c->ctx, c->n);
	free(c);
}

int ts_comm_size(const struct ts_comm *c)
{
	return c ? c->n : 0;
}

struct ts_device *ts_comm_device(const struct ts_comm *c, int rank)
{
	return c && rank >= 0 && rank < c->n ? c->devs[rank] : NULL;
}

const char *ts_comm_transport(const struct ts_comm *c)
{
	return c && c->ops->comm_run ? "nccl" : "host";
}

uint64_t ts_device_collective_bytes(const struct ts_device *dev)
{
	return dev ? atomic_load_explicit(&dev->collective_bytes, memory_order_relaxed) : 0;
}

/* ---- the host's collectives ---------------------------------------------- */

struct host_job {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int n;                       /* guarded by: mu; ranks enqueued (final once the
	                                caller unlocks) */
	int arrived, left;           /* guarded by: mu */
	bool failed;                 /* guarded by: mu; not every rank enqueued */
	bool done;                   /* guarded by: mu */
	enum ts__coll coll;          /* immutable */
	uint64_t count;              /* immutable */
	float *bufs[TS_COMM_MAX];    /* immutable */
	float *recv[TS_COMM_MAX];    /* immutable; a reduce-scatter into buffers of
	                                their own, else NULL */
};

/* Elements summed at a time: the partial sums stay in cache. */
#define CHUNK 1024

/* dst[r][dat + i] = sum over ranks of bufs[k][at + i] for r in ranks
 * [r0, r1) (all ranks: every rank's buffer gets the sum; one rank: only
 * its own), i < len; dst is bufs itself or the buffers of a reduce-scatter
 * out of place. */
static void sum_into(float *const *bufs, int n, uint64_t at, uint64_t len, int r0, int r1,
                     float *const *dst, uint64_t dat)
{
	float acc[CHUNK];

	for (uint64_t c = 0; c < len; c += CHUNK) {
		uint64_t m = len - c < CHUNK ? len - c : CHUNK;

		memcpy(acc, bufs[0] + at + c, m * sizeof *acc);
		for (int r = 1; r < n; r++) {
			const float *b = bufs[r] + at + c;

			for (uint64_t i = 0; i < m; i++)
				acc[i] += b[i];
		}
		for (int r = r0; r < r1; r++)
			memcpy(dst[r] + dat + c, acc, m * sizeof *acc);
	}
}

static void host_compute(struct host_job *j)
{
	int n = j->n;
	uint64_t k = j->count;

	switch (j->coll) {
	case TS__COLL_ALLREDUCE:
		sum_into(j->bufs, n, 0, k, 0, n, j->bufs, 0);
		break;
	case TS__COLL_REDUCE_SCATTER:
		for (int r = 0; r < n; r++)
			sum_into(j->bufs, n, (uint64_t)r * k, k, r, r + 1, j->recv[0] ? j->recv : j->bufs,
			         j->recv[0] ? 0 : (uint64_t)r * k);
		break;
	case TS__COLL_ALL_GATHER:
		for (int s = 0; s < n; s++)
			for (int r = 0; r < n; r++)
				if (r != s)
					memcpy(j->bufs[r] + (uint64_t)s * k, j->bufs[s] + (uint64_t)s * k,
					       k * sizeof(float));
		break;
	}
}

static void host_job_free(struct host_job *j)
{
	pthread_cond_destroy(&j->cv);
	pthread_mutex_destroy(&j->mu);
	free(j);
}

/* One rank's part, on its queue's worker. */
static void host_rank(void *arg)
{
	struct host_job *j = arg;
	bool last;

	pthread_mutex_lock(&j->mu);
	j->arrived++;
	if (j->arrived == j->n) {
		if (!j->failed)
			host_compute(j);
		j->done = true;
		pthread_cond_broadcast(&j->cv);
	}
	while (!j->done)
		pthread_cond_wait(&j->cv, &j->mu);
	last = ++j->left == j->n;
	pthread_mutex_unlock(&j->mu);
	if (last)
		host_job_free(j);
}

static const char *coll_name(enum ts__coll coll)
{
	switch (coll) {
	case TS__COLL_ALLREDUCE:
		return "all-reduce";
	case TS__COLL_REDUCE_SCATTER:
		return "reduce-scatter";
	case TS__COLL_ALL_GATHER:
		return "all-gather";
	}
	return "collective";
}

static ts_status host_run(const struct ts_comm *c, enum ts__coll coll, struct ts_queue *const *qs,
                          float *const *bufs, float *const *recv, uint64_t count,
                          struct ts_error *err)
{
	struct host_job *j = calloc(1, sizeof *j);
	ts_status st = TS_OK;
	int r, enqueued;

	if (!j)
		return ts_error_oom(err, "out of memory queueing a %s", coll_name(coll));
	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cv, NULL);
	j->coll = coll;
	j->count = count;
	memcpy(j->bufs, bufs, (size_t)c->n * sizeof *bufs);
	if (recv)
		memcpy(j->recv, recv, (size_t)c->n * sizeof *recv);
	pthread_mutex_lock(&j->mu);
	for (r = 0; r < c->n && st == TS_OK; r++) {
		st = ts_queue_host_fn_named(qs[r], host_rank, j, coll_name(coll), err);
		if (st == TS_OK)
			j->n++;
	}
	j->failed = st != TS_OK;
	enqueued = j->n;
	pthread_mutex_unlock(&j->mu);
	/* from here the ranks own j (the last to leave frees it) */
	if (enqueued == 0)
		host_job_free(j);
	return st;
}

/* ---- the calls ----------------------------------------------------------- */

static ts_status run(struct ts_comm *c, enum ts__coll coll, struct ts_queue *const *qs,
                     float *const *bufs, float *const *recv, uint64_t n, struct ts_error *err)
{
	uint64_t per = coll == TS__COLL_ALLREDUCE ? n : n * (uint64_t)(c ? c->n : 0);
	ts_status st;

	if (!c || !qs || !bufs)
		return BAD(err, "%s: no communicator, queues or buffers", coll_name(coll));
	if (n > UINT64_MAX / sizeof(float) / (uint64_t)c->n)
		return BAD(err, "%s of %llu elements a rank is too large", coll_name(coll),
		           (unsigned long long)n);
	for (int r = 0; r < c->n; r++) {
		if (!qs[r] || ts_queue_device(qs[r]) != c->devs[r])
			return BAD(err, "%s: rank %d's queue is not on '%s'", coll_name(coll), r,
			           c->devs[r]->props.id);
		if (n && (!bufs[r] || (recv && !recv[r])))
			return BAD(err, "%s: rank %d has no buffer", coll_name(coll), r);
		if (ts_device_broken(c->devs[r]))
			return ts_error_set(err, TS_UNAVAILABLE, "DEVICE_BROKEN", "'%s' is broken",
			                    c->devs[r]->props.id);
	}
	if (n == 0)
		return TS_OK;
	st = c->ctx && c->ops->comm_run ? c->ops->comm_run(c->ctx, c->n, coll, qs, bufs, recv, n,
	                                                   err)
	                                : host_run(c, coll, qs, bufs, recv, n, err);
	if (st == TS_OK && c->n > 1)
		for (int r = 0; r < c->n; r++)
			atomic_fetch_add_explicit(&c->devs[r]->collective_bytes, per * sizeof(float),
			                          memory_order_relaxed);
	return st;
}

ts_status ts_comm_allreduce(struct ts_comm *c, struct ts_queue *const *qs, float *const *bufs,
                            uint64_t n, struct ts_error *err)
{
	return run(c, TS__COLL_ALLREDUCE, qs, bufs, NULL, n, err);
}

ts_status ts_comm_reduce_scatter(struct ts_comm *c, struct ts_queue *const *qs,
                                 float *const *bufs, uint64_t n, struct ts_error *err)
{
	return run(c, TS__COLL_REDUCE_SCATTER, qs, bufs, NULL, n, err);
}

ts_status ts_comm_reduce_scatter_to(struct ts_comm *c, struct ts_queue *const *qs,
                                    float *const *bufs, float *const *recv, uint64_t n,
                                    struct ts_error *err)
{
	if (!recv)
		return BAD(err, "reduce-scatter: no buffers to scatter into");
	return run(c, TS__COLL_REDUCE_SCATTER, qs, bufs, recv, n, err);
}

ts_status ts_comm_all_gather(struct ts_comm *c, struct ts_queue *const *qs, float *const *bufs,
                             uint64_t n, struct ts_error *err)
{
	return run(c, TS__COLL_ALL_GATHER, qs, bufs, NULL, n, err);
}
