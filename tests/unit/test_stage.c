/*
 * test_stage.c - the stager: writers into host and device buffers across
 * staging-slot edges with odd piece sizes, reads and run copies between
 * every pair of host and device spaces, range refusals, and injected copy
 * failures surfacing from a writer; strided reads of device memory costing
 * one copy per window; the full matrix of (backend, memory kind) pairs.
 *
 * The "stager" case runs on two sim devices; with TS_TEST_BACKEND=cuda the
 * "cuda" case runs the matrix and the strided reads on every GPU found
 * beside one sim device and cpu:0 (under ../shared/fakecuda, with
 * FAKECUDA_DEVICES=2 for GPU peers), and fails on any FAKECUDA VIOLATION.
 */
#include <check.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"
#include "storage/stage.h"
#include "tests/unit/unit.h"

static struct ts_device_set *set;
static struct ts_memory *mem;
static struct ts_stager *stg;
static const char *dut;          /* the device the strided reads run on */

static void setup_with(const struct ts_device_config *dc, double fraction)
{
	struct ts_memory_config mc = {.device_memory_fraction = fraction,
	                              .pinned_host_limit = 64ull << 20,
	                              .unpinned_host_limit = 128ull << 20,
	                              .pinned_segment = 8ull << 20};
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_set_new(dc, &set, &err), TS_OK);
	ck_assert_int_eq(ts_memory_new(set, &mc, &mem, &err), TS_OK);
	ck_assert_int_eq(ts_stager_new(set, mem, &stg, &err), TS_OK);
}

static void setup(void)
{
	struct ts_device_config dc = {.sim_devices = 2, .sim_device_memory = 64ull << 20,
	                              .cuda = false, .host = "t"};

	setup_with(&dc, 0.75);
	dut = "sim:0";
}

/* Every GPU, one sim device and cpu:0 in one set. */
static void setup_cuda(void)
{
	struct ts_device_config dc = {.sim_devices = 1, .sim_device_memory = 64ull << 20,
	                              .cuda = true, .host = "t"};
	struct ts_backend_info bi;

	setup_with(&dc, 0.02);     /* of each GPU's free memory: pools the tests fit in */
	ts_device_set_backend(set, TS_BACKEND_CUDA, &bi);
	ck_assert_msg(bi.device_count > 0, "TS_TEST_BACKEND=cuda but no GPU: %s", bi.detail);
	ck_assert_ptr_nonnull(ts_device_set_find(set, "sim:0"));
	dut = "cuda:0";
}

/* The stand-in's count of rule violations (0 on a real GPU: no stand-in). */
static int cuda_violations(void)
{
	int (*fn)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fakecuda_violations");

	return fn ? fn() : 0;
}

static void teardown(void)
{
	ts_stager_free(stg);
	ts_memory_free(mem);
	ts_device_set_free(set);
	ck_assert_msg(cuda_violations() == 0, "FAKECUDA VIOLATION (see stderr)");
}

static struct ts_buffer *buf(const char *dev, enum ts_memory_kind k, uint64_t n)
{
	struct ts_buffer *b = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_buffer_new(ts_memory_find(mem, dev, k), n, &b, &err), TS_OK);
	return b;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)((i * 131 + seed * 7 + (i >> 9)) & 0xff);
}

/* Writes n bytes in pieces of awkward sizes, then reads them back whole. */
static void roundtrip(const char *dev, enum ts_memory_kind k, size_t n)
{
	struct ts_buffer *b = buf(dev, k, n);
	unsigned char *src = malloc(n ? n : 1), *back = malloc(n ? n : 1);
	static const size_t pieces[] = {1, 4095, 65536, 1000003, 3, 4u << 20};
	struct ts_writer *w;
	struct ts_error err;
	size_t off = 0, i = 0;

	ts_error_clear(&err);
	fill(src, n, (unsigned)n);
	ck_assert_int_eq(ts_writer_new(stg, b, 0, &w, &err), TS_OK);
	while (off < n) {
		size_t take = pieces[i++ % 6];

		take = take < n - off ? take : n - off;
		ck_assert_int_eq(ts_writer_write(w, src + off, take, &err), TS_OK);
		off += take;
	}
	ck_assert_uint_eq(ts_writer_offset(w), n);
	/* a byte past the end is refused and changes nothing */
	ck_assert_int_eq(ts_writer_write(w, src, 1, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_writer_finish(w, &err), TS_OK);
	ts_writer_free(w);
	memset(back, 0, n);
	ck_assert_int_eq(ts_stage_read(stg, b, 0, back, n, &err), TS_OK);
	ck_assert(memcmp(src, back, n) == 0);
	free(src);
	free(back);
	ts_buffer_unref(b);
}

START_TEST(test_writer_host_and_device)
{
	static const size_t sizes[] = {1, 4u << 20, (4u << 20) + 1, 13u << 20, 777777};

	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		roundtrip("sim:0", TS_MEM_DEVICE, sizes[i]);
		roundtrip("sim:1", TS_MEM_PINNED_HOST, sizes[i]);
		roundtrip("cpu:0", TS_MEM_DEVICE, sizes[i]);
	}
}
END_TEST

