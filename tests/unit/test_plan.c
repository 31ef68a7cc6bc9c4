/*
 * test_plan.c - the step planner: the JAX host-offloading guide's
 * configurations (argument and output sizes equal the guide's; temp never
 * above it with prefetch_depth 0), the 4-layer 7168x7168 Adam model under
 * the guide's 4.59 GB / 2.87 GB, and schedule invariants (every buffer
 * allocated is freed once, used only while live; copies and waits paired);
 * mixed-precision plans round both operands of every product into counted
 * 2-byte temps.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/unit.h"
#include "train/plan.h"

#define MiB (1024.0 * 1024.0)

static const struct ts_mlp guide = {.layers = 10, .d_model = 256, .d_hidden = 1024,
                                    .act = TS_ACT_RELU, .residual = false, .loss = TS_LOSS_SUM};
static const struct ts_optimizer grads_only = {.type = TS_OPT_NONE};

static struct ts_policy policy(bool params_host, bool offload_x, int prefetch)
{
	struct ts_policy p = {.params = params_host ? TS_MEM_PINNED_HOST : TS_MEM_DEVICE,
	                      .opt_state = TS_MEM_DEVICE, .prefetch_depth = prefetch};

	if (offload_x) {
		p.offload_x = true;             /* h recomputed */
	} else {
		p.save_x = true;
		p.save_h = true;
	}
	return p;
}

/*
 * The arenas: every temp lies inside the arena of its kind at an aligned
 * offset, and two temps alive at the same time never overlap; the timeline
 * peaks at the analysis' peak. Versioned arguments are the updated ones on
 * pinned_host; journaled ones the device ones a copy follows after the
 * first update, laid out in the journal.
 */
static void check_arena(const struct ts_plan *p)
{
	int *live = calloc((size_t)p->nbufs + 1, sizeof *live), n = 0;
	uint64_t peak = 0, journal = 0;

	ck_assert_ptr_nonnull(live);
	for (int i = 0; i < p->nactions; i++) {
		const struct ts_paction *a = &p->actions[i];
		const struct ts_pbuf *b;

		if (a->op != TS_P_ALLOC && a->op != TS_P_FREE)
			continue;
		b = &p->bufs[a->a];
		if (a->op == TS_P_FREE) {
			for (int j = 0; j < n; j++)
				if (live[j] == a->a)
					live[j] = live[--n];
			continue;
		}
		ck_assert_uint_eq(b->offset % TS_PLAN_ALIGN, 0);
		ck_assert_uint_le(b->offset + b->bytes, b->kind == TS_MEM_DEVICE ?
		                  p->temp_size_in_bytes : p->host_temp_size_in_bytes);
		for (int j = 0; j < n; j++) {
			const struct ts_pbuf *o = &p->bufs[live[j]];

			if (o->kind != b->kind)
				continue;
			ck_assert_msg(o->offset + o->bytes <= b->offset || b->offset + b->bytes <= o->offset,
			              "action %d: buffer %d [%llu, +%llu) overlaps live buffer %d [%llu, +%llu)",
			              i, a->a, (unsigned long long)b->offset, (unsigned long long)b->bytes,
			              live[j], (unsigned long long)o->offset, (unsigned long long)o->bytes);
		}
		live[n++] = a->a;
	}
	for (int i = 0; i < p->npoints; i++)
		if (p->points[i].live > peak)
			peak = p->points[i].live;
	ck_assert_uint_eq(peak, p->peak_device_bytes);
	for (int i = 0; i < p->nbufs; i++) {
		const struct ts_pbuf *b = &p->bufs[i];
		bool updated = p->opt.type != TS_OPT_NONE && b->cls == TS_PB_ARGUMENT &&
		               ts_role_state(b->role);

		ck_assert(!b->versioned || (updated && b->kind == TS_MEM_PINNED_HOST));
		ck_assert(!updated || b->kind == TS_MEM_DEVICE || b->versioned);
		ck_assert(!b->journaled || (updated && b->kind == TS_MEM_DEVICE));
		if (b->journaled) {
			ck_assert_uint_le(b->offset + b->bytes, p->host_journal_size_in_bytes);
			journal += b->bytes;
		}
	}
	ck_assert_uint_le(journal, p->host_journal_size_in_bytes);
	free(live);
}

