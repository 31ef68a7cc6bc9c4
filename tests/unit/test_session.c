/*
 * test_session.c - Check suite "session": the training session of
 * train/session.h on sim:0, without HTTP: roles bound by name, inputs and
 * targets staged from pinned_host rows (counted as h2d) giving the same
 * losses as the same batch already on the device, the versions of
 * offloaded weights handed over before and published after every step, a
 * failed step that leaves every bound array and the next memory untouched,
 * cancellation between steps, and bindings that do not match the plan.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"
#include "tests/unit/unit.h"
#include "train/session.h"

static struct ts_device_set *set;
static struct ts_device *dev;
static struct ts_memory *mem;
static struct ts_space *dsp, *psp;
static struct ts_error err;

#define OK(call) TS_UNIT_OK(err, call)

static void setup(void)
{
	static const struct ts_unit_sim_config sim = {.devices = 1, .device_memory = 128ull << 20,
	                                              .device_fraction = 1.0,
	                                              .pinned = 128ull << 20, .unpinned = 32ull << 20,
	                                              .segment = 16ull << 20};

	ts_error_clear(&err);
	ts_unit_sim_new(&sim, &set, &mem, NULL);
	dev = ts_device_set_find(set, "sim:0");
	ck_assert_ptr_nonnull(dev);
	dsp = ts_memory_find(mem, "sim:0", TS_MEM_DEVICE);
	psp = ts_memory_find(mem, "sim:0", TS_MEM_PINNED_HOST);
}

static void teardown(void)
{
	ts_unit_sim_free(set, mem, NULL);
}

static uint64_t in_use(struct ts_space *sp)
{
	struct ts_space_stats s;

	ts_space_stats(sp, &s);
	return s.bytes_in_use;
}

static const struct ts_mlp mlp = {.layers = 3, .d_model = 16, .d_hidden = 24,
                                  .act = TS_ACT_GELU, .residual = true, .loss = TS_LOSS_MSE};
static const struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f,
                                         .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f};

#define ROWS 40       /* the dataset */
#define BATCH 8

/* The model's memory by role, the dataset, and what the hooks saw. */
struct model {
	enum ts_memory_kind params;
	void *role[TS_ROLE_COUNT];          /* current memory of each parameter role */
	uint64_t bytes[TS_ROLE_COUNT];
	void *next[TS_ROLE_COUNT];          /* handed to the session before a step */
	float *data;                        /* [ROWS, d] on pinned_host */
	int prepared, published, cancel_after;
	float losses[16];
};

static const enum ts_pbuf_role params[] = {TS_ROLE_W1, TS_ROLE_W2, TS_ROLE_MU_W1,
                                           TS_ROLE_MU_W2, TS_ROLE_NU_W1, TS_ROLE_NU_W2};

static struct ts_space *space(enum ts_memory_kind k)
{
	return k == TS_MEM_DEVICE ? dsp : psp;
}

static void fill(float *x, size_t n, unsigned seed, float scale)
{
	uint32_t s = seed * 2654435761u + 1;

	for (size_t i = 0; i < n; i++) {
		s = s * 1664525u + 1013904223u;
		x[i] = scale * ((float)(s >> 8) / 16777216.0f - 0.5f);
	}
}

/* Writes host bytes into memory of kind k (sim device memory is host memory). */
static void put(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}

static struct ts_session_config config(const struct model *m)
{
	return (struct ts_session_config){
		.dev = dev, .memory = mem, .mlp = mlp, .opt = adam, .batch = BATCH,
		.policy = {.params = m->params, .opt_state = m->params, .save_x = true,
		           .save_h = true}};
}

