/*
 * test_lease.c - the lease service's answer for a device array on a GPU
 * (server/lease.h): a CUDA IPC handle's text round trip (through the
 * service's decoder and the wire client's, tests/integration/lease_wire.h),
 * and the shard built from a pool chunk and a buffer in it - the chunk
 * lookup of a real device pool (a sim device's region stands for a GPU's
 * cudaMalloc), the offset of the buffer in it, the GPU's identity, and the
 * refusal of bytes outside the chunk; the wire client's kept mappings; and
 * the cutting of a pipelined byte stream into frames (lease_proto.h), in
 * order, whatever pieces it arrives in.
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "memory/buffer.h"
#include "memory/space.h"
#include "server/lease.h"
#include "server/lease_proto.h"
#include "tests/integration/lease_wire.h"
#include "tests/unit/unit.h"

static void some_handle(struct ts_ipc_handle *h, unsigned seed)
{
	for (int i = 0; i < TS_IPC_HANDLE_BYTES; i++)
		h->bytes[i] = (unsigned char)(i * 37u + seed * 101u);
}

START_TEST(test_handle_text_round_trip)
{
	char hex[TS_LEASE_IPC_HEX + 1];
	struct ts_ipc_handle h, back;
	unsigned char wire[64];
	json_t *shard;

	/* every byte value passes, in both decoders */
	for (unsigned seed = 0; seed < 256; seed++) {
		some_handle(&h, seed);
		h.bytes[seed % TS_IPC_HANDLE_BYTES] = (unsigned char)seed;
		ts_lease_ipc_hex(&h, hex);
		ck_assert_uint_eq(strlen(hex), TS_LEASE_IPC_HEX);
		ck_assert_uint_eq(strspn(hex, "0123456789abcdef"), TS_LEASE_IPC_HEX);
		memset(&back, 0, sizeof back);
		ck_assert(ts_lease_ipc_unhex(hex, &back));
		ck_assert_int_eq(memcmp(back.bytes, h.bytes, TS_IPC_HANDLE_BYTES), 0);
		shard = json_pack("{s:{s:s}}", "cuda_ipc", "handle", hex);
		ck_assert_int_eq(lw_ipc_handle(shard, wire), 0);
		ck_assert_int_eq(memcmp(wire, h.bytes, 64), 0);
		json_decref(shard);
	}
	memset(&h, 0xff, sizeof h);
	ts_lease_ipc_hex(&h, hex);
	ck_assert_str_eq(hex + TS_LEASE_IPC_HEX - 4, "ffff");
	/* upper case is read too */
	for (char *c = hex; *c; c++)
		*c = *c == 'f' ? 'F' : *c;
	ck_assert(ts_lease_ipc_unhex(hex, &back));
	ck_assert_int_eq(back.bytes[63], 0xff);
}
END_TEST

START_TEST(test_handle_text_refused)
{
	char hex[TS_LEASE_IPC_HEX + 2];
	struct ts_ipc_handle h;
	unsigned char wire[64];
	json_t *shard;

	some_handle(&h, 3);
	ts_lease_ipc_hex(&h, hex);
	hex[TS_LEASE_IPC_HEX - 1] = '\0';                  /* one digit short */
	ck_assert(!ts_lease_ipc_unhex(hex, &h));
	ts_lease_ipc_hex(&h, hex);
	strcat(hex, "0");                                  /* one too many */
	ck_assert(!ts_lease_ipc_unhex(hex, &h));
	ts_lease_ipc_hex(&h, hex);
	hex[17] = 'g';                                     /* no hex digit */
	ck_assert(!ts_lease_ipc_unhex(hex, &h));
	shard = json_pack("{s:{s:s}}", "cuda_ipc", "handle", hex);
	ck_assert_int_eq(lw_ipc_handle(shard, wire), -1);
	json_decref(shard);
	ck_assert(!ts_lease_ipc_unhex("", &h));
	ck_assert(!ts_lease_ipc_unhex(NULL, &h));
	shard = json_pack("{s:s}", "transport", "fd");     /* an "fd" shard has none */
	ck_assert_int_eq(lw_ipc_handle(shard, wire), -1);
	json_decref(shard);
}
END_TEST

static const struct ts_device_props gpu = {
	.id = "cuda:1", .backend = TS_BACKEND_CUDA, .ordinal = 1,
	.pci_bus_id = "0000:3B:00.0", .uuid = "GPU-8f6e0a1b-2c3d-4e5f-6071-8293a4b5c6d7",
};

