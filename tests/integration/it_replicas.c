/*
 * it_replicas.c - Check suite "replicas": data-parallel models of a real
 * daemon. A model placed on two devices ("placement": {"devices": [...]})
 * keeps a replica of every array on each; its :step splits the batch
 * between them and all-reduces the gradients, so its losses and weights
 * equal those of the same model on one device stepped on the whole batch
 * (SGD: within float32 summation error); the step reports each device's
 * compute and the bytes all-reduced (the gradients' size, nothing more);
 * :analyze is each device's; a GPT trains on windows of a token stream the
 * same way; an exported checkpoint imports onto one device with the same
 * weights; bad placements and batches that do not split are 4xx naming
 * them.
 *
 * Each test case runs in its own forked process with its own daemon (two
 * sim devices, or the stand-in's GPUs under TS_TEST_BACKEND=cuda).
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static struct th_daemon D;

static void daemon_up(void)
{
	static const char *const args[] = {"--sim-device-memory", "256MiB", NULL};

	th_daemon_start(&D, args);
	ck_assert_msg(th_daemon_has_device(&D, th_dev(1)), "data parallel needs %s", th_dev(1));
}

static void daemon_down(void)
{
	th_daemon_stop_ok(&D);
}

/* A model spec of kind `what` (an "mlp" or "gpt" object, the loss and
 * optimizer) placed by `placement`. */
static char *spec(const char *name, const char *what, const char *placement)
{
	return th_fmt("{\"name\": \"%s\", %s, \"init\": {\"seed\": 7}, \"placement\": %s}", name,
	              what, placement);
}

static void create(const char *name, const char *what, const char *placement)
{
	char *s = spec(name, what, placement);

	json_decref(th_post_json(&D, "/v1/models?wait=true", s, 200));
	free(s);
}

static char *both_devices(void)
{
	return th_fmt("{\"devices\": [\"%s\", \"%s\"]}", th_dev(0), th_dev(1));
}

static char *first_device(void)
{
	return th_fmt("{\"device\": \"%s\"}", th_dev(0));
}

/* Arrays a and b hold the same floats within tol of b's largest. */
static void close_arrays(const char *a, const char *b, double tol)
{
	size_t na, nb;
	float *x = th_download_floats(&D, a, &na), *y = th_download_floats(&D, b, &nb);
	double scale = 0, worst = 0;

	ck_assert_uint_eq(na, nb);
	for (size_t i = 0; i < nb; i++)
		scale = fmax(scale, fabs(y[i]));
	for (size_t i = 0; i < nb; i++)
		worst = fmax(worst, fabs((double)x[i] - y[i]) / (scale + 1e-30));
	ck_assert_msg(worst <= tol, "%s vs %s: off by %.3g of %.3g", a, b, worst, scale);
	free(x);
	free(y);
}

static void close_losses(json_t *a, json_t *b, double rel)
{
	json_t *la = th_arr(a, "losses"), *lb = th_arr(b, "losses");

	ck_assert_uint_eq(json_array_size(la), json_array_size(lb));
	for (size_t i = 0; i < json_array_size(lb); i++) {
		double x = json_number_value(json_array_get(la, i));
		double y = json_number_value(json_array_get(lb, i));

		ck_assert_msg(fabs(x - y) <= rel * fabs(y), "loss %zu: %.9g on two devices, %.9g on one",
		              i, x, y);
	}
}

#define MLP "\"mlp\": {\"layers\": 2, \"d_model\": 16, \"d_hidden\": 8}, \"loss\": \"mse\", " \
            "\"optimizer\": {\"type\": \"sgd\", \"learning_rate\": 0.1, \"clip_global_norm\": 1.0}"

/* Two devices on 16 rows = one device on the same 16 rows, step after
 * step; the model says where its replicas are; the result has each
 * device's share. */
