#!/usr/bin/env python3
"""jax_train.py - the reference for bench_train's training rows: JAX on the CPU
running the same model, the same shapes and the same optimizer as the row,
on the same machine, in the same run (bench_train starts it).

Usage: jax_train.py MODEL RUNS
  guide   the JAX host-offloading guide's MLP: 10 scanned layers, d 256,
          h 1024, relu, loss sum(x_L), batch 256; the gradients only
  adam    4 layers, d = h = 2048, relu, loss sum, batch 256; optax.adam
          (lr 1e-4) applied to the params (value_and_grad, update, apply)
  tokens  a token model: embedding [8192, 256], 4 layers d 256 h 1024 relu,
          projection [256, 8192], softmax cross-entropy with integer labels
          (mean), 256 int32 tokens; optax.adam (lr 1e-4)
  gpt     GPT-2 (train/gpt.h, tests/integration/py/gpt_reference.py): L 4,
          d_model 256, 4 heads, context 256, d_ff 1024, vocab 8192, the
          head tied to wte, batch 8 windows; optax.adamw (lr 1e-4, decay
          1e-4 on every parameter)

Each step is jax.jit-compiled (params and optimizer state donated), warmed
up, then timed RUNS times with block_until_ready; prints one JSON line:
{"model": ..., "best_s": seconds, "jax": version, "backend": "cpu"}.
Exit status 2 on bad arguments, 3 when jax or optax is missing.
"""
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

try:
    import jax
    import jax.numpy as jnp
    import optax
except ImportError as e:  # the bench reports the row as skipped
    print(f"jax_train: {e}", file=sys.stderr)
    sys.exit(3)


def uniform(key, shape, lo, hi):
    return jax.random.uniform(key, shape, jnp.float32, lo, hi)


def layers(x, w1, w2):
    def layer(x, w):
        return jax.nn.relu(x @ w[0]) @ w[1], None

    x, _ = jax.lax.scan(layer, x, (w1, w2))
    return x


def mlp_params(key, L, d, h):
    k1, k2 = jax.random.split(key)
    return {"w1": uniform(k1, (L, d, h), -0.03, 0.03), "w2": uniform(k2, (L, h, d), -0.03, 0.03)}


def layer_norm(x, g, b):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * g + b


