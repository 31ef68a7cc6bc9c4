/*
 * harness.h - the integration tests' view of a real tstaged: start one as a
 * child process on an ephemeral port, talk to it with libcurl, stop it with
 * SIGTERM, and check what it answers (google.rpc.Status errors, Prometheus
 * text).
 *
 * A started daemon always runs with --port 0 --port-file <tmp> --log-level
 * warn, then the backend's arguments (sim: --sim-devices 2
 * --sim-device-memory 64MiB --no-cuda; cuda: --cuda=true), then the test's
 * own; a later flag wins, so a test can override any of them. Its stdout and
 * stderr go to files in a private temporary directory that the test can read
 * (the JSON log lines). Inherited TSTAGE_* variables are removed from the
 * daemon's environment, so only what a test passes reaches it.
 *
 * Every th_ function that can fail fails the current Check test (ck_assert)
 * with a message; none returns an error to check. A daemon left running by a
 * failed test dies with the test process (PR_SET_PDEATHSIG). A failed
 * assertion _exits the forked test, so its files stay behind until the
 * runner process, which called th_init, exits and removes the directory
 * that holds them all.
 *
 * TS_TEST_BACKEND selects what the daemon runs on: unset or "sim" gives two
 * simulated devices of TH_SIM_MEMORY bytes with CUDA discovery switched off;
 * "cuda" runs on the machine's GPUs and expects cuda to be the default
 * backend.
 *
 * Thread-safety: none; one test process drives its daemons from one thread.
 * The one exception is a struct th_client (below): each thread may send
 * requests on its own client, opened and closed by the driving thread.
 */
#ifndef TS_TESTS_HARNESS_H
#define TS_TESTS_HARNESS_H

#include <check.h>
#include <curl/curl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

/*
 * The one main of the integration suites is harness.c's: it calls
 * curl_global_init and th_init, gives Check room for a sanitizer's report
 * with its stacks (check_set_max_msg_size(32768)), runs th_suite() with
 * CK_NORMAL output and exits EXIT_FAILURE when any case failed. Each
 * it_<topic>.c defines th_suite and no main; work every case needs done
 * once (fixtures) goes in th_suite, which runs after th_init. Cases are
 * named test_<what>.
 */
Suite *th_suite(void);

/* Called once by that main, before th_suite: makes the directory every
 * test's files go under and removes it when the runner exits. */
void th_init(void);

/* That directory (borrowed), for what main prepares once for every test
 * (fixtures); "" when th_init failed or was not called. Fails nothing. */
const char *th_root(void);

/* ---- the backend under test ---------------------------------------------- */

#define TH_SIM_MEMORY (64ull << 20)     /* --sim-device-memory of sim runs */
#define TH_SIM_MEMORY_ARG "64MiB"

/* "sim" or "cuda", from TS_TEST_BACKEND (anything else fails the test). */
const char *th_backend(void);
bool th_backend_is_sim(void);

/* The ids the default run must show first and second ("sim:0", "sim:1" or
 * "cuda:0", "cuda:1"); the second may not exist on a one-GPU machine. */
const char *th_device_id(int ordinal, char *buf, size_t cap);

/* The same, borrowed: the backend's device of ordinal 0..7 ("sim:1",
 * "cuda:1"), valid for the whole process. Suites that name devices take
 * them from here, so a cuda run tests the GPU. */
const char *th_dev(int ordinal);

/* text with every "sim:N" (N one digit) replaced by th_dev(N): request
 * bodies and query strings written for sim, run on the backend under test.
 * Borrowed from a ring of 16 buffers: valid for the next 15 calls. */
const char *th_on_backend(const char *text);

/* ---- a daemon ------------------------------------------------------------- */

struct th_daemon {
	pid_t pid;                      /* 0 once stopped */
	int port;
	char base_url[64];              /* "http://127.0.0.1:PORT" */
	char dir[256];                  /* private temporary directory */
	char port_file[300];
	char stdout_path[300];
	char stderr_path[300];
	CURL *curl;                     /* reused: requests share one connection */
};

struct th_start {
	const char *const *args;        /* NULL-terminated extra flags, or NULL */
	const char *const *env;         /* NULL-terminated "NAME=value", or NULL */
	bool no_backend_args;           /* leave out th_backend's flags */
	int timeout_ms;                 /* for the port file; 0: 10 s, or 60 s when
	                                 * $TSTAGED is a sanitizer build ("san-") */
};

