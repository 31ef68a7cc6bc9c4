/*
 * exec.c - the step executor: a plan's actions, in order, on one compute and
 * two copy queues (and, data parallel, a comm queue) that meet only at
 * events.
 *
 * Every buffer of the plan keeps what the three queues did to it: the job
 * number of the last use on each queue, the queue and job of the last write,
 * and an event recorded after the last copy into it. Before an action runs
 * on a queue, each operand is ordered after the other queues' work on it (a
 * read after their last write, a write after their last use) with a
 * cross-queue event wait. A FREE does not wait: the next temp placed where
 * a freed one was takes over its last uses on each queue, so that its first
 * write there is ordered after them at an event too (reuse_hazards). So the
 * host does not block on the queues while it enqueues a step (only before
 * the first UPDATE, below, and at the end): the copies of later layers are
 * on their queues while earlier kernels still run, and each queue runs as
 * far ahead as the places it writes allow. The arenas (one per
 * memory kind, of the plan's size, each temp at its planned offset), the
 * events and the queue jobs are taken before the first action: nothing after
 * it allocates, and the measured peak (the extent the temps reach) is the
 * predicted one, also while other work allocates from the same spaces.
 *
 * Atomicity: every copy and kernel before the first UPDATE is known good
 * before it is enqueued; the loss (each micro-batch's, accumulating) is
 * read back before it too, and so is the global norm when the updates wait
 * for it (clipping, accumulation); fused updates' norm is read after the
 * step succeeded, best effort. Versioned arguments (plan.h) are written to
 * new memory, so after the first UPDATE nothing can change an argument but
 * kernels, which allocate nothing. A failure anywhere leaves the arguments
 * as they were.
 *
 * A WAIT is honoured where it matters, at the first kernel that touches the
 * copied buffer: the compute queue waits on the copy's event there and not
 * earlier, so that a prefetched layer's copy overlaps the kernels enqueued
 * between. A WAIT on a buffer no kernel touches (an offloaded residual on
 * pinned_host) costs nothing; the copy is then checked by the FREE of its
 * ends and the final sync.
 *
 * Collectives (data parallel) run on each replica's comm queue when the
 * environment has one, in plan order on every replica, so they overlap the
 * kernels enqueued after them: a collective is ordered after the work on
 * its buffers like any job, and the work after it on its bytes after it.
 * The comm queue's jobs are tracked by bytes (the union of what its jobs
 * touched in a buffer): a kernel on other bytes of the buffer (the next
 * layer's slice of a gradient whose layer above is being all-reduced) does
 * not wait for them; a temp placed where a freed one was waits for every
 * collective on it (reuse_hazards), and every queue is settled before the
 * first update, the comm queue included.
 *
 * Times: on sim and cpu, host callbacks on the compute queue mark where it
 * runs kernels and where it waits for copies; on CUDA (where a host callback
 * would stall the stream) the same marks are CUDA events with timing on the
 * compute stream (ts_k_timeline), read after the final sync. A runtime
 * that cannot time events leaves compute_s and copy_wait_s 0. With a comm
 * queue its own marks (callbacks; a second timeline on CUDA) time the
 * collectives (comm_s), and the compute queue's waits for them are
 * comm_wait_s, neither busy nor copy waiting.
 *
 * Thread-safety: one run at a time per environment; the timing marks are
 * written by the compute queue's worker (the comm queue's by its own) and
 * read after the queues are synced.
 */
#include "train/exec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"

#define LOWP 2u        /* bytes of a 16-bit GEMM operand (plan.h, mixed precision) */

/* compute, host->device, device->host, collectives (data parallel) */
enum { QC = 0, QH, QD, QM, NQ };

/* What the queues did to one plan buffer. */
struct slot {
	char *ptr;                   /* memory; NULL while a temp is not live */
	char *wptr;                  /* where copies into it go: ptr, or a host
	                                argument's new version */
	struct ts_event *copied;     /* owned; recorded after the last copy into it */
	int copied_q;                /* queue of that copy, -1: none */
	uint64_t copied_seq;         /* its job number there */
	int writer;                  /* queue of the last write, -1: none */
	uint64_t write_seq;
	uint64_t use[NQ];            /* last job touching it per queue, 0: none */
	uint64_t mlo, mhi;           /* the bytes the comm queue's jobs touched (the
	                                union; empty when mhi <= mlo): the other queues'
	                                work on bytes outside needs no order after them
	                                (a gradient's layer all-reduced while the
	                                backward pass makes the layer below) */
};

/* Busy, waiting and communicating time of the compute queue, written by
 * its worker only. */
struct clock {
	uint64_t seg, w0, c0;        /* start of the open busy segment, of a wait, of a
	                                collective */
	uint64_t busy, wait, comm;   /* ns */
	bool open;
};

struct run {
	const struct ts_plan *p;
	const struct ts_exec_env *env;
	int rank;                    /* the replica this run is (0 alone) */
	struct ts_queue *q[NQ];      /* q[QM] NULL: no comm queue */
	int cq;                      /* the queue of the collectives: QM, or QC without one */
	struct ts_event *mark[NQ];   /* owned: "now" on each queue */
	uint64_t seq[NQ];            /* jobs (kernels, copies) submitted this run */
	uint64_t done[NQ];           /* jobs the host knows complete */
	uint64_t seen[NQ][NQ];       /* seen[x][y]: x has waited for y's jobs up to */
	struct slot *s;              /* owned; one per plan buffer */
	int *freed;                  /* owned: temps freed whose queues may still use their
	                                place (reuse_hazards), nfreed <= FREED_MAX of them */
	int nfreed;
	char *arena[2];              /* owned; the temps of device, of pinned_host */
	uint64_t arena_bytes[2];
	char *journal;               /* owned, pinned_host: journaled arguments before the step */
	uint64_t dev_live, host_live; /* bytes of this step's live temps */
	bool timed;                  /* marks time the compute queue */
	struct ts_k_timeline *tl;    /* owned; the marks on CUDA, else NULL */
	struct ts_k_timeline *tlm;   /* owned; the comm queue's marks on CUDA, else NULL */
	bool tl_lost;                /* a mark could not be made: no times */
	bool host_open;              /* a busy segment is open on the compute queue */
	bool updating;               /* an UPDATE was enqueued */
	int nloss;                   /* micro-batch losses on their way back */
	bool norm_read;              /* the gradients' squared norm is on its way back */
	struct clock clk;            /* the compute queue's (its comm: waiting for the
	                                comm queue, or, without one, in collectives) */
	struct clock mclk;           /* the comm queue's (comm only), its worker's */
	float *losses;               /* owned: each micro-batch's loss, read back into
	                                here by the compute queue (plan's accumulate) */
	float gnorm_sq;              /* read back into here (clipping plans) */
	struct ts_exec_result res;
};

/* ---- the compute queue's clock (runs on its worker) ---------------------- */

static void clk_open(void *arg)
{
	struct clock *c = arg;

	c->seg = ts_now_ns();
	c->open = true;
}

static void clk_close(void *arg)
{
	struct clock *c = arg;

	if (c->open)
		c->busy += ts_now_ns() - c->seg;
	c->open = false;
}

static void clk_wait_begin(void *arg)
{
	struct clock *c = arg;

	clk_close(c);
	c->w0 = ts_now_ns();
}

static void clk_wait_end(void *arg)
{
	struct clock *c = arg;

	c->wait += ts_now_ns() - c->w0;
	clk_open(c);
}

static void clk_comm_begin(void *arg)
{
	struct clock *c = arg;

	clk_close(c);
	c->c0 = ts_now_ns();
}

static void clk_comm_end(void *arg)
{
	struct clock *c = arg;

	c->comm += ts_now_ns() - c->c0;
	clk_open(c);
}

/* Enqueues a clock mark on the compute queue (no-op when untimed): a host
 * callback on sim and cpu (its job reserved), a device-timed mark on CUDA.
 * A CUDA mark that cannot be made (it may allocate) stops the timing, not
 * the step: times are best effort, the step is atomic. */
