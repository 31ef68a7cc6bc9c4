#!/usr/bin/env python3
"""gpt_reference.py - the GPT model kind that tstaged trains, written with
jax.numpy from GPT-2's formulas (nanoGPT's model.py, GPT-2's tanh GELU) and
trained by optax itself, in float32, for the integration tests to compare a
daemon's steps, gradients, logits and generated tokens against.

Usage: gpt_reference.py SPEC.json

Files are raw little-endian, C order, no header: weights float32 (.f32),
token ids int32 (.i32) or uint16 (.u16).

WEIGHTS (the table WEIGHTS below; one file per weight, <file>.f32; the
daemon's array is {m}.<role>). V vocab, C context, L layers, d d_model,
H heads, hd = d / H, F d_ff. "matrix": decayed under "decay": "matrices".

  file         role          shape        matrix
  wte          wte           [V, d]       yes    token embedding, tied head
  wpe          wpe           [C, d]       yes    position embedding
  ln1_g        ln1.g         [L, d]       no
  ln1_b        ln1.b         [L, d]       no
  attn_qkv_w   attn.qkv.w    [L, d, 3d]   yes    columns q | k | v
  attn_qkv_b   attn.qkv.b    [L, 3d]      no
  attn_o_w     attn.o.w      [L, d, d]    yes
  attn_o_b     attn.o.b      [L, d]       no
  ln2_g        ln2.g         [L, d]       no
  ln2_b        ln2.b         [L, d]       no
  mlp_fc_w     mlp.fc.w      [L, d, F]    yes
  mlp_fc_b     mlp.fc.b      [L, F]       no
  mlp_proj_w   mlp.proj.w    [L, F, d]    yes
  mlp_proj_b   mlp.proj.b    [L, d]       no
  lnf_g        lnf.g         [d]          no
  lnf_b        lnf.b         [d]          no

THE MODEL, ids [B, T] (T <= C), all float32:
  x = wte[ids] + wpe[0:T]
  layer l (weights [l] of the stacks), pre-norm:
    h = LN(x; ln1_g, ln1_b)
    qkv = h @ attn_qkv_w + attn_qkv_b          [B, T, 3d]
    q = qkv[..., 0:d], k = qkv[..., d:2d], v = qkv[..., 2d:3d]; head j of
      each is columns j*hd:(j+1)*hd (head-major, nanoGPT's view(B,T,H,hd))
    s = (q_j @ k_j^T) * (1/sqrt(hd))   (the scale a float32, applied to the
      product); s[t, u] = -inf for u > t (causal); p = softmax(s) over u in
      float32; y_j = p @ v_j; y = concat_j y_j   [B, T, d]
    x = x + (y @ attn_o_w + attn_o_b)
    h = LN(x; ln2_g, ln2_b)
    x = x + (gelu(h @ mlp_fc_w + mlp_fc_b) @ mlp_proj_w + mlp_proj_b)
  x = LN(x; lnf_g, lnf_b);  logits = x @ wte^T   [B, T, V]
  loss = mean over the B*T positions of logsumexp(logits) - logits[target]
    (optax.softmax_cross_entropy_with_integer_labels(...).mean())
  LN(x; g, b) = (x - mean) / sqrt(var + 1e-5) * g + b, mean and the
    population variance over the last axis.
  gelu(z) = 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))
    (jax.nn.gelu(approximate=True); nanoGPT's nn.GELU() is the erf form,
    GPT-2's own is this one).

Mixed precision, "dtype": "bfloat16" (or "float16"): as train/plan.h and
optax_reference.py define it - weights, gradients, optimizer state and all
element-wise math (LayerNorm, softmax, GELU, loss, biases, residuals) stay
float32; EVERY product - h @ attn_qkv_w, q_j @ k_j^T, p @ v_j, y @ attn_o_w,
h @ mlp_fc_w, a @ mlp_proj_w and the tied head x @ wte^T - is
  jnp.matmul(a.astype(dt), b.astype(dt), preferred_element_type=float32)
(round to nearest even, float32 accumulation). With "vjp": "rounded" (the
default, the daemon's definition) each product's two backward products
g @ b^T and a^T @ g are that same expression (g, a, b rounded, float32
results); with "vjp": "jax" jax.grad differentiates the expression itself.
The attention scale multiplies the float32 product; the probabilities p
are rounded as p @ v's operand. (Checked: XLA's bf16 product here equals
float32 sgemm of the operands rounded to bf16, bit for bit. Rounding is
discontinuous, though: XLA's float32 exp/tanh/LayerNorm differ from another
implementation's in the last bits, which now and then puts an operand on
the other side of a bf16 rounding boundary, and the difference spreads
downstream - against a float64 model with the same roundings ~97% of the
tiny model's logits agree to 1e-6 of max|logit| and the rest within
~4e-4, the loss within ~2e-5 relative. Compare a bf16 daemon with
tolerances of that size, not float32's.)

SPEC.json:
  {"gpt": {"vocab": V, "context": C, "layers": L, "d_model": d,
           "heads": H, "d_ff": F (default 4 d)},
   "dtype": "float32" | "bfloat16" | "float16"   (default float32),
   "vjp": "rounded" | "jax"                      (default rounded),
   "weights": dir     (the initial weights, <file>.f32 of the table),
   "out": dir,
   "steps": N         (optimizer steps, 0 allowed; default 0),
   "accumulate": k    (micro-batches per optimizer step, default 1),
   "optimizer": {"type": "adamw" | "adam" | "sgd",
                 "learning_rate": lr | "schedule": {"type":
                   "warmup_cosine_decay", "init_value", "peak_value",
                   "warmup_steps", "decay_steps", "end_value"},
                 "b1", "b2", "eps", "weight_decay" (adamw, default 1e-4),
                 "clip_global_norm": c (0: none),
                 "decay": "all" | "matrices" (adamw, default all)},
   the data, one of:
     "inputs": path, "targets": path (int32 [k*B, T]), "batch": B, "tokens": T
        - every step uses the same k micro-batches, micro-batch m the rows
          m*B .. m*B+B-1;
     "windows": {"stream": path, "stream_dtype": "uint16" | "int32" (default
        from the file's extension, .u16 / .i32), "context": T (<= C),
        "batch_size": B, "order": "sequential" | "random", "seed": S,
        "start": P}
   "grads": true      (write the gradients at the initial weights),
   "adam_state": true (write Adam's mu and nu after the N steps),
   "evaluate": {"positions": "all" | "last", "inputs": path, "targets":
        path, "batch": B, "tokens": T}  (inputs/targets optional: default
        the spec's "inputs"/"targets" files, or with "windows" step 0's
        k*B windows),
   "generate": {"prompt": [ids], "max_tokens": n, "temperature": t,
        "top_k": K (0: all), "seed": S}}
Unknown keys, bad shapes, ids outside [0, V) and files of the wrong size
are a bad spec: exit status 2. Exit 0 on success.

WINDOWS (one flat stream of n tokens; nanoGPT's get_batch). The run draws
windows q = P, P+1, P+2, ...: micro-batch m of optimizer step s (both
0-based in this run) takes windows q = P + (s*k + m)*B + i, i = 0..B-1, as
its rows. Window q is the T+1 tokens stream[o_q : o_q + T + 1]; its
inputs are the first T, its targets the last T. The offset o_q:
  sequential: W = (n - 1) // T windows an epoch, o_q = (q mod W) * T -
    consecutive windows overlap by one token (the targets' last is the next
    window's first input), and after the last whole window the stream
    starts again at 0 (tokens after W*T + 1 of them are unread);
  random: o_q = splitmix64(S, q) mod (n - T), uniform over the n - T
    starts nanoGPT draws from (torch.randint(len - T)), with replacement,
    independent per window;
    splitmix64(S, q) = mix64((S + (q + 1) * 0x9e3779b97f4a7c15) mod 2^64),
    mix64(z): z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
              z = (z ^ (z >> 27)) * 0x94d049bb133111eb; z ^ (z >> 31)
    (all mod 2^64: output q of a SplitMix64 generator seeded with S).
  Both need n >= T + 1, and o_q + T + 1 <= n always: no window crosses the
  end of the stream. P counts windows, not tokens, in both orders, so the
  run's "next" (P + N*k*B) continues it exactly: a run of N1 steps then
  one of N2 from "start": next draws the windows of one N1+N2 run.

OPTIMIZER: optax.chain(optax.clip_by_global_norm(c) (when c > 0),
optax.adamw(lr, b1, b2, eps, weight_decay, mask)) (adam, sgd alike without
decay); "matrices" masks the decay to the table's "matrix" rows (nanoGPT
decays every parameter of dim >= 2: in the stacked layout that is the
layers' weight matrices and the two embeddings, not the LayerNorm scales
and biases nor the biases, which are also stacked 2-D). lr is a float32 or
optax.warmup_cosine_decay_schedule(...), evaluated by optax at the
optimizer's step count (0 for the first step). Hyperparameters are their
float32 values.
With "accumulate": k each optimizer step takes the gradients of the k
micro-batches' mean losses, summed in micro-batch order in float32 and
divided by k (so the gradient of the mean over all k*B*T positions), then
one clip + AdamW update. "losses" reports one value per OPTIMIZER step:
the mean of its k micro-batch losses; "micro_losses" each micro-batch's.

OUTPUT, into "out":
  result.json {"losses": [N], "micro_losses": [N*k], "grad_norms": [N]
    (global norm of the averaged gradient, before clipping), "clipped": [N],
    "learning_rates": [N] (the schedule's value at each step),
    "windows": {"next": P + N*k*B, "offsets": [N][k*B] (o_q of each step's
    rows, micro-batch major)} (with windows),
    "initial_loss" (with grads), "eval_loss" (evaluate, when it has targets),
    "tokens": [max_tokens] (generate: the generated ids, without the prompt),
    "jax", "optax": versions}
  <file>.f32 for every weight after the N steps;
  grad_<file>.f32: the gradients at the initial weights, of step 0's
    batch (averaged over its k micro-batches), no update ("grads": true);
  mu_<file>.f32, nu_<file>.f32: Adam's moments after the N steps;
  logits.f32: "evaluate" at the weights after the N steps: float32
    [R, T, V] ("all") or [R, V] (position T-1, "last"), R rows of inputs.

GENERATE (at the weights after the N steps): the sequence starts as the
prompt; each new token runs the model on the sequence's last min(len, C)
tokens (nanoGPT's crop) and takes the logits z of its last position:
  temperature 0: argmax z, ties to the lowest id (greedy; the daemon must
    give exactly these tokens);
  temperature t > 0: z = z / float32(t); with 0 < K < V every z below the
    K-th largest becomes -inf (ties with it are kept, as nanoGPT's top-k);
    token g (0-based) = jax.random.categorical(
      jax.random.fold_in(jax.random.PRNGKey(S), g), z)
    (JAX's default threefry PRNG). The daemon's sampler is only expected
    to match in distribution, not token for token.
"""
import json
import math
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

