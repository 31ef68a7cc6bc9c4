/*
 * session.c - a training session: the plan, its bound memory by role, the
 * staged batch, kernels and queues, and the steps run one after another.
 *
 * Every plan buffer the caller binds has one slot, found by its role
 * (slot_of); the executor gets the slots as its argument array. A
 * versioned role's next memory (outs) is given before each step and
 * becomes the role's memory after the step succeeded and was published.
 *
 * Data parallel (cfg.replicas > 1): one lane per replica, each with its
 * device's kernels, queues, bound memory and staged slice of the batch;
 * the same plan (ts_plan_build_replicated) runs on all of them at once
 * (ts_exec_run_replicas) over the session's communicator.
 */
#include "train/session.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/index.h"

/* What one replica (one device) of the session has. */
struct lane {
	struct ts_device *dev;
	struct ts_kernels *kernels;
	struct ts_exec_env env;
	void **args, **outs;             /* owned arrays, one per plan buffer; memory borrowed */
	void *staged[2];                 /* owned: device copies of inputs, targets */
	uint64_t staged_bytes[2];
	void *spare[2];                  /* owned: the next batch, staged meanwhile */
	struct ts_queue *stage_q;        /* owned: the next batch's copies */
	/* token models: the next batch's ids come from device memory and are
	 * checked once copied (the source's row bytes; 0: checked already) */
	uint64_t spare_check[2];
};

struct ts_session {
	struct ts_session_config cfg;
	struct ts_plan plan;
	int R;                           /* lanes: replicas, >= 1 */
	struct lane ln[TS_PLAN_REPLICAS_MAX];
	struct ts_comm *comm;            /* owned; R > 1 */
	int slot_of[TS_ROLE_COUNT];      /* plan buffer of a bound role, -1: none */
	bool pending;                    /* copies of the next batch are on the stage queues */
	struct ts_error next_err;        /* the next batch's bad ids, reported as it is due */
	size_t cap;                      /* of report.losses */
	struct ts_session_report report;
};

static const char *const role_names[TS_ROLE_COUNT] = {
	[TS_ROLE_W1] = "w1", [TS_ROLE_W2] = "w2", [TS_ROLE_MU_W1] = "mu.w1",
	[TS_ROLE_MU_W2] = "mu.w2", [TS_ROLE_NU_W1] = "nu.w1", [TS_ROLE_NU_W2] = "nu.w2",
	[TS_ROLE_INPUT] = "inputs", [TS_ROLE_TARGET] = "targets",
	[TS_ROLE_GRAD_W1] = "grad.w1", [TS_ROLE_GRAD_W2] = "grad.w2",
	[TS_ROLE_EMBED] = "embed", [TS_ROLE_PROJ] = "proj", [TS_ROLE_MU_EMBED] = "mu.embed",
	[TS_ROLE_MU_PROJ] = "mu.proj", [TS_ROLE_NU_EMBED] = "nu.embed",
	[TS_ROLE_NU_PROJ] = "nu.proj", [TS_ROLE_GRAD_EMBED] = "grad.embed",
	[TS_ROLE_GRAD_PROJ] = "grad.proj",
	[TS_ROLE_OUTPUT] = "outputs",
};

static const char *role_name(enum ts_pbuf_role role)
{
#define TS_GPT_NAME_P(id, name) name,
#define TS_GPT_NAME_MU(id, name) "mu." name,
#define TS_GPT_NAME_NU(id, name) "nu." name,
#define TS_GPT_NAME_G(id, name) "grad." name,
	static const char *const gpt_names[4][TS_GPT_NPARAMS] = {
		{TS_GPT_PARAMS(TS_GPT_NAME_P)}, {TS_GPT_PARAMS(TS_GPT_NAME_MU)},
		{TS_GPT_PARAMS(TS_GPT_NAME_NU)}, {TS_GPT_PARAMS(TS_GPT_NAME_G)},
	};
#undef TS_GPT_NAME_P
#undef TS_GPT_NAME_MU
#undef TS_GPT_NAME_NU
#undef TS_GPT_NAME_G
	int kind, t;

	if (ts_gpt_role_of(role, &kind, &t))
		return gpt_names[kind][t];
	return (unsigned)role < TS_ROLE_COUNT && role_names[role] ? role_names[role] : "temp";
}