START_TEST(test_mlp_on_two_devices_equals_one)
{
	float *x = th_floats(16 * 16, 3, -1.0f, 1.0f), *y = th_floats(16 * 16, 4, -1.0f, 1.0f);
	char *host = th_fmt("device=%s&memory_kind=pinned_host", th_dev(0));
	char *both = both_devices(), *one = first_device();
	json_t *m, *rd, *r1, *devs;
	long metric_total;

	th_put_floats(&D, "x", x, 16, 16, host);
	th_put_floats(&D, "y", y, 16, 16, host);
	create("dp", MLP, both);
	create("one", MLP, one);
	m = th_get_object(&D, "/v1/models/dp");
	devs = th_arr(th_obj(m, "placement"), "devices");
	ck_assert_uint_eq(json_array_size(devs), 2);
	ck_assert_str_eq(json_string_value(json_array_get(devs, 1)), th_dev(1));
	ck_assert_str_eq(th_str(th_obj(m, "placement"), "device"), th_dev(0));
	json_decref(m);
	rd = th_model_step(&D, "dp", "{\"inputs\": \"x\", \"targets\": \"y\", \"steps\": 3}");
	r1 = th_model_step(&D, "one", "{\"inputs\": \"x\", \"targets\": \"y\", \"steps\": 3}");
	close_losses(rd, r1, 1e-5);
	close_arrays("dp.w1", "one.w1", 2e-5);
	close_arrays("dp.w2", "one.w2", 2e-5);
	/* accumulating too: each device's 8 rows in two micro-batches of 4, the
	 * mean over all 16 rows still; one device's plain step on the 16 */
	{
		json_t *ad = th_model_step(&D, "dp", "{\"inputs\": \"x\", \"targets\": \"y\", "
		                                    "\"accumulate\": 2}");
		json_t *a1 = th_model_step(&D, "one", "{\"inputs\": \"x\", \"targets\": \"y\"}");

		close_losses(ad, a1, 1e-5);
		close_arrays("dp.w1", "one.w1", 2e-5);
		json_decref(ad);
		json_decref(a1);
	}
	/* each device's compute, and the gradients' bytes all-reduced: w1 and
	 * w2, [2, 16, 8] floats each, three steps */
	devs = th_arr(rd, "devices");
	ck_assert_uint_eq(json_array_size(devs), 2);
	for (size_t k = 0; k < 2; k++) {
		json_t *d = json_array_get(devs, k);

		ck_assert_str_eq(th_str(d, "device"), th_dev((int)k));
		ck_assert(json_number_value(json_object_get(d, "compute_s")) >= 0);
		/* sim's queue workers time themselves: a collective takes time */
		ck_assert(th_backend_is_sim() ? json_number_value(json_object_get(d, "communication_s")) > 0
		                              : json_number_value(json_object_get(d, "communication_s")) >= 0);
		/* what the compute waited for the collectives: within the steps */
		ck_assert(json_number_value(json_object_get(d, "communication_not_hidden_s")) >= 0);
		ck_assert(json_number_value(json_object_get(d, "communication_not_hidden_s")) <=
		          json_number_value(json_object_get(th_obj(rd, "time"), "wall_s")));
		ck_assert_int_eq(th_int(d, "all_reduce_bytes"), 3 * 2 * 2 * 16 * 8 * 4);
	}
	ck_assert_int_eq(th_int(rd, "all_reduce_bytes"), 3 * 2 * 2 * 16 * 8 * 4);
	metric_total = 4 * 2 * 2 * 16 * 8 * 4;      /* and the accumulating step's */
	/* and counted per device in /metrics */
	{
		size_t len;
		char *bytes = th_get_bytes(&D, "/metrics", &len), *text = strndup(bytes, len);

		for (int k = 0; k < 2; k++) {
			char labels[64];
			double v = -1;

			snprintf(labels, sizeof labels, "device=\"%s\"", th_dev(k));
			ck_assert(th_prom_find(text, "tstage_device_collective_bytes_total", labels, &v));
			ck_assert_msg(v == (double)metric_total, "%s: %g collective bytes", th_dev(k), v);
		}
		free(text);
		free(bytes);
	}
	ck_assert_ptr_null(json_object_get(r1, "devices"));
	/* an evaluation runs on the first device's replica: the same loss */
	{
		json_t *ed = th_post_json(&D, "/v1/models/dp:evaluate?wait=true",
		                          "{\"inputs\": \"x\", \"targets\": \"y\"}", 200);
		json_t *e1 = th_post_json(&D, "/v1/models/one:evaluate?wait=true",
		                          "{\"inputs\": \"x\", \"targets\": \"y\"}", 200);
		double a = json_number_value(json_object_get(ed, "loss"));
		double b = json_number_value(json_object_get(e1, "loss"));

		ck_assert_msg(b > 0 && fabs(a - b) <= 1e-5 * b, "evaluate: %.9g vs %.9g", a, b);
		ck_assert_str_eq(th_str(ed, "device"), th_dev(0));
		json_decref(ed);
		json_decref(e1);
	}
	/* the accounting holds over both devices' replicas */
	{
		char why[512];

		ck_assert_msg(th_spaces_match_shards(&D, why, sizeof why), "%s", why);
	}
	json_decref(rd);
	json_decref(r1);
	free(x);
	free(y);
	free(host);
	free(both);
	free(one);
}
END_TEST

