/*
 * test_comm.c - collectives over several devices (device.h's ts_comm): the
 * host's on sim devices, NCCL's on CUDA (TS_TEST_BACKEND=cuda: every GPU
 * the runtime shows, under ../shared/fakecuda with 2, 4 and 8).
 *
 * Each case moves its data in with a copy on each rank's queue, runs the
 * collective right behind it (no sync between: the collective must wait for
 * each queue's earlier work), copies the result out and only then syncs.
 * The host's sums must be bit for bit the sums in rank order; NCCL's the
 * same values within float32 summation error, and the same bits on every
 * rank.
 */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "tests/unit/unit.h"

static struct ts_device_set *set;
static struct ts_device *devs[TS_COMM_MAX];
static int ndev;
static bool on_cuda;

static void setup_sim(void)
{
	struct ts_device_config dc = {.sim_devices = 4, .sim_device_memory = 64ull << 20,
	                              .host = "t"};
	struct ts_error err;

	ts_error_clear(&err);
	TS_UNIT_OK(err, ts_device_set_new(&dc, &set, &err));
	ndev = 0;
	for (size_t i = 0; i < ts_device_set_count(set); i++)
		if (ts_device_props(ts_device_set_at(set, i))->backend == TS_BACKEND_SIM)
			devs[ndev++] = ts_device_set_at(set, i);
	ck_assert_int_eq(ndev, 4);
	on_cuda = false;
}

static void setup_cuda(void)
{
	struct ts_device_config dc = {.sim_devices = 0, .cuda = true, .host = "t"};
	struct ts_error err;

	ts_error_clear(&err);
	TS_UNIT_OK(err, ts_device_set_new(&dc, &set, &err));
	ndev = 0;
	for (size_t i = 0; i < ts_device_set_count(set) && ndev < TS_COMM_MAX; i++)
		if (ts_device_props(ts_device_set_at(set, i))->backend == TS_BACKEND_CUDA)
			devs[ndev++] = ts_device_set_at(set, i);
	ck_assert_msg(ndev >= 2, "TS_TEST_BACKEND=cuda but %d GPU(s): a collective needs 2", ndev);
	on_cuda = true;
}

/* The stand-in's count of rule violations (0 on a real GPU: no stand-in). */
static int cuda_violations(void)
{
	int (*fn)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fakecuda_violations");

	return fn ? fn() : 0;
}

static void teardown(void)
{
	ts_device_set_free(set);
	set = NULL;
	ck_assert_msg(cuda_violations() == 0, "FAKECUDA VIOLATION (see stderr)");
}

/* Values of many magnitudes, so that the order of a sum shows in its bits. */
static float value(int rank, uint64_t i)
{
	uint64_t z = (uint64_t)rank * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 1;

	z ^= z >> 31;
	z *= 0x94d049bb133111ebull;
	z ^= z >> 29;
	return (float)((double)(z % 2000001) / 1000000.0 - 1.0) *
	       ldexpf(1.0f, (int)(z >> 60) - 6);
}

struct ranks {
	int n;
	struct ts_comm *comm;
	struct ts_queue *q[TS_COMM_MAX];
	float *dmem[TS_COMM_MAX];        /* device memory of each rank */
	float *host[TS_COMM_MAX];        /* what goes in, then what came out */
	uint64_t elems;                  /* of each rank's buffer */
};

static void ranks_open(struct ranks *r, int n, uint64_t elems)
{
	struct ts_error err;

	ts_error_clear(&err);
	memset(r, 0, sizeof *r);
	r->n = n;
	r->elems = elems;
	TS_UNIT_OK(err, ts_comm_new(devs, n, &r->comm, &err));
	ck_assert_int_eq(ts_comm_size(r->comm), n);
	ck_assert_str_eq(ts_comm_transport(r->comm), on_cuda ? "nccl" : "host");
	for (int k = 0; k < n; k++) {
		void *p;

		ck_assert_ptr_eq(ts_comm_device(r->comm, k), devs[k]);
		TS_UNIT_OK(err, ts_queue_new(devs[k], &r->q[k], &err));
		TS_UNIT_OK(err, ts_device_mem_alloc(devs[k], TS_MEM_DEVICE, elems * sizeof(float), &p,
		                                    &err));
		r->dmem[k] = p;
		r->host[k] = malloc(elems * sizeof(float));
		ck_assert_ptr_nonnull(r->host[k]);
		for (uint64_t i = 0; i < elems; i++)
			r->host[k][i] = value(k, i);
	}
}

