/*
 * test_auth.c - the Authorization header against the token (server/auth.h):
 * both schemes in any case and with any run of spaces; Basic credentials
 * decoded with and without padding, any user name, a colon in the password;
 * every refusal's fault, reason and message, the scheme named only when it
 * cannot be a token, and no credentials echoed.
 */
#include <check.h>
#include <string.h>

#include "server/auth.h"
#include "tests/unit/unit.h"

#define TOKEN "0123456789abcdefghijABCDEFGHIJxy"

/* The header's outcome: TS_OK, or the fault with err filled. */
static ts_status check(const char *header, enum ts_auth_fault *fault, struct ts_error *err)
{
	ts_error_clear(err);
	*fault = (enum ts_auth_fault)-1;
	return ts_auth_check(header, TOKEN, strlen(TOKEN), fault, err);
}

static const char *meta(const struct ts_error *err, const char *key)
{
	for (int i = 0; i < err->nmeta; i++)
		if (strcmp(err->meta[i].key, key) == 0)
			return err->meta[i].value;
	return NULL;
}

START_TEST(test_accepted)
{
	/* base64 of "u:" TOKEN, padded and not; of ":" TOKEN; of "a:b:" with
	 * the token after a colon that belongs to the password */
	static const char *const ok[] = {
		"Bearer " TOKEN, "bearer " TOKEN, "BEARER   " TOKEN, "bEaReR\t" TOKEN, "Bearer " TOKEN "  ",
		"Basic dTowMTIzNDU2Nzg5YWJjZGVmZ2hpakFCQ0RFRkdISUp4eQ==",
		"basic dTowMTIzNDU2Nzg5YWJjZGVmZ2hpakFCQ0RFRkdISUp4eQ",
		"BASIC OjAxMjM0NTY3ODlhYmNkZWZnaGlqQUJDREVGR0hJSnh5",
	};
	enum ts_auth_fault f;
	struct ts_error err;

	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
		ck_assert_msg(check(ok[i], &f, &err) == TS_OK, "'%s': %s", ok[i], err.message);
}
END_TEST

START_TEST(test_refused)
{
	static const struct {
		const char *header;
		enum ts_auth_fault fault;
		const char *says, *scheme;
	} bad[] = {
		{NULL, TS_AUTH_MISSING, "no Authorization header", NULL},
		{"", TS_AUTH_MISSING, "is empty", NULL},
		{"Bearer", TS_AUTH_MISSING, "carries no token", "Bearer"},
		{"Bearer    ", TS_AUTH_MISSING, "carries no token", "Bearer"},
		{"Basic", TS_AUTH_MISSING, "carries no credentials", "Basic"},
		{"Bearer " TOKEN "0", TS_AUTH_WRONG, "not the daemon's token", "Bearer"},
		{"Bearer 0123456789abcdef", TS_AUTH_WRONG, "not the daemon's token", "Bearer"},
		{"basic ***", TS_AUTH_BASIC, "not base64", "basic"},
		{"Basic A", TS_AUTH_BASIC, "not base64", "Basic"},
		{"Basic MDEyMzQ1Njc4OWFiY2RlZmdoaWpBQkNERUZHSElKeHk=", TS_AUTH_BASIC,
		 "not 'user:password'", "Basic"},
		{"Basic dTowMTIzNDU2Nzg5YWJjZGVmZ2hpakFCQ0RFRkdISUp4eg==", TS_AUTH_BASIC,
		 "Basic password is not", "Basic"},
		{"Digest username=\"u\"", TS_AUTH_SCHEME, "not one the daemon takes", "Digest"},
		{"BearerX" TOKEN, TS_AUTH_SCHEME, "no space after 'Bearer'", "Bearer"},
		{"basicdTow", TS_AUTH_SCHEME, "no space after 'Basic'", "basic"},
		{TOKEN, TS_AUTH_SCHEME, "no scheme", NULL},
	};
	enum ts_auth_fault f;
	struct ts_error err;

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		const char *h = bad[i].header ? bad[i].header : "(none)", *scheme;

		ck_assert_msg(check(bad[i].header, &f, &err) == TS_UNAUTHENTICATED, "'%s' passed", h);
		ck_assert_msg(f == bad[i].fault, "'%s': fault %d, not %d", h, (int)f, (int)bad[i].fault);
		ck_assert_str_eq(err.reason, "TOKEN_REQUIRED");
		ck_assert_msg(strstr(err.message, bad[i].says), "'%s': '%s'", h, err.message);
		ck_assert_msg(!strstr(err.message, "0123456789abcdef"), "echoed: '%s'", err.message);
		scheme = meta(&err, "scheme");
		if (bad[i].scheme)
			ck_assert_msg(scheme && strcmp(scheme, bad[i].scheme) == 0, "'%s': scheme '%s'",
			              h, scheme ? scheme : "(none)");
		else
			ck_assert_msg(!scheme, "'%s': scheme '%s' shown", h, scheme);
	}
}
END_TEST

/* Credentials longer than any the daemon decodes are refused, not cut. */
START_TEST(test_long_credentials)
{
	static char h[8192];
	enum ts_auth_fault f;
	struct ts_error err;

	memcpy(h, "Basic ", 6);
	memset(h + 6, 'Q', sizeof h - 7);
	h[sizeof h - 1] = '\0';
	ck_assert_int_eq(check(h, &f, &err), TS_UNAUTHENTICATED);
	ck_assert_int_eq(f, TS_AUTH_BASIC);
	memcpy(h, "Bearer ", 7);
	ck_assert_int_eq(check(h, &f, &err), TS_UNAUTHENTICATED);
	ck_assert_int_eq(f, TS_AUTH_WRONG);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("auth");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_accepted);
	tcase_add_test(tc, test_refused);
	tcase_add_test(tc, test_long_credentials);
	suite_add_tcase(s, tc);
	return s;
}
