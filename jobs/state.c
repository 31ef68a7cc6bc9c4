/*
 * state.c - the state dir (jobs/state.h): saves of the marked arrays and
 * models as one generation of files and a manifest, each file through a
 * temporary name, fsync and rename; and their restore at start, entry by
 * entry, skipping (logged, counted) what does not read back whole.
 *
 * Invariant: manifest.json, whenever it exists, names only files that were
 * fsynced and renamed before it was, so a start after any crash reads
 * either the previous save or the new one, whole.
 */
#include "jobs/state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/lock.h"
#include "common/log.h"
#include "common/units.h"
#include "formats/safetensors.h"
#include "jobs/checkpoint.h"
#include "jobs/import.h"
#include "jobs/model.h"
#include "storage/array.h"
#include "storage/array_io.h"
#include "train/model.h"

#define STATE_FORMAT "tstage.state.v1"
#define MANIFEST "manifest.json"
#define CHUNK (8u << 20)
#define HOLD_RETRY_NS 20000000L        /* a save waiting for a step to end polls this often */
#define HOLD_WAIT_NS (30ull * 1000000000ull)  /* how long a save without an operation waits */
#define MODELS_MAX 4096

struct ts_state {
	const struct ts_jobs_env *env;             /* immutable after init */
	struct ts_device *default_device;          /* immutable after init */
	enum ts_memory_kind default_kind;          /* immutable after init */
	char dir[PATH_MAX];                        /* immutable after init */
	int dirfd;                                 /* immutable after init */
	struct ts_mutex save_mu;                   /* one writer at a time */
	json_t *files;                             /* guarded by: save_mu; the manifest's files */
	struct ts_mutex stats_mu;
	struct ts_state_stats stats;               /* guarded by: stats_mu */
};

static const char *const skip_names[] = {
#define TS_STATE_SKIP_NAME(e, s) s,
	TS_STATE_SKIP_REASONS(TS_STATE_SKIP_NAME)
#undef TS_STATE_SKIP_NAME
};

const char *ts_state_skip_name(enum ts_state_skip r)
{
	return r < TS_STATE_SKIP_COUNT ? skip_names[r] : "unknown";
}

ts_status ts_state_new(const struct ts_jobs_env *env, struct ts_device *default_device,
                       enum ts_memory_kind default_kind, const char *dir,
                       struct ts_state **out, struct ts_error *err)
{
	struct ts_state *s;

	*out = NULL;
	if (strlen(dir) >= sizeof s->dir)
		return ts_error_set(err, TS_FAILED_PRECONDITION, "STATE_DIR",
		                    "state dir '%.64s...' is too long", dir);
	if (mkdir(dir, 0700) != 0 && errno != EEXIST)
		return ts_error_set(err, TS_FAILED_PRECONDITION, "STATE_DIR",
		                    "cannot create state dir '%s': %s", dir, strerror(errno));
	s = calloc(1, sizeof *s);
	if (!s)
		return ts_error_oom(err, "no memory for the state");
	s->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s->dirfd < 0) {
		ts_error_set(err, TS_FAILED_PRECONDITION, "STATE_DIR",
		             "cannot open state dir '%s': %s", dir, strerror(errno));
		free(s);
		return err->status;
	}
	s->env = env;
	s->default_device = default_device;
	s->default_kind = default_kind;
	snprintf(s->dir, sizeof s->dir, "%s", dir);
	s->files = json_array();
	ts_mutex_init(&s->save_mu);
	ts_mutex_init(&s->stats_mu);
	*out = s;
	return TS_OK;
}

void ts_state_free(struct ts_state *s)
{
	if (!s)
		return;
	close(s->dirfd);
	json_decref(s->files);
	ts_mutex_destroy(&s->save_mu);
	ts_mutex_destroy(&s->stats_mu);
	free(s);
}

const char *ts_state_dir(const struct ts_state *s)
{
	return s->dir;
}

void ts_state_stats(struct ts_state *s, struct ts_state_stats *out)
{
	ts_mutex_lock(&s->stats_mu);
	*out = s->stats;
	ts_mutex_unlock(&s->stats_mu);
}

/* ---- placements as the manifest writes them -------------------------------------- */

static json_t *placement_json(const struct ts_placement *pl)
{
	const struct ts_sharding *sh = &pl->sharding;
	json_t *o = json_pack("{s:s, s:b}", "memory_kind", ts_memory_kind_name(sh->memory_kind),
	                      "committed", pl->committed);
	json_t *devs, *names, *shape, *spec;

	if (!o)
		return NULL;
	if (sh->type == TS_SHARDING_SINGLE) {
		json_object_set_new(o, "device", json_string(ts_device_props(sh->device)->id));
		return o;
	}
	devs = json_array();
	names = json_array();
	shape = json_array();
	spec = json_array();
	for (int i = 0; i < sh->mesh.ndevices; i++)
		json_array_append_new(devs, json_string(ts_device_props(sh->mesh.devices[i])->id));
	for (int i = 0; i < sh->mesh.naxes; i++) {
		json_array_append_new(names, json_string(sh->mesh.axis_names[i]));
		json_array_append_new(shape, json_integer(sh->mesh.shape[i]));
	}
	for (int i = 0; i < sh->spec_rank; i++) {
		json_t *e = json_array();

		for (int k = 0; k < sh->spec[i].naxes; k++)
			json_array_append_new(e, json_integer(sh->spec[i].axes[k]));
		json_array_append_new(spec, e);
	}
	json_object_set_new(o, "mesh", json_pack("{s:o, s:o, s:o}", "devices", devs,
	                                         "axis_names", names, "shape", shape));
	json_object_set_new(o, "spec", spec);
	return o;
}

