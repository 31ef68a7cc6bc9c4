/*
 * render.c - what the core's objects look like as JSON: a sharding, an
 * array's metadata, a plan's analysis, a model's spec and state. Handlers
 * answer with these, and jobs leave them as their operations' results, so
 * they live below both.
 */
#include "jobs/render.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/units.h"
#include "formats/dtype.h"

/* ---- shardings ------------------------------------------------------------------------ */

static json_t *spec_entry_json(const struct ts_mesh *m, const struct ts_spec_entry *e)
{
	json_t *list;

	if (e->naxes == 0)
		return json_null();
	if (e->naxes == 1)
		return json_string(m->axis_names[e->axes[0]]);
	list = json_array();
	for (int i = 0; list && i < e->naxes; i++)
		if (json_array_append_new(list, json_string(m->axis_names[e->axes[i]])) != 0) {
			json_decref(list);
			return NULL;
		}
	return list;
}

static json_t *mesh_json(const struct ts_mesh *m)
{
	json_t *devs = json_array(), *names = json_array(), *shape = json_array(), *o;
	bool ok = devs && names && shape;

	for (int k = 0; ok && k < m->ndevices; k++)
		ok = json_array_append_new(devs, json_string(ts_device_props(m->devices[k])->id)) == 0;
	for (int a = 0; ok && a < m->naxes; a++)
		ok = json_array_append_new(names, json_string(m->axis_names[a])) == 0 &&
		     json_array_append_new(shape, json_integer(m->shape[a])) == 0;
	o = ok ? json_object() : NULL;
	if (o && (json_object_set(o, "devices", devs) != 0 ||
	          json_object_set(o, "axis_names", names) != 0 ||
	          json_object_set(o, "shape", shape) != 0)) {
		json_decref(o);
		o = NULL;
	}
	json_decref(devs);
	json_decref(names);
	json_decref(shape);
	return o;
}

