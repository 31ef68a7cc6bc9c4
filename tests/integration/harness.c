/*
 * harness.c - a real tstaged for the integration tests: spawn, request,
 * stop, and the checks every suite shares (error shape, Prometheus text).
 *
 * Invariants: a running daemon is in the process's registry until stopped,
 * so that a test process that exits without stopping it kills it and
 * removes its files; a daemon never outlives its test process, even one
 * that a failed assertion ended with _exit (PR_SET_PDEATHSIG); every file
 * lies under the runner's root directory (th_init), removed when the
 * runner exits.
 */
#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/common/spawn.h"

extern char **environ;

/* ---- process-wide bookkeeping (this test process only) ---------------------- */

#define MAX_LIVE 16

/* Daemons started and not yet stopped, and the scratch directory: what the
 * atexit handler must undo when a failed assertion ends the process. */
static struct {
	pid_t pid;
	char dir[256];
} live[MAX_LIVE];
static char scratch_dir[256];
static bool atexit_done;

/* Set by th_init in the runner process: every temporary directory of every
 * forked test lives below root_dir, which the runner removes at its exit. */
static char root_dir[128];
static pid_t root_pid;

static void remove_dir(const char *dir)
{
	DIR *dp;
	struct dirent *e;
	char path[600];

	if (!dir[0] || !(dp = opendir(dir)))
		return;
	while ((e = readdir(dp)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		unlink(path);
	}
	closedir(dp);
	rmdir(dir);
}

static void cleanup_at_exit(void)
{
	for (int i = 0; i < MAX_LIVE; i++) {
		if (live[i].pid <= 0)
			continue;
		kill(live[i].pid, SIGKILL);
		waitpid(live[i].pid, NULL, 0);
		remove_dir(live[i].dir);
		live[i].pid = 0;
	}
	remove_dir(scratch_dir);
	scratch_dir[0] = '\0';
}

static void register_cleanup(void)
{
	if (!atexit_done) {
		atexit(cleanup_at_exit);
		atexit_done = true;
	}
}

static void live_add(pid_t pid, const char *dir)
{
	register_cleanup();
	for (int i = 0; i < MAX_LIVE; i++) {
		if (live[i].pid <= 0) {
			live[i].pid = pid;
			snprintf(live[i].dir, sizeof live[i].dir, "%s", dir);
			return;
		}
	}
}

static void live_remove(pid_t pid)
{
	for (int i = 0; i < MAX_LIVE; i++)
		if (live[i].pid == pid)
			live[i].pid = 0;
}

static const char *tmp_root(void)
{
	const char *t = getenv("TMPDIR");

	return t && *t ? t : "/tmp";
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

static void remove_root(void)
{
	if (root_dir[0] && getpid() == root_pid)
		nftw(root_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void th_init(void)
{
	snprintf(root_dir, sizeof root_dir, "%s/tstage-it-XXXXXX", tmp_root());
	if (!mkdtemp(root_dir)) {
		fprintf(stderr, "harness: mkdtemp '%s': %s\n", root_dir, strerror(errno));
		root_dir[0] = '\0';
		return;
	}
	root_pid = getpid();
	atexit(remove_root);
}

const char *th_root(void)
{
	return root_dir;
}

long long th_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

static void make_temp_dir(char *buf, size_t cap, const char *what)
{
	snprintf(buf, cap, "%s/tstage-%s-XXXXXX", root_dir[0] ? root_dir : tmp_root(), what);
	ck_assert_msg(mkdtemp(buf) != NULL, "mkdtemp '%s': %s", buf, strerror(errno));
}

/* The whole of a file (new string), or NULL when it cannot be read. */
static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t n = 0, cap = 0;

	if (!f)
		return NULL;
	for (;;) {
		if (cap - n < 4096) {
			char *grown = realloc(buf, cap = cap ? cap * 2 : 8192);

			ck_assert_ptr_nonnull(grown);
			buf = grown;
		}
		size_t got = fread(buf + n, 1, cap - n - 1, f);

		n += got;
		if (got == 0)
			break;
	}
	fclose(f);
	buf[n] = '\0';
	if (len)
		*len = n;
	return buf;
}

const char *th_write_temp(const char *name, const char *text, char *buf, size_t cap)
{
	FILE *f;

	register_cleanup();
	if (!scratch_dir[0])
		make_temp_dir(scratch_dir, sizeof scratch_dir, "it");
	snprintf(buf, cap, "%s/%s", scratch_dir, name);
	f = fopen(buf, "w");
	ck_assert_msg(f != NULL, "cannot write '%s': %s", buf, strerror(errno));
	fputs(text, f);
	ck_assert_int_eq(fclose(f), 0);
	return buf;
}

const char *th_temp_dir(const char *what, char *buf, size_t cap)
{
	register_cleanup();
	make_temp_dir(buf, cap, what);
	return buf;
}

void th_write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");

	ck_assert_msg(f != NULL, "cannot write '%s': %s", path, strerror(errno));
	ck_assert_msg(fwrite(data, 1, len, f) == len, "short write to '%s'", path);
	ck_assert_int_eq(fclose(f), 0);
}

char *th_read_file(const char *path, size_t *len)
{
	return slurp(path, len);
}

/* ---- backend selection ------------------------------------------------------- */

const char *th_backend(void)
{
	const char *b = getenv("TS_TEST_BACKEND");

	if (!b || !*b || strcmp(b, "sim") == 0)
		return "sim";
	ck_assert_msg(strcmp(b, "cuda") == 0, "TS_TEST_BACKEND='%s': want sim or cuda", b);
	return "cuda";
}

bool th_backend_is_sim(void)
{
	return strcmp(th_backend(), "sim") == 0;
}

const char *th_device_id(int ordinal, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s:%d", th_backend(), ordinal);
	return buf;
}

const char *th_dev(int ordinal)
{
	static char ids[8][16];

	ck_assert_msg(ordinal >= 0 && ordinal < 8, "th_dev(%d): ordinals 0..7", ordinal);
	if (!ids[ordinal][0])
		th_device_id(ordinal, ids[ordinal], sizeof ids[ordinal]);
	return ids[ordinal];
}

const char *th_on_backend(const char *text)
{
	static char ring[16][4096];
	static unsigned next;
	char *out = ring[next++ % 16];
	size_t n = 0;

	for (const char *p = text; *p; ) {
		if (strncmp(p, "sim:", 4) == 0 && p[4] >= '0' && p[4] <= '7') {
			const char *id = th_dev(p[4] - '0');

			ck_assert_msg(n + strlen(id) < sizeof ring[0], "th_on_backend: text too long");
			memcpy(out + n, id, strlen(id));
			n += strlen(id);
			p += 5;
			continue;
		}
		ck_assert_msg(n + 1 < sizeof ring[0], "th_on_backend: text too long");
		out[n++] = *p++;
	}
	out[n] = '\0';
	return out;
}

const char *th_tstaged(void)
{
	const char *p = getenv("TSTAGED");

	return p && *p ? p : "build/tstaged";
}

/* ---- spawning ------------------------------------------------------------------ */

#define MAX_ARGS 64
#define MAX_ENV 512

/* environ without TSTAGE_* variables, then extra (new array of borrowed
 * strings; caller frees the array). Built before fork: the child only execs. */
static char **child_env(const char *const *extra)
{
	char **envp = calloc(MAX_ENV + 1, sizeof *envp);
	size_t n = 0;

	ck_assert_ptr_nonnull(envp);
	for (char **e = environ; *e && n < MAX_ENV - 32; e++)
		if (strncmp(*e, "TSTAGE_", 7) != 0)
			envp[n++] = *e;
	for (; extra && *extra && n < MAX_ENV; extra++)
		envp[n++] = (char *)*extra;
	envp[n] = NULL;
	return envp;
}

/* Forks and execs tstaged with argv (argv[0] included) and envp, stdout and
 * stderr into the given files. */
static pid_t spawn(char *const *argv, char *const *envp, const char *out_path,
                   const char *err_path)
{
	int in, out, err;
	pid_t pid;

	in = open("/dev/null", O_RDONLY | O_CLOEXEC);
	out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ck_assert_msg(in >= 0 && out >= 0 && err >= 0, "cannot open output files: %s",
	              strerror(errno));
	pid = ts_test_spawn((const char *const *)argv, envp, in, out, err, "harness: ");
	ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
	close(in);
	close(out);
	close(err);
	return pid;
}

/* Shell-style status of a wait status. */
static int shell_status(int ws)
{
	if (WIFEXITED(ws))
		return WEXITSTATUS(ws);
	if (WIFSIGNALED(ws))
		return 128 + WTERMSIG(ws);
	return -1;
}

/* Waits at most timeout_ms for pid; -1 when it is still running. */
static int wait_bounded(pid_t pid, int timeout_ms)
{
	long long deadline = th_now_ms() + timeout_ms;
	int ws;

	for (;;) {
		pid_t r = waitpid(pid, &ws, WNOHANG);

		if (r == pid)
			return shell_status(ws);
		if (r < 0 && errno != EINTR)
			return -1;
		if (th_now_ms() >= deadline)
			return -1;
		sleep_ms(5);
	}
}

static bool sanitized_daemon(void)
{
	return strstr(th_tstaged(), "san-") != NULL;
}

static void push_args(const char **argv, int *n, const char *const *args)
{
	for (; args && *args; args++) {
		ck_assert_msg(*n < MAX_ARGS - 1, "too many arguments");
		argv[(*n)++] = *args;
	}
}

/* The port in the port file, or 0 while it is not written. */
static int read_port(const char *path)
{
	char *text = slurp(path, NULL);
	int port = 0;

	if (text) {
		port = atoi(text);
		free(text);
	}
	return port;
}

/* Starts the daemon as th_daemon_start_ex says. When port_may_be_taken and
 * the daemon exits before listening because a port it was given is taken
 * ("cannot listen" on stderr), returns false with d->pid and d->port 0 and
 * its files removed; any other failure fails the case. */
static bool daemon_start(struct th_daemon *d, const struct th_start *how, bool port_may_be_taken)
{
	static const char *const sim_args[] = {"--sim-devices", "2", "--sim-device-memory",
	                                       TH_SIM_MEMORY_ARG, "--no-cuda", NULL};
	static const char *const cuda_args[] = {"--cuda=true", NULL};
	const char *argv[MAX_ARGS];
	char **envp;
	int n = 0, timeout = how->timeout_ms;
	long long deadline;

	memset(d, 0, sizeof *d);
	make_temp_dir(d->dir, sizeof d->dir, "daemon");
	snprintf(d->port_file, sizeof d->port_file, "%s/port", d->dir);
	snprintf(d->stdout_path, sizeof d->stdout_path, "%s/stdout", d->dir);
	snprintf(d->stderr_path, sizeof d->stderr_path, "%s/stderr", d->dir);

	argv[n++] = th_tstaged();
	argv[n++] = "--port";
	argv[n++] = "0";
	argv[n++] = "--port-file";
	argv[n++] = d->port_file;
	argv[n++] = "--log-level";
	argv[n++] = "warn";
	if (!how->no_backend_args)
		push_args(argv, &n, th_backend_is_sim() ? sim_args : cuda_args);
	push_args(argv, &n, how->args);
	argv[n] = NULL;

	envp = child_env(how->env);
	d->pid = spawn((char *const *)argv, envp, d->stdout_path, d->stderr_path);
	free(envp);
	live_add(d->pid, d->dir);

	if (timeout <= 0)
		timeout = sanitized_daemon() ? 60000 : 10000;
	deadline = th_now_ms() + timeout;
	while ((d->port = read_port(d->port_file)) <= 0) {
		int ws, st;

		if (waitpid(d->pid, &ws, WNOHANG) == d->pid) {
			char *err = th_daemon_stderr(d);

			st = shell_status(ws);
			live_remove(d->pid);
			d->pid = 0;
			if (port_may_be_taken && err && strstr(err, "cannot listen")) {
				fprintf(stderr, "tstaged could not listen, a port taken meanwhile: %s",
				        err);
				free(err);
				th_daemon_cleanup(d);
				return false;
			}
			ck_abort_msg("tstaged exited with %d before listening; stderr:\n%s", st,
			             err ? err : "");
		}
		if (th_now_ms() >= deadline) {
			char *err = th_daemon_stderr(d);

			ck_abort_msg("tstaged wrote no port file within %d ms; stderr:\n%s", timeout,
			             err ? err : "");
		}
		sleep_ms(5);
	}
	snprintf(d->base_url, sizeof d->base_url, "http://127.0.0.1:%d", d->port);
	d->curl = curl_easy_init();
	ck_assert_ptr_nonnull(d->curl);
	return true;
}

void th_daemon_start_ex(struct th_daemon *d, const struct th_start *how)
{
	daemon_start(d, how, false);
}

bool th_daemon_try_start(struct th_daemon *d, const char *const *args)
{
	struct th_start how = {.args = args};

	return daemon_start(d, &how, true);
}

void th_daemon_start(struct th_daemon *d, const char *const *args)
{
	struct th_start how = {.args = args};

	th_daemon_start_ex(d, &how);
}

void th_daemon_signal(struct th_daemon *d, int sig)
{
	ck_assert_msg(d->pid > 0, "no running daemon to signal");
	ck_assert_int_eq(kill(d->pid, sig), 0);
}

int th_daemon_wait(struct th_daemon *d, int timeout_ms)
{
	int st;

	if (d->pid <= 0)
		return 0;
	st = wait_bounded(d->pid, timeout_ms);
	if (st >= 0) {
		live_remove(d->pid);
		d->pid = 0;
	}
	return st;
}

int th_daemon_stop(struct th_daemon *d, bool keep_files)
{
	int st = 0;

	if (d->pid > 0) {
		kill(d->pid, SIGTERM);
		st = th_daemon_wait(d, sanitized_daemon() ? 60000 : 20000);
		if (st < 0) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, NULL, 0);
			live_remove(d->pid);
			d->pid = 0;
		}
	}
	if (d->curl) {
		curl_easy_cleanup(d->curl);
		d->curl = NULL;
	}
	if (!keep_files)
		th_daemon_cleanup(d);
	return st;
}

