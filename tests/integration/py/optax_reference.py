#!/usr/bin/env python3
"""optax_reference.py - the MLP that tstaged trains, run by JAX and optax
themselves in float32, step by step, for the integration tests to compare
a daemon's steps against the real thing (it_optax).

Usage: optax_reference.py SPEC.json

SPEC.json is train_reference.py's (the same model and files), with the
optimizer as GET /v1/models/{m} shows it:
  {"type": "sgd" | "adam" | "adamw", "learning_rate": lr (or a "schedule"
   {"type": "warmup_cosine_decay", "init_value", "peak_value",
    "warmup_steps", "decay_steps", "end_value"}), "b1", "b2", "eps",
   "clip_global_norm": c, "weight_decay": wd (adamw)}

The model is written with jax.numpy from its formulas (train/mlp.h): layer
l: h = x @ w1[l]; a = act(h) (jax.nn.relu, jax.nn.gelu with its default
tanh approximation, jnp.tanh); y = a @ w2[l]; x = x + y when residual.
Loss: jnp.sum(x_L) or jnp.mean((x_L - targets)^2). Gradients by jax.grad;
the optimizer is optax's own:
  optax.chain(optax.clip_by_global_norm(c), optax.sgd | adam | adamw(lr))
(no clipping when c == 0), lr a float or
optax.warmup_cosine_decay_schedule(...). Each step is one jitted
value_and_grad + tx.update + optax.apply_updates, in float32 (jax_enable_x64
off), hyperparameters the daemon's float32 values.

Token models: with "vocab": V, the inputs and targets files hold int32 token
ids (B of them, B the rows of the step), "embed" names the [V, d] table and,
with "projection": true, "proj" the [d, V] projection; x_0 = jnp.take(embed,
ids, axis=0), the logits x_L @ proj (or x_L), and the loss
optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean().
The gradients at the initial weights are written too (grad_{name}.f32).

Mixed precision: with "dtype": "bfloat16" or "float16" (the model's), every
matmul (x @ w1[l], a @ w2[l], x_L @ proj) is
  jnp.matmul(a.astype(dt), b.astype(dt), preferred_element_type=jnp.float32)
and, with "vjp": "rounded" (the default), its two backward products are that
same expression too (a jax.custom_vjp: g @ b.T and a.T @ g with g, a, b
rounded to dt, float32 results), which is the daemon's definition
(train/mlp.h); with "vjp": "jax", jax.grad differentiates the expression
itself (JAX's transpose rule keeps the cotangent in float32 and rounds the
operand gradients to dt). Everything else stays float32.

Writes into "out": result.json {"losses": [N], "grad_norms": [N] (before
clipping), "clipped": [N], "learning_rates": [N] (the schedule's value at
each step)}; w1.f32, w2.f32 (after the N steps), and with adam or adamw
mu_w1.f32, nu_w1.f32, mu_w2.f32, nu_w2.f32. Exit status 0 on success, 2 on
a bad spec.
"""
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

jax.config.update("jax_enable_x64", False)