static void model_new(struct model *m, enum ts_memory_kind params_kind)
{
	struct ts_session *s;
	struct ts_session_config cfg;

	memset(m, 0, sizeof *m);
	m->params = params_kind;
	m->cancel_after = -1;
	cfg = config(m);
	OK(ts_session_new(&cfg, &s, &err));
	for (size_t i = 0; i < sizeof params / sizeof *params; i++) {
		enum ts_pbuf_role r = params[i];
		enum ts_memory_kind k;
		float *x;

		ck_assert(ts_session_slot(s, r, &m->bytes[r], &k));
		ck_assert_int_eq(k, params_kind);
		OK(ts_space_alloc(space(k), m->bytes[r], &m->role[r], &err));
		x = malloc(m->bytes[r]);
		ck_assert_ptr_nonnull(x);
		if (r <= TS_ROLE_W2)
			fill(x, m->bytes[r] / 4, (unsigned)r + 1, 0.5f);
		else
			memset(x, 0, m->bytes[r]);
		put(m->role[r], x, m->bytes[r]);
		free(x);
	}
	ts_session_free(s);
	OK(ts_space_alloc(psp, ROWS * mlp.d_model * 4, (void **)&m->data, &err));
	fill(m->data, ROWS * (size_t)mlp.d_model, 99, 2.0f);
}

static void model_free(struct model *m)
{
	for (size_t i = 0; i < sizeof params / sizeof *params; i++) {
		enum ts_pbuf_role r = params[i];

		ts_space_release(space(m->params), m->role[r], m->bytes[r]);
		if (m->next[r])
			ts_space_release(space(m->params), m->next[r], m->bytes[r]);
	}
	ts_space_release(psp, m->data, ROWS * mlp.d_model * 4);
}

static bool hook_cancelled(void *arg)
{
	struct model *m = arg;

	return m->cancel_after >= 0 && m->published >= m->cancel_after;
}

static ts_status hook_prepare(void *arg, struct ts_session *s, struct ts_error *e)
{
	struct model *m = arg;

	m->prepared++;
	for (size_t i = 0; i < sizeof params / sizeof *params; i++) {
		enum ts_pbuf_role r = params[i];
		ts_status st;

		if (!ts_session_versioned(s, r))
			continue;
		if (!m->next[r]) {
			st = ts_space_alloc(space(m->params), m->bytes[r], &m->next[r], e);
			if (st != TS_OK)
				return st;
		}
		memset(m->next[r], 0xa5, m->bytes[r]);     /* the step must write all of it */
		st = ts_session_set_next(s, r, m->next[r], e);
		if (st != TS_OK)
			return st;
	}
	return TS_OK;
}

static ts_status hook_publish(void *arg, struct ts_session *s, float loss, struct ts_error *e)
{
	struct model *m = arg;

	(void)e;
	m->losses[m->published++] = loss;
	for (size_t i = 0; i < sizeof params / sizeof *params; i++) {
		enum ts_pbuf_role r = params[i];
		void *t;

		if (!ts_session_versioned(s, r))
			continue;
		t = m->role[r];          /* the old version goes; its memory takes the next */
		m->role[r] = m->next[r];
		m->next[r] = t;
	}
	return TS_OK;
}

static const struct ts_session_hooks hooks = {hook_cancelled, hook_prepare, hook_publish, NULL};

/* A data-driven run's batches: step n's inputs are rows 4n..4n+7 of the
 * dataset (mod ROWS), its targets the rows after them. */
static uint64_t batch_in[BATCH], batch_tgt[BATCH];

static ts_status hook_batch(void *arg, uint64_t n, enum ts_pbuf_role role,
                            struct ts_session_source *src, struct ts_error *e)
{
	struct model *m = arg;
	uint64_t rb = (uint64_t)mlp.d_model * 4, *rows = role == TS_ROLE_INPUT ? batch_in : batch_tgt;

	(void)e;
	for (int j = 0; j < BATCH; j++)
		rows[j] = (4 * n + (uint64_t)j + (role == TS_ROLE_TARGET)) % ROWS;
	*src = (struct ts_session_source){.mem = m->data, .bytes = ROWS * rb, .row_bytes = rb,
	                                  .src_dev = dev, .src_kind = TS_MEM_PINNED_HOST,
	                                  .rows = rows, .nrows = BATCH};
	return TS_OK;
}

