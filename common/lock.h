/*
 * lock.h - a mutex and a reader-writer lock that know who holds them, so
 * that every `_locked` function can assert its lock (SQLite's
 * assert(sqlite3_mutex_held(...))).
 *
 * A ts_mutex records the holding thread; ts_mutex_held says whether it is
 * the calling one. A ts_rwlock records its writer and counts its readers:
 * ts_rwlock_writing says whether the calling thread writes, ts_rwlock_held
 * whether it writes or some thread reads (a reader's identity is not kept:
 * for a read-side function that is as far as the lock can tell). The
 * records cost two relaxed atomic stores per lock and unlock; the checks
 * are assert()s, so a build with NDEBUG keeps the records and drops the
 * checks.
 *
 * Thread-safety: as pthread's; the held queries may be called from any
 * thread and answer for the calling one.
 */
#ifndef TS_LOCK_H
#define TS_LOCK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

struct ts_mutex {
	pthread_mutex_t mu;
	_Atomic(const void *) owner;    /* private: the holder's token, NULL when free */
};

struct ts_rwlock {
	pthread_rwlock_t rw;
	_Atomic(const void *) writer;   /* private: the writer's token, NULL when none */
	atomic_int readers;             /* private */
};

/* Initialises m (a default mutex); 0 or pthread's error. */
int ts_mutex_init(struct ts_mutex *m);
void ts_mutex_destroy(struct ts_mutex *m);
void ts_mutex_lock(struct ts_mutex *m);
void ts_mutex_unlock(struct ts_mutex *m);

/* Waits on c, releasing m meanwhile (m held); until is an absolute time on
 * c's clock, or NULL for no deadline. Returns pthread_cond_(timed)wait's
 * code; m is held again on return. */
int ts_mutex_wait(struct ts_mutex *m, pthread_cond_t *c, const struct timespec *until);

/* Whether the calling thread holds m (for assertions). */
bool ts_mutex_held(const struct ts_mutex *m);

/* Initialises l; 0 or pthread's error. */
int ts_rwlock_init(struct ts_rwlock *l);
void ts_rwlock_destroy(struct ts_rwlock *l);
void ts_rwlock_rdlock(struct ts_rwlock *l);
void ts_rwlock_wrlock(struct ts_rwlock *l);
/* Releases the calling thread's hold, read or write. */
void ts_rwlock_unlock(struct ts_rwlock *l);

/* Whether the calling thread holds l for writing (for assertions). */
bool ts_rwlock_writing(const struct ts_rwlock *l);

/* Whether the calling thread writes l or some thread reads it (for
 * assertions of read-side functions). */
bool ts_rwlock_held(const struct ts_rwlock *l);

#endif