static ts_status clk_mark_on(struct run *r, int y, void (*fn)(void *), struct ts_error *err)
{
	struct ts_k_timeline *tl = y == QM ? r->tlm : r->tl;
	struct ts_error merr;
	enum ts_k_mark m;

	if (!r->timed)
		return TS_OK;
	if (!r->tl)
		return ts_queue_host_fn(r->q[y], fn, y == QM ? &r->mclk : &r->clk, err);
	if (fn == clk_open)
		m = TS_K_OPEN;
	else if (fn == clk_close)
		m = TS_K_CLOSE;
	else if (fn == clk_wait_begin)
		m = TS_K_WAIT_BEGIN;
	else if (fn == clk_wait_end)
		m = TS_K_WAIT_END;
	else if (fn == clk_comm_begin)
		m = TS_K_COMM_BEGIN;
	else
		m = TS_K_COMM_END;
	ts_error_clear(&merr);
	if (!tl || ts_k_timeline_mark(tl, r->q[y], m, &merr) != TS_OK) {
		r->timed = false;
		r->tl_lost = true;
	}
	return TS_OK;
}

/* A clock mark on the compute queue. */
static ts_status clk_mark(struct run *r, void (*fn)(void *), struct ts_error *err)
{
	return clk_mark_on(r, QC, fn, err);
}

/* ---- ordering ------------------------------------------------------------ */

/* Makes queue x wait on ev (of queue y, covering y's jobs up to upto). */
static ts_status wait_on(struct run *r, int x, int y, struct ts_event *ev, uint64_t upto,
                         struct ts_error *err)
{
	bool marked = x == QC && r->timed && !ts_event_done(ev);
	ts_status st = TS_OK;

	/* the compute queue waiting for a collective is communication, for a
	 * copy waiting */
	if (marked)
		st = clk_mark(r, y == QM ? clk_comm_begin : clk_wait_begin, err);
	if (st == TS_OK)
		st = ts_queue_wait_event(r->q[x], ev, err);
	if (st == TS_OK && x == QC && y == QM)
		r->res.comm_waits++;
	if (st == TS_OK && marked) {
		st = clk_mark(r, y == QM ? clk_comm_end : clk_wait_end, err);
		r->host_open = true;
	}
	if (st == TS_OK && upto > r->seen[x][y])
		r->seen[x][y] = upto;
	return st;
}

/*
 * Orders queue x after job u of queue y (u == 0: nothing): nothing when
 * already known complete or waited for; the buffer's copy event when it
 * covers u; else a mark recorded on y now.
 */
static ts_status order(struct run *r, int x, int y, uint64_t u, const struct slot *sl,
                       struct ts_error *err)
{
	ts_status st;

	if (x == y || u == 0 || u <= r->done[y] || u <= r->seen[x][y])
		return TS_OK;
	if (sl && sl->copied && sl->copied_q == y && sl->copied_seq >= u)
		return wait_on(r, x, y, sl->copied, sl->copied_seq, err);
	st = ts_event_record(r->mark[y], r->q[y], err);
	if (st != TS_OK)
		return st;
	return wait_on(r, x, y, r->mark[y], r->seq[y], err);
}

/* Orders queue x's next job, which touches bytes [off, off + bytes) of
 * buffer i, after the other queues' work on it: a read after their last
 * write, a write after everything they did to it (the comm queue's: where
 * the bytes meet). */
static ts_status before_use(struct run *r, int x, int i, bool write, uint64_t off,
                            uint64_t bytes, struct ts_error *err)
{
	const struct slot *sl = &r->s[i];
	ts_status st = TS_OK;

	for (int y = 0; y < NQ && st == TS_OK; y++) {
		if (y == QM && x != QM && (off >= sl->mhi || off + bytes <= sl->mlo))
			continue;
		if (write)
			st = order(r, x, y, sl->use[y], sl, err);
		else if (sl->writer == y)
			st = order(r, x, y, sl->write_seq, sl, err);
	}
	return st;
}

/* Notes that the job just submitted on x (number r->seq[x]) used buffer i. */
static void after_use(struct run *r, int x, int i, bool write)
{
	struct slot *sl = &r->s[i];

	sl->use[x] = r->seq[x];
	if (write) {
		sl->writer = x;
		sl->write_seq = r->seq[x];
	}
}

/* Blocks the host until queue y has run its jobs up to u. */
static ts_status settle(struct run *r, int y, uint64_t u, struct ts_error *err)
{
	ts_status st;

	if (u <= r->done[y])
		return TS_OK;
	if (y == QC && r->host_open) {
		st = clk_mark(r, clk_close, err);
		if (st != TS_OK)
			return st;
		r->host_open = false;
	}
	st = ts_event_record(r->mark[y], r->q[y], err);
	if (st == TS_OK)
		st = ts_event_sync(r->mark[y], err);
	if (st == TS_OK)
		r->done[y] = r->seq[y];
	return st;
}

/* ---- checks ---------------------------------------------------------------- */

static ts_status bad_plan(struct ts_error *err, int action, const char *what, int buf)
{
	return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_PLAN",
	                    "step plan action %d: %s (buffer %d)", action, what, buf);
}

/* Buffer i is live and [off, off + bytes) lies inside it. */
static ts_status need(const struct run *r, int action, int i, uint64_t off, uint64_t bytes,
                      struct ts_error *err)
{
	if (i < 0 || i >= r->p->nbufs)
		return bad_plan(err, action, "no such buffer", i);
	if (!r->s[i].ptr)
		return bad_plan(err, action, "buffer used while not allocated", i);
	if (off > r->p->bufs[i].bytes || bytes > r->p->bufs[i].bytes - off)
		return bad_plan(err, action, "range outside the buffer", i);
	return TS_OK;
}

static float *at(const struct run *r, int i, uint64_t off)
{
	return (float *)(void *)(r->s[i].ptr + off);
}

/* ---- memory ---------------------------------------------------------------- */

/* Freed temps whose queues may still use their place, at most: past it the
 * host waits for the queues to get past them all (so that placing a temp
 * scans a short list, whatever the plan's length). */
#define FREED_MAX 256

/* Whether the host knows every queue is past the last use of buffer i. */
static bool settled(const struct run *r, int i)
{
	for (int y = 0; y < NQ; y++)
		if (r->s[i].use[y] > r->done[y])
			return false;
	return true;
}

/*
 * A temp placed where freed temps were takes over their queues' last uses
 * (into use[]), so that its first write on a queue waits, on the device at
 * an event, for the other queues' work on that place, and the host never
 * blocks on a FREE. A freed temp the new one covers whole hands its uses
 * over for good (the new one carries them on); one settled is forgotten.
 */
static void reuse_hazards(struct run *r, int i, uint64_t use[NQ])
{
	const struct ts_pbuf *bf = &r->p->bufs[i];
	uint64_t lo = bf->offset, hi = bf->offset + bf->bytes;
	int k = 0;

	for (int y = 0; y < NQ; y++)
		use[y] = 0;
	for (int n = 0; n < r->nfreed; n++) {
		int j = r->freed[n];
		const struct ts_pbuf *fj = &r->p->bufs[j];
		bool keep = true;

		if (settled(r, j)) {
			keep = false;
		} else if (fj->kind == bf->kind && fj->offset < hi && lo < fj->offset + fj->bytes) {
			for (int y = 0; y < NQ; y++)
				if (r->s[j].use[y] > use[y])
					use[y] = r->s[j].use[y];
			keep = j != i && !(lo <= fj->offset && fj->offset + fj->bytes <= hi);
		}
		if (keep)
			r->freed[k++] = j;
	}
	r->nfreed = k;
}

static ts_status do_alloc(struct run *r, int action, int i, struct ts_error *err)
{
	const struct ts_pbuf *bf;
	struct slot *sl;
	struct ts_event *copied;
	uint64_t end, use[NQ];
	int k;

	if (i < 0 || i >= r->p->nbufs)
		return bad_plan(err, action, "no such buffer", i);
	bf = &r->p->bufs[i];
	sl = &r->s[i];
	if (bf->cls != TS_PB_TEMP || sl->ptr)
		return bad_plan(err, action, "allocates an argument or a live buffer", i);
	if (bf->kind != TS_MEM_DEVICE && bf->kind != TS_MEM_PINNED_HOST)
		return bad_plan(err, action, "temp neither on device nor on pinned_host", i);
	k = bf->kind == TS_MEM_DEVICE ? 0 : 1;
	end = bf->offset + bf->bytes;
	if (bf->offset % TS_PLAN_ALIGN || end < bf->offset || end > r->arena_bytes[k])
		return bad_plan(err, action, "temp outside the step's arena", i);
	reuse_hazards(r, i, use);
	copied = sl->copied;                 /* made before the run, kept */
	memset(sl, 0, sizeof *sl);
	sl->copied = copied;
	sl->ptr = sl->wptr = r->arena[k] + bf->offset;
	sl->copied_q = sl->writer = -1;
	memcpy(sl->use, use, sizeof sl->use);
	if (use[QM])                         /* the freed temps' collectives: anywhere */
		sl->mhi = UINT64_MAX;
	/* the step's own bytes: its arena's, as far as its temps reach */
	end = (end + TS_PLAN_ALIGN - 1) / TS_PLAN_ALIGN * TS_PLAN_ALIGN;
	if (bf->kind == TS_MEM_DEVICE) {
		r->dev_live += bf->bytes;
		if (end > r->res.measured_temp_peak)
			r->res.measured_temp_peak = end;
	} else {
		r->host_live += bf->bytes;
		if (end > r->res.measured_host_temp_peak)
			r->res.measured_host_temp_peak = end;
	}
	return TS_OK;
}