static const struct ts_session_hooks batch_hooks = {hook_cancelled, hook_prepare, hook_publish,
                                                    hook_batch};

/* A session over m with inputs rows[i] and targets trows[i] of the
 * dataset (rows NULL: rows 0.. and 1.. of it, copied to device memory). */
static struct ts_session *session_rows(struct model *m, const uint64_t *rows,
                                       const uint64_t *trows, void **dev_copy)
{
	struct ts_session_config cfg = config(m);
	struct ts_session *s;
	uint64_t rb = (uint64_t)mlp.d_model * 4;
	struct ts_session_source in = {.mem = m->data, .bytes = ROWS * rb, .row_bytes = rb,
	                               .src_dev = dev, .src_kind = TS_MEM_PINNED_HOST};
	struct ts_session_source tgt = in;

	OK(ts_session_new(&cfg, &s, &err));
	for (size_t i = 0; i < sizeof params / sizeof *params; i++)
		OK(ts_session_bind(s, params[i], m->role[params[i]], m->bytes[params[i]], m->params,
		                   &err));
	if (rows) {
		in.rows = rows;
		in.nrows = BATCH;
		tgt.rows = trows;
		tgt.nrows = BATCH;
		OK(ts_session_stage(s, TS_ROLE_INPUT, &in, &err));
		OK(ts_session_stage(s, TS_ROLE_TARGET, &tgt, &err));
	} else {
		/* the same batch, laid out on the device by the caller */
		OK(ts_space_alloc(dsp, 2 * BATCH * rb, dev_copy, &err));
		memcpy(*dev_copy, m->data, BATCH * rb);
		memcpy((char *)*dev_copy + BATCH * rb, (char *)m->data + rb, BATCH * rb);
		in = (struct ts_session_source){.mem = *dev_copy, .bytes = BATCH * rb, .row_bytes = rb,
		                                .src_dev = dev, .src_kind = TS_MEM_DEVICE};
		tgt = in;
		tgt.mem = (char *)*dev_copy + BATCH * rb;
		OK(ts_session_stage(s, TS_ROLE_INPUT, &in, &err));
		OK(ts_session_stage(s, TS_ROLE_TARGET, &tgt, &err));
	}
	return s;
}

/* Inputs rows[i], targets rows[i] + 1. */
static struct ts_session *session(struct model *m, const uint64_t *rows, void **dev_copy)
{
	uint64_t trows[BATCH];

	for (int i = 0; rows && i < BATCH; i++)
		trows[i] = rows[i] + 1;
	return session_rows(m, rows, rows ? trows : NULL, dev_copy);
}