void th_daemon_stop_ok(struct th_daemon *d)
{
	int st = th_daemon_stop(d, true);
	char *err = st != 0 ? th_daemon_stderr(d) : NULL;

	if (st != 0)
		ck_abort_msg("tstaged exited with %d after SIGTERM (want 0); stderr:\n%s", st,
		             err ? err : "");
	th_daemon_cleanup(d);
}

char *th_daemon_stderr(const struct th_daemon *d)
{
	char *s = slurp(d->stderr_path, NULL);

	return s ? s : strdup("");
}

void th_expect_no_sanitizer_report(const struct th_daemon *d)
{
	static const char *const marks[] = {"WARNING: ThreadSanitizer", "ERROR: AddressSanitizer",
	                                    "ERROR: LeakSanitizer", "runtime error:"};
	char *err = th_daemon_stderr(d);

	for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
		const char *at = strstr(err, marks[i]);

		if (at)
			ck_abort_msg("tstaged reported:\n%.3500s", at);
	}
	free(err);
}

void th_daemon_cleanup(struct th_daemon *d)
{
	remove_dir(d->dir);
	d->dir[0] = '\0';
}

struct th_daemon th_case_daemon;

void th_case_up(void)
{
	th_daemon_start(&th_case_daemon, NULL);
}

void th_case_down(void)
{
	if (th_case_daemon.pid) {
		th_expect_no_sanitizer_report(&th_case_daemon);
		th_daemon_stop_ok(&th_case_daemon);
	}
}