/* Ends a temp's life; the arena keeps the memory, and the copy event stays
 * for the next buffer there. */
static void slot_release(struct run *r, int i)
{
	struct slot *sl = &r->s[i];

	if (sl->ptr && r->p->bufs[i].cls == TS_PB_TEMP) {
		if (r->p->bufs[i].kind == TS_MEM_DEVICE)
			r->dev_live -= r->p->bufs[i].bytes;
		else
			r->host_live -= r->p->bufs[i].bytes;
	}
	sl->ptr = sl->wptr = NULL;
}

/* Reads the scalar of buffer i (the loss, the squared norm) back into
 * *dst. */
static ts_status read_scalar(struct run *r, int i, float *dst, struct ts_error *err)
{
	ts_status st;

	/* on the compute queue, right behind the kernel that wrote it (or
	 * after the collective that summed it): the temp placed where it was
	 * then waits for the forward pass only, not for the offloads queued on
	 * the d2h queue meanwhile */
	st = before_use(r, QC, i, false, 0, sizeof *dst, err);
	if (st == TS_OK)
		st = ts_queue_copy(r->q[QC], dst, r->s[i].ptr, sizeof *dst, TS_COPY_D2H, err);
	if (st != TS_OK)
		return st;
	r->seq[QC]++;
	after_use(r, QC, i, false);
	return TS_OK;
}

static ts_status do_free(struct run *r, int action, int i, struct ts_error *err)
{
	ts_status st;

	st = need(r, action, i, 0, 0, err);
	if (st != TS_OK)
		return st;
	if (r->p->bufs[i].cls != TS_PB_TEMP)
		return bad_plan(err, action, "frees an argument", i);
	/* no wait here: the next temp placed there waits for its queues */
	if (!settled(r, i)) {
		if (r->nfreed == FREED_MAX) {
			for (int y = 0; y < NQ; y++) {
				uint64_t u = 0;

				for (int n = 0; n < r->nfreed; n++)
					if (r->s[r->freed[n]].use[y] > u)
						u = r->s[r->freed[n]].use[y];
				st = settle(r, y, u, err);
				if (st != TS_OK)
					return st;
			}
			r->nfreed = 0;
		}
		r->freed[r->nfreed++] = i;
	}
	slot_release(r, i);
	return TS_OK;
}

/* ---- copies ---------------------------------------------------------------- */

static ts_status do_copy(struct run *r, int action, const struct ts_paction *a,
                         struct ts_error *err)
{
	struct slot *dst;
	enum ts_copy_kind kind;
	int x;
	ts_status st;

	st = need(r, action, a->a, a->aoff, a->bytes, err);
	if (st == TS_OK)
		st = need(r, action, a->b, a->boff, a->bytes, err);
	if (st != TS_OK)
		return st;
	if (r->p->bufs[a->a].kind == r->p->bufs[a->b].kind)
		return bad_plan(err, action, "copy between buffers of one memory kind", a->a);
	if (r->p->bufs[a->a].kind == TS_MEM_DEVICE) {
		x = QH;
		kind = TS_COPY_H2D;
		r->res.h2d_bytes += a->bytes;
	} else {
		x = QD;
		kind = TS_COPY_D2H;
		r->res.d2h_bytes += a->bytes;
	}
	st = before_use(r, x, a->b, false, a->boff, a->bytes, err);
	if (st == TS_OK)
		st = before_use(r, x, a->a, true, a->aoff, a->bytes, err);
	if (st == TS_OK)
		st = ts_queue_copy(r->q[x], r->s[a->a].wptr + a->aoff, r->s[a->b].ptr + a->boff,
		                   a->bytes, kind, err);
	if (st != TS_OK)
		return st;
	r->seq[x]++;
	after_use(r, x, a->b, false);
	after_use(r, x, a->a, true);
	dst = &r->s[a->a];
	if (!dst->copied)          /* made before the run for every copy's end */
		return bad_plan(err, action, "copy into a buffer without an event", a->a);
	st = ts_event_record(dst->copied, r->q[x], err);
	if (st != TS_OK)
		return st;
	dst->copied_q = x;
	dst->copied_seq = r->seq[x];
	return TS_OK;
}

/* ---- kernels ---------------------------------------------------------------- */

struct operand {
	int buf;                     /* -1: not used */
	uint64_t off, bytes;
	bool write, optional;
};

/*
 * The operands of each kernel, in the order they are checked: which buffer
 * of the action (a..e), which of its offsets (or none), how many bytes it
 * spans, whether the kernel writes it, and whether it may be unset (-1).
 */
enum { FA = 0, FB, FC, FD, FE, FF, FG };         /* ts_paction's a .. g */
enum { OA = 0, OB, OC, OF, OG, O0 };             /* aoff, boff, coff, foff, goff, none */
enum span {
	S_N = 0,      /* n floats */
	S_N_LOWP,     /* n 16-bit elements */
	S_SCALAR,     /* one float */
	S_N_1,        /* n + 1 floats: a cross-entropy's per-row losses and their mean */
	S_IDS,        /* n token ids */
	S_TABLE,      /* vocab x d floats */
	S_ROWS_D,     /* n x d floats */
	S_ROWS_V,     /* n x vocab floats */
	S_MK, S_KN, S_MN,             /* a GEMM's op(A), op(B) and C, floats */
	S_MK_LOWP, S_KN_LOWP,         /* the same operands rounded to 16 bits */
	/* the GPT's blocks */
	S_ROWS_W,     /* n x N floats (rows of a width) */
	S_W,          /* N floats */
	S_STATS,      /* 2 n floats: a LayerNorm's mean and rstd per row */
	S_PERIOD,     /* K x N floats */
	S_BMK, S_BKN, S_BMN,          /* n batches of a GEMM's operands */
	S_BMK_LOWP, S_BKN_LOWP,       /* the same operands rounded to 16 bits */
	S_SQ,         /* n blocks of N x N floats */
	S_N_REPLICAS, /* n floats of each replica */
	S_COUNT
};

struct operand_rule {
	unsigned char field, off, span;
	bool write, optional;
};

#define RD(f, o, s) {f, o, s, false, false}
#define WR(f, o, s) {f, o, s, true, false}

