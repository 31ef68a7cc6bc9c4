/*
 * step.c - a model's runs: training steps and evaluations as operations
 * (jobs/step.h), from the model's held arrays, the operands and, for a
 * data-driven step, its batches, to a training session and back.
 *
 * A step and an evaluation share one struct run and one prologue
 * (run_begin: operands, placement, batch shapes, the session and its
 * bindings) and one epilogue (run_end); between them a step binds its
 * gradients and runs its steps with the versioning hooks, an evaluation
 * binds its outputs and runs one pass. A generation is a run too: the
 * same holds, one evaluation session per context length, a token a pass.
 */
#include "jobs/step.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"
#include "formats/index.h"
#include "jobs/model.h"
#include "jobs/render.h"
#include "storage/array.h"
#include "storage/array_io.h"
#include "storage/colocate.h"
#include "train/sample.h"
#include "train/session.h"

/* The most gradient arrays a step without an optimizer publishes (a GPT's). */
#define TS_GRADS_MAX TS_GPT_NPARAMS

/* One operand of a run: the array, its rows (normalised; NULL: all) and a
 * device copy when the array is sharded. */
struct operand {
	struct ts_array *arr;              /* own reference */
	json_t *rows_json;                 /* borrowed from the run's request */
	uint64_t *rows;                    /* owned */
	size_t nrows;
	uint64_t row_bytes;                /* of a row staged (0: the array's axis 0) */
	struct ts_array *gathered;         /* own reference, or NULL */
};

/* A data-driven run's batches, and while it runs the datasets' rows and
 * the current epoch's order. */
struct batches {
	bool on;
	bool shuffle;
	uint64_t size, start, seed;
	uint64_t rows;                     /* of the datasets, while it runs */
	uint64_t perm_epoch;               /* the epoch of perm (UINT64_MAX: none) */
	uint64_t *perm;                    /* owned; a permutation of the rows */
};

/* A token stream's windows (jobs/step.h's struct ts_job_windows), and
 * while it runs the stream's length in tokens and its windows an epoch. */
struct windows {
	bool on;
	bool random;
	uint64_t context, size, seed, start;
	uint64_t tokens, per_epoch;        /* of the stream, while it runs */
};

/* A step's or an evaluation's state, the operation's argument from
 * submission to release. */
struct run {
	const struct ts_jobs_env *env;
	bool evaluate;
	struct ts_model model;
	struct ts_policy policy;
	uint64_t steps;
	int accumulate;                    /* micro-batches a step (1: none); a data-driven
	                                      run's batches.size and windows.size count them all */
	char *inputs, *targets;            /* owned copies of the operands' names; NULL: none */
	json_t *inputs_rows, *targets_rows;   /* own copies of the request's, or NULL */
	struct ts_array *held[TS_ROLE_COUNT];  /* the model's arrays by role (own references) */
	char op_id[40];                    /* the holder, once submitted */
	struct batches batches;
	struct windows windows;
	struct ts_job_outputs out;         /* an evaluation's outputs array, when asked for */
	bool last;                         /* an evaluation's: the windows' last positions */
	bool no_targets;                   /* an evaluation of a token model's logits only */
	int window;                        /* a GPT evaluation's tokens per window */
	struct gen {                       /* a generation's request and sequence */
		int32_t *seq;              /* owned: the prompt, then the tokens made */
		size_t nprompt, len;
		float temperature;
		int top_k;
		uint64_t seed;
	} gen;
	/* while it runs (the worker's) */
	struct ts_operation *op;           /* borrowed */
	struct operand in, tgt;
	struct ts_device *dev;             /* where it runs */
	struct ts_session *sess;
	uint64_t bin, btgt;                /* the operands' rows */
	struct ts_array *priv[TS_ROLE_COUNT][2];  /* offloaded: the private versions */
	struct ts_array *next[TS_ROLE_COUNT];  /* in place: the version the end publishes */
	uint64_t done;                     /* steps that succeeded */
	double timed_s;                    /* the report's wall time at the last step's end */
	double partial_s;                  /* the report's wall time at the last partial result */
	double partial_cost_s;             /* what building it took */
};

/* ---- holds ---------------------------------------------------------------------- */

static ts_status run_hold(const char *id, void *arg, struct ts_error *err)
{
	struct run *s = arg;
	struct ts_array *list[TS_ROLE_COUNT];
	size_t n = 0;
	ts_status st;

	for (int r = 0; r < TS_ROLE_COUNT; r++)
		if (s->held[r])
			list[n++] = s->held[r];
	st = ts_catalog_hold(s->env->catalog, list, n, id, err);
	if (st == TS_OK)
		snprintf(s->op_id, sizeof s->op_id, "%s", id);
	return st;
}

static void run_release(void *arg)
{
	struct run *s = arg;

	if (s->op_id[0])
		ts_catalog_release(s->env->catalog, s->op_id);
	for (int r = 0; r < TS_ROLE_COUNT; r++) {
		ts_array_unref(s->held[r]);
		ts_array_unref(s->next[r]);
		ts_array_unref(s->priv[r][0]);
		ts_array_unref(s->priv[r][1]);
	}
	free(s->inputs);
	free(s->targets);
	json_decref(s->inputs_rows);
	json_decref(s->targets_rows);
	free(s->batches.perm);
	free(s->gen.seq);
	free(s);
}

/* A device copy of rows (or all) of a sharded array, on dev: what a session
 * cannot stage from one piece of memory. New reference, never published. */
static ts_status gather_sharded(const struct ts_jobs_env *env, struct ts_array *src,
                                const uint64_t *rows, size_t n, struct ts_device *dev,
                                struct ts_array **out, struct ts_error *err)
{
	const struct ts_array_desc *sd = ts_array_desc(src);
	struct ts_array_desc d = *sd;
	struct ts_placement pl;
	struct ts_run *runs = malloc((rows && n ? n : 1) * sizeof *runs);
	struct ts_rows_iter it;
	uint64_t off, len, at = 0;
	size_t k = 0;
	ts_status st;

	*out = NULL;
	if (!runs)
		return ts_error_oom(err, "no memory for rows");
	if (rows) {
		ts_rows_iter_init(&it, rows, n, sd->shape[0] ? sd->nbytes / sd->shape[0] : 0);
		while (ts_rows_iter_next(&it, &off, &len)) {
			runs[k++] = (struct ts_run){.src_offset = off, .dst_offset = at, .len = len};
			at += len;
		}
		d.shape[0] = n;
	} else {
		runs[k++] = (struct ts_run){0, 0, sd->nbytes};
	}
	ts_placement_single(&pl, dev, TS_MEM_DEVICE, false);
	st = ts_array_desc_init(&d, err);
	if (st == TS_OK)
		st = ts_array_new(ts_array_name(src), &d, &pl, env->memory, out, err);
	if (st == TS_OK)
		st = ts_array_copy(env->stager, *out, NULL, src, runs, k, NULL, NULL, NULL, err);
	free(runs);
	return st;
}

/* Resolves an operand to the current version of its array (and its rows,
 * borrowed; NULL for all). */
static ts_status operand_resolve(const struct ts_jobs_env *env, const char *name, json_t *rows,
                                 const char *what, struct operand *o, struct ts_error *err)
{
	o->rows_json = rows;
	o->arr = ts_catalog_get(env->catalog, name);
	if (!o->arr)
		return ts_error_set(err, TS_NOT_FOUND, "ARRAY_NOT_FOUND", "%s array '%s' not found", what,
		                    name);
	return TS_OK;
}

/* The memory kind shared by the held parameters (state false) or optimizer
 * state (state true); unchanged when there are none. */
static ts_status held_kind(const struct run *s, bool state, enum ts_memory_kind *kind,
                           struct ts_error *err)
{
	const struct ts_array *first = NULL;

	for (size_t i = 0; i < TS_MODEL_NROLES; i++) {
		const struct ts_array *a = s->held[ts_model_roles[i]];
		enum ts_memory_kind k;

		if (!a || ts_role_opt_state(ts_model_roles[i]) != state)
			continue;
		k = ts_array_placement(a)->sharding.memory_kind;
		if (first && k != *kind)
			return ts_error_set(err, TS_FAILED_PRECONDITION, "MIXED_MEMORY_KINDS",
			                    "'%s' is in %s but '%s' is in %s; put them in one memory kind",
			                    ts_array_name(first), ts_memory_kind_name(*kind),
			                    ts_array_name(a), ts_memory_kind_name(k));
		first = a;
		*kind = k;
	}
	return TS_OK;
}

/* ---- data-driven runs: the rows of each step's batch ------------------------------ */

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The permutation of epoch e: Fisher-Yates from (seed, e). */
static ts_status epoch_perm(struct batches *b, uint64_t e, struct ts_error *err)
{
	uint64_t state = mix64(b->seed * 0x9e3779b97f4a7c15ull + e + 1);

	if (b->perm && b->perm_epoch == e)
		return TS_OK;
	if (!b->perm) {
		b->perm = malloc(b->rows * sizeof *b->perm);
		if (!b->perm)
			return ts_error_oom(err, "no memory to shuffle %llu rows", (unsigned long long)b->rows);
	}
	for (uint64_t i = 0; i < b->rows; i++)
		b->perm[i] = i;
	for (uint64_t i = b->rows - 1; i > 0; i--) {
		uint64_t j, t;

		state += 0x9e3779b97f4a7c15ull;
		j = mix64(state) % (i + 1);
		t = b->perm[i];
		b->perm[i] = b->perm[j];
		b->perm[j] = t;
	}
	b->perm_epoch = e;
	return TS_OK;
}