/* ---- running to completion -------------------------------------------------- */

void th_run(const char *const *args, const char *const *env, int timeout_ms,
            struct th_run_result *res)
{
	const char *argv[MAX_ARGS];
	char dir[256], out_path[300], err_path[300];
	char **envp;
	pid_t pid;
	int n = 0;

	memset(res, 0, sizeof *res);
	make_temp_dir(dir, sizeof dir, "run");
	snprintf(out_path, sizeof out_path, "%s/stdout", dir);
	snprintf(err_path, sizeof err_path, "%s/stderr", dir);
	argv[n++] = th_tstaged();
	push_args(argv, &n, args);
	argv[n] = NULL;
	envp = child_env(env);
	pid = spawn((char *const *)argv, envp, out_path, err_path);
	free(envp);
	live_add(pid, dir);
	res->status = wait_bounded(pid, timeout_ms);
	if (res->status < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	live_remove(pid);
	res->out = slurp(out_path, NULL);
	res->err = slurp(err_path, NULL);
	if (!res->out)
		res->out = strdup("");
	if (!res->err)
		res->err = strdup("");
	remove_dir(dir);
}

void th_run_free(struct th_run_result *res)
{
	free(res->out);
	free(res->err);
	res->out = res->err = NULL;
}

/* ---- requests ---------------------------------------------------------------- */

struct upload {
	const char *data;
	size_t len, off;
};

static size_t on_body(char *p, size_t size, size_t nmemb, void *ud)
{
	struct th_response *r = ud;
	size_t n = size * nmemb;

	if (r->body_len + n + 1 > r->body_cap) {
		/* geometric growth: a large body costs O(n), not O(n^2), even where
		 * realloc always copies (sanitizer builds) */
		size_t cap = (r->body_len + n + 1) * 2;
		char *grown = realloc(r->body, cap);

		if (!grown)
			return 0;
		r->body = grown;
		r->body_cap = cap;
	}
	memcpy(r->body + r->body_len, p, n);
	r->body_len += n;
	r->body[r->body_len] = '\0';
	return n;
}

static size_t on_header(char *p, size_t size, size_t nmemb, void *ud)
{
	struct th_response *r = ud;
	size_t n = size * nmemb, len = n;
	const char *colon, *v;
	size_t nlen, vlen;

	while (len && (p[len - 1] == '\n' || p[len - 1] == '\r'))
		len--;
	if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) {
		r->nheaders = 0;        /* a new (possibly final) response begins */
		return n;
	}
	colon = memchr(p, ':', len);
	if (!colon || r->nheaders >= TH_MAX_HEADERS)
		return n;
	nlen = (size_t)(colon - p);
	v = colon + 1;
	while (v < p + len && (*v == ' ' || *v == '\t'))
		v++;
	vlen = (size_t)(p + len - v);
	if (nlen >= sizeof r->headers[0].name)
		nlen = sizeof r->headers[0].name - 1;
	if (vlen >= sizeof r->headers[0].value)
		vlen = sizeof r->headers[0].value - 1;
	memcpy(r->headers[r->nheaders].name, p, nlen);
	r->headers[r->nheaders].name[nlen] = '\0';
	memcpy(r->headers[r->nheaders].value, v, vlen);
	r->headers[r->nheaders].value[vlen] = '\0';
	r->nheaders++;
	return n;
}

static size_t on_read(char *buf, size_t size, size_t nmemb, void *ud)
{
	struct upload *u = ud;
	size_t n = size * nmemb, left = u->len - u->off;

	if (n > left)
		n = left;
	if (n > 64 * 1024)
		n = 64 * 1024;          /* several chunks, as a streaming client sends */
	memcpy(buf, u->data + u->off, n);
	u->off += n;
	return n;
}

static bool is_chunked(const char *const *headers)
{
	for (; headers && *headers; headers++)
		if (strncasecmp(*headers, "Transfer-Encoding:", 18) == 0 &&
		    strstr(*headers + 18, "chunked"))
			return true;
	return false;
}

/* Sends one request on c (base_url + path) into r, without failing the
 * test: CURLE_OK, or curl's error with its words in errbuf. */
static CURLcode perform(CURL *c, const char *base_url, const char *method, const char *path,
                        const char *const *headers, const char *body, size_t body_len,
                        struct th_response *r, char *errbuf)
{
	struct curl_slist *hl = NULL;
	struct upload up = {body, body_len, 0};
	char url[1200];
	CURLcode rc;

