/*
 * it_restart.c - Check suite "restart": what a restart keeps (--state-dir)
 * and the signals a running daemon takes.
 *
 * A daemon with a state dir is given arrays and a model marked persist,
 * trained, and stopped with SIGTERM; a new daemon on the same dir serves
 * the same bytes, placements, dtypes, shapes and step count, and its next
 * losses equal, bit for bit, those of a daemon that never stopped. A
 * corrupt manifest or a truncated entry is skipped with a log line and a
 * metric, and the daemon still becomes ready. A SIGKILL in the middle of a
 * save leaves the previous save loadable. SIGHUP and SIGUSR1 keep the
 * daemon serving and log what they did.
 *
 * Each case runs forked with its own daemons and state dir.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CASE_TIMEOUT_S 120
#define B 8
#define D 16
#define N 3
#define M 4

static char state_dir[256];
static char state_arg[300];

static void up(void)
{
	snprintf(state_dir, sizeof state_dir, "/tmp/it_restart.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(state_dir));
	snprintf(state_arg, sizeof state_arg, "%s/state", state_dir);
}

static void down(void)
{
	char *cmd = th_fmt("rm -rf '%s'", state_dir);

	(void)!system(cmd);
	free(cmd);
}

static void start(struct th_daemon *d)
{
	const char *const args[] = {"--sim-device-memory", "256MiB", "--state-dir", state_arg, NULL};

	th_daemon_start(d, args);
}

/* Waits (bounded) until /readyz answers 200. */
static void wait_ready(struct th_daemon *d)
{
	for (int i = 0; i < 500; i++) {
		if (th_get_status(d, "/readyz") == 200)
			return;
		usleep(10000);
	}
	ck_abort_msg("the daemon never became ready");
}

static void create(struct th_daemon *d, const char *name, bool persist)
{
	char *spec = th_fmt("{\"name\": \"%s\", \"mlp\": {\"layers\": 3, \"d_model\": %d, "
	                    "\"d_hidden\": 24, \"activation\": \"gelu\", \"residual\": true}, "
	                    "\"loss\": \"mse\", \"optimizer\": {\"type\": \"adam\", "
	                    "\"learning_rate\": 0.01}, \"init\": {\"seed\": 7, \"scale\": 0.3}%s}",
	                    name, D, persist ? ", \"persist\": true" : "");

	json_decref(th_post_json(d, "/v1/models?wait=true", spec, 200));
	free(spec);
}

static void data_up(struct th_daemon *d, const char *extra)
{
	float *x = th_signed_floats(B * D, 31), *t = th_signed_floats(B * D, 32);

	th_put_floats(d, "x", x, B, D, extra);
	th_put_floats(d, "t", t, B, D, extra);
	free(x);
	free(t);
}

/* The value of metric line (its whole name with labels) in /metrics, or -1. */
static double metric(struct th_daemon *d, const char *line)
{
	size_t n;
	char *text = th_get_bytes(d, "/metrics", &n), *p = strstr(text, line);
	double v = p ? strtod(p + strlen(line), NULL) : -1;

	free(text);
	return v;
}

static bool log_has(const char *text, const char *what)
{
	return text && strstr(text, what) != NULL;
}

/* The file name of the state dir that starts with prefix ("a.x."), into
 * out; false when none. */
static bool state_file(const char *prefix, char *out, size_t cap)
{
	DIR *d = opendir(state_arg);
	struct dirent *e;
	bool found = false;

	ck_assert_ptr_nonnull(d);
	while (!found && (e = readdir(d)))
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
			snprintf(out, cap, "%s/%s", state_arg, e->d_name);
			found = true;
		}
	closedir(d);
	return found;
}

/* ---- the cases ------------------------------------------------------------------- */

/* Upload, create, step, mark, SIGTERM, start again: everything marked is
 * back, and training continues bit for bit as if it had never stopped. */