static int slot(const struct ts_session *s, enum ts_pbuf_role role)
{
	return (unsigned)role < TS_ROLE_COUNT ? s->slot_of[role] : -1;
}

static ts_status no_slot(enum ts_pbuf_role role, struct ts_error *err)
{
	return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
	                    "the step plan has no '%s' to bind", role_name(role));
}

ts_status ts_session_new(const struct ts_session_config *cfg, struct ts_session **out,
                         struct ts_error *err)
{
	struct ts_session *s;
	const char *id;
	ts_status st;

	*out = NULL;
	if (!cfg || !cfg->dev || !cfg->memory)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "session: no device or memory");
	if (cfg->replicas > 1 && (cfg->evaluate || cfg->replicas > TS_PLAN_REPLICAS_MAX ||
	                          cfg->devs[0] != cfg->dev))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REPLICAS",
		                    "session: %d replicas: a step (not an evaluation) on up to %d "
		                    "devices, the first of them cfg.dev", cfg->replicas,
		                    TS_PLAN_REPLICAS_MAX);
	s = calloc(1, sizeof *s);
	if (!s)
		return ts_error_oom(err, "no memory for a training session");
	s->cfg = *cfg;
	s->R = cfg->replicas > 1 ? cfg->replicas : 1;
	for (int k = 0; k < s->R; k++)
		s->ln[k].dev = s->R > 1 ? cfg->devs[k] : cfg->dev;
	for (int r = 0; r < TS_ROLE_COUNT; r++)
		s->slot_of[r] = -1;
	if (cfg->evaluate) {
		struct ts_eval_spec spec = {.outputs = cfg->outputs, .outputs_kind = cfg->outputs_kind,
		                            .no_targets = cfg->no_targets, .last = cfg->last,
		                            .window = cfg->window};

		st = ts_plan_build_eval_spec(&cfg->mlp, cfg->batch, &cfg->policy, &spec, &s->plan, err);
	} else if (cfg->shard_state) {
		st = (cfg->shard_grads ? ts_plan_build_zero2 : ts_plan_build_zero)(
			&cfg->mlp, &cfg->opt, cfg->batch, cfg->accumulate > 1 ? cfg->accumulate : 1, s->R,
			&cfg->policy, &s->plan, err);
	} else {
		st = ts_plan_build_replicated(&cfg->mlp, &cfg->opt, cfg->batch,
		                              cfg->accumulate > 1 ? cfg->accumulate : 1, s->R,
		                              &cfg->policy, &s->plan, err);
	}
	if (st == TS_OK && s->R > 1)
		st = ts_comm_new(cfg->devs, s->R, &s->comm, err);
	if (st != TS_OK)
		goto out_fail;
	for (int i = 0; i < s->plan.nbufs; i++)
		if (s->plan.bufs[i].cls != TS_PB_TEMP)
			s->slot_of[s->plan.bufs[i].role] = i;
	for (int k = 0; k < s->R && st == TS_OK; k++) {
		struct lane *l = &s->ln[k];

		l->args = calloc((size_t)s->plan.nbufs + 1, sizeof *l->args);
		l->outs = calloc((size_t)s->plan.nbufs + 1, sizeof *l->outs);
		if (!l->args || !l->outs) {
			st = ts_error_oom(err, "no memory to bind a step");
			break;
		}
		id = ts_device_props(l->dev)->id;
		l->env.dev = l->dev;
		l->env.device_space = ts_memory_find(cfg->memory, id, TS_MEM_DEVICE);
		l->env.pinned_space = ts_memory_find(cfg->memory, id, TS_MEM_PINNED_HOST);
		if (!l->env.device_space || !l->env.pinned_space) {
			st = ts_error_set(err, TS_FAILED_PRECONDITION, "NO_MEMORY_SPACE",
			                  "device '%s' has no device or pinned_host memory to train in",
			                  id);
			break;
		}
		st = ts_kernels_new(l->dev, &l->kernels, err);
		l->env.kernels = l->kernels;
		if (st == TS_OK)
			st = ts_queue_new(l->dev, &l->env.compute, err);
		if (st == TS_OK)
			st = ts_queue_new(l->dev, &l->env.h2d, err);
		if (st == TS_OK)
			st = ts_queue_new(l->dev, &l->env.d2h, err);
		/* data parallel: the collectives beside the backward pass */
		if (st == TS_OK && s->R > 1)
			st = ts_queue_new(l->dev, &l->env.comm, err);
		if (st != TS_OK)
			break;
		ts_queue_set_label(l->env.compute, "step compute");
		ts_queue_set_label(l->env.h2d, "step h2d");
		ts_queue_set_label(l->env.d2h, "step d2h");
		if (l->env.comm)
			ts_queue_set_label(l->env.comm, "step comm");
	}
	if (st != TS_OK)
		goto out_fail;
	*out = s;
	return TS_OK;