	memset(r, 0, sizeof *r);
	errbuf[0] = '\0';
	snprintf(url, sizeof url, "%s%s", base_url, path);
	curl_easy_reset(c);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 30000L);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
	for (const char *const *h = headers; h && *h; h++)
		hl = curl_slist_append(hl, *h);
	if (hl)
		curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);

	if (strcmp(method, "HEAD") == 0) {
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	} else if (body && is_chunked(headers)) {
		curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(c, CURLOPT_READDATA, &up);
		if (strcmp(method, "POST") == 0) {
			curl_easy_setopt(c, CURLOPT_POST, 1L);
		} else {
			curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
			curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
		}
	} else if (body || strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "");
		if (strcmp(method, "POST") != 0)
			curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	} else if (strcmp(method, "GET") != 0) {
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	}
	rc = curl_easy_perform(c);
	curl_slist_free_all(hl);
	/* the transfer is over: curl must not write to errbuf any more */
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, NULL);
	if (rc == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
	if (!r->body)
		r->body = strdup("");
	return rc;
}

void th_request(struct th_daemon *d, const char *method, const char *path,
                const char *const *headers, const char *body, size_t body_len,
                struct th_response *r)
{
	char errbuf[CURL_ERROR_SIZE];
	CURLcode rc;

	memset(r, 0, sizeof *r);
	ck_assert_msg(d->curl != NULL, "no running daemon to send %s %s to", method, path);
	rc = perform(d->curl, d->base_url, method, path, headers, body, body_len, r, errbuf);
	ck_assert_msg(rc == CURLE_OK, "%s %s: curl: %s (%s)", method, path,
	              curl_easy_strerror(rc), errbuf);
	ck_assert_ptr_nonnull(r->body);
}

/* ---- clients of their own (one per thread) -------------------------------------- */

void th_client_open(struct th_client *c, const struct th_daemon *d)
{
	memset(c, 0, sizeof *c);
	ck_assert_msg(d->base_url[0], "no running daemon to open a client to");
	snprintf(c->base_url, sizeof c->base_url, "%s", d->base_url);
	c->curl = curl_easy_init();
	ck_assert_ptr_nonnull(c->curl);
}

void th_client_close(struct th_client *c)
{
	if (c->curl)
		curl_easy_cleanup(c->curl);
	c->curl = NULL;
}

bool th_client_request(struct th_client *c, const char *method, const char *path,
                       const char *const *headers, const char *body, size_t body_len,
                       struct th_response *r)
{
	CURLcode rc;

	if (!c->curl) {
		memset(r, 0, sizeof *r);
		snprintf(c->error, sizeof c->error, "client is not open");
		return false;
	}
	rc = perform(c->curl, c->base_url, method, path, headers, body, body_len, r, c->error);
	if (rc != CURLE_OK && !c->error[0])
		snprintf(c->error, sizeof c->error, "%s", curl_easy_strerror(rc));
	else if (rc == CURLE_OK && !r->body)
		snprintf(c->error, sizeof c->error, "out of memory for the body");
	return rc == CURLE_OK && r->body != NULL;
}

char *th_fmt(const char *f, ...)
{
	va_list ap;
	char *s = NULL;
	int n;

	va_start(ap, f);
	n = vasprintf(&s, f, ap);
	va_end(ap);
	ck_assert_msg(n >= 0 && s, "vasprintf failed for '%s'", f);
	return s;
}

void th_get(struct th_daemon *d, const char *path, struct th_response *r)
{
	th_request(d, "GET", path, NULL, NULL, 0, r);
}

json_t *th_get_json(struct th_daemon *d, const char *path, struct th_response *r)
{
	json_t *j;

	th_get(d, path, r);
	ck_assert_msg(r->status == 200, "GET %s: status %ld, body %s", path, r->status, r->body);
	j = th_json(r);
	ck_assert_msg(json_is_object(j), "GET %s: body is not a JSON object: %s", path, r->body);
	return j;
}

void th_post(struct th_daemon *d, const char *path, const char *body, struct th_response *r)
{
	th_post_headers(d, path, body, NULL, r);
}

void th_post_headers(struct th_daemon *d, const char *path, const char *body,
                     const char *const *headers, struct th_response *r)
{
	static const char *const json_headers[] = {"Content-Type: application/json", NULL};

	if (!headers && body)
		headers = json_headers;
	th_request(d, "POST", path, headers, body, body ? strlen(body) : 0, r);
}

void th_post_on_backend(struct th_daemon *d, const char *path, const char *body,
                        struct th_response *r)
{
	th_post(d, th_on_backend(path), th_on_backend(body), r);
}

json_t *th_post_json_on_backend(struct th_daemon *d, const char *path, const char *body,
                                long want)
{
	return th_post_json(d, th_on_backend(path), th_on_backend(body), want);
}

json_t *th_post_json(struct th_daemon *d, const char *path, const char *body, long want)
{
	struct th_response r;
	json_t *j;

	th_post(d, path, body, &r);
	ck_assert_msg(r.status == want, "POST %s %.2000s: %ld, want %ld: %s", path,
	              body ? body : "", r.status, want, r.body);
	j = json_incref(th_json(&r));
	th_response_free(&r);
	return j;
}

json_t *th_get_object(struct th_daemon *d, const char *path)
{
	struct th_response r;
	json_t *j = json_incref(th_get_json(d, path, &r));

	th_response_free(&r);
	return j;
}

long th_get_status(struct th_daemon *d, const char *path)
{
	struct th_response r;
	long st;

	th_get(d, path, &r);
	st = r.status;
	th_response_free(&r);
	return st;
}

void th_put_array(struct th_daemon *d, const char *name, const char *query, const void *data,
                  size_t n)
{
	struct th_response r;
	char path[2048];

	snprintf(path, sizeof path, "/v1/arrays/%s%s%s", name, query && *query ? "?" : "",
	         query ? query : "");
	th_request(d, "PUT", path, NULL, data, n, &r);
	ck_assert_msg(r.status == 200 || r.status == 201, "PUT %s: %ld %s", path, r.status, r.body);
	th_response_free(&r);
}

char *th_get_bytes(struct th_daemon *d, const char *path, size_t *n)
{
	struct th_response r;
	char *x;

	th_get(d, path, &r);
	ck_assert_msg(r.status == 200, "GET %s: %ld %s", path, r.status, r.body);
	*n = r.body_len;
	x = malloc(r.body_len ? r.body_len : 1);
	ck_assert_ptr_nonnull(x);
	memcpy(x, r.body, r.body_len);
	th_response_free(&r);
	return x;
}

