/*
 * test_device.c - Check suite "device": discovery, memory kinds, sim
 * capacity, queues, events, copy failures and concurrency of the device
 * layer, on sim and cpu devices (and CUDA discovery failing cleanly where
 * there is no GPU).
 *
 * Every test builds its own device set; tests that depend on the absence of
 * a GPU say so and adapt when one is present. The sticky-error case needs
 * two GPUs of ../shared/fakecuda (FAKECUDA_DEVICES=2), whose fault hook it
 * calls; elsewhere it has nothing to break and returns.
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/hugepage.h"
#include "device/backend.h"
#include "device/device.h"
#include "tests/unit/unit.h"

#define MIB (1024ULL * 1024)

/* ---- helpers ------------------------------------------------------------- */

static struct ts_device_set *make_set(int sims, uint64_t mem)
{
	struct ts_device_config cfg = {
		.sim_devices = sims, .sim_device_memory = mem, .cuda = true,
		.host = "testhost",
	};
	struct ts_device_set *set = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_set_new(&cfg, &set, &err), TS_OK);
	ck_assert_ptr_nonnull(set);
	return set;
}

static size_t cuda_count(const struct ts_device_set *set)
{
	struct ts_backend_info info;

	ts_device_set_backend(set, TS_BACKEND_CUDA, &info);
	return (size_t)info.device_count;
}

static struct ts_device *find(const struct ts_device_set *set, const char *id)
{
	struct ts_device *dev = ts_device_set_find(set, id);

	ck_assert_msg(dev != NULL, "no device '%s'", id);
	return dev;
}

static void *xalloc(struct ts_device *dev, enum ts_memory_kind kind, size_t n)
{
	struct ts_error err;
	void *p = NULL;

	ts_error_clear(&err);
	ck_assert_msg(ts_device_mem_alloc(dev, kind, n, &p, &err) == TS_OK,
	              "alloc %zu on %s/%s: %s", n, ts_device_props(dev)->id,
	              ts_memory_kind_name(kind), err.message);
	ck_assert_ptr_nonnull(p);
	return p;
}

static struct ts_queue *xqueue(struct ts_device *dev)
{
	struct ts_queue *q = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_queue_new(dev, &q, &err), TS_OK);
	return q;
}

static struct ts_event *xevent(struct ts_device *dev)
{
	struct ts_event *ev = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_event_new(dev, &ev, &err), TS_OK);
	return ev;
}

static void xcopy(struct ts_queue *q, void *dst, const void *src, size_t n,
                  enum ts_copy_kind kind)
{
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_queue_copy(q, dst, src, n, kind, &err), TS_OK);
}

static void xrecord(struct ts_event *ev, struct ts_queue *q)
{
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_event_record(ev, q, &err), TS_OK);
}

static void xsync_event(struct ts_event *ev)
{
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_event_sync(ev, &err) == TS_OK, "event sync: %s", err.message);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	uint32_t x = seed * 2654435761u + 1;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (unsigned char)x;
	}
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* A host function that blocks its queue until the test opens it. */
struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool open;
	bool entered;
};

static void gate_init(struct gate *g)
{
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	g->open = false;
	g->entered = false;
}