/* A device the stager was not made with (one of another set) has no
 * queues here: writers, reads and copies touching its memory are refused
 * (INTERNAL, NO_QUEUES) instead of following a NULL queue. */
START_TEST(test_foreign_device_refused)
{
	struct ts_device_config dc = {.sim_devices = 1, .sim_device_memory = 16ull << 20,
	                              .cuda = false, .host = "o"};
	struct ts_memory_config mc = {.device_memory_fraction = 0.75,
	                              .pinned_host_limit = 8ull << 20,
	                              .unpinned_host_limit = 8ull << 20,
	                              .pinned_segment = 1ull << 20};
	struct ts_device_set *oset;
	struct ts_memory *omem;
	struct ts_buffer *foreign, *mine = buf("sim:0", TS_MEM_DEVICE, 4096);
	struct ts_writer *w = NULL;
	struct ts_run run = {.src_offset = 0, .dst_offset = 0, .len = 4096};
	struct ts_error err;
	char host[4096];

	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_set_new(&dc, &oset, &err), TS_OK);
	ck_assert_int_eq(ts_memory_new(oset, &mc, &omem, &err), TS_OK);
	ck_assert_int_eq(ts_buffer_new(ts_memory_find(omem, "sim:0", TS_MEM_DEVICE), 4096, &foreign,
	                               &err), TS_OK);
	ck_assert_int_eq(ts_writer_new(stg, foreign, 0, &w, &err), TS_INTERNAL);
	ck_assert_str_eq(err.reason, "NO_QUEUES");
	ck_assert_ptr_null(w);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_stage_read(stg, foreign, 0, host, sizeof host, &err), TS_INTERNAL);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_stage_copy_runs(stg, mine, foreign, &run, 1, &err), TS_INTERNAL);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_stage_copy_runs(stg, foreign, mine, &run, 1, &err), TS_INTERNAL);
	ck_assert_str_eq(err.reason, "NO_QUEUES");
	ts_buffer_unref(foreign);
	ts_buffer_unref(mine);
	ts_memory_free(omem);
	ts_device_set_free(oset);
}
END_TEST

START_TEST(test_staging_slots_return_to_the_pool)
{
	struct ts_space_stats s;

	roundtrip("sim:0", TS_MEM_DEVICE, 13u << 20);
	ts_space_stats(ts_memory_find(mem, "sim:0", TS_MEM_PINNED_HOST), &s);
	ck_assert_uint_eq(s.bytes_in_use, 0);
	ck_assert_uint_gt(s.peak_bytes_in_use, 0);      /* slots were used ... */
	ck_assert_uint_le(s.peak_bytes_in_use, TS_STAGE_SLOTS * (uint64_t)TS_STAGE_SLOT);
}
END_TEST

START_TEST(test_copy_runs_every_pair)
{
	static const struct {
		const char *dev;
		enum ts_memory_kind k;
	} ends[] = {{"sim:0", TS_MEM_DEVICE}, {"sim:1", TS_MEM_DEVICE},
	            {"sim:0", TS_MEM_UNPINNED_HOST}, {"sim:1", TS_MEM_PINNED_HOST}};
	enum { N = 100000 };
	struct ts_run runs[] = {{0, 10, 100}, {5000, 0, 7}, {N - 50, 200, 50}, {123, 400, 0}};
	unsigned char src[N], out[N];
	struct ts_error err;

	fill(src, N, 3);
	for (size_t a = 0; a < 4; a++) {
		for (size_t b = 0; b < 4; b++) {
			struct ts_buffer *s = buf(ends[a].dev, ends[a].k, N), *d = buf(ends[b].dev, ends[b].k, N);
			struct ts_writer *w;

			ts_error_clear(&err);
			ck_assert_int_eq(ts_writer_new(stg, s, 0, &w, &err), TS_OK);
			ck_assert_int_eq(ts_writer_write(w, src, N, &err), TS_OK);
			ck_assert_int_eq(ts_writer_finish(w, &err), TS_OK);
			ts_writer_free(w);
			ck_assert_int_eq(ts_stage_copy_runs(stg, d, s, runs, 4, &err), TS_OK);
			ck_assert_int_eq(ts_stage_read(stg, d, 0, out, N, &err), TS_OK);
			for (size_t r = 0; r < 4; r++)
				ck_assert(memcmp(out + runs[r].dst_offset, src + runs[r].src_offset, runs[r].len) == 0);
			ts_buffer_unref(s);
			ts_buffer_unref(d);
		}
	}
}
END_TEST