char *th_download(struct th_daemon *d, const char *name, size_t *n)
{
	char path[300];

	snprintf(path, sizeof path, "/v1/arrays/%s/data", name);
	return th_get_bytes(d, path, n);
}

json_t *th_model_step(struct th_daemon *d, const char *model, const char *body)
{
	char path[300];

	snprintf(path, sizeof path, "/v1/models/%s:step?wait=true", model);
	return th_post_json(d, path, body, 200);
}

void th_model_losses(struct th_daemon *d, const char *model, const char *inputs,
                     const char *targets, int n, double *out)
{
	char *body = th_fmt("{\"inputs\": \"%s\", \"targets\": \"%s\", \"steps\": %d}", inputs,
	                    targets, n);
	json_t *res = th_model_step(d, model, body), *losses = th_arr(res, "losses");

	ck_assert_uint_eq(json_array_size(losses), (size_t)n);
	for (int i = 0; i < n; i++)
		out[i] = json_number_value(json_array_get(losses, (size_t)i));
	json_decref(res);
	free(body);
}

char *th_export_model(struct th_daemon *d, const char *name, size_t *len)
{
	char path[300];

	snprintf(path, sizeof path, "/v1/models/%s:export", name);
	return th_get_bytes(d, path, len);
}

void th_import_model(struct th_daemon *d, const char *query, const void *file, size_t len,
                     struct th_response *r)
{
	static const char *const octet_headers[] = {"Content-Type: application/octet-stream", NULL};
	char path[300];

	snprintf(path, sizeof path, "/v1/models:import%s%s", query ? "?" : "", query ? query : "");
	th_request(d, "POST", path, octet_headers, file, len, r);
}

void th_import_ok(struct th_daemon *d, const char *query, const void *file, size_t len)
{
	struct th_response r;

	th_import_model(d, query, file, len, &r);
	ck_assert_msg(r.status == 201, "import: %ld %s", r.status, r.body);
	ck_assert_str_eq(th_str(th_json(&r), "state"), "READY");
	th_response_free(&r);
}

void th_put_floats(struct th_daemon *d, const char *name, const float *x, size_t rows,
                   size_t cols, const char *extra)
{
	char query[1024];

	snprintf(query, sizeof query, "dtype=float32&shape=%zu,%zu%s%s", rows, cols,
	         extra ? "&" : "", extra ? extra : "");
	th_put_array(d, name, query, x, rows * cols * sizeof *x);
}

float *th_download_floats(struct th_daemon *d, const char *name, size_t *n)
{
	size_t bytes;
	char *x = th_download(d, name, &bytes);

	ck_assert_msg(bytes % sizeof(float) == 0, "GET /v1/arrays/%s/data: %zu bytes, not whole floats",
	              name, bytes);
	*n = bytes / sizeof(float);
	return (float *)(void *)x;
}

json_t *th_array_meta(struct th_daemon *d, const char *name)
{
	char path[300];

	snprintf(path, sizeof path, "/v1/arrays/%s", name);
	return th_get_object(d, path);
}

void th_expect_data(struct th_daemon *d, const char *name, const char *index, const void *want,
                    size_t len)
{
	struct th_response r;
	char path[1024], esc[512], what[1100];

	if (index) {
		th_url_escape(esc, sizeof esc, index);
		snprintf(path, sizeof path, "/v1/arrays/%s/data?index=%s", name, esc);
	} else {
		snprintf(path, sizeof path, "/v1/arrays/%s/data", name);
	}
	th_get(d, path, &r);
	ck_assert_msg(r.status == 200, "GET %s: %ld %s", path, r.status, r.body);
	snprintf(what, sizeof what, "GET %s", path);
	th_assert_bytes(what, r.body, r.body_len, want, len);
	th_response_free(&r);
}

/* Fails the test unless r's error message contains word. */
static void expect_message_names(struct th_response *r, const char *what, const char *word)
{
	const char *msg = th_str(th_obj(th_json(r), "error"), "message");

	ck_assert_msg(strstr(msg, word), "%s: the message does not name '%s': %s", what, word, msg);
}

void th_expect_error(struct th_response *r, const char *what, long http, const char *status,
                     const char *reason, const char *word, const char *word2)
{
	ck_assert_msg(r->status == http, "%s: %ld, want %ld: %s", what, r->status, http, r->body);
	th_assert_error(r, http, status, reason);
	if (word)
		expect_message_names(r, what, word);
	if (word2)
		expect_message_names(r, what, word2);
	th_response_free(r);
}

void th_post_error(struct th_daemon *d, const char *path, const char *body, long http,
                   const char *status, const char *reason, const char *word, const char *word2)
{
	struct th_response r;
	char what[600];

	snprintf(what, sizeof what, "POST %s %.400s", path, body ? body : "");
	th_post(d, path, body, &r);
	th_expect_error(&r, what, http, status, reason, word, word2);
}

void th_post_error_words(struct th_daemon *d, const char *path, const char *body, long http,
                         const char *status, const char *reason, ...)
{
	struct th_response r;
	const char *word;
	char what[600];
	va_list ap;

	snprintf(what, sizeof what, "POST %s %.400s", path, body ? body : "");
	th_post(d, path, body, &r);
	ck_assert_msg(r.status == http, "%s: %ld, want %ld: %s", what, r.status, http, r.body);
	th_assert_error(&r, http, status, reason);
	va_start(ap, reason);
	while ((word = va_arg(ap, const char *)) != NULL)
		expect_message_names(&r, what, word);
	va_end(ap);
	th_response_free(&r);
}

bool th_spaces_match_shards(struct th_daemon *d, char *why, size_t cap)
{
	struct th_response r;
	json_t *sums = json_object(), *a, *s, *list, *shard;
	size_t i, k, o = 0;
	bool ok = true;

	list = th_arr(th_get_json(d, "/v1/arrays?page_size=1000", &r), "arrays");
	ck_assert_ptr_null(json_object_get(th_json(&r), "next_page_token"));
	json_array_foreach(list, i, a) {
		json_array_foreach(th_arr(a, "shards"), k, shard) {
			char key[64];

			snprintf(key, sizeof key, "%s/%s", th_str(shard, "device"),
			         th_str(shard, "memory_kind"));
			json_object_set_new(sums, key,
			                    json_integer(json_integer_value(json_object_get(sums, key)) +
			                                 th_int(shard, "nbytes")));
		}
	}
	th_response_free(&r);
	why[0] = '\0';
	list = th_arr(th_get_json(d, "/v1/memory", &r), "spaces");
	json_array_foreach(list, i, s) {
		char key[64];
		json_int_t want;

		snprintf(key, sizeof key, "%s/%s", th_str(s, "device"), th_str(s, "memory_kind"));
		want = json_integer_value(json_object_get(sums, key));
		if (th_int(s, "bytes_in_use") != want) {
			ok = false;
			o += (size_t)snprintf(why + o, cap > o ? cap - o : 0,
			                      "%s holds %lld, its shards %lld; ", key,
			                      (long long)th_int(s, "bytes_in_use"), (long long)want);
		}
	}
	th_response_free(&r);
	json_decref(sums);
	return ok;
}