/* Copies in on each queue, runs coll right behind, copies out, syncs. */
static void ranks_run(struct ranks *r,
                      ts_status (*coll)(struct ts_comm *, struct ts_queue *const *,
                                        float *const *, uint64_t, struct ts_error *),
                      uint64_t count)
{
	struct ts_error err;
	uint64_t bytes = r->elems * sizeof(float);

	ts_error_clear(&err);
	for (int k = 0; k < r->n; k++)
		TS_UNIT_OK(err, ts_queue_copy(r->q[k], r->dmem[k], r->host[k], bytes, TS_COPY_H2D,
		                              &err));
	TS_UNIT_OK(err, coll(r->comm, r->q, r->dmem, count, &err));
	for (int k = 0; k < r->n; k++)
		TS_UNIT_OK(err, ts_queue_copy(r->q[k], r->host[k], r->dmem[k], bytes, TS_COPY_D2H,
		                              &err));
	for (int k = 0; k < r->n; k++)
		TS_UNIT_OK(err, ts_queue_sync(r->q[k], &err));
}

static void ranks_close(struct ranks *r)
{
	for (int k = 0; k < r->n; k++) {
		ts_queue_free(r->q[k]);
		ts_device_mem_free(devs[k], TS_MEM_DEVICE, r->dmem[k], r->elems * sizeof(float));
		free(r->host[k]);
	}
	ts_comm_free(r->comm);
}

/* The sum over ranks 0..n-1 of element i, in that order. */
static float rank_order_sum(int n, uint64_t i)
{
	float s = value(0, i);

	for (int k = 1; k < n; k++)
		s += value(k, i);
	return s;
}

/* got is the rank-order sum: bit for bit on the host, within float32
 * summation error on NCCL (its order is its own). */
static void check_sum(float got, int n, uint64_t i, int rank)
{
	float want = rank_order_sum(n, i);
	float mag = 0;

	if (!on_cuda) {
		ck_assert_msg(memcmp(&got, &want, sizeof got) == 0,
		              "rank %d element %llu: %.9g, not the rank-order sum %.9g", rank,
		              (unsigned long long)i, got, want);
		return;
	}
	for (int k = 0; k < n; k++)
		mag += fabsf(value(k, i));
	ck_assert_msg(fabsf(got - want) <= 4.0f * (float)n * 1.2e-7f * mag,
	              "rank %d element %llu: %.9g, not %.9g", rank, (unsigned long long)i, got,
	              want);
}

/* Every rank count from 1 to the devices, a size that is no multiple of
 * the host's chunk. */
START_TEST(test_allreduce_sums_every_rank)
{
	uint64_t elems = 5000;

	for (int n = 1; n <= ndev; n++) {
		struct ranks r;

		ranks_open(&r, n, elems);
		ranks_run(&r, ts_comm_allreduce, elems);
		for (int k = 0; k < n; k++) {
			ck_assert_msg(memcmp(r.host[k], r.host[0], elems * sizeof(float)) == 0,
			              "%d ranks: rank %d's sums are not rank 0's bits", n, k);
			for (uint64_t i = 0; i < elems; i++)
				check_sum(r.host[k][i], n, i, k);
		}
		ranks_close(&r);
	}
}
END_TEST

/* Twice the same inputs: the same bits (a step's replicas must not drift
 * between runs). */
START_TEST(test_allreduce_same_bits_every_run)
{
	uint64_t elems = 3 << 12;
	struct ranks a, b;

	ranks_open(&a, ndev, elems);
	ranks_run(&a, ts_comm_allreduce, elems);
	ranks_open(&b, ndev, elems);
	ranks_run(&b, ts_comm_allreduce, elems);
	for (int k = 0; k < ndev; k++)
		ck_assert_msg(memcmp(a.host[k], b.host[k], elems * sizeof(float)) == 0,
		              "rank %d: two runs differ", k);
	ranks_close(&a);
	ranks_close(&b);
}
END_TEST

/* Rank k's slice k is the sum of every rank's slice k; then all-gather
 * puts each rank's slice into everyone's buffer: together an all-reduce. */
