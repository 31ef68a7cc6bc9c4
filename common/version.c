/*
 * version.c - the release and git revision of this build (see version.h);
 * the only file compiled with TS_VERSION and TS_GIT_REV.
 */
#include "common/version.h"

#ifndef TS_VERSION
#define TS_VERSION "0.0.0"
#endif
#ifndef TS_GIT_REV
#define TS_GIT_REV "unknown"
#endif

const char ts_version[] = TS_VERSION;
const char ts_git_rev[] = TS_GIT_REV;