def gpt(kp, kx, V=8192, C=256, L=4, d=256, nh=4, F=1024, B=8):
    """GPT-2 as gpt_reference.py writes it (float32, pre-norm, tied head)."""
    hd = d // nh
    ks = jax.random.split(kp, 6)
    p = {"wte": uniform(ks[0], (V, d), -0.02, 0.02), "wpe": uniform(ks[1], (C, d), -0.02, 0.02),
         "ln1_g": jnp.ones((L, d)), "ln1_b": jnp.zeros((L, d)),
         "qkv_w": uniform(ks[2], (L, d, 3 * d), -0.02, 0.02), "qkv_b": jnp.zeros((L, 3 * d)),
         "o_w": uniform(ks[3], (L, d, d), -0.02, 0.02), "o_b": jnp.zeros((L, d)),
         "ln2_g": jnp.ones((L, d)), "ln2_b": jnp.zeros((L, d)),
         "fc_w": uniform(ks[4], (L, d, F), -0.02, 0.02), "fc_b": jnp.zeros((L, F)),
         "proj_w": uniform(ks[5], (L, F, d), -0.02, 0.02), "proj_b": jnp.zeros((L, d)),
         "lnf_g": jnp.ones((d,)), "lnf_b": jnp.zeros((d,))}
    toks = jax.random.randint(kx, (B, C + 1), 0, V, jnp.int32)
    scale = jnp.float32(1.0 / hd ** 0.5)
    causal = jnp.tril(jnp.ones((C, C), dtype=bool))
    stacked = [n for n in p if n not in ("wte", "wpe", "lnf_g", "lnf_b")]

    def heads(z):
        return z.reshape(B, C, nh, hd).transpose(0, 2, 1, 3)

    def block(x, w):
        h = layer_norm(x, w["ln1_g"], w["ln1_b"]).reshape(B * C, d)
        qkv = h @ w["qkv_w"] + w["qkv_b"]
        q, k, v = heads(qkv[:, :d]), heads(qkv[:, d:2 * d]), heads(qkv[:, 2 * d:])
        s = jnp.where(causal, (q @ jnp.swapaxes(k, -1, -2)) * scale, -jnp.inf)
        y = (jax.nn.softmax(s, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(B * C, d)
        x = x + (y @ w["o_w"] + w["o_b"]).reshape(B, C, d)
        h = layer_norm(x, w["ln2_g"], w["ln2_b"]).reshape(B * C, d)
        a = jax.nn.gelu(h @ w["fc_w"] + w["fc_b"], approximate=True)
        return x + (a @ w["proj_w"] + w["proj_b"]).reshape(B, C, d), None

    def loss(p, ids, tgt):
        x = jnp.take(p["wte"], ids, axis=0) + p["wpe"][None, :, :]
        x, _ = jax.lax.scan(block, x, {n: p[n] for n in stacked})
        x = layer_norm(x, p["lnf_g"], p["lnf_b"]).reshape(B * C, d)
        logits = (x @ p["wte"].T).reshape(B, C, V)
        return optax.softmax_cross_entropy_with_integer_labels(logits, tgt).mean()

    return p, (toks[:, :C], toks[:, 1:]), loss


def build(model):
    key = jax.random.PRNGKey(0)
    kp, kx, ke, kt = jax.random.split(key, 4)
    if model == "guide":
        params = mlp_params(kp, 10, 256, 1024)
        x = uniform(kx, (256, 256), -1.0, 1.0)

        def loss(p, x):
            return jnp.sum(layers(x, p["w1"], p["w2"]))

        grad = jax.jit(jax.grad(loss))

        def run(state):
            g = grad(state[0], x)
            return state, g

        return (params,), run
    opt = optax.adam(1e-4)
    if model == "adam":
        params = mlp_params(kp, 4, 2048, 2048)
        batch = (uniform(kx, (256, 2048), -1.0, 1.0),)

        def loss(p, x):
            return jnp.sum(layers(x, p["w1"], p["w2"]))
    elif model == "tokens":
        V, d = 8192, 256
        params = mlp_params(kp, 4, d, 1024)
        params["embed"] = uniform(ke, (V, d), -0.03, 0.03)
        params["proj"] = uniform(kt, (d, V), -0.03, 0.03)
        ids = jax.random.randint(kx, (256,), 0, V, jnp.int32)
        tgt = jax.random.randint(kt, (256,), 0, V, jnp.int32)
        batch = (ids, tgt)

        def loss(p, ids, tgt):
            x = layers(p["embed"][ids], p["w1"], p["w2"])
            return optax.softmax_cross_entropy_with_integer_labels(x @ p["proj"], tgt).mean()
    elif model == "gpt":
        opt = optax.adamw(1e-4, weight_decay=1e-4)
        params, batch, loss = gpt(kp, kx)
    else:
        print(f"jax_train: unknown model '{model}'", file=sys.stderr)
        sys.exit(2)

    @jax.jit
    def step(p, s, *b):
        value, g = jax.value_and_grad(loss)(p, *b)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, value

    step = jax.jit(step, donate_argnums=(0, 1))

    def run(state):
        p, s, value = step(state[0], state[1], *batch)
        return (p, s), value

    return (params, opt.init(params)), run


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    model, runs = sys.argv[1], int(sys.argv[2])
    state, run = build(model)
    state, out = run(state)
    jax.block_until_ready(out)
    best = float("inf")
    for _ in range(max(runs, 1)):
        t0 = time.perf_counter()
        state, out = run(state)
        jax.block_until_ready((state, out))
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"model": model, "best_s": best, "jax": jax.__version__,
                      "backend": jax.default_backend()}))


if __name__ == "__main__":
    main()
