/*
 * nocuda_kernels.c - the CUDA training kernels of a build without CUDA
 * (make CUDA=0).
 *
 * There are none: ts_kernels_new answers UNIMPLEMENTED for a cuda device
 * (which such a build never discovers anyway). Compiled in place of
 * train/cuda_*.
 *
 * Thread-safety: stateless.
 */
#include <stddef.h>

#include "train/kernels_int.h"

const struct ts__kernel_ops *ts__kernels_cuda_ops(void)
{
	return NULL;   /* built without CUDA */
}