/* Host-to-host runs into a new buffer's fresh pages go through its file
 * (ts_host_mem_fill), into touched pages by memcpy: either way exactly the
 * runs' bytes land, edges inside pages included, and nothing else changes. */
START_TEST(test_host_copy_into_fresh_and_touched_pages)
{
	enum { N = 12 << 20 };
	static const enum ts_memory_kind kinds[] = {TS_MEM_PINNED_HOST, TS_MEM_UNPINNED_HOST};
	struct ts_run runs[] = {{0, 4096 * 3 + 17, (8 << 20) + 5}, {N - 9000, 100, 7000},
	                        {12345, (10 << 20) + 1, 1 << 20}};
	struct ts_error err;

	for (int touched = 0; touched < 2; touched++)
		for (size_t k = 0; k < 2; k++) {
			struct ts_buffer *s = buf("sim:0", TS_MEM_PINNED_HOST, N);
			struct ts_buffer *d = buf("sim:1", kinds[k], N);
			unsigned char *sp = ts_buffer_data(s), *dp = ts_buffer_data(d);
			unsigned char *want = malloc(N);

			ck_assert_ptr_nonnull(want);
			fill(sp, N, 11);
			memset(want, touched ? 0xa5 : 0, N);
			if (touched)
				memset(dp, 0xa5, N);
			for (size_t r = 0; r < 3; r++)
				memcpy(want + runs[r].dst_offset, sp + runs[r].src_offset, runs[r].len);
			ts_error_clear(&err);
			ck_assert_int_eq(ts_stage_copy_runs(stg, d, s, runs, 3, &err), TS_OK);
			ck_assert_msg(memcmp(dp, want, N) == 0, "%s, %s pages: the bytes differ",
			              ts_memory_kind_name(kinds[k]), touched ? "touched" : "fresh");
			free(want);
			ts_buffer_unref(s);
			ts_buffer_unref(d);
		}
}
END_TEST

/* Pageable host <-> device goes through the pinned ring: many chunks, odd edges. */
START_TEST(test_staged_copies_through_the_ring)
{
	const size_t n = (13u << 20) + 12345;
	struct ts_buffer *h = buf("sim:0", TS_MEM_UNPINNED_HOST, n);
	struct ts_buffer *dv = buf("sim:0", TS_MEM_DEVICE, n);
	struct ts_buffer *back = buf("cpu:0", TS_MEM_DEVICE, n);
	struct ts_run runs[] = {{0, 7, n - 7}};
	struct ts_run whole = {0, 0, n};
	struct ts_space_stats ps;
	struct ts_error err;

	ts_error_clear(&err);
	fill(ts_buffer_data(h), n, 5);
	ck_assert_int_eq(ts_stage_copy_runs(stg, dv, h, runs, 1, &err), TS_OK);
	ck_assert_int_eq(ts_stage_copy_runs(stg, back, dv, &whole, 1, &err), TS_OK);
	ck_assert(memcmp((char *)ts_buffer_data(back) + 7, ts_buffer_data(h), n - 7) == 0);
	ts_space_stats(ts_memory_find(mem, "sim:0", TS_MEM_PINNED_HOST), &ps);
	ck_assert_uint_eq(ps.bytes_in_use, 0);                     /* the ring went back */
	ck_assert_uint_eq(ps.peak_bytes_in_use, TS_STAGE_SLOTS * (uint64_t)TS_STAGE_SLOT);
	ts_buffer_unref(h);
	ts_buffer_unref(dv);
	ts_buffer_unref(back);
}
END_TEST

