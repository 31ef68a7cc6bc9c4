/*
 * test_model_registry.c - Check suite "model_registry": the model registry
 * of train/model.h and the names and shapes of a model's arrays: uids
 * never given twice (a model created again under a name is another
 * model), names unique, records copied out, readiness and the creating
 * operation, the step counter by uid, listing in name order, and the
 * roles, array names and shapes of MLP and token models.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/unit.h"
#include "train/model.h"

static struct ts_model_registry *reg;
static struct ts_error err;

static void setup(void)
{
	ts_error_clear(&err);
	reg = ts_model_registry_new();
	ck_assert_ptr_nonnull(reg);
}

static void teardown(void)
{
	ts_model_registry_free(reg);
}

static struct ts_model model(const char *name)
{
	struct ts_model m = {.mlp = {.layers = 3, .d_model = 4, .d_hidden = 6,
	                             .loss = TS_LOSS_MSE},
	                     .opt = {.type = TS_OPT_ADAM}};

	snprintf(m.name, sizeof m.name, "%s", name);
	return m;
}

START_TEST(test_put_gives_new_uids_and_refuses_taken_names)
{
	struct ts_model a = model("a"), b = model("b"), got;
	uint64_t ua = 0, ub = 0, ua2 = 0;

	ck_assert_int_eq(ts_model_registry_put(reg, &a, &ua, &err), TS_OK);
	ck_assert_int_eq(ts_model_registry_put(reg, &b, &ub, &err), TS_OK);
	ck_assert_uint_ne(ua, 0);
	ck_assert_uint_ne(ua, ub);
	ck_assert_int_eq(ts_model_registry_put(reg, &a, NULL, &err), TS_ALREADY_EXISTS);
	ck_assert_str_eq(err.reason, "MODEL_EXISTS");
	/* a model created again under its name is another model */
	ck_assert(ts_model_registry_remove(reg, ua));
	ck_assert(!ts_model_registry_remove(reg, ua));
	ck_assert(!ts_model_registry_get(reg, "a", &got));
	ck_assert_int_eq(ts_model_registry_put(reg, &a, &ua2, &err), TS_OK);
	ck_assert_uint_ne(ua2, ua);
	ck_assert_uint_ne(ua2, ub);
	ck_assert(ts_model_registry_get(reg, "a", &got));
	ck_assert_uint_eq(got.uid, ua2);
	/* what refers to the old uid reaches nothing */
	ck_assert(!ts_model_registry_add_steps(reg, ua, 1, NULL));
	ck_assert(!ts_model_registry_set_ready(reg, ua, true, NULL));
}
END_TEST

START_TEST(test_records_are_copies)
{
	struct ts_model a = model("a"), got;
	uint64_t uid = 0;

	ck_assert_int_eq(ts_model_registry_put(reg, &a, &uid, &err), TS_OK);
	a.mlp.layers = 99;                        /* the caller's copy changes */
	ck_assert(ts_model_registry_get(reg, "a", &got));
	ck_assert_int_eq(got.mlp.layers, 3);
	got.steps = 1234;                         /* so does the copy taken out */
	ck_assert(ts_model_registry_get(reg, "a", &got));
	ck_assert_uint_eq(got.steps, 0);
}
END_TEST

START_TEST(test_readiness_names_the_creating_operation)
{
	struct ts_model a = model("a"), got;
	uint64_t uid = 0;

	ck_assert_int_eq(ts_model_registry_put(reg, &a, &uid, &err), TS_OK);
	ck_assert(ts_model_registry_set_ready(reg, uid, false, "op-0123"));
	ck_assert(ts_model_registry_get(reg, "a", &got));
	ck_assert(!got.ready);
	ck_assert_str_eq(got.creating, "op-0123");
	ck_assert(ts_model_registry_set_ready(reg, uid, true, "ignored"));
	ck_assert(ts_model_registry_get(reg, "a", &got));
	ck_assert(got.ready);
	ck_assert_str_eq(got.creating, "");
}
END_TEST

