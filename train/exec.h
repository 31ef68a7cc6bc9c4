/*
 * exec.h - the step executor: runs a plan's actions on a device, exactly.
 *
 * The executor allocates every temp buffer of the plan from the device's
 * memory spaces when the plan says ALLOC and releases it when the plan says
 * FREE (after the work using it has completed), runs kernels on a compute
 * queue, and copies on a host->device and a device->host queue, which meet
 * the compute queue only at events: a WAIT makes the compute queue wait for
 * the last copy into a buffer, and a copy out of a buffer computed on the
 * device first waits for that computation. Since it allocates nothing else,
 * the device space's in-use bytes rise above their level before the step by
 * exactly the plan's temp peak, which the executor measures from the space
 * itself and reports.
 *
 * Thread-safety: one run at a time per environment (queues are shared by
 * the actions of one run).
 */
#ifndef TS_EXEC_H
#define TS_EXEC_H

#include <stdint.h>

#include "common/status.h"
#include "memory/space.h"
#include "train/kernels.h"
#include "train/plan.h"

struct ts_exec_env {
	struct ts_device *dev;
	struct ts_space *device_space;    /* (dev, device): temps */
	struct ts_space *pinned_space;    /* (dev, pinned_host): offloaded residuals */
	struct ts_kernels *kernels;
	struct ts_queue *compute, *h2d, *d2h;
};

struct ts_exec_result {
	float loss;                        /* this step's loss, read back */
	uint64_t measured_temp_peak;       /* max bytes of this step's live device temps */
	uint64_t measured_host_temp_peak;  /* the same on pinned_host */
	uint64_t h2d_bytes, d2h_bytes;     /* copied this step */
	double wall_s;                     /* the whole step */
	double compute_s;                  /* time the compute queue was busy */
	double copy_wait_s;                /* time the compute queue waited for copies */
};

/*
 * Runs one step of plan p. args[i] is the memory of plan buffer i for every
 * ARGUMENT and OUTPUT buffer (device pointers for device buffers, host
 * pointers for pinned_host ones; NULL for temps, which the executor
 * allocates). step is 1-based (Adam's bias correction). On failure every
 * temp is released and the arguments may hold a partial update only if the
 * failure happened during the update phase (reported as such).
 */
ts_status ts_exec_run(const struct ts_plan *p, const struct ts_exec_env *env,
                      void *const *args, int step, struct ts_exec_result *out,
                      struct ts_error *err);

#endif