out_fail:
	ts_session_free(s);
	return st;
}

void ts_session_free(struct ts_session *s)
{
	if (!s)
		return;
	for (int r = 0; r < s->R; r++) {
		struct lane *l = &s->ln[r];

		if (l->env.compute)
			ts_queue_free(l->env.compute);
		if (l->env.h2d)
			ts_queue_free(l->env.h2d);     /* waits for staging copies */
		if (l->env.d2h)
			ts_queue_free(l->env.d2h);
		if (l->env.comm)
			ts_queue_free(l->env.comm);
		if (l->stage_q)
			ts_queue_free(l->stage_q);     /* waits for the next batch's copies */
		ts_kernels_free(l->kernels);
		for (int k = 0; k < 2; k++) {
			if (l->staged[k])
				ts_space_release(l->env.device_space, l->staged[k], l->staged_bytes[k]);
			if (l->spare[k])
				ts_space_release(l->env.device_space, l->spare[k], l->staged_bytes[k]);
		}
		free(l->args);
		free(l->outs);
	}
	ts_comm_free(s->comm);
	free(s->report.losses);
	free(s->report.grad_norms);
	free(s->report.learning_rates);
	ts_plan_release(&s->plan);
	free(s);
}

const struct ts_plan *ts_session_plan(const struct ts_session *s)
{
	return &s->plan;
}

bool ts_session_has_role(const struct ts_session *s, enum ts_pbuf_role role)
{
	return slot(s, role) >= 0;
}

bool ts_session_versioned(const struct ts_session *s, enum ts_pbuf_role role)
{
	int i = slot(s, role);

	return i >= 0 && s->plan.bufs[i].versioned;
}

bool ts_session_slot(const struct ts_session *s, enum ts_pbuf_role role, uint64_t *bytes,
                     enum ts_memory_kind *kind)
{
	int i = slot(s, role);

	if (i < 0)
		return false;
	if (bytes)
		*bytes = s->plan.bufs[i].bytes;
	if (kind)
		*kind = s->plan.bufs[i].kind;
	return true;
}

int ts_session_replicas(const struct ts_session *s)
{
	return s->R;
}

ts_status ts_session_bind(struct ts_session *s, enum ts_pbuf_role role, void *mem,
                          uint64_t bytes, enum ts_memory_kind kind, struct ts_error *err)
{
	return ts_session_bind_replica(s, 0, role, mem, bytes, kind, err);
}

ts_status ts_session_bind_replica(struct ts_session *s, int replica, enum ts_pbuf_role role,
                                  void *mem, uint64_t bytes, enum ts_memory_kind kind,
                                  struct ts_error *err)
{
	int i = slot(s, role);

	if (i < 0)
		return no_slot(role, err);
	if (replica < 0 || replica >= s->R)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "'%s': replica %d of %d", role_name(role), replica, s->R);
	if (!mem || bytes != s->plan.bufs[i].bytes || kind != s->plan.bufs[i].kind)
		return ts_error_set(err, TS_FAILED_PRECONDITION, "BAD_BINDING",
		                    "'%s' does not match the step plan: %llu bytes in %s, the plan "
		                    "wants %llu bytes in %s", role_name(role), (unsigned long long)bytes,
		                    ts_memory_kind_name(kind),
		                    (unsigned long long)s->plan.bufs[i].bytes,
		                    ts_memory_kind_name(s->plan.bufs[i].kind));
	s->ln[replica].args[i] = mem;
	return TS_OK;
}