START_TEST(test_read_runs_into_host_memory)
{
	struct ts_buffer *b = buf("sim:1", TS_MEM_DEVICE, 4096);
	struct ts_run runs[] = {{4000, 0, 96}, {0, 96, 4}, {100, 100, 1}};
	unsigned char src[4096], out[101];
	struct ts_writer *w;
	struct ts_error err;

	ts_error_clear(&err);
	fill(src, sizeof src, 9);
	ck_assert_int_eq(ts_writer_new(stg, b, 0, &w, &err), TS_OK);
	ck_assert_int_eq(ts_writer_write(w, src, sizeof src, &err), TS_OK);
	ck_assert_int_eq(ts_writer_finish(w, &err), TS_OK);
	ts_writer_free(w);
	ck_assert_int_eq(ts_stage_read_runs(stg, b, runs, 3, out, &err), TS_OK);
	ck_assert(memcmp(out, src + 4000, 96) == 0);
	ck_assert(memcmp(out + 96, src, 4) == 0);
	ck_assert_int_eq(out[100], src[100]);
	ts_buffer_unref(b);
}
END_TEST

START_TEST(test_out_of_range_refused)
{
	struct ts_buffer *a = buf("sim:0", TS_MEM_DEVICE, 100), *b = buf("sim:0", TS_MEM_PINNED_HOST, 50);
	struct ts_run bad_src = {90, 0, 20}, bad_dst = {0, 40, 20};
	char out[200];
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_stage_copy_runs(stg, b, a, &bad_src, 1, &err), TS_OUT_OF_RANGE);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_stage_copy_runs(stg, b, a, &bad_dst, 1, &err), TS_OUT_OF_RANGE);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_stage_read(stg, a, 50, out, 51, &err), TS_OUT_OF_RANGE);
	ts_buffer_unref(a);
	ts_buffer_unref(b);
}
END_TEST

START_TEST(test_injected_copy_failure_surfaces)
{
	struct ts_buffer *b = buf("sim:0", TS_MEM_DEVICE, 9u << 20);
	unsigned char *src = calloc(1, 9u << 20);
	struct ts_writer *w;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_writer_new(stg, b, 0, &w, &err), TS_OK);
	ts__sim_inject_copy_failure(ts_device_set_find(set, "sim:0"), 1);
	(void)ts_writer_write(w, src, 9u << 20, &err);
	ck_assert_int_ne(ts_writer_finish(w, &err), TS_OK);
	ts_writer_free(w);
	free(src);
	ts_buffer_unref(b);
}
END_TEST


/* ---- strided reads: one copy per covering window ------------------------------ */

/* A device buffer of n bytes of fill(seed) on dev. */
static struct ts_buffer *device_pattern(const char *dev, size_t n, unsigned seed,
                                        unsigned char **host)
{
	struct ts_buffer *b = buf(dev, TS_MEM_DEVICE, n);
	struct ts_writer *w;
	struct ts_error err;

	*host = malloc(n);
	ck_assert_ptr_nonnull(*host);
	fill(*host, n, seed);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_writer_new(stg, b, 0, &w, &err), TS_OK);
	ck_assert_int_eq(ts_writer_write(w, *host, n, &err), TS_OK);
	ck_assert_int_eq(ts_writer_finish(w, &err), TS_OK);
	ts_writer_free(w);
	return b;
}

/* Reads count runs of len bytes, stride bytes apart (negative: from the end
 * backwards), checks every byte and returns the copies the device made. */
static uint64_t strided_read(struct ts_buffer *b, const unsigned char *host, size_t count,
                             size_t len, long long stride)
{
	struct ts_device *dev = ts_buffer_device(b);
	struct ts_run *runs = calloc(count, sizeof *runs);
	unsigned char *out = malloc(count * len);
	uint64_t first = stride < 0 ? ts_buffer_size(b) - len : 0, before;
	struct ts_error err;

	ck_assert(runs && out);
	for (size_t i = 0; i < count; i++)
		runs[i] = (struct ts_run){.src_offset = first + (uint64_t)((long long)i * stride),
		                          .dst_offset = i * len, .len = len};
	memset(out, 0xa5, count * len);
	ts_error_clear(&err);
	before = ts_device_copies(dev);
	ck_assert_int_eq(ts_stage_read_runs(stg, b, runs, count, out, &err), TS_OK);
	before = ts_device_copies(dev) - before;
	for (size_t i = 0; i < count; i++)
		ck_assert_msg(memcmp(out + i * len, host + runs[i].src_offset, len) == 0,
		              "run %zu of %zu (stride %lld) differs", i, count, stride);
	free(runs);
	free(out);
	return before;
}