/* The placement j records, into *pl; false when it names a device or kind
 * this node lacks or is malformed (*gone says which: a device is gone). */
static bool placement_parse(const struct ts_state *s, const json_t *j, struct ts_placement *pl,
                            bool *gone)
{
	const char *kind = json_string_value(json_object_get(j, "memory_kind"));
	const char *dev = json_string_value(json_object_get(j, "device"));
	const json_t *mesh = json_object_get(j, "mesh"), *spec = json_object_get(j, "spec");
	struct ts_sharding *sh = &pl->sharding;
	enum ts_memory_kind mk;
	struct ts_error err;
	size_t i;
	json_t *v;

	*gone = false;
	memset(pl, 0, sizeof *pl);
	pl->committed = json_is_true(json_object_get(j, "committed"));
	if (!kind || !ts_memory_kind_parse(kind, &mk))
		return false;
	if (dev) {
		struct ts_device *d = ts_device_set_find(s->env->devices, dev);

		*gone = d == NULL;
		if (d)
			ts_placement_single(pl, d, mk, pl->committed);
		return d != NULL;
	}
	if (!json_is_object(mesh) || !json_is_array(spec))
		return false;
	sh->type = TS_SHARDING_NAMED;
	sh->memory_kind = mk;
	json_array_foreach(json_object_get(mesh, "devices"), i, v) {
		struct ts_device *d = json_string_value(v) ?
		                      ts_device_set_find(s->env->devices, json_string_value(v)) : NULL;

		if (i >= TS_MESH_MAX_DEVICES)
			return false;
		if (!d) {
			*gone = true;
			return false;
		}
		sh->mesh.devices[sh->mesh.ndevices++] = d;
	}
	json_array_foreach(json_object_get(mesh, "axis_names"), i, v) {
		const json_t *n = json_array_get(json_object_get(mesh, "shape"), i);

		if (i >= TS_MESH_MAX_AXES || !json_string_value(v) ||
		    strlen(json_string_value(v)) >= TS_AXIS_NAME_MAX || !json_is_integer(n))
			return false;
		snprintf(sh->mesh.axis_names[i], TS_AXIS_NAME_MAX, "%s", json_string_value(v));
		sh->mesh.shape[i] = (int)json_integer_value(n);
		sh->mesh.naxes++;
	}
	json_array_foreach(spec, i, v) {
		size_t k;
		json_t *a;

		if (i >= TS_MAX_RANK || !json_is_array(v))
			return false;
		json_array_foreach(v, k, a) {
			if (k >= TS_SPEC_MAX_AXES || !json_is_integer(a))
				return false;
			sh->spec[i].axes[k] = (int)json_integer_value(a);
			sh->spec[i].naxes++;
		}
		sh->spec_rank++;
	}
	ts_error_clear(&err);
	return ts_sharding_validate(sh, &err) == TS_OK;
}

/* ---- writing files --------------------------------------------------------------- */

/* One file being written: name.tmp, renamed to name at commit. */
struct wfile {
	char name[TS_ARRAY_NAME_MAX + 64], tmp[TS_ARRAY_NAME_MAX + 72];
	int fd;
	uint64_t size, hash;
};

static ts_status io_error(struct ts_state *s, const char *what, const char *name,
                          struct ts_error *err)
{
	return ts_error_set(err, ts_status_from_errno(errno), "STATE_IO", "cannot %s '%s/%s': %s",
	                    what, s->dir, name, strerror(errno));
}