jax.config.update("jax_enable_x64", False)

# (file stem, daemon role, shape in symbols, decayed under "matrices")
WEIGHTS = (
    ("wte", "wte", ("V", "d"), True),
    ("wpe", "wpe", ("C", "d"), True),
    ("ln1_g", "ln1.g", ("L", "d"), False),
    ("ln1_b", "ln1.b", ("L", "d"), False),
    ("attn_qkv_w", "attn.qkv.w", ("L", "d", "3d"), True),
    ("attn_qkv_b", "attn.qkv.b", ("L", "3d"), False),
    ("attn_o_w", "attn.o.w", ("L", "d", "d"), True),
    ("attn_o_b", "attn.o.b", ("L", "d"), False),
    ("ln2_g", "ln2.g", ("L", "d"), False),
    ("ln2_b", "ln2.b", ("L", "d"), False),
    ("mlp_fc_w", "mlp.fc.w", ("L", "d", "F"), True),
    ("mlp_fc_b", "mlp.fc.b", ("L", "F"), False),
    ("mlp_proj_w", "mlp.proj.w", ("L", "F", "d"), True),
    ("mlp_proj_b", "mlp.proj.b", ("L", "d"), False),
    ("lnf_g", "lnf.g", ("d",), False),
    ("lnf_b", "lnf.b", ("d",), False),
)
NAMES = tuple(w[0] for w in WEIGHTS)
LN_EPS = 1e-5
M64 = (1 << 64) - 1
GOLDEN = 0x9e3779b97f4a7c15

