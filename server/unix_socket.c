/*
 * unix_socket.c - the listening Unix socket of --unix-socket: created with
 * its final mode (the umask is narrowed around bind, then chmod says it
 * again) and group, a stale socket of an earlier run replaced, a live one
 * or any other file refused. The socket's file is the permission: whoever
 * may connect to it is served without a token (server/http.c).
 */
#include "server/server_int.h"

#include <errno.h>
#include <grp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/units.h"

/* The mode of --unix-socket-mode: octal digits, at most 0777. */
static bool parse_mode(const char *s, mode_t *out)
{
	char *end;
	long v;

	if (!*s || strspn(s, "01234567") != strlen(s))
		return false;
	errno = 0;
	v = strtol(s, &end, 8);
	if (errno || *end || v < 0 || v > 0777)
		return false;
	*out = (mode_t)v;
	return true;
}

/* The gid of --unix-socket-group: a group name, or a number. */
static bool parse_group(const char *s, gid_t *out)
{
	struct group gr, *found = NULL;
	char buf[4096];
	long v;

	if (getgrnam_r(s, &gr, buf, sizeof buf, &found) == 0 && found) {
		*out = found->gr_gid;
		return true;
	}
	if (ts_parse_long(s, 0, 0x7fffffffL, &v)) {
		*out = (gid_t)v;
		return true;
	}
	return false;
}

/* Removes a socket file no one listens on; refuses a live socket or a file
 * of another kind. */
static ts_status clear_stale(const struct sockaddr_un *sa, struct ts_error *err)
{
	struct stat st;
	int fd, rc, e;

	if (lstat(sa->sun_path, &st) != 0)
		return errno == ENOENT ? TS_OK
		                       : ts_error_set(err, TS_UNAVAILABLE, "UNIX_SOCKET",
		                                      "--unix-socket '%s': %s", sa->sun_path,
		                                      strerror(errno));
	if (!S_ISSOCK(st.st_mode))
		return ts_error_set(err, TS_UNAVAILABLE, "UNIX_SOCKET",
		                    "--unix-socket '%s' exists and is not a socket; not replacing it",
		                    sa->sun_path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return ts_error_set(err, TS_UNAVAILABLE, "UNIX_SOCKET", "socket: %s", strerror(errno));
	rc = connect(fd, (const struct sockaddr *)sa, sizeof *sa);
	e = errno;
	close(fd);
	if (rc == 0)
		return ts_error_set(err, TS_UNAVAILABLE, "UNIX_SOCKET",
		                    "--unix-socket '%s' is in use by another process", sa->sun_path);
	if (e != ECONNREFUSED)
		return ts_error_set(err, TS_UNAVAILABLE, "UNIX_SOCKET", "--unix-socket '%s': %s",
		                    sa->sun_path, strerror(e));
	if (unlink(sa->sun_path) != 0 && errno != ENOENT)
		return ts_error_set(err, TS_UNAVAILABLE, "UNIX_SOCKET",
		                    "cannot remove the stale socket '%s': %s", sa->sun_path,
		                    strerror(errno));
	return TS_OK;
}

ts_status ts__unix_listen(const struct ts_config *cfg, int *out, struct ts_error *err)
{
	return ts__unix_listen_at(cfg, cfg->unix_socket, out, err);
}

ts_status ts__unix_listen_at(const struct ts_config *cfg, const char *path, int *out,
                             struct ts_error *err)
{
	struct sockaddr_un sa;
	mode_t mode, old_mask;
	gid_t gid = (gid_t)-1;
	ts_status st;
	int fd = -1, rc;

	*out = -1;
	if (!parse_mode(cfg->unix_socket_mode, &mode))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_FLAG",
		                    "--unix-socket-mode '%s' is not an octal file mode such as 0660",
		                    cfg->unix_socket_mode);
	if (cfg->unix_socket_group[0] && !parse_group(cfg->unix_socket_group, &gid))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_FLAG",
		                    "--unix-socket-group '%s' is no group of this system",
		                    cfg->unix_socket_group);
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	/* config.c and lease.c refuse a path longer than sun_path holds */
	memcpy(sa.sun_path, path, strnlen(path, sizeof sa.sun_path - 1));
	st = clear_stale(&sa, err);
	if (st != TS_OK)
		return st;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return ts_error_set(err, TS_UNAVAILABLE, "UNIX_SOCKET", "socket: %s", strerror(errno));
	/* the file is born with no more than its mode (chmod below says it
	 * exactly): no moment when others may connect */
	old_mask = umask((mode_t)(~mode & 0777));
	rc = bind(fd, (const struct sockaddr *)&sa, sizeof sa);
	umask(old_mask);
	if (rc != 0) {
		st = ts_error_set(err, TS_UNAVAILABLE, "UNIX_SOCKET", "cannot bind --unix-socket '%s': %s",
		                  sa.sun_path, strerror(errno));
		goto out;
	}
	if ((gid != (gid_t)-1 && chown(sa.sun_path, (uid_t)-1, gid) != 0) ||
	    chmod(sa.sun_path, mode) != 0) {
		st = ts_error_set(err, TS_UNAVAILABLE, "UNIX_SOCKET",
		                  "cannot give --unix-socket '%s' group '%s' and mode %s: %s",
		                  sa.sun_path, cfg->unix_socket_group, cfg->unix_socket_mode,
		                  strerror(errno));
		unlink(sa.sun_path);
		goto out;
	}
	if (listen(fd, 128) != 0) {
		st = ts_error_set(err, TS_UNAVAILABLE, "UNIX_SOCKET", "listen on '%s': %s", sa.sun_path,
		                  strerror(errno));
		unlink(sa.sun_path);
		goto out;
	}
	*out = fd;
	fd = -1;
	st = TS_OK;
out:
	if (fd >= 0)
		close(fd);
	return st;
}
