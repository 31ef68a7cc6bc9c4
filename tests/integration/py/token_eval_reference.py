#!/usr/bin/env python3
"""token_eval_reference.py - a float64 numpy reference of a token model's
forward pass and loss (what :evaluate computes), for it_tokens to compare a
daemon's evaluation against.

Usage: token_eval_reference.py SPEC.json

The model, written from its formulas rather than from tstage's code:
  x_0 = embed[ids]                      (embed [vocab, d], one row per token)
  layer l:  h = x @ w1[l];  a = act(h);  y = a @ w2[l];  x = x + y (residual)
  logits = x_L @ proj                   (proj [d, vocab]; x_L without one)
  loss = mean over tokens of logsumexp(logits) - logits[target]
  act: relu, tanh, none, gelu (the tanh approximation, jax.nn.gelu's default)

SPEC.json (paths are raw little-endian, C order; weights float32, ids of
"id_dtype", uint16 or int32):
  {"layers": L, "d_model": d, "d_hidden": h, "vocab": V, "activation": "relu",
   "residual": true, "projection": true, "id_dtype": "uint16", "tokens": n,
   "embed": path, "w1": path, "w2": path, "proj": path (when projection),
   "inputs": path, "targets": path, "out": directory}

Writes into "out": logits.f32 (float32 [n, V]) and result.json {"loss": x}.
"""
import json
import math
import os
import sys

import numpy as np

GELU_S = math.sqrt(2.0 / math.pi)


def act(name, h):
    if name == "none":
        return h
    if name == "relu":
        return np.maximum(h, 0.0)
    if name == "tanh":
        return np.tanh(h)
    if name == "gelu":
        return 0.5 * h * (1.0 + np.tanh(GELU_S * (h + 0.044715 * h ** 3)))
    raise SystemExit(f"token_eval_reference: unknown activation '{name}'")


def load(path, dtype, shape):
    return np.fromfile(path, dtype=dtype).reshape(shape)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    with open(sys.argv[1]) as f:
        s = json.load(f)
    L, d, hd, V, n = s["layers"], s["d_model"], s["d_hidden"], s["vocab"], s["tokens"]
    ids_t = np.dtype("<u2") if s["id_dtype"] == "uint16" else np.dtype("<i4")
    f32 = np.dtype("<f4")
    embed = load(s["embed"], f32, (V, d)).astype(np.float64)
    w1 = load(s["w1"], f32, (L, d, hd)).astype(np.float64)
    w2 = load(s["w2"], f32, (L, hd, d)).astype(np.float64)
    ids = load(s["inputs"], ids_t, (n,)).astype(np.int64)
    tgt = load(s["targets"], ids_t, (n,)).astype(np.int64)
    x = embed[ids]
    for l in range(L):
        y = act(s["activation"], x @ w1[l]) @ w2[l]
        x = x + y if s.get("residual") else y
    logits = x @ load(s["proj"], f32, (d, V)).astype(np.float64) if s.get("projection") else x
    m = logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(axis=1)) + m[:, 0]
    loss = float(np.mean(lse - logits[np.arange(n), tgt]))
    os.makedirs(s["out"], exist_ok=True)
    logits.astype(f32).tofile(os.path.join(s["out"], "logits.f32"))
    with open(os.path.join(s["out"], "result.json"), "w") as f:
        json.dump({"loss": loss}, f)


if __name__ == "__main__":
    main()