START_TEST(test_rows_from_the_host_train_like_the_batch_on_the_device)
{
	static const uint64_t rows[BATCH] = {0, 1, 2, 3, 4, 5, 6, 7};
	enum ts_memory_kind kinds[2] = {TS_MEM_DEVICE, TS_MEM_PINNED_HOST};

	for (int k = 0; k < 2; k++) {
		struct model a, b;
		struct ts_session *sa, *sb;
		void *copy = NULL;
		const struct ts_session_report *ra, *rb;
		uint64_t staged = 2ull * BATCH * mlp.d_model * 4;

		model_new(&a, kinds[k]);
		model_new(&b, kinds[k]);
		sa = session(&a, rows, NULL);
		sb = session(&b, NULL, &copy);
		OK(ts_session_run(sa, 3, 1, &hooks, &a, &err));
		OK(ts_session_run(sb, 3, 1, &hooks, &b, &err));
		ra = ts_session_report(sa);
		rb = ts_session_report(sb);
		ck_assert_uint_eq(ra->steps, 3);
		ck_assert_int_eq(a.published, 3);
		ck_assert_int_eq(a.prepared, 3);
		/* the same numbers, bit for bit */
		ck_assert(memcmp(ra->losses, rb->losses, 3 * sizeof *ra->losses) == 0);
		ck_assert(memcmp(a.losses, ra->losses, 3 * sizeof *ra->losses) == 0);
		ck_assert(ra->losses[2] < ra->losses[0]);
		for (size_t i = 0; i < sizeof params / sizeof *params; i++)
			ck_assert(memcmp(a.role[params[i]], b.role[params[i]], a.bytes[params[i]]) == 0);
		/* staging from pinned_host counts as h2d; the batch already on
		 * the device moves nothing */
		ck_assert_uint_eq(ra->staged_h2d_bytes, staged);
		ck_assert_uint_eq(rb->staged_h2d_bytes, 0);
		ck_assert_uint_eq(ra->h2d_bytes, rb->h2d_bytes + staged);
		ck_assert_uint_eq(ra->measured_temp_peak, ts_session_plan(sa)->temp_size_in_bytes);
		ts_session_free(sa);
		ts_session_free(sb);
		ts_space_release(dsp, copy, 2ull * BATCH * mlp.d_model * 4);
		model_free(&a);
		model_free(&b);
	}
}
END_TEST

/* Rows in any order, repeated, stage exactly those rows: the same as a
 * dataset laid out in that order beforehand. */
START_TEST(test_repeated_and_reordered_rows_stage_exactly_those_rows)
{
	static const uint64_t rows[BATCH] = {5, 5, 0, 9, 8, 7, 30, 2};
	static const uint64_t in_rows[BATCH] = {0, 1, 2, 3, 4, 5, 6, 7};
	static const uint64_t tgt_rows[BATCH] = {8, 9, 10, 11, 12, 13, 14, 15};
	uint64_t rb = (uint64_t)mlp.d_model * 4;
	struct model m, n;
	struct ts_session *s, *t;

	model_new(&m, TS_MEM_DEVICE);
	model_new(&n, TS_MEM_DEVICE);
	for (int i = 0; i < BATCH; i++) {
		memcpy((char *)n.data + i * rb, (char *)m.data + rows[i] * rb, rb);
		memcpy((char *)n.data + (BATCH + i) * rb, (char *)m.data + (rows[i] + 1) * rb, rb);
	}
	s = session(&m, rows, NULL);
	t = session_rows(&n, in_rows, tgt_rows, NULL);
	OK(ts_session_run(s, 2, 1, &hooks, &m, &err));
	OK(ts_session_run(t, 2, 1, &hooks, &n, &err));
	ck_assert(memcmp(ts_session_report(s)->losses, ts_session_report(t)->losses,
	                 2 * sizeof(float)) == 0);
	for (size_t i = 0; i < sizeof params / sizeof *params; i++)
		ck_assert(memcmp(m.role[params[i]], n.role[params[i]], m.bytes[params[i]]) == 0);
	ts_session_free(s);
	ts_session_free(t);
	model_free(&m);
	model_free(&n);
}
END_TEST