SPEC_KEYS = {"gpt", "dtype", "vjp", "weights", "out", "steps", "accumulate", "optimizer",
             "inputs", "targets", "batch", "tokens", "windows", "grads", "adam_state",
             "evaluate", "generate"}
GPT_KEYS = {"vocab", "context", "layers", "d_model", "heads", "d_ff"}
OPT_KEYS = {"type", "learning_rate", "schedule", "b1", "b2", "eps", "weight_decay",
            "clip_global_norm", "decay"}
WIN_KEYS = {"stream", "stream_dtype", "context", "batch_size", "order", "seed", "start"}
EVAL_KEYS = {"positions", "inputs", "targets", "batch", "tokens"}
GEN_KEYS = {"prompt", "max_tokens", "temperature", "top_k", "seed"}


class BadSpec(Exception):
    pass


def bad(msg):
    raise BadSpec(msg)


def check_keys(obj, allowed, where):
    if not isinstance(obj, dict):
        bad(f"{where} is not an object")
    extra = set(obj) - allowed
    if extra:
        bad(f"{where}: unknown key(s) {sorted(extra)}")


def need_int(obj, key, where, lo=0, default=None):
    v = obj.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        bad(f"{where}.{key} must be an integer >= {lo} (got {v!r})")
    return v


def f32(v):
    return float(np.float32(v))