/* The rows of the batch of step i (0-based in this call) into rows[size]:
 * positions start + i * size onwards, wrapping into the next epoch (each
 * epoch its own order when shuffled). */
static ts_status batch_rows(struct batches *b, uint64_t i, uint64_t *rows, struct ts_error *err)
{
	for (uint64_t j = 0; j < b->size; j++) {
		uint64_t q = b->start + i * b->size + j, e = q / b->rows, k = q % b->rows;
		ts_status st;

		if (!b->shuffle) {
			rows[j] = k;
			continue;
		}
		st = epoch_perm(b, e, err);
		if (st != TS_OK)
			return st;
		rows[j] = b->perm[k];
	}
	return TS_OK;
}

/* ---- windows of a token stream ---------------------------------------------------- */

/* The token offset of window q (jobs/step.h; docs/API.md's definition):
 * sequential, (q mod W) * context; random, output q of a SplitMix64
 * generator seeded with seed, mod (n - context). */
static uint64_t window_offset(const struct windows *w, uint64_t q)
{
	if (!w->random)
		return (q % w->per_epoch) * w->context;
	return mix64(w->seed + (q + 1) * 0x9e3779b97f4a7c15ull) % (w->tokens - w->context);
}

/* The tokens of step i's windows (0-based in this call), as one-token rows
 * of the stream: inputs window by window, each its context tokens from
 * o_q; the targets the same one token on. */
static void window_rows(const struct windows *w, uint64_t i, uint64_t *in, uint64_t *tgt)
{
	for (uint64_t b = 0; b < w->size; b++) {
		uint64_t o = window_offset(w, w->start + i * w->size + b);

		for (uint64_t t = 0; t < w->context; t++) {
			in[b * w->context + t] = o + t;
			tgt[b * w->context + t] = o + 1 + t;
		}
	}
}

/* ---- the session's hooks: versions of the held arrays ---------------------------- */

static bool run_cancelled(void *arg)
{
	return ts_operation_cancelled(((struct run *)arg)->op);
}

/* A private version of cur, in new memory where it is (unpublished). */
static ts_status private_version(const struct ts_jobs_env *env, const struct ts_array *cur,
                                 struct ts_array **out, struct ts_error *err)
{
	const json_t *meta = ts_array_metadata(cur);
	ts_status st;

	st = ts_array_new(ts_array_name(cur), ts_array_desc(cur), ts_array_placement(cur),
	                  env->memory, out, err);
	if (st != TS_OK)
		return st;
	if (meta)
		ts_array_set_metadata(*out, json_deep_copy(meta));
	ts_array_set_implicit_bytes(*out, ts_array_implicit_bytes(cur));
	ts_array_set_owner(*out, ts_array_owner(cur));
	return TS_OK;
}

/*
 * Before each step, what it writes and what publishing will need: for an
 * offloaded array, the private version the step writes its update into
 * (the two take turns: a step reads the one the last wrote); for a device
 * array, once, the new version sharing its updated-in-place buffer. Made
 * before anything is written, so publishing allocates nothing.
 */
static ts_status step_prepare(void *arg, struct ts_session *sess, struct ts_error *err)
{
	struct run *s = arg;
	ts_status st = TS_OK;

	if (s->model.opt.type == TS_OPT_NONE)
		return st;
	for (size_t i = 0; i < TS_MODEL_NROLES && st == TS_OK; i++) {
		enum ts_pbuf_role role = ts_model_roles[i];
		struct ts_array *cur = s->held[role], **slot;

		if (!cur)
			continue;
		if (!ts_session_versioned(sess, role)) {
			if (!s->next[role])
				st = ts_array_new_version(cur, &s->next[role], err);
			continue;
		}
		slot = &s->priv[role][s->done % 2];
		if (!*slot)
			st = private_version(s->env, cur, slot, err);
		for (int k = 0; st == TS_OK && k < ts_session_replicas(sess); k++)
			st = ts_session_set_next_replica(sess, k, role,
			                                 ts_buffer_data(ts_job_model_buffer(*slot, k)), err);
	}
	return st;
}

static json_t *running_json(const struct run *s, const struct ts_session *sess);

/*
 * While the run goes on, its partial result: what the steps so far did
 * (running_json), renewed after a step - after every step, unless building
 * it took more than a sixteenth of the time since the last one (a long run
 * of tiny steps renews it every few steps). Best effort: out of memory, the
 * last one stays.
 */
static void step_partial(struct run *s, const struct ts_session *sess)
{
	double now = (double)ts_now_ns() / 1e9;
	json_t *part;

	if (s->partial_s > 0 && now - s->partial_s < 16 * s->partial_cost_s)
		return;
	part = running_json(s, sess);
	if (part)
		ts_operation_set_partial(s->op, part);
	s->partial_s = (double)ts_now_ns() / 1e9;
	s->partial_cost_s = s->partial_s - now;
}

/* After a step that succeeded: counted, on the model (Adam's t) too, and
 * shown in the operation's partial result. */
static ts_status step_publish(void *arg, struct ts_session *sess, float loss,
                              struct ts_error *err)
{
	struct run *s = arg;
	double wall = ts_session_report(sess)->wall_s;

	(void)loss;
	(void)err;
	s->done++;
	if (s->model.opt.type != TS_OPT_NONE)
		ts_model_registry_add_steps(s->env->models, s->model.uid, 1, NULL);
	ts_model_registry_record_step(s->env->models, (uint64_t)((wall - s->timed_s) * 1e9));
	s->timed_s = wall;
	step_partial(s, sess);
	ts_operation_progress_add(s->op, 1);
	return TS_OK;
}

/* As the call ends, when some step updated them: the new versions replace
 * the held ones (allocation-free replaces, as the holder). */
static ts_status step_install(struct run *s, struct ts_error *err)
{
	struct ts_precondition pre = {.holder = s->op_id};
	ts_status st = TS_OK;

	if (!s->done || s->model.opt.type == TS_OPT_NONE)
		return TS_OK;
	for (int r = 0; r < TS_ROLE_COUNT; r++) {
		struct ts_array *v = s->priv[r][(s->done - 1) % 2] ? s->priv[r][(s->done - 1) % 2]
		                                                   : s->next[r];

		if (!v || st != TS_OK)
			continue;
		st = ts_catalog_replace(s->env->catalog, v, &pre, err);
		if (st == TS_OK) {
			ts_array_unref(s->held[r]);
			s->held[r] = ts_array_ref(v);
		}
	}
	return st;
}

static ts_status step_batch(void *arg, uint64_t n, enum ts_pbuf_role role,
                            struct ts_session_source *src, struct ts_error *err);
static ts_status window_batch(void *arg, uint64_t n, enum ts_pbuf_role role,
                              struct ts_session_source *src, struct ts_error *err);

static const struct ts_session_hooks step_hooks = {
	.cancelled = run_cancelled, .prepare = step_prepare, .publish = step_publish,
};

static const struct ts_session_hooks batch_hooks = {
	.cancelled = run_cancelled, .prepare = step_prepare, .publish = step_publish,
	.batch = step_batch,
};

static const struct ts_session_hooks window_hooks = {
	.cancelled = run_cancelled, .prepare = step_prepare, .publish = step_publish,
	.batch = window_batch,
};

static const struct ts_session_hooks eval_hooks = {.cancelled = run_cancelled};

/* ---- operands ------------------------------------------------------------------- */

static void operand_release(struct operand *o)
{
	ts_array_unref(o->arr);
	ts_array_unref(o->gathered);
	free(o->rows);
	*o = (struct operand){0};
}

/* The rows the operand stages: parsed, and its batch rows. */
static ts_status operand_rows(struct operand *o, const char *field, uint64_t *batch,
                              struct ts_error *err)
{
	const struct ts_array_desc *d = ts_array_desc(o->arr);
	ts_status st;

	*batch = d->rank ? d->shape[0] : 0;
	if (!o->rows_json)
		return TS_OK;
	if (d->rank == 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ROWS",
		                    "%s: array '%s' is 0-dimensional: it has no rows", field,
		                    ts_array_name(o->arr));
	st = ts_rows_parse(o->rows_json, field, d->shape[0], &o->rows, &o->nrows, err);
	if (st == TS_OK)
		*batch = o->nrows;
	return st;
}

/* The memory of a one-shard array as a session's source, with rows of
 * row_bytes (0: its axis 0's). */
static struct ts_session_source operand_source(const struct ts_array *a, const uint64_t *rows,
                                               size_t nrows, uint64_t row_bytes)
{
	const struct ts_array_desc *d = ts_array_desc(a);

	if (!row_bytes)
		row_bytes = d->rank && d->shape[0] ? d->nbytes / d->shape[0] : 0;
	return (struct ts_session_source){
		.mem = ts_buffer_data(ts_array_single_buffer(a)), .bytes = d->nbytes,
		.row_bytes = row_bytes,
		.src_dev = ts_array_box(a, 0)->device,
		.src_kind = ts_array_placement(a)->sharding.memory_kind,
		.rows = rows, .nrows = nrows};
}

/* Stages an operand for the session: its memory as a source (gathered to
 * dev first when sharded). */
