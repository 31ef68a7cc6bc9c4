/*
 * beneath.h - opening a file a client names, below one directory and never
 * outside it.
 *
 * A client path is first made relative to the directory by text alone
 * (ts_path_beneath): an absolute path must start with the directory's own
 * path, "." and empty components go, ".." pops a component and may not pop
 * past the top. Then ts_open_beneath opens that relative path from a
 * descriptor of the directory, following no symbolic link at any component
 * (openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS where the kernel has
 * it, else a walk of openat calls with O_NOFOLLOW), without blocking
 * (O_NONBLOCK: a FIFO opens at once), and keeps it only when fstat says it
 * is a regular file. Nothing is checked by name and opened later, so a
 * rename or a new link between the two cannot lead outside.
 *
 * Refusals: PERMISSION_DENIED (reason PATH_NOT_ALLOWED) for whatever is
 * outside, a link or not readable, the same whether or not it exists;
 * NOT_FOUND (FILE_NOT_FOUND) for a missing file below the directory;
 * INVALID_ARGUMENT (NOT_A_REGULAR_FILE) for directories, FIFOs, devices and
 * sockets. Messages quote the client's path, never the directory's.
 *
 * Thread-safety: reentrant; no shared state.
 */
#ifndef TS_BENEATH_H
#define TS_BENEATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/*
 * Makes path (the client's, borrowed) relative to the directory root (an
 * absolute path without a trailing slash; also accepted: alias, another
 * spelling of the same directory such as the one configured, or NULL) into
 * rel (cap bytes): no leading slash, no ".", "..", or empty components; ""
 * is the directory itself. Fails PERMISSION_DENIED when path is absolute and
 * not below root (or alias) or climbs above it; INVALID_ARGUMENT when it is
 * empty or longer than cap. Touches no file system.
 */
ts_status ts_path_beneath(const char *root, const char *alias, const char *path, char *rel,
                          size_t cap, struct ts_error *err);

/*
 * Opens rel (from ts_path_beneath; borrowed) below the directory descriptor
 * dirfd for reading: a new descriptor (O_RDONLY | O_CLOEXEC | O_NONBLOCK)
 * in *fd and the file's size in *size. shown is what messages quote (the
 * client's path). Fails as the header says; *fd is -1 on failure.
 */
ts_status ts_open_beneath(int dirfd, const char *rel, const char *shown, int *fd,
                          uint64_t *size, struct ts_error *err);

/* The same without openat2, by the openat walk alone (for tests of the
 * fallback, and kernels before 5.6). */
ts_status ts__open_beneath_walk(int dirfd, const char *rel, const char *shown, int *fd,
                                uint64_t *size, struct ts_error *err);

#endif