/* Every temp is allocated once and freed once, and only live buffers are used. */
static void check_schedule(const struct ts_plan *p)
{
	int *state = calloc((size_t)p->nbufs, sizeof *state);   /* 0 new, 1 live, 2 freed */

	for (int i = 0; i < p->nbufs; i++)
		if (p->bufs[i].cls != TS_PB_TEMP)
			state[i] = 1;
	for (int i = 0; i < p->nactions; i++) {
		const struct ts_paction *a = &p->actions[i];
		int used[5] = {a->a, a->b, a->c, a->d, a->e};

		if (a->op == TS_P_ALLOC) {
			ck_assert_msg(state[a->a] == 0, "action %d allocates buffer %d twice", i, a->a);
			state[a->a] = 1;
			continue;
		}
		if (a->op == TS_P_FREE) {
			ck_assert_msg(state[a->a] == 1, "action %d frees buffer %d not live", i, a->a);
			state[a->a] = 2;
			continue;
		}
		for (int k = 0; k < 5; k++)
			if (used[k] >= 0)
				ck_assert_msg(state[used[k]] == 1, "action %d (op %d, %s layer %d) uses "
				              "buffer %d (role %d) not live", i, a->op, a->phase, a->layer,
				              used[k], p->bufs[used[k]].role);
		if (a->op == TS_P_COPY) {
			ck_assert(p->bufs[a->a].kind != p->bufs[a->b].kind);
			ck_assert_uint_le(a->aoff + a->bytes, p->bufs[a->a].bytes);
			ck_assert_uint_le(a->boff + a->bytes, p->bufs[a->b].bytes);
			ck_assert_int_eq(p->actions[i + 1].op, TS_P_WAIT);
		}
		if (a->op == TS_P_GEMM || a->op == TS_P_GEMM_LP) {
			uint64_t e = a->op == TS_P_GEMM ? 4 : 2;     /* operand element bytes */

			ck_assert_uint_le(a->coff + (uint64_t)a->M * a->N * 4, p->bufs[a->c].bytes);
			ck_assert_uint_le(a->aoff + (uint64_t)a->M * a->K * e, p->bufs[a->a].bytes);
			ck_assert_uint_le(a->boff + (uint64_t)a->K * a->N * e, p->bufs[a->b].bytes);
			/* compute touches device memory only */
			ck_assert_int_eq(p->bufs[a->a].kind, TS_MEM_DEVICE);
			ck_assert_int_eq(p->bufs[a->b].kind, TS_MEM_DEVICE);
			ck_assert_int_eq(p->bufs[a->c].kind, TS_MEM_DEVICE);
		}
	}
	for (int i = 0; i < p->nbufs; i++)
		if (p->bufs[i].cls == TS_PB_TEMP)
			ck_assert_msg(state[i] == 2, "buffer %d (role %d) never freed", i, p->bufs[i].role);
	ck_assert_int_gt(p->npoints, 0);
	ck_assert_uint_eq(p->points[p->npoints - 1].live,
	                  p->argument_size_in_bytes + p->output_size_in_bytes);
	check_arena(p);
	free(state);
}

static void plan_guide(bool params_host, bool offload_x, int prefetch, struct ts_plan *p)
{
	struct ts_policy pol = policy(params_host, offload_x, prefetch);
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_plan_build(&guide, &grads_only, 256, &pol, p, &err) == TS_OK, "%s",
	              err.message);
	check_schedule(p);
	fprintf(stderr, "guide params_host=%d offload_x=%d prefetch=%d: argument %.2f MiB, "
	                "output %.2f MiB, temp %.2f MiB, host argument %.2f MiB, host temp %.2f MiB, "
	                "peak %.2f MiB, h2d %.2f MiB, d2h %.2f MiB\n",
	        params_host, offload_x, prefetch, p->argument_size_in_bytes / MiB,
	        p->output_size_in_bytes / MiB, p->temp_size_in_bytes / MiB,
	        p->host_argument_size_in_bytes / MiB, p->host_temp_size_in_bytes / MiB,
	        p->peak_device_bytes / MiB, p->h2d_bytes / MiB, p->d2h_bytes / MiB);
}

START_TEST(test_guide_no_offload)
{
	struct ts_plan p;

	plan_guide(false, false, 0, &p);
	ck_assert_uint_eq(p.argument_size_in_bytes, (uint64_t)(20.25 * MiB));
	ck_assert_uint_eq(p.output_size_in_bytes, (uint64_t)(20 * MiB));
	ck_assert_uint_eq(p.alias_size_in_bytes, 0);
	ck_assert_uint_le(p.temp_size_in_bytes, (uint64_t)(17.25 * MiB));
	ck_assert_uint_eq(p.h2d_bytes, 0);
	ck_assert_uint_eq(p.d2h_bytes, 0);
	ck_assert_uint_eq(p.peak_device_bytes,
	                  p.argument_size_in_bytes + p.output_size_in_bytes + p.temp_size_in_bytes);
	ts_plan_release(&p);
}
END_TEST

START_TEST(test_guide_params_offloaded)
{
	struct ts_plan p;

	plan_guide(true, false, 0, &p);
	ck_assert_uint_eq(p.argument_size_in_bytes, (uint64_t)(0.25 * MiB));
	ck_assert_uint_eq(p.host_argument_size_in_bytes, (uint64_t)(20 * MiB));
	ck_assert_uint_eq(p.output_size_in_bytes, (uint64_t)(20 * MiB));
	ck_assert_uint_le(p.temp_size_in_bytes, (uint64_t)(17.25 * MiB));
	/* every layer's weights come in twice (forward, backward) */
	ck_assert_uint_eq(p.h2d_bytes, (uint64_t)(40 * MiB));
	ts_plan_release(&p);
	plan_guide(true, false, 1, &p);
	ck_assert_uint_eq(p.argument_size_in_bytes, (uint64_t)(0.25 * MiB));
	/* prefetching, the last layer's stay from its forward into the
	 * backward pass: in once */
	ck_assert_uint_eq(p.h2d_bytes, (uint64_t)(38 * MiB));
	ts_plan_release(&p);
}
END_TEST

