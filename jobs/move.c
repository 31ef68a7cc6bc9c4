/*
 * move.c - device_put and copy as operations (jobs/move.h): admission and
 * the refusals the publish would meet on the caller's thread, the copy and
 * the publish on a worker.
 */
#include "jobs/move.h"

#include <stdlib.h>

#include "jobs/render.h"

static void move_progress(void *arg, uint64_t bytes)
{
	ts_operation_progress_add(arg, bytes);
}

static bool move_cancelled(void *arg)
{
	return ts_operation_cancelled(arg);
}

/* The operation's argument. */
struct move {
	const struct ts_jobs_env *env;
	struct ts_move *mv;                /* owned */
	bool is_copy;
	uint64_t total;                    /* bytes the copy writes */
};

/* How the move copied between devices, in the operation's metadata: "path"
 * "peer" (peer access), "staged" (through pinned host memory) or "mixed",
 * with the pairs of shards each way; nothing for a move that copied no
 * device memory to another device. */
static void move_details(struct ts_operation *op, const struct ts_stage_paths *p)
{
	const char *path = p->staged == 0 ? "peer" : p->peer == 0 ? "staged" : "mixed";

	if (p->peer + p->staged == 0)
		return;
	ts_operation_set_details(op, json_pack("{s:s, s:{s:i, s:i}}", "path", path, "path_pairs",
	                                       "peer", (int)p->peer, "staged", (int)p->staged));
}

static ts_status move_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct move *m = arg;
	ts_status s;

	s = ts_move_run(m->mv, m->env->catalog, m->env->stager, move_progress, move_cancelled, op,
	                err);
	move_details(op, ts_move_paths(m->mv));
	if (s == TS_OK)
		ts_operation_set_result(op, ts_render_array(ts_move_result(m->mv)));
	return s;
}

static void move_release(void *arg)
{
	struct move *m = arg;

	ts_move_free(m->mv);
	free(m);
}

/* What the publish would refuse, answered before anything is allocated. */
static ts_status move_check(const struct ts_jobs_env *env, struct ts_array *src,
                            const struct ts_move_spec *spec, bool is_copy, struct ts_error *err)
{
	struct ts_array_desc d = *ts_array_desc(src);
	struct ts_precondition pre = {0};
	const char *name = spec->name ? spec->name : ts_array_name(src);
	struct ts_array *there;

	d.dtype = spec->dtype;
	if (ts_array_desc_init(&d, err) != TS_OK ||
	    ts_catalog_check_write(env->catalog, name, is_copy || spec->convert ? &d : NULL, &pre,
	                           err) != TS_OK)
		return err->status;
	if (!is_copy || spec->overwrite)
		return TS_OK;
	there = ts_catalog_get(env->catalog, name);
	ts_array_unref(there);
	if (there)
		return ts_error_set(err, TS_ALREADY_EXISTS, "ARRAY_EXISTS",
		                    "array '%s' already exists; give \"overwrite\": true to replace it",
		                    name);
	return TS_OK;
}

ts_status ts_job_move_prepare(const struct ts_jobs_env *env, struct ts_array *src,
                              const struct ts_move_spec *spec, bool is_copy,
                              struct ts_job_move **out, uint64_t *bytes, struct ts_error *err)
{
	struct move *m = NULL;
	uint64_t total = 0;
	ts_status st;

	*out = NULL;
	st = move_check(env, src, spec, is_copy, err);
	if (st != TS_OK)
		return st;
	m = calloc(1, sizeof *m);
	if (!m)
		return ts_error_oom(err, "no memory for a move");
	m->env = env;
	m->is_copy = is_copy;
	/* admission: the destination is allocated now, or the move is refused */
	st = ts_move_new(env->memory, src, spec, &m->mv, &total, err);
	if (st != TS_OK) {
		free(m);
		return st;
	}
	m->total = total;
	if (bytes)
		*bytes = total;
	*out = (struct ts_job_move *)m;
	return TS_OK;
}

ts_status ts_job_move_start(struct ts_job_move *jm, bool here, struct ts_operation **op,
                            struct ts_error *err)
{
	struct move *m = (struct move *)jm;
	ts_status st;

	st = (here ? ts_op_submit_here : ts_op_submit)(
	    m->env->operations, m->is_copy ? "copy" : "put", ts_array_name(ts_move_source(m->mv)),
	    m->total, "bytes", move_run, m, move_release, op, err);
	if (st != TS_OK)
		move_release(m);
	return st;
}

void ts_job_move_discard(struct ts_job_move *jm)
{
	if (jm)
		move_release(jm);
}

ts_status ts_job_move_submit(const struct ts_jobs_env *env, struct ts_array *src,
                             const struct ts_move_spec *spec, bool is_copy,
                             struct ts_operation **op, struct ts_error *err)
{
	struct ts_job_move *jm;
	ts_status st;

	*op = NULL;
	st = ts_job_move_prepare(env, src, spec, is_copy, &jm, NULL, err);
	return st == TS_OK ? ts_job_move_start(jm, false, op, err) : st;
}
