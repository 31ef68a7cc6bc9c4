/*
 * health.c - liveness. Readiness depends on server state (draining) and is
 * answered by the server itself.
 */
#include "handlers/handlers.h"

void ts_h_livez(const struct ts_call *call, struct ts_reply *reply)
{
	(void)call;
	ts_reply_text(reply, TS_HTTP_OK, "text/plain; charset=utf-8", "ok\n", 3);
}
