/*
 * unit.h - what every unit suite (tests/unit/test_<module>.c) shares: the
 * one main (unit.c), the backend a suite runs on, and a sim fixture.
 *
 * A suite file defines ts_unit_suite() and no main: unit.c's main builds
 * that suite, runs it (CK_NORMAL output, each case forked unless
 * CK_FORK=no) and exits EXIT_FAILURE when any case failed. Cases are named
 * test_<what> (START_TEST(test_publish_keeps_the_reader)), so that a
 * case never shares a name with a helper and a failure line names it as
 * a test.
 *
 * The sim fixture is the device set and memory most suites build in their
 * setup: simulated devices with CUDA discovery off, and the host budgets
 * of a struct ts_memory_config; every step that fails fails the case with
 * the error's message. The topology fixtures are the files of tests/data,
 * small sim sets and the topologies the suites of device placement load
 * from those files.
 *
 * Thread-safety: none; called from the runner's thread or a case's.
 */
#ifndef TS_TESTS_UNIT_H
#define TS_TESTS_UNIT_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

struct ts_device_set;
struct ts_memory;
struct ts_stager;
struct ts_topology;

/* The suite of this file (a new Suite, freed by the runner): each
 * tests/unit/test_*.c defines it. */
Suite *ts_unit_suite(void);

/* Runs s (steals it) and returns EXIT_SUCCESS when no case failed, else
 * EXIT_FAILURE. */
int ts_unit_run(Suite *s);

/* Whether TS_TEST_BACKEND is "cuda": a suite that can run on the GPU adds
 * its cuda cases then. */
bool ts_unit_cuda(void);

/* ---- the sim fixture ------------------------------------------------------------- */

struct ts_unit_sim_config {
	int devices;                    /* sim:0 .. sim:devices-1 */
	uint64_t device_memory;         /* each one's memory */
	double device_fraction;         /* of it the device space may use */
	uint64_t pinned, unpinned;      /* host limits */
	uint64_t segment;               /* pinned pool segment */
	uint64_t pinned_keep;           /* idle pinned segments kept (0: none) */
	bool preallocate;               /* the pinned pool pinned at start */
	const char *host;               /* NULL: "t" */
};

/* Makes the device set and memory of c into *set and *mem, and a stager
 * over them into *stager when stager is not NULL; fails the case when
 * any step fails. */
void ts_unit_sim_new(const struct ts_unit_sim_config *c, struct ts_device_set **set,
                     struct ts_memory **mem, struct ts_stager **stager);

/* Frees what ts_unit_sim_new made (stager may be NULL). */
void ts_unit_sim_free(struct ts_device_set *set, struct ts_memory *mem, struct ts_stager *stager);

/* ---- the topology fixtures ------------------------------------------------------ */

/* The path of name in the test data folder: tests/data, relative to the
 * checkout's root (run from it), or the folder TS_TEST_DATA names. In one
 * of four buffers used in turn: valid until the fourth call after. */
const char *ts_unit_data(const char *name);

/* A set of n sim devices of 1 MiB each on host "testhost", CUDA discovery
 * off; fails the case when it cannot be made. */
struct ts_device_set *ts_unit_sims(int n);

/* The topology of set read from the hwloc XML file xml (a path; NULL or
 * "": this machine's), with --sim-numa-nodes numa[0..n) and
 * --sim-peer-links links (NULL: the default); fails the case with the
 * error's message when it does not load. */
struct ts_topology *ts_unit_topology(const char *xml, const struct ts_device_set *set,
                                     const int *numa, size_t n, const char *links);

/* Fails the case unless call returns TS_OK, naming the line, the call, the
 * status and the message of err (a struct ts_error). */
#define TS_UNIT_OK(err, call)                                                          \
	do {                                                                           \
		ts_status st_ = (call);                                                \
		ck_assert_msg(st_ == TS_OK, "line %d: %s: %s: %s", __LINE__, #call,    \
		              ts_status_name(st_), (err).message);                     \
	} while (0)

#endif