START_TEST(test_guide_activations_offloaded)
{
	struct ts_plan p;

	plan_guide(false, true, 0, &p);
	ck_assert_uint_eq(p.argument_size_in_bytes, (uint64_t)(20.25 * MiB));
	ck_assert_uint_eq(p.output_size_in_bytes, (uint64_t)(20 * MiB));
	ck_assert_uint_le(p.temp_size_in_bytes, (uint64_t)(6.50 * MiB));
	/* x_1..x_9 go out and come back */
	ck_assert_uint_eq(p.d2h_bytes, (uint64_t)(9 * 0.25 * MiB));
	ck_assert_uint_eq(p.h2d_bytes, (uint64_t)(9 * 0.25 * MiB));
	ck_assert_uint_eq(p.host_temp_size_in_bytes, (uint64_t)(9 * 0.25 * MiB));
	ts_plan_release(&p);
}
END_TEST

START_TEST(test_guide_both_offloaded)
{
	struct ts_plan p;

	plan_guide(true, true, 0, &p);
	ck_assert_uint_eq(p.argument_size_in_bytes, (uint64_t)(0.25 * MiB));
	ck_assert_uint_le(p.temp_size_in_bytes, (uint64_t)(4.75 * MiB));
	ts_plan_release(&p);
	plan_guide(true, true, 1, &p);     /* reported, not bounded by the guide */
	ts_plan_release(&p);
}
END_TEST

START_TEST(test_big_adam_model)
{
	/* 4 layers of 7168 x 7168 (no hidden width: one matrix per layer) with Adam */
	struct ts_mlp m = {.layers = 4, .d_model = 7168, .d_hidden = 0, .act = TS_ACT_RELU,
	                   .loss = TS_LOSS_SUM};
	struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-3f, .b1 = 0.9f,
	                            .b2 = 0.999f, .eps = 1e-8f};
	struct ts_policy on_dev = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                           .save_x = true, .save_h = true};
	struct ts_policy opt_host = on_dev;
	struct ts_plan p;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_plan_build(&m, &adam, 128, &on_dev, &p, &err), TS_OK);
	check_schedule(&p);
	fprintf(stderr, "7168x7168 adam: peak %.3f GB\n", p.peak_device_bytes / 1e9);
	ck_assert_uint_le(p.peak_device_bytes, 4590000000ull);
	ck_assert_uint_eq(p.alias_size_in_bytes, 3ull * 4 * 7168 * 7168 * 4);
	ts_plan_release(&p);
	opt_host.opt_state = TS_MEM_PINNED_HOST;
	ck_assert_int_eq(ts_plan_build(&m, &adam, 128, &opt_host, &p, &err), TS_OK);
	check_schedule(&p);
	fprintf(stderr, "7168x7168 adam, opt state on host: peak %.3f GB\n", p.peak_device_bytes / 1e9);
	ck_assert_uint_le(p.peak_device_bytes, 2870000000ull);
	ck_assert_uint_eq(p.host_argument_size_in_bytes, 2ull * 4 * 7168 * 7168 * 4);
	ts_plan_release(&p);
}
END_TEST

START_TEST(test_every_policy_is_consistent)
{
	static const enum ts_act acts[] = {TS_ACT_NONE, TS_ACT_GELU};

	for (int mask = 0; mask < 64; mask++) {
		struct ts_policy pol = {
			.params = mask & 1 ? TS_MEM_PINNED_HOST : TS_MEM_DEVICE,
			.opt_state = mask & 2 ? TS_MEM_PINNED_HOST : TS_MEM_DEVICE,
			.save_x = (mask >> 2) % 3 == 1, .offload_x = (mask >> 2) % 3 == 2,
			.save_h = mask & 16, .offload_h = !(mask & 16) && (mask & 32),
			.prefetch_depth = (mask >> 5) & 1,
		};
		for (int w2 = 0; w2 < 2; w2++) {
			struct ts_mlp m = {.layers = 5, .d_model = 8, .d_hidden = w2 ? 12 : 0,
			                   .act = acts[w2], .residual = mask & 8,
			                   .loss = mask & 4 ? TS_LOSS_MSE : TS_LOSS_SUM};
			struct ts_optimizer o = {.type = (enum ts_opt)(mask % 3), .learning_rate = 0.1f,
			                         .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f,
			                         .clip_global_norm = mask & 1 ? 1.0f : 0.0f};
			struct ts_plan p;
			struct ts_error err;

			ts_error_clear(&err);
			if (ts_policy_check(&pol, &err) != TS_OK)
				continue;
			ck_assert_msg(ts_plan_build(&m, &o, 3, &pol, &p, &err) == TS_OK, "%s", err.message);
			check_schedule(&p);
			ts_plan_release(&p);
		}
	}
}
END_TEST