/* Path of the daemon binary: $TSTAGED, default "build/tstaged". */
const char *th_tstaged(void);

/* Starts a daemon with the default flags plus args (NULL-terminated, may be
 * NULL) and waits until it listens. */
void th_daemon_start(struct th_daemon *d, const char *const *args);

/* The same with every knob of struct th_start. */
void th_daemon_start_ex(struct th_daemon *d, const struct th_start *how);

/* th_daemon_start for a daemon given fixed ports (chosen free, then let go,
 * so another process may take one first): false when it exited because a
 * port was taken ("cannot listen"), d then stopped and its files removed,
 * for the caller to choose ports again; other failures fail the case. */
bool th_daemon_try_start(struct th_daemon *d, const char *const *args);

/* Sends SIGTERM and waits (bounded) for the exit; returns the wait status
 * as a shell would report it (exit code, or 128 + signal). Removes the
 * daemon's files unless keep_files. */
int th_daemon_stop(struct th_daemon *d, bool keep_files);

/* Sends sig to a running daemon. */
void th_daemon_signal(struct th_daemon *d, int sig);

/* Waits at most timeout_ms for the daemon to exit: its shell-style status,
 * or -1 while it still runs. Once it has exited, d->pid is 0. */
int th_daemon_wait(struct th_daemon *d, int timeout_ms);

/* Whether the running daemon lists device id (GET /v1/devices): a suite
 * that needs a second device skips what it cannot do on a one-GPU machine. */
bool th_daemon_has_device(struct th_daemon *d, const char *id);

/* Whether d has the backend's second device (th_dev(1)); without it (a
 * machine with one GPU) says on stderr that case `what` does not run here,
 * and the case returns: `if (!th_second_device(&D, __func__)) return;`. */
bool th_second_device(struct th_daemon *d, const char *what);

/* Stops the daemon and fails the test unless it exits 0 (graceful drain). */
void th_daemon_stop_ok(struct th_daemon *d);

/* The daemon's stderr so far (new NUL-terminated string, caller frees). */
char *th_daemon_stderr(const struct th_daemon *d);

/* Fails the test when the daemon's stderr so far holds a sanitizer's
 * report (ThreadSanitizer, AddressSanitizer, LeakSanitizer, UBSan), showing
 * its start (the harness's main leaves room for the stacks). */
void th_expect_no_sanitizer_report(const struct th_daemon *d);

/*
 * The fixture of a suite whose every case runs against a daemon of its own
 * with the default flags: tcase_add_checked_fixture(tc, th_case_up,
 * th_case_down). th_case_up starts th_case_daemon; th_case_down, unless the
 * case stopped it already, fails the case when its stderr holds a
 * sanitizer's report or when it does not exit 0 on SIGTERM. Each case runs
 * in a forked process of its own, so th_case_daemon is that case's.
 */
extern struct th_daemon th_case_daemon;
void th_case_up(void);
void th_case_down(void);

/* Removes a stopped daemon's files (after th_daemon_stop(d, true)). */
void th_daemon_cleanup(struct th_daemon *d);

/* ---- running tstaged to completion ---------------------------------------- */

struct th_run_result {
	int status;                     /* exit code, 128 + signal, or -1: timed out */
	char *out;                      /* stdout (new string, freed by th_run_free) */
	char *err;                      /* stderr */
};

/* Runs tstaged with exactly args (no defaults) and env, waits at most
 * timeout_ms (then kills it) and collects its output. */
void th_run(const char *const *args, const char *const *env, int timeout_ms,
            struct th_run_result *res);
void th_run_free(struct th_run_result *res);

/* ---- requests ------------------------------------------------------------- */

#define TH_MAX_HEADERS 32

struct th_response {
	long status;                    /* HTTP status code */
	char *body;                     /* NUL-terminated (owned) */
	size_t body_len;
	int nheaders;
	struct {
		char name[64];
		char value[256];
	} headers[TH_MAX_HEADERS];      /* of the final response only */
	json_t *json;                   /* set by th_json (owned) */
	size_t body_cap;                /* private: bytes allocated for body */
};

/*
 * Sends method path (with query) and waits for the answer. headers is
 * NULL-terminated "Name: value" lines, or NULL. body (body_len bytes) may be
 * NULL; a "Transfer-Encoding: chunked" header sends it chunked, without a
 * Content-Length. The daemon's connection is kept alive between calls.
 */
void th_request(struct th_daemon *d, const char *method, const char *path,
                const char *const *headers, const char *body, size_t body_len,
                struct th_response *r);