static ts_status operand_stage(const struct ts_jobs_env *env, struct ts_session *sess,
                               enum ts_pbuf_role role, struct operand *o, struct ts_device *dev,
                               struct ts_error *err)
{
	struct ts_session_source src;
	ts_status st;

	if (!ts_array_single_buffer(o->arr)) {
		st = gather_sharded(env, o->arr, o->rows, o->nrows, dev, &o->gathered, err);
		if (st != TS_OK)
			return st;
		src = operand_source(o->gathered, NULL, 0, 0);
	} else {
		src = operand_source(o->arr, o->rows, o->nrows, o->row_bytes);
	}
	return ts_session_stage(sess, role, &src, err);
}

/* A token model's operands: ids uint16 or int32, [B] or [B, T] (B*T rows
 * of the step, one per token), targets of the inputs' dtype and shape.
 * The rows of the step into *rows, the ids' width into *id_bytes. */
static ts_status check_token_batch(const struct run *s, const struct operand *in, uint64_t bin,
                                   const struct operand *tgt, uint64_t btgt, uint64_t *rows,
                                   int *id_bytes, struct ts_error *err)
{
	const struct ts_array_desc *d = ts_array_desc(in->arr);
	uint64_t T = d->rank == 2 ? d->shape[1] : 1;

	if ((d->dtype != TS_DT_UINT16 && d->dtype != TS_DT_INT32) || d->rank < 1 || d->rank > 2 ||
	    bin == 0 || T == 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_INPUTS",
		                    "inputs of token model '%s' must be token ids, uint16 or int32, "
		                    "[B] or [B, T] with B, T >= 1", s->model.name);
	if (s->model.mlp.gpt && !s->evaluate &&
	    (d->rank != 2 || T != (uint64_t)s->model.mlp.context))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_INPUTS",
		                    "inputs of GPT '%s' must be windows of token ids [B, %d] (its "
		                    "context)", s->model.name, s->model.mlp.context);
	if (s->model.mlp.gpt && s->evaluate &&
	    (d->rank != 2 || T > (uint64_t)s->model.mlp.context))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_INPUTS",
		                    "inputs of GPT '%s' must be windows of token ids [B, T], T in "
		                    "1..%d (its context)", s->model.name, s->model.mlp.context);
	if (bin * T > (1u << 24))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_INPUTS",
		                    "inputs have %llu tokens; a step takes at most %u",
		                    (unsigned long long)(bin * T), 1u << 24);
	*rows = bin * T;
	*id_bytes = d->dtype == TS_DT_UINT16 ? 2 : 4;
	if (!tgt->arr && s->evaluate)
		return TS_OK;                 /* the logits only */
	if (!tgt->arr)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "NO_TARGETS",
		                    "loss softmax_cross_entropy needs \"targets\" (token ids)");
	{
		const struct ts_array_desc *t = ts_array_desc(tgt->arr);

		if (t->dtype != d->dtype || t->rank != d->rank || (d->rank == 2 && t->shape[1] != T) ||
		    btgt != bin)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TARGETS",
			                    "targets must be token ids of the inputs' dtype and shape");
	}
	return TS_OK;
}

/* The batch of the run's step n of a data-driven run: the inputs' rows
 * drawn, the targets' the same. */
static ts_status step_batch(void *arg, uint64_t n, enum ts_pbuf_role role,
                            struct ts_session_source *src, struct ts_error *err)
{
	struct run *s = arg;
	ts_status st = TS_OK;

	if (role == TS_ROLE_INPUT) {
		st = batch_rows(&s->batches, n, s->in.rows, err);
		*src = operand_source(s->in.arr, s->in.rows, s->in.nrows, 0);
	} else {
		memcpy(s->tgt.rows, s->in.rows, s->in.nrows * sizeof *s->in.rows);
		*src = operand_source(s->tgt.arr, s->tgt.rows, s->tgt.nrows, 0);
	}
	return st;
}

/* The windows of the run's step n: the inputs' tokens and the targets',
 * both from the stream (rows borrowed until the next call). */
static ts_status window_batch(void *arg, uint64_t n, enum ts_pbuf_role role,
                              struct ts_session_source *src, struct ts_error *err)
{
	struct run *s = arg;
	struct operand *o = role == TS_ROLE_INPUT ? &s->in : &s->tgt;

	(void)err;
	if (role == TS_ROLE_INPUT)
		window_rows(&s->windows, n, s->in.rows, s->tgt.rows);
	*src = operand_source(o->arr, o->rows, o->nrows, o->row_bytes);
	return TS_OK;
}

/* " x accumulate k" for a run of k > 1 micro-batches a step, else "" (in
 * buf), for the messages about its batches. */
static const char *times_accumulate(const struct run *s, char *buf, size_t cap)
{
	if (s->accumulate <= 1)
		return "";
	snprintf(buf, cap, " x accumulate %d", s->accumulate);
	return buf;
}

/* A windows run's operands: the one stream, as inputs and as targets, read
 * as one-token rows (token ids of a token model; any shape, one shard);
 * the first step's windows. */
static ts_status windows_begin(struct run *s, struct operand *in, struct operand *tgt,
                               uint64_t *rows, int *id_bytes, struct ts_error *err)
{
	const struct ts_array_desc *d = ts_array_desc(in->arr);
	struct windows *w = &s->windows;
	const char *name = ts_array_name(in->arr);
	char acc[32];
	uint64_t n;

	if (!ts_mlp_tokens(&s->model.mlp))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		                    "windows read token ids; model '%s' takes float32 inputs, not "
		                    "tokens", s->model.name);
	if (s->model.mlp.gpt && w->context != (uint64_t)s->model.mlp.context)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		                    "windows.context %llu is not GPT '%s''s context %d: its windows "
		                    "are whole", (unsigned long long)w->context, s->model.name,
		                    s->model.mlp.context);
	if (d->dtype != TS_DT_UINT16 && d->dtype != TS_DT_INT32)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		                    "windows.array '%s' is %s; windows read token ids, uint16 or int32",
		                    name, ts_dtype_name(d->dtype));
	if (!ts_array_single_buffer(in->arr))
		return ts_error_set(err, TS_UNIMPLEMENTED, "SHARDED_DATASET",
		                    "windows are read from a one-shard stream; '%s' is sharded", name);
	n = d->nbytes / ts_dtype_size(d->dtype);
	if (n < w->context + 1)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		                    "windows.array '%s' holds %llu tokens; a window of context %llu "
		                    "reads %llu", name, (unsigned long long)n,
		                    (unsigned long long)w->context, (unsigned long long)w->context + 1);
	w->tokens = n;
	w->per_epoch = (n - 1) / w->context;
	if (w->size > w->per_epoch)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		                    "windows.batch_size %llu%s exceeds the %llu windows of context "
		                    "%llu that '%s' (%llu tokens) holds",
		                    (unsigned long long)(w->size / (uint64_t)s->accumulate),
		                    times_accumulate(s, acc, sizeof acc),
		                    (unsigned long long)w->per_epoch, (unsigned long long)w->context,
		                    name, (unsigned long long)n);
	if (w->size * w->context > (1u << 24))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		                    "windows of %llu x %llu tokens (batch_size%s, context); a step "
		                    "takes at most %u", (unsigned long long)w->size,
		                    (unsigned long long)w->context, times_accumulate(s, acc, sizeof acc),
		                    1u << 24);
	*rows = w->size * w->context;
	*id_bytes = (int)ts_dtype_size(d->dtype);
	tgt->arr = ts_array_ref(in->arr);
	in->row_bytes = tgt->row_bytes = (uint64_t)*id_bytes;
	in->rows = malloc(*rows * sizeof *in->rows);
	tgt->rows = malloc(*rows * sizeof *tgt->rows);
	if (!in->rows || !tgt->rows)
		return ts_error_oom(err, "no memory for %llu windows", (unsigned long long)w->size);
	in->nrows = tgt->nrows = (size_t)*rows;
	window_rows(w, 0, in->rows, tgt->rows);
	return TS_OK;
}

/* A data-driven run's operands: whole datasets of the same rows, one shard
 * each; the first batch's rows. */
static ts_status batches_begin(struct run *s, struct operand *in, struct operand *tgt,
                               uint64_t *bin, uint64_t *btgt, struct ts_error *err)
{
	const struct ts_array_desc *d = ts_array_desc(in->arr);
	struct batches *b = &s->batches;
	char acc[32];
	ts_status st;

	if (in->rows_json || (tgt->arr && tgt->rows_json))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCHES",
		                    "%s.rows and batches are exclusive: batches draw the rows",
		                    in->rows_json ? "inputs" : "targets");
	if (!ts_array_single_buffer(in->arr) || (tgt->arr && !ts_array_single_buffer(tgt->arr)))
		return ts_error_set(err, TS_UNIMPLEMENTED, "SHARDED_DATASET",
		                    "batches are drawn from one-shard datasets; '%s' is sharded",
		                    ts_array_name(ts_array_single_buffer(in->arr) ? tgt->arr : in->arr));
	b->rows = d->rank ? d->shape[0] : 0;
	if (tgt->arr && (ts_array_desc(tgt->arr)->rank == 0 ||
	                 ts_array_desc(tgt->arr)->shape[0] != b->rows))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TARGETS",
		                    "targets '%s' must have the %llu rows of the inputs '%s'",
		                    ts_array_name(tgt->arr), (unsigned long long)b->rows,
		                    ts_array_name(in->arr));
	if (b->size > b->rows)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCHES",
		                    "batches.batch_size %llu%s exceeds the %llu rows of '%s'",
		                    (unsigned long long)(b->size / (uint64_t)s->accumulate),
		                    times_accumulate(s, acc, sizeof acc), (unsigned long long)b->rows,
		                    ts_array_name(in->arr));
	in->rows = malloc(b->size * sizeof *in->rows);
	tgt->rows = tgt->arr ? malloc(b->size * sizeof *tgt->rows) : NULL;
	if (!in->rows || (tgt->arr && !tgt->rows))
		return ts_error_oom(err, "no memory for a batch");
	in->nrows = b->size;
	st = batch_rows(b, 0, in->rows, err);
	if (st == TS_OK && tgt->arr) {
		memcpy(tgt->rows, in->rows, b->size * sizeof *in->rows);
		tgt->nrows = b->size;
	}
	*bin = *btgt = b->size;
	return st;
}