/* Offloaded: the replicas of params and Adam's state on each device's
 * pinned_host, streamed in per layer; still one device's steps. Adam's
 * losses within 1e-4 (its first steps amplify rounding noise in tiny
 * gradients, test_replicas says why). */
START_TEST(test_offloaded_replicas)
{
	float *x = th_floats(16 * 16, 3, -1.0f, 1.0f), *y = th_floats(16 * 16, 4, -1.0f, 1.0f);
	char *both = th_fmt("{\"devices\": [\"%s\", \"%s\"], \"params\": \"pinned_host\", "
	                    "\"opt_state\": \"pinned_host\", \"prefetch_depth\": 1}", th_dev(0),
	                    th_dev(1));
	char *one = th_fmt("{\"device\": \"%s\", \"params\": \"pinned_host\", "
	                   "\"opt_state\": \"pinned_host\", \"prefetch_depth\": 1}", th_dev(0));
	const char *adam = "\"mlp\": {\"layers\": 3, \"d_model\": 16, \"d_hidden\": 8}, "
	                   "\"loss\": \"mse\", \"optimizer\": {\"type\": \"adam\", "
	                   "\"learning_rate\": 0.01}";
	json_t *rd, *r1, *a;

	th_put_floats(&D, "x", x, 16, 16, NULL);
	th_put_floats(&D, "y", y, 16, 16, NULL);
	create("dp", adam, both);
	create("one", adam, one);
	a = th_array_meta(&D, "dp.adam.nu.w2");
	{
		char *text = json_dumps(a, 0);

		ck_assert_msg(text && strstr(text, "pinned_host") != NULL, "%s", text);
		free(text);
	}
	json_decref(a);
	rd = th_model_step(&D, "dp", "{\"inputs\": \"x\", \"targets\": \"y\", \"steps\": 3}");
	r1 = th_model_step(&D, "one", "{\"inputs\": \"x\", \"targets\": \"y\", \"steps\": 3}");
	close_losses(rd, r1, 1e-4);
	ck_assert_int_gt(th_int(th_obj(rd, "bytes_moved"), "h2d"), 0);
	json_decref(rd);
	json_decref(r1);
	/* moved back to the devices (every replica, each on its own device),
	 * the steps go on there, the same as the one-device model's moved too */
	for (int w = 1; w <= 2; w++) {
		char path[64];
		json_t *mv;

		snprintf(path, sizeof path, "/v1/arrays/dp.w%d:put?wait=true", w);
		mv = th_post_json(&D, path, "{\"memory_kind\": \"device\"}", 200);
		json_decref(mv);
		snprintf(path, sizeof path, "/v1/arrays/one.w%d:put?wait=true", w);
		json_decref(th_post_json(&D, path, "{\"memory_kind\": \"device\"}", 200));
	}
	rd = th_model_step(&D, "dp", "{\"inputs\": \"x\", \"targets\": \"y\", \"steps\": 2}");
	r1 = th_model_step(&D, "one", "{\"inputs\": \"x\", \"targets\": \"y\", \"steps\": 2}");
	close_losses(rd, r1, 1e-4);
	{
		size_t n;
		char *t = th_get_bytes(&D, "/v1/arrays/dp.w1/sharding?format=text", &n);
		char *text = strndup(t, n);

		ck_assert_msg(strstr(text, th_dev(1)) && strstr(text, "memory_kind: device"), "%s",
		              text);
		free(text);
		free(t);
	}
	json_decref(rd);
	json_decref(r1);
	free(x);
	free(y);
	free(both);
	free(one);
}
END_TEST

