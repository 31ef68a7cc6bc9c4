/*
 * spawn.h - a child process for the test tiers that start programs: the
 * integration harness (tstaged) and the benches (tstaged, nginx,
 * redis-server). The child dies with its parent (PR_SET_PDEATHSIG), starts
 * with no signal blocked and SIGPIPE at its default, and has the given
 * descriptors as its stdin, stdout and stderr.
 *
 * Thread-safety: call from the thread that owns the child; the child
 * process only execs.
 */
#ifndef TS_TESTS_SPAWN_H
#define TS_TESTS_SPAWN_H

#include <sys/types.h>

/*
 * Forks and execs argv[0] with argv (NULL-terminated): execve with envp
 * when envp is not NULL, else execvp with the caller's environment. In
 * the child, in, out and err (each -1: left as inherited) become 0, 1 and
 * 2; a failed exec writes "<what>cannot exec '<argv[0]>': <why>" to the
 * child's stderr and exits 127. Flushes stdio first. Returns the child's
 * pid, or -1 when fork failed (errno says why). The descriptors stay the
 * caller's to close.
 */
pid_t ts_test_spawn(const char *const *argv, char *const *envp, int in, int out, int err,
                    const char *what);

#endif