START_TEST(test_policy_refusals)
{
	struct ts_policy both = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                         .save_x = true, .offload_x = true};
	struct ts_policy bad_kind = {.params = TS_MEM_UNPINNED_HOST, .opt_state = TS_MEM_DEVICE};
	struct ts_policy bad_depth = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                              .prefetch_depth = 2};
	struct ts_plan p;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_plan_build(&guide, &grads_only, 256, &both, &p, &err), TS_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(err.message, "exclusive"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_policy_check(&bad_kind, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_policy_check(&bad_depth, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_plan_build(&guide, &grads_only, 0, &bad_depth, &p, &err),
	                 TS_INVALID_ARGUMENT);
}
END_TEST

/* ---- a GPT's activations by name --------------------------------------------------- */

/* A GPT of 3 blocks: vocab 37, windows of 8 tokens, width 16, 4 heads, d_ff
 * 48; batches of 2 windows. */
static const struct ts_mlp gpt = {.layers = 3, .d_model = 16, .d_hidden = 48,
                                  .act = TS_ACT_GELU, .loss = TS_LOSS_XENT, .vocab = 37,
                                  .id_bytes = 4, .gpt = true, .heads = 4, .context = 8};
#define GPT_B 2u

static uint64_t aligned(uint64_t n)
{
	return (n + TS_PLAN_ALIGN - 1) / TS_PLAN_ALIGN * TS_PLAN_ALIGN;
}

/* One block's intermediate n in bytes, as docs/API.md's table counts it;
 * with arena, as its buffers take the arena (each aligned: a LayerNorm's
 * output and its statistics are two). */
static uint64_t act_bytes(enum ts_gpt_act n, bool arena)
{
	uint64_t T = (uint64_t)gpt.context, N = GPT_B * T, d = (uint64_t)gpt.d_model;
	uint64_t F = (uint64_t)gpt.d_hidden, H = (uint64_t)gpt.heads, one;

	switch (n) {
	case TS_GPT_A_LN1:
	case TS_GPT_A_LN2:
		return arena ? aligned(N * d * 4) + aligned(2 * N * 4) : (N * d + 2 * N) * 4;
	case TS_GPT_A_QKV:
		one = 3 * N * d * 4;
		break;
	case TS_GPT_A_ATTN:
		one = GPT_B * H * T * T * 4;
		break;
	case TS_GPT_A_ATTN_OUT:
	case TS_GPT_A_RESID:
		one = N * d * 4;
		break;
	default:
		one = N * F * 4;
		break;
	}
	return arena ? aligned(one) : one;
}

static void plan_gpt(const struct ts_policy *pol, struct ts_plan *p)
{
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_plan_build(&gpt, &grads_only, (int)GPT_B * gpt.context, pol, p, &err) ==
	              TS_OK, "%s", err.message);
	check_arena(p);
}

/* Each name offloaded alone holds its bytes of every block on pinned_host
 * (all blocks' at the end of the forward pass; each buffer aligned in the
 * arena) and moves them once each way; "h" all of them but mlp_act's. */
START_TEST(test_gpt_offloaded_names_cost_their_bytes)
{
	struct ts_policy base = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                         .save_x = true};
	struct ts_plan b, p;
	uint64_t L = (uint64_t)gpt.layers, h = 0, hm = 0;

	plan_gpt(&base, &b);
	ck_assert_uint_eq(b.host_temp_size_in_bytes, 0);
	for (int n = 0; n < TS_GPT_NACTS; n++) {
		struct ts_policy pol = base;
		uint64_t want = L * act_bytes((enum ts_gpt_act)n, false);
		uint64_t held = L * act_bytes((enum ts_gpt_act)n, true);

		pol.offload_acts = 1u << n;
		plan_gpt(&pol, &p);
		ck_assert_msg(p.host_temp_size_in_bytes == held && p.h2d_bytes - b.h2d_bytes == want &&
		              p.d2h_bytes - b.d2h_bytes == want,
		              "%s: host temp %llu, h2d +%llu, d2h +%llu; want %llu, %llu moved",
		              ts_gpt_act_name((enum ts_gpt_act)n),
		              (unsigned long long)p.host_temp_size_in_bytes,
		              (unsigned long long)(p.h2d_bytes - b.h2d_bytes),
		              (unsigned long long)(p.d2h_bytes - b.d2h_bytes),
		              (unsigned long long)held, (unsigned long long)want);
		if (TS_GPT_ACTS_H & (1u << n)) {
			h += held;
			hm += want;
		}
		ts_plan_release(&p);
	}
	base.offload_h = true;
	plan_gpt(&base, &p);
	ck_assert_uint_eq(p.host_temp_size_in_bytes, h);
	ck_assert_uint_eq(p.h2d_bytes - b.h2d_bytes, hm);
	ts_plan_release(&p);
	ts_plan_release(&b);
}
END_TEST

/* ---- evaluation: the forward pass and the loss only ---------------------------- */

/* L layers of d 64, h 128 on 8 rows: x 2 KiB, h 4 KiB, w1/w2 32 KiB each. */
#define EX 2048u
#define EH 4096u
#define EW 32768u

static const struct ts_mlp small_mse = {.layers = 3, .d_model = 64, .d_hidden = 128,
                                        .act = TS_ACT_GELU, .residual = true,
                                        .loss = TS_LOSS_MSE};