json_t *ts_render_sharding(const struct ts_sharding *s)
{
	json_t *o = json_object(), *spec = NULL, *mesh = NULL;
	bool ok = o != NULL;

	if (ok && s->type == TS_SHARDING_SINGLE) {
		ok = json_object_set_new(o, "device", json_string(ts_device_props(s->device)->id)) == 0;
	} else if (ok) {
		mesh = mesh_json(&s->mesh);
		spec = json_array();
		ok = mesh && spec;
		for (int d = 0; ok && d < s->spec_rank; d++)
			ok = json_array_append_new(spec, spec_entry_json(&s->mesh, &s->spec[d])) == 0;
		ok = ok && json_object_set(o, "mesh", mesh) == 0 && json_object_set(o, "spec", spec) == 0;
	}
	ok = ok && json_object_set_new(o, "memory_kind",
	                               json_string(ts_memory_kind_name(s->memory_kind))) == 0;
	json_decref(mesh);
	json_decref(spec);
	if (!ok) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static json_t *time_json(uint64_t ns)
{
	char buf[48];

	ts_format_rfc3339(buf, sizeof buf, ns);
	return json_string(buf);
}

static json_t *shape_json(int rank, const uint64_t *shape)
{
	json_t *a = json_array();

	for (int i = 0; a && i < rank; i++)
		json_array_append_new(a, json_integer((json_int_t)shape[i]));
	return a;
}

json_t *ts_render_shards(const struct ts_array *a)
{
	const struct ts_array_desc *d = ts_array_desc(a);
	const char *kind = ts_memory_kind_name(ts_array_placement(a)->sharding.memory_kind);
	json_t *list = json_array();

	for (int i = 0; list && i < ts_array_nshards(a); i++) {
		const struct ts_shard_box *b = ts_array_box(a, i);
		json_t *index = json_array();

		for (int k = 0; index && k < d->rank; k++)
			json_array_append_new(index, json_pack("[I, I]", (json_int_t)b->start[k],
			                                       (json_int_t)(b->start[k] + b->count[k])));
		json_array_append_new(list, json_pack("{s:s, s:s, s:o*, s:i, s:I}",
		                                      "device", ts_device_props(b->device)->id,
		                                      "memory_kind", kind, "index", index,
		                                      "replica", b->replica,
		                                      "nbytes", (json_int_t)ts_buffer_size(
		                                              ts_array_shard_buffer(a, i))));
	}
	return list;
}

json_t *ts_render_array(const struct ts_array *a)
{
	const struct ts_array_desc *d = ts_array_desc(a);
	const struct ts_placement *p = ts_array_placement(a);
	json_t *o;

	o = json_pack("{s:s, s:s, s:o*, s:I, s:o*, s:b, s:o*, s:I, s:s, s:o*, s:o*}",
	              "name", ts_array_name(a), "dtype", ts_dtype_name(d->dtype),
	              "shape", shape_json(d->rank, d->shape), "nbytes", (json_int_t)d->nbytes,
	              "sharding", ts_render_sharding(&p->sharding),
	              "committed", p->committed,
	              "shards", ts_render_shards(a),
	              "version", (json_int_t)ts_array_version(a), "etag", ts_array_etag(a),
	              "create_time", time_json(ts_array_created_ns(a)),
	              "update_time", time_json(ts_array_updated_ns(a)));
	if (o)
		json_object_set_new(o, "implicit_transfer_bytes",
		                    json_integer((json_int_t)ts_array_implicit_bytes(a)));
	if (o)
		json_object_set_new(o, "persist", json_boolean(ts_array_persisted(a)));
	/* a copy: the version's metadata is its own (storage/array.h), and a
	 * reference here would be counted on this thread while others count
	 * theirs */
	if (o && ts_array_metadata(a) &&
	    json_object_set_new(o, "metadata", json_deep_copy(ts_array_metadata(a))) != 0) {
		json_decref(o);
		o = NULL;
	}
	return o;
}

json_t *ts_render_optimizer(const struct ts_optimizer *o)
{
	json_t *j = json_pack("{s:s, s:f, s:f, s:f, s:f}", "type", ts_optimizer_name(o),
	                      "b1", (double)o->b1, "b2", (double)o->b2, "eps", (double)o->eps,
	                      "clip_global_norm", (double)o->clip_global_norm);

	if (!j)
		return NULL;
	if (o->adamw) {
		json_object_set_new(j, "weight_decay", json_real((double)o->weight_decay));
		json_object_set_new(j, "decay", json_string(o->decay_matrices ? "matrices" : "all"));
	}
	if (o->schedule.type == TS_SCHED_WARMUP_COSINE)
		json_object_set_new(j, "schedule",
		                    json_pack("{s:s, s:f, s:f, s:I, s:I, s:f}", "type", "warmup_cosine_decay",
		                              "init_value", (double)o->schedule.init_value,
		                              "peak_value", (double)o->schedule.peak_value,
		                              "warmup_steps", (json_int_t)o->schedule.warmup_steps,
		                              "decay_steps", (json_int_t)o->schedule.decay_steps,
		                              "end_value", (double)o->schedule.end_value));
	else
		json_object_set_new(j, "learning_rate", json_real((double)o->learning_rate));
	return j;
}

json_t *ts_render_model_spec(const struct ts_model *m)
{
	json_t *save = json_array(), *offload = json_array();

	if (m->policy.save_x)
		json_array_append_new(save, json_string("x"));
	if (m->policy.save_h)
		json_array_append_new(save, json_string("h"));
	if (m->policy.offload_x)
		json_array_append_new(offload, json_string("x"));
	if (m->policy.offload_h)
		json_array_append_new(offload, json_string("h"));
	for (int a = 0; a < TS_GPT_NACTS; a++) {
		if (m->policy.save_acts & (1u << a))
			json_array_append_new(save, json_string(ts_gpt_act_name((enum ts_gpt_act)a)));
		if (m->policy.offload_acts & (1u << a))
			json_array_append_new(offload, json_string(ts_gpt_act_name((enum ts_gpt_act)a)));
	}
	json_t *o = json_pack("{s:s, s:{s:i, s:i, s:i, s:s, s:b}, s:s, s:s, s:o*,"
	                 " s:{s:s, s:s, s:s, s:{s:o, s:o}, s:i}, s:I}",
	                 "name", m->name, "mlp", "layers", m->mlp.layers, "d_model", m->mlp.d_model,
	                 "d_hidden", m->mlp.d_hidden, "activation", ts_act_name(m->mlp.act),
	                 "residual", m->mlp.residual, "dtype", ts_compute_name(m->mlp.compute),
	                 "loss", ts_loss_name(m->mlp.loss), "optimizer", ts_render_optimizer(&m->opt),
	                 "placement", "device", ts_device_props(m->device)->id,
	                 "params", ts_memory_kind_name(m->policy.params),
	                 "opt_state", ts_memory_kind_name(m->policy.opt_state),
	                 "activations", "save", save, "offload", offload,
	                 "prefetch_depth", m->policy.prefetch_depth, "steps", (json_int_t)m->steps);

	if (o && m->replicas > 1) {
		/* data parallel: every device a replica is on, the first the device */
		json_t *devs = json_array();

		for (int k = 0; devs && k < m->replicas; k++)
			json_array_append_new(devs, json_string(ts_device_props(m->replica_devs[k])->id));
		json_object_set_new(json_object_get(o, "placement"), "devices", devs);
		if (m->shard_optimizer)
			json_object_set_new(json_object_get(o, "placement"), "shard_optimizer",
			                    m->shard_gradients ? json_string("gradients") : json_true());
	}
	if (o && m->mlp.gpt) {
		/* the GPT kind: its own section instead of the MLP's, no loss (always
		 * next-token cross-entropy) */
		json_object_del(o, "mlp");
		json_object_del(o, "loss");
		json_object_set_new(o, "gpt", json_pack("{s:i, s:i, s:i, s:i, s:i, s:i}",
		                                        "vocab", m->mlp.vocab, "context",
		                                        m->mlp.context, "layers", m->mlp.layers,
		                                        "d_model", m->mlp.d_model, "heads",
		                                        m->mlp.heads, "d_ff", m->mlp.d_hidden));
		return o;
	}
	if (o && ts_mlp_tokens(&m->mlp)) {
		json_t *mlp = json_object_get(o, "mlp");

		json_object_set_new(mlp, "vocab", json_integer(m->mlp.vocab));
		json_object_set_new(mlp, "projection", json_boolean(m->mlp.proj));
	}
	return o;
}

static json_t *model_arrays_json(const struct ts_model *m)
{
	json_t *o = ts_render_model_spec(m), *arrays = json_object();
	char name[256];

	for (size_t i = 0; i < TS_MODEL_NROLES; i++) {
		if (!ts_model_has_role(m, ts_model_roles[i]))
			continue;
		ts_model_array_name(m, ts_model_roles[i], name, sizeof name);
		json_object_set_new(arrays, strchr(name, '.') + 1, json_string(name));
	}
	if (o)
		json_object_set_new(o, "arrays", arrays);
	else
		json_decref(arrays);
	return o;
}

/* model_arrays_json with "state" (CREATING while its creation runs, with the
 * operation's id, then READY). */
json_t *ts_render_model(const struct ts_model *m)
{
	json_t *o = model_arrays_json(m);

	if (o) {
		json_object_set_new(o, "state", json_string(m->ready ? "READY" : "CREATING"));
		json_object_set_new(o, "persist", json_boolean(m->persist));
		if (!m->ready && m->creating[0])
			json_object_set_new(o, "creating_operation", json_string(m->creating));
	}
	return o;
}

/* The device temp whose allocation or free action i is, or -1: the
 * timeline has one point for each, in action order. */
static int device_temp_change(const struct ts_plan *p, int i)
{
	const struct ts_paction *a = &p->actions[i];

	if ((a->op != TS_P_ALLOC && a->op != TS_P_FREE) || a->a < 0 ||
	    p->bufs[a->a].kind != TS_MEM_DEVICE)
		return -1;
	return a->a;
}

/* Names on each point of the timeline the change it follows: which temp
 * ("buffer", the plan's index), allocated or freed, and where it lies in the
 * device arena ("offset", "bytes"), so that a viewer can draw every temp's
 * lifetime at its place and see the peak. Left out if the points and the
 * changes do not pair up. */
static void add_temp_events(const struct ts_plan *p, json_t *t)
{
	int pt = 0;

	for (int i = 0; i < p->nactions; i++)
		if (device_temp_change(p, i) >= 0)
			pt++;
	if (pt != p->npoints)
		return;
	pt = 0;
	for (int i = 0; i < p->nactions; i++) {
		int b = device_temp_change(p, i);
		json_t *e;

		if (b < 0)
			continue;
		e = json_array_get(t, (size_t)pt++);
		json_object_set_new(e, "event",
		                    json_string(p->actions[i].op == TS_P_ALLOC ? "alloc" : "free"));
		json_object_set_new(e, "buffer", json_integer(b));
		json_object_set_new(e, "offset", json_integer((json_int_t)p->bufs[b].offset));
		json_object_set_new(e, "bytes", json_integer((json_int_t)p->bufs[b].bytes));
	}
}

json_t *ts_render_plan(const struct ts_plan *p, bool timeline)
{
	json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
	                      "argument_size_in_bytes", (json_int_t)p->argument_size_in_bytes,
	                      "output_size_in_bytes", (json_int_t)p->output_size_in_bytes,
	                      "alias_size_in_bytes", (json_int_t)p->alias_size_in_bytes,
	                      "temp_size_in_bytes", (json_int_t)p->temp_size_in_bytes,
	                      "host_argument_size_in_bytes", (json_int_t)p->host_argument_size_in_bytes,
	                      "host_output_size_in_bytes", (json_int_t)p->host_output_size_in_bytes,
	                      "host_alias_size_in_bytes", (json_int_t)p->host_alias_size_in_bytes,
	                      "host_temp_size_in_bytes", (json_int_t)p->host_temp_size_in_bytes,
	                      "host_version_size_in_bytes", (json_int_t)p->host_version_size_in_bytes,
	                      "host_journal_size_in_bytes", (json_int_t)p->host_journal_size_in_bytes,
	                      "peak_device_bytes", (json_int_t)p->peak_device_bytes,
	                      "h2d_bytes", (json_int_t)p->h2d_bytes,
	                      "d2h_bytes", (json_int_t)p->d2h_bytes);

	if (o && p->accumulate > 1)          /* a step of that many micro-batches */
		json_object_set_new(o, "accumulate", json_integer(p->accumulate));
	if (o && p->replicas > 1) {
		/* data parallel: every figure above is each device's; the gradients
		 * all-reduced on each, a step */
		json_object_set_new(o, "replicas", json_integer(p->replicas));
		json_object_set_new(o, "all_reduce_bytes",
		                    json_integer((json_int_t)p->all_reduce_bytes));
	}
	if (o && timeline) {
		json_t *t = json_array();

		for (int i = 0; t && i < p->npoints; i++)
			json_array_append_new(t, json_pack("{s:s, s:i, s:I}", "phase", p->points[i].phase,
			                                   "layer", p->points[i].layer,
			                                   "live_device_bytes", (json_int_t)p->points[i].live));
		if (t)
			add_temp_events(p, t);
		json_object_set_new(o, "timeline", t);
	}
	return o;
}