static void gate_fn(void *arg)
{
	struct gate *g = arg;

	pthread_mutex_lock(&g->mu);
	g->entered = true;
	pthread_cond_broadcast(&g->cv);
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

static void gate_wait_entered(struct gate *g)
{
	pthread_mutex_lock(&g->mu);
	while (!g->entered)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

static void gate_open(struct gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->open = true;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

static void gate_destroy(struct gate *g)
{
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
}

static void sleep_fn(void *arg)
{
	sleep_ms((long)(intptr_t)arg);
}

static void set_flag_fn(void *arg)
{
	atomic_store((atomic_int *)arg, 1);
}

/* ---- discovery ----------------------------------------------------------- */

START_TEST(test_discovery_order)
{
	struct ts_device_set *set = make_set(3, 64 * MIB);
	size_t nc = cuda_count(set);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

	ck_assert_uint_eq(ts_device_set_count(set), nc + 4);
	for (size_t i = 0; i < nc; i++) {
		const struct ts_device_props *p = ts_device_props(ts_device_set_at(set, i));

		ck_assert_int_eq(p->backend, TS_BACKEND_CUDA);
		ck_assert(!p->simulated);
	}
	for (int i = 0; i < 3; i++) {
		const struct ts_device_props *p =
			ts_device_props(ts_device_set_at(set, nc + (size_t)i));
		char id[16];

		snprintf(id, sizeof id, "sim:%d", i);
		ck_assert_str_eq(p->id, id);
		ck_assert_int_eq(p->backend, TS_BACKEND_SIM);
		ck_assert_int_eq(p->ordinal, i);
		ck_assert_str_eq(p->name, "tstage simulated accelerator");
		ck_assert_str_eq(p->host, "testhost");
		ck_assert(p->simulated);
		ck_assert_uint_eq(p->total_memory, 64 * MIB);
		ck_assert_uint_eq(p->free_memory, 64 * MIB);
		ck_assert_int_eq(p->multiprocessors, 1);
		ck_assert_int_eq(p->compute_major, 0);
		ck_assert_str_eq(p->pci_bus_id, "");
	}
	{
		const struct ts_device_props *p =
			ts_device_props(ts_device_set_at(set, nc + 3));

		ck_assert_str_eq(p->id, "cpu:0");
		ck_assert_int_eq(p->backend, TS_BACKEND_CPU);
		ck_assert_int_eq(p->ordinal, 0);
		ck_assert(!p->simulated);
		ck_assert_str_eq(p->host, "testhost");
		ck_assert_uint_gt(p->total_memory, 0);
		ck_assert_uint_le(p->free_memory, p->total_memory);
		ck_assert_int_eq(p->multiprocessors, (int)ncpu);
		ck_assert_str_ne(p->name, "");
	}
	ck_assert_ptr_null(ts_device_set_at(set, nc + 4));
	for (size_t i = 0; i < ts_device_set_count(set); i++) {
		struct ts_device *dev = ts_device_set_at(set, i);

		ck_assert(!ts_device_broken(dev));
		for (int k = 0; k < TS_MEM_KIND_COUNT; k++)
			ck_assert(ts_device_has_memory_kind(dev, (enum ts_memory_kind)k));
		ck_assert(!ts_device_has_memory_kind(dev, TS_MEM_KIND_COUNT));
	}
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_default_backend)
{
	struct ts_device_set *set = make_set(3, 64 * MIB);
	struct ts_backend_info info;

	if (cuda_count(set) == 0)
		ck_assert_int_eq(ts_device_set_default_backend(set), TS_BACKEND_SIM);
	else
		ck_assert_int_eq(ts_device_set_default_backend(set), TS_BACKEND_CUDA);
	ts_device_set_backend(set, TS_BACKEND_SIM, &info);
	ck_assert_int_eq(info.kind, TS_BACKEND_SIM);
	ck_assert(info.compiled && info.available);
	ck_assert_int_eq(info.device_count, 3);
	ck_assert_ptr_nonnull(strstr(info.detail, "64.00 MiB"));
	ts_device_set_backend(set, TS_BACKEND_CPU, &info);
	ck_assert(info.compiled && info.available);
	ck_assert_int_eq(info.device_count, 1);
	ts_device_set_free(set);

	/* Without sim devices (and no GPU) cpu is the default. */
	set = make_set(0, 0);
	ts_device_set_backend(set, TS_BACKEND_SIM, &info);
	ck_assert(info.compiled && !info.available);
	ck_assert_int_eq(info.device_count, 0);
	if (cuda_count(set) == 0) {
		ck_assert_int_eq(ts_device_set_default_backend(set), TS_BACKEND_CPU);
		ck_assert_uint_eq(ts_device_set_count(set), 1);
	}
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_cuda_backend_info)
{
	struct ts_device_set *set = make_set(1, 16 * MIB);
	struct ts_device_config off = {.sim_devices = 1, .cuda = false, .host = "h"};
	struct ts_backend_info info;
	struct ts_error err;

	ts_device_set_backend(set, TS_BACKEND_CUDA, &info);
	ck_assert_int_eq(info.kind, TS_BACKEND_CUDA);
#if TS_HAVE_CUDA
	ck_assert(info.compiled);
	if (!info.available) {
		ck_assert_int_eq(info.device_count, 0);
		ck_assert_msg(strncmp(info.detail, "cudaGetDeviceCount: ", 20) == 0,
		              "detail '%s'", info.detail);
		ck_assert_uint_gt(strlen(info.detail), 20);
	} else {
		ck_assert_int_gt(info.device_count, 0);
		ck_assert_ptr_nonnull(strstr(info.detail, "CUDA runtime"));
	}
#else
	ck_assert(!info.compiled);
	ck_assert(!info.available);
	ck_assert_int_eq(info.device_count, 0);
	ck_assert_str_eq(info.detail, "built without CUDA");
#endif
	ts_device_set_free(set);

	/* cuda = false skips the backend. */
	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_set_new(&off, &set, &err), TS_OK);
	ts_device_set_backend(set, TS_BACKEND_CUDA, &info);
	ck_assert(!info.available);
#if TS_HAVE_CUDA
	ck_assert_str_eq(info.detail, "disabled by configuration");
#else
	ck_assert_str_eq(info.detail, "built without CUDA");
#endif
	ck_assert_int_eq(ts_device_set_default_backend(set), TS_BACKEND_SIM);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_sim_default_count_and_host)
{
	struct ts_device_config cfg = {.sim_devices = -1, .cuda = true, .host = NULL};
	struct ts_device_set *set = NULL;
	struct ts_backend_info info;
	struct ts_error err;
	char host[64] = "";

	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_set_new(&cfg, &set, &err), TS_OK);
	ts_device_set_backend(set, TS_BACKEND_SIM, &info);
	if (cuda_count(set) == 0)
		ck_assert_int_eq(info.device_count, 2);
	else
		ck_assert_int_eq(info.device_count, 0);
	gethostname(host, sizeof host - 1);
	ck_assert_str_eq(ts_device_props(find(set, "cpu:0"))->host, host);
	if (info.device_count > 0)
		ck_assert_uint_eq(ts_device_props(find(set, "sim:0"))->total_memory,
		                  TS__SIM_DEFAULT_MEMORY);
	ts_device_set_free(set);

	/* A NULL configuration means the defaults. */
	ck_assert_int_eq(ts_device_set_new(NULL, &set, &err), TS_OK);
	ck_assert_ptr_nonnull(ts_device_set_find(set, "cpu:0"));
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_find)
{
	struct ts_device_set *set = make_set(3, 16 * MIB);
	size_t nc = cuda_count(set);

	ck_assert_ptr_eq(ts_device_set_find(set, "sim:1"), ts_device_set_at(set, nc + 1));
	ck_assert_ptr_eq(ts_device_set_find(set, "cpu:0"), ts_device_set_at(set, nc + 3));
	ck_assert_ptr_null(ts_device_set_find(set, "sim:3"));
	ck_assert_ptr_null(ts_device_set_find(set, "sim:"));
	ck_assert_ptr_null(ts_device_set_find(set, "cpu:1"));
	ck_assert_ptr_null(ts_device_set_find(set, ""));
	ck_assert_ptr_null(ts_device_set_find(set, NULL));
	if (nc == 0)
		ck_assert_ptr_null(ts_device_set_find(set, "cuda:0"));
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_names)
{
	enum ts_memory_kind k;

	ck_assert_str_eq(ts_memory_kind_name(TS_MEM_DEVICE), "device");
	ck_assert_str_eq(ts_memory_kind_name(TS_MEM_PINNED_HOST), "pinned_host");
	ck_assert_str_eq(ts_memory_kind_name(TS_MEM_UNPINNED_HOST), "unpinned_host");
	ck_assert_str_eq(ts_memory_kind_name(TS_MEM_KIND_COUNT), "unknown");
	for (int i = 0; i < TS_MEM_KIND_COUNT; i++) {
		ck_assert(ts_memory_kind_parse(ts_memory_kind_name((enum ts_memory_kind)i), &k));
		ck_assert_int_eq(k, i);
	}
	k = TS_MEM_UNPINNED_HOST;
	ck_assert(!ts_memory_kind_parse("Device", &k));
	ck_assert(!ts_memory_kind_parse("pinned", &k));
	ck_assert(!ts_memory_kind_parse("device ", &k));
	ck_assert(!ts_memory_kind_parse("", &k));
	ck_assert(!ts_memory_kind_parse(NULL, &k));
	ck_assert_int_eq(k, TS_MEM_UNPINNED_HOST);
	ck_assert_str_eq(ts_backend_name(TS_BACKEND_CUDA), "cuda");
	ck_assert_str_eq(ts_backend_name(TS_BACKEND_SIM), "sim");
	ck_assert_str_eq(ts_backend_name(TS_BACKEND_CPU), "cpu");
	ck_assert_str_eq(ts_backend_name(TS_BACKEND_COUNT), "unknown");
}
END_TEST

/* ---- memory -------------------------------------------------------------- */

START_TEST(test_sim_capacity)
{
	struct ts_device_set *set = make_set(2, 64 * MIB);
	struct ts_device *s0 = find(set, "sim:0"), *s1 = find(set, "sim:1");
	uint64_t free_b = 0, total_b = 0;
	struct ts_error err;
	void *a, *b = NULL, *c;

	a = xalloc(s0, TS_MEM_DEVICE, 48 * MIB);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_mem_info(s0, &free_b, &total_b, &err), TS_OK);
	ck_assert_uint_eq(free_b, 16 * MIB);
	ck_assert_uint_eq(total_b, 64 * MIB);

	ck_assert_int_eq(ts_device_mem_alloc(s0, TS_MEM_DEVICE, 32 * MIB, &b, &err),
	                 TS_RESOURCE_EXHAUSTED);
	ck_assert_ptr_null(b);
	ck_assert_str_eq(err.reason, "OUT_OF_MEMORY");
	ck_assert_msg(strstr(err.message, "sim:0/device") != NULL, "%s", err.message);
	ck_assert_msg(strstr(err.message, "33554432") != NULL, "%s", err.message);  /* asked */
	ck_assert_msg(strstr(err.message, "16777216") != NULL, "%s", err.message);  /* free */
	ck_assert_msg(strstr(err.message, "64.00 MiB") != NULL, "%s", err.message); /* limit */
	ck_assert_int_eq(err.nmeta, 5);
	ck_assert_str_eq(err.meta[0].key, "device");
	ck_assert_str_eq(err.meta[0].value, "sim:0");
	ck_assert_str_eq(err.meta[1].value, "device");
	ck_assert_str_eq(err.meta[2].value, "33554432");
	ck_assert_str_eq(err.meta[3].value, "16777216");
	ck_assert_str_eq(err.meta[4].value, "67108864");

	/* Other devices have their own capacity. */
	c = xalloc(s1, TS_MEM_DEVICE, 64 * MIB);
	ts_device_mem_free(s1, TS_MEM_DEVICE, c, 64 * MIB);

	/* The last byte fits exactly; one more does not. */
	c = xalloc(s0, TS_MEM_DEVICE, 16 * MIB);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_mem_alloc(s0, TS_MEM_DEVICE, 1, &b, &err),
	                 TS_RESOURCE_EXHAUSTED);
	ts_device_mem_free(s0, TS_MEM_DEVICE, c, 16 * MIB);

	/* Releasing restores the capacity. */
	ts_device_mem_free(s0, TS_MEM_DEVICE, a, 48 * MIB);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_mem_info(s0, &free_b, &total_b, &err), TS_OK);
	ck_assert_uint_eq(free_b, 64 * MIB);
	a = xalloc(s0, TS_MEM_DEVICE, 64 * MIB);
	memset(a, 0x5a, 4096);           /* the caller may touch it */
	ts_device_mem_free(s0, TS_MEM_DEVICE, a, 64 * MIB);

	/* Host kinds do not count against the device capacity. */
	a = xalloc(s0, TS_MEM_PINNED_HOST, 80 * MIB);
	b = xalloc(s0, TS_MEM_UNPINNED_HOST, 80 * MIB);
	memset(a, 1, 80 * MIB);
	memset(b, 2, 80 * MIB);
	ts_device_mem_free(s0, TS_MEM_PINNED_HOST, a, 80 * MIB);
	ts_device_mem_free(s0, TS_MEM_UNPINNED_HOST, b, 80 * MIB);

	/* Zero bytes is not an allocation. */
	ts_error_clear(&err);
	b = (void *)1;
	ck_assert_int_eq(ts_device_mem_alloc(s0, TS_MEM_DEVICE, 0, &b, &err),
	                 TS_INVALID_ARGUMENT);
	ck_assert_ptr_null(b);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_sim_capacity_larger_than_host)
{
	/* A sim device may be bigger than the host: memory is reserved, not
	 * committed, until the caller touches it. */
	struct ts_device_set *set;
	struct ts_device *s0;
	FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
	int mode = 0;
	void *p;

	if (f) {
		if (fscanf(f, "%d", &mode) != 1)
			mode = 0;
		fclose(f);
	}
	if (mode == 2)
		return;   /* strict accounting: MAP_NORESERVE has no effect */
	set = make_set(1, 128ULL << 30);
	s0 = find(set, "sim:0");
	p = xalloc(s0, TS_MEM_DEVICE, (size_t)(64ULL << 30));

	((unsigned char *)p)[0] = 1;
	((unsigned char *)p)[(64ULL << 30) - 1] = 2;
	ts_device_mem_free(s0, TS_MEM_DEVICE, p, (size_t)(64ULL << 30));
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_host_memory_refusal)
{
	struct ts_device_set *set = make_set(1, 16 * MIB);
	struct ts_device *cpu = find(set, "cpu:0");
	struct ts_error err;
	void *p = NULL;
	size_t huge = (size_t)1 << 62;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_mem_alloc(cpu, TS_MEM_DEVICE, huge, &p, &err),
	                 TS_RESOURCE_EXHAUSTED);
	ck_assert_ptr_null(p);
	ck_assert_msg(strstr(err.message, "cpu:0/device") != NULL, "%s", err.message);
	ck_assert_str_eq(err.reason, "OUT_OF_MEMORY");
	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_mem_alloc(find(set, "sim:0"), TS_MEM_UNPINNED_HOST,
	                                     huge, &p, &err),
	                 TS_RESOURCE_EXHAUSTED);
	ck_assert_msg(strstr(err.message, "sim:0/unpinned_host") != NULL, "%s", err.message);
	ts_device_set_free(set);
}
END_TEST