static void plan_eval(const struct ts_mlp *m, bool params_host, int prefetch, bool outputs,
                      enum ts_memory_kind kind, struct ts_plan *p)
{
	struct ts_policy pol = policy(params_host, false, prefetch);
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_plan_build_eval(m, 8, &pol, outputs, kind, p, &err) == TS_OK, "%s",
	              err.message);
	ck_assert(p->evaluate);
	check_schedule(p);
	/* forward only: no backward kernel, no update, nothing aliased; the loss
	 * kernel's gradient is freed right after it */
	for (int i = 0; i < p->nactions; i++) {
		const struct ts_paction *a = &p->actions[i];

		ck_assert_int_ne(a->op, TS_P_ACT_BWD);
		ck_assert_int_ne(a->op, TS_P_UPDATE);
		ck_assert_int_ne(a->op, TS_P_SUMSQ);
		if (a->op == TS_P_LOSS) {
			ck_assert_int_eq(p->bufs[a->d].role, TS_ROLE_G);
			ck_assert_int_eq(p->actions[i + 2].op, TS_P_FREE);
			ck_assert_int_eq(p->actions[i + 2].a, a->d);
		}
	}
	for (int i = 0; i < p->nbufs; i++) {
		ck_assert_int_ne(p->bufs[i].role, TS_ROLE_GX);
		ck_assert_int_ne(p->bufs[i].role, TS_ROLE_GRAD_W1);
		ck_assert_int_ne(p->bufs[i].role, TS_ROLE_GRAD_W2);
		ck_assert(p->bufs[i].role > TS_ROLE_NU_W2 || p->bufs[i].role < TS_ROLE_MU_W1);
		ck_assert(!p->bufs[i].versioned && !p->bufs[i].journaled);
	}
	ck_assert_uint_eq(p->alias_size_in_bytes, 0);
	ck_assert_uint_eq(p->host_alias_size_in_bytes, 0);
	ck_assert_uint_eq(p->host_version_size_in_bytes, 0);
	ck_assert_uint_eq(p->host_journal_size_in_bytes, 0);
}

/* Params on the device: arguments are w1, w2, inputs, targets; the temps
 * peak in a middle layer at its input, h and output (x + h + x). */
START_TEST(test_eval_params_on_device)
{
	struct ts_plan p;

	plan_eval(&small_mse, false, 0, false, TS_MEM_DEVICE, &p);
	ck_assert_uint_eq(p.argument_size_in_bytes, 2 * 3 * EW + 2 * EX);
	ck_assert_uint_eq(p.output_size_in_bytes, 0);
	ck_assert_uint_eq(p.temp_size_in_bytes, EX + EH + EX);
	ck_assert_uint_eq(p.peak_device_bytes, 2 * 3 * EW + 2 * EX + EX + EH + EX);
	ck_assert_uint_eq(p.host_argument_size_in_bytes, 0);
	ck_assert_uint_eq(p.host_temp_size_in_bytes, 0);
	ck_assert_uint_eq(p.h2d_bytes, 0);
	ck_assert_uint_eq(p.d2h_bytes, 0);
	ts_plan_release(&p);
}
END_TEST

/* Params on pinned_host: each layer's w1 and w2 come in once (h2d = all of
 * them), and with prefetch_depth 1 the next layer's are there too. */
START_TEST(test_eval_params_streamed)
{
	struct ts_plan p;

	plan_eval(&small_mse, true, 0, false, TS_MEM_DEVICE, &p);
	ck_assert_uint_eq(p.argument_size_in_bytes, 2 * EX);
	ck_assert_uint_eq(p.host_argument_size_in_bytes, 2 * 3 * EW);
	ck_assert_uint_eq(p.temp_size_in_bytes, 2 * EW + EX + EH + EX);
	ck_assert_uint_eq(p.h2d_bytes, 2 * 3 * EW);
	ck_assert_uint_eq(p.d2h_bytes, 0);
	ck_assert_uint_eq(p.peak_device_bytes, 2 * EX + 2 * EW + EX + EH + EX);
	ts_plan_release(&p);
	plan_eval(&small_mse, true, 1, false, TS_MEM_DEVICE, &p);
	ck_assert_uint_eq(p.temp_size_in_bytes, 4 * EW + EX + EH + EX);
	ck_assert_uint_eq(p.h2d_bytes, 2 * 3 * EW);
	ts_plan_release(&p);
}
END_TEST

/* Outputs on the device are written by the last layer (an output, no
 * temp); on pinned_host they are copied out of the last layer's temp. */
START_TEST(test_eval_outputs)
{
	struct ts_mlp two = small_mse;
	struct ts_plan p;

	two.layers = 2;
	plan_eval(&two, false, 0, true, TS_MEM_DEVICE, &p);
	ck_assert_uint_eq(p.argument_size_in_bytes, 2 * 2 * EW + 2 * EX);
	ck_assert_uint_eq(p.output_size_in_bytes, EX);
	ck_assert_uint_eq(p.temp_size_in_bytes, EH + EX);      /* layer 0: h, x_1; layer 1: x_1, h */
	ck_assert_uint_eq(p.peak_device_bytes, 2 * 2 * EW + 2 * EX + EX + EH + EX);
	ck_assert_uint_eq(p.d2h_bytes, 0);
	ts_plan_release(&p);
	plan_eval(&two, false, 0, true, TS_MEM_PINNED_HOST, &p);
	ck_assert_uint_eq(p.output_size_in_bytes, 0);
	ck_assert_uint_eq(p.host_output_size_in_bytes, EX);
	ck_assert_uint_eq(p.temp_size_in_bytes, EX + EH + EX);
	ck_assert_uint_eq(p.d2h_bytes, EX);
	ck_assert_uint_eq(p.h2d_bytes, 0);
	ts_plan_release(&p);
}
END_TEST

/* An evaluation never needs more device memory than a step of the same
 * model (it keeps no residual and no gradient), under any policy; the
 * refusals are the step's. */