/* The operands' shapes: inputs float32 [B, d_model], targets like them. */
static ts_status check_batch(const struct run *s, const struct operand *in, uint64_t bin,
                             const struct operand *tgt, uint64_t btgt, struct ts_error *err)
{
	const struct ts_array_desc *d = ts_array_desc(in->arr);

	if (d->dtype != TS_DT_FLOAT32 || d->rank != 2 || d->shape[1] != (uint64_t)s->model.mlp.d_model ||
	    bin == 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_INPUTS",
		                    "inputs must be float32 [B, %d] with B >= 1", s->model.mlp.d_model);
	if (bin > (1u << 24))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_INPUTS",
		                    "inputs have %llu rows; a step takes at most %u",
		                    (unsigned long long)bin, 1u << 24);
	if (tgt && tgt->arr) {
		const struct ts_array_desc *t = ts_array_desc(tgt->arr);

		if (t->dtype != d->dtype || t->rank != 2 || t->shape[1] != d->shape[1] || btgt != bin)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TARGETS",
			                    "targets must have the shape of the inputs");
	}
	return TS_OK;
}

/* Where it runs: committed arrays decide; uncommitted operands given by
 * name follow (counted as implicit transfers); operands given as rows are
 * staged instead (only their rows move). */
static ts_status step_place(struct run *s, struct operand *in, struct operand *tgt,
                            struct ts_device **dev, struct ts_error *err)
{
	const struct ts_jobs_env *env = s->env;
	struct ts_array *use[TS_ROLE_COUNT + 2];
	enum ts_pbuf_role from[TS_ROLE_COUNT];
	size_t nuse = 0, where_in = SIZE_MAX, where_tgt = SIZE_MAX, nheld;
	ts_status st;

	for (size_t i = 0; i < TS_MODEL_NROLES; i++)
		if (s->held[ts_model_roles[i]]) {
			from[nuse] = ts_model_roles[i];
			use[nuse++] = ts_array_ref(s->held[ts_model_roles[i]]);
		}
	nheld = nuse;
	if (!in->rows_json && !s->batches.on && !s->windows.on) {
		where_in = nuse;
		use[nuse++] = ts_array_ref(in->arr);
	}
	if (tgt->arr && !tgt->rows_json && !s->batches.on && !s->windows.on) {
		where_tgt = nuse;
		use[nuse++] = ts_array_ref(tgt->arr);
	}
	st = ts_colocate(env->catalog, env->stager, env->memory, use, nuse, s->model.device,
	                 s->op_id, dev, err);
	/* colocation may have replaced a moved array by its new version */
	for (size_t i = 0; i < nheld; i++) {
		ts_array_unref(s->held[from[i]]);
		s->held[from[i]] = use[i];
	}
	if (where_in != SIZE_MAX) {
		ts_array_unref(in->arr);
		in->arr = use[where_in];
	}
	if (where_tgt != SIZE_MAX) {
		ts_array_unref(tgt->arr);
		tgt->arr = use[where_tgt];
	}
	return st;
}

/* ---- results ------------------------------------------------------------------- */

/* n floats as a JSON array, null for a value that is not finite. */
static json_t *floats_json(const float *v, uint64_t n)
{
	json_t *a = json_array();

	for (uint64_t i = 0; a && i < n; i++)
		json_array_append_new(a, isfinite(v[i]) ? json_real(v[i]) : json_null());
	return a;
}

/* What the steps report one value per step of, beside the losses, with an
 * optimizer: the learning rate each update used and the gradients' global
 * norm before clipping, into o. */
static void per_step_json(const struct run *s, const struct ts_session_report *rep, json_t *o)
{
	if (!o || s->model.opt.type == TS_OPT_NONE)
		return;
	json_object_set_new(o, "learning_rates", floats_json(rep->learning_rates, rep->steps));
	json_object_set_new(o, "grad_norms", floats_json(rep->grad_norms, rep->steps));
}

/* The result of a run (the session's report; the plan's analysis). */
static json_t *step_result(const struct run *s, const struct ts_session *sess,
                           struct ts_device *dev)
{
	const struct ts_plan *plan = ts_session_plan(sess);
	const struct ts_session_report *rep = ts_session_report(sess);
	json_t *losses = json_array();
	double per = rep->steps ? 1.0 / (double)rep->steps : 0;
	uint64_t spare = 0, bytes = 0;

	/* a data-driven run of more than one step stages the next batch in a
	 * second buffer per operand: device memory beside the plan's */
	for (int k = 0; (s->batches.on || s->windows.on) && s->steps > 1 && k < 2; k++)
		if (ts_session_slot(sess, k ? TS_ROLE_TARGET : TS_ROLE_INPUT, &bytes, NULL))
			spare += bytes;
	double busy = rep->compute_s, waits = rep->copy_wait_s;
	int R = ts_session_replicas(sess);
	json_t *o;

	for (uint64_t i = 0; losses && i < rep->steps; i++)
		json_array_append_new(losses, json_real(rep->losses[i]));
	o = json_pack("{s:s, s:I, s:o*, s:s, s:I, s:I, s:I, s:I, s:o*,"
	                 " s:{s:f, s:f, s:f, s:f}, s:{s:I, s:I, s:I}, s:f}",
	                 "model", s->model.name, "steps", (json_int_t)rep->steps, "losses", losses,
	                 "device", ts_device_props(dev)->id,
	                 "predicted_peak_device_bytes", (json_int_t)(plan->peak_device_bytes + spare),
	                 "measured_peak_device_bytes",
	                 (json_int_t)(plan->argument_size_in_bytes + plan->output_size_in_bytes +
	                              rep->measured_temp_peak + rep->spare_bytes / (uint64_t)R),
	                 "predicted_temp_size_in_bytes", (json_int_t)plan->temp_size_in_bytes,
	                 "measured_temp_size_in_bytes", (json_int_t)rep->measured_temp_peak,
	                 "analysis", ts_render_plan(plan, false),
	                 "time", "wall_s", rep->wall_s, "compute_s", busy,
	                 "transfer_not_hidden_s", waits, "per_step_s", rep->wall_s * per,
	                 "bytes_moved", "h2d", (json_int_t)rep->h2d_bytes,
	                 "d2h", (json_int_t)rep->d2h_bytes,
	                 "staged_h2d", (json_int_t)rep->staged_h2d_bytes,
	                 "overlap_ratio", busy + waits > 0 ? busy / (busy + waits) : 1.0);
	if (o && R > 1) {
		/* data parallel: the figures above are each device's (the peaks)
		 * or the slowest's (the times); per device, its compute, its
		 * collectives, the part of them its compute waited for, and the
		 * gradient bytes it all-reduced */
		json_t *devs = json_array();

		for (int k = 0; devs && k < R; k++)
			json_array_append_new(devs, json_pack("{s:s, s:f, s:f, s:f, s:I}", "device",
			                                      ts_device_props(s->model.replica_devs[k])->id,
			                                      "compute_s", rep->replica_compute_s[k],
			                                      "communication_s", rep->replica_comm_s[k],
			                                      "communication_not_hidden_s",
			                                      rep->replica_comm_wait_s[k],
			                                      "all_reduce_bytes",
			                                      (json_int_t)rep->allreduce_bytes));
		json_object_set_new(o, "devices", devs);
		json_object_set_new(o, "all_reduce_bytes", json_integer((json_int_t)rep->allreduce_bytes));
	}
	return o;
}

/* Where a windows run stopped after done steps: the next window (a call
 * with "start": next continues exactly) and its epoch. */
static json_t *windows_json(const struct run *s, uint64_t done)
{
	const struct windows *w = &s->windows;
	uint64_t next = w->start + done * w->size;

	return json_pack("{s:I, s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:I}",
	                 "context", (json_int_t)w->context,
	                 "batch_size", (json_int_t)(w->size / (uint64_t)s->accumulate),
	                 "order", w->random ? "random" : "sequential", "seed", (json_int_t)w->seed,
	                 "start", (json_int_t)w->start, "next", (json_int_t)next,
	                 "epoch", (json_int_t)(next / w->per_epoch),
	                 "windows_per_epoch", (json_int_t)w->per_epoch,
	                 "tokens", (json_int_t)w->tokens);
}

/* A run's result: step_result, the model's step count after it and, for a
 * data-driven run, where it stopped (the next call continues with start =
 * next). The same for a run that completed and one that stopped early. */
static json_t *run_json(const struct run *s, const struct ts_session *sess,
                        struct ts_device *dev)
{
	json_t *res = step_result(s, sess, dev);
	uint64_t t = 0;