/* ---- copies -------------------------------------------------------------- */

START_TEST(test_sim_copies_exact)
{
	static const size_t sizes[] = {0, 1, 3, 4095, 4097, 65537, 5 * MIB + 7, 9 * MIB};
	struct ts_device_set *set = make_set(2, 64 * MIB);
	struct ts_device *s0 = find(set, "sim:0"), *s1 = find(set, "sim:1");
	struct ts_queue *q = xqueue(s0);
	struct ts_event *ev = xevent(s0);

	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		size_t n = sizes[i], a = n ? n : 1;
		unsigned char *src = xalloc(s0, TS_MEM_UNPINNED_HOST, a);
		unsigned char *d0 = xalloc(s0, TS_MEM_DEVICE, a);
		unsigned char *d0b = xalloc(s0, TS_MEM_DEVICE, a);
		unsigned char *d1 = xalloc(s1, TS_MEM_DEVICE, a);
		unsigned char *pin = xalloc(s0, TS_MEM_PINNED_HOST, a);
		unsigned char *h = xalloc(s0, TS_MEM_UNPINNED_HOST, a);

		fill(src, a, (unsigned)i + 1);
		memset(pin, 0xee, a);
		memset(h, 0xdd, a);
		xcopy(q, d0, src, n, TS_COPY_H2D);
		xcopy(q, d0b, d0, n, TS_COPY_D2D);       /* same device */
		xcopy(q, d1, d0b, n, TS_COPY_D2D);       /* peer */
		xcopy(q, pin, d1, n, TS_COPY_D2H);
		xcopy(q, h, pin, n, TS_COPY_H2H);
		xrecord(ev, q);
		xsync_event(ev);
		ck_assert(ts_event_done(ev));
		if (n) {
			ck_assert_msg(memcmp(h, src, n) == 0, "size %zu differs", n);
			ck_assert(memcmp(pin, src, n) == 0);
		} else {
			ck_assert_uint_eq(pin[0], 0xee);   /* nothing moved */
			ck_assert_uint_eq(h[0], 0xdd);
		}
		ts_device_mem_free(s0, TS_MEM_UNPINNED_HOST, src, a);
		ts_device_mem_free(s0, TS_MEM_DEVICE, d0, a);
		ts_device_mem_free(s0, TS_MEM_DEVICE, d0b, a);
		ts_device_mem_free(s1, TS_MEM_DEVICE, d1, a);
		ts_device_mem_free(s0, TS_MEM_PINNED_HOST, pin, a);
		ts_device_mem_free(s0, TS_MEM_UNPINNED_HOST, h, a);
	}
	ts_event_free(ev);
	ts_queue_free(q);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_cpu_copies)
{
	struct ts_device_set *set = make_set(0, 0);
	struct ts_device *cpu = find(set, "cpu:0");
	struct ts_queue *q = xqueue(cpu);
	struct ts_event *ev = xevent(cpu);
	size_t n = 3 * MIB + 1;
	unsigned char *src = xalloc(cpu, TS_MEM_PINNED_HOST, n);
	unsigned char *dev = xalloc(cpu, TS_MEM_DEVICE, n);
	unsigned char *dst = xalloc(cpu, TS_MEM_UNPINNED_HOST, n);
	uint64_t free_b = 0, total_b = 0;
	struct ts_error err;

	fill(src, n, 77);
	xcopy(q, dev, src, n, TS_COPY_H2D);
	xcopy(q, dst, dev, n, TS_COPY_D2H);
	xrecord(ev, q);
	xsync_event(ev);
	ck_assert(memcmp(dst, src, n) == 0);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_queue_sync(q, &err), TS_OK);
	ck_assert_int_eq(ts_device_mem_info(cpu, &free_b, &total_b, &err), TS_OK);
	ck_assert_uint_gt(total_b, 0);
	ck_assert_uint_le(free_b, total_b);
	ck_assert_ptr_eq(ts_queue_device(q), cpu);
	ts_device_mem_free(cpu, TS_MEM_PINNED_HOST, src, n);
	ts_device_mem_free(cpu, TS_MEM_DEVICE, dev, n);
	ts_device_mem_free(cpu, TS_MEM_UNPINNED_HOST, dst, n);
	ts_event_free(ev);
	ts_queue_free(q);
	ts_device_set_free(set);
}
END_TEST