static ts_status wfile_open(struct ts_state *s, struct wfile *f, struct ts_error *err)
{
	snprintf(f->tmp, sizeof f->tmp, "%s.tmp", f->name);
	f->size = 0;
	f->hash = TS_FNV1A_INIT;
	f->fd = openat(s->dirfd, f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	return f->fd < 0 ? io_error(s, "create", f->tmp, err) : TS_OK;
}

static ts_status wfile_write(struct ts_state *s, struct wfile *f, const void *p, size_t n,
                             struct ts_error *err)
{
	const char *b = p;

	f->hash = ts_fnv1a(f->hash, p, n);
	f->size += n;
	while (n) {
		ssize_t w = write(f->fd, b, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			if (w == 0)
				errno = EIO;
			return io_error(s, "write", f->tmp, err);
		}
		b += w;
		n -= (size_t)w;
	}
	return TS_OK;
}

/* fsync, close and rename into place (the directory is fsynced by the
 * caller, once for a batch). */
static ts_status wfile_commit(struct ts_state *s, struct wfile *f, struct ts_error *err)
{
	int fd = f->fd;

	f->fd = -1;
	if (fsync(fd) != 0) {
		io_error(s, "fsync", f->tmp, err);
		close(fd);
		return err->status;
	}
	if (close(fd) != 0)
		return io_error(s, "close", f->tmp, err);
	if (renameat(s->dirfd, f->tmp, s->dirfd, f->name) != 0)
		return io_error(s, "rename", f->tmp, err);
	return TS_OK;
}

static void wfile_abandon(struct ts_state *s, struct wfile *f)
{
	if (f->fd >= 0) {
		close(f->fd);
		f->fd = -1;
	}
	unlinkat(s->dirfd, f->tmp, 0);
}

static ts_status dir_sync(struct ts_state *s, struct ts_error *err)
{
	return fsync(s->dirfd) != 0 ? io_error(s, "fsync", ".", err) : TS_OK;
}

/* ---- a save ---------------------------------------------------------------------- */

struct save {
	struct ts_state *s;
	struct ts_operation *op;          /* may be NULL */
	uint64_t gen, done;
	char *buf;                        /* CHUNK bytes */
	json_t *arrays, *models, *files;  /* manifest entries; names written */
};

static bool save_cancelled(const struct save *sv)
{
	return sv->op && ts_operation_cancelled(sv->op);
}

/* Writes the bytes of a (all of them, parent order) to f. */
static ts_status write_array_bytes(struct save *sv, struct wfile *f, const struct ts_array *a,
                                   struct ts_error *err)
{
	uint64_t total = ts_array_desc(a)->nbytes;

	for (uint64_t off = 0; off < total;) {
		struct ts_run run = {.src_offset = off, .dst_offset = 0,
		                     .len = total - off < CHUNK ? total - off : CHUNK};

		if (ts_array_read(sv->s->env->stager, a, &run, 1, sv->buf, err) != TS_OK ||
		    wfile_write(sv->s, f, sv->buf, run.len, err) != TS_OK)
			return err->status;
		off += run.len;
		sv->done += run.len;
		if (sv->op)
			ts_operation_progress_set(sv->op, sv->done);
		if (save_cancelled(sv))
			return ts_error_set(err, TS_CANCELLED, "CANCELLED", "the save was cancelled");
	}
	return TS_OK;
}

/* Writes a file of tensors (header hdr, then the arrays' bytes) named
 * name; records it in the manifest entry e (name, file, size, fnv1a). */
static ts_status write_entry(struct save *sv, const char *file, const char *hdr, size_t hdr_len,
                             struct ts_array *const *arrs, size_t n, json_t *e,
                             struct ts_error *err)
{
	struct wfile f = {.fd = -1};
	char hash[24];

	snprintf(f.name, sizeof f.name, "%s", file);
	if (wfile_open(sv->s, &f, err) != TS_OK)
		return err->status;
	json_array_append_new(sv->files, json_string(f.name));  /* removed if the save fails */
	if (wfile_write(sv->s, &f, hdr, hdr_len, err) != TS_OK)
		goto out_abandon;
	for (size_t i = 0; i < n; i++)
		if (write_array_bytes(sv, &f, arrs[i], err) != TS_OK)
			goto out_abandon;
	if (wfile_commit(sv->s, &f, err) != TS_OK)
		goto out_abandon;
	snprintf(hash, sizeof hash, "%016" PRIx64, f.hash);
	json_object_set_new(e, "file", json_string(f.name));
	json_object_set_new(e, "size", json_integer((json_int_t)f.size));
	json_object_set_new(e, "fnv1a", json_string(hash));
	return TS_OK;

out_abandon:
	wfile_abandon(sv->s, &f);
	return err->status;
}

static ts_status save_array(struct save *sv, struct ts_array *a, struct ts_error *err)
{
	const struct ts_array_desc *d = ts_array_desc(a);
	struct ts_st_tensor t = {.name = (char *)ts_array_name(a), .dtype = d->dtype, .rank = d->rank};
	const json_t *meta = ts_array_metadata(a);
	char file[TS_ARRAY_NAME_MAX + 64], *hdr = NULL;
	size_t hdr_len = 0;
	json_t *e;
	ts_status st;

	memcpy(t.shape, d->shape, sizeof t.shape);
	/* metadata that is not a map of strings (none today) is left out */
	if (ts_st_build_header(&t, 1, meta, &hdr, &hdr_len, err) != TS_OK &&
	    (!meta || ts_st_build_header(&t, 1, NULL, &hdr, &hdr_len, err) != TS_OK))
		return err->status;
	snprintf(file, sizeof file, "a.%s.%" PRIu64 ".safetensors", ts_array_name(a), sv->gen);
	e = json_pack("{s:s, s:o*}", "name", ts_array_name(a),
	              "placement", placement_json(ts_array_placement(a)));
	if (!e) {
		free(hdr);
		return ts_error_oom(err, "no memory for the manifest");
	}
	st = write_entry(sv, file, hdr, hdr_len, &a, 1, e, err);
	free(hdr);
	if (st == TS_OK)
		json_array_append_new(sv->arrays, e);
	else
		json_decref(e);
	return st;
}

/* Holds the model's arrays (waiting while a step holds them) and reads
 * them and its record as one: arrs[0..*n) new references, *m its record
 * with the memory kinds its arrays are in now. */
static ts_status hold_model(struct save *sv, const char *name, const char *holder,
                            struct ts_model *m, enum ts_pbuf_role *roles,
                            struct ts_array **arrs, size_t *n, struct ts_error *err)
{
	const struct ts_jobs_env *env = sv->s->env;
	struct timespec pause = {0, HOLD_RETRY_NS};
	uint64_t until = ts_wall_ns() + HOLD_WAIT_NS;

	for (;;) {
		struct ts_policy pol;

		*n = 0;
		if (!ts_model_registry_get(env->models, name, m) || !m->ready)
			return ts_error_set(err, TS_NOT_FOUND, "MODEL_GONE", "model '%s' is gone", name);
		*n = ts_checkpoint_roles(m, roles);
		for (size_t i = 0; i < *n; i++) {
			char an[TS_MODEL_NAME_MAX + 32];

			ts_model_array_name(m, roles[i], an, sizeof an);
			arrs[i] = ts_catalog_get(env->catalog, an);
		}
		for (size_t i = 0; i < *n; i++)
			if (!arrs[i])
				goto out_retry;
		if (ts_catalog_hold(env->catalog, arrs, *n, holder, err) == TS_OK) {
			/* held: no step runs on them, so this t is theirs */
			if (!ts_model_registry_get(env->models, name, m) ||
			    ts_job_model_policy(env, m, &pol, err) != TS_OK) {
				ts_catalog_release(env->catalog, holder);
				goto out_drop;
			}
			m->policy.params = pol.params;
			m->policy.opt_state = pol.opt_state;
			return TS_OK;
		}
out_retry:
		for (size_t i = 0; i < *n; i++) {
			ts_array_unref(arrs[i]);
			arrs[i] = NULL;
		}
		if (save_cancelled(sv))
			return ts_error_set(err, TS_CANCELLED, "CANCELLED", "the save was cancelled");
		/* the drain's save (no operation) cannot be cancelled: it gives up */
		if (!sv->op && ts_wall_ns() > until)
			return ts_error_set(err, TS_ABORTED, "MODEL_BUSY",
			                    "model '%s' stayed held by a step for 30 s", name);
		nanosleep(&pause, NULL);
	}
out_drop:
	for (size_t i = 0; i < *n; i++) {
		ts_array_unref(arrs[i]);
		arrs[i] = NULL;
	}
	return err->status;
}

static ts_status save_model(struct save *sv, const char *name, struct ts_error *err)
{
	struct ts_array *arrs[TS_MODEL_NROLES] = {0};
	struct ts_st_tensor tensors[TS_MODEL_NROLES];
	enum ts_pbuf_role roles[TS_MODEL_NROLES];
	char tnames[TS_MODEL_NROLES][32], holder[64], file[TS_MODEL_NAME_MAX + 64];
	char *hdr = NULL;
	size_t n = 0, hdr_len = 0;
	struct ts_model m;
	json_t *meta = NULL, *e = NULL;
	ts_status st;

	snprintf(holder, sizeof holder, "state-save %" PRIu64, sv->gen);
	st = hold_model(sv, name, holder, &m, roles, arrs, &n, err);
	if (st == TS_NOT_FOUND)
		return TS_OK;               /* deleted meanwhile: nothing to keep */
	if (st != TS_OK)
		return st;
	meta = ts_checkpoint_metadata(&m);
	for (size_t i = 0; i < n; i++) {
		const struct ts_array_desc *d = ts_array_desc(arrs[i]);

		ts_checkpoint_tensor_name(&m, roles[i], tnames[i], sizeof tnames[i]);
		tensors[i] = (struct ts_st_tensor){.name = tnames[i], .dtype = d->dtype, .rank = d->rank};
		memcpy(tensors[i].shape, d->shape, sizeof tensors[i].shape);
	}
	snprintf(file, sizeof file, "m.%s.%" PRIu64 ".safetensors", m.name, sv->gen);
	e = json_pack("{s:s, s:s, s:I}", "name", m.name, "device", ts_device_props(m.device)->id,
	              "steps", (json_int_t)m.steps);
	if (!meta || !e)
		st = ts_error_oom(err, "no memory for model '%s''s checkpoint", m.name);
	else if ((st = ts_st_build_header(tensors, n, meta, &hdr, &hdr_len, err)) == TS_OK)
		st = write_entry(sv, file, hdr, hdr_len, arrs, n, e, err);
	ts_catalog_release(sv->s->env->catalog, holder);
	if (st == TS_OK) {
		json_array_append_new(sv->models, e);
		e = NULL;
	}
	for (size_t i = 0; i < n; i++)
		ts_array_unref(arrs[i]);
	json_decref(e);
	json_decref(meta);
	free(hdr);
	return st;
}

static bool keep_marked(const struct ts_array *a, void *arg)
{
	(void)arg;
	return ts_array_persisted(a) && !ts_array_owner(a)[0];
}

static ts_status save_arrays(struct save *sv, struct ts_error *err)
{
	struct ts_array **page = NULL;
	char after[TS_ARRAY_NAME_MAX + 1] = "";
	size_t n = 0;
	bool more = true;
	ts_status st = TS_OK;

	while (st == TS_OK && more) {
		st = ts_catalog_list(sv->s->env->catalog, after[0] ? after : NULL, 256, keep_marked,
		                     NULL, &page, &n, &more, err);
		if (st != TS_OK)
			break;
		for (size_t i = 0; i < n && st == TS_OK; i++)
			st = save_array(sv, page[i], err);
		if (n)
			snprintf(after, sizeof after, "%s", ts_array_name(page[n - 1]));
		ts_catalog_list_free(page, n);
		more = more && n > 0;
	}
	return st;
}

static ts_status save_models(struct save *sv, struct ts_error *err)
{
	struct ts_model *ms = calloc(MODELS_MAX, sizeof *ms);
	size_t n;
	ts_status st = TS_OK;

	if (!ms)
		return ts_error_oom(err, "no memory to list the models");
	n = ts_model_registry_list(sv->s->env->models, ms, MODELS_MAX);
	for (size_t i = 0; i < n && st == TS_OK; i++)
		if (ms[i].persist && ms[i].ready)
			st = save_model(sv, ms[i].name, err);
	free(ms);
	return st;
}

static ts_status write_manifest(struct save *sv, struct ts_error *err)
{
	struct wfile f = {.fd = -1};
	char *text;
	json_t *man;
	ts_status st;

	man = json_pack("{s:s, s:I, s:I, s:O, s:O}", "format", STATE_FORMAT,
	                "generation", (json_int_t)sv->gen, "saved_ns", (json_int_t)ts_wall_ns(),
	                "arrays", sv->arrays, "models", sv->models);
	text = man ? json_dumps(man, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
	json_decref(man);
	if (!text)
		return ts_error_oom(err, "no memory for the manifest");
	snprintf(f.name, sizeof f.name, "%s", MANIFEST);
	st = wfile_open(sv->s, &f, err);
	if (st == TS_OK)
		st = wfile_write(sv->s, &f, text, strlen(text), err);
	if (st == TS_OK)
		st = wfile_commit(sv->s, &f, err);
	if (st != TS_OK)
		wfile_abandon(sv->s, &f);
	free(text);
	return st;
}

static bool listed(const json_t *list, const char *name)
{
	size_t i;
	json_t *v;

	json_array_foreach(list, i, v)
		if (strcmp(json_string_value(v), name) == 0)
			return true;
	return false;
}

/* Removes the files of old that now does not name. */
static void remove_unlisted(struct ts_state *s, const json_t *old, const json_t *now)
{
	size_t i;
	json_t *v;

	json_array_foreach(old, i, v)
		if (!listed(now, json_string_value(v)))
			unlinkat(s->dirfd, json_string_value(v), 0);
}

ts_status ts_state_save(struct ts_state *s, struct ts_operation *op, json_t **result,
                        struct ts_error *err)
{
	struct save sv = {.s = s, .op = op};
	uint64_t count = 0, bytes = 0, start = ts_wall_ns(), secs = start / 1000000000ull;
	ts_status st;

	if (result)
		*result = NULL;
	ts_mutex_lock(&s->save_mu);
	ts_mutex_lock(&s->stats_mu);
	/* a generation never used before, even after a manifest that could not
	 * be read: the clock's seconds, or one past the last */
	sv.gen = s->stats.generation + 1 > secs ? s->stats.generation + 1 : secs;
	ts_mutex_unlock(&s->stats_mu);
	ts_catalog_totals(s->env->catalog, &count, &bytes);
	if (op)
		ts_operation_total_set(op, bytes);
	sv.buf = malloc(CHUNK);
	sv.arrays = json_array();
	sv.models = json_array();
	sv.files = json_array();
	if (!sv.buf || !sv.arrays || !sv.models || !sv.files)
		st = ts_error_oom(err, "no memory for a save");
	else
		st = save_arrays(&sv, err);
	if (st == TS_OK)
		st = save_models(&sv, err);
	if (st == TS_OK)
		st = dir_sync(s, err);        /* the entries' renames before the manifest's */
	if (st == TS_OK)
		st = write_manifest(&sv, err);
	if (st == TS_OK)
		st = dir_sync(s, err);
	if (st == TS_OK) {
		json_array_append_new(sv.files, json_string(MANIFEST));
		remove_unlisted(s, s->files, sv.files);
		json_decref(s->files);
		s->files = json_incref(sv.files);
	} else {
		/* this generation's entries: no manifest names them */
		remove_unlisted(s, sv.files, s->files);
	}
	ts_mutex_lock(&s->stats_mu);
	if (st == TS_OK) {
		s->stats.saves++;
		s->stats.generation = sv.gen;
		s->stats.last_save_wall_ns = ts_wall_ns();
		s->stats.last_save_bytes = sv.done;
	} else {
		s->stats.save_failures++;
	}
	ts_mutex_unlock(&s->stats_mu);
	if (st == TS_OK) {
		char fields[200];

		snprintf(fields, sizeof fields, "\"event\":\"state_saved\",\"generation\":%" PRIu64
		         ",\"arrays\":%zu,\"models\":%zu,\"bytes\":%" PRIu64 ",\"ms\":%" PRIu64, sv.gen,
		         json_array_size(sv.arrays), json_array_size(sv.models), sv.done,
		         (ts_wall_ns() - start) / 1000000);
		ts_log(TS_LOG_INFO, fields, "state saved to '%s': %zu arrays, %zu models", s->dir,
		       json_array_size(sv.arrays), json_array_size(sv.models));
		if (result)
			*result = json_pack("{s:I, s:I, s:I, s:I, s:s}", "generation", (json_int_t)sv.gen,
			                    "arrays", (json_int_t)json_array_size(sv.arrays), "models",
			                    (json_int_t)json_array_size(sv.models), "bytes",
			                    (json_int_t)sv.done, "dir", s->dir);
	} else {
		ts_log(TS_LOG_WARN, "\"event\":\"state_save_failed\"",
		       "state save to '%s' failed (the previous save stays): %s", s->dir,
		       err->message);
	}
	ts_mutex_unlock(&s->save_mu);
	free(sv.buf);
	json_decref(sv.arrays);
	json_decref(sv.models);
	json_decref(sv.files);
	return st;
}

static ts_status save_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	json_t *result = NULL;
	ts_status st = ts_state_save(arg, op, &result, err);

	if (st == TS_OK)
		ts_operation_set_result(op, result ? result : json_object());
	else
		json_decref(result);
	return st;
}

ts_status ts_job_state_save_submit(struct ts_state *s, struct ts_operation **op,
                                   struct ts_error *err)
{
	return ts_op_submit(s->env->operations, "save_state", NULL, 0, "bytes", save_run, s, NULL,
	                    op, err);
}

/* ---- restore --------------------------------------------------------------------- */

static void skip(struct ts_state *s, enum ts_state_skip why, const char *kind, const char *name,
                 const char *file, const char *detail)
{
	json_t *fields = json_pack("{s:s, s:s, s:s, s:s, s:s}", "event", "state_restore_skipped",
	                           "reason", ts_state_skip_name(why), "kind", kind,
	                           "name", name ? name : "", "file", file ? file : "");

	ts_mutex_lock(&s->stats_mu);
	s->stats.skipped[why]++;
	ts_mutex_unlock(&s->stats_mu);
	ts_log_json(TS_LOG_WARN, fields, "state restore skipped %s '%s' (%s): %s", kind,
	            name ? name : "", ts_state_skip_name(why), detail);
}

/* The reason a failed read of an entry is skipped for. */
static enum ts_state_skip skip_of(const struct ts_error *err)
{
	if (strcmp(err->reason, "TRUNCATED") == 0)
		return TS_STATE_SKIP_TRUNCATED;
	if (err->status == TS_RESOURCE_EXHAUSTED || err->status == TS_ALREADY_EXISTS ||
	    err->status == TS_ABORTED)
		return TS_STATE_SKIP_REFUSED;
	return TS_STATE_SKIP_CORRUPT;
}

/* An array entry being read: what admit needs. */
struct arx {
	struct ts_state *s;
	const char *name;
	struct ts_placement pl;
	bool gone;                         /* the saved placement's device is gone */
	struct ts_import_rx rx;
};

static ts_status array_admit(void *ctx, const struct ts_st_header *st, struct ts_array **arrays,
                             struct ts_error *err)
{
	struct arx *x = ctx;
	struct ts_array_desc d;
	ts_status r;

	if (st->ntensors != 1 || strcmp(st->tensors[0].name, x->name) != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_STATE_FILE",
		                    "the file holds %zu tensors, not the one array '%s'", st->ntensors,
		                    x->name);
	d = (struct ts_array_desc){.dtype = st->tensors[0].dtype, .rank = st->tensors[0].rank};
	memcpy(d.shape, st->tensors[0].shape, sizeof d.shape);
	if (ts_array_desc_init(&d, err) != TS_OK)
		return err->status;
	r = ts_array_new(x->name, &d, &x->pl, x->s->env->memory, &arrays[0], err);
	if (r != TS_OK && x->gone && x->pl.sharding.memory_kind != x->s->default_kind) {
		/* the default device may lack the kind: its default kind then */
		ts_placement_single(&x->pl, x->s->default_device, x->s->default_kind, x->pl.committed);
		ts_error_clear(err);
		r = ts_array_new(x->name, &d, &x->pl, x->s->env->memory, &arrays[0], err);
	}
	if (r != TS_OK)
		return r;
	ts_array_set_persist(arrays[0], true);
	if (st->metadata)
		ts_array_set_metadata(arrays[0], json_deep_copy(st->metadata));
	return TS_OK;
}

/* Opens an entry's file and checks its size; fd, or -1 after the skip. */
static int open_entry(struct ts_state *s, const char *kind, const char *name, const char *file,
                      uint64_t size)
{
	struct stat sb;
	char why[160];
	int fd;

	if (!file || strchr(file, '/') || file[0] == '.') {
		skip(s, TS_STATE_SKIP_ENTRY, kind, name, file, "the entry names no file in the dir");
		return -1;
	}
	fd = openat(s->dirfd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		skip(s, errno == ENOENT ? TS_STATE_SKIP_MISSING : TS_STATE_SKIP_CORRUPT, kind, name,
		     file, strerror(errno));
		return -1;
	}
	if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != size) {
		snprintf(why, sizeof why, "the file has %lld bytes; the save wrote %" PRIu64,
		         (long long)sb.st_size, size);
		skip(s, TS_STATE_SKIP_TRUNCATED, kind, name, file, why);
		close(fd);
		return -1;
	}
	return fd;
}