/* ZeRO-1: "shard_optimizer" keeps each device's half of Adam's state; the
 * steps are the replicated model's bit for bit, each device's arguments
 * shrink by half the state, and a checkpoint carries the whole state. */
START_TEST(test_shard_optimizer)
{
	float *x = th_floats(16 * 16, 3, -1.0f, 1.0f), *y = th_floats(16 * 16, 4, -1.0f, 1.0f);
	char *both = both_devices();
	char *sharded = th_fmt("{\"devices\": [\"%s\", \"%s\"], \"shard_optimizer\": true}",
	                       th_dev(0), th_dev(1));
	char *q = th_fmt("name=back&device=%s", th_dev(0));
	const char *adam = "\"mlp\": {\"layers\": 2, \"d_model\": 16, \"d_hidden\": 8}, "
	                   "\"loss\": \"mse\", \"optimizer\": {\"type\": \"adam\", "
	                   "\"learning_rate\": 0.01, \"clip_global_norm\": 1.0}";
	json_t *rz, *rr, *az, *ar, *m;
	size_t len;
	char *file;

	th_put_floats(&D, "x", x, 16, 16, NULL);
	th_put_floats(&D, "y", y, 16, 16, NULL);
	create("z", adam, sharded);
	create("r", adam, both);
	m = th_get_object(&D, "/v1/models/z");
	ck_assert(th_bool(th_obj(m, "placement"), "shard_optimizer"));
	json_decref(m);
	/* a state array is split over the devices, a parameter replicated */
	{
		size_t n;
		char *t = th_get_bytes(&D, "/v1/arrays/z.adam.mu.w1/sharding?format=text", &n);
		char *text = strndup(t, n), *want = th_fmt("[:, 8:16, :] %s", th_dev(1));

		ck_assert_msg(strstr(text, want) != NULL, "%s", text);
		free(want);
		free(text);
		free(t);
	}
	az = th_post_json(&D, "/v1/models/z:analyze", "{\"batch\": [16, 16]}", 200);
	ar = th_post_json(&D, "/v1/models/r:analyze", "{\"batch\": [16, 16]}", 200);
	/* Adam's mu and nu of w1 and w2: 4 x [2, 16, 8] floats, half on each */
	ck_assert_int_eq(th_int(ar, "argument_size_in_bytes") - th_int(az, "argument_size_in_bytes"),
	                 4 * 2 * 16 * 8 * 4 / 2);
	rz = th_model_step(&D, "z", "{\"inputs\": \"x\", \"targets\": \"y\", \"steps\": 3}");
	rr = th_model_step(&D, "r", "{\"inputs\": \"x\", \"targets\": \"y\", \"steps\": 3}");
	close_losses(rz, rr, 0);
	close_arrays("z.w1", "r.w1", 0);
	close_arrays("z.w2", "r.w2", 0);
	close_arrays("z.adam.nu.w1", "r.adam.nu.w1", 0);    /* gathered from both halves */
	file = th_export_model(&D, "z", &len);
	th_import_ok(&D, q, file, len);
	close_arrays("back.adam.mu.w2", "r.adam.mu.w2", 0);
	json_decref(th_model_step(&D, "back", "{\"inputs\": \"x\", \"targets\": \"y\"}"));
	json_decref(rz);
	json_decref(rr);
	json_decref(az);
	json_decref(ar);
	free(file);
	free(x);
	free(y);
	free(both);
	free(sharded);
	free(q);
}
END_TEST

