/*
 * assets.c - the documents built into the binary and served as they are:
 * GET /openapi.yaml (the API description, the top-level openapi.yaml) and
 * GET /dashboard (server/dashboard.html, a self-contained page that polls
 * the API). The assembler includes the files themselves (.incbin) at build
 * time, so what is served is byte for byte what the repository holds; the
 * Makefile rebuilds this object when either changes.
 */
#include "server/server_routes.h"

#include <stddef.h>

#include "handlers/api.h"

/* Each file, then a NUL (not counted), then its length as a size_t. */
#define TS_ASSET(sym, path)                                                                \
	__asm__(".section .rodata\n"                                                           \
	        ".global " #sym "\n"                                                           \
	        ".type " #sym ", @object\n"                                                    \
	        ".balign 16\n" #sym ":\n"                                                      \
	        ".incbin \"" path "\"\n"                                                       \
	        "1:\n"                                                                         \
	        ".byte 0\n"                                                                    \
	        ".size " #sym ", . - " #sym "\n"                                               \
	        ".global " #sym "_len\n"                                                       \
	        ".type " #sym "_len, @object\n"                                                \
	        ".balign 8\n" #sym "_len:\n"                                                   \
	        ".quad 1b - " #sym "\n"                                                        \
	        ".size " #sym "_len, 8\n"                                                      \
	        ".previous\n")

TS_ASSET(ts__asset_openapi, "openapi.yaml");
TS_ASSET(ts__asset_dashboard, "server/dashboard.html");

extern const char ts__asset_openapi[], ts__asset_dashboard[];
extern const size_t ts__asset_openapi_len, ts__asset_dashboard_len;

/* Answers with a static document in place (no copy, nothing to free). */
static void reply_asset(struct ts_reply *reply, const char *type, const char *data, size_t len)
{
	struct ts_parts parts = {.n = 1, .part = {{.base = data, .len = len}}};

	ts_reply_buffers(reply, TS_HTTP_OK, type, &parts);
}

void ts_s_openapi(struct ts_server *srv, const struct ts_call *call, struct ts_reply *reply)
{
	(void)srv;
	(void)call;
	reply_asset(reply, "application/yaml", ts__asset_openapi, ts__asset_openapi_len);
}

void ts_s_dashboard(struct ts_server *srv, const struct ts_call *call, struct ts_reply *reply)
{
	(void)srv;
	(void)call;
	reply_asset(reply, "text/html; charset=utf-8", ts__asset_dashboard, ts__asset_dashboard_len);
	/* the page loads nothing from elsewhere and talks only to its origin */
	ts_reply_header(reply, "Content-Security-Policy",
	                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
	                "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
	                "frame-ancestors 'none'");
	ts_reply_header(reply, "Cache-Control", "no-cache");
}