/* Feeds the file to rx (the array's or the model's receiver) and checks
 * the hash; the skip's reason into *why when it fails. */
static ts_status read_entry(int fd, uint64_t size, uint64_t want_hash, char *buf,
                            ts_status (*feed)(void *rx, const char *p, size_t n,
                                              struct ts_error *err),
                            void *rx, enum ts_state_skip *why, struct ts_error *err)
{
	uint64_t off = 0, hash = TS_FNV1A_INIT;

	while (off < size) {
		ssize_t got = pread(fd, buf, CHUNK, (off_t)off);

		if (got <= 0) {
			*why = TS_STATE_SKIP_TRUNCATED;
			return ts_error_set(err, TS_DATA_LOSS, "TRUNCATED", "reading at byte %" PRIu64
			                    ": %s", off, got < 0 ? strerror(errno) : "it got shorter");
		}
		hash = ts_fnv1a(hash, buf, (size_t)got);
		if (feed(rx, buf, (size_t)got, err) != TS_OK) {
			*why = skip_of(err);
			return err->status;
		}
		off += (uint64_t)got;
	}
	if (hash != want_hash) {
		*why = TS_STATE_SKIP_CHECKSUM;
		return ts_error_set(err, TS_DATA_LOSS, "CHECKSUM",
		                    "its FNV-1a hash is %016" PRIx64 "; the save wrote %016" PRIx64,
		                    hash, want_hash);
	}
	return TS_OK;
}

