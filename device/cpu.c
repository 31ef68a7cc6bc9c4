/*
 * cpu.c - the host itself as device "cpu:0".
 *
 * Its device memory is pageable host memory (anonymous mappings, untouched
 * here), bounded only by what the kernel grants; its figures are MemTotal
 * and MemAvailable of /proc/meminfo. Its queues are copy threads like sim's
 * (hostq.c), not inline copies: a copy never runs on the submitting thread,
 * so an HTTP or compute thread never spends a multi-GiB memcpy inside
 * ts_queue_copy, and cpu and sim queues can wait on each other's events.
 *
 * Invariants: exactly one cpu device exists, ordinal 0.
 *
 * Thread-safety: all functions may be called from any thread; the device
 * holds no mutable state of its own.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/units.h"
#include "device/backend.h"

/* Nothing mutable: impl only marks the device as set up. */
struct cpu_dev {
	int online_cpus;         /* immutable */
};

static ts_status cpu_mem_alloc(struct ts_device *dev, size_t size, void **out,
                               struct ts_error *err)
{
	return ts__host_pages_alloc(dev, TS_MEM_DEVICE, size, false, out, err);
}

static void cpu_mem_free(struct ts_device *dev, void *p, size_t size)
{
	ts__host_pages_free(dev, p, size);
}

static ts_status cpu_copy(struct ts_device *dev, void *dst, const void *src,
                          size_t n, enum ts_copy_kind kind, struct ts_error *err)
{
	memcpy(dst, src, n);
	return TS_OK;
}

static ts_status cpu_queue_new(struct ts_device *dev, struct ts_queue **out,
                               struct ts_error *err)
{
	return ts__hostq_new(dev, cpu_copy, out, err);
}

static ts_status cpu_mem_info(struct ts_device *dev, uint64_t *free_bytes,
                              uint64_t *total_bytes, struct ts_error *err)
{
	return ts__host_meminfo(free_bytes, total_bytes, err);
}

static void cpu_device_free(struct ts_device *dev)
{
	free(dev->impl);
	dev->impl = NULL;
}

static const struct ts__backend_ops cpu_ops = {
	.events = TS__EVENTS_HOST,
	.mem_alloc = cpu_mem_alloc,
	.mem_free = cpu_mem_free,
	.queue_new = cpu_queue_new,
	.queue_free = ts__hostq_free,
	.queue_copy = ts__hostq_copy,
	.queue_host_fn = ts__hostq_host_fn,
	.queue_host_fn_named = ts__hostq_host_fn_named,
	.queue_wait_event = ts__hostq_wait_event,
	.queue_sync = ts__hostq_sync,
	.queue_reserve = ts__hostq_reserve,
	.event_new = ts__hostev_new,
	.event_free = ts__hostev_free,
	.event_record = ts__hostev_record,
	.event_done = ts__hostev_done,
	.event_sync = ts__hostev_sync,
	.device_sync = ts__hostq_device_sync,
	.mem_info = cpu_mem_info,
	.device_free = cpu_device_free,
};

/* The processor's model name from /proc/cpuinfo, or a generic one. */
static void cpu_model_name(char *buf, size_t len)
{
	char line[256];
	FILE *f = fopen("/proc/cpuinfo", "re");

	snprintf(buf, len, "host cpu");
	if (!f)
		return;
	while (fgets(line, sizeof line, f)) {
		char *colon;

		if (strncmp(line, "model name", 10) != 0)
			continue;
		colon = strchr(line, ':');
		if (!colon)
			break;
		colon++;
		while (*colon == ' ' || *colon == '\t')
			colon++;
		colon[strcspn(colon, "\n")] = '\0';
		if (*colon)
			snprintf(buf, len, "%s", colon);
		break;
	}
	fclose(f);
}

ts_status ts__cpu_discover(struct ts__discover_ctx *ctx,
                           struct ts_backend_info *info,
                           struct ts_error *err)
{
	struct ts_device *dev;
	struct cpu_dev *c;
	uint64_t avail = 0, total = 0;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	char total_h[32];

	memset(info, 0, sizeof *info);
	info->kind = TS_BACKEND_CPU;
	info->compiled = true;

	dev = ts__device_new(ctx, TS_BACKEND_CPU, 0, &cpu_ops);
	if (!dev)
		goto out_oom;
	c = calloc(1, sizeof *c);
	if (!c)
		goto out_dev;
	c->online_cpus = ncpu > 0 ? (int)ncpu : 1;
	dev->impl = c;

	/* Without /proc the device still exists, with unknown (0) figures. */
	ts__host_meminfo(&avail, &total, NULL);
	cpu_model_name(dev->props.name, sizeof dev->props.name);
	dev->props.total_memory = total;
	dev->props.free_memory = avail;
	dev->props.multiprocessors = c->online_cpus;
	ts_format_bytes(total_h, sizeof total_h, total);
	snprintf(info->detail, sizeof info->detail, "%d online cpus, %s of memory",
	         c->online_cpus, total_h);
	info->device_count = 1;
	info->available = true;
	return ts__discover_add(ctx, dev, err);

out_dev:
	ts__device_destroy(dev);
out_oom:
	return ts_error_oom(err, "cpu:0: out of memory during discovery");
}