static const struct kernel_rule {
	unsigned char n;             /* operands; 0: no kernel */
	bool gemm;                   /* M, N, K must not be negative */
	struct operand_rule o[7];
} kernel_rules[] = {
	[TS_P_GEMM] = {3, true, {RD(FA, OA, S_MK), RD(FB, OB, S_KN), WR(FC, OC, S_MN)}},
	[TS_P_GEMM_LP] = {3, true, {RD(FA, OA, S_MK_LOWP), RD(FB, OB, S_KN_LOWP),
	                            WR(FC, OC, S_MN)}},
	[TS_P_ROUND] = {2, false, {RD(FA, OA, S_N), WR(FB, OB, S_N_LOWP)}},
	[TS_P_ACT_FWD] = {2, false, {RD(FA, OA, S_N), WR(FB, OB, S_N)}},
	[TS_P_ACT_BWD] = {3, false, {RD(FA, OA, S_N), RD(FB, OB, S_N), WR(FC, OC, S_N)}},
	[TS_P_ADD] = {2, false, {RD(FA, OA, S_N), WR(FB, OB, S_N)}},
	[TS_P_LOSS] = {4, false, {RD(FA, OA, S_N), {FB, OB, S_N, false, true},
	                          WR(FC, OC, S_SCALAR), WR(FD, O0, S_N)}},
	[TS_P_SUMSQ] = {2, false, {RD(FA, OA, S_N), WR(FB, OB, S_SCALAR)}},
	[TS_P_UPDATE] = {5, false, {WR(FA, OA, S_N), RD(FB, OB, S_N), {FC, OC, S_N, true, true},
	                            {FD, OC, S_N, true, true}, {FE, O0, S_SCALAR, false, true}}},
	[TS_P_FILL] = {1, false, {WR(FA, OA, S_N)}},
	[TS_P_EMBED_FWD] = {3, false, {RD(FA, OA, S_TABLE), RD(FB, OB, S_IDS),
	                               WR(FC, OC, S_ROWS_D)}},
	[TS_P_EMBED_BWD] = {3, false, {RD(FA, OA, S_ROWS_D), RD(FB, OB, S_IDS),
	                               WR(FC, OC, S_TABLE)}},
	[TS_P_XENT] = {4, false, {RD(FA, OA, S_ROWS_V), RD(FB, OB, S_IDS), WR(FC, OC, S_N_1),
	                          WR(FD, O0, S_ROWS_V)}},
	[TS_P_LN_FWD] = {5, false, {RD(FA, OA, S_ROWS_W), RD(FB, OB, S_W), RD(FC, OC, S_W),
	                            WR(FD, O0, S_ROWS_W), WR(FE, O0, S_STATS)}},
	[TS_P_LN_BWD] = {7, false, {RD(FA, OA, S_ROWS_W), RD(FB, OB, S_W), RD(FC, OC, S_STATS),
	                            RD(FD, O0, S_ROWS_W), WR(FE, O0, S_ROWS_W), WR(FF, OF, S_W),
	                            WR(FG, OG, S_W)}},
	[TS_P_ADD_ROWS] = {2, false, {RD(FA, OA, S_PERIOD), WR(FB, OB, S_ROWS_W)}},
	[TS_P_SUM_ROWS] = {2, false, {RD(FA, OA, S_ROWS_W), WR(FB, OB, S_PERIOD)}},
	[TS_P_HEADS] = {2, false, {RD(FA, OA, S_N), WR(FB, OB, S_N)}},
	[TS_P_GEMM_BATCHED] = {3, true, {RD(FA, OA, S_BMK), RD(FB, OB, S_BKN), WR(FC, OC, S_BMN)}},
	[TS_P_SOFTMAX_FWD] = {2, false, {RD(FA, OA, S_SQ), WR(FB, OB, S_SQ)}},
	[TS_P_SOFTMAX_BWD] = {3, false, {RD(FA, OA, S_SQ), RD(FB, OB, S_SQ), WR(FC, OC, S_SQ)}},
	[TS_P_GEMM_BATCHED_LP] = {3, true, {RD(FA, OA, S_BMK_LOWP), RD(FB, OB, S_BKN_LOWP),
	                                    WR(FC, OC, S_BMN)}},
	/* not kernels of one queue: the replicas' (run_collective) */
	[TS_P_ALLREDUCE] = {1, false, {WR(FA, OA, S_N)}},
	[TS_P_ALLGATHER] = {1, false, {WR(FA, OA, S_N_REPLICAS)}},
	[TS_P_REDUCE_SCATTER] = {2, false, {RD(FA, OA, S_N_REPLICAS), WR(FB, OB, S_N)}},
};

#undef RD
#undef WR

/* Action a's operands by its kernel's rule into o (room for five), *n of
 * them. INVALID_ARGUMENT (bad_plan) when a is no kernel or a GEMM with a
 * negative size. */
static ts_status kernel_operands(const struct ts_plan *p, int action, const struct ts_paction *a,
                                 struct operand *o, int *n, struct ts_error *err)
{
	const struct kernel_rule *kr;
	uint64_t f = sizeof(float), nb = a->n * f;
	uint64_t M = (uint64_t)a->M, N = (uint64_t)a->N, K = (uint64_t)a->K;
	const int bufs[] = {a->a, a->b, a->c, a->d, a->e, a->f, a->g};
	const uint64_t offs[] = {a->aoff, a->boff, a->coff, a->foff, a->goff, 0};
	uint64_t rows_w = a->n * N * f, bn = a->n;
	const uint64_t span[S_COUNT] = {
		[S_N] = nb, [S_N_LOWP] = a->n * LOWP, [S_SCALAR] = f, [S_N_1] = nb + f,
		[S_IDS] = a->n * (uint64_t)p->mlp.id_bytes,
		[S_TABLE] = (uint64_t)p->mlp.vocab * (uint64_t)p->mlp.d_model * f,
		[S_ROWS_D] = nb * (uint64_t)p->mlp.d_model, [S_ROWS_V] = nb * (uint64_t)p->mlp.vocab,
		[S_MK] = M * K * f, [S_KN] = K * N * f, [S_MN] = M * N * f,
		[S_MK_LOWP] = M * K * LOWP, [S_KN_LOWP] = K * N * LOWP,
		[S_ROWS_W] = rows_w, [S_W] = N * f, [S_STATS] = 2 * nb, [S_PERIOD] = K * N * f,
		[S_BMK] = bn * M * K * f, [S_BKN] = bn * K * N * f, [S_BMN] = bn * M * N * f,
		[S_BMK_LOWP] = bn * M * K * LOWP, [S_BKN_LOWP] = bn * K * N * LOWP,
		[S_SQ] = bn * N * N * f,
		[S_N_REPLICAS] = nb * (uint64_t)(p->replicas > 1 ? p->replicas : 1),
	};

	if ((size_t)a->op >= sizeof kernel_rules / sizeof kernel_rules[0] ||
	    !kernel_rules[a->op].n)
		return bad_plan(err, action, "unknown action", a->a);
	kr = &kernel_rules[a->op];
	if (kr->gemm && (a->M < 0 || a->N < 0 || a->K < 0))
		return bad_plan(err, action, "negative gemm size", a->c);
	for (int k = 0; k < kr->n; k++) {
		const struct operand_rule *r = &kr->o[k];

		o[k] = (struct operand){.buf = bufs[r->field], .off = offs[r->off],
		                        .bytes = span[r->span], .write = r->write,
		                        .optional = r->optional};
	}
	*n = kr->n;
	return TS_OK;
}

/* Checks the operands of a kernel and orders the compute queue after the
 * copies that touch them. */
static ts_status kernel_begin(struct run *r, int action, const struct operand *o, int n,
                              struct ts_error *err)
{
	ts_status st = TS_OK;

	for (int k = 0; k < n && st == TS_OK; k++)
		if (o[k].buf >= 0 || !o[k].optional)
			st = need(r, action, o[k].buf, o[k].off, o[k].bytes, err);
	for (int k = 0; k < n && st == TS_OK; k++)
		if (o[k].buf >= 0)
			st = before_use(r, QC, o[k].buf, o[k].write, o[k].off, o[k].bytes, err);
	if (st == TS_OK && !r->host_open) {
		st = clk_mark(r, clk_open, err);
		r->host_open = true;
	}
	return st;
}

static void kernel_end(struct run *r, const struct operand *o, int n)
{
	r->seq[QC]++;
	for (int k = 0; k < n; k++)
		if (o[k].buf >= 0)
			after_use(r, QC, o[k].buf, o[k].write);
}

/* A buffer index when set, else NULL's stand-in. */
static float *opt_at(const struct run *r, int i, uint64_t off)
{
	return i >= 0 ? at(r, i, off) : NULL;
}

/* The GPT's attention scale 1 / sqrt(hd), as a float (jnp's 1/jnp.sqrt). */
static float attention_scale(const struct ts_plan *p)
{
	return (float)(1.0 / sqrt((double)ts_gpt_head_dim(&p->mlp)));
}

/* Micro-batches of the plan's step (1 for a plan that does not accumulate). */
static int accumulate(const struct ts_plan *p)
{
	return p->accumulate > 1 ? p->accumulate : 1;
}

/* The step's loss: the mean of its micro-batches' (in order, in float32,
 * as jnp.mean of a few values), or the one loss. */
static float mean_loss(const struct run *r)
{
	float sum = 0.0f;

	if (r->nloss <= 1)
		return r->nloss ? r->losses[0] : 0.0f;
	for (int i = 0; i < r->nloss; i++)
		sum += r->losses[i];
	return sum / (float)r->nloss;
}