static ts_status feed_array(void *rx, const char *p, size_t n, struct ts_error *err)
{
	return ts_import_rx_bytes(rx, p, n, err);
}

static ts_status feed_model(void *rx, const char *p, size_t n, struct ts_error *err)
{
	return ts_checkpoint_rx_bytes(rx, p, n, err);
}

/* The entry's common fields; false after the skip. */
static bool entry_fields(struct ts_state *s, const char *kind, const json_t *e, const char **name,
                         const char **file, uint64_t *size, uint64_t *hash)
{
	const char *h = json_string_value(json_object_get(e, "fnv1a"));
	char *end = NULL;

	*name = json_string_value(json_object_get(e, "name"));
	*file = json_string_value(json_object_get(e, "file"));
	*size = (uint64_t)json_integer_value(json_object_get(e, "size"));
	*hash = h ? strtoull(h, &end, 16) : 0;
	if (!*name || !ts_array_name_valid(*name) || !*file || !h || !end || *end ||
	    !json_is_integer(json_object_get(e, "size"))) {
		skip(s, TS_STATE_SKIP_ENTRY, kind, *name, *file,
		     "the manifest entry lacks its name, file, size or fnv1a");
		return false;
	}
	return true;
}

static void restore_array(struct ts_state *s, const json_t *e, char *buf)
{
	struct arx x = {.s = s};
	struct ts_precondition pre = {.create_only = true};
	const char *file;
	uint64_t size, hash;
	enum ts_state_skip why = TS_STATE_SKIP_CORRUPT;
	struct ts_error err;
	int fd;

	ts_error_clear(&err);
	if (!entry_fields(s, "array", e, &x.name, &file, &size, &hash))
		return;
	if (!placement_parse(s, json_object_get(e, "placement"), &x.pl, &x.gone)) {
		if (!x.gone) {
			skip(s, TS_STATE_SKIP_ENTRY, "array", x.name, file,
			     "its placement is not one this node can read");
			return;
		}
		ts_log(TS_LOG_WARN, "\"event\":\"state_restore_moved\"",
		       "array '%s' was saved on a device this node lacks; restoring it on %s",
		       x.name, ts_device_props(s->default_device)->id);
		ts_placement_single(&x.pl, s->default_device,
		                    x.pl.sharding.memory_kind, x.pl.committed);
	}
	if (!x.pl.committed)      /* uncommitted: the default placement, as an upload */
		ts_placement_single(&x.pl, s->default_device, s->default_kind, false);
	if ((fd = open_entry(s, "array", x.name, file, size)) < 0)
		return;
	ts_import_rx_init(&x.rx, s->env, size, array_admit, &x);
	if (read_entry(fd, size, hash, buf, feed_array, &x.rx, &why, &err) != TS_OK ||
	    (ts_import_rx_finish(&x.rx, &err) != TS_OK && ((why = skip_of(&err)), true)) ||
	    (ts_catalog_put(s->env->catalog, x.rx.arrays[0], &pre, NULL, &err) != TS_OK &&
	     ((why = TS_STATE_SKIP_REFUSED), true))) {
		skip(s, why, "array", x.name, file, err.message);
	} else {
		ts_mutex_lock(&s->stats_mu);
		s->stats.restored_arrays++;
		ts_mutex_unlock(&s->stats_mu);
	}
	ts_import_rx_release(&x.rx);
	close(fd);
}