START_TEST(test_add_steps_counts_by_uid)
{
	struct ts_model a = model("a"), b = model("b"), got;
	uint64_t ua = 0, ub = 0, before = 99;

	a.steps = 10;                              /* a resumed model's count */
	ck_assert_int_eq(ts_model_registry_put(reg, &a, &ua, &err), TS_OK);
	ck_assert_int_eq(ts_model_registry_put(reg, &b, &ub, &err), TS_OK);
	ck_assert(ts_model_registry_add_steps(reg, ua, 3, &before));
	ck_assert_uint_eq(before, 10);
	ck_assert(ts_model_registry_step_count(reg, ua, &before));
	ck_assert_uint_eq(before, 13);
	ck_assert(ts_model_registry_get(reg, "b", &got));
	ck_assert_uint_eq(got.steps, 0);
	ts_model_registry_record_step(reg, 1000);
	ts_model_registry_record_step(reg, 2000);
	{
		struct ts_histogram_snapshot h;

		ts_histogram_read(ts_model_registry_step_times(reg), &h);
		ck_assert_uint_eq(h.count, 2);
	}
}
END_TEST

START_TEST(test_list_in_name_order)
{
	static const char *const names[] = {"delta", "alpha", "charlie", "bravo"};
	struct ts_model out[8];
	size_t n;

	for (size_t i = 0; i < 4; i++) {
		struct ts_model m = model(names[i]);

		ck_assert_int_eq(ts_model_registry_put(reg, &m, NULL, &err), TS_OK);
	}
	n = ts_model_registry_list(reg, out, 8);
	ck_assert_uint_eq(n, 4);
	ck_assert_str_eq(out[0].name, "alpha");
	ck_assert_str_eq(out[1].name, "bravo");
	ck_assert_str_eq(out[2].name, "charlie");
	ck_assert_str_eq(out[3].name, "delta");
	ck_assert_uint_eq(ts_model_registry_list(reg, out, 2), 2);
	ck_assert_str_eq(out[1].name, "bravo");
}
END_TEST

START_TEST(test_array_names_roles_and_shapes)
{
	struct ts_model m = model("net"), tok = model("gpt"), none = model("plain");
	uint64_t shape[3];
	char name[256], owner[160];

	ts_model_array_name(&m, TS_ROLE_W1, name, sizeof name);
	ck_assert_str_eq(name, "net.w1");
	ts_model_array_name(&m, TS_ROLE_NU_W2, name, sizeof name);
	ck_assert_str_eq(name, "net.adam.nu.w2");
	ts_model_owner(&m, owner, sizeof owner);
	ck_assert_str_eq(owner, "model 'net'");
	ck_assert_int_eq(ts_model_param_shape(&m, TS_ROLE_W1, shape), 3);
	ck_assert_uint_eq(shape[0], 3);
	ck_assert_uint_eq(shape[1], 4);
	ck_assert_uint_eq(shape[2], 6);
	ck_assert_int_eq(ts_model_param_shape(&m, TS_ROLE_MU_W2, shape), 3);
	ck_assert_uint_eq(shape[1], 6);
	ck_assert_uint_eq(shape[2], 4);
	ck_assert(ts_model_has_role(&m, TS_ROLE_MU_W1));
	ck_assert(!ts_model_has_role(&m, TS_ROLE_EMBED));
	/* no optimizer state without an optimizer that keeps it */
	none.opt.type = TS_OPT_SGD;
	ck_assert(ts_model_has_role(&none, TS_ROLE_W2));
	ck_assert(!ts_model_has_role(&none, TS_ROLE_MU_W1));
	/* a token model: an embedding table [vocab, d] and its state */
	tok.mlp.vocab = 50;
	tok.mlp.loss = TS_LOSS_XENT;
	ck_assert(ts_mlp_tokens(&tok.mlp));
	ck_assert(ts_model_has_role(&tok, TS_ROLE_EMBED));
	ck_assert(ts_model_has_role(&tok, TS_ROLE_MU_EMBED));
	ts_model_array_name(&tok, TS_ROLE_EMBED, name, sizeof name);
	ck_assert_str_eq(name, "gpt.embed");
	ck_assert_int_eq(ts_model_param_shape(&tok, TS_ROLE_EMBED, shape), 2);
	ck_assert_uint_eq(shape[0], 50);
	ck_assert_uint_eq(shape[1], 4);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("model_registry");
	TCase *c = tcase_create("registry");

	tcase_add_checked_fixture(c, setup, teardown);
	tcase_add_test(c, test_put_gives_new_uids_and_refuses_taken_names);
	tcase_add_test(c, test_records_are_copies);
	tcase_add_test(c, test_readiness_names_the_creating_operation);
	tcase_add_test(c, test_add_steps_counts_by_uid);
	tcase_add_test(c, test_list_in_name_order);
	tcase_add_test(c, test_array_names_roles_and_shapes);
	suite_add_tcase(s, c);
	return s;
}