START_TEST(test_restart_keeps_what_was_marked)
{
	struct th_daemon A, A2, U;
	double whole[N + M], first[N], rest[M];
	const char *roles[] = {"w1", "w2", "adam.mu.w1", "adam.mu.w2", "adam.nu.w1", "adam.nu.w2"};
	float *p = th_signed_floats(64, 5);
	char *w0[6], *before_x;
	size_t n0[6], nx;
	json_t *m, *meta;

	start(&A);
	th_daemon_start(&U, (const char *const[]){"--sim-device-memory", "256MiB", NULL});
	data_up(&A, "persist=true");
	data_up(&U, NULL);
	th_put_floats(&A, "pinned", p, 8, 8, th_on_backend("device=sim:0&memory_kind=pinned_host"));
	json_decref(th_post_json(&A, "/v1/arrays/pinned:persist", NULL, 200));
	th_put_floats(&A, "scratch", p, 8, 8, NULL);          /* not marked: not kept */
	create(&A, "c", true);
	create(&U, "c", false);
	th_model_losses(&U, "c", "x", "t", N + M, whole);
	th_model_losses(&A, "c", "x", "t", N, first);
	for (int i = 0; i < N; i++)
		ck_assert_msg(first[i] == whole[i], "step %d differs before the restart", i + 1);
	for (int r = 0; r < 6; r++) {
		char a[64];

		snprintf(a, sizeof a, "c.%s", roles[r]);
		w0[r] = th_download(&A, a, &n0[r]);
	}
	before_x = th_download(&A, "x", &nx);
	ck_assert_int_eq(th_daemon_stop(&A, false), 0);

	start(&A2);
	wait_ready(&A2);
	/* the arrays: bytes, dtype, shape, placement, mark */
	th_expect_data(&A2, "pinned", NULL, p, 64 * sizeof(float));
	th_expect_data(&A2, "x", NULL, before_x, nx);
	meta = th_array_meta(&A2, "pinned");
	ck_assert_str_eq(th_str(meta, "dtype"), "float32");
	ck_assert_int_eq(json_integer_value(json_array_get(th_arr(meta, "shape"), 0)), 8);
	ck_assert_str_eq(th_str(th_obj(meta, "sharding"), "memory_kind"), "pinned_host");
	ck_assert_str_eq(th_str(th_obj(meta, "sharding"), "device"), th_dev(0));
	ck_assert(th_bool(meta, "committed"));
	ck_assert(th_bool(meta, "persist"));
	/* versions and ETags start again (documented): version 1 */
	ck_assert_int_eq(th_int(meta, "version"), 1);
	json_decref(meta);
	ck_assert_int_eq(th_get_status(&A2, "/v1/arrays/scratch"), 404);
	/* the model: spec, optimizer state, steps */
	m = th_get_object(&A2, "/v1/models/c");
	ck_assert_int_eq(th_int(m, "steps"), N);
	ck_assert(th_bool(m, "persist"));
	json_decref(m);
	for (int r = 0; r < 6; r++) {
		char a[64];
		size_t n1;
		char *w1;

		snprintf(a, sizeof a, "c.%s", roles[r]);
		w1 = th_download(&A2, a, &n1);
		th_assert_bytes(a, w1, n1, w0[r], n0[r]);
		free(w1);
		free(w0[r]);
	}
	th_model_losses(&A2, "c", "x", "t", M, rest);
	for (int i = 0; i < M; i++)
		ck_assert_msg(rest[i] == whole[N + i],
		              "after the restart, step %d: loss %.17g, never restarted %.17g",
		              N + i + 1, rest[i], whole[N + i]);
	ck_assert(metric(&A2, "tstage_state_restored{kind=\"model\"} ") == 1);
	th_daemon_stop_ok(&A2);
	th_daemon_stop_ok(&U);
	free(before_x);
	free(p);
}
END_TEST

/* Unmarking: an array or model unmarked before the stop is not kept. */
START_TEST(test_unpersist)
{
	struct th_daemon A, A2;
	float *p = th_signed_floats(16, 9);

	start(&A);
	th_put_floats(&A, "a", p, 4, 4, "persist=true");
	th_put_floats(&A, "b", p, 4, 4, "persist=true");
	json_decref(th_post_json(&A, "/v1/arrays/b:unpersist", NULL, 200));
	create(&A, "m", true);
	json_decref(th_post_json(&A, "/v1/models/m:unpersist", NULL, 200));
	th_post_error(&A, "/v1/arrays/m.w1:persist", NULL, 400, "FAILED_PRECONDITION",
	              "ARRAY_OWNED", "m.w1", NULL);
	ck_assert_int_eq(th_daemon_stop(&A, false), 0);
	start(&A2);
	wait_ready(&A2);
	th_expect_data(&A2, "a", NULL, p, 16 * sizeof(float));
	ck_assert_int_eq(th_get_status(&A2, "/v1/arrays/b"), 404);
	ck_assert_int_eq(th_get_status(&A2, "/v1/models/m"), 404);
	th_daemon_stop_ok(&A2);
	free(p);
}
END_TEST