/* ---- ordering ------------------------------------------------------------ */

struct order_log {
	pthread_mutex_t mu;
	int seen[16];
	int n;
	const volatile unsigned char *watch;   /* read by the host function */
};

struct order_arg {
	struct order_log *log;
	int tag;
};

static void order_fn(void *arg)
{
	struct order_arg *a = arg;

	pthread_mutex_lock(&a->log->mu);
	a->log->seen[a->log->n++] = a->tag < 0 ? *a->log->watch : a->tag;
	pthread_mutex_unlock(&a->log->mu);
}

START_TEST(test_queue_order)
{
	struct ts_device_set *set = make_set(1, 16 * MIB);
	struct ts_device *s0 = find(set, "sim:0");
	struct ts_queue *q = xqueue(s0);
	struct ts_event *ev = xevent(s0);
	unsigned char *vals = xalloc(s0, TS_MEM_UNPINNED_HOST, 256);
	unsigned char *cell = xalloc(s0, TS_MEM_DEVICE, 1);
	struct order_log log = {.n = 0};
	struct order_arg args[4] = {
		{&log, -1}, {&log, 101}, {&log, 102}, {&log, 103},
	};

	pthread_mutex_init(&log.mu, NULL);
	log.watch = cell;
	for (int i = 0; i < 256; i++)
		vals[i] = (unsigned char)i;
	/* 1000 one-byte copies into the same cell: the last one wins. */
	for (int i = 0; i < 1000; i++)
		xcopy(q, cell, &vals[(i * 7 + 3) % 256], 1, TS_COPY_H2D);
	ck_assert_int_eq(ts_queue_host_fn(q, order_fn, &args[0], NULL), TS_OK);
	for (int i = 1; i < 4; i++)
		ck_assert_int_eq(ts_queue_host_fn(q, order_fn, &args[i], NULL), TS_OK);
	xrecord(ev, q);
	xsync_event(ev);
	pthread_mutex_lock(&log.mu);
	ck_assert_int_eq(log.n, 4);
	ck_assert_int_eq(log.seen[0], (999 * 7 + 3) % 256);
	ck_assert_int_eq(log.seen[1], 101);
	ck_assert_int_eq(log.seen[2], 102);
	ck_assert_int_eq(log.seen[3], 103);
	pthread_mutex_unlock(&log.mu);
	pthread_mutex_destroy(&log.mu);
	ts_device_mem_free(s0, TS_MEM_UNPINNED_HOST, vals, 256);
	ts_device_mem_free(s0, TS_MEM_DEVICE, cell, 1);
	ts_event_free(ev);
	ts_queue_free(q);
	ts_device_set_free(set);
}
END_TEST

/* A host function that holds its queue until *release is set. */
static void hold_queue(void *arg)
{
	_Atomic int *release = arg;

	while (!atomic_load(release))
		usleep(200);
}

/* Bytes are counted per device and direction as copies are accepted; the
 * copies queued behind a held worker are the queue's depth until they run. */
