/*
 * lease_proto.c - parsing the lease service's requests (lease_proto.h).
 */
#include "server/lease_proto.h"

#include <jansson.h>
#include <string.h>

#define BAD(err, ...) ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_LEASE_REQUEST", __VA_ARGS__)

static const char *const op_names[] = {
	[TS_LEASE_OP_LEASE] = "lease",
	[TS_LEASE_OP_CREATE] = "create",
	[TS_LEASE_OP_PUBLISH] = "publish",
	[TS_LEASE_OP_RELEASE] = "release",
	[TS_LEASE_OP_PING] = "ping",
};

/* Which members each op takes, beyond "op". */
static bool member_allowed(enum ts_lease_op op, const char *key)
{
	switch (op) {
	case TS_LEASE_OP_LEASE:
		return strcmp(key, "name") == 0;
	case TS_LEASE_OP_CREATE:
		return strcmp(key, "name") == 0 || strcmp(key, "dtype") == 0 ||
		       strcmp(key, "shape") == 0 || strcmp(key, "memory_kind") == 0 ||
		       strcmp(key, "device") == 0;
	case TS_LEASE_OP_PUBLISH:
		return strcmp(key, "lease") == 0 || strcmp(key, "if_none_match") == 0;
	case TS_LEASE_OP_RELEASE:
		return strcmp(key, "lease") == 0;
	default:
		return false;
	}
}

static ts_status parse_name(json_t *root, struct ts_lease_req *out, struct ts_error *err)
{
	json_t *v = json_object_get(root, "name");
	const char *s;

	if (!json_is_string(v))
		return BAD(err, "member 'name' must be an array name (a string)");
	s = json_string_value(v);
	if (strlen(s) != json_string_length(v) || !ts_name_valid(s))
		return BAD(err, "'name' is not a valid array name "
		           "(^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$)");
	memcpy(out->name, s, strlen(s) + 1);
	return TS_OK;
}

static ts_status parse_create(json_t *root, struct ts_lease_req *out, struct ts_error *err)
{
	json_t *dt = json_object_get(root, "dtype"), *shape = json_object_get(root, "shape");
	json_t *kind = json_object_get(root, "memory_kind"), *dev = json_object_get(root, "device");
	uint64_t nbytes;
	size_t i;

	if (!json_is_string(dt) || !ts_dtype_parse(json_string_value(dt), &out->dtype))
		return BAD(err, "member 'dtype' must name a dtype such as 'float32'");
	if (!json_is_array(shape) || json_array_size(shape) > TS_MAX_RANK)
		return BAD(err, "member 'shape' must be a list of at most %d sizes", TS_MAX_RANK);
	out->rank = (int)json_array_size(shape);
	for (i = 0; i < json_array_size(shape); i++) {
		json_t *d = json_array_get(shape, i);

		if (!json_is_integer(d) || json_integer_value(d) < 0)
			return BAD(err, "'shape'[%zu] must be a size (an integer >= 0)", i);
		out->shape[i] = (uint64_t)json_integer_value(d);
	}
	if (!ts_shape_nbytes(out->rank, out->shape, out->dtype, &nbytes))
		return BAD(err, "'shape' holds more than 2^64 bytes");
	if (kind) {
		if (!json_is_string(kind) ||
		    !ts_memory_kind_parse(json_string_value(kind), &out->kind))
			return BAD(err, "member 'memory_kind' must be 'pinned_host' or "
			           "'unpinned_host'");
		out->kind_given = true;
	}
	if (dev) {
		if (!json_is_string(dev) || json_string_length(dev) >= sizeof out->device ||
		    strlen(json_string_value(dev)) != json_string_length(dev))
			return BAD(err, "member 'device' must be a device id such as 'cpu:0'");
		memcpy(out->device, json_string_value(dev), json_string_length(dev) + 1);
	}
	return TS_OK;
}

static ts_status parse_lease_id(json_t *root, struct ts_lease_req *out, struct ts_error *err)
{
	json_t *v = json_object_get(root, "lease");

	if (!json_is_integer(v) || json_integer_value(v) <= 0)
		return BAD(err, "member 'lease' must be a lease id (an integer > 0)");
	out->lease = (uint64_t)json_integer_value(v);
	return TS_OK;
}

ts_status ts_lease_parse(const char *buf, size_t len, struct ts_lease_req *out,
                         struct ts_error *err)
{
	json_error_t jerr;
	json_t *root, *op, *inm;
	const char *key;
	json_t *val;
	ts_status st = TS_OK;
	size_t i;

	memset(out, 0, sizeof *out);
	root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!json_is_object(root)) {
		st = BAD(err, "a lease request must be one JSON object");
		goto out;
	}
	op = json_object_get(root, "op");
	for (i = 0; i < sizeof op_names / sizeof op_names[0]; i++)
		if (json_is_string(op) && strcmp(json_string_value(op), op_names[i]) == 0)
			break;
	if (i == sizeof op_names / sizeof op_names[0]) {
		st = BAD(err, "member 'op' must be 'lease', 'create', 'publish', 'release' or 'ping'");
		goto out;
	}
	out->op = (enum ts_lease_op)i;
	json_object_foreach(root, key, val) {
		if (strcmp(key, "op") != 0 && !member_allowed(out->op, key)) {
			st = BAD(err, "'%s' takes no member '%.64s'", op_names[out->op], key);
			goto out;
		}
	}
	switch (out->op) {
	case TS_LEASE_OP_LEASE:
		st = parse_name(root, out, err);
		break;
	case TS_LEASE_OP_CREATE:
		st = parse_name(root, out, err);
		if (st == TS_OK)
			st = parse_create(root, out, err);
		break;
	case TS_LEASE_OP_PUBLISH:
		st = parse_lease_id(root, out, err);
		inm = json_object_get(root, "if_none_match");
		if (st == TS_OK && inm) {
			if (!json_is_string(inm) || strcmp(json_string_value(inm), "*") != 0)
				st = BAD(err, "member 'if_none_match' may only be '*'");
			else
				out->create_only = true;
		}
		break;
	case TS_LEASE_OP_RELEASE:
		st = parse_lease_id(root, out, err);
		break;
	default:
		break;
	}
out:
	json_decref(root);
	return st;
}

enum ts_lease_frame_state ts_lease_frame_next(const unsigned char *buf, size_t have,
                                              struct ts_lease_frame *out,
                                              struct ts_error *err)
{
	uint32_t len;

	if (have < 4)
		return TS_LEASE_FRAME_MORE;
	len = (uint32_t)buf[0] << 24 | (uint32_t)buf[1] << 16 | (uint32_t)buf[2] << 8 | buf[3];
	if (len == 0 || len > TS_LEASE_FRAME_MAX) {
		ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_LEASE_FRAME",
		             "a lease frame of %u bytes: frames hold 1 to %u bytes", len,
		             TS_LEASE_FRAME_MAX);
		return TS_LEASE_FRAME_BAD;
	}
	if (have - 4 < len)
		return TS_LEASE_FRAME_MORE;
	out->payload = (const char *)buf + 4;
	out->len = len;
	out->size = 4 + (size_t)len;
	return TS_LEASE_FRAME_WHOLE;
}