static ts_status do_kernel(struct run *r, int action, const struct ts_paction *a, int step,
                           struct ts_error *err)
{
	const struct ts_plan *p = r->p;
	struct ts_kernels *k = r->env->kernels;
	struct ts_queue *q = r->q[QC];
	struct ts_optimizer no_decay = p->opt;     /* a masked parameter's adamw */
	struct operand o[7];
	int n = 0;
	ts_status st;

	no_decay.weight_decay = 0.0f;
	st = kernel_operands(p, action, a, o, &n, err);
	if (st != TS_OK)
		return st;
	if (st == TS_OK && a->op == TS_P_UPDATE && a->e >= 0 && !r->norm_read) {
		/* the global norm is whole before the first update reads it; read
		 * back before the settling below, which then covers that copy too */
		st = read_scalar(r, a->e, &r->gnorm_sq, err);
		r->norm_read = st == TS_OK;
		if (st != TS_OK)
			return st;
	}
	if (a->op == TS_P_UPDATE && !r->updating) {
		/* nothing reaches the parameters before every earlier copy is
		 * known good: a failure before the update leaves them whole */
		for (int y = 0; y < NQ; y++) {
			st = settle(r, y, r->seq[y], err);
			if (st != TS_OK)
				return st;
		}
	}
	st = kernel_begin(r, action, o, n, err);
	if (st != TS_OK)
		return st;
	switch (a->op) {
	case TS_P_GEMM:
		st = ts_k_gemm(k, q, a->ta, a->tb, a->M, a->N, a->K, 1.0f, at(r, a->a, a->aoff),
		               at(r, a->b, a->boff), a->beta, at(r, a->c, a->coff), err);
		break;
	case TS_P_GEMM_LP:
		st = ts_k_gemm_lp(k, q, p->mlp.compute, a->ta, a->tb, a->M, a->N, a->K, 1.0f,
		                  (const uint16_t *)(const void *)at(r, a->a, a->aoff),
		                  (const uint16_t *)(const void *)at(r, a->b, a->boff), a->beta,
		                  at(r, a->c, a->coff), err);
		break;
	case TS_P_ROUND:
		st = ts_k_round(k, q, p->mlp.compute, at(r, a->a, a->aoff),
		                (uint16_t *)(void *)at(r, a->b, a->boff), a->n, err);
		break;
	case TS_P_ACT_FWD:
		st = ts_k_act_fwd(k, q, p->mlp.act, at(r, a->a, a->aoff), at(r, a->b, a->boff),
		                  a->n, err);
		break;
	case TS_P_ACT_BWD:
		st = ts_k_act_bwd(k, q, p->mlp.act, at(r, a->a, a->aoff), at(r, a->b, a->boff),
		                  at(r, a->c, a->coff), a->n, err);
		break;
	case TS_P_ADD:
		st = ts_k_add(k, q, at(r, a->a, a->aoff), at(r, a->b, a->boff), a->n, err);
		break;
	case TS_P_LOSS:
		st = ts_k_loss(k, q, p->mlp.loss, at(r, a->a, a->aoff), opt_at(r, a->b, a->boff),
		               at(r, a->c, a->coff), at(r, a->d, 0), a->n, err);
		break;
	case TS_P_SUMSQ:
		st = ts_k_sumsq(k, q, at(r, a->a, a->aoff), a->n, at(r, a->b, a->boff), err);
		break;
	case TS_P_UPDATE:
		st = ts_k_update(k, q, a->no_decay ? &no_decay : &p->opt, step, at(r, a->a, a->aoff),
		                 at(r, a->b, a->boff),
		                 opt_at(r, a->c, a->coff), opt_at(r, a->d, a->coff), a->n,
		                 opt_at(r, a->e, 0), err);
		r->updating = r->updating || st == TS_OK;
		break;
	case TS_P_EMBED_FWD:
		st = ts_k_embed_fwd(k, q, at(r, a->a, a->aoff), p->mlp.vocab, p->mlp.d_model,
		                    at(r, a->b, a->boff), p->mlp.id_bytes, a->n, at(r, a->c, a->coff),
		                    err);
		break;
	case TS_P_EMBED_BWD:
		st = ts_k_embed_bwd(k, q, at(r, a->b, a->boff), p->mlp.id_bytes, a->n, p->mlp.vocab,
		                    p->mlp.d_model, at(r, a->a, a->aoff), at(r, a->c, a->coff), err);
		break;
	case TS_P_XENT:
		st = ts_k_xent(k, q, at(r, a->a, a->aoff), at(r, a->b, a->boff), p->mlp.id_bytes, a->n,
		               p->mlp.vocab, at(r, a->c, a->coff), at(r, a->d, 0), err);
		break;
	case TS_P_LN_FWD:
		st = ts_k_ln_fwd(k, q, at(r, a->a, a->aoff), at(r, a->b, a->boff), at(r, a->c, a->coff),
		                 a->n, a->N, TS_GPT_LN_EPS, at(r, a->d, 0), at(r, a->e, 0), err);
		break;
	case TS_P_LN_BWD:
		st = ts_k_ln_bwd(k, q, at(r, a->a, a->aoff), at(r, a->b, a->boff), at(r, a->c, a->coff),
		                 at(r, a->d, 0), a->n, a->N, at(r, a->e, 0), at(r, a->f, a->foff),
		                 at(r, a->g, a->goff), err);
		break;
	case TS_P_ADD_ROWS:
		st = ts_k_add_rows(k, q, at(r, a->a, a->aoff), (uint64_t)a->K, at(r, a->b, a->boff),
		                   a->n, a->N, err);
		break;
	case TS_P_SUM_ROWS:
		st = ts_k_sum_rows(k, q, at(r, a->a, a->aoff), a->n, a->N, (uint64_t)a->K,
		                   at(r, a->b, a->boff), err);
		break;
	case TS_P_HEADS:
		st = ts_k_heads(k, q, !a->ta, at(r, a->a, a->aoff), at(r, a->b, a->boff), a->M, a->N,
		                a->K, p->mlp.heads, ts_gpt_head_dim(&p->mlp), err);
		break;
	case TS_P_GEMM_BATCHED:
		st = ts_k_gemm_batched(k, q, a->ta, a->tb, a->M, a->N, a->K, 1.0f, at(r, a->a, a->aoff),
		                       (uint64_t)a->M * (uint64_t)a->K, at(r, a->b, a->boff),
		                       (uint64_t)a->K * (uint64_t)a->N, a->beta, at(r, a->c, a->coff),
		                       (uint64_t)a->M * (uint64_t)a->N, (int)a->n, err);
		break;
	case TS_P_GEMM_BATCHED_LP:
		st = ts_k_gemm_batched_lp(k, q, p->mlp.compute, a->ta, a->tb, a->M, a->N, a->K, 1.0f,
		                          (const uint16_t *)(const void *)at(r, a->a, a->aoff),
		                          (uint64_t)a->M * (uint64_t)a->K,
		                          (const uint16_t *)(const void *)at(r, a->b, a->boff),
		                          (uint64_t)a->K * (uint64_t)a->N, a->beta,
		                          at(r, a->c, a->coff), (uint64_t)a->M * (uint64_t)a->N,
		                          (int)a->n, err);
		break;
	case TS_P_SOFTMAX_FWD:
		st = ts_k_softmax_causal_fwd(k, q, at(r, a->a, a->aoff), (int)a->n, a->N,
		                             attention_scale(p), at(r, a->b, a->boff), err);
		break;
	case TS_P_SOFTMAX_BWD:
		st = ts_k_softmax_causal_bwd(k, q, at(r, a->a, a->aoff), at(r, a->b, a->boff),
		                             (int)a->n, a->N, attention_scale(p), at(r, a->c, a->coff),
		                             err);
		break;
	default:    /* TS_P_FILL */
		st = ts_k_fill(k, q, at(r, a->a, a->aoff), 0.0f, a->n, err);
		break;
	}
	if (st != TS_OK)
		return st;
	kernel_end(r, o, n);
	/* each micro-batch's loss goes back at once: known good before the
	 * first update */
	if ((a->op == TS_P_LOSS || a->op == TS_P_XENT) && r->nloss < accumulate(p)) {
		st = read_scalar(r, a->c, &r->losses[r->nloss], err);
		r->nloss += st == TS_OK;
	}
	return st;
}