/* Whether memory of (dev, kind) is host memory (a copy from it is h2d). */
static bool host_memory(struct ts_device *dev, enum ts_memory_kind kind)
{
	return kind != TS_MEM_DEVICE || ts_device_props(dev)->backend == TS_BACKEND_CPU;
}

/* The first of n ids (of width w) outside [0, vocab) into *bad, its index
 * into *at; false when all are in. */
static bool first_bad_id(const char *ids, uint64_t n, int w, int vocab, int64_t *bad,
                         uint64_t *at)
{
	for (uint64_t i = 0; i < n; i++) {
		int64_t v;

		if (w == 2) {
			uint16_t u;

			memcpy(&u, ids + 2 * i, 2);
			v = u;
		} else {
			int32_t x;

			memcpy(&x, ids + 4 * i, 4);
			v = x;
		}
		if (v < 0 || v >= vocab) {
			*bad = v;
			*at = i;
			return true;
		}
	}
	return false;
}

static ts_status bad_id(const struct ts_session *s, enum ts_pbuf_role role, uint64_t row_bytes,
                        int64_t v, uint64_t at, struct ts_error *err)
{
	uint64_t per = row_bytes / (uint64_t)s->plan.mlp.id_bytes;

	if (!per)
		per = 1;
	ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TOKEN",
	             "%s: token id %lld (row %llu of the batch, position %llu) is outside the "
	             "vocabulary [0, %d)", role_name(role), (long long)v,
	             (unsigned long long)(at / per), (unsigned long long)(at % per),
	             s->plan.mlp.vocab);
	ts_error_meta(err, "token_id", "%lld", (long long)v);
	return TS_INVALID_ARGUMENT;
}

/*
 * Token models: every id staged for role is inside the vocabulary, checked
 * before any step - on the source where the host reads it (host memory),
 * else on a copy of the staged ids read back.
 */
static ts_status check_ids(struct ts_session *s, struct lane *l, enum ts_pbuf_role role,
                           const struct ts_session_source *src, const void *staged,
                           struct ts_error *err)
{
	int w = s->plan.mlp.id_bytes, vocab = s->plan.mlp.vocab;
	uint64_t off, len, at = 0, bad_at;
	struct ts_rows_iter it;
	int64_t v;
	char *h;
	ts_status st;

	if (!ts_mlp_tokens(&s->plan.mlp))
		return TS_OK;
	if (!staged) {
		if (!src->rows)
			return first_bad_id(src->mem, src->bytes / (uint64_t)w, w, vocab, &v, &bad_at) ?
			       bad_id(s, role, src->row_bytes, v, bad_at, err) : TS_OK;
		ts_rows_iter_init(&it, src->rows, src->nrows, src->row_bytes);
		while (ts_rows_iter_next(&it, &off, &len)) {
			if (first_bad_id((const char *)src->mem + off, len / (uint64_t)w, w, vocab, &v,
			                 &bad_at))
				return bad_id(s, role, src->row_bytes, v, at + bad_at, err);
			at += len / (uint64_t)w;
		}
		return TS_OK;
	}
	len = s->plan.bufs[slot(s, role)].bytes;
	h = malloc(len ? len : 1);
	if (!h)
		return ts_error_oom(err, "no memory to check %llu bytes of token ids", (unsigned long long)len);
	st = ts_queue_copy(l->env.d2h, h, staged, len, TS_COPY_D2H, err);
	if (st == TS_OK)
		st = ts_queue_sync(l->env.d2h, err);
	else
		ts_queue_sync(l->env.d2h, NULL);
	if (st == TS_OK && first_bad_id(h, len / (uint64_t)w, w, vocab, &v, &bad_at))
		st = bad_id(s, role, src->row_bytes, v, bad_at, err);
	free(h);
	return st;
}

/* Enqueues on q the copies of src's selected rows (all of it when none)
 * into mem. */
