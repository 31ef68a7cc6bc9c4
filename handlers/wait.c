/*
 * wait.c - answering when an operation finishes, without holding a thread:
 * POST /v1/operations/{operation}:wait, and ?wait=true / Prefer: wait=N on
 * calls that start operations. The connection is suspended; the operation's
 * completion (or the deadline) resumes it.
 */
#include "handlers/handlers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/units.h"
#include "handlers/operations.h"
#include "ops/operation.h"

/* the largest timeout a :wait may name; what it waits is then cut to
 * --wait-limit (core->wait_limit_ns), as a ?wait=true or Prefer: wait=N is */
#define WAIT_MAX_S 3600

struct waiter {
	struct ts_operation *op;        /* own reference */
	bool answer_result;             /* finished: answer the result itself, not the operation */
};

static bool waiter_arm(void *state, void (*wake)(void *token), void *token)
{
	struct waiter *w = state;

	return ts_operation_wait(w->op, wake, token);
}

static void waiter_disarm(void *state, void (*wake)(void *token), void *token)
{
	struct waiter *w = state;

	ts_operation_unwait(w->op, wake, token);
}

/* The answer for op as snap shows it: the operation, or once finished and
 * when answer_result, its result or error. */
static void answer(struct ts_reply *reply, struct ts_operation *op, bool answer_result,
                   const struct ts_op_snapshot *snap)
{
	if (!snap->done || !answer_result)
		ts_h_reply_operation(reply, op, snap->done);
	else if (snap->state == TS_OP_SUCCEEDED)
		ts_reply_json(reply, TS_HTTP_OK,
		              snap->result ? json_incref(snap->result) : json_object());
	else
		ts_reply_error(reply, &snap->error);
}

static void waiter_resume(void *state, bool timed_out, struct ts_reply *reply)
{
	struct waiter *w = state;
	struct ts_op_snapshot snap;

	ts_operation_snapshot(w->op, &snap);
	answer(reply, w->op, w->answer_result, &snap);
	(void)timed_out;
	ts_op_snapshot_release(&snap);
}

static void waiter_release(void *state)
{
	struct waiter *w = state;

	ts_operation_unref(w->op);
	free(w);
}

void ts_h_reply_wait(struct ts_reply *reply, struct ts_operation *op, uint64_t timeout_ns,
                     bool answer_result)
{
	struct waiter *w;
	struct ts_op_snapshot snap;
	struct ts_suspend s;

	/* finished already (it ran on this thread): answered now, the
	 * connection never suspended */
	ts_operation_snapshot(op, &snap);
	if (snap.done) {
		answer(reply, op, answer_result, &snap);
		ts_op_snapshot_release(&snap);
		return;
	}
	ts_op_snapshot_release(&snap);
	w = malloc(sizeof *w);
	if (!w) {
		ts_h_reply_operation(reply, op, false);
		return;
	}
	w->op = ts_operation_ref(op);
	w->answer_result = answer_result;
	s = (struct ts_suspend){.timeout_ns = timeout_ns, .arm = waiter_arm,
	                        .disarm = waiter_disarm, .resume = waiter_resume,
	                        .release = waiter_release, .state = w};
	ts_reply_suspend(reply, &s);
}

/* A wait of ns, cut to --wait-limit (0 there: no limit, for tests). */
static uint64_t wait_cut(const struct ts_call *call, uint64_t ns)
{
	uint64_t limit = call->core->wait_limit_ns;

	return limit && ns > limit ? limit : ns;
}

bool ts_h_wait_requested(const struct ts_call *call, uint64_t *timeout_ns)
{
	const char *q = ts_call_query(call, "wait"), *prefer = ts_call_header(call, "Prefer");
	long secs;
	const char *p;

	if (prefer && (p = strcasestr(prefer, "wait=")) != NULL) {
		char num[16];
		size_t n = strspn(p + 5, "0123456789");

		if (n && n < sizeof num) {
			memcpy(num, p + 5, n);
			num[n] = '\0';
			secs = atol(num);
			*timeout_ns = wait_cut(call, (uint64_t)(secs > WAIT_MAX_S ? WAIT_MAX_S : secs) *
			                             1000000000ull);
			return true;
		}
	}
	/* the route declares wait:bool, so q is "true" or "false" */
	if (q && strcmp(q, "true") == 0) {
		*timeout_ns = wait_cut(call, (uint64_t)WAIT_MAX_S * 1000000000ull);
		return true;
	}
	return false;
}

/* Seconds as AIP-151 writes a duration ("30s", "1.5s") or a bare number:
 * digits, an optional fraction, an optional 's'; nothing else. */
static bool parse_seconds(const char *t, double *secs)
{
	const char *p = t;
	size_t whole = strspn(p, "0123456789"), frac = 0;
	char *end;

	p += whole;
	if (*p == '.') {
		frac = strspn(p + 1, "0123456789");
		p += 1 + frac;
	}
	if (whole + frac == 0 || whole > 9 || (*p && strcmp(p, "s") != 0))
		return false;
	*secs = strtod(t, &end);
	return end == p;
}

ts_status ts_h_wait_timeout(const char *query, const char *body, size_t body_len,
                            uint64_t *timeout_ns, struct ts_error *err)
{
	const char *t = query, *bt = NULL;
	double secs = WAIT_MAX_S;
	json_error_t jerr;
	json_t *j = NULL;
	ts_status st = TS_OK;
	size_t blank = 0;

	while (blank < body_len && body[blank] && strchr(" \t\r\n", body[blank]))
		blank++;
	if (blank < body_len) {
		j = json_loadb(body, body_len, JSON_REJECT_DUPLICATES, &jerr);
		if (!j || json_unpack_ex(j, &jerr, JSON_STRICT, "{s?s}", "timeout", &bt) != 0) {
			st = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
			                  "wait body: %s (expected {\"timeout\": \"30s\"} or none)",
			                  jerr.text);
			goto out;
		}
		if (bt && t) {
			st = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TIMEOUT",
			                  "give the timeout once: as ?timeout= or in the body");
			goto out;
		}
		if (bt)
			t = bt;
	}
	if (t && (!parse_seconds(t, &secs) || secs > WAIT_MAX_S)) {
		st = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TIMEOUT",
		                  "timeout '%.64s' is not a number of seconds in 0..%d, as in \"30s\"",
		                  t, WAIT_MAX_S);
		goto out;
	}
	*timeout_ns = (uint64_t)(secs * 1e9);
out:
	json_decref(j);
	return st;
}

void ts_h_operations_wait(const struct ts_call *call, struct ts_reply *reply)
{
	const char *id = ts_call_param(call, "operation");
	struct ts_operation *op;
	struct ts_error err;
	uint64_t ns = 0;

	ts_error_clear(&err);
	/* the timeout comes as ?timeout=30s or {"timeout": "30s"} (AIP-151) */
	if (ts_h_wait_timeout(ts_call_query(call, "timeout"), call->body, call->body_len, &ns,
	                      &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	op = id ? ts_op_get(call->core->env.operations, id) : NULL;
	if (!op) {
		ts_reply_fail(reply, TS_NOT_FOUND, "OPERATION_NOT_FOUND", "operation '%.128s' not found",
		              id ? id : "");
		return;
	}
	ts_h_reply_wait(reply, op, wait_cut(call, ns), false);
	ts_operation_unref(op);
}
