/*
 * fuzz_model_spec.c - libFuzzer target for the model spec of POST /v1/models
 * and the placement policy of :analyze / :step: the input is parsed as any
 * JSON value and handed to ts_job_model_parse against a fake core of two
 * simulated devices, and to ts_job_policy_parse. A refusal must carry a known
 * code, a reason and a message; a model that parses must satisfy the limits
 * the parser promises (a valid name, sizes in range, a device, a policy
 * that checks, a schedule whose steps are ordered), and its rendering
 * (ts_render_model_spec, what a checkpoint carries) must parse back to the
 * same model.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "handlers/api.h"
#include "jobs/model_spec.h"
#include "storage/array.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The fake core, built on the first input and kept for the process. */
static const struct ts_core *fake_core(void)
{
	static struct ts_core core;
	static bool ready;
	struct ts_device_config dc = {.sim_devices = 2, .sim_device_memory = 1ull << 20,
	                              .cuda = false, .host = "fuzz"};
	struct ts_error err;

	if (ready)
		return &core;
	ts_error_clear(&err);
	if (ts_device_set_new(&dc, &core.env.devices, &err) != TS_OK)
		abort();
	core.default_device = ts_device_set_find(core.env.devices, "sim:0");
	core.default_memory_kind = TS_MEM_DEVICE;
	ready = true;
	return &core;
}

static void check_failure(ts_status st, const struct ts_error *err)
{
	if (st != err->status || !err->message[0] || !err->reason[0])
		abort();
	if (st != TS_INVALID_ARGUMENT && st != TS_UNIMPLEMENTED)
		abort();
}

static void check_model(const struct ts_model *m, const struct ts_model_init *in)
{
	struct ts_error err;

	if (!ts_array_name_valid(m->name) || strlen(m->name) > TS_MODEL_NAME_MAX)
		abort();
	if (m->mlp.layers < 1 || m->mlp.layers > 4096 || m->mlp.d_model < 1 ||
	    m->mlp.d_model > 65536 || m->mlp.d_hidden < 0 || m->mlp.d_hidden > 65536)
		abort();
	if (!m->device || !(m->opt.learning_rate > 0) || m->opt.b1 < 0 || m->opt.b1 >= 1 ||
	    m->opt.b2 < 0 || m->opt.b2 >= 1)
		abort();
	ts_error_clear(&err);
	if (ts_policy_check(&m->policy, &err) != TS_OK)
		abort();
	if (m->opt.schedule.type == TS_SCHED_WARMUP_COSINE &&
	    (m->opt.schedule.warmup_steps < 0 ||
	     m->opt.schedule.decay_steps <= m->opt.schedule.warmup_steps ||
	     !(m->opt.schedule.peak_value > 0)))
		abort();
	if (m->opt.adamw && (m->opt.type != TS_OPT_ADAM || !(m->opt.weight_decay >= 0)))
		abort();
	if (m->steps > 1000000000ull)
		abort();
	(void)in;
}

/* The rendered spec parses back to the same model. */
static void check_round_trip(const struct ts_core *core, const struct ts_model *m)
{
	json_t *spec = ts_render_model_spec(m);
	struct ts_model back;
	struct ts_model_init init;
	struct ts_error err;
	const struct ts_optimizer *a = &m->opt, *b = &back.opt;

	if (!spec)
		abort();
	ts_error_clear(&err);
	if (ts_job_model_parse(&core->env, core->default_device, spec, &back, &init, &err) != TS_OK)
		abort();
	if (strcmp(back.name, m->name) != 0 || back.steps != m->steps || back.device != m->device ||
	    memcmp(&back.mlp, &m->mlp, sizeof m->mlp) != 0 || a->type != b->type ||
	    a->adamw != b->adamw || a->learning_rate != b->learning_rate || a->b1 != b->b1 ||
	    a->b2 != b->b2 || a->eps != b->eps || a->clip_global_norm != b->clip_global_norm ||
	    a->weight_decay != b->weight_decay || a->schedule.type != b->schedule.type ||
	    a->schedule.init_value != b->schedule.init_value ||
	    a->schedule.peak_value != b->schedule.peak_value ||
	    a->schedule.end_value != b->schedule.end_value ||
	    a->schedule.warmup_steps != b->schedule.warmup_steps ||
	    a->schedule.decay_steps != b->schedule.decay_steps ||
	    back.policy.params != m->policy.params || back.policy.opt_state != m->policy.opt_state ||
	    back.policy.save_x != m->policy.save_x || back.policy.save_h != m->policy.save_h ||
	    back.policy.offload_x != m->policy.offload_x ||
	    back.policy.offload_h != m->policy.offload_h ||
	    back.policy.save_acts != m->policy.save_acts ||
	    back.policy.offload_acts != m->policy.offload_acts ||
	    back.policy.prefetch_depth != m->policy.prefetch_depth)
		abort();
	json_decref(spec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct ts_core *core = fake_core();
	struct ts_model m;
	struct ts_model_init init;
	struct ts_policy p = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE, .save_x = true,
	                      .save_h = true};
	struct ts_error err;
	json_error_t jerr;
	json_t *j;
	ts_status st;

	j = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
	if (!j)
		return 0;
	ts_error_clear(&err);
	st = ts_job_model_parse(&core->env, core->default_device, j, &m, &init, &err);
	if (st != TS_OK)
		check_failure(st, &err);
	else {
		check_model(&m, &init);
		check_round_trip(core, &m);
	}
	ts_error_clear(&err);
	st = ts_job_policy_parse(j, &p, &err);
	if (st != TS_OK)
		check_failure(st, &err);
	else if (ts_policy_check(&p, &err) != TS_OK)
		abort();
	json_decref(j);
	return 0;
}