	if (!res)
		return NULL;
	per_step_json(s, ts_session_report(sess), res);
	if (s->accumulate > 1)
		json_object_set_new(res, "accumulate", json_integer(s->accumulate));
	if (ts_model_registry_step_count(s->env->models, s->model.uid, &t))
		json_object_set_new(res, "model_steps", json_integer((json_int_t)t));
	if (s->batches.on) {
		const struct batches *b = &s->batches;
		uint64_t next = b->start + s->done * b->size;

		json_object_set_new(res, "batches",
		                    json_pack("{s:I, s:s, s:I, s:I, s:I, s:I, s:I}",
		                              "batch_size",
		                              (json_int_t)(b->size / (uint64_t)s->accumulate),
		                              "order", b->shuffle ? "shuffle" : "sequential",
		                              "seed", (json_int_t)b->seed,
		                              "start", (json_int_t)b->start,
		                              "next", (json_int_t)next,
		                              "epoch", (json_int_t)(next / b->rows),
		                              "rows", (json_int_t)b->rows));
	}
	if (s->windows.on)
		json_object_set_new(res, "windows", windows_json(s, s->evaluate ? 1 : s->done));
	return res;
}

/* A running step's partial result: run_json's object without the plan's
 * figures and times - the model, the steps so far, their losses (learning
 * rates, norms), the model's step count and where a data-driven run is. */
static json_t *running_json(const struct run *s, const struct ts_session *sess)
{
	const struct ts_session_report *rep = ts_session_report(sess);
	json_t *o = json_pack("{s:s, s:I, s:o*}", "model", s->model.name,
	                      "steps", (json_int_t)rep->steps,
	                      "losses", floats_json(rep->losses, rep->steps));
	uint64_t t = 0;

	if (!o)
		return NULL;
	per_step_json(s, rep, o);
	if (ts_model_registry_step_count(s->env->models, s->model.uid, &t))
		json_object_set_new(o, "model_steps", json_integer((json_int_t)t));
	if (s->batches.on)
		json_object_set_new(o, "batches",
		                    json_pack("{s:I, s:I}", "next",
		                              (json_int_t)(s->batches.start + s->done * s->batches.size),
		                              "epoch",
		                              (json_int_t)((s->batches.start +
		                                            s->done * s->batches.size) /
		                                           s->batches.rows)));
	if (s->windows.on)
		json_object_set_new(o, "windows", windows_json(s, s->done));
	return o;
}

static json_t *eval_result(const struct run *s, const struct ts_session *sess,
                           struct ts_device *dev, const struct ts_array *outs)
{
	const struct ts_plan *plan = ts_session_plan(sess);
	const struct ts_session_report *rep = ts_session_report(sess);
	json_t *o = json_pack("{s:s, s:f, s:I, s:s, s:I, s:I, s:I, s:I, s:o*,"
	                      " s:{s:f, s:f, s:f}, s:{s:I, s:I, s:I}}",
	                      "model", s->model.name,
	                      "loss", s->no_targets ? 0.0 : (double)rep->losses[0],
	                      "batch", (json_int_t)plan->batch, "device", ts_device_props(dev)->id,
	                      "predicted_peak_device_bytes", (json_int_t)plan->peak_device_bytes,
	                      "measured_peak_device_bytes",
	                      (json_int_t)(plan->argument_size_in_bytes + plan->output_size_in_bytes +
	                                   rep->measured_temp_peak),
	                      "predicted_temp_size_in_bytes", (json_int_t)plan->temp_size_in_bytes,
	                      "measured_temp_size_in_bytes", (json_int_t)rep->measured_temp_peak,
	                      "analysis", ts_render_plan(plan, false),
	                      "time", "wall_s", rep->wall_s, "compute_s", rep->compute_s,
	                      "transfer_not_hidden_s", rep->copy_wait_s,
	                      "bytes_moved", "h2d", (json_int_t)rep->h2d_bytes,
	                      "d2h", (json_int_t)rep->d2h_bytes,
	                      "staged_h2d", (json_int_t)rep->staged_h2d_bytes);

	if (o && s->no_targets)
		json_object_del(o, "loss");          /* the logits only */
	if (o && outs)
		json_object_set_new(o, "outputs", ts_render_array(outs));
	if (o && s->windows.on)
		json_object_set_new(o, "windows", windows_json(s, 1));
	return o;
}

/* Whether a is laid out as model m's array of role is on its devices: a
 * whole replica on each, in order, or (ZeRO-1 optimizer state) each
 * device's slice, as ts_job_model_placement places it. */
static bool model_layout(const struct ts_array *a, const struct ts_model *m,
                         enum ts_pbuf_role role)
{
	const struct ts_array_desc *d = ts_array_desc(a);
	const struct ts_sharding *have = &ts_array_placement(a)->sharding;
	struct ts_placement want;

	ts_job_model_placement(m, role, &want);
	if (ts_array_nshards(a) != m->replicas || have->type != TS_SHARDING_NAMED ||
	    have->spec_rank != want.sharding.spec_rank)
		return false;
	for (int x = 0; x < want.sharding.spec_rank; x++)
		if (have->spec[x].naxes != want.sharding.spec[x].naxes)
			return false;
	for (int k = 0; k < m->replicas; k++) {
		const struct ts_shard_box *b = ts_array_box(a, k);

		if (b->device != m->replica_devs[k])
			return false;
		for (int x = 0; want.sharding.spec_rank == 0 && x < d->rank; x++)
			if (b->start[x] != 0 || b->count[x] != d->shape[x])
				return false;
	}
	return true;
}

/* Takes into s->held the current version of each of the model's arrays of
 * roles (those it has), checking each is the model's and on one device;
 * what says what runs there ("steps", "evaluations"). */
static ts_status hold_roles(const struct ts_jobs_env *env, struct run *s,
                            const enum ts_pbuf_role *roles, size_t n, const char *what,
                            struct ts_error *err)
{
	char owner[160];

	ts_model_owner(&s->model, owner, sizeof owner);
	for (size_t i = 0; i < n; i++) {
		struct ts_array *a;
		char name[256];

		if (!ts_model_has_role(&s->model, roles[i]))
			continue;
		ts_model_array_name(&s->model, roles[i], name, sizeof name);
		a = ts_catalog_get(env->catalog, name);
		if (!a)
			return ts_error_set(err, TS_FAILED_PRECONDITION, "ARRAY_NOT_FOUND",
			                    "model array '%s' is missing", name);
		s->held[roles[i]] = a;
		if (strcmp(ts_array_owner(a), owner) != 0)
			return ts_error_set(err, TS_FAILED_PRECONDITION, "ARRAY_NOT_OWNED",
			                    "array '%s' is not %s's", name, owner);
		if (s->model.replicas > 1 ? !model_layout(a, &s->model, roles[i])
		                          : ts_array_nshards(a) != 1)
			return ts_error_set(err, TS_UNIMPLEMENTED, "SHARDED_PARAMS",
			                    "model array '%s' is sharded otherwise than the model's "
			                    "placement (%s run on one device, or data parallel on a "
			                    "replica on each of placement.devices)", name, what);
	}
	return TS_OK;
}

/* Not over a held array, nor over any model's array (an evaluation writes
 * no weights). */
ts_status ts_job_outputs_writable(const struct ts_jobs_env *env,
                                  const struct ts_job_outputs *o, struct ts_error *err)
{
	struct ts_array *a = ts_catalog_get(env->catalog, o->name);
	ts_status st = TS_OK;

	if (a && ts_array_owner(a)[0])
		st = ts_error_set(err, TS_FAILED_PRECONDITION, "ARRAY_OWNED",
		                  "outputs.name '%s' is an array of %s; an evaluation writes its "
		                  "outputs to an array of its own", o->name, ts_array_owner(a));
	ts_array_unref(a);
	if (st == TS_OK)
		st = ts_catalog_check_write(env->catalog, o->name, NULL,
		                            &(struct ts_precondition){0}, err);
	return st;
}

/* ---- the run -------------------------------------------------------------------- */

/*
 * What a step and an evaluation share before they differ: the operands
 * resolved and placed (the run goes where the parameters are), their rows
 * (a data-driven step's first batch), the batch checked against the model,
 * the policy with params and optimizer state where the held arrays are now
 * (a :put before the run may have moved them), the session planned on cfg
 * and every held array bound by its role.
 */
/* Every slot of the session by its role: the held arrays, each replica's
 * own (an evaluation or one device: replica 0, the model's device). */
static ts_status bind_held(struct run *s, struct ts_error *err)
{
	ts_status st = TS_OK;

	for (int r = 0; st == TS_OK && r < TS_ROLE_COUNT; r++) {
		const struct ts_array *a = s->held[r];

		for (int k = 0; a && st == TS_OK && k < ts_session_replicas(s->sess); k++) {
			const struct ts_buffer *b = ts_job_model_buffer(a, k);

			st = ts_session_bind_replica(s->sess, k, (enum ts_pbuf_role)r, ts_buffer_data(b),
			                             ts_buffer_size(b),
			                             ts_array_placement(a)->sharding.memory_kind, err);
		}
	}
	return st;
}