START_TEST(test_copy_accounting)
{
	struct ts_device_set *set = make_set(1, 16 * MIB);
	struct ts_device *s0 = find(set, "sim:0");
	struct ts_queue *q = xqueue(s0);
	struct ts_event *ev = xevent(s0);
	unsigned char *h = xalloc(s0, TS_MEM_UNPINNED_HOST, 4096);
	unsigned char *d = xalloc(s0, TS_MEM_DEVICE, 4096);
	unsigned char *d2 = xalloc(s0, TS_MEM_DEVICE, 4096);
	_Atomic int release = 0;
	uint64_t depth = 99;

	memset(h, 1, 4096);
	ck_assert(ts_device_copies_queued(s0, &depth));
	ck_assert_uint_eq(depth, 0);
	ck_assert_int_eq(ts_queue_host_fn(q, hold_queue, &release, NULL), TS_OK);
	xcopy(q, d, h, 4096, TS_COPY_H2D);
	xcopy(q, d2, d, 1000, TS_COPY_D2D);
	xcopy(q, h, d2, 10, TS_COPY_D2H);
	xcopy(q, h, h, 0, TS_COPY_H2H);          /* nothing: not counted */
	ck_assert(ts_device_copies_queued(s0, &depth));
	ck_assert_uint_eq(depth, 3);
	ck_assert_uint_eq(ts_device_copied_bytes(s0, TS_COPY_H2D), 4096);
	ck_assert_uint_eq(ts_device_copied_bytes(s0, TS_COPY_D2D), 1000);
	ck_assert_uint_eq(ts_device_copied_bytes(s0, TS_COPY_D2H), 10);
	ck_assert_uint_eq(ts_device_copied_bytes(s0, TS_COPY_H2H), 0);
	ck_assert_uint_eq(ts_device_copied_bytes(s0, (enum ts_copy_kind)9), 0);
	atomic_store(&release, 1);
	xrecord(ev, q);
	xsync_event(ev);
	ck_assert(ts_device_copies_queued(s0, &depth));
	ck_assert_uint_eq(depth, 0);
	ck_assert_uint_eq(ts_device_copies(s0), 3);
	ts_device_mem_free(s0, TS_MEM_UNPINNED_HOST, h, 4096);
	ts_device_mem_free(s0, TS_MEM_DEVICE, d, 4096);
	ts_device_mem_free(s0, TS_MEM_DEVICE, d2, 4096);
	ts_event_free(ev);
	ts_queue_free(q);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_events_across_queues)
{
	struct ts_device_set *set = make_set(2, 64 * MIB);
	struct ts_device *s0 = find(set, "sim:0"), *s1 = find(set, "sim:1");
	struct ts_device *cpu = find(set, "cpu:0");
	struct ts_queue *q0 = xqueue(s0), *q1 = xqueue(s1), *qc = xqueue(cpu);
	struct ts_event *e0 = xevent(s0), *e1 = xevent(s1), *ec = xevent(cpu);
	size_t n = 2 * MIB + 5;
	unsigned char *src = xalloc(s0, TS_MEM_PINNED_HOST, n);
	unsigned char *a = xalloc(s0, TS_MEM_DEVICE, n);
	unsigned char *b = xalloc(s1, TS_MEM_DEVICE, n);
	unsigned char *c = xalloc(cpu, TS_MEM_DEVICE, n);
	struct gate g;
	struct ts_error err;

	gate_init(&g);
	fill(src, n, 5);
	memset(b, 0, n);
	memset(c, 0, n);
	/* q0 is held by the gate; q1 must wait for e0 before copying a -> b,
	 * and the cpu queue for e1 before copying b -> c. */
	ck_assert_int_eq(ts_queue_host_fn(q0, gate_fn, &g, NULL), TS_OK);
	xcopy(q0, a, src, n, TS_COPY_H2D);
	xrecord(e0, q0);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_queue_wait_event(q1, e0, &err), TS_OK);
	xcopy(q1, b, a, n, TS_COPY_D2D);
	xrecord(e1, q1);
	ck_assert_int_eq(ts_queue_wait_event(qc, e1, &err), TS_OK);
	xcopy(qc, c, b, n, TS_COPY_D2D);
	xrecord(ec, qc);

	gate_wait_entered(&g);
	sleep_ms(20);
	ck_assert(!ts_event_done(e0));
	ck_assert(!ts_event_done(e1));
	ck_assert(!ts_event_done(ec));
	ck_assert_uint_eq(b[0], 0);
	ck_assert_uint_eq(c[n - 1], 0);
	gate_open(&g);
	xsync_event(ec);
	ck_assert(ts_event_done(e0) && ts_event_done(e1) && ts_event_done(ec));
	ck_assert(memcmp(c, src, n) == 0);
	ck_assert(memcmp(b, src, n) == 0);

	/* An event never recorded is complete; waiting on it is a no-op. */
	{
		struct ts_event *never = xevent(s0);

		ck_assert(ts_event_done(never));
		xsync_event(never);
		ck_assert_int_eq(ts_queue_wait_event(q1, never, &err), TS_OK);
		ck_assert_int_eq(ts_queue_sync(q1, &err), TS_OK);
		ts_event_free(never);
	}
	/* An event belongs to one device's queues. */
	ts_error_clear(&err);
	ck_assert_int_eq(ts_event_record(e0, q1, &err), TS_INVALID_ARGUMENT);

	gate_destroy(&g);
	ts_device_mem_free(s0, TS_MEM_PINNED_HOST, src, n);
	ts_device_mem_free(s0, TS_MEM_DEVICE, a, n);
	ts_device_mem_free(s1, TS_MEM_DEVICE, b, n);
	ts_device_mem_free(cpu, TS_MEM_DEVICE, c, n);
	ts_event_free(e0);
	ts_event_free(e1);
	ts_event_free(ec);
	ts_queue_free(q0);
	ts_queue_free(q1);
	ts_queue_free(qc);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_sync_functions)
{
	struct ts_device_set *set = make_set(1, 16 * MIB);
	struct ts_device *s0 = find(set, "sim:0");
	struct ts_queue *q = xqueue(s0), *q2 = xqueue(s0);
	struct ts_event *ev = xevent(s0);
	atomic_int flag1 = 0, flag2 = 0, flag3 = 0;
	struct ts_error err;
	struct gate g;

	/* ts_queue_sync waits for everything submitted before it. */
	ck_assert_int_eq(ts_queue_host_fn(q, sleep_fn, (void *)(intptr_t)30, NULL), TS_OK);
	ck_assert_int_eq(ts_queue_host_fn(q, set_flag_fn, &flag1, NULL), TS_OK);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_queue_sync(q, &err), TS_OK);
	ck_assert_int_eq(atomic_load(&flag1), 1);

	/* ts_event_sync waits for the work before the record only. */
	ck_assert_int_eq(ts_queue_host_fn(q, sleep_fn, (void *)(intptr_t)30, NULL), TS_OK);
	ck_assert_int_eq(ts_queue_host_fn(q, set_flag_fn, &flag2, NULL), TS_OK);
	xrecord(ev, q);
	xsync_event(ev);
	ck_assert_int_eq(atomic_load(&flag2), 1);

	/* Re-recording: the event follows its latest record. */
	gate_init(&g);
	ck_assert_int_eq(ts_queue_host_fn(q, gate_fn, &g, NULL), TS_OK);
	xrecord(ev, q);
	gate_wait_entered(&g);
	ck_assert(!ts_event_done(ev));
	gate_open(&g);
	xsync_event(ev);
	ck_assert(ts_event_done(ev));
	gate_destroy(&g);

	/* ts_device_sync waits for every queue of the device. */
	ck_assert_int_eq(ts_queue_host_fn(q2, sleep_fn, (void *)(intptr_t)40, NULL), TS_OK);
	ck_assert_int_eq(ts_queue_host_fn(q2, set_flag_fn, &flag3, NULL), TS_OK);
	ck_assert_int_eq(ts_device_sync(s0, &err), TS_OK);
	ck_assert_int_eq(atomic_load(&flag3), 1);

	ts_event_free(ev);
	ts_queue_free(q);
	ts_queue_free(q2);
	ts_device_set_free(set);
}
END_TEST

/* ---- failures ------------------------------------------------------------ */