START_TEST(test_reduce_scatter_then_all_gather)
{
	uint64_t per = 777, elems = per * (uint64_t)ndev;
	struct ranks r;
	struct ts_error err;

	ts_error_clear(&err);
	ranks_open(&r, ndev, elems);
	ranks_run(&r, ts_comm_reduce_scatter, per);
	for (int k = 0; k < ndev; k++)
		for (uint64_t i = k * per; i < (k + 1) * per; i++)
			check_sum(r.host[k][i], ndev, i, k);
	/* the gathered slices: what each rank's own slice holds now */
	for (int k = 0; k < ndev; k++)
		for (int s = 0; s < ndev; s++)
			if (s != k)
				for (uint64_t i = s * per; i < (s + 1) * per; i++)
					r.host[k][i] = -1.0f;   /* overwritten by the gather */
	for (int k = 0; k < ndev; k++)
		TS_UNIT_OK(err, ts_queue_copy(r.q[k], r.dmem[k], r.host[k], elems * sizeof(float),
		                              TS_COPY_H2D, &err));
	TS_UNIT_OK(err, ts_comm_all_gather(r.comm, r.q, r.dmem, per, &err));
	for (int k = 0; k < ndev; k++)
		TS_UNIT_OK(err, ts_queue_copy(r.q[k], r.host[k], r.dmem[k], elems * sizeof(float),
		                              TS_COPY_D2H, &err));
	for (int k = 0; k < ndev; k++)
		TS_UNIT_OK(err, ts_queue_sync(r.q[k], &err));
	for (int k = 0; k < ndev; k++) {
		ck_assert_msg(memcmp(r.host[k], r.host[0], elems * sizeof(float)) == 0,
		              "rank %d's gathered buffer is not rank 0's", k);
		for (uint64_t i = 0; i < elems; i++)
			check_sum(r.host[k][i], ndev, i, k);
	}
	ranks_close(&r);
}
END_TEST

/* Each rank's buffer bytes are counted on its device, once a collective. */
/* Out of place (ZeRO-2's): rank k's buffer of its own gets the sum of
 * every rank's slice k, the same bits as the in-place form's slice k, and
 * the sent buffers stay as they were; no receive buffers is refused. */