static ts_status run_begin(struct run *s, struct ts_session_config *cfg, struct ts_error *err)
{
	const struct ts_jobs_env *env = s->env;
	struct ts_model *m = &s->model;
	struct ts_device *pdev;
	uint64_t rows = 0;
	int id_bytes = 4;
	ts_status st;

	st = operand_resolve(env, s->inputs, s->inputs_rows, s->windows.on ? "windows" : "inputs",
	                     &s->in, err);
	/* an evaluation of a token model without targets: its logits only */
	s->no_targets = s->evaluate && !s->windows.on && !s->targets && ts_mlp_tokens(&m->mlp);
	if (st == TS_OK && !s->windows.on && !s->no_targets &&
	    (m->mlp.loss == TS_LOSS_MSE || m->mlp.loss == TS_LOSS_XENT)) {
		if (!s->targets)
			st = ts_error_set(err, TS_INVALID_ARGUMENT, "NO_TARGETS", "loss mse needs \"targets\"");
		else
			st = operand_resolve(env, s->targets, s->targets_rows, "targets", &s->tgt, err);
	}
	if (st == TS_OK)
		st = step_place(s, &s->in, &s->tgt, &s->dev, err);
	if (st == TS_OK && s->windows.on) {
		st = windows_begin(s, &s->in, &s->tgt, &rows, &id_bytes, err);
		s->bin = s->btgt = s->windows.size;
	} else if (st == TS_OK && s->batches.on) {
		st = batches_begin(s, &s->in, &s->tgt, &s->bin, &s->btgt, err);
	} else {
		if (st == TS_OK)
			st = operand_rows(&s->in, "inputs.rows", &s->bin, err);
		if (st == TS_OK && s->tgt.arr)
			st = operand_rows(&s->tgt, "targets.rows", &s->btgt, err);
	}
	if (st == TS_OK && s->bin % (uint64_t)s->accumulate != 0)
		st = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ACCUMULATE",
		                  "accumulate %d splits the inputs' %llu rows into micro-batches: "
		                  "their count must be a multiple of it", s->accumulate,
		                  (unsigned long long)s->bin);
	if (st != TS_OK)
		;
	else if (s->windows.on)
		;    /* windows_begin checked the stream */
	else if (st == TS_OK && ts_mlp_tokens(&m->mlp))
		st = check_token_batch(s, &s->in, s->bin, &s->tgt, s->btgt, &rows, &id_bytes, err);
	else if (st == TS_OK)
		st = check_batch(s, &s->in, s->bin, &s->tgt, s->btgt, err);
	if (st == TS_OK)
		st = held_kind(s, false, &s->policy.params, err);
	if (st == TS_OK)
		st = held_kind(s, true, &s->policy.opt_state, err);
	if (st != TS_OK)
		return st;
	pdev = ts_array_box(s->held[m->mlp.gpt ? ts_gpt_role(0, TS_GPT_WTE) : TS_ROLE_W1], 0)->device;
	if (pdev != s->dev)
		return ts_error_set(err, TS_FAILED_PRECONDITION, "PARAMS_ELSEWHERE",
		                    "model '%s' parameters are on %s, not %s", m->name,
		                    ts_device_props(pdev)->id, ts_device_props(s->dev)->id);
	if (s->out.outputs && s->out.dev && s->out.dev != s->dev)
		return ts_error_set(err, TS_FAILED_PRECONDITION, "OUTPUTS_ELSEWHERE",
		                    "outputs '%s' are asked for on %s, but the evaluation runs on %s, "
		                    "where model '%s' is", s->out.name, ts_device_props(s->out.dev)->id,
		                    ts_device_props(s->dev)->id, m->name);
	cfg->dev = s->dev;
	cfg->policy = s->policy;
	if (m->replicas > 1 && !s->evaluate) {
		/* every replica its own rows: the inputs' rows, a GPT's windows */
		uint64_t parts = (uint64_t)s->accumulate * (uint64_t)m->replicas;

		if (s->bin % parts != 0)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCH",
			                    "model '%s' runs on %d devices: a step's %llu rows must split "
			                    "into %llu equal parts%s", m->name, m->replicas,
			                    (unsigned long long)s->bin, (unsigned long long)parts,
			                    s->accumulate > 1 ? " (devices x accumulate)" : "");
		cfg->replicas = m->replicas;
		cfg->shard_state = m->shard_optimizer;
		cfg->shard_grads = m->shard_gradients;
		memcpy(cfg->devs, m->replica_devs, sizeof cfg->devs);
	}
	cfg->batch = (int)((ts_mlp_tokens(&m->mlp) ? rows : s->bin) / (uint64_t)s->accumulate /
	                   (uint64_t)(cfg->replicas > 1 ? cfg->replicas : 1));
	cfg->accumulate = s->accumulate;
	cfg->mlp.id_bytes = id_bytes;
	if (s->evaluate) {
		cfg->no_targets = s->no_targets;
		cfg->last = s->last;
		if (m->mlp.gpt)
			cfg->window = s->window = s->windows.on ? (int)s->windows.context
			                          : (int)(rows / s->bin);
	}
	st = ts_session_new(cfg, &s->sess, err);
	if (st == TS_OK)
		st = bind_held(s, err);
	return st;
}

/* The batch staged for the session, after the run's own bindings. */
static ts_status run_stage(struct run *s, struct ts_error *err)
{
	ts_status st = operand_stage(s->env, s->sess, TS_ROLE_INPUT, &s->in, s->dev, err);

	if (st == TS_OK && s->tgt.arr)
		st = operand_stage(s->env, s->sess, TS_ROLE_TARGET, &s->tgt, s->dev, err);
	return st;
}

/* What the worker made for the run goes; what it holds stays until
 * release. */
static void run_end(struct run *s)
{
	ts_session_free(s->sess);
	s->sess = NULL;
	for (int r = 0; r < TS_ROLE_COUNT; r++) {
		ts_array_unref(s->next[r]);
		ts_array_unref(s->priv[r][0]);
		ts_array_unref(s->priv[r][1]);
		s->next[r] = s->priv[r][0] = s->priv[r][1] = NULL;
	}
	operand_release(&s->in);
	operand_release(&s->tgt);
}

/* The gradient role of a parameter role, and the gradient's name after
 * "{model}.grad."; false for a role that is no parameter. */
static bool grad_of(enum ts_pbuf_role r, enum ts_pbuf_role *g, const char **name)
{
	static const enum ts_pbuf_role mlp_param[4] = {TS_ROLE_W1, TS_ROLE_W2, TS_ROLE_EMBED,
	                                               TS_ROLE_PROJ};
	static const enum ts_pbuf_role mlp_grad[4] = {TS_ROLE_GRAD_W1, TS_ROLE_GRAD_W2,
	                                              TS_ROLE_GRAD_EMBED, TS_ROLE_GRAD_PROJ};
	static const char *const mlp_name[4] = {"w1", "w2", "embed", "proj"};
	int kind, t;

	if (ts_gpt_role_of(r, &kind, &t)) {
		*g = ts_gpt_role(3, t);
		*name = ts_gpt_param_name((enum ts_gpt_param)t);
		return kind == 0;
	}
	for (int i = 0; i < 4; i++)
		if (mlp_param[i] == r) {
			*g = mlp_grad[i];
			*name = mlp_name[i];
			return true;
		}
	return false;
}

/* A step without an optimizer leaves its gradients in new arrays
 * "{model}.grad.{w1,w2,embed,proj}" (a GPT's "{model}.grad.{wte,...}") on
 * the device: made and bound here, published as the run ends. */
static ts_status step_grads(struct run *s, struct ts_array *grads[TS_GRADS_MAX], int *ng,
                            struct ts_error *err)
{
	ts_status st = TS_OK;

	for (size_t i = 0; st == TS_OK && s->model.opt.type == TS_OPT_NONE &&
	                   i < TS_MODEL_NROLES; i++) {
		enum ts_pbuf_role r = ts_model_roles[i], gr;
		struct ts_placement pl;
		const char *gname;
		char name[256];

		if (!grad_of(r, &gr, &gname) || !s->held[r] || *ng == TS_GRADS_MAX)
			continue;
		snprintf(name, sizeof name, "%s.grad.%s", s->model.name, gname);
		/* where the parameter is: a replica on each device when data
		 * parallel (the all-reduced gradient, the same on every one) */
		pl = *ts_array_placement(s->held[r]);
		pl.sharding.memory_kind = TS_MEM_DEVICE;
		pl.committed = true;
		if (ts_session_replicas(s->sess) == 1)
			ts_placement_single(&pl, s->dev, TS_MEM_DEVICE, true);
		st = ts_array_new(name, ts_array_desc(s->held[r]), &pl, s->env->memory, &grads[*ng],
		                  err);
		for (int k = 0; st == TS_OK && k < ts_session_replicas(s->sess); k++)
			st = ts_session_bind_replica(s->sess, k, gr,
			                             ts_buffer_data(ts_job_model_buffer(grads[*ng], k)),
			                             ts_array_desc(grads[*ng])->nbytes, TS_MEM_DEVICE, err);
		(*ng)++;
	}
	return st;
}