static ts_status enqueue_rows(struct ts_queue *q, void *mem, const struct ts_session_source *src,
                              bool from_host, uint64_t want, struct ts_error *err)
{
	enum ts_copy_kind kind = from_host ? TS_COPY_H2D : TS_COPY_D2D;
	uint64_t off, len, at = 0;
	struct ts_rows_iter it;
	ts_status st = TS_OK;

	if (!src->rows)
		return ts_queue_copy(q, mem, src->mem, want, kind, err);
	ts_rows_iter_init(&it, src->rows, src->nrows, src->row_bytes);
	while (st == TS_OK && ts_rows_iter_next(&it, &off, &len)) {
		st = ts_queue_copy(q, (char *)mem + at, (const char *)src->mem + off, len, kind, err);
		at += len;
	}
	return st;
}

/* Copies src's selected rows into mem on the h2d queue, and waits. */
static ts_status copy_rows(struct lane *l, void *mem, const struct ts_session_source *src,
                           bool from_host, uint64_t want, struct ts_error *err)
{
	ts_status st = enqueue_rows(l->env.h2d, mem, src, from_host, want, err);

	if (st == TS_OK)
		return ts_queue_sync(l->env.h2d, err);
	ts_queue_sync(l->env.h2d, NULL);    /* the copies enqueued are done with mem */
	return st;
}

/* The staged bytes src gives, checked against the plan's buffer i (on
 * every replica: the whole batch is each one's rows, one after another). */
static ts_status stage_check(const struct ts_session *s, enum ts_pbuf_role role, int i,
                             const struct ts_session_source *src, struct ts_error *err)
{
	uint64_t want = s->plan.bufs[i].bytes * (uint64_t)s->R;
	uint64_t have = src->rows ? (uint64_t)src->nrows * src->row_bytes : src->bytes;

	if (have != want || (src->rows && src->row_bytes == 0) ||
	    (src->rows && src->nrows % (size_t)s->R))
		return ts_error_set(err, TS_FAILED_PRECONDITION, "BAD_BINDING",
		                    "'%s' stages %llu bytes; the step plan wants %llu", role_name(role),
		                    (unsigned long long)have, (unsigned long long)want);
	return TS_OK;
}

/* Replica k's part of a checked source: its rows of the batch. */
static struct ts_session_source lane_source(const struct ts_session *s,
                                            const struct ts_session_source *src, int k)
{
	struct ts_session_source part = *src;

	if (s->R == 1)
		return part;
	if (src->rows) {
		part.nrows = src->nrows / (size_t)s->R;
		part.rows = src->rows + (size_t)k * part.nrows;
	} else {
		part.bytes = src->bytes / (uint64_t)s->R;
		part.mem = (const char *)src->mem + (uint64_t)k * part.bytes;
	}
	return part;
}

static void count_staged(struct ts_session *s, bool from_host, uint64_t bytes)
{
	if (from_host) {
		s->report.staged_h2d_bytes += bytes;
		s->report.h2d_bytes += bytes;
	}
}

/* Stages replica l's part of role (a checked source of its rows). */
static ts_status stage_lane(struct ts_session *s, struct lane *l, enum ts_pbuf_role role,
                            const struct ts_session_source *src, struct ts_error *err)
{
	int i = slot(s, role), k = role == TS_ROLE_TARGET ? 1 : 0;
	uint64_t want = s->plan.bufs[i].bytes;
	bool from_host = host_memory(src->src_dev, src->src_kind);
	void *mem = NULL;
	ts_status st;

	if (from_host) {
		st = check_ids(s, l, role, src, NULL, err);
		if (st != TS_OK)
			return st;
	}
	if (!src->rows && src->src_dev == l->dev && src->src_kind == TS_MEM_DEVICE &&
	    !host_memory(src->src_dev, src->src_kind)) {
		st = check_ids(s, l, role, src, src->mem, err);
		if (st == TS_OK)
			l->args[i] = (void *)src->mem;     /* already where the step reads it */
		return st;
	}
	st = ts_space_alloc(l->env.device_space, want, &mem, err);
	if (st != TS_OK)
		return st;
	st = copy_rows(l, mem, src, from_host, want, err);
	if (st == TS_OK && !from_host)
		st = check_ids(s, l, role, src, mem, err);
	if (st != TS_OK) {
		ts_space_release(l->env.device_space, mem, want);
		return st;
	}
	l->staged[k] = mem;
	l->staged_bytes[k] = want;
	l->args[i] = mem;
	count_staged(s, from_host, want);
	return TS_OK;
}