/* printf into a new string (caller frees); fails the test when out of
 * memory. For request paths and bodies built from values. */
char *th_fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));

/* GET path, no headers. */
void th_get(struct th_daemon *d, const char *path, struct th_response *r);

/* GET path and fail the test unless the status is 200 and the body is a JSON
 * object; returns the body (borrowed from r). */
json_t *th_get_json(struct th_daemon *d, const char *path, struct th_response *r);

void th_response_free(struct th_response *r);

/*
 * The requests every suite sends, each with one behaviour. Path and body
 * go as given (a suite that writes them for sim and runs them on the
 * backend under test passes them through th_on_backend first); every
 * failure fails the test with the request and the answer in the message.
 */

/* POST path with body (NUL-terminated JSON text, Content-Type
 * application/json; NULL sends none); the answer in r. */
void th_post(struct th_daemon *d, const char *path, const char *body, struct th_response *r);

/* th_post with headers (NULL-terminated "Name: value" lines) instead of
 * the Content-Type line; NULL headers is th_post. */
void th_post_headers(struct th_daemon *d, const char *path, const char *body,
                     const char *const *headers, struct th_response *r);

/* th_post with path and body written for sim, run on the backend under
 * test (th_on_backend). */
void th_post_on_backend(struct th_daemon *d, const char *path, const char *body,
                        struct th_response *r);

/* th_post; the status must be want and the body JSON: returns it (new
 * reference). */
json_t *th_post_json(struct th_daemon *d, const char *path, const char *body, long want);

/* th_post_json with path and body through th_on_backend. */
json_t *th_post_json_on_backend(struct th_daemon *d, const char *path, const char *body,
                                long want);

/* th_get_json's checks (200, a JSON object); returns the object (new
 * reference), the response freed. */
json_t *th_get_object(struct th_daemon *d, const char *path);

/* The status of GET path. */
long th_get_status(struct th_daemon *d, const char *path);

/* PUT /v1/arrays/name?query (query NULL or "" for none) with n bytes of
 * data; the status must be 200 or 201. */
void th_put_array(struct th_daemon *d, const char *name, const char *query, const void *data,
                  size_t n);

/* GET path: it must answer 200; returns the body (a new buffer the caller
 * frees) and its length in *n. */
char *th_get_bytes(struct th_daemon *d, const char *path, size_t *n);

/* th_get_bytes of /v1/arrays/name/data. */
char *th_download(struct th_daemon *d, const char *name, size_t *n);

/* PUT /v1/arrays/name?dtype=float32&shape=rows,cols, then &extra when extra
 * is not NULL, with the rows * cols floats of x; th_put_array's checks. */
void th_put_floats(struct th_daemon *d, const char *name, const float *x, size_t rows,
                   size_t cols, const char *extra);

/* th_download of a float32 array: its length must be whole floats; returns
 * them (a new buffer the caller frees) and their number in *n. */
float *th_download_floats(struct th_daemon *d, const char *name, size_t *n);

/* GET /v1/arrays/name: th_get_object's checks; the array's description
 * (new reference). */
json_t *th_array_meta(struct th_daemon *d, const char *name);

/* POST /v1/models/model:step?wait=true with body: it must answer 200;
 * returns the step's result (new reference). */
json_t *th_model_step(struct th_daemon *d, const char *model, const char *body);

/* n steps of model on the arrays inputs and targets (th_model_step): it must
 * answer n losses, written to out. */
void th_model_losses(struct th_daemon *d, const char *model, const char *inputs,
                     const char *targets, int n, double *out);

/* th_get_bytes of /v1/models/name:export: the model's file. */
char *th_export_model(struct th_daemon *d, const char *name, size_t *len);

/* POST /v1/models:import, then ?query when query is not NULL, with the len
 * bytes of file (Content-Type application/octet-stream); the answer in r. */
void th_import_model(struct th_daemon *d, const char *query, const void *file, size_t len,
                     struct th_response *r);

/* th_import_model; it must answer 201 with a model in state READY. */
void th_import_ok(struct th_daemon *d, const char *query, const void *file, size_t len);

/* GET /v1/arrays/name/data, with ?index=index (escaped here) when index is
 * not NULL: it must answer 200 with exactly the len bytes of want. */
void th_expect_data(struct th_daemon *d, const char *name, const char *index, const void *want,
                    size_t len);