START_TEST(test_shard_from_pool_chunk)
{
	struct ts_device_config dc = {.sim_devices = 1, .sim_device_memory = 16ull << 20};
	struct ts_memory_config mc = {.device_memory_fraction = 1.0, .pinned_host_limit = 4ull << 20,
	                              .unpinned_host_limit = 4ull << 20};
	struct ts_device_set *set;
	struct ts_memory *mem;
	struct ts_space *sp;
	struct ts_buffer *a, *b;
	struct ts_lease_ipc_chunk chunk;
	struct ts_error err;
	unsigned char wire[64];
	void *base;
	uint64_t off;
	json_t *sh, *ipc;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_set_new(&dc, &set, &err), TS_OK);
	ck_assert_int_eq(ts_memory_new(set, &mc, &mem, &err), TS_OK);
	sp = ts_memory_find(mem, "sim:0", TS_MEM_DEVICE);
	ck_assert_int_eq(ts_buffer_new(sp, 1 << 20, &a, &err), TS_OK);
	ck_assert_int_eq(ts_buffer_new(sp, 12345, &b, &err), TS_OK);

	/* b's chunk is the pool's region; the shard names b's bytes in it */
	ck_assert(ts_buffer_chunk(b, &base, &chunk.size, &off));
	chunk.base = base;
	some_handle(&chunk.handle, 7);
	sh = json_object();
	ck_assert_int_eq(ts_lease_ipc_shard(sh, &chunk, ts_buffer_data(b), ts_buffer_size(b), &gpu,
	                                    &err), TS_OK);
	ck_assert_str_eq(json_string_value(json_object_get(sh, "transport")), "cuda_ipc");
	ck_assert_int_eq(json_integer_value(json_object_get(sh, "offset")),
	                 (json_int_t)((uintptr_t)ts_buffer_data(b) - (uintptr_t)base));
	ck_assert_int_eq(json_integer_value(json_object_get(sh, "offset")), (json_int_t)off);
	ck_assert_int_ge(off, 1 << 20);                    /* after a's block */
	ck_assert_int_eq(json_integer_value(json_object_get(sh, "length")), 12345);
	ipc = json_object_get(sh, "cuda_ipc");
	ck_assert_int_eq(json_integer_value(json_object_get(ipc, "chunk_bytes")), 16 << 20);
	ck_assert_int_eq(json_integer_value(json_object_get(ipc, "ordinal")), 1);
	ck_assert_str_eq(json_string_value(json_object_get(ipc, "pci_bus_id")), "0000:3B:00.0");
	ck_assert_str_eq(json_string_value(json_object_get(ipc, "uuid")), gpu.uuid);
	ck_assert_int_eq(lw_ipc_handle(sh, wire), 0);
	ck_assert_int_eq(memcmp(wire, chunk.handle.bytes, 64), 0);
	json_decref(sh);

	/* the chunk's last byte, and an empty shard at its end, are inside */
	sh = json_object();
	ck_assert_int_eq(ts_lease_ipc_shard(sh, &chunk, (char *)base + chunk.size - 1, 1, &gpu, &err),
	                 TS_OK);
	ck_assert_int_eq(ts_lease_ipc_shard(sh, &chunk, (char *)base + chunk.size, 0, &gpu, &err),
	                 TS_OK);
	json_decref(sh);

	/* bytes past the chunk's end, or before its base, are refused */
	sh = json_object();
	ck_assert_int_eq(ts_lease_ipc_shard(sh, &chunk, (char *)base + chunk.size - 1, 2, &gpu, &err),
	                 TS_INTERNAL);
	ck_assert_str_eq(err.reason, "LEASE_CHUNK");
	ck_assert_msg(strstr(err.message, "'cuda:1'"), "%s", err.message);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_lease_ipc_shard(sh, &chunk, (char *)base - 256, 16, &gpu, &err),
	                 TS_INTERNAL);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_lease_ipc_shard(sh, &chunk, (char *)base + chunk.size + 256, 0, &gpu,
	                                    &err), TS_INTERNAL);
	json_decref(sh);

	ts_buffer_unref(a);
	ts_buffer_unref(b);
	ts_memory_free(mem);
	ts_device_set_free(set);
}
END_TEST

/* A device that is no GPU has no CUDA IPC handles, whatever the build. */
START_TEST(test_no_handle_off_a_gpu)
{
	struct ts_device_config dc = {.sim_devices = 1, .sim_device_memory = 1ull << 20};
	struct ts_device_set *set;
	struct ts_ipc_handle h;
	struct ts_error err;
	int x;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_set_new(&dc, &set, &err), TS_OK);
	ck_assert_int_eq(ts_device_ipc_handle(ts_device_set_find(set, "sim:0"), &x, &h, &err),
	                 TS_FAILED_PRECONDITION);
	ck_assert_msg(strstr(err.message, "'sim:0'"), "%s", err.message);
	ts_device_set_free(set);
}
END_TEST

/* The wire client's kept mappings (the bench's): one per file and
 * protection, found again through any descriptor of the same memfd. */