/* ---- the run ------------------------------------------------------------------ */

static ts_status check_env(const struct ts_plan *p, const struct ts_exec_env *env,
                           void *const *args, void *const *outs,
                           struct ts_exec_result *out, struct ts_error *err)
{
	if (!p || !env || !out || !env->kernels || !env->compute || !env->h2d || !env->d2h ||
	    !env->device_space || !env->pinned_space)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "step: no plan, result, kernels, queue or memory space");
	if (p->nbufs < 0 || p->nactions < 0 || (p->nbufs && !p->bufs) ||
	    (p->nactions && !p->actions))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_PLAN", "step: empty plan");
	/* a compute dtype the kernels cannot multiply in is refused before anything runs */
	{
		ts_status st = ts_k_lowp_check(env->kernels, p->mlp.compute, err);

		if (st != TS_OK)
			return st;
	}
	for (int i = 0; i < p->nbufs; i++) {
		if (p->bufs[i].cls == TS_PB_TEMP)
			continue;
		if (!args || !args[i])
			return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
			                    "step: no memory for argument %d (role %d)", i,
			                    (int)p->bufs[i].role);
		if (p->bufs[i].versioned && (!outs || !outs[i] || outs[i] == args[i]))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
			                    "step: no new memory for the new version of argument %d "
			                    "(role %d)", i, (int)p->bufs[i].role);
	}
	return TS_OK;
}

/*
 * Upper bounds of the queue jobs the run submits to each queue. An action
 * on queue x with m operands submits itself, for each operand a wait per
 * other queue (on the compute queue with a clock mark on each side) and on
 * each other queue a record; a FREE a record per queue (and a clock mark);
 * a copy also records its event; the loss read-back is a copy of one
 * operand; the journal a copy per journaled buffer each way.
 */
static void count_jobs(const struct ts_plan *p, int cq, size_t jobs[NQ])
{
	for (int y = 0; y < NQ; y++)
		jobs[y] = 16 + 2 * (size_t)p->nbufs;
	for (int i = 0; i < p->nactions; i++) {
		const struct ts_paction *a = &p->actions[i];
		int x, m;

		switch (a->op) {
		case TS_P_ALLOC:
		case TS_P_WAIT:
		case TS_P_PHASE:
			continue;
		case TS_P_FREE:
			for (int y = 0; y < NQ; y++)
				jobs[y] += 2;
			continue;
		case TS_P_COPY:
			x = a->a >= 0 && p->bufs[a->a].kind == TS_MEM_DEVICE ? QH : QD;
			m = 2;
			jobs[x] += 1;              /* its event */
			break;
		case TS_P_ALLREDUCE:
		case TS_P_ALLGATHER:
		case TS_P_REDUCE_SCATTER:
			x = cq;
			m = 2;
			jobs[x] += 2;                  /* its clock marks */
			break;
		case TS_P_LOSS:
		case TS_P_XENT:
		case TS_P_UPDATE:
			/* the loss's read-back, or the norm's before the first
			 * update: a copy after the other queues (waits, marks) */
			jobs[QC] += 1 + 3 * (NQ - 1);
			for (int y = 1; y < NQ; y++)
				jobs[y] += 1;
			/* fall through */
		default:
			x = QC;
			m = 5;
			break;
		}
		jobs[x] += 2 + (size_t)m * (NQ - 1) * (x == QC ? 3 : 1);
		for (int y = 0; y < NQ; y++)
			if (y != x)
				jobs[y] += (size_t)m;
	}
}

/*
 * Takes everything the run will need before its first action: the slots,
 * an event per buffer a copy writes, the queues' marks, the two arenas and
 * the queue jobs. A step that got past this cannot fail for memory.
 */
static ts_status run_init(struct run *r, void *const *args, void *const *outs,
                          struct ts_error *err)
{
	const struct ts_plan *p = r->p;
	struct ts_space *sp[2] = {r->env->device_space, r->env->pinned_space};
	uint64_t sizes[2] = {p->temp_size_in_bytes, p->host_temp_size_in_bytes};
	size_t jobs[NQ];
	ts_status st = TS_OK;

	r->q[QC] = r->env->compute;
	r->q[QH] = r->env->h2d;
	r->q[QD] = r->env->d2h;
	r->q[QM] = p->replicas > 1 ? r->env->comm : NULL;
	r->cq = r->q[QM] ? QM : QC;
	r->timed = true;
	/* a host callback would stall a CUDA stream: the device times itself */
	if (ts_device_props(ts_queue_device(r->q[QC]))->backend == TS_BACKEND_CUDA)
		r->timed = ts_k_timeline_new(r->env->kernels, &r->tl, NULL) == TS_OK &&
		           (!r->q[QM] ||
		            ts_k_timeline_new(r->env->kernels, &r->tlm, NULL) == TS_OK);
	r->s = calloc((size_t)(p->nbufs > 0 ? p->nbufs : 1), sizeof *r->s);
	r->freed = malloc(FREED_MAX * sizeof *r->freed);
	r->losses = calloc((size_t)accumulate(p), sizeof *r->losses);
	if (!r->s || !r->freed || !r->losses)
		return ts_error_oom(err, "step: out of memory for %d buffers", p->nbufs);
	for (int i = 0; i < p->nbufs; i++) {
		r->s[i].copied_q = r->s[i].writer = -1;
		if (p->bufs[i].cls == TS_PB_TEMP)
			continue;
		r->s[i].ptr = r->s[i].wptr = args[i];
		if (p->bufs[i].versioned)
			r->s[i].wptr = outs[i];                  /* read the old, write the new */
	}
	for (int i = 0; i < p->nactions && st == TS_OK; i++) {
		const struct ts_paction *a = &p->actions[i];
		struct slot *sl;

		if (a->op != TS_P_COPY || a->a < 0 || a->a >= p->nbufs)
			continue;
		sl = &r->s[a->a];
		if (!sl->copied)
			st = ts_event_new(ts_queue_device(r->q[QC]), &sl->copied, err);
	}
	for (int y = 0; y < NQ && st == TS_OK; y++)
		if (r->q[y])
			st = ts_event_new(ts_queue_device(r->q[y]), &r->mark[y], err);
	for (int k = 0; k < 2 && st == TS_OK; k++) {
		void *mem = NULL;

		if (!sizes[k])
			continue;
		st = ts_space_alloc(sp[k], sizes[k], &mem, err);
		if (st == TS_OK) {
			r->arena[k] = mem;
			r->arena_bytes[k] = sizes[k];
		}
	}
	if (st == TS_OK && p->host_journal_size_in_bytes) {
		void *mem = NULL;

		st = ts_space_alloc(sp[1], p->host_journal_size_in_bytes, &mem, err);
		r->journal = mem;
	}
	count_jobs(p, r->cq, jobs);
	for (int y = 0; y < NQ && st == TS_OK; y++)
		if (r->q[y])
			st = ts_queue_reserve(r->q[y], jobs[y], err);
	return st;
}

/* Saves the journaled arguments to the journal (on the d2h queue; known
 * good before the first update, as every copy before it). */
static ts_status journal_save(struct run *r, struct ts_error *err)
{
	const struct ts_plan *p = r->p;
	ts_status st = TS_OK;

	for (int i = 0; i < p->nbufs && st == TS_OK; i++) {
		if (!p->bufs[i].journaled)
			continue;
		st = ts_queue_copy(r->q[QD], r->journal + p->bufs[i].offset, r->s[i].ptr,
		                   p->bufs[i].bytes, TS_COPY_D2H, err);
		if (st != TS_OK)
			break;
		r->seq[QD]++;
		after_use(r, QD, i, false);
	}
	return st;
}

/*
 * After a failure past the first update (every queue synced): the
 * journaled arguments get their bytes back. A restore that fails too is
 * DATA_LOSS naming the argument (the device lost the step's weights).
 */
static ts_status journal_restore(struct run *r, struct ts_error *err)
{
	const struct ts_plan *p = r->p;
	struct ts_error rerr;
	ts_status st = TS_OK;

	ts_error_clear(&rerr);
	for (int i = 0; i < p->nbufs && st == TS_OK; i++)
		if (p->bufs[i].journaled)
			st = ts_queue_copy(r->q[QH], r->s[i].ptr, r->journal + p->bufs[i].offset,
			                   p->bufs[i].bytes, TS_COPY_H2D, &rerr);
	if (ts_queue_sync(r->q[QH], &rerr) != TS_OK || st != TS_OK) {
		ts_error_clear(err);
		return ts_error_set(err, TS_DATA_LOSS, "STEP_NOT_RESTORED",
		                    "a failed step could not restore the weights it had updated on "
		                    "%s: %s", ts_device_props(r->env->dev)->id, rerr.message);
	}
	return TS_OK;
}