static void restore_model(struct ts_state *s, const json_t *e, char *buf)
{
	const char *name, *file, *dev = json_string_value(json_object_get(e, "device"));
	const char *over = NULL;
	struct ts_checkpoint_rx cp;
	uint64_t size, hash;
	enum ts_state_skip why = TS_STATE_SKIP_CORRUPT;
	struct ts_error err;
	int fd;

	ts_error_clear(&err);
	if (!entry_fields(s, "model", e, &name, &file, &size, &hash))
		return;
	if (dev && !ts_device_set_find(s->env->devices, dev)) {
		over = ts_device_props(s->default_device)->id;
		ts_log(TS_LOG_WARN, "\"event\":\"state_restore_moved\"",
		       "model '%s' was saved on %s, which this node lacks; restoring it on %s", name,
		       dev, over);
	}
	if ((fd = open_entry(s, "model", name, file, size)) < 0)
		return;
	if (ts_checkpoint_rx_init(&cp, s->env, s->default_device, name, over, true, size,
	                          &err) != TS_OK) {
		skip(s, TS_STATE_SKIP_ENTRY, "model", name, file, err.message);
		close(fd);
		return;
	}
	if (read_entry(fd, size, hash, buf, feed_model, &cp, &why, &err) != TS_OK ||
	    (ts_checkpoint_rx_publish(&cp, &err) != TS_OK && ((why = skip_of(&err)), true))) {
		skip(s, why, "model", name, file, err.message);
	} else {
		ts_mutex_lock(&s->stats_mu);
		s->stats.restored_models++;
		ts_mutex_unlock(&s->stats_mu);
	}
	ts_checkpoint_rx_release(&cp);
	close(fd);
}

