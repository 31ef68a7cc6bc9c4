/*
 * nocuda.c - the CUDA backend of a build without CUDA (make CUDA=0).
 *
 * Discovery finds nothing and says why; sim and cpu take over. Compiled in
 * place of device/cuda_*.c, with the same internal discovery function.
 *
 * Thread-safety: stateless.
 */
#include <stdio.h>
#include <string.h>

#include "device/backend.h"

ts_status ts__cuda_discover(struct ts__discover_ctx *ctx,
                            struct ts_backend_info *info,
                            struct ts_error *err)
{
	memset(info, 0, sizeof *info);
	info->kind = TS_BACKEND_CUDA;
	info->compiled = false;
	snprintf(info->detail, sizeof info->detail, "built without CUDA");
	return TS_OK;
}

ts_status ts_device_cuda_status(struct ts_device *dev, int cuda_error, const char *call,
                                struct ts_error *err)
{
	(void)dev;
	return ts_error_set(err, TS_INTERNAL, "NO_CUDA", "%s: CUDA error %d in a build without CUDA",
	                    call, cuda_error);
}

ts_status ts_device_ipc_handle(struct ts_device *dev, void *base, struct ts_ipc_handle *out,
                               struct ts_error *err)
{
	(void)base;
	memset(out, 0, sizeof *out);
	return ts_error_set(err, TS_FAILED_PRECONDITION, "NOT_CUDA_DEVICE",
	                    "'%s' is no CUDA device: it has no CUDA IPC handles",
	                    ts_device_props(dev)->id);
}