bool th_daemon_has_device(struct th_daemon *d, const char *id)
{
	struct th_response r;
	json_t *devices, *dev;
	bool found = false;
	size_t i;

	/* fetched once: json_array_foreach evaluates its array per item */
	devices = th_arr(th_get_json(d, "/v1/devices", &r), "devices");
	json_array_foreach(devices, i, dev)
		found = found || strcmp(th_str(dev, "id"), id) == 0;
	th_response_free(&r);
	return found;
}

bool th_second_device(struct th_daemon *d, const char *what)
{
	if (th_daemon_has_device(d, th_dev(1)))
		return true;
	size_t n = strlen(what);

	/* Check's START_TEST(name) makes a function name_fn */
	if (n > 3 && strcmp(what + n - 3, "_fn") == 0)
		n -= 3;
	fprintf(stderr, "SKIP %.*s: needs a second device (%s), which this machine has not\n",
	        (int)n, what, th_dev(1));
	return false;
}

void th_response_free(struct th_response *r)
{
	free(r->body);
	json_decref(r->json);
	memset(r, 0, sizeof *r);
}

const char *th_header(const struct th_response *r, const char *name)
{
	for (int i = 0; i < r->nheaders; i++)
		if (strcasecmp(r->headers[i].name, name) == 0)
			return r->headers[i].value;
	return NULL;
}

json_t *th_json(struct th_response *r)
{
	json_error_t e;

	if (!r->json) {
		r->json = json_loadb(r->body, r->body_len, 0, &e);
		ck_assert_msg(r->json != NULL, "body is not JSON (%s at %d:%d): %.300s", e.text,
		              e.line, e.column, r->body);
	}
	return r->json;
}

/* ---- raw HTTP ---------------------------------------------------------------------- */

int th_raw_connect(const struct th_daemon *d)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)d->port)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0,
	              "connect to port %d: %s", d->port, strerror(errno));
	return fd;
}

void th_raw_send_bytes(int fd, const void *data, size_t len)
{
	const char *p = data;
	size_t off = 0;

	while (off < len) {
		ssize_t n = send(fd, p + off, len - off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		ck_assert_msg(n > 0, "send: %s", strerror(errno));
		off += (size_t)n;
	}
}

void th_raw_send(int fd, const char *text)
{
	th_raw_send_bytes(fd, text, strlen(text));
}

/* Bytes of a complete response in buf[0..len), or 0 while incomplete. */
static size_t raw_complete(const char *buf, size_t len)
{
	const char *end = memmem(buf, len, "\r\n\r\n", 4), *cl;
	size_t head, body = 0;

	if (!end)
		return 0;
	head = (size_t)(end - buf) + 4;
	for (cl = buf; (cl = memmem(cl, head - (size_t)(cl - buf), "\r\n", 2)) != NULL; cl += 2) {
		if (strncasecmp(cl + 2, "Content-Length:", 15) == 0) {
			body = strtoul(cl + 17, NULL, 10);
			break;
		}
	}
	return len >= head + body ? head + body : 0;
}

int th_raw_response(int fd, char *buf, size_t cap, int timeout_ms)
{
	long long deadline = th_now_ms() + timeout_ms;
	size_t len = 0;

	buf[0] = '\0';
	while (!raw_complete(buf, len)) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		long long left = deadline - th_now_ms();
		ssize_t n;

		if (left <= 0 || len + 1 >= cap)
			return -1;
		if (poll(&pfd, 1, (int)left) <= 0)
			continue;
		n = recv(fd, buf + len, cap - len - 1, 0);
		if (n <= 0)
			return -1;
		len += (size_t)n;
		buf[len] = '\0';
	}
	if (strncmp(buf, "HTTP/1.", 7) != 0 || len < 12)
		return -1;
	return atoi(buf + 9);
}

/* ---- JSON accessors --------------------------------------------------------------- */

static json_t *member(json_t *o, const char *key)
{
	json_t *v;

	ck_assert_msg(json_is_object(o), "not a JSON object (looking for '%s')", key);
	v = json_object_get(o, key);
	ck_assert_msg(v != NULL, "member '%s' missing", key);
	return v;
}

json_t *th_op_meta(json_t *op, const char *key)
{
	json_t *meta = json_object_get(op, "metadata");

	return member(json_is_object(meta) ? meta : op, key);
}

json_t *th_op_get(struct th_daemon *d, const char *id)
{
	char path[160];

	snprintf(path, sizeof path, "/v1/operations/%.120s", id);
	return th_get_object(d, path);
}

bool th_op_terminal(const char *state)
{
	return strcmp(state, "SUCCEEDED") == 0 || strcmp(state, "FAILED") == 0 ||
	       strcmp(state, "CANCELLED") == 0;
}

json_t *th_op_result(json_t *op)
{
	json_t *v = json_object_get(op, "response");

	return v ? v : member(op, "result");
}

json_t *th_obj(json_t *o, const char *key)
{
	json_t *v = member(o, key);

	ck_assert_msg(json_is_object(v), "member '%s' is not an object", key);
	return v;
}

json_t *th_arr(json_t *o, const char *key)
{
	json_t *v = member(o, key);

	ck_assert_msg(json_is_array(v), "member '%s' is not an array", key);
	return v;
}

const char *th_str(json_t *o, const char *key)
{
	json_t *v = member(o, key);

	ck_assert_msg(json_is_string(v), "member '%s' is not a string", key);
	return json_string_value(v);
}

json_int_t th_int(json_t *o, const char *key)
{
	json_t *v = member(o, key);

	ck_assert_msg(json_is_integer(v), "member '%s' is not an integer", key);
	return json_integer_value(v);
}

bool th_bool(json_t *o, const char *key)
{
	json_t *v = member(o, key);

	ck_assert_msg(json_is_boolean(v), "member '%s' is not a boolean", key);
	return json_is_true(v);
}

/* ---- the error shape ---------------------------------------------------------------- */