ts_status ts_session_stage(struct ts_session *s, enum ts_pbuf_role role,
                           const struct ts_session_source *src, struct ts_error *err)
{
	int i = slot(s, role), k = role == TS_ROLE_TARGET ? 1 : 0;
	ts_status st;

	if (i < 0 || (role != TS_ROLE_INPUT && role != TS_ROLE_TARGET))
		return no_slot(role, err);
	if (s->ln[0].staged[k])
		return ts_error_set(err, TS_FAILED_PRECONDITION, "ALREADY_STAGED",
		                    "'%s' is staged already", role_name(role));
	st = stage_check(s, role, i, src, err);
	for (int r = 0; r < s->R && st == TS_OK; r++) {
		struct ts_session_source part = lane_source(s, src, r);

		st = stage_lane(s, &s->ln[r], role, &part, err);
	}
	if (st != TS_OK)
		ts_session_unstage(s, role);     /* the replicas staged so far */
	return st;
}

/*
 * Starts staging the batch of the run's step n into the spare buffers, on
 * the stage queue, while the step before computes: the hooks give the
 * sources; the copies are waited for by prestage_finish.
 */
static ts_status prestage_start(struct ts_session *s, const struct ts_session_hooks *h,
                                void *arg, uint64_t n, struct ts_error *err)
{
	static const enum ts_pbuf_role roles[2] = {TS_ROLE_INPUT, TS_ROLE_TARGET};
	ts_status st = TS_OK;

	for (int r = 0; r < s->R && st == TS_OK; r++) {
		struct lane *l = &s->ln[r];

		if (!l->stage_q) {
			st = ts_queue_new(l->dev, &l->stage_q, err);
			if (st == TS_OK)
				ts_queue_set_label(l->stage_q, "step staging");
		}
	}
	for (int k = 0; k < 2 && st == TS_OK; k++) {
		struct ts_session_source src;
		int i = slot(s, roles[k]);

		if (i < 0 || !s->ln[0].staged[k])
			continue;
		st = h->batch(arg, n, roles[k], &src, err);
		if (st == TS_OK)
			st = stage_check(s, roles[k], i, &src, err);
		for (int r = 0; r < s->R && st == TS_OK; r++) {
			struct lane *l = &s->ln[r];
			struct ts_session_source part = lane_source(s, &src, r);
			bool from_host = host_memory(part.src_dev, part.src_kind);

			if (!l->spare[k]) {
				st = ts_space_alloc(l->env.device_space, l->staged_bytes[k], &l->spare[k],
				                    err);
				if (st != TS_OK)
					break;
				s->report.spare_bytes += l->staged_bytes[k];
			}
			/* token ids in device memory are checked once copied */
			l->spare_check[k] = from_host ? 0 : part.row_bytes ? part.row_bytes : 1;
			s->pending = true;
			/* token ids in host memory are checked where they are; a bad
			 * one fails the run as its step is due, not this step */
			if (from_host && s->next_err.status == TS_OK &&
			    check_ids(s, l, roles[k], &part, NULL, &s->next_err) != TS_OK)
				continue;
			st = enqueue_rows(l->stage_q, l->spare[k], &part, from_host, l->staged_bytes[k],
			                  err);
			if (st == TS_OK)
				count_staged(s, from_host, l->staged_bytes[k]);
		}
	}
	return st;
}