# ---- the configuration and its weights ---------------------------------------------


def config(gpt):
    check_keys(gpt, GPT_KEYS, "gpt")
    c = {k: need_int(gpt, k, "gpt", 1) for k in ("vocab", "context", "layers", "d_model", "heads")}
    c["d_ff"] = need_int(gpt, "d_ff", "gpt", 1, 4 * c["d_model"])
    if c["d_model"] % c["heads"]:
        bad(f"gpt.d_model {c['d_model']} is not a multiple of gpt.heads {c['heads']}")
    return c


def weight_shapes(c):
    """{file stem: shape} for configuration c."""
    sym = {"V": c["vocab"], "C": c["context"], "L": c["layers"], "d": c["d_model"],
           "3d": 3 * c["d_model"], "F": c["d_ff"]}
    return {name: tuple(sym[s] for s in shape) for name, _, shape, _ in WEIGHTS}


def read_raw(path, dtype, shape=None):
    try:
        x = np.fromfile(path, dtype=dtype)
    except OSError as e:
        bad(f"cannot read {path}: {e}")
    if shape is not None:
        want = int(np.prod(shape))
        if x.size != want:
            bad(f"{path} holds {x.size} elements, want {want} {list(shape)}")
        x = x.reshape(shape)
    return x


def save(path, x):
    np.asarray(x, dtype="<f4").tofile(path)


def load_weights(directory, c):
    return {name: jnp.asarray(read_raw(os.path.join(directory, name + ".f32"), "<f4", shape))
            for name, shape in weight_shapes(c).items()}


# ---- windows of a token stream -------------------------------------------------------


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)


def splitmix64(seed, q):
    return mix64((seed + (q + 1) * GOLDEN) & M64)


def window_offsets(n, context, order, seed, first, count):
    """Token offsets o_q of windows q = first .. first+count-1 (docstring)."""
    if n < context + 1:
        bad(f"a stream of {n} tokens holds no window of {context + 1}")
    if order == "sequential":
        w = (n - 1) // context
        offs = [(q % w) * context for q in range(first, first + count)]
    elif order == "random":
        offs = [splitmix64(seed, q) % (n - context) for q in range(first, first + count)]
    else:
        bad(f"windows.order '{order}' is not sequential or random")
    offs = np.asarray(offs, dtype=np.int64)
    assert offs.size == 0 or (offs.min() >= 0 and offs.max() + context + 1 <= n)
    return offs


def windows_rows(stream, offs, context):
    """inputs, targets [len(offs), context] of the windows at offs."""
    idx = offs[:, None] + np.arange(context + 1)[None, :]
    assert idx.size == 0 or idx.max() < stream.size
    w = stream[idx].astype(np.int64)
    return w[:, :-1], w[:, 1:]


# ---- the model -----------------------------------------------------------------------

LOWP = {"bfloat16": jnp.bfloat16, "float16": jnp.float16}


def matmul(dtype, vjp):
    """The model's a @ b (any equal leading batch dims) for its dtype."""
    if dtype in (None, "float32"):
        return jnp.matmul
    if dtype not in LOWP:
        bad(f"dtype '{dtype}' is not float32, bfloat16 or float16")
    dt = LOWP[dtype]

    def mm(a, b):
        return jnp.matmul(a.astype(dt), b.astype(dt), preferred_element_type=jnp.float32)

    if vjp == "jax":
        return mm
    if vjp != "rounded":
        bad(f"vjp '{vjp}' is not rounded or jax")

    @jax.custom_vjp
    def mm_rounded(a, b):
        return mm(a, b)

    def fwd(a, b):
        return mm(a, b), (a, b)

    def bwd(res, g):
        a, b = res
        return mm(g, jnp.swapaxes(b, -1, -2)), mm(jnp.swapaxes(a, -1, -2), g)

    mm_rounded.defvjp(fwd, bwd)
    return mm_rounded


