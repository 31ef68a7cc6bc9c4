#!/usr/bin/env python3
"""train_reference.py - a float64 numpy reference of the MLP that tstaged
trains (train/mlp.h), for it_models to compare a daemon's steps against.

Usage: train_reference.py SPEC.json

The model, written from its formulas rather than from tstage's code:
  layer l:  h = x @ w1[l];  a = act(h);  y = a @ w2[l] (y = a without w2);
            x = x + y when residual, else y
  loss:     sum -> sum(x_L);  mse -> mean((x_L - targets)^2)
  act:      none, relu, tanh, gelu (the tanh approximation, jax.nn.gelu's
            default: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))))
  optimizer (optax): none (gradients only); sgd: p -= lr g; adam:
            chain(clip_by_global_norm(c), adam(lr, b1, b2, eps)):
              norm = sqrt(sum of every gradient element squared)
              g = g if norm < c else g * (c / norm)      (c > 0 only)
              mu = b1 mu + (1 - b1) g;  nu = b2 nu + (1 - b2) g^2
              mu_hat = mu / (1 - b1^t);  nu_hat = nu / (1 - b2^t)
              p -= lr * mu_hat / (sqrt(nu_hat) + eps)
            t counts from first_step (1 for a fresh model). The same
            clipping applies before sgd when c > 0 (chain(clip, sgd)).

SPEC.json (paths are raw little-endian float32, C order):
  {"layers": L, "d_model": d, "d_hidden": h (0: no w2, w1 is [L, d, d]),
   "activation": "gelu", "residual": true, "loss": "mse",
   "optimizer": {"type": "adam", "learning_rate": ..., "b1": ..., "b2": ...,
                 "eps": ..., "clip_global_norm": ...},
   "batch": B, "steps": N, "first_step": 1 (optional),
   "w1": path, "w2": path (when h > 0), "inputs": path ([B, d]),
   "targets": path ([B, d], for mse), "out": directory}

Writes into "out": result.json {"losses": [N floats], "grad_norms": [N],
"clipped": [N booleans]}; w1.f32 and w2.f32 (the parameters after the N
steps); grad_w1.f32 and grad_w2.f32 (the last step's gradients, before
clipping); with adam, mu_w1.f32, nu_w1.f32, mu_w2.f32, nu_w2.f32;
outputs.f32 (x_L [B, d] of the initial parameters: what an evaluation before
the steps writes) and "initial_loss" in result.json. All float32.
Exit status 0 on success, 2 on a bad spec.
"""
import json
import math
import os
import sys

import numpy as np

GELU_S = math.sqrt(2.0 / math.pi)
GELU_C = 0.044715


def act_fwd(name, h):
    if name == "none":
        return h
    if name == "relu":
        return np.maximum(h, 0.0)
    if name == "tanh":
        return np.tanh(h)
    if name == "gelu":
        return 0.5 * h * (1.0 + np.tanh(GELU_S * (h + GELU_C * h ** 3)))
    raise SystemExit(f"train_reference: unknown activation '{name}'")


def act_grad(name, h):
    """d act / d h, elementwise."""
    if name == "none":
        return np.ones_like(h)
    if name == "relu":
        return (h > 0.0).astype(np.float64)
    if name == "tanh":
        return 1.0 - np.tanh(h) ** 2
    if name == "gelu":
        u = GELU_S * (h + GELU_C * h ** 3)
        t = np.tanh(u)
        du = GELU_S * (1.0 + 3.0 * GELU_C * h ** 2)
        return 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * du
    raise SystemExit(f"train_reference: unknown activation '{name}'")


def load(path, shape):
    x = np.fromfile(path, dtype="<f4")
    want = int(np.prod(shape))
    if x.size != want:
        raise SystemExit(f"train_reference: {path} holds {x.size} floats, want {want} {shape}")
    return x.reshape(shape).astype(np.float64)


def save(path, x):
    np.asarray(x, dtype="<f4").tofile(path)