/* Waits for the next batch's copies; with swap, it becomes the batch. */
static ts_status prestage_finish(struct ts_session *s, bool swap, struct ts_error *err)
{
	static const enum ts_pbuf_role roles[2] = {TS_ROLE_INPUT, TS_ROLE_TARGET};
	ts_status st;

	if (!s->pending)
		return TS_OK;
	s->pending = false;
	st = TS_OK;
	for (int r = 0; r < s->R; r++) {
		ts_status q = ts_queue_sync(s->ln[r].stage_q, swap && st == TS_OK ? err : NULL);

		if (st == TS_OK)
			st = q;
	}
	if (st == TS_OK && swap && s->next_err.status != TS_OK) {
		if (err)
			*err = s->next_err;
		st = s->next_err.status;
	}
	ts_error_clear(&s->next_err);
	if (st != TS_OK || !swap)
		return st;
	for (int r = 0; r < s->R; r++) {
		struct lane *l = &s->ln[r];

		for (int k = 0; k < 2; k++) {
			struct ts_session_source src = {.row_bytes = l->spare_check[k]};

			if (slot(s, roles[k]) < 0 || !l->spare[k] || !l->spare_check[k])
				continue;
			st = check_ids(s, l, roles[k], &src, l->spare[k], err);
			if (st != TS_OK)
				return st;
		}
	}
	for (int r = 0; r < s->R; r++) {
		struct lane *l = &s->ln[r];

		for (int k = 0; k < 2; k++) {
			int i = slot(s, roles[k]);
			void *t;

			if (i < 0 || !l->spare[k])
				continue;
			t = l->staged[k];
			l->staged[k] = l->spare[k];
			l->spare[k] = t;
			l->args[i] = l->staged[k];
		}
	}
	return TS_OK;
}

void ts_session_unstage(struct ts_session *s, enum ts_pbuf_role role)
{
	int i = slot(s, role), k = role == TS_ROLE_TARGET ? 1 : 0;

	if (i < 0 || (role != TS_ROLE_INPUT && role != TS_ROLE_TARGET))
		return;
	for (int r = 0; r < s->R; r++) {
		struct lane *l = &s->ln[r];

		if (l->staged[k])
			ts_space_release(l->env.device_space, l->staged[k], l->staged_bytes[k]);
		l->staged[k] = NULL;
		l->staged_bytes[k] = 0;
		l->args[i] = NULL;
	}
}

ts_status ts_session_set_next(struct ts_session *s, enum ts_pbuf_role role, void *mem,
                              struct ts_error *err)
{
	return ts_session_set_next_replica(s, 0, role, mem, err);
}

ts_status ts_session_set_next_replica(struct ts_session *s, int replica,
                                      enum ts_pbuf_role role, void *mem, struct ts_error *err)
{
	int i = slot(s, role);

	if (i < 0)
		return no_slot(role, err);
	if (!s->plan.bufs[i].versioned || !mem || replica < 0 || replica >= s->R)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "'%s' is not updated into new memory (replica %d of %d)",
		                    role_name(role), replica, s->R);
	s->ln[replica].outs[i] = mem;
	return TS_OK;
}

static void add(struct ts_session_report *rep, const struct ts_exec_result *r)
{
	if (r->measured_temp_peak > rep->measured_temp_peak)
		rep->measured_temp_peak = r->measured_temp_peak;
	if (r->measured_host_temp_peak > rep->measured_host_temp_peak)
		rep->measured_host_temp_peak = r->measured_host_temp_peak;
	rep->h2d_bytes += r->h2d_bytes;
	rep->d2h_bytes += r->d2h_bytes;
	rep->wall_s += r->wall_s;
	rep->compute_s += r->compute_s;
	rep->copy_wait_s += r->copy_wait_s;
}

/* The next memory of every versioned role becomes its memory. */
static void advance(struct ts_session *s)
{
	for (int r = 0; r < s->R; r++)
		for (int i = 0; i < s->plan.nbufs; i++) {
			if (!s->plan.bufs[i].versioned)
				continue;
			s->ln[r].args[i] = s->ln[r].outs[i];
			s->ln[r].outs[i] = NULL;
		}
}


ts_status ts_session_run(struct ts_session *s, uint64_t steps, uint64_t first_t,
                         const struct ts_session_hooks *hooks, void *arg,
                         struct ts_error *err)
{
	ts_status st = TS_OK;