START_TEST(test_injected_copy_failure)
{
	struct ts_device_set *set = make_set(2, 16 * MIB);
	struct ts_device *s0 = find(set, "sim:0"), *s1 = find(set, "sim:1");
	struct ts_queue *q = xqueue(s0);
	struct ts_event *e1 = xevent(s0), *e2 = xevent(s0), *e3 = xevent(s0);
	size_t n = 4096;
	unsigned char *src = xalloc(s0, TS_MEM_UNPINNED_HOST, n);
	unsigned char *x = xalloc(s0, TS_MEM_DEVICE, n);
	unsigned char *y = xalloc(s0, TS_MEM_DEVICE, n);
	unsigned char *z = xalloc(s0, TS_MEM_DEVICE, n);
	struct ts_error err;

	fill(src, n, 9);
	memset(x, 0, n);
	memset(y, 0, n);
	memset(z, 0, n);

	ts__sim_inject_copy_failure(s0, 1);
	ts__sim_inject_copy_failure(find(set, "cpu:0"), 5);   /* no-op elsewhere */
	xcopy(q, x, src, n, TS_COPY_H2D);     /* fails */
	xcopy(q, y, src, n, TS_COPY_H2D);     /* runs */
	xrecord(e1, q);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_event_sync(e1, &err), TS_INTERNAL);
	ck_assert_str_eq(err.reason, "COPY_FAILED");
	ck_assert_msg(strstr(err.message, "sim:0") && strstr(err.message, "injected") &&
	              strstr(err.message, "4096") && strstr(err.message, "H2D"),
	              "%s", err.message);
	ck_assert(ts_event_done(e1));
	ck_assert_uint_eq(x[0], 0);            /* the failed copy wrote nothing */
	ck_assert(memcmp(y, src, n) == 0);

	/* Sticky: later events report it too, however late they come, and the
	 * work keeps running. */
	xcopy(q, z, src, n, TS_COPY_H2D);
	xrecord(e2, q);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_event_sync(e2, &err), TS_INTERNAL);
	ck_assert_str_eq(err.reason, "COPY_FAILED");
	ck_assert(memcmp(z, src, n) == 0);

	/* The sync reports it and clears it: the queue recovers. */
	ts_error_clear(&err);
	ck_assert_int_eq(ts_queue_sync(q, &err), TS_INTERNAL);
	ck_assert_str_eq(err.reason, "COPY_FAILED");
	ts_error_clear(&err);
	ck_assert_int_eq(ts_queue_sync(q, &err), TS_OK);
	/* e1 keeps its outcome until recorded again. */
	ts_error_clear(&err);
	ck_assert_int_eq(ts_event_sync(e1, &err), TS_INTERNAL);
	memset(x, 0, n);
	xcopy(q, x, src, n, TS_COPY_H2D);
	xrecord(e1, q);
	xrecord(e3, q);
	xsync_event(e3);
	xsync_event(e1);
	ck_assert(memcmp(x, src, n) == 0);

	/* A first error already in err is kept. */
	ts__sim_inject_copy_failure(s0, 1);
	xcopy(q, x, src, n, TS_COPY_H2D);
	xrecord(e1, q);
	ts_error_clear(&err);
	ts_error_set(&err, TS_ABORTED, "EARLIER", "earlier failure");
	ck_assert_int_eq(ts_event_sync(e1, &err), TS_ABORTED);
	ck_assert_str_eq(err.reason, "EARLIER");
	ck_assert_int_eq(ts_queue_sync(q, NULL), TS_INTERNAL);
	ck_assert_int_eq(ts_queue_sync(q, NULL), TS_OK);

	/* A failure passes along an event another queue waited on. */
	{
		struct ts_queue *q1 = xqueue(s1);
		struct ts_event *f1 = xevent(s1);

		ts__sim_inject_copy_failure(s0, 1);
		xcopy(q, x, src, n, TS_COPY_H2D);
		xrecord(e1, q);
		ts_error_clear(&err);
		ck_assert_int_eq(ts_queue_wait_event(q1, e1, &err), TS_OK);
		xrecord(f1, q1);
		ts_error_clear(&err);
		ck_assert_int_eq(ts_event_sync(f1, &err), TS_INTERNAL);
		ck_assert_str_eq(err.reason, "COPY_FAILED");
		ck_assert_int_eq(ts_queue_sync(q1, NULL), TS_INTERNAL);
		ck_assert_int_eq(ts_queue_sync(q, NULL), TS_INTERNAL);
		xrecord(f1, q1);
		xsync_event(f1);
		ts_event_free(f1);
		ts_queue_free(q1);
	}
	/* Cancelling what is left of an injection. */
	ts__sim_inject_copy_failure(s0, 3);
	ts__sim_inject_copy_failure(s0, 0);
	xcopy(q, x, src, n, TS_COPY_H2D);
	xrecord(e1, q);
	xsync_event(e1);
	ck_assert(memcmp(x, src, n) == 0);

	ts_device_mem_free(s0, TS_MEM_UNPINNED_HOST, src, n);
	ts_device_mem_free(s0, TS_MEM_DEVICE, x, n);
	ts_device_mem_free(s0, TS_MEM_DEVICE, y, n);
	ts_device_mem_free(s0, TS_MEM_DEVICE, z, n);
	ts_event_free(e1);
	ts_event_free(e2);
	ts_event_free(e3);
	ts_queue_free(q);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_bad_arguments)
{
	struct ts_device_set *set = make_set(1, 16 * MIB);
	struct ts_device *s0 = find(set, "sim:0");
	struct ts_queue *q = xqueue(s0);
	struct ts_error err;
	unsigned char buf[4];

	ts_error_clear(&err);
	ck_assert_int_eq(ts_queue_copy(q, NULL, buf, 4, TS_COPY_H2H, &err),
	                 TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_queue_copy(q, buf, buf + 2, 2, (enum ts_copy_kind)9, &err),
	                 TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_queue_host_fn(q, NULL, NULL, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_queue_copy(q, NULL, NULL, 0, TS_COPY_H2H, &err), TS_OK);
	ck_assert_int_eq(ts_queue_sync(q, &err), TS_OK);
	ts_queue_free(q);
	ts_device_set_free(set);
}
END_TEST

/* ---- lifetimes ----------------------------------------------------------- */

START_TEST(test_free_queue_waits)
{
	struct ts_device_set *set = make_set(1, 16 * MIB);
	struct ts_device *s0 = find(set, "sim:0");
	struct ts_queue *q = xqueue(s0);
	struct ts_event *ev = xevent(s0);
	atomic_int flag = 0;
	size_t n = 8 * MIB;
	unsigned char *src = xalloc(s0, TS_MEM_UNPINNED_HOST, n);
	unsigned char *dst = xalloc(s0, TS_MEM_DEVICE, n);

	fill(src, n, 3);
	ck_assert_int_eq(ts_queue_host_fn(q, sleep_fn, (void *)(intptr_t)50, NULL), TS_OK);
	xcopy(q, dst, src, n, TS_COPY_H2D);
	xrecord(ev, q);
	ck_assert_int_eq(ts_queue_host_fn(q, set_flag_fn, &flag, NULL), TS_OK);
	ts_queue_free(q);
	ck_assert_int_eq(atomic_load(&flag), 1);
	ck_assert(ts_event_done(ev));
	ck_assert(memcmp(dst, src, n) == 0);

	/* Freeing an event whose record is still queued waits for it. */
	q = xqueue(s0);
	ck_assert_int_eq(ts_queue_host_fn(q, sleep_fn, (void *)(intptr_t)30, NULL), TS_OK);
	xrecord(ev, q);
	ts_event_free(ev);

	/* A queue left behind is freed (after its work) with the set. */
	ck_assert_int_eq(ts_queue_host_fn(q, sleep_fn, (void *)(intptr_t)20, NULL), TS_OK);
	ts_device_mem_free(s0, TS_MEM_UNPINNED_HOST, src, n);
	ts_device_mem_free(s0, TS_MEM_DEVICE, dst, n);
	ts_device_set_free(set);
}
END_TEST

/* ---- concurrency --------------------------------------------------------- */

struct worker_arg {
	struct ts_device *dev;
	struct ts_queue *shared;     /* a queue shared with other threads */
	unsigned seed;
	int failures;
};

/* Submits many copies of varied sizes through its own queue and through the
 * shared one, and checks every byte. */
static void *submit_thread(void *arg)
{
	struct worker_arg *w = arg;
	struct ts_queue *q = NULL;
	struct ts_event *ev = NULL, *evs = NULL;
	struct ts_error err;
	enum { ROUNDS = 40, SLOTS = 8 };
	size_t n = 64 * 1024 + w->seed;
	unsigned char *src, *dev, *back;

	void *p1 = NULL, *p2 = NULL, *p3 = NULL;

	ts_error_clear(&err);
	if (ts_queue_new(w->dev, &q, &err) != TS_OK ||
	    ts_event_new(w->dev, &ev, &err) != TS_OK ||
	    ts_event_new(ts_queue_device(w->shared), &evs, &err) != TS_OK ||
	    ts_device_mem_alloc(w->dev, TS_MEM_PINNED_HOST, n * SLOTS, &p1, &err) ||
	    ts_device_mem_alloc(w->dev, TS_MEM_DEVICE, n * SLOTS, &p2, &err) ||
	    ts_device_mem_alloc(w->dev, TS_MEM_UNPINNED_HOST, n * SLOTS, &p3, &err)) {
		w->failures++;
		return NULL;
	}
	src = p1;
	dev = p2;
	back = p3;
	for (int r = 0; r < ROUNDS; r++) {
		struct ts_queue *use = (r % 2) ? w->shared : q;
		struct ts_event *e = (r % 2) ? evs : ev;

		fill(src, n * SLOTS, w->seed * 1000 + (unsigned)r);
		memset(back, 0, n * SLOTS);
		for (int s = 0; s < SLOTS; s++) {
			size_t len = n - (size_t)s * 17;

			if (ts_queue_copy(use, dev + s * n, src + s * n, len, TS_COPY_H2D, &err) ||
			    ts_queue_copy(use, back + s * n, dev + s * n, len, TS_COPY_D2H, &err))
				w->failures++;
		}
		if (ts_event_record(e, use, &err) || ts_event_sync(e, &err))
			w->failures++;
		for (int s = 0; s < SLOTS; s++) {
			size_t len = n - (size_t)s * 17;

			if (memcmp(back + s * n, src + s * n, len) != 0)
				w->failures++;
		}
	}
	ts_device_mem_free(w->dev, TS_MEM_PINNED_HOST, src, n * SLOTS);
	ts_device_mem_free(w->dev, TS_MEM_DEVICE, dev, n * SLOTS);
	ts_device_mem_free(w->dev, TS_MEM_UNPINNED_HOST, back, n * SLOTS);
	ts_event_free(ev);
	ts_event_free(evs);
	ts_queue_free(q);
	return NULL;
}

START_TEST(test_concurrent_submission)
{
	enum { THREADS = 8 };
	struct ts_device_set *set = make_set(3, 256 * MIB);
	struct ts_device *devs[4] = {
		find(set, "sim:0"), find(set, "sim:1"), find(set, "sim:2"),
		find(set, "cpu:0"),
	};
	struct ts_queue *shared[4];
	struct worker_arg args[THREADS];
	pthread_t th[THREADS];

	for (int i = 0; i < 4; i++)
		shared[i] = xqueue(devs[i]);
	for (int i = 0; i < THREADS; i++) {
		args[i] = (struct worker_arg){
			.dev = devs[i % 4], .shared = shared[i % 4],
			.seed = (unsigned)i + 1, .failures = 0,
		};
		ck_assert_int_eq(pthread_create(&th[i], NULL, submit_thread, &args[i]), 0);
	}
	for (int i = 0; i < THREADS; i++) {
		pthread_join(th[i], NULL);
		ck_assert_int_eq(args[i].failures, 0);
	}
	for (int i = 0; i < 4; i++) {
		uint64_t free_b = 0, total_b = 0;

		ts_queue_free(shared[i]);
		if (i < 3) {
			ck_assert_int_eq(ts_device_mem_info(devs[i], &free_b, &total_b, NULL), TS_OK);
			ck_assert_uint_eq(free_b, total_b);   /* every byte back */
		}
	}
	ts_device_set_free(set);
}
END_TEST

/* Many threads record and wait on shared events between two queues. */
struct pingpong {
	struct ts_queue *qa, *qb;
	struct ts_event *ea, *eb;
	atomic_int counter;
	int failures;
};

static void count_fn(void *arg)
{
	atomic_fetch_add((atomic_int *)arg, 1);
}

static void *pingpong_thread(void *arg)
{
	struct pingpong *p = arg;
	struct ts_error err;

	ts_error_clear(&err);
	for (int i = 0; i < 200; i++) {
		if (ts_queue_host_fn(p->qa, count_fn, &p->counter, &err) ||
		    ts_event_record(p->ea, p->qa, &err) ||
		    ts_queue_wait_event(p->qb, p->ea, &err) ||
		    ts_queue_host_fn(p->qb, count_fn, &p->counter, &err) ||
		    ts_event_record(p->eb, p->qb, &err) ||
		    ts_queue_wait_event(p->qa, p->eb, &err))
			p->failures++;
		if ((i % 50) == 0 && ts_event_sync(p->eb, &err))
			p->failures++;
		(void)ts_event_done(p->ea);
	}
	return NULL;
}

START_TEST(test_concurrent_events)
{
	struct ts_device_set *set = make_set(1, 16 * MIB);
	struct ts_device *s0 = find(set, "sim:0");
	struct pingpong p = {.failures = 0};
	pthread_t th[4];
	struct ts_error err;

	p.qa = xqueue(s0);
	p.qb = xqueue(s0);
	p.ea = xevent(s0);
	p.eb = xevent(s0);
	atomic_init(&p.counter, 0);
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, pingpong_thread, &p), 0);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	ck_assert_int_eq(p.failures, 0);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_sync(s0, &err), TS_OK);
	ck_assert_int_eq(atomic_load(&p.counter), 4 * 200 * 2);
	ts_event_free(p.ea);
	ts_event_free(p.eb);
	ts_queue_free(p.qa);
	ts_queue_free(p.qb);
	ts_device_set_free(set);
}
END_TEST