/*
 * A plan with fused updates (norm_after): its global norm's temp, the first
 * allocated and the last freed, still holds the sum of squares in the
 * device arena once every queue is synced; read back now, after the step
 * succeeded, so that a failed read costs the norm (NaN), never the step.
 */
static void read_norm_after(struct run *r)
{
	const struct ts_plan *p = r->p;
	struct ts_error nerr;

	for (int i = 0; i < p->nbufs; i++) {
		const struct ts_pbuf *bf = &p->bufs[i];

		if (bf->role != TS_ROLE_NORM || bf->cls != TS_PB_TEMP || bf->kind != TS_MEM_DEVICE ||
		    !r->arena[0] || bf->offset + sizeof r->gnorm_sq > r->arena_bytes[0])
			continue;
		ts_error_clear(&nerr);
		r->norm_read = ts_queue_copy(r->q[QC], &r->gnorm_sq, r->arena[0] + bf->offset,
		                             sizeof r->gnorm_sq, TS_COPY_D2H, &nerr) == TS_OK &&
		               ts_queue_sync(r->q[QC], &nerr) == TS_OK;
		return;
	}
}

/* Waits for every queue. Keeps the first failure in err and returns the
 * outcome. */
static ts_status run_drain(struct run *r, ts_status st, struct ts_error *err)
{
	ts_status sync;

	if (r->host_open) {
		sync = clk_mark(r, clk_close, err);
		if (st == TS_OK)
			st = sync;
		r->host_open = false;
	}
	for (int y = 0; y < NQ; y++) {
		if (!r->q[y])
			continue;
		sync = ts_queue_sync(r->q[y], err);
		if (st == TS_OK)
			st = sync;
	}
	return st;
}

/* After run_drain, with the run's outcome st (every replica's): puts the
 * journaled arguments back on failure, gives back the arenas, frees the
 * events. Returns the outcome (DATA_LOSS when the journal could not be
 * restored). */
static ts_status run_finish(struct run *r, ts_status st, struct ts_error *err)
{
	struct ts_space *sp[2] = {r->env->device_space, r->env->pinned_space};
	/* a failure past the first update: the journal puts the weights back */
	if (st != TS_OK && r->updating && r->journal && journal_restore(r, err) != TS_OK)
		st = TS_DATA_LOSS;
	if (st == TS_OK && r->p->norm_after && !r->norm_read)
		read_norm_after(r);
	for (int i = 0; r->s && i < r->p->nbufs; i++) {
		slot_release(r, i);
		if (r->s[i].copied)
			ts_event_free(r->s[i].copied);
	}
	if (r->journal)
		ts_space_release(sp[1], r->journal, r->p->host_journal_size_in_bytes);
	for (int k = 0; k < 2; k++)
		if (r->arena[k])
			ts_space_release(sp[k], r->arena[k], r->arena_bytes[k]);
	for (int y = 0; y < NQ; y++)
		if (r->mark[y])
			ts_event_free(r->mark[y]);
	if (r->tl) {
		double busy, wait, comm;

		/* every mark has run: the queues are synced; a runtime that
		 * cannot time events leaves the times 0 */
		if (st == TS_OK && !r->tl_lost &&
		    ts_k_timeline_read(r->tl, &busy, &wait, &comm, NULL) == TS_OK) {
			r->clk.busy = (uint64_t)(busy * 1e9);
			r->clk.wait = (uint64_t)(wait * 1e9);
			r->clk.comm = (uint64_t)(comm * 1e9);
		}
		ts_k_timeline_free(r->tl);
		r->tl = NULL;
	}
	if (r->tlm) {
		double busy, wait, comm;

		if (st == TS_OK && !r->tl_lost &&
		    ts_k_timeline_read(r->tlm, &busy, &wait, &comm, NULL) == TS_OK)
			r->mclk.comm = (uint64_t)(comm * 1e9);
		ts_k_timeline_free(r->tlm);
		r->tlm = NULL;
	}
	if (st == TS_OK)                 /* every read-back has landed */
		r->res.loss = mean_loss(r);
	free(r->s);
	free(r->freed);
	free(r->losses);
	return st;
}

/* Action i of the plan on one replica (every kind but the collectives). */
static ts_status run_action(struct run *r, int i, int step, struct ts_error *err)
{
	const struct ts_paction *a = &r->p->actions[i];

	switch (a->op) {
	case TS_P_ALLOC:
		return do_alloc(r, i, a->a, err);
	case TS_P_FREE:
		return do_free(r, i, a->a, err);
	case TS_P_COPY:
		return do_copy(r, i, a, err);
	case TS_P_WAIT:
		/* honoured at the first kernel touching a (see the top) */
		return need(r, i, a->a, 0, 0, err);
	case TS_P_PHASE:
		return TS_OK;
	case TS_P_ALLREDUCE:
	case TS_P_ALLGATHER:
	case TS_P_REDUCE_SCATTER:
		return bad_plan(err, i, "a collective outside a data-parallel run", a->a);
	case TS_P_UPDATE:
		if (a->rank_slice) {
			/* ZeRO-1: this replica's part of the parameter and gradient
			 * (ZeRO-2: the gradient is the replica's part already) */
			struct ts_paction u = *a;
			uint64_t at = (uint64_t)r->rank * a->n * sizeof(float);

			if (r->p->replicas < 2)
				return bad_plan(err, i, "a sharded update outside a data-parallel run",
				                a->a);
			u.aoff += at;
			if (!r->p->shard_grads)
				u.boff += at;
			u.rank_slice = false;
			return do_kernel(r, i, &u, step, err);
		}
		return do_kernel(r, i, a, step, err);
	default:
		return do_kernel(r, i, a, step, err);
	}
}

/*
 * Action i, an ALLREDUCE, ALLGATHER or REDUCE_SCATTER, on every replica at
 * once: each compute queue ordered after what touches its buffers (as a
 * kernel), then one collective over all of them (device.h's ts_comm: an
 * NCCL group on CUDA, the host's in rank order on sim), which each queue
 * runs in its order.
 */
static ts_status run_collective(struct run *r, int n, struct ts_comm *comm, int i,
                                struct ts_error *err)
{
	const struct ts_paction *a = &r[0].p->actions[i];
	struct ts_queue *qs[TS_PLAN_REPLICAS_MAX];
	float *bufs[TS_PLAN_REPLICAS_MAX], *recv[TS_PLAN_REPLICAS_MAX];
	struct operand o[7];
	int no = 0;
	ts_status st = kernel_operands(r[0].p, i, a, o, &no, err);