	if (first_t < 1 || first_t + steps > (uint64_t)INT32_MAX)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_STEPS",
		                    "step count %llu is out of range", (unsigned long long)first_t);
	if (s->report.steps + steps > s->cap) {
		size_t cap = (size_t)(s->report.steps + steps);
		float **per[3] = {&s->report.losses, &s->report.grad_norms,
		                  &s->report.learning_rates};

		for (int k = 0; k < 3; k++) {
			float *g = realloc(*per[k], (cap ? cap : 1) * sizeof *g);

			if (!g)
				return ts_error_oom(err, "no memory for %llu losses",
				                    (unsigned long long)steps);
			*per[k] = g;
		}
		s->cap = cap;
	}
	for (uint64_t n = 0; n < steps && st == TS_OK; n++) {
		struct ts_exec_result res[TS_PLAN_REPLICAS_MAX], r;
		void *const *args[TS_PLAN_REPLICAS_MAX], *const *outs[TS_PLAN_REPLICAS_MAX];

		if (hooks && hooks->cancelled && hooks->cancelled(arg)) {
			st = ts_error_set(err, TS_CANCELLED, "CANCELLED",
			                  "the steps were cancelled after %llu", (unsigned long long)n);
			break;
		}
		/* a data-driven run: this step's batch, staged meanwhile; the
		 * next one starts on its way while this one computes */
		if (hooks && hooks->batch && n > 0)
			st = prestage_finish(s, true, err);
		if (st == TS_OK && hooks && hooks->prepare)
			st = hooks->prepare(arg, s, err);
		if (st == TS_OK && hooks && hooks->batch && n + 1 < steps)
			st = prestage_start(s, hooks, arg, n + 1, err);
		if (st == TS_OK) {
			struct ts_exec_env envs[TS_PLAN_REPLICAS_MAX];

			for (int k = 0; k < s->R; k++) {
				envs[k] = s->ln[k].env;
				args[k] = s->ln[k].args;
				outs[k] = s->ln[k].outs;
			}
			st = ts_exec_run_replicas(&s->plan, envs, s->R, s->comm, args, outs,
			                          (int)(first_t + n), res, err);
		}
		if (st != TS_OK) {
			/* the next memory was not used: the caller drops it */
			for (int k = 0; k < s->R; k++)
				for (int i = 0; i < s->plan.nbufs; i++)
					s->ln[k].outs[i] = NULL;
			break;
		}
		/* the replicas' step: the mean of their losses (each its rows'),
		 * their bytes summed, the slowest's times; per device apart */
		r = res[0];
		for (int k = 1; k < s->R; k++) {
			r.loss += res[k].loss;
			r.h2d_bytes += res[k].h2d_bytes;
			r.d2h_bytes += res[k].d2h_bytes;
			r.wall_s = res[k].wall_s > r.wall_s ? res[k].wall_s : r.wall_s;
			r.compute_s = res[k].compute_s > r.compute_s ? res[k].compute_s : r.compute_s;
			r.copy_wait_s = res[k].copy_wait_s > r.copy_wait_s ? res[k].copy_wait_s
			                                                   : r.copy_wait_s;
		}
		if (s->R > 1)
			r.loss /= (float)s->R;
		for (int k = 0; k < s->R; k++) {
			s->report.replica_compute_s[k] += res[k].compute_s;
			s->report.replica_comm_s[k] += res[k].comm_s;
			s->report.replica_comm_wait_s[k] += res[k].comm_wait_s;
		}
		s->report.allreduce_bytes += s->plan.all_reduce_bytes;
		add(&s->report, &r);
		s->report.grad_norms[s->report.steps] = r.grad_norm;
		s->report.learning_rates[s->report.steps] =
			s->cfg.evaluate || s->cfg.opt.type == TS_OPT_NONE
				? NAN : ts_optimizer_learning_rate(&s->cfg.opt, first_t + n);
		s->report.losses[s->report.steps++] = r.loss;
		if (hooks && hooks->publish)
			st = hooks->publish(arg, s, r.loss, err);
		advance(s);
	}
	/* a next batch still on its way is not needed */
	prestage_finish(s, false, NULL);
	return st;
}

const struct ts_session_report *ts_session_report(const struct ts_session *s)
{
	return &s->report;
}