/* ZeRO-2: "shard_optimizer": "gradients" also keeps each device's half of
 * the reduced gradients: the model renders it, :analyze answers ZeRO-1's
 * arguments with fewer temps and the gradients reduce-scattered (plus the
 * norm's 4 bytes), the steps equal the replicated model's and ZeRO-1's
 * within float32 summation error (the norm clips, summed part by part). */
START_TEST(test_shard_gradients)
{
	float *x = th_floats(16 * 16, 3, -1.0f, 1.0f), *y = th_floats(16 * 16, 4, -1.0f, 1.0f);
	char *both = both_devices();
	char *z1 = th_fmt("{\"devices\": [\"%s\", \"%s\"], \"shard_optimizer\": true}",
	                  th_dev(0), th_dev(1));
	char *z2 = th_fmt("{\"devices\": [\"%s\", \"%s\"], \"shard_optimizer\": \"gradients\"}",
	                  th_dev(0), th_dev(1));
	char *odd = th_fmt("{\"devices\": [\"%s\", \"%s\"], \"shard_optimizer\": \"params\"}",
	                   th_dev(0), th_dev(1));
	const char *adam = "\"mlp\": {\"layers\": 2, \"d_model\": 16, \"d_hidden\": 8}, "
	                   "\"loss\": \"mse\", \"optimizer\": {\"type\": \"adam\", "
	                   "\"learning_rate\": 0.01, \"clip_global_norm\": 1.0}";
	json_t *r2, *r1, *rr, *a2, *a1, *m;
	char *s;

	th_put_floats(&D, "x", x, 16, 16, NULL);
	th_put_floats(&D, "y", y, 16, 16, NULL);
	create("g", adam, z2);
	create("z", adam, z1);
	create("r", adam, both);
	m = th_get_object(&D, "/v1/models/g");
	ck_assert_str_eq(th_str(th_obj(m, "placement"), "shard_optimizer"), "gradients");
	json_decref(m);
	a2 = th_post_json(&D, "/v1/models/g:analyze", "{\"batch\": [16, 16]}", 200);
	a1 = th_post_json(&D, "/v1/models/z:analyze", "{\"batch\": [16, 16]}", 200);
	ck_assert_int_eq(th_int(a2, "argument_size_in_bytes"), th_int(a1, "argument_size_in_bytes"));
	ck_assert_int_lt(th_int(a2, "temp_size_in_bytes"), th_int(a1, "temp_size_in_bytes"));
	/* w1 and w2's gradients, 2 x [2, 16, 8] floats, reduced; and the norm */
	ck_assert_int_eq(th_int(a1, "all_reduce_bytes"), 2 * 2 * 16 * 8 * 4);
	ck_assert_int_eq(th_int(a2, "all_reduce_bytes"), 2 * 2 * 16 * 8 * 4 + 4);
	r2 = th_model_step(&D, "g", "{\"inputs\": \"x\", \"targets\": \"y\", \"steps\": 3}");
	r1 = th_model_step(&D, "z", "{\"inputs\": \"x\", \"targets\": \"y\", \"steps\": 3}");
	rr = th_model_step(&D, "r", "{\"inputs\": \"x\", \"targets\": \"y\", \"steps\": 3}");
	close_losses(r2, rr, 1e-5);
	close_losses(r2, r1, 1e-5);
	close_arrays("g.w1", "r.w1", 1e-4);
	close_arrays("g.w2", "z.w2", 1e-4);
	close_arrays("g.adam.nu.w1", "z.adam.nu.w1", 1e-4);
	s = spec("bad", adam, odd);
	th_post_error(&D, "/v1/models", s, 400, "INVALID_ARGUMENT", "BAD_SHARDING", "params", NULL);
	free(s);
	json_decref(r2);
	json_decref(r1);
	json_decref(rr);
	json_decref(a2);
	json_decref(a1);
	free(x);
	free(y);
	free(both);
	free(z1);
	free(z2);
	free(odd);
}
END_TEST

/* :analyze of the model on two devices is each device's: the plan of its
 * half of the batch, and the gradients it all-reduces. */