/* google.rpc canonical codes and their HTTP numbers (AIP-193). */
static const struct {
	const char *name;
	long http;
} canonical[] = {
	{"CANCELLED", 499}, {"UNKNOWN", 500}, {"INVALID_ARGUMENT", 400},
	{"DEADLINE_EXCEEDED", 504}, {"NOT_FOUND", 404}, {"ALREADY_EXISTS", 409},
	{"PERMISSION_DENIED", 403}, {"RESOURCE_EXHAUSTED", 429},
	{"FAILED_PRECONDITION", 400}, {"ABORTED", 409}, {"OUT_OF_RANGE", 400},
	{"UNIMPLEMENTED", 501}, {"INTERNAL", 500}, {"UNAVAILABLE", 503},
	{"DATA_LOSS", 500}, {"UNAUTHENTICATED", 401},
};

static long canonical_http(const char *name)
{
	for (size_t i = 0; i < sizeof canonical / sizeof canonical[0]; i++)
		if (strcmp(canonical[i].name, name) == 0)
			return canonical[i].http;
	return -1;
}

void th_assert_error(struct th_response *r, long http, const char *status,
                     const char *reason)
{
	const char *ct = th_header(r, "Content-Type"), *got_status, *msg, *got_reason;
	json_t *err, *details, *info;
	long want_http;

	ck_assert_msg(r->status == http, "status %ld, want %ld; body %s", r->status, http,
	              r->body);
	ck_assert_msg(ct && strncmp(ct, "application/json", 16) == 0,
	              "error Content-Type '%s', want application/json", ct ? ct : "(none)");
	err = th_obj(th_json(r), "error");
	ck_assert_msg(th_int(err, "code") == http, "error.code %lld, want %ld; body %s",
	              (long long)th_int(err, "code"), http, r->body);
	got_status = th_str(err, "status");
	ck_assert_msg(strcmp(got_status, status) == 0, "error.status '%s', want '%s'",
	              got_status, status);
	want_http = canonical_http(got_status);
	/* 405 has no canonical code: it goes with INVALID_ARGUMENT, never with
	 * UNIMPLEMENTED (501) */
	ck_assert_msg(want_http == http || (http == 405 && strcmp(got_status, "INVALID_ARGUMENT") == 0),
	              "status %s goes with HTTP %ld, not %ld", got_status, want_http, http);
	msg = th_str(err, "message");
	ck_assert_msg(msg[0] != '\0', "error.message is empty");
	details = th_arr(err, "details");
	ck_assert_msg(json_array_size(details) >= 1, "error.details is empty");
	info = json_array_get(details, 0);
	ck_assert_str_eq(th_str(info, "@type"), "type.googleapis.com/google.rpc.ErrorInfo");
	got_reason = th_str(info, "reason");
	ck_assert_msg(got_reason[0] != '\0', "details[0].reason is empty");
	if (reason)
		ck_assert_msg(strcmp(got_reason, reason) == 0, "reason '%s', want '%s'",
		              got_reason, reason);
	ck_assert_str_eq(th_str(info, "domain"), "tstage");
	th_obj(info, "metadata");
}

/* ---- Prometheus text ----------------------------------------------------------------- */

static bool name_start(int c)
{
	return isalpha(c) || c == '_' || c == ':';
}

static bool name_char(int c)
{
	return isalnum(c) || c == '_' || c == ':';
}

/* Parses a label value after the opening quote; advances *pp past the
 * closing quote. */
static bool parse_label_value(const char **pp, const char *end, char *out, size_t cap)
{
	const char *p = *pp;
	size_t o = 0;

	while (p < end && *p != '"') {
		char c = *p++;

		if (c == '\\') {
			if (p >= end)
				return false;
			c = *p++;
			if (c == 'n')
				c = '\n';
			else if (c != '\\' && c != '"')
				return false;
		} else if (c == '\n') {
			return false;
		}
		if (o + 1 < cap)
			out[o++] = c;
	}
	if (p >= end)
		return false;
	out[o] = '\0';
	*pp = p + 1;
	return true;
}

static bool parse_labels(const char **pp, const char *end, struct th_prom_sample *s)
{
	const char *p = *pp + 1;       /* past '{' */

	while (p < end && *p != '}') {
		size_t n = 0;

		if (s->nlabels >= TH_PROM_MAX_LABELS || !name_start((unsigned char)*p) ||
		    *p == ':')
			return false;
		while (p < end && name_char((unsigned char)*p) && *p != ':') {
			if (n + 1 < sizeof s->labels[0].name)
				s->labels[s->nlabels].name[n++] = *p;
			p++;
		}
		s->labels[s->nlabels].name[n] = '\0';
		if (p + 1 >= end || p[0] != '=' || p[1] != '"')
			return false;
		p += 2;
		if (!parse_label_value(&p, end, s->labels[s->nlabels].value,
		                       sizeof s->labels[0].value))
			return false;
		s->nlabels++;
		if (p < end && *p == ',')
			p++;
		else if (p < end && *p != '}')
			return false;
	}
	if (p >= end)
		return false;
	*pp = p + 1;
	return true;
}

bool th_prom_parse_line(const char *line, size_t len, struct th_prom_sample *s)
{
	const char *p = line, *end = line + len;
	char num[64], *num_end;
	size_t n = 0;

	memset(s, 0, sizeof *s);
	if (p >= end || !name_start((unsigned char)*p))
		return false;
	while (p < end && name_char((unsigned char)*p)) {
		if (n + 1 >= sizeof s->name)
			return false;
		s->name[n++] = *p++;
	}
	s->name[n] = '\0';
	if (p < end && *p == '{' && !parse_labels(&p, end, s))
		return false;
	if (p >= end || *p != ' ')
		return false;
	p++;
	n = 0;
	while (p < end && *p != ' ' && n + 1 < sizeof num)
		num[n++] = *p++;
	num[n] = '\0';
	if (n == 0)
		return false;
	s->value = strtod(num, &num_end);
	if (*num_end != '\0')
		return false;
	if (p < end) {             /* an optional integer timestamp */
		p++;
		if (p < end && *p == '-')
			p++;
		if (p >= end)
			return false;
		for (; p < end; p++)
			if (!isdigit((unsigned char)*p))
				return false;
	}
	return true;
}

static bool comment_ok(const char *line, size_t len)
{
	const char *p;

	if (len >= 7 && (strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0)) {
		p = line + 7;
		if (p >= line + len || !name_start((unsigned char)*p))
			return false;
		return true;
	}
	return len >= 1 && line[0] == '#';    /* other comments are allowed */
}

int th_prom_validate(const char *text, char *why, size_t cap)
{
	const char *p = text;
	int samples = 0, lineno = 0;
	struct th_prom_sample s;

	while (*p) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);

		lineno++;
		if (len > 0) {
			bool ok = p[0] == '#' ? comment_ok(p, len) : th_prom_parse_line(p, len, &s);

			if (!ok) {
				snprintf(why, cap, "line %d: '%.*s'", lineno, (int)(len < 200 ? len : 200), p);
				return -1;
			}
			if (p[0] != '#')
				samples++;
		}
		if (!nl)
			break;
		p = nl + 1;
	}
	return samples;
}

