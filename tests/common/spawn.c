/*
 * spawn.c - a child process for the test tiers (tests/common/spawn.h).
 */
#include "tests/common/spawn.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

pid_t ts_test_spawn(const char *const *argv, char *const *envp, int in, int out, int err,
                    const char *what)
{
	pid_t parent = getpid(), pid;

	fflush(NULL);
	pid = fork();
	if (pid != 0)
		return pid;
	{
		sigset_t none;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		signal(SIGPIPE, SIG_DFL);
		if ((in >= 0 && dup2(in, 0) < 0) || (out >= 0 && dup2(out, 1) < 0) ||
		    (err >= 0 && dup2(err, 2) < 0))
			_exit(127);
		if (envp)
			execve(argv[0], (char *const *)argv, envp);
		else
			execvp(argv[0], (char *const *)argv);
		dprintf(2, "%scannot exec '%s': %s\n", what ? what : "", argv[0], strerror(errno));
		_exit(127);
	}
}