START_TEST(test_strided_read_is_one_copy)
{
	const size_t n = 1u << 20;         /* 256K float32 elements */
	unsigned char *host;
	struct ts_buffer *b = device_pattern(dut, n, 21, &host);
	struct ts_space_stats ps;

	/* x[::4] of float32: 64K runs of 4 bytes */
	ck_assert_uint_eq(strided_read(b, host, 65536, 4, 16), 1);
	/* x[::-4] walks the same window backwards */
	ck_assert_uint_eq(strided_read(b, host, 65536, 4, -16), 1);
	/* rows of 1 KiB every 3 KiB */
	ck_assert_uint_eq(strided_read(b, host, 341, 1024, 3072), 1);
	/* runs farther apart than TS_STAGE_GAP gain nothing from a window: one
	 * copy each, straight into the destination */
	ck_assert_uint_eq(strided_read(b, host, 7, 8, (long long)TS_STAGE_GAP + 4096), 7);
	ts_space_stats(ts_memory_find(mem, dut, TS_MEM_PINNED_HOST), &ps);
	ck_assert_uint_eq(ps.bytes_in_use, 0);          /* the slots went back */
	ts_buffer_unref(b);
	free(host);
}
END_TEST

START_TEST(test_strided_read_spanning_slots)
{
	const size_t n = 12u << 20;
	unsigned char *host;
	struct ts_buffer *b = device_pattern(dut, n, 22, &host);
	uint64_t copies;

	/* x[::64] of float32 over 12 MiB spans three slots: three windows */
	copies = strided_read(b, host, n / 256, 4, 256);
	ck_assert_msg(copies >= 3 && copies <= 4, "%llu copies for three slots of span",
	              (unsigned long long)copies);
	ts_buffer_unref(b);
	free(host);
}
END_TEST

/* With the pinned budget spent, a strided read still comes whole, one copy
 * per run straight into the destination. */
START_TEST(test_strided_read_without_pinned_slots)
{
	const size_t n = 1u << 16;
	unsigned char *host;
	struct ts_buffer *b = device_pattern("sim:0", n, 23, &host);
	static const uint64_t grains[] = {1u << 20, 16u << 10};
	struct ts_buffer *hog[256];
	struct ts_error err;
	size_t nhog = 0;

	/* the 64 MiB pinned budget taken, 1 MiB at a time, then the rest in
	 * pieces smaller than the read's window */
	for (int g = 0; g < 2; g++)
		for (;;) {
			ts_error_clear(&err);
			ck_assert_uint_lt(nhog, 256);
			if (ts_buffer_new(ts_memory_find(mem, "sim:0", TS_MEM_PINNED_HOST), grains[g],
			                  &hog[nhog], &err) != TS_OK)
				break;
			nhog++;
		}
	ck_assert_int_eq(err.status, TS_RESOURCE_EXHAUSTED);
	ck_assert_uint_eq(strided_read(b, host, 1024, 4, 64), 1024);
	while (nhog)
		ts_buffer_unref(hog[--nhog]);
	ck_assert_uint_eq(strided_read(b, host, 1024, 4, 64), 1);
	ts_buffer_unref(b);
	free(host);
}
END_TEST

/* ---- every pair of (backend, memory kind) -------------------------------------- */

struct end {
	char dev[32];
	enum ts_memory_kind kind;
};

/* Every (device, memory kind) of the set. */
static size_t all_ends(struct end *out, size_t cap)
{
	size_t n = 0;

	for (size_t i = 0; i < ts_device_set_count(set); i++)
		for (int k = 0; k < TS_MEM_KIND_COUNT && n < cap; k++) {
			snprintf(out[n].dev, sizeof out[n].dev, "%s",
			         ts_device_props(ts_device_set_at(set, i))->id);
			out[n++].kind = (enum ts_memory_kind)k;
		}
	return n;
}