struct th_prom_sample *th_prom_samples(const char *text, int *n)
{
	char why[300];
	int count = th_prom_validate(text, why, sizeof why), i = 0;
	struct th_prom_sample *all;
	const char *p = text;

	ck_assert_msg(count >= 0, "bad Prometheus text at %s", why);
	all = calloc((size_t)count + 1, sizeof *all);
	ck_assert_ptr_nonnull(all);
	while (*p && i < count) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);

		if (len > 0 && p[0] != '#')
			th_prom_parse_line(p, len, &all[i++]);
		if (!nl)
			break;
		p = nl + 1;
	}
	*n = i;
	return all;
}

const char *th_prom_label(const struct th_prom_sample *s, const char *name)
{
	for (int i = 0; i < s->nlabels; i++)
		if (strcmp(s->labels[i].name, name) == 0)
			return s->labels[i].value;
	return NULL;
}

static bool same_labels(const struct th_prom_sample *a, const struct th_prom_sample *b)
{
	if (a->nlabels != b->nlabels)
		return false;
	for (int i = 0; i < a->nlabels; i++) {
		const char *v = th_prom_label(b, a->labels[i].name);

		if (!v || strcmp(v, a->labels[i].value) != 0)
			return false;
	}
	return true;
}

bool th_prom_find(const char *text, const char *name, const char *labels, double *out)
{
	struct th_prom_sample want, s;
	char line[1024];
	const char *p = text;
	int n;

	n = snprintf(line, sizeof line, "%s{%s} 0", name, labels ? labels : "");
	ck_assert_msg(n > 0 && (size_t)n < sizeof line && th_prom_parse_line(line, (size_t)n, &want),
	              "bad sample selector %s{%s}", name, labels ? labels : "");
	while (*p) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);

		if (len > 0 && p[0] != '#' && th_prom_parse_line(p, len, &s) &&
		    strcmp(s.name, want.name) == 0 && same_labels(&s, &want)) {
			if (out)
				*out = s.value;
			return true;
		}
		if (!nl)
			break;
		p = nl + 1;
	}
	return false;
}

/* ---- bytes ------------------------------------------------------------------ */

uint64_t th_rand(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

void th_fill(void *buf, size_t n, uint64_t seed)
{
	unsigned char *p = buf;
	uint64_t s = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull, v;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		v = th_rand(&s);
		memcpy(p + i, &v, 8);
	}
	if (i < n) {
		v = th_rand(&s);
		memcpy(p + i, &v, n - i);
	}
}

void *th_pattern(size_t n, uint64_t seed)
{
	void *p = malloc(n ? n : 1);

	ck_assert_ptr_nonnull(p);
	th_fill(p, n, seed);
	return p;
}

void th_assert_bytes(const char *what, const void *got, size_t got_len, const void *want,
                     size_t want_len)
{
	const unsigned char *g = got, *w = want;
	size_t i = 0;

	ck_assert_msg(got_len == want_len, "%s: %zu bytes, want %zu", what, got_len, want_len);
	if (want_len == 0 || memcmp(g, w, want_len) == 0)
		return;
	while (g[i] == w[i])
		i++;
	ck_abort_msg("%s: byte %zu of %zu is 0x%02x, want 0x%02x", what, i, want_len, g[i], w[i]);
}

/* ---- float32 data ------------------------------------------------------------ */

void th_fill_floats(float *x, size_t n, unsigned seed, float lo, float hi)
{
	uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;

	for (size_t i = 0; i < n; i++)
		x[i] = lo + (hi - lo) * (float)(th_rand(&s) >> 40) / 16777216.0f;
}

float *th_floats(size_t n, unsigned seed, float lo, float hi)
{
	float *x = malloc(n ? n * sizeof *x : 1);

	ck_assert_ptr_nonnull(x);
	th_fill_floats(x, n, seed, lo, hi);
	return x;
}

float *th_signed_floats(size_t n, uint64_t seed)
{
	float *x = malloc(n ? n * sizeof *x : 1);
	uint64_t s = seed;

	ck_assert_ptr_nonnull(x);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)((double)(th_rand(&s) >> 11) / 9007199254740992.0 * 4.0 - 2.0);
	return x;
}

void th_assert_same_floats(const char *what, const float *got, size_t ngot, const float *want,
                           size_t nwant)
{
	ck_assert_msg(ngot == nwant, "%s: %zu floats, want %zu", what, ngot, nwant);
	for (size_t i = 0; i < nwant; i++)
		if (memcmp(&got[i], &want[i], sizeof got[i]) != 0)
			ck_abort_msg("%s: element %zu is %.9g, want %.9g (bit for bit)", what, i,
			             (double)got[i], (double)want[i]);
}

void th_assert_close_floats(const char *what, const float *got, size_t ngot, const float *want,
                            size_t nwant, double rel)
{
	double scale = 0;

	ck_assert_msg(ngot == nwant, "%s: %zu floats, want %zu", what, ngot, nwant);
	for (size_t i = 0; i < nwant; i++)
		scale = fmax(scale, fabs((double)want[i]));
	ck_assert_msg(scale > 0, "%s: the reference is all zeros", what);
	for (size_t i = 0; i < nwant; i++)
		if (!(fabs((double)got[i] - (double)want[i]) <= rel * scale))
			ck_abort_msg("%s: element %zu is %.9g, reference %.9g (tolerance %.3g)", what, i,
			             (double)got[i], (double)want[i], rel * scale);
}

const char *th_py_dir(void)
{
	static char dir[1024];
	const char *env = getenv("TS_IT_PY_DIR"), *slash = strrchr(__FILE__, '/');

	if (env && *env)
		snprintf(dir, sizeof dir, "%s", env);
	else if (slash)
		snprintf(dir, sizeof dir, "%.*s/py", (int)(slash - __FILE__), __FILE__);
	else
		snprintf(dir, sizeof dir, "py");
	return dir;
}

void th_url_escape(char *out, size_t cap, const char *in)
{
	char *e = curl_easy_escape(NULL, in, 0);

	ck_assert_ptr_nonnull(e);
	ck_assert_msg(strlen(e) < cap, "escaped value too long: %s", e);
	snprintf(out, cap, "%s", e);
	curl_free(e);
}

/* ---- the one main ------------------------------------------------------------------ */

int main(void)
{
	SRunner *sr;
	int failed;

	curl_global_init(CURL_GLOBAL_DEFAULT);
	th_init();
	/* room for a sanitizer's report with its stacks */
	check_set_max_msg_size(32768);
	sr = srunner_create(th_suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	curl_global_cleanup();
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