START_TEST(test_eval_below_step)
{
	static const struct ts_mlp models[] = {
		{.layers = 4, .d_model = 64, .d_hidden = 128, .act = TS_ACT_RELU, .loss = TS_LOSS_SUM},
		{.layers = 3, .d_model = 64, .d_hidden = 0, .act = TS_ACT_TANH, .residual = true,
		 .loss = TS_LOSS_MSE},
		{.layers = 1, .d_model = 32, .d_hidden = 96, .act = TS_ACT_GELU, .loss = TS_LOSS_MSE},
	};
	struct ts_policy bad = {.params = TS_MEM_UNPINNED_HOST, .opt_state = TS_MEM_DEVICE};
	struct ts_error err;
	struct ts_plan p, q;

	for (size_t m = 0; m < sizeof models / sizeof models[0]; m++)
		for (int host = 0; host < 2; host++)
			for (int pre = 0; pre < 2; pre++) {
				struct ts_policy pol = policy(host, false, pre);

				plan_eval(&models[m], host, pre, m == 1, host ? TS_MEM_PINNED_HOST :
				          TS_MEM_DEVICE, &p);
				ts_error_clear(&err);
				ck_assert(ts_plan_build(&models[m], &grads_only, 8, &pol, &q, &err) == TS_OK);
				ck_assert_uint_lt(p.temp_size_in_bytes, q.temp_size_in_bytes);
				ck_assert_uint_le(p.peak_device_bytes, q.peak_device_bytes);
				ts_plan_release(&p);
				ts_plan_release(&q);
			}
	ts_error_clear(&err);
	ck_assert_int_eq(ts_plan_build_eval(&small_mse, 8, &bad, false, TS_MEM_DEVICE, &p, &err),
	                 TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_plan_build_eval(&small_mse, 0, &(struct ts_policy){0}, false,
	                                    TS_MEM_DEVICE, &p, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_plan_build_eval(&small_mse, 8, &(struct ts_policy){0}, true,
	                                    TS_MEM_UNPINNED_HOST, &p, &err), TS_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(err.message, "unpinned_host"));
}
END_TEST

/* A token model's evaluation (8 tokens of uint16 ids, vocab 100, with a
 * projection): the table and projection are arguments where params are, x_0
 * is gathered, the logits [8, 100] are the outputs (written by the
 * projection when on the device), the step's cross-entropy gives the loss;
 * no gradient of the table or the projection, no scatter. */
START_TEST(test_eval_tokens)
{
	struct ts_mlp tok = small_mse;
	const uint64_t EE = 100u * 64u * 4u, LG = 8u * 100u * 4u, ID = 8u * 2u;
	struct ts_policy pol = policy(false, false, 0);
	struct ts_error err;
	struct ts_plan p, q;
	int xent = -1, gathers = 0;

	tok.vocab = 100;
	tok.proj = true;
	tok.id_bytes = 2;
	tok.loss = TS_LOSS_XENT;
	plan_eval(&tok, false, 0, true, TS_MEM_DEVICE, &p);
	for (int i = 0; i < p.nactions; i++) {
		ck_assert_int_ne(p.actions[i].op, TS_P_EMBED_BWD);
		ck_assert_int_ne(p.actions[i].op, TS_P_LOSS);
		gathers += p.actions[i].op == TS_P_EMBED_FWD;
		if (p.actions[i].op == TS_P_XENT)
			xent = i;
	}
	ck_assert_int_eq(gathers, 1);
	ck_assert_int_ge(xent, 0);
	ck_assert_int_eq(p.bufs[p.actions[xent].a].role, TS_ROLE_OUTPUT);
	ck_assert_int_eq(p.bufs[p.actions[xent].b].role, TS_ROLE_TARGET);
	for (int i = 0; i < p.nbufs; i++) {
		ck_assert_int_ne(p.bufs[i].role, TS_ROLE_GRAD_EMBED);
		ck_assert_int_ne(p.bufs[i].role, TS_ROLE_GRAD_PROJ);
		ck_assert(p.bufs[i].role < TS_ROLE_MU_EMBED || p.bufs[i].role > TS_ROLE_NU_PROJ);
	}
	ck_assert_uint_eq(p.argument_size_in_bytes, 2 * 3 * EW + 2 * EE + 2 * ID);
	ck_assert_uint_eq(p.output_size_in_bytes, LG);
	ck_assert_uint_eq(p.d2h_bytes, 0);
	ck_assert_uint_eq(p.h2d_bytes, 0);
	ts_plan_release(&p);
	/* params streamed, logits to pinned_host: copied out once */
	plan_eval(&tok, true, 1, true, TS_MEM_PINNED_HOST, &p);
	ck_assert_uint_eq(p.argument_size_in_bytes, 2 * ID);
	ck_assert_uint_eq(p.host_argument_size_in_bytes, 2 * 3 * EW + 2 * EE);
	ck_assert_uint_eq(p.h2d_bytes, 2 * 3 * EW + 2 * EE);
	ck_assert_uint_eq(p.host_output_size_in_bytes, LG);
	ck_assert_uint_eq(p.d2h_bytes, LG);
	/* below the step's */
	ts_error_clear(&err);
	pol = policy(true, false, 1);
	ck_assert(ts_plan_build(&tok, &grads_only, 8, &pol, &q, &err) == TS_OK);
	ck_assert_uint_le(p.peak_device_bytes, q.peak_device_bytes);
	ts_plan_release(&p);
	ts_plan_release(&q);
	/* without a projection the logits are x_L (d_model == vocab) */
	tok.proj = false;
	tok.vocab = 64;
	plan_eval(&tok, false, 0, true, TS_MEM_DEVICE, &p);
	ck_assert_uint_eq(p.output_size_in_bytes, 8u * 64u * 4u);
	ck_assert_uint_eq(p.argument_size_in_bytes, 2 * 3 * EW + 64u * 64u * 4u + 2 * ID);
	ts_plan_release(&p);
	/* a token model without its loss is refused */
	tok.loss = TS_LOSS_MSE;
	ts_error_clear(&err);
	ck_assert_int_eq(ts_plan_build_eval(&tok, 8, &pol, false, TS_MEM_DEVICE, &p, &err),
	                 TS_INVALID_ARGUMENT);
}
END_TEST

/* ---- mixed precision --------------------------------------------------------------- */

/*
 * A bfloat16 / float16 plan is the float32 plan with every GEMM replaced by
 * ALLOC ra, ROUND a -> ra, ALLOC rb, ROUND b -> rb, GEMM_LP, FREE ra, FREE rb:
 * ra and rb device temps of role LOWP holding op(A) [M, K] and op(B) [K, N]
 * at 2 bytes an element. Returns the largest pair's bytes.
 */
static uint64_t check_lowp(const struct ts_plan *lp, const struct ts_plan *f32)
{
	int ngemm = 0, nlp = 0, nlowp = 0;
	uint64_t pair = 0;

	for (int i = 0; i < f32->nactions; i++)
		ngemm += f32->actions[i].op == TS_P_GEMM;
	for (int i = 0; i < lp->nbufs; i++)
		nlowp += lp->bufs[i].role == TS_ROLE_LOWP;
	for (int i = 0; i < lp->nactions; i++) {
		const struct ts_paction *a = &lp->actions[i], *w;
		uint64_t mk, kn;

		ck_assert_msg(a->op != TS_P_GEMM, "action %d: a float32 gemm in a %s plan", i,
		              ts_compute_name(lp->mlp.compute));
		if (a->op != TS_P_GEMM_LP)
			continue;
		nlp++;
		ck_assert_int_ge(i, 4);
		ck_assert_int_lt(i + 2, lp->nactions);
		mk = (uint64_t)a->M * (uint64_t)a->K;
		kn = (uint64_t)a->K * (uint64_t)a->N;
		w = &lp->actions[i - 4];
		ck_assert(w[0].op == TS_P_ALLOC && w[0].a == a->a);
		ck_assert(w[1].op == TS_P_ROUND && w[1].b == a->a && w[1].n == mk);
		ck_assert(w[2].op == TS_P_ALLOC && w[2].a == a->b);
		ck_assert(w[3].op == TS_P_ROUND && w[3].b == a->b && w[3].n == kn);
		ck_assert(w[5].op == TS_P_FREE && w[5].a == a->a);
		ck_assert(w[6].op == TS_P_FREE && w[6].a == a->b);
		ck_assert_int_eq(lp->bufs[a->a].role, TS_ROLE_LOWP);
		ck_assert_int_eq(lp->bufs[a->b].role, TS_ROLE_LOWP);
		ck_assert_int_eq(lp->bufs[a->a].cls, TS_PB_TEMP);
		ck_assert_int_eq(lp->bufs[a->a].kind, TS_MEM_DEVICE);
		ck_assert_uint_eq(lp->bufs[a->a].bytes, 2 * mk);
		ck_assert_uint_eq(lp->bufs[a->b].bytes, 2 * kn);
		ck_assert_uint_eq(a->aoff + a->boff, 0);
		/* what is rounded is float32 device memory */
		ck_assert_int_eq(lp->bufs[w[1].a].kind, TS_MEM_DEVICE);
		ck_assert_int_ne(lp->bufs[w[1].a].role, TS_ROLE_LOWP);
		if (2 * (mk + kn) > pair)
			pair = 2 * (mk + kn);
	}
	ck_assert_int_eq(nlp, ngemm);
	ck_assert_int_eq(nlowp, 2 * ngemm);
	/* master weights, gradients and optimizer state stay float32 */
	ck_assert_uint_eq(lp->argument_size_in_bytes, f32->argument_size_in_bytes);
	ck_assert_uint_eq(lp->output_size_in_bytes, f32->output_size_in_bytes);
	ck_assert_uint_eq(lp->alias_size_in_bytes, f32->alias_size_in_bytes);
	ck_assert_uint_eq(lp->host_argument_size_in_bytes, f32->host_argument_size_in_bytes);
	ck_assert_uint_eq(lp->h2d_bytes, f32->h2d_bytes);
	ck_assert_uint_eq(lp->d2h_bytes, f32->d2h_bytes);
	/* the copies are temps in the arena (check_arena: placed, never over a
	 * live buffer): it holds them, growing at most by the largest pair (each
	 * lives around one product) plus the alignment; small ones may fit in
	 * its holes */
	ck_assert_uint_ge(lp->temp_size_in_bytes, f32->temp_size_in_bytes);
	ck_assert_uint_le(lp->temp_size_in_bytes,
	                  f32->temp_size_in_bytes + pair + 2 * TS_PLAN_ALIGN);
	ck_assert_uint_eq(lp->peak_device_bytes, lp->argument_size_in_bytes +
	                  lp->output_size_in_bytes + lp->temp_size_in_bytes);
	return pair;
}

START_TEST(test_lowp_guide_counts_the_copies)
{
	struct ts_mlp m = guide;
	struct ts_plan f, lp;
	struct ts_error err;

	for (int c = 0; c < 2; c++)
		for (int k = 0; k < 4; k++) {
			struct ts_policy pol = policy(k & 1, k & 2, 0);
			uint64_t pair;

			ts_error_clear(&err);
			m.compute = TS_COMPUTE_F32;
			ck_assert_int_eq(ts_plan_build(&m, &grads_only, 256, &pol, &f, &err), TS_OK);
			m.compute = c ? TS_COMPUTE_F16 : TS_COMPUTE_BF16;
			ck_assert_int_eq(ts_plan_build(&m, &grads_only, 256, &pol, &lp, &err), TS_OK);
			check_schedule(&lp);
			pair = check_lowp(&lp, &f);
			ck_assert_uint_gt(lp.temp_size_in_bytes, f.temp_size_in_bytes);
			/* the guide's largest product reads h [256, 1024] and w2 [1024, 256] */
			ck_assert_uint_eq(pair, 2ull * (256 * 1024 + 1024 * 256));
			fprintf(stderr, "guide %s params_host=%d offload_x=%d: temp %.4f MiB "
			        "(float32 %.4f MiB), peak %.4f MiB\n", ts_compute_name(m.compute), k & 1,
			        (k >> 1) & 1, lp.temp_size_in_bytes / MiB, f.temp_size_in_bytes / MiB,
			        lp.peak_device_bytes / MiB);
			ts_plan_release(&f);
			ts_plan_release(&lp);
		}
}
END_TEST

/* Every policy, with Adam and clipping, a token model with its projection,
 * and evaluations: each product rounds its operands. */
START_TEST(test_lowp_every_plan_rounds_every_product)
{
	struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 0.1f, .b1 = 0.9f,
	                            .b2 = 0.999f, .eps = 1e-8f, .clip_global_norm = 1.0f};
	struct ts_mlp tok = {.layers = 2, .d_model = 8, .d_hidden = 16, .act = TS_ACT_GELU,
	                     .residual = true, .loss = TS_LOSS_XENT, .vocab = 40, .proj = true,
	                     .id_bytes = 2};
	struct ts_mlp mlp = {.layers = 3, .d_model = 8, .d_hidden = 12, .act = TS_ACT_TANH,
	                     .residual = true, .loss = TS_LOSS_MSE};
	struct ts_plan f, lp;
	struct ts_error err;

	for (int mask = 0; mask < 36; mask++) {
		struct ts_policy pol = {
			.params = mask & 1 ? TS_MEM_PINNED_HOST : TS_MEM_DEVICE,
			.opt_state = mask & 2 ? TS_MEM_PINNED_HOST : TS_MEM_DEVICE,
			.save_x = (mask >> 2) % 3 == 1, .offload_x = (mask >> 2) % 3 == 2,
			.save_h = (mask / 12) % 3 == 1, .offload_h = (mask / 12) % 3 == 2,
			.prefetch_depth = mask & 1,
		};
		for (int t = 0; t < 2; t++) {
			struct ts_mlp m = t ? tok : mlp;
			const struct ts_optimizer *o = mask & 2 ? &adam : &grads_only;

			ts_error_clear(&err);
			ck_assert_int_eq(ts_plan_build(&m, o, 4, &pol, &f, &err), TS_OK);
			m.compute = mask % 2 ? TS_COMPUTE_F16 : TS_COMPUTE_BF16;
			ck_assert_int_eq(ts_plan_build(&m, o, 4, &pol, &lp, &err), TS_OK);
			check_schedule(&lp);
			check_lowp(&lp, &f);
			ts_plan_release(&f);
			ts_plan_release(&lp);
			if (t)
				continue;           /* evaluations of plain MLPs */
			m.compute = TS_COMPUTE_F32;
			ck_assert_msg(ts_plan_build_eval(&m, 4, &pol, true, TS_MEM_DEVICE, &f, &err) == TS_OK,
			              "%s", err.message);
			m.compute = TS_COMPUTE_BF16;
			ck_assert_msg(ts_plan_build_eval(&m, 4, &pol, true, TS_MEM_DEVICE, &lp, &err) == TS_OK,
			              "%s", err.message);
			check_schedule(&lp);
			check_lowp(&lp, &f);
			ts_plan_release(&f);
			ts_plan_release(&lp);
		}
	}
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("plan");
	TCase *tc = tcase_create("planner");

	tcase_add_test(tc, test_guide_no_offload);
	tcase_add_test(tc, test_guide_params_offloaded);
	tcase_add_test(tc, test_guide_activations_offloaded);
	tcase_add_test(tc, test_guide_both_offloaded);
	tcase_add_test(tc, test_big_adam_model);
	tcase_add_test(tc, test_every_policy_is_consistent);
	tcase_add_test(tc, test_policy_refusals);
	tcase_add_test(tc, test_gpt_offloaded_names_cost_their_bytes);
	tcase_add_test(tc, test_eval_params_on_device);
	tcase_add_test(tc, test_eval_params_streamed);
	tcase_add_test(tc, test_eval_outputs);
	tcase_add_test(tc, test_eval_below_step);
	tcase_add_test(tc, test_eval_tokens);
	tcase_add_test(tc, test_lowp_guide_counts_the_copies);
	tcase_add_test(tc, test_lowp_every_plan_rounds_every_product);
	suite_add_tcase(s, tc);
	return s;
}