START_TEST(test_kept_mappings)
{
	struct lw_maps maps = {.n = 0};
	int fd = memfd_create("kept", 0), ro;
	char path[64];
	bool fresh;
	unsigned char *a, *b, *w;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 1 << 20), 0);
	ck_assert_int_eq((int)pwrite(fd, "abc", 3, 4096), 3);
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	ro = open(path, O_RDONLY);                 /* as a read lease's descriptor is */
	ck_assert_int_ge(ro, 0);
	a = lw_map_kept(&maps, ro, 4096, 3, false, &fresh);
	ck_assert_ptr_nonnull(a);
	ck_assert(fresh);
	ck_assert_int_eq(memcmp(a, "abc", 3), 0);
	b = lw_map_kept(&maps, fd, 8192, 100, false, &fresh);
	ck_assert(!fresh);                         /* the same file: the same mapping */
	ck_assert_ptr_eq(b, a + 4096);
	w = lw_map_kept(&maps, fd, 4096, 3, true, &fresh);
	ck_assert(fresh);                          /* another protection: its own */
	w[0] = 'x';
	ck_assert_int_eq(a[0], 'x');               /* one memfd: both see it */
	ck_assert_ptr_null(lw_map_kept(&maps, fd, (1 << 20) - 2, 3, false, &fresh));
	ck_assert_int_eq(errno, EINVAL);           /* past the file's end */
	ck_assert_int_eq(maps.n, 2);
	lw_maps_release(&maps);
	ck_assert_int_eq(maps.n, 0);
	close(ro);
	close(fd);
}
END_TEST

/* Appends a frame of payload to buf at *n. */
static void put_frame(unsigned char *buf, size_t *n, const char *payload)
{
	size_t len = strlen(payload);

	buf[*n] = (unsigned char)(len >> 24);
	buf[*n + 1] = (unsigned char)(len >> 16);
	buf[*n + 2] = (unsigned char)(len >> 8);
	buf[*n + 3] = (unsigned char)len;
	memcpy(buf + *n + 4, payload, len);
	*n += 4 + len;
}

/* 1,000 frames written at once are cut one by one, in order, from every
 * prefix of the stream: a frame is WHOLE only once its last byte is in. */
START_TEST(test_pipelined_frames_cut_in_order)
{
	enum { N = 1000 };
	static unsigned char buf[N * 64];
	size_t n = 0, at = 0, ends[N];
	struct ts_lease_frame f;
	struct ts_error err;
	char one[64];
	int got = 0;

	for (int i = 0; i < N; i++) {
		snprintf(one, sizeof one, "{\"op\":\"release\",\"lease\":%d}", i + 1);
		put_frame(buf, &n, one);
		ends[i] = n;
	}
	ts_error_clear(&err);
	while (ts_lease_frame_next(buf + at, n - at, &f, &err) == TS_LEASE_FRAME_WHOLE) {
		struct ts_lease_req rq;

		ck_assert_int_eq(ts_lease_parse(f.payload, f.len, &rq, &err), TS_OK);
		ck_assert_uint_eq(rq.lease, (uint64_t)got + 1);
		at += f.size;
		ck_assert_uint_eq(at, ends[got]);
		got++;
	}
	ck_assert_int_eq(got, N);
	ck_assert_uint_eq(at, n);
	/* a prefix that ends inside a frame asks for more */
	for (size_t cut = 0; cut < ends[0]; cut++)
		ck_assert_int_eq(ts_lease_frame_next(buf, cut, &f, &err), TS_LEASE_FRAME_MORE);
	ck_assert_int_eq(ts_lease_frame_next(buf, ends[0], &f, &err), TS_LEASE_FRAME_WHOLE);
}
END_TEST

START_TEST(test_unreadable_frames_refused)
{
	const unsigned char zero[4] = {0, 0, 0, 0}, big[4] = {0, 1, 0, 1}, max[4] = {0, 1, 0, 0};
	struct ts_lease_frame f;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_lease_frame_next(zero, 4, &f, &err), TS_LEASE_FRAME_BAD);
	ck_assert_int_eq(err.status, TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "BAD_LEASE_FRAME");
	ts_error_clear(&err);
	ck_assert_int_eq(ts_lease_frame_next(big, 4, &f, &err), TS_LEASE_FRAME_BAD);
	ck_assert_msg(strstr(err.message, "65537"), "%s", err.message);
	/* the largest frame is only waited for */
	ck_assert_int_eq(ts_lease_frame_next(max, 4, &f, &err), TS_LEASE_FRAME_MORE);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("lease");
	TCase *tc = tcase_create("ipc");

	tcase_add_test(tc, test_handle_text_round_trip);
	tcase_add_test(tc, test_handle_text_refused);
	tcase_add_test(tc, test_shard_from_pool_chunk);
	tcase_add_test(tc, test_no_handle_off_a_gpu);
	tcase_add_test(tc, test_kept_mappings);
	tcase_add_test(tc, test_pipelined_frames_cut_in_order);
	tcase_add_test(tc, test_unreadable_frames_refused);
	suite_add_tcase(s, tc);
	return s;
}
