/*
 * version.h - which tstaged this is: the release (VERSION) and the git
 * revision it was built from.
 *
 * Both are baked into one object (common/version.o), which the Makefile
 * rebuilds whenever either changes, so that --version, the start log and
 * tstage_build_info never report a stale revision after a commit.
 *
 * Thread-safety: immutable.
 */
#ifndef TS_VERSION_H
#define TS_VERSION_H

extern const char ts_version[];   /* "0.1.0" */
extern const char ts_git_rev[];   /* short hash of HEAD, or "unknown" */

#endif