/* Reads manifest.json: a new reference, or NULL (after the skip; ENOENT
 * is no save yet, not a skip). */
static json_t *read_manifest(struct ts_state *s)
{
	json_error_t jerr;
	const char *format;
	json_t *man;
	int fd = openat(s->dirfd, MANIFEST, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	if (fd < 0) {
		if (errno != ENOENT)
			skip(s, TS_STATE_SKIP_MANIFEST, "manifest", MANIFEST, MANIFEST, strerror(errno));
		return NULL;
	}
	man = json_loadfd(fd, JSON_REJECT_DUPLICATES, &jerr);
	close(fd);
	if (!man) {
		skip(s, TS_STATE_SKIP_MANIFEST, "manifest", MANIFEST, MANIFEST, jerr.text);
		/* kept aside for whoever looks into it; the next save writes a new one */
		renameat(s->dirfd, MANIFEST, s->dirfd, MANIFEST ".unreadable");
		return NULL;
	}
	format = json_string_value(json_object_get(man, "format"));
	if (!json_is_object(man) || !format || strcmp(format, STATE_FORMAT) != 0 ||
	    !json_is_array(json_object_get(man, "arrays")) ||
	    !json_is_array(json_object_get(man, "models"))) {
		skip(s, TS_STATE_SKIP_MANIFEST, "manifest", MANIFEST, MANIFEST,
		     "not a " STATE_FORMAT " manifest");
		json_decref(man);
		return NULL;
	}
	return man;
}

/* The files the manifest names (and itself), as the next save's old set;
 * removes temporaries and files of a later generation that no manifest
 * names (a save cut off before its manifest). */
static void tidy_dir(struct ts_state *s, const json_t *man, uint64_t gen)
{
	const char *kinds[] = {"arrays", "models"};
	int fd = dup(s->dirfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *de;

	for (size_t k = 0; k < 2; k++) {
		size_t i;
		json_t *e;

		json_array_foreach(json_object_get(man, kinds[k]), i, e)
			if (json_string_value(json_object_get(e, "file")))
				json_array_append(s->files, json_object_get(e, "file"));
	}
	json_array_append_new(s->files, json_string(MANIFEST));
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((de = readdir(d))) {
		const char *n = de->d_name, *dot;
		size_t len = strlen(n);
		unsigned long long g;

		if (len > 4 && strcmp(n + len - 4, ".tmp") == 0) {
			unlinkat(s->dirfd, n, 0);
			continue;
		}
		/* "a.<name>.<gen>.safetensors" past the manifest's generation */
		if (len < 14 || (n[0] != 'a' && n[0] != 'm') || n[1] != '.' ||
		    strcmp(n + len - 12, ".safetensors") != 0 || listed(s->files, n))
			continue;
		dot = n + len - 12;
		while (dot > n && dot[-1] != '.')
			dot--;
		if (sscanf(dot, "%llu", &g) == 1 && g > gen) {
			ts_log(TS_LOG_INFO, NULL, "removing '%s/%s': written by a save that never "
			       "finished", s->dir, n);
			unlinkat(s->dirfd, n, 0);
		}
	}
	closedir(d);
}

void ts_state_restore(struct ts_state *s)
{
	char *buf = malloc(CHUNK);
	json_t *man, *e;
	uint64_t gen = 0, start = ts_wall_ns();
	struct ts_state_stats st;
	char fields[200];
	size_t i;

	ts_mutex_lock(&s->save_mu);
	man = buf ? read_manifest(s) : NULL;
	if (man) {
		gen = (uint64_t)json_integer_value(json_object_get(man, "generation"));
		json_array_foreach(json_object_get(man, "arrays"), i, e)
			restore_array(s, e, buf);
		json_array_foreach(json_object_get(man, "models"), i, e)
			restore_model(s, e, buf);
		tidy_dir(s, man, gen);
	}
	ts_mutex_lock(&s->stats_mu);
	s->stats.generation = gen;
	s->stats.restored = true;
	st = s->stats;
	ts_mutex_unlock(&s->stats_mu);
	ts_mutex_unlock(&s->save_mu);
	snprintf(fields, sizeof fields, "\"event\":\"state_restored\",\"generation\":%" PRIu64
	         ",\"arrays\":%" PRIu64 ",\"models\":%" PRIu64 ",\"ms\":%" PRIu64, gen,
	         st.restored_arrays, st.restored_models, (ts_wall_ns() - start) / 1000000);
	ts_log(TS_LOG_INFO, fields, "state restored from '%s': %" PRIu64 " arrays, %" PRIu64
	       " models%s", s->dir, st.restored_arrays, st.restored_models,
	       man ? "" : " (no save to read)");
	json_decref(man);
	free(buf);
}

/* ---- what it holds ----------------------------------------------------------------- */

json_t *ts_state_render(struct ts_state *s)
{
	struct ts_state_stats st;
	json_t *o, *skipped = json_object(), *arrays = json_array(), *models = json_array();
	struct ts_array **page = NULL;
	struct ts_model *ms = calloc(MODELS_MAX, sizeof *ms);
	struct ts_error err;
	size_t n = 0;
	bool more = false;

	ts_state_stats(s, &st);
	for (int r = 0; r < TS_STATE_SKIP_COUNT; r++)
		json_object_set_new(skipped, ts_state_skip_name(r), json_integer((json_int_t)st.skipped[r]));
	ts_error_clear(&err);
	/* the marked arrays (first page of 1000: a listing, not an export) */
	if (ts_catalog_list(s->env->catalog, NULL, 1000, keep_marked, NULL, &page, &n, &more,
	                    &err) == TS_OK) {
		for (size_t i = 0; i < n; i++)
			json_array_append_new(arrays, json_string(ts_array_name(page[i])));
		ts_catalog_list_free(page, n);
	}
	n = ms ? ts_model_registry_list(s->env->models, ms, MODELS_MAX) : 0;
	for (size_t i = 0; i < n; i++)
		if (ms[i].persist)
			json_array_append_new(models, json_string(ms[i].name));
	free(ms);
	o = json_pack("{s:s, s:I, s:I, s:I, s:I, s:{s:I, s:I}, s:o, s:o, s:o, s:b}",
	              "dir", s->dir, "generation", (json_int_t)st.generation,
	              "saves", (json_int_t)st.saves, "save_failures", (json_int_t)st.save_failures,
	              "last_save_bytes", (json_int_t)st.last_save_bytes,
	              "restored", "arrays", (json_int_t)st.restored_arrays,
	              "models", (json_int_t)st.restored_models, "restore_skipped", skipped,
	              "arrays", arrays, "models", models, "arrays_truncated", more);
	if (o && st.last_save_wall_ns) {
		char ts[40];
		time_t t = (time_t)(st.last_save_wall_ns / 1000000000ull);
		struct tm tm;

		gmtime_r(&t, &tm);
		strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
		json_object_set_new(o, "last_save_time", json_string(ts));
	}
	return o;
}