START_TEST(test_analyze_is_per_device)
{
	char *both = both_devices(), *one = first_device();
	json_t *ad, *a1, *ah;

	create("dp", MLP, both);
	create("one", MLP, one);
	ad = th_post_json(&D, "/v1/models/dp:analyze", "{\"batch\": [16, 16]}", 200);
	a1 = th_post_json(&D, "/v1/models/one:analyze", "{\"batch\": [8, 16]}", 200);
	ah = th_post_json(&D, "/v1/models/one:analyze", "{\"batch\": [16, 16]}", 200);
	ck_assert_int_eq(th_int(ad, "replicas"), 2);
	ck_assert_int_eq(th_int(ad, "all_reduce_bytes"), 2 * 2 * 16 * 8 * 4);
	ck_assert_int_eq(th_int(ad, "argument_size_in_bytes"), th_int(a1, "argument_size_in_bytes"));
	ck_assert_int_lt(th_int(ad, "temp_size_in_bytes"), th_int(ah, "temp_size_in_bytes"));
	ck_assert_ptr_null(json_object_get(a1, "replicas"));
	json_decref(ad);
	json_decref(a1);
	json_decref(ah);
	free(both);
	free(one);
}
END_TEST

#define GPT "\"gpt\": {\"vocab\": 37, \"context\": 8, \"layers\": 2, \"d_model\": 16, " \
            "\"heads\": 4}, \"optimizer\": {\"type\": \"sgd\", \"learning_rate\": 0.1}"

/* A GPT on windows of one token stream: four windows a step, two on each
 * device; the same as one device on the four. */
START_TEST(test_gpt_windows_on_two_devices_equal_one)
{
	static uint16_t tok[512];
	char *both = both_devices(), *one = first_device();
	char *q = th_fmt("dtype=uint16&shape=512&device=%s&memory_kind=pinned_host", th_dev(0));
	const char *body = "{\"windows\": {\"array\": \"stream\", \"context\": 8, \"batch_size\": 4, "
	                   "\"order\": \"sequential\"}, \"steps\": 3}";
	json_t *rd, *r1;
	uint64_t s = 5;

	for (size_t i = 0; i < 512; i++)
		tok[i] = (uint16_t)(th_rand(&s) % 37);
	th_put_array(&D, "stream", q, tok, sizeof tok);
	create("g2", GPT, both);
	create("g1", GPT, one);
	rd = th_model_step(&D, "g2", body);
	r1 = th_model_step(&D, "g1", body);
	close_losses(rd, r1, 1e-5);
	close_arrays("g2.wte", "g1.wte", 2e-5);
	close_arrays("g2.mlp.fc.w", "g1.mlp.fc.w", 2e-5);
	ck_assert_int_eq(th_int(th_obj(rd, "windows"), "next"), th_int(th_obj(r1, "windows"), "next"));
	json_decref(rd);
	json_decref(r1);
	free(both);
	free(one);
	free(q);
}
END_TEST

/* Export gathers one replica; imported onto one device, the weights are
 * the same and it trains on. */
START_TEST(test_checkpoint_onto_one_device)
{
	float *x = th_floats(8 * 16, 3, -1.0f, 1.0f), *y = th_floats(8 * 16, 4, -1.0f, 1.0f);
	char *both = both_devices(), *q = th_fmt("name=back&device=%s", th_dev(1));
	size_t len;
	char *file;
	json_t *m;

	th_put_floats(&D, "x", x, 8, 16, NULL);
	th_put_floats(&D, "y", y, 8, 16, NULL);
	create("dp", MLP, both);
	json_decref(th_model_step(&D, "dp", "{\"inputs\": \"x\", \"targets\": \"y\", \"steps\": 2}"));
	file = th_export_model(&D, "dp", &len);
	th_import_ok(&D, q, file, len);
	m = th_get_object(&D, "/v1/models/back");
	ck_assert_str_eq(th_str(th_obj(m, "placement"), "device"), th_dev(1));
	ck_assert_ptr_null(json_object_get(th_obj(m, "placement"), "devices"));
	json_decref(m);
	close_arrays("back.w1", "dp.w1", 0);
	close_arrays("back.w2", "dp.w2", 0);
	/* and imported as it was, onto both devices again */
	th_import_ok(&D, "name=again", file, len);
	m = th_get_object(&D, "/v1/models/again");
	ck_assert_uint_eq(json_array_size(th_arr(th_obj(m, "placement"), "devices")), 2);
	json_decref(m);
	close_arrays("again.w1", "dp.w1", 0);
	json_decref(th_model_step(&D, "again", "{\"inputs\": \"x\", \"targets\": \"y\"}"));
	free(file);
	free(x);
	free(y);
	free(both);
	free(q);
}
END_TEST