	for (int k = 0; k < n && st == TS_OK; k++) {
		int x = r[k].cq;

		if (x == QC) {
			st = kernel_begin(&r[k], i, o, no, err);
		} else {
			/* on the comm queue: after the kernels that wrote its
			 * buffers (and anything that used what it writes); what
			 * touches them next, on any queue, waits for it in turn
			 * (before_use), and so does a temp placed where they were
			 * once freed (reuse_hazards) */
			for (int j = 0; j < no && st == TS_OK; j++)
				if (o[j].buf >= 0 || !o[j].optional)
					st = need(&r[k], i, o[j].buf, o[j].off, o[j].bytes, err);
			for (int j = 0; j < no && st == TS_OK; j++)
				if (o[j].buf >= 0)
					st = before_use(&r[k], x, o[j].buf, o[j].write, o[j].off,
					                o[j].bytes, err);
		}
		if (st == TS_OK && (r[k].p->bufs[a->a].kind != TS_MEM_DEVICE ||
		                    (a->b >= 0 && r[k].p->bufs[a->b].kind != TS_MEM_DEVICE)))
			st = bad_plan(err, i, "a collective of host memory", a->a);
		qs[k] = r[k].q[x];
		bufs[k] = st == TS_OK ? at(&r[k], a->a, a->aoff) : NULL;
		recv[k] = st == TS_OK && a->b >= 0 ? at(&r[k], a->b, a->boff) : NULL;
	}
	/* each queue's time in the collective (waiting for the others
	 * included) is its communication, not its compute */
	for (int k = 0; k < n && st == TS_OK; k++)
		st = clk_mark_on(&r[k], r[k].cq, clk_comm_begin, err);
	if (st == TS_OK && a->op == TS_P_ALLREDUCE)
		st = ts_comm_allreduce(comm, qs, bufs, a->n, err);
	else if (st == TS_OK && a->op == TS_P_ALLGATHER)
		st = ts_comm_all_gather(comm, qs, bufs, a->n, err);
	else if (st == TS_OK)
		st = ts_comm_reduce_scatter_to(comm, qs, bufs, recv, a->n, err);
	for (int k = 0; k < n && st == TS_OK; k++)
		st = clk_mark_on(&r[k], r[k].cq, clk_comm_end, err);
	for (int k = 0; k < n && st == TS_OK; k++) {
		int x = r[k].cq;

		r[k].seq[x]++;
		for (int j = 0; j < no; j++) {
			struct slot *sl;

			if (o[j].buf < 0)
				continue;
			sl = &r[k].s[o[j].buf];
			after_use(&r[k], x, o[j].buf, o[j].write);
			if (x != QM)
				continue;
			if (sl->mhi <= sl->mlo) {
				sl->mlo = o[j].off;
				sl->mhi = o[j].off + o[j].bytes;
			} else {
				sl->mlo = o[j].off < sl->mlo ? o[j].off : sl->mlo;
				sl->mhi = o[j].off + o[j].bytes > sl->mhi ? o[j].off + o[j].bytes
				                                         : sl->mhi;
			}
		}
	}
	return st;
}

/*
 * Before the first UPDATE a of any replica: every replica's global norm
 * read back (as do_kernel reads its own) and every replica's earlier copies
 * and collectives known good, so that a failure on one device leaves every
 * device's arguments whole (after it, only kernels and the journaled or
 * versioned arguments' copies run, as on one device).
 */
static ts_status settle_all(struct run *r, int n, const struct ts_paction *a,
                            struct ts_error *err)
{
	ts_status st = TS_OK;

	for (int k = 0; k < n && st == TS_OK; k++)
		if (a->e >= 0 && !r[k].norm_read) {
			st = read_scalar(&r[k], a->e, &r[k].gnorm_sq, err);
			r[k].norm_read = st == TS_OK;
		}
	for (int k = 0; k < n && st == TS_OK; k++)
		for (int y = 0; y < NQ && st == TS_OK; y++)
			st = settle(&r[k], y, r[k].seq[y], err);
	return st;
}

static ts_status check_replicas(const struct ts_plan *p, const struct ts_exec_env *envs, int n,
                                struct ts_comm *comm, void *const *const *args,
                                void *const *const *outs, struct ts_exec_result *out,
                                struct ts_error *err)
{
	int R = p && p->replicas > 1 ? p->replicas : 1;
	ts_status st = TS_OK;

	if (!p || !envs || !args || !out)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "step: no plan, environments, arguments or results");
	if (n != R)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REPLICAS",
		                    "step: the plan is for %d device(s), not %d", R, n);
	if (n > 1 && (!comm || ts_comm_size(comm) != n))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REPLICAS",
		                    "step: %d replicas need a communicator of %d devices", n, n);
	for (int k = 0; k < n && st == TS_OK; k++) {
		st = check_env(p, &envs[k], args[k], outs ? outs[k] : NULL, &out[k], err);
		if (st == TS_OK && n > 1 &&
		    ts_queue_device(envs[k].compute) != ts_comm_device(comm, k))
			st = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REPLICAS",
			                  "step: replica %d runs on '%s', the communicator's rank %d "
			                  "is '%s'", k,
			                  ts_device_props(ts_queue_device(envs[k].compute))->id, k,
			                  ts_device_props(ts_comm_device(comm, k))->id);
	}
	return st;
}

/*
 * A failure carries metadata "phase" (the phase of the action at which it
 * was noticed) and, with several replicas, "device". Every copy and kernel
 * before the first UPDATE is known good before that UPDATE is enqueued on
 * any replica, and after it only kernels run on device arguments in place
 * (a copy after it makes them versioned or journaled), so a failure
 * anywhere leaves every replica's arguments as they were. Actions run in
 * plan order, each on every replica before the next: one thread drives the
 * replicas' queues, and a collective is enqueued for all of them at once.
 */
ts_status ts_exec_run_replicas(const struct ts_plan *p, const struct ts_exec_env *envs, int n,
                               struct ts_comm *comm, void *const *const *args,
                               void *const *const *outs, int step,
                               struct ts_exec_result *out, struct ts_error *err)
{
	struct run *r;
	uint64_t t0 = ts_now_ns();
	bool updating = false;
	ts_status st;
	int i = 0, k = 0, failed = -1;

	st = check_replicas(p, envs, n, comm, args, outs, out, err);
	if (st != TS_OK)
		return st;
	r = calloc((size_t)(n > 0 ? n : 1), sizeof *r);    /* n >= 1: checked */
	if (!r)
		return ts_error_oom(err, "step: out of memory for %d replicas", n);
	for (k = 0; k < n; k++) {
		memset(&out[k], 0, sizeof out[k]);
		r[k].p = p;
		r[k].env = &envs[k];
		r[k].rank = k;
	}
	for (k = 0; k < n && st == TS_OK; k++) {
		st = run_init(&r[k], args[k], outs ? outs[k] : NULL, err);
		if (st == TS_OK)
			st = journal_save(&r[k], err);
	}
	if (st != TS_OK)
		failed = k - 1;
	for (i = 0; st == TS_OK && i < p->nactions; i++) {
		const struct ts_paction *a = &p->actions[i];

		if (a->op == TS_P_ALLREDUCE || a->op == TS_P_ALLGATHER ||
		    a->op == TS_P_REDUCE_SCATTER) {
			st = run_collective(r, n, comm, i, err);
			continue;
		}
		if (a->op == TS_P_UPDATE && !updating && n > 1) {
			st = settle_all(r, n, a, err);
			updating = true;
		}
		for (k = 0; k < n && st == TS_OK; k++) {
			st = run_action(&r[k], i, step, err);
			if (st != TS_OK)
				failed = k;
		}
	}
	/* every queue of every replica drained, and the outcome known, before
	 * any replica ends: one that failed makes the others put back what
	 * they updated (err keeps the first failure) */
	for (k = 0; k < n; k++) {
		ts_status ks = run_drain(&r[k], st, err);

		if (st == TS_OK && ks != TS_OK)
			failed = k;
		st = ks;
	}
	for (k = 0; k < n; k++) {
		ts_status ks = run_finish(&r[k], st, err);

		if (ks == TS_DATA_LOSS)
			st = ks;
	}
	if (st != TS_OK) {
		if (i > 0 && i <= p->nactions)
			ts_error_meta(err, "phase", "%s",
			              p->actions[i - 1].phase ? p->actions[i - 1].phase : "");
		if (n > 1 && failed >= 0)
			ts_error_meta(err, "device", "%s",
			              ts_device_props(ts_queue_device(envs[failed].compute))->id);
		free(r);
		return st;
	}
	for (k = 0; k < n; k++) {
		r[k].res.grad_norm = r[k].norm_read ? sqrtf(r[k].gnorm_sq) : NAN;
		r[k].res.wall_s = (double)(ts_now_ns() - t0) / 1e9;
		r[k].res.compute_s = (double)r[k].clk.busy / 1e9;
		r[k].res.copy_wait_s = (double)r[k].clk.wait / 1e9;
		/* with a comm queue, the compute queue's comm is its waiting
		 * for the collectives, the comm queue's its time in them */
		r[k].res.comm_s = (double)(r[k].q[QM] ? r[k].mclk.comm : r[k].clk.comm) / 1e9;
		r[k].res.comm_wait_s = r[k].q[QM] ? (double)r[k].clk.comm / 1e9 : 0.0;
		out[k] = r[k].res;
	}
	free(r);
	return TS_OK;
}

ts_status ts_exec_run(const struct ts_plan *p, const struct ts_exec_env *env,
                      void *const *args, void *const *outs, int step,
                      struct ts_exec_result *out, struct ts_error *err)
{
	void *const *a1[1] = {args};
	void *const *o1[1] = {outs};

	return ts_exec_run_replicas(p, env, 1, NULL, a1, o1, step, out, err);
}