def layer_norm(x, g, b):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + LN_EPS) * g + b


def make_forward(c, mm):
    """logits(params, ids [B, T]) -> float32 [B, T, V]."""
    d, nh = c["d_model"], c["heads"]
    hd = d // nh
    scale = np.float32(1.0 / math.sqrt(hd))
    stacked = [n for n, _, shape, _ in WEIGHTS if shape[0] == "L"]

    def forward(p, ids):
        B, T = ids.shape
        causal = jnp.tril(jnp.ones((T, T), dtype=bool))
        x = jnp.take(p["wte"], ids, axis=0) + p["wpe"][:T][None, :, :]

        def heads(z):  # [B*T, d] -> [B, H, T, hd]
            return z.reshape(B, T, nh, hd).transpose(0, 2, 1, 3)

        def block(x, w):
            h = layer_norm(x, w["ln1_g"], w["ln1_b"]).reshape(B * T, d)
            qkv = mm(h, w["attn_qkv_w"]) + w["attn_qkv_b"]
            q, k, v = heads(qkv[:, :d]), heads(qkv[:, d:2 * d]), heads(qkv[:, 2 * d:])
            s = mm(q, jnp.swapaxes(k, -1, -2)) * scale
            s = jnp.where(causal, s, -jnp.inf)
            pr = jax.nn.softmax(s, axis=-1)
            y = mm(pr, v).transpose(0, 2, 1, 3).reshape(B * T, d)
            x = x + (mm(y, w["attn_o_w"]) + w["attn_o_b"]).reshape(B, T, d)
            h = layer_norm(x, w["ln2_g"], w["ln2_b"]).reshape(B * T, d)
            a = jax.nn.gelu(mm(h, w["mlp_fc_w"]) + w["mlp_fc_b"], approximate=True)
            x = x + (mm(a, w["mlp_proj_w"]) + w["mlp_proj_b"]).reshape(B, T, d)
            return x, None

        x, _ = jax.lax.scan(block, x, {n: p[n] for n in stacked})
        x = layer_norm(x, p["lnf_g"], p["lnf_b"]).reshape(B * T, d)
        return mm(x, p["wte"].T).reshape(B, T, -1)

    return forward


def make_loss(forward):
    def loss_fn(p, ids, tgt):
        logits = forward(p, ids)
        return optax.softmax_cross_entropy_with_integer_labels(logits, tgt).mean()
    return loss_fn


class Model:
    """The jitted functions of one (configuration, dtype, vjp); kept for the
    process, so that runs of one model in one process compile them once."""

    def __init__(self, c, dtype, vjp):
        self.forward = make_forward(c, matmul(dtype, vjp))
        loss_fn = make_loss(self.forward)
        vg = jax.value_and_grad(loss_fn)

        @jax.jit
        def grads(p, ids, tgt):
            """ids, tgt [k, B, T] -> the k micro losses, their mean gradient:
            summed in micro-batch order (0 + g_0 + g_1 ...), then / k."""
            def body(acc, xs):
                loss, g = vg(p, xs[0], xs[1])
                return jax.tree_util.tree_map(jnp.add, acc, g), loss
            zero = jax.tree_util.tree_map(jnp.zeros_like, p)
            acc, losses = jax.lax.scan(body, zero, (ids, tgt))
            k = jnp.float32(ids.shape[0])
            return losses, jax.tree_util.tree_map(lambda a: a / k, acc)

        @jax.jit
        def evaluate(p, ids, tgt):
            logits = self.forward(p, ids)
            return logits, optax.softmax_cross_entropy_with_integer_labels(logits, tgt).mean()

        @jax.jit
        def last_logits(p, ids, t):
            return self.forward(p, ids)[0, t]

        self.grads, self.evaluate, self.last_logits = grads, evaluate, last_logits


_MODELS = {}
_UPDATES = {}