START_TEST(test_bad_placements_and_batches)
{
	char *one_listed = th_fmt("{\"devices\": [\"%s\"]}", th_dev(0));
	char *twice = th_fmt("{\"devices\": [\"%s\", \"%s\"]}", th_dev(0), th_dev(0));
	char *both_kinds = th_fmt("{\"device\": \"%s\", \"devices\": [\"%s\", \"%s\"]}", th_dev(1),
	                          th_dev(0), th_dev(1));
	char *nowhere = th_fmt("{\"devices\": [\"%s\", \"sim:99\"]}", th_dev(0));
	char *with_cpu = th_fmt("{\"devices\": [\"%s\", \"cpu:0\"]}", th_dev(0));
	char *both = both_devices(), *s;
	char *shard_host = th_fmt("{\"devices\": [\"%s\", \"%s\"], \"shard_optimizer\": true, "
	                          "\"opt_state\": \"pinned_host\"}", th_dev(0), th_dev(1));
	float *x = th_floats(3 * 16, 3, -1.0f, 1.0f);
	const struct {
		const char *placement, *reason, *word;
	} bad[] = {
		{one_listed, "BAD_DEVICES", "2.."},
		{twice, "BAD_DEVICES", "twice"},
		{both_kinds, "BAD_DEVICES", "first of devices"},
		{nowhere, "DEVICE_NOT_FOUND", "sim:99"},
		{with_cpu, "BAD_DEVICES", "one backend"},
		{"{\"devices\": \"sim:0\"}", "BAD_DEVICES", "list"},
		{"{\"shard_optimizer\": true}", "BAD_SHARDING", "2 or more"},
		{shard_host, "BAD_SHARDING", "opt_state"},
	};

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		s = spec("bad", MLP, bad[i].placement);
		th_post_error(&D, "/v1/models", s, 400, "INVALID_ARGUMENT", bad[i].reason, bad[i].word,
		              NULL);
		free(s);
	}
	s = th_fmt("{\"name\": \"kept\", %s, \"persist\": true, \"placement\": %s}", MLP, both);
	th_post_error(&D, "/v1/models", s, 501, "UNIMPLEMENTED", "PERSIST_REPLICAS", "checkpoint",
	              NULL);
	free(s);
	/* three rows do not split over two devices */
	th_put_floats(&D, "x3", x, 3, 16, NULL);
	create("dp", MLP, both);
	th_post_error(&D, "/v1/models/dp:step?wait=true", "{\"inputs\": \"x3\", \"targets\": \"x3\"}", 400,
	              "INVALID_ARGUMENT", "BAD_BATCH", "2 devices", NULL);
	th_post_error(&D, "/v1/models/dp:analyze", "{\"batch\": [3, 16]}", 400, "INVALID_ARGUMENT",
	              "BAD_BATCH", "2 devices", NULL);
	free(one_listed);
	free(twice);
	free(both_kinds);
	free(nowhere);
	free(with_cpu);
	free(shard_host);
	free(both);
	free(x);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("replicas");
	TCase *tc = tcase_create("replicas");

	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_mlp_on_two_devices_equals_one);
	tcase_add_test(tc, test_offloaded_replicas);
	tcase_add_test(tc, test_shard_optimizer);
	tcase_add_test(tc, test_shard_gradients);
	tcase_add_test(tc, test_analyze_is_per_device);
	tcase_add_test(tc, test_gpt_windows_on_two_devices_equal_one);
	tcase_add_test(tc, test_checkpoint_onto_one_device);
	tcase_add_test(tc, test_bad_placements_and_batches);
	suite_add_tcase(s, tc);
	return s;
}