/* Whether every space's bytes_in_use (GET /v1/memory) equals the sum of
 * the nbytes of the shards that GET /v1/arrays places in it: the daemon's
 * accounting is exact. What differs goes to why (cap bytes). */
bool th_spaces_match_shards(struct th_daemon *d, char *why, size_t cap);

/* Fails the test unless r is the error th_assert_error checks (http,
 * status, reason) and its message contains word and word2 (each when not
 * NULL); what names the request in the failure. Frees r. */
void th_expect_error(struct th_response *r, const char *what, long http, const char *status,
                     const char *reason, const char *word, const char *word2);

/* th_post, then th_expect_error on the answer. */
void th_post_error(struct th_daemon *d, const char *path, const char *body, long http,
                   const char *status, const char *reason, const char *word, const char *word2);

/* th_post, then th_expect_error's checks with any number of words: the
 * message must contain each of the NULL-terminated list after reason. */
void th_post_error_words(struct th_daemon *d, const char *path, const char *body, long http,
                         const char *status, const char *reason, ...)
	__attribute__((sentinel));

/* Value of a response header (case-insensitive name), or NULL (borrowed). */
const char *th_header(const struct th_response *r, const char *name);

/* The body parsed as JSON; fails the test if it is not JSON (borrowed from r). */
json_t *th_json(struct th_response *r);

/*
 * Fails the test unless r is a google.rpc.Status error: HTTP status http,
 * Content-Type application/json, {"error": {"code": http, "status": status,
 * "message": non-empty, "details": [{"@type": ErrorInfo, "reason": reason
 * (any non-empty one when NULL), "domain": "tstage", "metadata": {}}]}},
 * and status's canonical HTTP number equals http (405 goes with
 * INVALID_ARGUMENT).
 */
void th_assert_error(struct th_response *r, long http, const char *status,
                     const char *reason);

/* JSON accessors that fail the test when the member is missing or of
 * another type (borrowed results). */
json_t *th_obj(json_t *o, const char *key);
json_t *th_arr(json_t *o, const char *key);
const char *th_str(json_t *o, const char *key);
json_int_t th_int(json_t *o, const char *key);
bool th_bool(json_t *o, const char *key);

/*
 * An operation's members, whatever its shape: th_op_meta returns the member
 * key of its "metadata" (kind, target, state, progress, create_time...),
 * th_op_result its "response" (a succeeded operation's result); both fail the
 * test when the member is missing. Tests read operations only through these
 * two, so that the operation's shape is stated in one place.
 */
json_t *th_op_meta(json_t *op, const char *key);
json_t *th_op_result(json_t *op);

/* GET /v1/operations/id: th_get_object's checks; the operation (new
 * reference). */
json_t *th_op_get(struct th_daemon *d, const char *id);

/* Whether an operation's state is final: SUCCEEDED, FAILED or CANCELLED. */
bool th_op_terminal(const char *state);

/* ---- clients of their own, for threads ------------------------------------ */

/* A connection of its own to a daemon, for a thread that sends requests
 * while others do (th_request shares the daemon's one handle and fails the
 * test from whichever thread it runs on). */
struct th_client {
	CURL *curl;                     /* private */
	char base_url[64];              /* the daemon's, copied when opened */
	char error[CURL_ERROR_SIZE];    /* why the last request failed, if it did */
};

/* Opens a client to a running daemon (fails the test when curl cannot).
 * Call from the thread that runs the test, as th_client_close. */
void th_client_open(struct th_client *c, const struct th_daemon *d);
void th_client_close(struct th_client *c);

/*
 * th_request on c, failing nothing: true when an answer came (r->status and
 * the body as th_request fills them), false when the transfer failed (why in
 * c->error; r holds what came, if anything). Free r with th_response_free
 * either way; use json_loadb, not th_json, on the body (th_json fails the
 * test). Safe from any thread, each client used by one thread at a time.
 */
bool th_client_request(struct th_client *c, const char *method, const char *path,
                       const char *const *headers, const char *body, size_t body_len,
                       struct th_response *r);

/* ---- Prometheus text exposition ------------------------------------------- */

#define TH_PROM_MAX_LABELS 8

struct th_prom_sample {
	char name[128];
	int nlabels;
	struct {
		char name[64];
		char value[256];            /* unescaped */
	} labels[TH_PROM_MAX_LABELS];
	double value;
};

/* Parses one sample line ("name{a=\"x\",b=\"y\"} 1.5" or "name 2");
 * false when it is malformed. */