static ts_status step_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct run *s = arg;
	const struct ts_jobs_env *env = s->env;
	struct ts_model *m = &s->model;
	struct ts_array *grads[TS_GRADS_MAX] = {NULL};
	struct ts_session_config cfg = {.mlp = m->mlp, .opt = m->opt, .memory = env->memory};
	uint64_t base_steps = 0;
	int ng = 0;
	bool ran = false;
	ts_status st;

	s->op = op;
	st = run_begin(s, &cfg, err);
	if (st == TS_OK)
		st = step_grads(s, grads, &ng, err);
	if (st == TS_OK)
		st = run_stage(s, err);
	if (st == TS_OK && !ts_model_registry_step_count(env->models, m->uid, &base_steps))
		st = ts_error_set(err, TS_ABORTED, "MODEL_GONE", "model '%s' was deleted", m->name);
	if (st == TS_OK) {
		ran = true;
		st = ts_session_run(s->sess, s->steps, base_steps + 1,
		                    s->windows.on ? &window_hooks
		                                  : s->batches.on ? &batch_hooks : &step_hooks,
		                    s, err);
	}
	/* what the steps that succeeded did is published, also after a failure */
	{
		struct ts_error ierr;
		ts_status ist;

		ts_error_clear(&ierr);
		ist = step_install(s, &ierr);
		if (ist != TS_OK && st == TS_OK) {
			*err = ierr;
			st = ist;
		}
	}
	if (st == TS_OK && grads[0])
		st = ts_catalog_put_all(env->catalog, grads, (size_t)ng, true, err);
	/* what the run did: its result, or, when it stopped early, the
	 * operation's partial result (the losses of the steps that ran and
	 * where to continue) */
	if (ran) {
		json_t *res = run_json(s, s->sess, s->dev);

		if (st == TS_OK) {
			ts_operation_set_partial(op, NULL);    /* the result says it all */
			ts_operation_set_result(op, res);
		} else {
			ts_operation_set_partial(op, res);
		}
	}
	run_end(s);
	for (int g = 0; g < TS_GRADS_MAX; g++)
		ts_array_unref(grads[g]);
	return st;
}

/* An evaluation's outputs: float32 [B, d_model], or a token model's logits
 * (the inputs' shape, then vocab), made where it runs and bound. */
static ts_status eval_outputs_bind(struct run *s, struct ts_array **outs, struct ts_error *err)
{
	const struct ts_mlp *mlp = &s->model.mlp;
	struct ts_array_desc d = {.dtype = TS_DT_FLOAT32, .rank = 2,
	                          .shape = {s->bin, (uint64_t)mlp->d_model}};
	struct ts_placement pl;
	ts_status st;

	if (s->last) {
		/* [windows, vocab] */
		d.shape[0] = s->windows.on ? s->windows.size : s->bin;
		d.shape[1] = (uint64_t)mlp->vocab;
	} else if (s->windows.on) {
		/* [windows, context, vocab] */
		d.rank = 3;
		d.shape[0] = s->windows.size;
		d.shape[1] = s->windows.context;
		d.shape[2] = (uint64_t)mlp->vocab;
	} else if (ts_mlp_tokens(mlp)) {
		const struct ts_array_desc *id = ts_array_desc(s->in.arr);

		d.rank = id->rank + 1;
		d.shape[0] = s->bin;
		if (id->rank == 2)
			d.shape[1] = id->shape[1];
		d.shape[d.rank - 1] = (uint64_t)mlp->vocab;
	}
	ts_placement_single(&pl, s->dev, s->out.kind, true);
	st = ts_array_desc_init(&d, err);
	if (st == TS_OK)
		st = ts_array_new(s->out.name, &d, &pl, s->env->memory, outs, err);
	if (st == TS_OK)
		st = ts_session_bind(s->sess, TS_ROLE_OUTPUT,
		                     ts_buffer_data(ts_array_single_buffer(*outs)), d.nbytes,
		                     s->out.kind, err);
	return st;
}

static ts_status eval_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct run *s = arg;
	const struct ts_jobs_env *env = s->env;
	struct ts_array *outs = NULL;
	struct ts_session_config cfg = {.mlp = s->model.mlp, .memory = env->memory,
	                                .evaluate = true, .outputs = s->out.outputs,
	                                .outputs_kind = s->out.kind};
	ts_status st;

	s->op = op;
	st = run_begin(s, &cfg, err);
	if (st == TS_OK && s->out.outputs)
		st = eval_outputs_bind(s, &outs, err);
	if (st == TS_OK)
		st = run_stage(s, err);
	if (st == TS_OK)
		st = ts_session_run(s->sess, 1, 1, &eval_hooks, s, err);
	/* the pass itself runs to its end; a cancel that came meanwhile drops it */
	if (st == TS_OK && ts_operation_cancelled(op))
		st = ts_error_set(err, TS_CANCELLED, "CANCELLED",
		                  "the evaluation of model '%s' was cancelled; no outputs were "
		                  "published", s->model.name);
	if (st == TS_OK && outs)
		st = ts_job_outputs_writable(env, &s->out, err);
	if (st == TS_OK && outs) {
		struct ts_precondition pre = {0};

		st = ts_catalog_put(env->catalog, outs, &pre, NULL, err);
	}
	if (st == TS_OK) {
		ts_operation_progress_add(op, 1);
		ts_operation_set_result(op, eval_result(s, s->sess, s->dev, outs));
	}
	run_end(s);
	ts_array_unref(outs);
	return st;
}

/* ---- submission ----------------------------------------------------------------- */


/* What a step holds (and writes): every array of the model. What an
 * evaluation reads, and so holds: the weights (those the model has). */
static const enum ts_pbuf_role eval_roles[] = {
	TS_ROLE_W1, TS_ROLE_W2, TS_ROLE_EMBED, TS_ROLE_PROJ,
#define TS_GPT_EVAL_ROLE_(id, name) TS_ROLE_GPT_##id,
	TS_GPT_PARAMS(TS_GPT_EVAL_ROLE_)
#undef TS_GPT_EVAL_ROLE_
};

/* A run of req, its operands copied, its arrays taken as current now and
 * held, submitted as an operation of kind; s is the operation's once this
 * succeeds, freed here otherwise. */
static ts_status run_submit(const struct ts_jobs_env *env, const struct ts_job_run *req,
                            bool evaluate, struct ts_operation **op, struct ts_error *err)
{
	struct run *s = calloc(1, sizeof *s);
	ts_status st;

	*op = NULL;
	if (!s)
		return ts_error_oom(err, evaluate ? "no memory for an evaluation" : "no memory for a step");
	s->env = env;
	s->evaluate = evaluate;
	s->model = req->model;
	s->policy = req->policy;
	s->steps = evaluate ? 1 : req->steps;
	s->inputs = strdup(req->windows.on ? req->windows.array
	                                   : req->inputs.array ? req->inputs.array : "");
	s->targets = req->targets.array ? strdup(req->targets.array) : NULL;
	s->batches = (struct batches){.on = req->batches.on, .shuffle = req->batches.shuffle,
	                              .size = req->batches.size, .start = req->batches.start,
	                              .seed = req->batches.seed, .perm_epoch = UINT64_MAX};
	s->windows = (struct windows){.on = req->windows.on, .random = req->windows.random,
	                              .context = req->windows.context, .size = req->windows.size,
	                              .seed = req->windows.seed, .start = req->windows.start};
	s->accumulate = !evaluate && req->accumulate > 1 ? req->accumulate : 1;
	s->batches.size *= (uint64_t)s->accumulate;
	s->windows.size *= (uint64_t)s->accumulate;
	if (evaluate) {
		s->batches.on = false;
		s->out = req->outputs;
		s->last = req->last;
	}
	/* copies: the worker drops them while the caller drops the request */
	s->inputs_rows = req->inputs.rows ? json_deep_copy(req->inputs.rows) : NULL;
	s->targets_rows = req->targets.rows ? json_deep_copy(req->targets.rows) : NULL;
	if (!s->inputs || (req->targets.array && !s->targets) ||
	    (req->inputs.rows && !s->inputs_rows) || (req->targets.rows && !s->targets_rows)) {
		st = ts_error_oom(err, "no memory for the request's operands");
		goto out_free;
	}
	/* the model's arrays by role, by the versions current now, to be held */
	st = evaluate ? hold_roles(env, s, eval_roles, sizeof eval_roles / sizeof eval_roles[0],
	                           "evaluations", err)
	              : hold_roles(env, s, ts_model_roles, TS_MODEL_NROLES, "steps", err);
	if (st == TS_OK)
		st = ts_op_submit_holding(env->operations, evaluate ? "evaluate" : "step",
		                          s->model.name, s->steps, evaluate ? "passes" : "steps",
		                          evaluate ? eval_run : step_run, s, run_release, run_hold, op,
		                          err);
	if (st == TS_OK)
		return TS_OK;
out_free:
	run_release(s);
	return st;
}

ts_status ts_job_step_submit(const struct ts_jobs_env *env, const struct ts_job_run *run,
                             struct ts_operation **op, struct ts_error *err)
{
	return run_submit(env, run, false, op, err);
}

ts_status ts_job_eval_submit(const struct ts_jobs_env *env, const struct ts_job_run *run,
                             struct ts_operation **op, struct ts_error *err)
{
	return run_submit(env, run, true, op, err);
}

/* ---- generation ------------------------------------------------------------------ */

/* The generated tokens so far as a JSON array. */
static json_t *gen_tokens_json(const struct run *s)
{
	json_t *a = json_array();

	for (size_t i = s->gen.nprompt; a && i < s->gen.len; i++)
		json_array_append_new(a, json_integer(s->gen.seq[i]));
	return a;
}

/* What a generation's passes planned and measured, as it ends. */
struct gen_figures {
	uint64_t predicted, measured;
	double wall_s, compute_s;
};