START_TEST(test_a_failed_step_leaves_every_array_and_publishes_nothing)
{
	static const uint64_t rows[BATCH] = {0, 1, 2, 3, 4, 5, 6, 7};
	enum ts_memory_kind kinds[2] = {TS_MEM_DEVICE, TS_MEM_PINNED_HOST};

	for (int k = 0; k < 2; k++) {
		struct model m;
		struct ts_session *s;
		unsigned char *before[TS_ROLE_COUNT] = {NULL};
		uint64_t dev0, host0;
		ts_status st;

		model_new(&m, kinds[k]);
		s = session(&m, rows, NULL);
		OK(ts_session_run(s, 1, 1, &hooks, &m, &err));
		for (size_t i = 0; i < sizeof params / sizeof *params; i++) {
			enum ts_pbuf_role r = params[i];

			before[r] = malloc(m.bytes[r]);
			memcpy(before[r], m.role[r], m.bytes[r]);
		}
		dev0 = in_use(dsp);
		host0 = in_use(psp);
		/* every copy fails: the step's first one, before any update, or
		 * (offloaded) the ones streaming state after updates began */
		ts__sim_inject_copy_failure(dev, 1000000);
		ts_error_clear(&err);
		st = ts_session_run(s, 2, 2, &hooks, &m, &err);
		ts__sim_inject_copy_failure(dev, 0);
		ck_assert_int_eq(st, TS_INTERNAL);
		ck_assert_str_eq(err.reason, "COPY_FAILED");
		ck_assert_int_eq(m.published, 1);
		ck_assert_uint_eq(ts_session_report(s)->steps, 1);
		ck_assert_uint_eq(in_use(dsp), dev0);
		ck_assert_uint_eq(in_use(psp), host0);
		for (size_t i = 0; i < sizeof params / sizeof *params; i++) {
			enum ts_pbuf_role r = params[i];

			ck_assert_msg(memcmp(before[r], m.role[r], m.bytes[r]) == 0,
			              "%s: role %d changed by a failed step",
			              ts_memory_kind_name(kinds[k]), (int)r);
			free(before[r]);
		}
		/* and it trains on */
		ts_error_clear(&err);
		OK(ts_session_run(s, 1, 2, &hooks, &m, &err));
		ck_assert_int_eq(m.published, 2);
		ts_session_free(s);
		model_free(&m);
	}
}
END_TEST

START_TEST(test_cancelled_between_steps)
{
	static const uint64_t rows[BATCH] = {0, 1, 2, 3, 4, 5, 6, 7};
	struct model m;
	struct ts_session *s;
	ts_status st;

	model_new(&m, TS_MEM_PINNED_HOST);
	m.cancel_after = 2;
	s = session(&m, rows, NULL);
	ts_error_clear(&err);
	st = ts_session_run(s, 5, 1, &hooks, &m, &err);
	ck_assert_int_eq(st, TS_CANCELLED);
	ck_assert_int_eq(m.published, 2);
	ck_assert_uint_eq(ts_session_report(s)->steps, 2);
	ck_assert_ptr_nonnull(strstr(err.message, "after 2"));
	ts_session_free(s);
	model_free(&m);
}
END_TEST

START_TEST(test_bindings_that_do_not_match_the_plan_are_refused)
{
	struct model m;
	struct ts_session_config cfg;
	struct ts_session *s;
	struct ts_session_source src = {0};
	uint64_t dev0;

	model_new(&m, TS_MEM_DEVICE);
	cfg = config(&m);
	OK(ts_session_new(&cfg, &s, &err));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_session_bind(s, TS_ROLE_W1, m.role[TS_ROLE_W1], m.bytes[TS_ROLE_W1] - 4,
	                                 TS_MEM_DEVICE, &err), TS_FAILED_PRECONDITION);
	ck_assert_str_eq(err.reason, "BAD_BINDING");
	ck_assert_ptr_nonnull(strstr(err.message, "'w1'"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_session_bind(s, TS_ROLE_MU_W2, m.role[TS_ROLE_MU_W2],
	                                 m.bytes[TS_ROLE_MU_W2], TS_MEM_PINNED_HOST, &err),
	                 TS_FAILED_PRECONDITION);
	ck_assert_ptr_nonnull(strstr(err.message, "'mu.w2'"));
	/* Adam has no gradient outputs to bind */
	ts_error_clear(&err);
	ck_assert(!ts_session_has_role(s, TS_ROLE_GRAD_W1));
	ck_assert_int_eq(ts_session_bind(s, TS_ROLE_GRAD_W1, m.role[TS_ROLE_W1], m.bytes[TS_ROLE_W1],
	                                 TS_MEM_DEVICE, &err), TS_INVALID_ARGUMENT);
	/* a batch of the wrong size stages nothing */
	dev0 = in_use(dsp);
	src = (struct ts_session_source){.mem = m.data, .bytes = 3 * 64, .row_bytes = 64,
	                                 .src_dev = dev, .src_kind = TS_MEM_PINNED_HOST};
	ts_error_clear(&err);
	ck_assert_int_eq(ts_session_stage(s, TS_ROLE_INPUT, &src, &err), TS_FAILED_PRECONDITION);
	ck_assert_ptr_nonnull(strstr(err.message, "'inputs'"));
	ck_assert_uint_eq(in_use(dsp), dev0);
	/* device weights are updated in place: they take no next memory */
	ts_error_clear(&err);
	ck_assert(!ts_session_versioned(s, TS_ROLE_W1));
	ck_assert_int_eq(ts_session_set_next(s, TS_ROLE_W1, m.role[TS_ROLE_W1], &err),
	                 TS_INVALID_ARGUMENT);
	ts_session_free(s);
	model_free(&m);
}
END_TEST