/* A sticky error on the first GPU leaves pinned memory to every other
 * device: it is pinned in a healthy GPU's context. */
START_TEST(test_pinned_outlives_a_broken_gpu)
{
	void (*fault)(int, const char *) =
		(void (*)(int, const char *))dlsym(RTLD_DEFAULT, "fakecuda_fault");
	struct ts_device_set *set = make_set(1, 64 * MIB);
	struct ts_device *g0, *g1, *sim, *cpu;
	struct ts_queue *q;
	struct ts_event *ev;
	unsigned char *before, *after, *back;
	void *dmem;
	uint64_t copies;
	struct ts_error err;

	if (!fault || cuda_count(set) < 2) {
		ts_device_set_free(set);
		return;            /* needs the stand-in with two GPUs */
	}
	g0 = find(set, "cuda:0");
	g1 = find(set, "cuda:1");
	sim = find(set, "sim:0");
	cpu = find(set, "cpu:0");
	before = xalloc(cpu, TS_MEM_PINNED_HOST, MIB);
	fault(0, "test: sticky error on cuda:0");
	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_sync(g0, &err), TS_UNAVAILABLE);
	ck_assert(ts_device_broken(g0));
	/* pinned memory for every other device still comes */
	after = xalloc(sim, TS_MEM_PINNED_HOST, MIB);
	back = xalloc(g1, TS_MEM_PINNED_HOST, MIB);
	ts_device_mem_free(cpu, TS_MEM_PINNED_HOST, xalloc(cpu, TS_MEM_PINNED_HOST, MIB), MIB);
	/* ... and the healthy GPU copies through it, old and new alike */
	dmem = xalloc(g1, TS_MEM_DEVICE, MIB);
	for (size_t i = 0; i < MIB; i++)
		before[i] = (unsigned char)(i * 7 + 1);
	q = xqueue(g1);
	ev = xevent(g1);
	copies = ts_device_copies(g1);
	ck_assert_int_eq(ts_queue_copy(q, dmem, before, MIB, TS_COPY_H2D, &err), TS_OK);
	ck_assert_int_eq(ts_queue_copy(q, back, dmem, MIB, TS_COPY_D2H, &err), TS_OK);
	ck_assert_int_eq(ts_event_record(ev, q, &err), TS_OK);
	ck_assert_int_eq(ts_event_sync(ev, &err), TS_OK);
	ck_assert_uint_eq(ts_device_copies(g1) - copies, 2);
	ck_assert(memcmp(back, before, MIB) == 0);
	/* the broken GPU's own requests are refused, naming it */
	{
		void *p = NULL;

		ts_error_clear(&err);
		ck_assert_int_eq(ts_device_mem_alloc(g0, TS_MEM_PINNED_HOST, MIB, &p, &err),
		                 TS_UNAVAILABLE);
		ck_assert_ptr_nonnull(strstr(err.message, "cuda:0"));
	}
	ts_event_free(ev);
	ts_queue_free(q);
	ts_device_mem_free(g1, TS_MEM_DEVICE, dmem, MIB);
	ts_device_mem_free(cpu, TS_MEM_PINNED_HOST, before, MIB);
	ts_device_mem_free(sim, TS_MEM_PINNED_HOST, after, MIB);
	ts_device_mem_free(g1, TS_MEM_PINNED_HOST, back, MIB);
	/* with every GPU broken, pinned memory is refused, not taken from a
	 * broken context */
	fault(1, "test: sticky error on cuda:1");
	ck_assert_int_eq(ts_device_sync(g1, &err), TS_UNAVAILABLE);
	{
		void *p = NULL;

		ts_error_clear(&err);
		ck_assert_int_eq(ts_device_mem_alloc(sim, TS_MEM_PINNED_HOST, MIB, &p, &err),
		                 TS_UNAVAILABLE);
		ck_assert_ptr_null(p);
		ck_assert_ptr_nonnull(strstr(err.message, "sim:0/pinned_host"));
	}
	ts_device_set_free(set);
}
END_TEST