def model(c, dtype, vjp):
    key = (tuple(sorted(c.items())), dtype, vjp)
    if key not in _MODELS:
        matmul(dtype, vjp)  # a bad dtype or vjp fails here, before anything is kept
        _MODELS[key] = Model(c, dtype, vjp)
    return _MODELS[key]


def updater(opt):
    """(update(p, state, g) -> p, state, global norm of g; tx, lr, clip) of
    optimizer spec opt, kept per spec like model()'s."""
    key = json.dumps(opt, sort_keys=True)
    if key not in _UPDATES:
        tx, lr, clip = optimizer(opt)

        @jax.jit
        def update(p, state, g):
            updates, state = tx.update(g, state, p)
            return optax.apply_updates(p, updates), state, optax.global_norm(g)

        _UPDATES[key] = update, tx, lr, clip
    return _UPDATES[key]


# ---- the optimizer -------------------------------------------------------------------


def learning_rate(opt):
    sched = opt.get("schedule")
    if sched is None:
        if "learning_rate" not in opt:
            bad("optimizer needs learning_rate or schedule")
        return f32(opt["learning_rate"])
    if not isinstance(sched, dict) or sched.get("type") != "warmup_cosine_decay":
        bad(f"unknown schedule {sched!r}")
    check_keys(sched, {"type", "init_value", "peak_value", "warmup_steps", "decay_steps",
                       "end_value"}, "optimizer.schedule")
    for key in ("init_value", "peak_value", "warmup_steps", "decay_steps"):
        if key not in sched:
            bad(f"optimizer.schedule.{key} is required")
    return optax.warmup_cosine_decay_schedule(
        init_value=f32(sched["init_value"]), peak_value=f32(sched["peak_value"]),
        warmup_steps=int(sched["warmup_steps"]), decay_steps=int(sched["decay_steps"]),
        end_value=f32(sched.get("end_value", 0.0)))


def decay_mask(decay):
    if decay == "all":
        return {name: True for name in NAMES}
    if decay == "matrices":
        return {name: matrix for name, _, _, matrix in WEIGHTS}
    bad(f"optimizer.decay '{decay}' is not all or matrices")


def optimizer(opt):
    check_keys(opt, OPT_KEYS, "optimizer")
    kind = opt.get("type")
    lr = learning_rate(opt)
    b1, b2, eps = f32(opt.get("b1", 0.9)), f32(opt.get("b2", 0.999)), f32(opt.get("eps", 1e-8))
    if kind == "sgd":
        base = optax.sgd(lr)
    elif kind == "adam":
        base = optax.adam(lr, b1=b1, b2=b2, eps=eps)
    elif kind == "adamw":
        base = optax.adamw(lr, b1=b1, b2=b2, eps=eps,
                           weight_decay=f32(opt.get("weight_decay", 1e-4)),
                           mask=decay_mask(opt.get("decay", "all")))
    else:
        bad(f"optimizer '{kind}' is not sgd, adam or adamw")
    if kind != "adamw" and "decay" in opt:
        bad("optimizer.decay is adamw's")
    clip = f32(opt.get("clip_global_norm", 0.0))
    return (optax.chain(optax.clip_by_global_norm(clip), base) if clip > 0 else base), lr, clip


# ---- the data ------------------------------------------------------------------------


def read_ids(path, rows, cols, vocab, what):
    if path.endswith(".u16"):
        x = read_raw(path, "<u2", (rows, cols))
    else:
        x = read_raw(path, "<i4", (rows, cols))
    return checked_ids(x, vocab, what)


def checked_ids(x, vocab, what):
    x = np.asarray(x, dtype=np.int64)
    if x.size and (x.min() < 0 or x.max() >= vocab):
        bad(f"{what}: token id {int(x.min()) if x.min() < 0 else int(x.max())} outside [0, {vocab})")
    return x.astype(np.int32)


