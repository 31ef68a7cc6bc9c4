/*
 * auth.h - the Authorization header against the daemon's token.
 *
 * Two schemes carry the token, each named in any case (RFC 9110 11.1:
 * auth-schemes are case-insensitive) and followed by one or more spaces:
 * "Bearer <token>", and "Basic <base64 of user:token>" with any user name
 * (what a browser sends after the prompt a 401 on /dashboard raises). The
 * token is compared in constant time. Every refusal says what was wrong
 * with the header - none, a scheme the daemon does not take, no
 * credentials, Basic credentials that are not base64 of "user:password",
 * or a token that is not the daemon's - without echoing any of it.
 *
 * Thread-safety: pure functions.
 */
#ifndef TS_SERVER_AUTH_H
#define TS_SERVER_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

/* What a refused header lacked, for the challenge a 401 carries. */
enum ts_auth_fault {
	TS_AUTH_MISSING,       /* no header, or one with no credentials */
	TS_AUTH_SCHEME,        /* a scheme other than Bearer and Basic */
	TS_AUTH_WRONG,         /* a Bearer token that is not the daemon's */
	TS_AUTH_BASIC,         /* Basic credentials undecodable, or not the token */
};

/*
 * TS_OK when header (borrowed; NULL when the request has none) presents
 * token (token_len bytes). Otherwise UNAUTHENTICATED, reason TOKEN_REQUIRED,
 * with a message naming the problem (and metadata "scheme" with the scheme
 * given, when it is shorter than any token), and *fault says which it was.
 */
ts_status ts_auth_check(const char *header, const char *token, size_t token_len,
                        enum ts_auth_fault *fault, struct ts_error *err);

#endif
