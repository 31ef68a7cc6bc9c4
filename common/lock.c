/*
 * lock.c - locks that know their holder (lock.h).
 *
 * A thread's token is the address of a thread-local byte: unique among the
 * threads alive, never NULL.
 */
#include "common/lock.h"

static _Thread_local char me;

int ts_mutex_init(struct ts_mutex *m)
{
	atomic_init(&m->owner, NULL);
	return pthread_mutex_init(&m->mu, NULL);
}

void ts_mutex_destroy(struct ts_mutex *m)
{
	pthread_mutex_destroy(&m->mu);
}

void ts_mutex_lock(struct ts_mutex *m)
{
	pthread_mutex_lock(&m->mu);
	atomic_store_explicit(&m->owner, &me, memory_order_relaxed);
}

void ts_mutex_unlock(struct ts_mutex *m)
{
	atomic_store_explicit(&m->owner, NULL, memory_order_relaxed);
	pthread_mutex_unlock(&m->mu);
}

int ts_mutex_wait(struct ts_mutex *m, pthread_cond_t *c, const struct timespec *until)
{
	int rc;

	atomic_store_explicit(&m->owner, NULL, memory_order_relaxed);
	rc = until ? pthread_cond_timedwait(c, &m->mu, until) : pthread_cond_wait(c, &m->mu);
	atomic_store_explicit(&m->owner, &me, memory_order_relaxed);
	return rc;
}

bool ts_mutex_held(const struct ts_mutex *m)
{
	return atomic_load_explicit(&m->owner, memory_order_relaxed) == &me;
}

int ts_rwlock_init(struct ts_rwlock *l)
{
	atomic_init(&l->writer, NULL);
	atomic_init(&l->readers, 0);
	return pthread_rwlock_init(&l->rw, NULL);
}

void ts_rwlock_destroy(struct ts_rwlock *l)
{
	pthread_rwlock_destroy(&l->rw);
}

void ts_rwlock_rdlock(struct ts_rwlock *l)
{
	pthread_rwlock_rdlock(&l->rw);
	atomic_fetch_add_explicit(&l->readers, 1, memory_order_relaxed);
}

void ts_rwlock_wrlock(struct ts_rwlock *l)
{
	pthread_rwlock_wrlock(&l->rw);
	atomic_store_explicit(&l->writer, &me, memory_order_relaxed);
}

void ts_rwlock_unlock(struct ts_rwlock *l)
{
	if (atomic_load_explicit(&l->writer, memory_order_relaxed) == &me)
		atomic_store_explicit(&l->writer, NULL, memory_order_relaxed);
	else
		atomic_fetch_sub_explicit(&l->readers, 1, memory_order_relaxed);
	pthread_rwlock_unlock(&l->rw);
}

bool ts_rwlock_writing(const struct ts_rwlock *l)
{
	return atomic_load_explicit(&l->writer, memory_order_relaxed) == &me;
}

bool ts_rwlock_held(const struct ts_rwlock *l)
{
	return ts_rwlock_writing(l) || atomic_load_explicit(&l->readers, memory_order_relaxed) > 0;
}