bool th_prom_parse_line(const char *line, size_t len, struct th_prom_sample *s);

/* Number of samples in text, or -1 with the first bad line in why: every
 * non-empty line is a "# HELP"/"# TYPE" comment or a well-formed sample. */
int th_prom_validate(const char *text, char *why, size_t cap);

/* Every sample of text (new array, caller frees), or fails the test. */
struct th_prom_sample *th_prom_samples(const char *text, int *n);

/* The value of the sample named name whose label set equals labels
 * ("a=\"x\",b=\"y\"", any order; "" or NULL for none); false when absent. */
bool th_prom_find(const char *text, const char *name, const char *labels, double *out);

/* The value of a label of s, or NULL. */
const char *th_prom_label(const struct th_prom_sample *s, const char *name);

/* ---- raw HTTP/1.1 over a socket (for what curl hides) ---------------------- */

/* A TCP connection to the daemon's port (fails the test if refused). */
int th_raw_connect(const struct th_daemon *d);

/* Sends all of text. */
void th_raw_send(int fd, const char *text);

/* Sends all of len bytes of data (binary; fails the test on an error). */
void th_raw_send_bytes(int fd, const void *data, size_t len);

/* Reads one response (headers, then Content-Length bytes of body) into buf
 * (NUL-terminated) within timeout_ms; returns its status code, or -1 on
 * timeout or a closed connection. */
int th_raw_response(int fd, char *buf, size_t cap, int timeout_ms);

/* ---- small things ---------------------------------------------------------- */

/* Writes text to a new file in the daemon-independent temporary directory and
 * returns its path in buf. */
const char *th_write_temp(const char *name, const char *text, char *buf, size_t cap);

/* Makes a new, empty directory below the runner's temporary root (removed
 * when the runner exits) and returns its path in buf. */
const char *th_temp_dir(const char *what, char *buf, size_t cap);

/* Writes len bytes of data to path, replacing it (fails the test on error). */
void th_write_file(const char *path, const void *data, size_t len);

/* The whole of a file as a new NUL-terminated buffer (caller frees) with its
 * size in *len (may be NULL); NULL when it cannot be read. */
char *th_read_file(const char *path, size_t *len);

/* Monotonic milliseconds. */
long long th_now_ms(void);

/* ---- bytes ------------------------------------------------------------------ */

/* The next value of a small xorshift generator (state must be non-zero). */
uint64_t th_rand(uint64_t *state);

/* n deterministic pseudo-random bytes from seed into buf. */
void th_fill(void *buf, size_t n, uint64_t seed);

/* A new buffer of th_fill's bytes (caller frees; fails the test when out of memory). */
void *th_pattern(size_t n, uint64_t seed);

/* Fails the test unless got equals want, naming the first differing byte. */
void th_assert_bytes(const char *what, const void *got, size_t got_len, const void *want,
                     size_t want_len);

/* ---- float32 data ------------------------------------------------------------ */

/* n deterministic floats of [lo, hi) from seed into x: th_rand's sequence
 * from the state seed * 0x9e3779b97f4a7c15 + 1, the top 24 bits of each. */
void th_fill_floats(float *x, size_t n, unsigned seed, float lo, float hi);

/* th_fill_floats into a new buffer (caller frees). */
float *th_floats(size_t n, unsigned seed, float lo, float hi);

/* n deterministic floats of [-2, 2) (new buffer, caller frees): th_rand's
 * sequence from the state seed (non-zero), the top 53 bits of each. */
float *th_signed_floats(size_t n, uint64_t seed);

/* Fails the test unless got (ngot floats) equals want (nwant) bit for bit,
 * naming the first element that differs. */
void th_assert_same_floats(const char *what, const float *got, size_t ngot, const float *want,
                           size_t nwant);

/* Fails the test unless got (ngot floats) is within rel of want's largest
 * magnitude element by element, want being a float64 reference rounded to
 * float32: an element near zero is the sum of terms much larger than
 * itself, and float32 rounds it relative to those terms, not to the sum.
 * A reference of all zeros fails too (it would compare nothing). */
void th_assert_close_floats(const char *what, const float *got, size_t ngot, const float *want,
                            size_t nwant, double rel);

/* Percent-encodes in for a query value (libcurl's escaping) into out. */
void th_url_escape(char *out, size_t cap, const char *in);

/* The folder of the Python helper scripts: $TS_IT_PY_DIR, else py/ beside
 * the integration sources (the build runs from the repository root). */
const char *th_py_dir(void);

#endif