/* A data-driven run stages each step's batch while the step before
 * computes: the same as one step per call on those rows. */
START_TEST(test_a_batch_per_step_equals_those_rows_step_by_step)
{
	struct model a, b;
	struct ts_session *s;
	float losses[5];
	uint64_t rb = (uint64_t)mlp.d_model * 4;

	model_new(&a, TS_MEM_PINNED_HOST);
	model_new(&b, TS_MEM_PINNED_HOST);
	for (int j = 0; j < BATCH; j++) {
		batch_in[j] = (uint64_t)j;
		batch_tgt[j] = (uint64_t)j + 1;
	}
	s = session_rows(&a, batch_in, batch_tgt, NULL);
	OK(ts_session_run(s, 5, 1, &batch_hooks, &a, &err));
	ck_assert_uint_eq(ts_session_report(s)->steps, 5);
	ck_assert_uint_eq(ts_session_report(s)->spare_bytes, 2 * BATCH * rb);
	ck_assert_uint_eq(ts_session_report(s)->staged_h2d_bytes, 5 * 2 * BATCH * rb);
	memcpy(losses, ts_session_report(s)->losses, sizeof losses);
	ts_session_free(s);
	for (int n = 0; n < 5; n++) {
		uint64_t in[BATCH], tgt[BATCH];

		for (int j = 0; j < BATCH; j++) {
			in[j] = (4 * (uint64_t)n + (uint64_t)j) % ROWS;
			tgt[j] = (4 * (uint64_t)n + (uint64_t)j + 1) % ROWS;
		}
		s = session_rows(&b, in, tgt, NULL);
		OK(ts_session_run(s, 1, 1 + (uint64_t)n, &hooks, &b, &err));
		ck_assert_msg(memcmp(&losses[n], ts_session_report(s)->losses, sizeof(float)) == 0,
		              "step %d: %g, step by step %g", n, (double)losses[n],
		              (double)ts_session_report(s)->losses[0]);
		ts_session_free(s);
	}
	for (size_t i = 0; i < sizeof params / sizeof *params; i++)
		ck_assert(memcmp(a.role[params[i]], b.role[params[i]], a.bytes[params[i]]) == 0);
	model_free(&a);
	model_free(&b);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("session");
	TCase *tc = tcase_create("sim");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_rows_from_the_host_train_like_the_batch_on_the_device);
	tcase_add_test(tc, test_repeated_and_reordered_rows_stage_exactly_those_rows);
	tcase_add_test(tc, test_a_failed_step_leaves_every_array_and_publishes_nothing);
	tcase_add_test(tc, test_cancelled_between_steps);
	tcase_add_test(tc, test_a_batch_per_step_equals_those_rows_step_by_step);
	tcase_add_test(tc, test_bindings_that_do_not_match_the_plan_are_refused);
	suite_add_tcase(s, tc);
	return s;
}