/* Without --state-dir, asking to persist is refused. */
START_TEST(test_no_state_dir)
{
	struct th_daemon A;
	struct th_response r;
	float v[4] = {1, 2, 3, 4};

	th_daemon_start(&A, NULL);
	th_request(&A, "PUT", "/v1/arrays/a?dtype=float32&shape=4&persist=true", NULL,
	           (const char *)v, sizeof v, &r);
	th_expect_error(&r, "upload", 400, "FAILED_PRECONDITION", "NO_STATE_DIR", "--state-dir",
	                NULL);
	th_post_error(&A, "/v1/state:save", NULL, 400, "FAILED_PRECONDITION", "NO_STATE_DIR",
	              NULL, NULL);
	th_daemon_stop_ok(&A);
}
END_TEST

/* A corrupt manifest: skipped, logged, counted; the daemon is ready. */
START_TEST(test_corrupt_manifest)
{
	struct th_daemon A, A2;
	float *p = th_signed_floats(16, 3);
	char *path = th_fmt("%s/manifest.json", state_arg), *err;
	FILE *f;

	start(&A);
	th_put_floats(&A, "a", p, 4, 4, "persist=true");
	ck_assert_int_eq(th_daemon_stop(&A, false), 0);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs("{\"format\": \"tstage.state.v1\", \"arr", f);
	fclose(f);
	start(&A2);
	wait_ready(&A2);
	ck_assert(metric(&A2, "tstage_state_restore_skipped_total{reason=\"manifest\"} ") == 1);
	ck_assert_int_eq(th_get_status(&A2, "/v1/arrays/a"), 404);
	err = th_daemon_stderr(&A2);
	ck_assert_msg(log_has(err, "\"event\":\"state_restore_skipped\"") &&
	              log_has(err, "\"reason\":\"manifest\""), "no skip line: %s", err);
	free(err);
	th_daemon_stop_ok(&A2);
	free(path);
	free(p);
}
END_TEST

/* A truncated entry and a flipped byte: each skipped with its reason; the
 * others restored. */
START_TEST(test_torn_entries)
{
	struct th_daemon A, A2;
	float *p = th_signed_floats(64, 4);
	char file[600], *err;
	struct stat sb;
	FILE *f;

	start(&A);
	th_put_floats(&A, "whole", p, 8, 8, "persist=true");
	th_put_floats(&A, "torn", p, 8, 8, "persist=true");
	th_put_floats(&A, "flipped", p, 8, 8, "persist=true");
	ck_assert_int_eq(th_daemon_stop(&A, false), 0);
	ck_assert(state_file("a.torn.", file, sizeof file));
	ck_assert_int_eq(stat(file, &sb), 0);
	ck_assert_int_eq(truncate(file, sb.st_size - 10), 0);
	ck_assert(state_file("a.flipped.", file, sizeof file));
	f = fopen(file, "r+");
	ck_assert_ptr_nonnull(f);
	fseek(f, -3, SEEK_END);
	fputc('X', f);
	fclose(f);
	start(&A2);
	wait_ready(&A2);
	th_expect_data(&A2, "whole", NULL, p, 64 * sizeof(float));
	ck_assert_int_eq(th_get_status(&A2, "/v1/arrays/torn"), 404);
	ck_assert_int_eq(th_get_status(&A2, "/v1/arrays/flipped"), 404);
	ck_assert(metric(&A2, "tstage_state_restore_skipped_total{reason=\"truncated\"} ") == 1);
	ck_assert(metric(&A2, "tstage_state_restore_skipped_total{reason=\"checksum\"} ") == 1);
	err = th_daemon_stderr(&A2);
	ck_assert_msg(log_has(err, "\"name\":\"torn\"") && log_has(err, "\"name\":\"flipped\""),
	              "the skips are not named: %s", err);
	free(err);
	th_daemon_stop_ok(&A2);
	free(p);
}
END_TEST

/* SIGKILL while a save writes: the previous save is what the next start
 * reads, whole. */
