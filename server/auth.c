/*
 * auth.c - the Authorization header against the daemon's token (auth.h).
 * The header is parsed here, scheme first, rather than by libmicrohttpd,
 * whose Basic parser takes the scheme in one spelling only ("Basic").
 */
#include "server/auth.h"

#include <string.h>
#include <strings.h>

#include "common/base64.h"

/* A scheme is shown back only when shorter than any token may be (tokens
 * have 16 characters or more): a bare token sent as the whole header is
 * never echoed. */
#define SCHEME_SHOWN 15
#define CRED_MAX 1024          /* decoded Basic credentials; longer ones are wrong */

static bool token_equal(const char *token, size_t token_len, const char *given, size_t n)
{
	unsigned char diff = (unsigned char)(n != token_len);

	for (size_t i = 0; i < token_len; i++)
		diff |= (unsigned char)(token[i] ^ (i < n ? given[i] : 0));
	return diff == 0;
}

static ts_status refuse(struct ts_error *err, enum ts_auth_fault *fault, enum ts_auth_fault f,
                        const char *scheme, size_t scheme_len, const char *what)
{
	*fault = f;
	ts_error_set(err, TS_UNAUTHENTICATED, "TOKEN_REQUIRED",
	             "%s; send 'Authorization: Bearer <token>' (or Basic with the token as "
	             "the password)", what);
	if (scheme && scheme_len <= SCHEME_SHOWN)
		ts_error_meta(err, "scheme", "%.*s", (int)scheme_len, scheme);
	return TS_UNAUTHENTICATED;
}

ts_status ts_auth_check(const char *header, const char *token, size_t token_len,
                        enum ts_auth_fault *fault, struct ts_error *err)
{
	char cred[CRED_MAX];
	const char *scheme, *rest, *colon;
	size_t slen, rlen;
	long n;

	if (!header)
		return refuse(err, fault, TS_AUTH_MISSING, NULL, 0, "no Authorization header");
	scheme = header + strspn(header, " \t");
	slen = strcspn(scheme, " \t");
	rest = scheme + slen;
	rest += strspn(rest, " \t");
	rlen = strlen(rest);
	while (rlen > 0 && (rest[rlen - 1] == ' ' || rest[rlen - 1] == '\t'))
		rlen--;
	if (slen == 6 && strncasecmp(scheme, "Bearer", 6) == 0) {
		if (rlen == 0)
			return refuse(err, fault, TS_AUTH_MISSING, scheme, slen,
			              "the Authorization header's Bearer scheme carries no token");
		if (!token_equal(token, token_len, rest, rlen))
			return refuse(err, fault, TS_AUTH_WRONG, scheme, slen,
			              "the Bearer token is not the daemon's token");
		return TS_OK;
	}
	if (slen == 5 && strncasecmp(scheme, "Basic", 5) == 0) {
		if (rlen == 0)
			return refuse(err, fault, TS_AUTH_MISSING, scheme, slen,
			              "the Authorization header's Basic scheme carries no credentials");
		n = ts_base64_decode(rest, rlen, false, cred, sizeof cred);
		colon = n >= 0 ? memchr(cred, ':', (size_t)n) : NULL;
		if (!colon) {
			explicit_bzero(cred, sizeof cred);
			return refuse(err, fault, TS_AUTH_BASIC, scheme, slen,
			              n < 0 ? "the Basic credentials are not base64"
			                    : "the Basic credentials are not 'user:password'");
		}
		colon++;
		if (!token_equal(token, token_len, colon, (size_t)(cred + n - colon))) {
			explicit_bzero(cred, sizeof cred);
			return refuse(err, fault, TS_AUTH_BASIC, scheme, slen,
			              "the Basic password is not the daemon's token");
		}
		explicit_bzero(cred, sizeof cred);
		return TS_OK;
	}
	/* "Bearer<token>": the scheme glued to its credentials */
	if (slen > 6 && strncasecmp(scheme, "Bearer", 6) == 0)
		return refuse(err, fault, TS_AUTH_SCHEME, scheme, 6,
		              "the Authorization header has no space after 'Bearer'");
	if (slen > 5 && strncasecmp(scheme, "Basic", 5) == 0)
		return refuse(err, fault, TS_AUTH_SCHEME, scheme, 5,
		              "the Authorization header has no space after 'Basic'");
	if (slen > SCHEME_SHOWN)
		return refuse(err, fault, TS_AUTH_SCHEME, NULL, 0,
		              "the Authorization header has no scheme (Bearer or Basic) before "
		              "its credentials");
	return refuse(err, fault, slen ? TS_AUTH_SCHEME : TS_AUTH_MISSING, slen ? scheme : NULL,
	              slen, slen ? "the Authorization scheme is not one the daemon takes (Bearer "
	                           "or Basic)" : "the Authorization header is empty");
}