class Data:
    """The k micro-batches of each step: batch(s) -> ids, tgt [k, B, T]."""

    def __init__(self, spec, c, k):
        self.k = k
        self.windows = None
        if "windows" in spec:
            if "inputs" in spec or "targets" in spec:
                bad("give inputs/targets or windows, not both")
            w = spec["windows"]
            check_keys(w, WIN_KEYS, "windows")
            if "stream" not in w:
                bad("windows.stream is required")
            path = w["stream"]
            sd = w.get("stream_dtype", "uint16" if path.endswith(".u16") else "int32")
            if sd not in ("uint16", "int32"):
                bad(f"windows.stream_dtype '{sd}' is not uint16 or int32")
            self.stream = read_raw(path, "<u2" if sd == "uint16" else "<i4")
            self.T = need_int(w, "context", "windows", 1)
            self.B = need_int(w, "batch_size", "windows", 1)
            self.order = w.get("order", "sequential")
            self.seed = need_int(w, "seed", "windows", 0, 0)
            self.start = need_int(w, "start", "windows", 0, 0)
            if self.seed > M64:
                bad("windows.seed must fit 64 bits")
            if self.T > c["context"]:
                bad(f"windows.context {self.T} exceeds gpt.context {c['context']}")
            window_offsets(self.stream.size, self.T, self.order, self.seed, 0, 0)
            self.vocab = c["vocab"]
            self.windows = True
        else:
            if "inputs" not in spec or "targets" not in spec:
                bad("give inputs and targets, or windows")
            self.B = need_int(spec, "batch", "spec", 1)
            self.T = need_int(spec, "tokens", "spec", 1)
            if self.T > c["context"]:
                bad(f"tokens {self.T} exceeds gpt.context {c['context']}")
            ids = read_ids(spec["inputs"], k * self.B, self.T, c["vocab"], "inputs")
            tgt = read_ids(spec["targets"], k * self.B, self.T, c["vocab"], "targets")
            self.fixed = ids.reshape(k, self.B, self.T), tgt.reshape(k, self.B, self.T)

    def offsets(self, s):
        n = self.k * self.B
        return window_offsets(self.stream.size, self.T, self.order, self.seed,
                              self.start + s * n, n)

    def batch(self, s):
        if not self.windows:
            return self.fixed
        ids, tgt = windows_rows(self.stream, self.offsets(s), self.T)
        ids = checked_ids(ids, self.vocab, f"windows of step {s}")
        tgt = checked_ids(tgt, self.vocab, f"windows of step {s}")
        return (ids.reshape(self.k, self.B, self.T), tgt.reshape(self.k, self.B, self.T))


# ---- generation ----------------------------------------------------------------------


@jax.jit
def _sample(z, temp, kth, key):
    z = z / temp
    z = jnp.where(z < kth, -jnp.inf, z)
    return jax.random.categorical(key, z)


def generate(m, params, c, g):
    check_keys(g, GEN_KEYS, "generate")
    prompt = g.get("prompt")
    if not isinstance(prompt, list) or not prompt or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < c["vocab"] for t in prompt):
        bad(f"generate.prompt must be a non-empty list of ids in [0, {c['vocab']})")
    n = need_int(g, "max_tokens", "generate", 0)
    temp = g.get("temperature", 0.0)
    if isinstance(temp, bool) or not isinstance(temp, (int, float)) or temp < 0:
        bad("generate.temperature must be a number >= 0")
    top_k = need_int(g, "top_k", "generate", 0, 0)
    seed = need_int(g, "seed", "generate", 0, 0)
    C, V = c["context"], c["vocab"]
    key = jax.random.PRNGKey(seed)
    seq, out = list(prompt), []
    # one shape for every call: the last min(len, C) tokens, padded after
    # with zeros (the causal mask keeps them out of the last real position)
    for i in range(n):
        ctx = seq[-C:]
        ids = np.zeros((1, C), dtype=np.int32)
        ids[0, :len(ctx)] = ctx
        z = m.last_logits(params, jnp.asarray(ids), len(ctx) - 1)
        if temp == 0:
            tok = int(np.argmax(np.asarray(z)))  # first maximum: the lowest id
        else:
            t = jnp.float32(temp)
            # the K-th largest of z / t (-inf: keep all)
            kth = jnp.sort(z / t)[V - top_k] if 0 < top_k < V else jnp.float32(-jnp.inf)
            tok = int(_sample(z, t, kth, jax.random.fold_in(key, i)))
        seq.append(tok)
        out.append(tok)
    return out


# ---- the run -------------------------------------------------------------------------