START_TEST(test_every_backend_and_kind_pair)
{
	enum { N = 200000, NRUNS = 6 };
	struct ts_run runs[NRUNS] = {{0, 10, 100}, {5000, 0, 7}, {N - 50, 200, 50}, {123, 400, 0},
	                             {60000, 100000, 70000}, {199000, 1000, 4}};
	struct ts_run strided[64];
	struct end ends[64];
	size_t nends = all_ends(ends, 64);
	unsigned char *src = malloc(N), *out = malloc(N), *got = malloc(sizeof strided / sizeof strided[0] * 4);
	struct ts_error err;
	bool backends[TS_BACKEND_COUNT] = {false};

	ck_assert(src && out && got);
	for (size_t i = 0; i < 64; i++)
		strided[i] = (struct ts_run){.src_offset = 8 + 16 * i, .dst_offset = 4 * i, .len = 4};
	fill(src, N, 3);
	for (size_t a = 0; a < nends; a++) {
		struct ts_buffer *s = buf(ends[a].dev, ends[a].kind, N);
		struct ts_writer *w;

		backends[ts_device_props(ts_buffer_device(s))->backend] = true;
		ts_error_clear(&err);
		ck_assert_int_eq(ts_writer_new(stg, s, 0, &w, &err), TS_OK);
		ck_assert_int_eq(ts_writer_write(w, src, N, &err), TS_OK);
		ck_assert_int_eq(ts_writer_finish(w, &err), TS_OK);
		ts_writer_free(w);
		/* a strided read of every end */
		ck_assert_msg(ts_stage_read_runs(stg, s, strided, 64, got, &err) == TS_OK,
		              "read of %s/%s: %s", ends[a].dev, ts_memory_kind_name(ends[a].kind),
		              err.message);
		for (size_t i = 0; i < 64; i++)
			ck_assert(memcmp(got + 4 * i, src + 8 + 16 * i, 4) == 0);
		for (size_t b = 0; b < nends; b++) {
			struct ts_buffer *d = buf(ends[b].dev, ends[b].kind, N);

			ck_assert_msg(ts_stage_copy_runs(stg, d, s, runs, NRUNS, &err) == TS_OK,
			              "copy %s/%s -> %s/%s: %s", ends[a].dev,
			              ts_memory_kind_name(ends[a].kind), ends[b].dev,
			              ts_memory_kind_name(ends[b].kind), err.message);
			ck_assert_int_eq(ts_stage_read(stg, d, 0, out, N, &err), TS_OK);
			for (size_t r = 0; r < NRUNS; r++)
				ck_assert_msg(memcmp(out + runs[r].dst_offset, src + runs[r].src_offset,
				                     runs[r].len) == 0,
				              "copy %s/%s -> %s/%s: run %zu differs", ends[a].dev,
				              ts_memory_kind_name(ends[a].kind), ends[b].dev,
				              ts_memory_kind_name(ends[b].kind), r);
			ts_buffer_unref(d);
		}
		ts_buffer_unref(s);
	}
	/* the set really mixes backends: sim and cpu always, cuda in the cuda case */
	ck_assert(backends[TS_BACKEND_SIM] && backends[TS_BACKEND_CPU]);
	ck_assert(strcmp(dut, "cuda:0") != 0 || backends[TS_BACKEND_CUDA]);
	free(src);
	free(out);
	free(got);
}
END_TEST

Suite *ts_unit_suite(void)
{
	bool cuda = ts_unit_cuda();
	Suite *s = suite_create("stage");
	TCase *tc = tcase_create("stager");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_writer_host_and_device);
	tcase_add_test(tc, test_foreign_device_refused);
	tcase_add_test(tc, test_staging_slots_return_to_the_pool);
	tcase_add_test(tc, test_copy_runs_every_pair);
	tcase_add_test(tc, test_host_copy_into_fresh_and_touched_pages);
	tcase_add_test(tc, test_staged_copies_through_the_ring);
	tcase_add_test(tc, test_read_runs_into_host_memory);
	tcase_add_test(tc, test_out_of_range_refused);
	tcase_add_test(tc, test_injected_copy_failure_surfaces);
	tcase_add_test(tc, test_strided_read_is_one_copy);
	tcase_add_test(tc, test_strided_read_spanning_slots);
	tcase_add_test(tc, test_strided_read_without_pinned_slots);
	tcase_add_test(tc, test_every_backend_and_kind_pair);
	suite_add_tcase(s, tc);
	if (cuda) {
		tc = tcase_create("cuda");
		tcase_add_checked_fixture(tc, setup_cuda, teardown);
		tcase_set_timeout(tc, 300);
		tcase_add_test(tc, test_strided_read_is_one_copy);
		tcase_add_test(tc, test_strided_read_spanning_slots);
		tcase_add_test(tc, test_every_backend_and_kind_pair);
		suite_add_tcase(s, tc);
	}
	return s;
}
