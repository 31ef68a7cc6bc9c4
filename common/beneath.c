/*
 * beneath.c - opening a client-named file below a directory: text
 * normalisation first, then one openat2 (or a walk of O_NOFOLLOW openat
 * calls) from the directory's descriptor, then fstat. See beneath.h.
 */
#include "common/beneath.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static ts_status outside(struct ts_error *err, const char *shown)
{
	return ts_error_set(err, TS_PERMISSION_DENIED, "PATH_NOT_ALLOWED",
	                    "'%s' is not a file below the data dir (links are not followed)",
	                    shown);
}

/* The rest of path after prefix and a slash (or the end), or NULL. */
static const char *below(const char *prefix, const char *path)
{
	size_t n;

	if (!prefix || !*prefix)
		return NULL;
	n = strlen(prefix);
	while (n > 1 && prefix[n - 1] == '/')
		n--;
	if (strncmp(path, prefix, n) != 0)
		return NULL;
	if (path[n] == '\0')
		return path + n;
	if (path[n] == '/' || (n == 1 && prefix[0] == '/'))
		return path + n;
	return NULL;
}

ts_status ts_path_beneath(const char *root, const char *alias, const char *path, char *rel,
                          size_t cap, struct ts_error *err)
{
	const char *p = path;
	size_t len = 0;

	if (!path || !*path)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_PATH", "the path is empty");
	if (cap == 0 || strlen(path) >= cap)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_PATH",
		                    "the path is longer than %zu bytes", cap ? cap - 1 : 0);
	if (path[0] == '/') {
		p = below(root, path);
		if (!p)
			p = below(alias, path);
		if (!p)
			return outside(err, path);
	}
	rel[0] = '\0';
	while (*p) {
		size_t n;

		while (*p == '/')
			p++;
		n = strcspn(p, "/");
		if (n == 0 || (n == 1 && p[0] == '.')) {
			/* nothing */
		} else if (n == 2 && p[0] == '.' && p[1] == '.') {
			if (len == 0)
				return outside(err, path);
			while (len > 0 && rel[len - 1] != '/')
				len--;
			if (len > 0)
				len--;                        /* the slash before it */
			rel[len] = '\0';
		} else {
			if (len)
				rel[len++] = '/';
			memcpy(rel + len, p, n);
			len += n;
			rel[len] = '\0';
		}
		p += n;
	}
	return TS_OK;
}

/* Keeps fd when it is a regular file; closes it otherwise. */
static ts_status keep_regular(int fd, const char *shown, int *out, uint64_t *size,
                              struct ts_error *err)
{
	struct stat sb;
	const char *what;

	if (fstat(fd, &sb) != 0) {
		int e = errno;

		close(fd);
		return ts_error_set(err, ts_status_from_errno(e), "READ_FAILED", "cannot stat '%s': %s",
		                    shown, strerror(e));
	}
	if (S_ISREG(sb.st_mode)) {
		*out = fd;
		*size = (uint64_t)sb.st_size;
		return TS_OK;
	}
	close(fd);
	what = S_ISDIR(sb.st_mode) ? "a directory" : S_ISFIFO(sb.st_mode) ? "a FIFO"
	       : S_ISSOCK(sb.st_mode) ? "a socket" : S_ISLNK(sb.st_mode) ? "a link"
	       : "a device";
	return ts_error_set(err, TS_INVALID_ARGUMENT, "NOT_A_REGULAR_FILE",
	                    "'%s' is %s, not a regular file", shown, what);
}

/* Translates the errno of a failed open below the directory. */
static ts_status open_failed(int e, const char *shown, struct ts_error *err)
{
	switch (e) {
	case ENOENT:
	case ENOTDIR:
		return ts_error_set(err, TS_NOT_FOUND, "FILE_NOT_FOUND",
		                    "no file '%s' in the data dir", shown);
	case ELOOP:
	case EXDEV:
	case EACCES:
	case EPERM:
		return outside(err, shown);
	default:
		return ts_error_set(err, ts_status_from_errno(e), "READ_FAILED", "cannot open '%s': %s",
		                    shown, strerror(e));
	}
}

#define OPEN_FLAGS (O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW)

ts_status ts__open_beneath_walk(int dirfd, const char *rel, const char *shown, int *fd,
                                uint64_t *size, struct ts_error *err)
{
	const char *p = *rel ? rel : ".";
	int cur = dirfd;
	ts_status st = TS_OK;

	*fd = -1;
	for (;;) {
		size_t n = strcspn(p, "/");
		char comp[256];
		int next;

		if (n >= sizeof comp) {
			st = open_failed(ENAMETOOLONG, shown, err);
			break;
		}
		memcpy(comp, p, n);
		comp[n] = '\0';
		if (p[n] == '\0') {
			next = openat(cur, comp, OPEN_FLAGS);
			if (next < 0)
				st = open_failed(errno, shown, err);
			else
				st = keep_regular(next, shown, fd, size, err);
			break;
		}
		next = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0) {
			struct stat sb;
			int e = errno;

			/* a link where a directory should be is outside, not missing */
			if (e == ENOTDIR && fstatat(cur, comp, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
			    S_ISLNK(sb.st_mode))
				e = ELOOP;
			st = open_failed(e, shown, err);
			break;
		}
		if (cur != dirfd)
			close(cur);
		cur = next;
		p += n + 1;
	}
	if (cur != dirfd)
		close(cur);
	return st;
}

ts_status ts_open_beneath(int dirfd, const char *rel, const char *shown, int *fd,
                          uint64_t *size, struct ts_error *err)
{
	struct open_how how = {
		.flags = OPEN_FLAGS,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	long got;

	*fd = -1;
	got = syscall(SYS_openat2, dirfd, *rel ? rel : ".", &how, sizeof how);
	if (got >= 0)
		return keep_regular((int)got, shown, fd, size, err);
	/* a kernel (or a seccomp filter) without openat2: walk instead */
	if (errno == ENOSYS || errno == E2BIG || errno == EINVAL ||
	    (errno == EPERM && syscall(SYS_openat2, -1, "", NULL, 0) < 0 && errno == EPERM))
		return ts__open_beneath_walk(dirfd, rel, shown, fd, size, err);
	return open_failed(errno, shown, err);
}