def forward_backward(spec, params, x0, target):
    """The loss and the gradients of every parameter, in float64."""
    L, act, residual = spec["layers"], spec["activation"], bool(spec.get("residual", False))
    w1, w2 = params["w1"], params.get("w2")
    xs, hs, As = [], [], []
    x = x0
    for l in range(L):
        xs.append(x)
        h = x @ w1[l]
        a = act_fwd(act, h)
        hs.append(h)
        As.append(a)
        y = a @ w2[l] if w2 is not None else a
        x = x + y if residual else y
    if spec.get("loss", "sum") == "sum":
        loss = float(np.sum(x))
        gx = np.ones_like(x)
    else:
        diff = x - target
        loss = float(np.mean(diff * diff))
        gx = 2.0 * diff / diff.size
    g1 = np.zeros_like(w1)
    g2 = np.zeros_like(w2) if w2 is not None else None
    for l in reversed(range(L)):
        gy = gx
        if w2 is not None:
            g2[l] = As[l].T @ gy
            ga = gy @ w2[l].T
        else:
            ga = gy
        gh = ga * act_grad(act, hs[l])
        g1[l] = xs[l].T @ gh
        gin = gh @ w1[l].T
        gx = gin + gx if residual else gin
    grads = {"w1": g1}
    if g2 is not None:
        grads["w2"] = g2
    return loss, grads


def forward(spec, params, x0, target):
    """The outputs x_L and the loss, in float64 (an evaluation)."""
    act, residual = spec["activation"], bool(spec.get("residual", False))
    w1, w2 = params["w1"], params.get("w2")
    x = x0
    for l in range(spec["layers"]):
        a = act_fwd(act, x @ w1[l])
        y = a @ w2[l] if w2 is not None else a
        x = x + y if residual else y
    if spec.get("loss", "sum") == "sum":
        return x, float(np.sum(x))
    diff = x - target
    return x, float(np.mean(diff * diff))


def f32(v):
    """A hyperparameter as the daemon holds it (float32)."""
    return float(np.float32(v))


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    L, d, hd = spec["layers"], spec["d_model"], spec.get("d_hidden", 0)
    B, steps = spec["batch"], spec["steps"]
    width = hd if hd else d
    opt = spec.get("optimizer", {"type": "none"})
    kind = opt.get("type", "none")
    lr = f32(opt.get("learning_rate", 1e-3))
    b1, b2, eps = f32(opt.get("b1", 0.9)), f32(opt.get("b2", 0.999)), f32(opt.get("eps", 1e-8))
    clip = f32(opt.get("clip_global_norm", 0.0))
    t0 = spec.get("first_step", 1)

    params = {"w1": load(spec["w1"], (L, d, width))}
    if hd:
        params["w2"] = load(spec["w2"], (L, hd, d))
    x0 = load(spec["inputs"], (B, d))
    target = load(spec["targets"], (B, d)) if spec.get("loss", "sum") == "mse" else None
    mu = {k: np.zeros_like(v) for k, v in params.items()}
    nu = {k: np.zeros_like(v) for k, v in params.items()}

    outputs, initial_loss = forward(spec, params, x0, target)
    losses, norms, clipped, grads = [], [], [], {}
    for i in range(steps):
        t = t0 + i
        loss, grads = forward_backward(spec, params, x0, target)
        norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
        did_clip = clip > 0 and not norm < clip
        losses.append(loss)
        norms.append(norm)
        clipped.append(did_clip)
        if kind == "none":
            continue
        for k, g in grads.items():
            g = g * (clip / norm) if did_clip else g
            if kind == "sgd":
                params[k] = params[k] - lr * g
            elif kind == "adam":
                mu[k] = b1 * mu[k] + (1.0 - b1) * g
                nu[k] = b2 * nu[k] + (1.0 - b2) * g * g
                mu_hat = mu[k] / (1.0 - b1 ** t)
                nu_hat = nu[k] / (1.0 - b2 ** t)
                params[k] = params[k] - lr * mu_hat / (np.sqrt(nu_hat) + eps)
            else:
                raise SystemExit(f"train_reference: unknown optimizer '{kind}'")

    out = spec["out"]
    os.makedirs(out, exist_ok=True)
    for k, v in params.items():
        save(os.path.join(out, f"{k}.f32"), v)
        save(os.path.join(out, f"grad_{k}.f32"), grads[k])
        if kind == "adam":
            save(os.path.join(out, f"mu_{k}.f32"), mu[k])
            save(os.path.join(out, f"nu_{k}.f32"), nu[k])
    save(os.path.join(out, "outputs.f32"), outputs)
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"losses": losses, "grad_norms": norms, "clipped": clipped,
                   "initial_loss": initial_loss}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
