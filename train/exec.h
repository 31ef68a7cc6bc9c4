/*
 * exec.h - the step executor: runs a plan's actions on a device, exactly.
 *
 * The executor takes one arena per memory kind from the device's spaces,
 * of the plan's temp size, before anything runs, and places each temp at its
 * planned offset when the plan says ALLOC; FREE ends its life (the next temp
 * placed there waits on the device for the work that used it; the host does
 * not wait). It runs kernels on a compute
 * queue, and copies on a host->device and a device->host queue, which meet
 * the compute queue only at events: a WAIT makes the compute queue wait for
 * the last copy into a buffer, and a copy out of a buffer computed on the
 * device first waits for that computation. Data parallel, the collectives
 * run on a comm queue of their own when the environment has one, beside
 * the compute queue (ordered at events as the copies are), so that a
 * gradient's all-reduce overlaps the rest of the backward pass. Since it allocates nothing else,
 * the device space's in-use bytes rise above their level before the step by
 * exactly the plan's temp peak, which the executor measures from the space
 * itself and reports (the arena's extent its temps reached).
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
	struct ts_queue *comm;            /* the collectives' (data parallel), beside the
	                                     compute queue; NULL: on the compute queue */
};

struct ts_exec_result {
	float loss;                        /* this step's loss, read back (accumulating:
	                                      the mean of its micro-batches') */
	float grad_norm;                   /* the gradients' global norm before clipping,
	                                      read back (before the first update, or with
	                                      fused updates after the step); NaN with
	                                      optimizer none, or when that late read
	                                      failed */
	uint64_t measured_temp_peak;       /* max bytes of this step's live device temps */
	uint64_t measured_host_temp_peak;  /* the same on pinned_host */
	uint64_t h2d_bytes, d2h_bytes;     /* copied this step */
	double wall_s;                     /* the whole step */
	double compute_s;                  /* time the compute queue was busy */
	double copy_wait_s;                /* time the compute queue waited for copies */
	double comm_s;                     /* time in collectives with the other replicas
	                                      (waiting for them included): the comm
	                                      queue's, overlapping the compute queue's
	                                      (without one, the compute queue's); 0 on
	                                      one device */
	double comm_wait_s;                /* time the compute queue waited for the comm
	                                      queue's collectives (not in compute_s) */
	uint64_t comm_waits;               /* times the compute queue was ordered after
	                                      the comm queue (an event wait each) */
};

/*
 * Runs one step of plan p. args[i] is the memory of plan buffer i for every
 * ARGUMENT and OUTPUT buffer (device pointers for device buffers, host
 * pointers for pinned_host ones; NULL for temps, which live in the arenas).
 * outs[i] is new memory of the same size and kind for every versioned
 * argument (NULL elsewhere; outs may be NULL when none is): the step's
 * update of it lands there, args[i] is only read. step is 1-based (Adam's
 * bias correction).
 *
 * Atomic: the arenas, events and queue jobs are taken before the first
 * action, so nothing after it allocates; on any failure every argument
 * (args[i]) holds what it held before the call, and outs[i] is garbage. On
 * success outs[i] holds the updated values. Failures are RESOURCE_EXHAUSTED
 * (an arena or the queue jobs did not fit), the queues' copy failures, or
 * BAD_PLAN / INVALID_ARGUMENT for a plan or binding that cannot run.
 */
ts_status ts_exec_run(const struct ts_plan *p, const struct ts_exec_env *env,
                      void *const *args, void *const *outs, int step,
                      struct ts_exec_result *out, struct ts_error *err);

/*
 * Data parallel: runs one step of plan p (ts_plan_build_replicated, for n
 * = p->replicas devices) on n replicas together: envs[k] is replica k's
 * device, spaces, kernels and queues, args[k] / outs[k] its memory as
 * ts_exec_run's, out[k] its result (each replica's loss is its own
 * batch's; the gradients' norm, after the all-reduce, is every replica's).
 * comm is a communicator over the n devices in replica order (device.h's
 * ts_comm), used by the plan's ALLREDUCE actions. One thread drives every
 * replica's queues, action by action in plan order.
 *
 * Atomic across replicas: every replica's arenas and jobs are taken
 * before the first action; before the first update on any replica every
 * replica's earlier work is known good; a failure on any replica leaves
 * every replica's arguments as they were (the journal of each put back),
 * with metadata "device" naming the replica where it was noticed.
 * INVALID_ARGUMENT (BAD_REPLICAS) when n is not the plan's replicas, comm
 * is missing or not over the envs' devices in order; otherwise as
 * ts_exec_run. ts_exec_run is this with one replica and no communicator.
 */
ts_status ts_exec_run_replicas(const struct ts_plan *p, const struct ts_exec_env *envs, int n,
                               struct ts_comm *comm, void *const *const *args,
                               void *const *const *outs, int step,
                               struct ts_exec_result *out, struct ts_error *err);

#endif