/* Shareable host pages of 2 MiB or more start on a 2 MiB boundary (so that
 * where the node gives shared memory huge pages, they are 2 MiB ones here
 * and in a lease's mapping); any size still maps exactly, and shares at
 * the offset it has. */
START_TEST(test_shared_pages_huge_aligned)
{
	struct ts_device_set *set = make_set(1, 64 * MIB);
	struct ts_device *cpu = find(set, "cpu:0");
	const size_t sizes[] = {64 * 1024, 2 * MIB, 6 * MIB + 12 * 1024};
	char mode[32];
	bool huge = ts_host_shmem_huge(mode, sizeof mode);

	ck_assert(!strcmp(mode, "always") || !strcmp(mode, "within_size") ||
	          !strcmp(mode, "advise") || !strcmp(mode, "never") || !strcmp(mode, "deny") ||
	          !strcmp(mode, "force") || !strcmp(mode, "unknown"));
	for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
		size_t n = sizes[k];
		unsigned char *p = NULL, *m;
		uint64_t off = 1;
		struct ts_error err;
		int fd;

		ts_error_clear(&err);
		ck_assert_int_eq(ts__host_pages_alloc(cpu, TS_MEM_PINNED_HOST, n, false, (void **)&p,
		                                      &err), TS_OK);
		if (n >= TS_HUGE_PAGE)
			ck_assert_uint_eq((uintptr_t)p % TS_HUGE_PAGE, 0);
		for (size_t i = 0; i < n; i += 4096)
			p[i] = (unsigned char)(i / 4096 + k);
		p[n - 1] = 0xa5;
		/* the last page and the one past a huge page are the mapping's */
		fd = ts_host_mem_share(cpu, p + n - 1, 1, &off);
		ck_assert_int_ge(fd, 0);
		ck_assert_uint_eq(off, n - 1);
		m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
		ck_assert_ptr_ne(m, MAP_FAILED);
		ck_assert_int_eq(memcmp(m, p, n), 0);
		munmap(m, n);
		close(fd);
		if (huge && n >= 4 * MIB)
			ck_assert_msg(ts_pmd_mapped_kib(p) > 0, "shmem_enabled is %s, yet no 2 MiB page is mapped",
			              mode);
		ts__host_pages_free(cpu, p, n);
	}
	ts_device_set_free(set);
}
END_TEST

/* A fresh shareable mapping filled through its file (ts_host_mem_fill) holds
 * the bytes, at any offset; once shared, the file is sealed: a fill then
 * writes through the daemon's mapping alone, and a reopened descriptor
 * writes nothing. Memory that is no memfd is filled by memcpy. */
START_TEST(test_host_mem_fill)
{
	struct ts_device_set *set = make_set(1, 64 * MIB);
	struct ts_device *cpu = find(set, "cpu:0");
	size_t n = 3 * MIB + 4096;
	unsigned char *p = NULL, *src = malloc(n), *m, anon[64];
	struct ts_error err;
	uint64_t off = 1;
	char path[64];
	int fd, rw;

	ck_assert_ptr_nonnull(src);
	for (size_t i = 0; i < n; i++)
		src[i] = (unsigned char)(i * 7 + i / 4096);
	ts_error_clear(&err);
	ck_assert_int_eq(ts__host_pages_alloc(cpu, TS_MEM_UNPINNED_HOST, n, false, (void **)&p, &err),
	                 TS_OK);
	ts_host_mem_fill(cpu, p, src, 4096);
	ts_host_mem_fill(cpu, p + 4096, src + 4096, n - 4096);
	ck_assert_int_eq(memcmp(p, src, n), 0);
	fd = ts_host_mem_share(cpu, p, n, &off);
	ck_assert_int_ge(fd, 0);
	ck_assert_uint_eq(off, 0);
	m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(m, MAP_FAILED);
	ck_assert_int_eq(memcmp(m, src, n), 0);
	/* shared: sealed against every writer but the daemon's mapping */
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	rw = open(path, O_RDWR);
	if (rw >= 0) {
		ck_assert_int_lt(pwrite(rw, "x", 1, 0), 0);
		ck_assert_int_eq(errno, EPERM);
		close(rw);
	}
	ts_host_mem_fill(cpu, p + 100, "abc", 3);
	ck_assert_int_eq(memcmp(m + 100, "abc", 3), 0);
	munmap(m, n);
	close(fd);
	ts__host_pages_free(cpu, p, n);
	ts_host_mem_fill(cpu, anon, src, sizeof anon);    /* no memfd: memcpy */
	ck_assert_int_eq(memcmp(anon, src, sizeof anon), 0);
	free(src);
	ts_device_set_free(set);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("device");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_discovery_order);
	tcase_add_test(tc, test_shared_pages_huge_aligned);
	tcase_add_test(tc, test_host_mem_fill);
	tcase_add_test(tc, test_default_backend);
	tcase_add_test(tc, test_cuda_backend_info);
	tcase_add_test(tc, test_sim_default_count_and_host);
	tcase_add_test(tc, test_find);
	tcase_add_test(tc, test_names);
	tcase_add_test(tc, test_sim_capacity);
	tcase_add_test(tc, test_sim_capacity_larger_than_host);
	tcase_add_test(tc, test_host_memory_refusal);
	tcase_add_test(tc, test_sim_copies_exact);
	tcase_add_test(tc, test_cpu_copies);
	tcase_add_test(tc, test_queue_order);
	tcase_add_test(tc, test_copy_accounting);
	tcase_add_test(tc, test_events_across_queues);
	tcase_add_test(tc, test_sync_functions);
	tcase_add_test(tc, test_injected_copy_failure);
	tcase_add_test(tc, test_bad_arguments);
	tcase_add_test(tc, test_free_queue_waits);
	tcase_add_test(tc, test_concurrent_submission);
	tcase_add_test(tc, test_concurrent_events);
	tcase_add_test(tc, test_pinned_outlives_a_broken_gpu);
	suite_add_tcase(s, tc);
	return s;
}