START_TEST(test_reduce_scatter_to_own_buffers)
{
	uint64_t per = 1031, elems = per * (uint64_t)ndev;
	struct ranks r, in_place;
	float *recv[TS_COMM_MAX], *got = malloc(per * sizeof(float));
	struct ts_error err;

	ck_assert_ptr_nonnull(got);
	ts_error_clear(&err);
	ranks_open(&in_place, ndev, elems);
	ranks_run(&in_place, ts_comm_reduce_scatter, per);
	ranks_open(&r, ndev, elems);
	for (int k = 0; k < ndev; k++) {
		void *p;

		TS_UNIT_OK(err, ts_device_mem_alloc(devs[k], TS_MEM_DEVICE, per * sizeof(float), &p,
		                                    &err));
		recv[k] = p;
		TS_UNIT_OK(err, ts_queue_copy(r.q[k], r.dmem[k], r.host[k], elems * sizeof(float),
		                              TS_COPY_H2D, &err));
	}
	ck_assert_int_eq(ts_comm_reduce_scatter_to(r.comm, r.q, r.dmem, NULL, per, &err),
	                 TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	TS_UNIT_OK(err, ts_comm_reduce_scatter_to(r.comm, r.q, r.dmem, recv, per, &err));
	for (int k = 0; k < ndev; k++) {
		TS_UNIT_OK(err, ts_queue_copy(r.q[k], got, recv[k], per * sizeof(float), TS_COPY_D2H,
		                              &err));
		TS_UNIT_OK(err, ts_queue_copy(r.q[k], r.host[k], r.dmem[k], elems * sizeof(float),
		                              TS_COPY_D2H, &err));
		TS_UNIT_OK(err, ts_queue_sync(r.q[k], &err));
		for (uint64_t i = 0; i < per; i++)
			check_sum(got[i], ndev, k * per + i, k);
		ck_assert_msg(on_cuda || memcmp(got, in_place.host[k] + k * per,
		                                per * sizeof(float)) == 0,
		              "rank %d: not the in-place reduce-scatter's bits", k);
		for (uint64_t i = 0; i < elems; i++)
			ck_assert_msg(r.host[k][i] == value(k, i), "rank %d's sent element %llu changed",
			              k, (unsigned long long)i);
		ts_device_mem_free(devs[k], TS_MEM_DEVICE, recv[k], per * sizeof(float));
	}
	free(got);
	ranks_close(&r);
	ranks_close(&in_place);
}
END_TEST

START_TEST(test_collective_bytes_counted)
{
	uint64_t before[TS_COMM_MAX], elems = 1000;
	struct ranks r;

	for (int k = 0; k < ndev; k++)
		before[k] = ts_device_collective_bytes(devs[k]);
	ranks_open(&r, ndev, elems);
	ranks_run(&r, ts_comm_allreduce, elems);
	for (int k = 0; k < ndev; k++)
		ck_assert_uint_eq(ts_device_collective_bytes(devs[k]) - before[k],
		                  elems * sizeof(float));
	ranks_close(&r);
}
END_TEST

START_TEST(test_bad_communicators_refused)
{
	struct ts_device *twice[2] = {devs[0], devs[0]};
	struct ts_device *none[2] = {devs[0], NULL};
	struct ts_comm *c = (struct ts_comm *)1;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_comm_new(devs, 0, &c, &err), TS_INVALID_ARGUMENT);
	ck_assert_ptr_null(c);
	ck_assert_int_eq(ts_comm_new(devs, TS_COMM_MAX + 1, &c, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_comm_new(twice, 2, &c, &err), TS_INVALID_ARGUMENT);
	ck_assert_msg(strstr(err.message, "ranks 0 and 1") != NULL, "%s", err.message);
	ck_assert_int_eq(ts_comm_new(none, 2, &c, &err), TS_INVALID_ARGUMENT);
	ck_assert_int_eq(ts_comm_new(NULL, 2, &c, &err), TS_INVALID_ARGUMENT);
}
END_TEST

/* A queue of another device than its rank's, or no buffer: refused before
 * any rank's queue waits for the others (the queues still run after). */
START_TEST(test_bad_collectives_refused)
{
	struct ranks r;
	struct ts_queue *swapped[TS_COMM_MAX];
	float *holes[TS_COMM_MAX];
	struct ts_error err;

	ts_error_clear(&err);
	ranks_open(&r, 2, 64);
	swapped[0] = r.q[1];
	swapped[1] = r.q[0];
	ts_error_clear(&err);
	ck_assert_int_eq(ts_comm_allreduce(r.comm, swapped, r.dmem, 64, &err), TS_INVALID_ARGUMENT);
	ck_assert_msg(strstr(err.message, "rank 0's queue") != NULL, "%s", err.message);
	holes[0] = r.dmem[0];
	holes[1] = NULL;
	ck_assert_int_eq(ts_comm_allreduce(r.comm, r.q, holes, 64, &err), TS_INVALID_ARGUMENT);
	ck_assert_int_eq(ts_comm_allreduce(NULL, r.q, r.dmem, 64, &err), TS_INVALID_ARGUMENT);
	TS_UNIT_OK(err, ts_comm_allreduce(r.comm, r.q, holes, 0, &err));   /* nothing to do */
	ranks_run(&r, ts_comm_allreduce, 64);
	for (uint64_t i = 0; i < 64; i++)
		check_sum(r.host[1][i], 2, i, 1);
	ranks_close(&r);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("comm");
	TCase *tc = tcase_create("sim");

	tcase_add_checked_fixture(tc, setup_sim, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_allreduce_sums_every_rank);
	tcase_add_test(tc, test_allreduce_same_bits_every_run);
	tcase_add_test(tc, test_reduce_scatter_then_all_gather);
	tcase_add_test(tc, test_reduce_scatter_to_own_buffers);
	tcase_add_test(tc, test_collective_bytes_counted);
	tcase_add_test(tc, test_bad_communicators_refused);
	tcase_add_test(tc, test_bad_collectives_refused);
	suite_add_tcase(s, tc);
	if (ts_unit_cuda()) {
		tc = tcase_create("cuda");
		tcase_add_checked_fixture(tc, setup_cuda, teardown);
		tcase_set_timeout(tc, 300);
		tcase_add_test(tc, test_allreduce_sums_every_rank);
		tcase_add_test(tc, test_allreduce_same_bits_every_run);
		tcase_add_test(tc, test_reduce_scatter_then_all_gather);
	tcase_add_test(tc, test_reduce_scatter_to_own_buffers);
		tcase_add_test(tc, test_collective_bytes_counted);
		tcase_add_test(tc, test_bad_collectives_refused);
		suite_add_tcase(s, tc);
	}
	return s;
}