def run(spec):
    """Runs SPEC (a dict); writes its outputs; returns result.json's dict."""
    check_keys(spec, SPEC_KEYS, "spec")
    if "gpt" not in spec or "weights" not in spec or "out" not in spec:
        bad("spec needs gpt, weights and out")
    c = config(spec["gpt"])
    steps = need_int(spec, "steps", "spec", 0, 0)
    k = need_int(spec, "accumulate", "spec", 1, 1)
    m = model(c, spec.get("dtype", "float32"), spec.get("vjp", "rounded"))
    params = load_weights(spec["weights"], c)
    need_data = steps > 0 or spec.get("grads")
    data = Data(spec, c, k) if (need_data or "inputs" in spec or "windows" in spec) else None
    update = None
    clip = 0.0
    if steps > 0 or "optimizer" in spec:
        if "optimizer" not in spec:
            bad("steps need an optimizer")
        update, tx, lr, clip = updater(spec["optimizer"])
    if spec.get("adam_state") and (update is None or spec["optimizer"].get("type") == "sgd"):
        bad("adam_state needs adam or adamw")

    result = {}
    out = spec["out"]
    os.makedirs(out, exist_ok=True)
    if spec.get("grads"):
        ids, tgt = data.batch(0)
        losses, g0 = m.grads(params, jnp.asarray(ids), jnp.asarray(tgt))
        for name in NAMES:
            save(os.path.join(out, f"grad_{name}.f32"), g0[name])
        result["initial_loss"] = float(jnp.mean(losses))

    if update is not None:
        state = tx.init(params)
        losses, micro, norms, clipped, lrs, offsets = [], [], [], [], [], []
        for s in range(steps):
            ids, tgt = data.batch(s)
            if data.windows:
                offsets.append([int(o) for o in data.offsets(s)])
            ml, g = m.grads(params, jnp.asarray(ids), jnp.asarray(tgt))
            params, state, norm = update(params, state, g)
            ml = [float(v) for v in np.asarray(ml)]
            micro.extend(ml)
            losses.append(float(np.mean(np.asarray(ml, dtype=np.float64))))
            norms.append(float(norm))
            clipped.append(bool(clip > 0 and not float(norm) < clip))
            lrs.append(float(lr(s)) if callable(lr) else lr)
        result.update({"losses": losses, "micro_losses": micro, "grad_norms": norms,
                       "clipped": clipped, "learning_rates": lrs})
        if data is not None and data.windows:
            result["windows"] = {"next": data.start + steps * k * data.B, "offsets": offsets}
        if spec.get("adam_state"):
            adam = [s for s in jax.tree_util.tree_leaves(
                state, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
                if isinstance(s, optax.ScaleByAdamState)]
            for name in NAMES:
                save(os.path.join(out, f"mu_{name}.f32"), adam[0].mu[name])
                save(os.path.join(out, f"nu_{name}.f32"), adam[0].nu[name])

    for name in NAMES:
        save(os.path.join(out, f"{name}.f32"), params[name])

    if "evaluate" in spec:
        e = spec["evaluate"]
        check_keys(e, EVAL_KEYS, "evaluate")
        pos = e.get("positions", "all")
        if pos not in ("all", "last"):
            bad(f"evaluate.positions '{pos}' is not all or last")
        tgt = None
        if "inputs" in e:
            B = need_int(e, "batch", "evaluate", 1)
            T = need_int(e, "tokens", "evaluate", 1)
            if T > c["context"]:
                bad(f"evaluate.tokens {T} exceeds gpt.context {c['context']}")
            ids = read_ids(e["inputs"], B, T, c["vocab"], "evaluate.inputs")
            if "targets" in e:
                tgt = read_ids(e["targets"], B, T, c["vocab"], "evaluate.targets")
        elif data is not None:
            ids, tgt = data.batch(0)
            ids, tgt = ids.reshape(-1, data.T), tgt.reshape(-1, data.T)
        else:
            bad("evaluate needs inputs")
        logits, loss = m.evaluate(params, jnp.asarray(ids),
                                  jnp.asarray(tgt if tgt is not None else np.zeros_like(ids)))
        if tgt is not None:
            result["eval_loss"] = float(loss)
        save(os.path.join(out, "logits.f32"), logits if pos == "all" else logits[:, -1, :])

    if "generate" in spec:
        result["tokens"] = generate(m, params, c, spec["generate"])

    result["jax"], result["optax"] = jax.__version__, optax.__version__
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f)
    return result


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1]) as f:
            spec = json.load(f)
        run(spec)
    except BadSpec as e:
        print(f"gpt_reference: {e}", file=sys.stderr)
        return 2
    except (OSError, json.JSONDecodeError) as e:
        print(f"gpt_reference: bad spec: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
