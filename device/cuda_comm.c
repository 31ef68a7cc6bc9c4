/*
 * cuda_comm.c - the CUDA backend's collectives: NCCL (device.h's ts_comm).
 *
 * A communicator is ncclCommInitAll over the devices' ordinals, one
 * ncclComm_t per rank, in one process. Each collective is one NCCL group
 * (ncclGroupStart, the call for every rank on its rank's stream,
 * ncclGroupEnd), as NCCL requires when one thread drives several devices;
 * the work is then ordered on each stream like any kernel. In-place forms
 * (ncclReduceScatter with recvbuff = sendbuff + rank * count, ncclAllGather
 * with sendbuff = recvbuff + rank * count: NCCL's documented in-place
 * operations), and a reduce-scatter into each rank's buffer of its own.
 * Every ncclResult_t is translated in nccl_fail() and nowhere else; its
 * text comes from ncclGetErrorString and, where NCCL kept one,
 * ncclGetLastError.
 *
 * Thread-safety: one collective at a time per communicator (comm.c's
 * caller); NCCL's calls are otherwise thread-safe.
 */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "device/backend.h"

static ts_status nccl_fail(ncclComm_t comm, ncclResult_t r, const char *call,
                           struct ts_error *err)
{
	const char *last;

	if (r == ncclSuccess)
		return TS_OK;
	last = ncclGetLastError(comm);
	switch (r) {
	case ncclInvalidArgument:
	case ncclInvalidUsage:
		return ts_error_set(err, TS_INVALID_ARGUMENT, "NCCL_ERROR", "%s: %s%s%s", call,
		                    ncclGetErrorString(r), last && *last ? ": " : "",
		                    last ? last : "");
	case ncclInternalError:
		return ts_error_set(err, TS_INTERNAL, "NCCL_ERROR", "%s: %s%s%s", call,
		                    ncclGetErrorString(r), last && *last ? ": " : "",
		                    last ? last : "");
	default:                 /* CUDA, system and remote errors */
		return ts_error_set(err, TS_UNAVAILABLE, "NCCL_ERROR", "%s: %s%s%s", call,
		                    ncclGetErrorString(r), last && *last ? ": " : "",
		                    last ? last : "");
	}
}

ts_status ts__cuda_comm_new(struct ts_device *const *devs, int n, void **ctx,
                            struct ts_error *err)
{
	ncclComm_t *comms = calloc((size_t)n, sizeof *comms);
	int ord[TS_COMM_MAX];
	ts_status st;

	if (!comms)
		return ts_error_oom(err, "out of memory making a communicator");
	for (int r = 0; r < n; r++)
		ord[r] = devs[r]->props.ordinal;
	st = nccl_fail(NULL, ncclCommInitAll(comms, n, ord), "ncclCommInitAll", err);
	if (st != TS_OK) {
		free(comms);
		return st;
	}
	*ctx = comms;
	return TS_OK;
}

void ts__cuda_comm_free(void *ctx, int n)
{
	ncclComm_t *comms = ctx;

	for (int r = 0; r < n; r++)
		nccl_fail(comms[r], ncclCommDestroy(comms[r]), "ncclCommDestroy", NULL);
	free(comms);
}

ts_status ts__cuda_comm_run(void *ctx, int n, enum ts__coll coll, struct ts_queue *const *qs,
                            float *const *bufs, float *const *recv, uint64_t count,
                            struct ts_error *err)
{
	ncclComm_t *comms = ctx;
	ts_status st;
	int r;

	st = nccl_fail(NULL, ncclGroupStart(), "ncclGroupStart", err);
	for (r = 0; r < n && st == TS_OK; r++) {
		cudaStream_t s = (cudaStream_t)ts_queue_native(qs[r]);
		float *b = bufs[r];

		switch (coll) {
		case TS__COLL_ALLREDUCE:
			st = nccl_fail(comms[r], ncclAllReduce(b, b, count, ncclFloat32, ncclSum,
			                                       comms[r], s),
			               "ncclAllReduce", err);
			break;
		case TS__COLL_REDUCE_SCATTER:
			st = nccl_fail(comms[r], ncclReduceScatter(b, recv ? recv[r]
			                                                   : b + (uint64_t)r * count,
			                                           count, ncclFloat32, ncclSum, comms[r],
			                                           s),
			               "ncclReduceScatter", err);
			break;
		case TS__COLL_ALL_GATHER:
			st = nccl_fail(comms[r], ncclAllGather(b + (uint64_t)r * count, b, count,
			                                       ncclFloat32, comms[r], s),
			               "ncclAllGather", err);
			break;
		}
	}
	/* the group ends whatever happened: NCCL launches a group's calls
	 * only at its end, and drops them all when one inside it failed */
	if (st == TS_OK)
		st = nccl_fail(NULL, ncclGroupEnd(), "ncclGroupEnd", err);
	else
		ncclGroupEnd();
	return st;
}