START_TEST(test_sigkill_mid_save)
{
	struct th_daemon A, A2;
	float *p = th_signed_floats(64, 6);
	size_t big = 48u << 20;
	char *zeros = calloc(1, big), *q;
	struct th_response r;
	json_t *op;

	ck_assert_ptr_nonnull(zeros);
	start(&A);
	th_put_floats(&A, "small", p, 8, 8, "persist=true");
	op = th_post_json(&A, "/v1/state:save?wait=true", NULL, 200);
	json_decref(op);
	q = th_fmt("/v1/arrays/big?dtype=uint8&shape=%zu&persist=true", big);
	th_request(&A, "PUT", q, NULL, zeros, big, &r);
	ck_assert_int_le(r.status, 201);
	th_response_free(&r);
	th_post(&A, "/v1/state:save", NULL, &r);
	ck_assert_int_eq(r.status, 202);
	th_response_free(&r);
	usleep(20000);
	th_daemon_signal(&A, SIGKILL);
	ck_assert_int_eq(th_daemon_wait(&A, 5000), 128 + SIGKILL);
	th_daemon_stop(&A, false);      /* the killed daemon's client and files */
	start(&A2);
	wait_ready(&A2);
	th_expect_data(&A2, "small", NULL, p, 64 * sizeof(float));
	for (int reason = 0; reason < 7; reason++) {
		static const char *const names[] = {"manifest", "entry", "missing", "truncated",
		                                    "checksum", "corrupt", "refused"};
		char *line = th_fmt("tstage_state_restore_skipped_total{reason=\"%s\"} ",
		                    names[reason]);

		ck_assert_msg(metric(&A2, line) == 0, "%s not 0", line);
		free(line);
	}
	th_daemon_stop_ok(&A2);
	free(q);
	free(zeros);
	free(p);
}
END_TEST

/* SIGHUP and SIGUSR1: the daemon keeps serving and logs what it did; with
 * --log-file, SIGHUP reopens it (logrotate's move, then HUP). */
START_TEST(test_signals)
{
	struct th_daemon A;
	char *log = th_fmt("%s/tstaged.log", state_dir), *moved = th_fmt("%s.1", log);
	const char *const args[] = {"--log-file", log, "--state-dir", state_arg, "--log-level",
	                            "info", NULL};
	float v[4] = {1, 2, 3, 4};
	size_t n;
	char *text;
	FILE *f;

	th_daemon_start(&A, args);
	th_put_floats(&A, "a", v, 2, 2, NULL);
	th_daemon_signal(&A, SIGUSR1);
	usleep(200000);
	ck_assert_int_eq(th_get_status(&A, "/livez"), 200);
	ck_assert_int_eq(th_get_status(&A, "/readyz"), 200);
	ck_assert_int_eq(rename(log, moved), 0);
	th_daemon_signal(&A, SIGHUP);
	usleep(200000);
	ck_assert_int_eq(th_get_status(&A, "/readyz"), 200);
	th_expect_data(&A, "a", NULL, v, sizeof v);
	/* the dump went to the old file, the HUP's line to the new one */
	f = fopen(moved, "r");
	ck_assert_ptr_nonnull(f);
	text = calloc(1, 1 << 20);
	n = fread(text, 1, (1 << 20) - 1, f);
	fclose(f);
	text[n] = '\0';
	ck_assert_msg(log_has(text, "\"event\":\"dump_catalog\"") &&
	              log_has(text, "\"arrays\":1") && log_has(text, "\"event\":\"dump_space\"") &&
	              log_has(text, "\"event\":\"dump_operations\""), "no dump: %s", text);
	f = fopen(log, "r");
	ck_assert_ptr_nonnull(f);
	n = fread(text, 1, (1 << 20) - 1, f);
	fclose(f);
	text[n] = '\0';
	ck_assert_msg(log_has(text, "\"event\":\"sighup\"") && log_has(text, "log_file"),
	              "the reopened log has no SIGHUP line: %s", text);
	th_daemon_stop_ok(&A);
	free(text);
	free(log);
	free(moved);
}
END_TEST

/* SIGHUP without a log file: accepted, logged, nothing else changes. */
START_TEST(test_sighup_stderr)
{
	struct th_daemon A;
	char *err;

	th_daemon_start(&A, (const char *const[]){"--log-level", "info", NULL});
	th_daemon_signal(&A, SIGHUP);
	th_daemon_signal(&A, SIGUSR1);
	usleep(200000);
	ck_assert_int_eq(th_get_status(&A, "/readyz"), 200);
	err = th_daemon_stderr(&A);
	ck_assert_msg(log_has(err, "\"event\":\"sighup\"") && log_has(err, "nothing to reopen"),
	              "no SIGHUP line: %s", err);
	ck_assert_msg(log_has(err, "\"event\":\"dump_operations\""), "no dump: %s", err);
	free(err);
	th_daemon_stop_ok(&A);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("restart");
	TCase *tc = tcase_create("restart");

	tcase_add_checked_fixture(tc, up, down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_restart_keeps_what_was_marked);
	tcase_add_test(tc, test_unpersist);
	tcase_add_test(tc, test_no_state_dir);
	tcase_add_test(tc, test_corrupt_manifest);
	tcase_add_test(tc, test_torn_entries);
	tcase_add_test(tc, test_sigkill_mid_save);
	tcase_add_test(tc, test_signals);
	tcase_add_test(tc, test_sighup_stderr);
	suite_add_tcase(s, tc);
	return s;
}
