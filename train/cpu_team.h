/*
 * cpu_team.h - the CPU kernels' own threads: a team that shares one
 * kernel's independent pieces.
 *
 * A kernel cut into n pieces (each piece writes only its own elements, with
 * the same single-threaded code whoever runs it) hands them to the team:
 * the calling thread and every free helper take the next piece from the
 * task's counter until none is left, and the call returns once every piece
 * has run. So a thread that loses its core delays one piece, never the
 * whole kernel, and every wait sleeps (no spinning). How a kernel is cut is
 * the caller's business and must depend on the kernel's shape alone, unless
 * every cut gives the same bits (a product's output tiles); the team never
 * changes what a piece computes, so results are the same bits whatever
 * thread ran which piece, however many threads there are.
 *
 * Always holds: every piece of a task runs exactly once, and before
 * ts__cpu_team_for returns; a helper touches a task only while its caller
 * waits in ts__cpu_team_for.
 *
 * Thread-safety: ts__cpu_team_for may be called from any number of threads
 * at once: one task at a time has the team, the others run their pieces on
 * their own thread. _new and _free are not concurrent with anything.
 */
#ifndef TS_CPU_TEAM_H
#define TS_CPU_TEAM_H

#include <pthread.h>
#include <stdint.h>

struct ts__cpu_team;

/* A piece of a task: fn(arg, i) for piece i. */
typedef void (*ts__cpu_piece_fn)(const void *arg, int64_t i);

/* Called with each helper as it starts (to bind it to CPUs); ctx borrowed. */
typedef void (*ts__cpu_team_bind_fn)(void *ctx, pthread_t helper);

/* A team of `threads` threads counting the caller of ts__cpu_team_for (so
 * threads - 1 helpers), or of one per CPU of the process's affinity when
 * threads is 0; bind (NULL: none) is given each helper once created. New
 * reference; NULL when that is one thread or no helper could be started
 * (callers then run every piece themselves). */
struct ts__cpu_team *ts__cpu_team_new(int threads, ts__cpu_team_bind_fn bind, void *ctx);

/* Stops and joins the helpers and frees t (NULL is fine); no task may be
 * running. */
void ts__cpu_team_free(struct ts__cpu_team *t);

/* Runs fn(arg, i) for every i in [0, n): on the team when it is free,
 * else (or t NULL, or n < 2) on the calling thread in order. Returns when
 * every piece has run; arg is borrowed until then. */
void ts__cpu_team_for(struct ts__cpu_team *t, int64_t n, ts__cpu_piece_fn fn, const void *arg);

/* The threads a task may run on (the caller included); 1 for NULL. */
int ts__cpu_team_threads(const struct ts__cpu_team *t);

#endif