def bad(msg):
    print(f"optax_reference: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path, shape, dtype="<f4"):
    x = np.fromfile(path, dtype=dtype)
    want = int(np.prod(shape))
    if x.size != want:
        bad(f"{path} holds {x.size} floats, want {want} {shape}")
    if dtype != "<f4":
        return jnp.asarray(x.reshape(shape), dtype=jnp.int32)
    return jnp.asarray(x.reshape(shape), dtype=jnp.float32)


def save(path, x):
    np.asarray(x, dtype="<f4").tofile(path)


def f32(v):
    return float(np.float32(v))


ACTS = {
    "none": lambda h: h,
    "relu": jax.nn.relu,
    "gelu": lambda h: jax.nn.gelu(h, approximate=True),
    "tanh": jnp.tanh,
}


LOWP = {"bfloat16": jnp.bfloat16, "float16": jnp.float16}


def matmul(dtype, vjp):
    """The model's a @ b for its dtype (see the docstring)."""
    if dtype in (None, "float32"):
        return lambda a, b: a @ b
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
        return mm(g, b.T), mm(a.T, g)

    mm_rounded.defvjp(fwd, bwd)
    return mm_rounded


def learning_rate(opt):
    sched = opt.get("schedule")
    if sched is None:
        return f32(opt["learning_rate"])
    if sched.get("type") != "warmup_cosine_decay":
        bad(f"unknown schedule {sched!r}")
    return optax.warmup_cosine_decay_schedule(
        init_value=f32(sched["init_value"]), peak_value=f32(sched["peak_value"]),
        warmup_steps=int(sched["warmup_steps"]), decay_steps=int(sched["decay_steps"]),
        end_value=f32(sched.get("end_value", 0.0)))


def optimizer(opt):
    kind = opt.get("type")
    lr = learning_rate(opt)
    b1, b2, eps = f32(opt.get("b1", 0.9)), f32(opt.get("b2", 0.999)), f32(opt.get("eps", 1e-8))
    if kind == "sgd":
        base = optax.sgd(lr)
    elif kind == "adam":
        base = optax.adam(lr, b1=b1, b2=b2, eps=eps)
    elif kind == "adamw":
        base = optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=f32(opt.get("weight_decay", 1e-4)))
    else:
        bad(f"optimizer '{kind}' is not sgd, adam or adamw")
    clip = f32(opt.get("clip_global_norm", 0.0))
    return (optax.chain(optax.clip_by_global_norm(clip), base) if clip > 0 else base), lr, clip


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    L, d, hd = spec["layers"], spec["d_model"], spec.get("d_hidden", 0)
    B, steps = spec["batch"], spec["steps"]
    act = ACTS.get(spec.get("activation", "relu"))
    if act is None:
        bad(f"unknown activation '{spec.get('activation')}'")
    if spec.get("first_step", 1) != 1:
        bad("optax_reference starts from a fresh optimizer state (first_step 1)")
    residual = bool(spec.get("residual", False))
    mse = spec.get("loss", "sum") == "mse"
    vocab = int(spec.get("vocab", 0))
    proj = bool(spec.get("projection", False))
    params = {"w1": load(spec["w1"], (L, d, hd if hd else d))}
    if hd:
        params["w2"] = load(spec["w2"], (L, hd, d))
    if vocab:
        params["embed"] = load(spec["embed"], (vocab, d))
        if proj:
            params["proj"] = load(spec["proj"], (d, vocab))
        ids = load(spec["inputs"], (B,), "<i4")
        labels = load(spec["targets"], (B,), "<i4")
        x0 = target = None
    else:
        x0 = load(spec["inputs"], (B, d))
        target = load(spec["targets"], (B, d)) if mse else None
    tx, lr, clip = optimizer(spec["optimizer"])
    mm = matmul(spec.get("dtype"), spec.get("vjp", "rounded"))

    def loss_fn(p):
        x = jnp.take(p["embed"], ids, axis=0) if vocab else x0
        for l in range(L):
            a = act(mm(x, p["w1"][l]))
            y = mm(a, p["w2"][l]) if "w2" in p else a
            x = x + y if residual else y
        if vocab:
            logits = mm(x, p["proj"]) if proj else x
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return jnp.mean((x - target) ** 2) if mse else jnp.sum(x)

    grads0 = jax.jit(jax.grad(loss_fn))(params)

    @jax.jit
    def step(p, state):
        loss, g = jax.value_and_grad(loss_fn)(p)
        updates, state = tx.update(g, state, p)
        return optax.apply_updates(p, updates), state, loss, optax.global_norm(g)

    state = tx.init(params)
    losses, norms, clipped, lrs = [], [], [], []
    for i in range(steps):
        params, state, loss, norm = step(params, state)
        losses.append(float(loss))
        norms.append(float(norm))
        clipped.append(bool(clip > 0 and not float(norm) < clip))
        lrs.append(float(lr(i)) if callable(lr) else lr)

    out = spec["out"]
    os.makedirs(out, exist_ok=True)
    for k, v in params.items():
        save(os.path.join(out, f"{k}.f32"), v)
        save(os.path.join(out, f"grad_{k}.f32"), grads0[k])
    adam = [s for s in jax.tree_util.tree_leaves(
        state, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
        if isinstance(s, optax.ScaleByAdamState)]
    if adam:
        for k in params:
            save(os.path.join(out, f"mu_{k}.f32"), adam[0].mu[k])
            save(os.path.join(out, f"nu_{k}.f32"), adam[0].nu[k])
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"losses": losses, "grad_norms": norms, "clipped": clipped,
                   "learning_rates": lrs, "jax": jax.__version__, "optax": optax.__version__}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