static json_t *gen_result(const struct run *s, const struct gen_figures *f)
{
	uint64_t made = s->gen.len - s->gen.nprompt;

	return json_pack("{s:s, s:o*, s:I, s:s, s:I, s:I, s:{s:f, s:f, s:f}}", "model",
	                 s->model.name, "tokens", gen_tokens_json(s), "prompt_tokens",
	                 (json_int_t)s->gen.nprompt, "device", ts_device_props(s->dev)->id,
	                 "predicted_peak_device_bytes", (json_int_t)f->predicted,
	                 "measured_peak_device_bytes", (json_int_t)f->measured, "time", "wall_s",
	                 f->wall_s, "compute_s", f->compute_s, "per_token_s",
	                 made ? f->wall_s / (double)made : 0.0);
}

/* A session of one window of T tokens, the last position's logits into
 * logits (pinned_host, [1, vocab]); every held parameter bound. */
static ts_status gen_session(struct run *s, int T, struct ts_array *logits,
                             struct ts_error *err)
{
	struct ts_session_config cfg = {
		.dev = s->dev, .memory = s->env->memory, .mlp = s->model.mlp,
		.policy = s->policy, .batch = T, .evaluate = true, .outputs = true,
		.outputs_kind = TS_MEM_PINNED_HOST, .no_targets = true, .last = true, .window = T,
	};
	const struct ts_buffer *lb = ts_array_single_buffer(logits);
	ts_status st;

	cfg.mlp.id_bytes = 4;
	ts_session_free(s->sess);
	s->sess = NULL;
	st = ts_session_new(&cfg, &s->sess, err);
	if (st == TS_OK)
		st = bind_held(s, err);
	if (st == TS_OK)
		st = ts_session_bind(s->sess, TS_ROLE_OUTPUT, ts_buffer_data(lb), ts_buffer_size(lb),
		                     TS_MEM_PINNED_HOST, err);
	return st;
}

/* A pinned_host scratch array of shape [1, n] of dtype where the run is
 * (never published). */
static ts_status gen_scratch(struct run *s, const char *name, enum ts_dtype dt, uint64_t n,
                             struct ts_array **out, struct ts_error *err)
{
	struct ts_array_desc d = {.dtype = dt, .rank = 2, .shape = {1, n}};
	struct ts_placement pl;
	ts_status st = ts_array_desc_init(&d, err);

	ts_placement_single(&pl, s->dev, TS_MEM_PINNED_HOST, false);
	if (st == TS_OK)
		st = ts_array_new(name, &d, &pl, s->env->memory, out, err);
	return st;
}

/* The passes: one per token, each the last min(len, context) tokens'
 * evaluation; a new session only when that length changes. */
static ts_status gen_loop(struct run *s, struct ts_array *ids, struct ts_array *logits,
                          float *scratch, struct gen_figures *f, struct ts_error *err)
{
	int C = s->model.mlp.context, V = s->model.mlp.vocab, T = 0;
	int32_t *idp = ts_buffer_data(ts_array_single_buffer(ids));
	const float *lp = ts_buffer_data(ts_array_single_buffer(logits));
	ts_status st = TS_OK;

	for (uint64_t i = 0; st == TS_OK && i < s->steps; i++) {
		int t = s->gen.len < (size_t)C ? (int)s->gen.len : C;
		struct ts_session_source src = {
			.mem = idp, .bytes = (uint64_t)t * 4, .row_bytes = 4, .src_dev = s->dev,
			.src_kind = TS_MEM_PINNED_HOST,
		};
		const struct ts_session_report *rep;
		const struct ts_plan *plan;

		if (ts_operation_cancelled(s->op))
			return ts_error_set(err, TS_CANCELLED, "CANCELLED",
			                    "the generation was cancelled after %llu tokens",
			                    (unsigned long long)i);
		if (t != T) {
			if (s->sess) {
				rep = ts_session_report(s->sess);
				f->wall_s += rep->wall_s;
				f->compute_s += rep->compute_s;
			}
			st = gen_session(s, t, logits, err);
			T = t;
		} else {
			ts_session_unstage(s->sess, TS_ROLE_INPUT);
		}
		memcpy(idp, s->gen.seq + s->gen.len - (size_t)t, (size_t)t * sizeof *idp);
		if (st == TS_OK)
			st = ts_session_stage(s->sess, TS_ROLE_INPUT, &src, err);
		if (st == TS_OK)
			st = ts_session_run(s->sess, 1, 1, &eval_hooks, s, err);
		if (st != TS_OK)
			break;
		plan = ts_session_plan(s->sess);
		rep = ts_session_report(s->sess);
		if (plan->peak_device_bytes > f->predicted)
			f->predicted = plan->peak_device_bytes;
		if (plan->argument_size_in_bytes + plan->output_size_in_bytes +
		    rep->measured_temp_peak > f->measured)
			f->measured = plan->argument_size_in_bytes + plan->output_size_in_bytes +
			              rep->measured_temp_peak;
		s->gen.seq[s->gen.len++] = ts_sample_next(lp, V, s->gen.temperature, s->gen.top_k,
		                                          s->gen.seed, i, scratch);
		ts_operation_progress_add(s->op, 1);
		ts_operation_set_partial(s->op, json_pack("{s:s, s:o*}", "model", s->model.name,
		                                          "tokens", gen_tokens_json(s)));
	}
	if (s->sess) {
		const struct ts_session_report *rep = ts_session_report(s->sess);

		f->wall_s += rep->wall_s;
		f->compute_s += rep->compute_s;
	}
	return st;
}

static ts_status gen_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct run *s = arg;
	struct ts_model *m = &s->model;
	struct ts_array *ids = NULL, *logits = NULL;
	struct gen_figures f = {0};
	float *scratch = malloc((size_t)m->mlp.vocab * sizeof *scratch);
	ts_status st = TS_OK;

	s->op = op;
	if (!scratch)
		st = ts_error_oom(err, "no memory for %d logits", m->mlp.vocab);
	if (st == TS_OK)
		st = held_kind(s, false, &s->policy.params, err);
	if (st == TS_OK) {
		s->dev = ts_array_box(s->held[ts_gpt_role(0, TS_GPT_WTE)], 0)->device;
		for (int r = 0; st == TS_OK && r < TS_ROLE_COUNT; r++)
			if (s->held[r] && ts_array_box(s->held[r], 0)->device != s->dev)
				st = ts_error_set(err, TS_FAILED_PRECONDITION, "PARAMS_ELSEWHERE",
				                  "model '%s' array '%s' is on %s, not %s with its wte",
				                  m->name, ts_array_name(s->held[r]),
				                  ts_device_props(ts_array_box(s->held[r], 0)->device)->id,
				                  ts_device_props(s->dev)->id);
	}
	if (st == TS_OK)
		st = gen_scratch(s, "generate.ids", TS_DT_INT32, (uint64_t)m->mlp.context, &ids, err);
	if (st == TS_OK)
		st = gen_scratch(s, "generate.logits", TS_DT_FLOAT32, (uint64_t)m->mlp.vocab, &logits,
		                 err);
	if (st == TS_OK)
		st = gen_loop(s, ids, logits, scratch, &f, err);
	if (st == TS_OK) {
		ts_operation_set_partial(op, NULL);
		ts_operation_set_result(op, gen_result(s, &f));
	}
	run_end(s);
	ts_array_unref(ids);
	ts_array_unref(logits);
	free(scratch);
	return st;
}

ts_status ts_job_generate_submit(const struct ts_jobs_env *env,
                                 const struct ts_job_generate *req, struct ts_operation **op,
                                 struct ts_error *err)
{
	struct run *s;
	ts_status st;

	*op = NULL;
	if (!req->model.mlp.gpt)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		                    "model '%s' is no GPT: generation is a GPT's", req->model.name);
	if (req->nprompt < 1 || req->nprompt > TS_GENERATE_PROMPT_MAX || req->max_tokens < 1 ||
	    req->max_tokens > TS_GENERATE_MAX_TOKENS)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_GENERATE",
		                    "a generation takes 1..%d prompt tokens and makes 1..%d",
		                    TS_GENERATE_PROMPT_MAX, TS_GENERATE_MAX_TOKENS);
	s = calloc(1, sizeof *s);
	if (!s)
		return ts_error_oom(err, "no memory for a generation");
	s->env = env;
	s->evaluate = true;
	s->model = req->model;
	s->policy = req->policy;
	s->steps = req->max_tokens;
	s->gen = (struct gen){.nprompt = req->nprompt, .len = req->nprompt,
	                      .temperature = req->temperature, .top_k = req->top_k,
	                      .seed = req->seed};
	s->gen.seq = malloc((req->nprompt + req->max_tokens) * sizeof *s->gen.seq);
	if (!s->gen.seq) {
		st = ts_error_oom(err, "no memory for a generation of %llu tokens",
		                  (unsigned long long)req->max_tokens);
		goto out_free;
	}
	memcpy(s->gen.seq, req->prompt, req->nprompt * sizeof *s->gen.seq);
	st = hold_roles(env, s, eval_roles, sizeof eval_roles / sizeof eval_roles[0],
	                "generations", err);
	if (st == TS_OK)
		st = ts_op_submit_holding(env->operations, "generate", s->model.name, s->steps,
		                          "tokens", gen_run, s, run_release, run_hold, op, err);
	if (st == TS_OK)
		return TS_OK;
out_free:
	run_release(s);
	return st;
}
