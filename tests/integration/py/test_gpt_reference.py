#!/usr/bin/env python3
"""test_gpt_reference.py - checks gpt_reference.py (the JAX GPT-2 the
integration tests compare tstaged against) against a float64 numpy GPT-2
written here from the formulas, independently of it.

Usage: nice python3 tests/integration/py/test_gpt_reference.py
Exit status 0 when every check passes, 1 otherwise.

Tiny model: V=37, C=16, L=2, d=24, heads=4, d_ff=96, batch 3. Checks:
  - forward: the reference's loss and logits against float64 numpy (1e-5);
  - gradients: against central finite differences of the float64 loss, a
    few elements of every weight;
  - windows: offsets by the documented definitions (computed here again),
    never past the end of the stream, the steps' losses on exactly those
    windows, and "next" continuing a run exactly;
  - accumulate: k micro-batches give the gradient of the k*B-row batch;
  - AdamW: decay "matrices" decays exactly the table's matrices, the
    learning rates follow the warmup-cosine formula;
  - bfloat16: the loss against float64 numpy with every product's operands
    rounded to bfloat16 (and far enough from the float32 loss to show it);
  - generation: greedy tokens equal the float64 model's argmax loop (the
    context cropped to C), top_k=1 sampling equals greedy;
  - a bad spec exits with status 2.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# XLA's LLVM optimizations off: these shapes compile 2-3x faster and run in
# milliseconds either way (the integration tests run the reference as is)
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import gpt_reference as ref  # noqa: E402

V, C, L, D, H, F, B = 37, 16, 2, 24, 4, 96, 3
CFG = {"vocab": V, "context": C, "layers": L, "d_model": D, "heads": H, "d_ff": F}
FAILS = []


T0 = time.time()


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + f"[{time.time() - T0:5.1f} s] " + what)
    if not ok:
        FAILS.append(what)


# ---- an independent float64 GPT-2 ----------------------------------------------------

SHAPES = {
    "wte": (V, D), "wpe": (C, D),
    "ln1_g": (L, D), "ln1_b": (L, D), "attn_qkv_w": (L, D, 3 * D), "attn_qkv_b": (L, 3 * D),
    "attn_o_w": (L, D, D), "attn_o_b": (L, D), "ln2_g": (L, D), "ln2_b": (L, D),
    "mlp_fc_w": (L, D, F), "mlp_fc_b": (L, F), "mlp_proj_w": (L, F, D), "mlp_proj_b": (L, D),
    "lnf_g": (D,), "lnf_b": (D,),
}
MATRICES = {"wte", "wpe", "attn_qkv_w", "attn_o_w", "mlp_fc_w", "mlp_proj_w"}


def bf16(x):
    """x rounded to bfloat16 (nearest even), as float64."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def np_layer_norm(x, g, b):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def np_gelu(z):
    return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3)))


def np_logits(w, ids, rounded=False):
    r = bf16 if rounded else (lambda a: a)

    def mm(a, b):
        return np.matmul(r(a), r(b))

    n, T = ids.shape
    hd = D // H
    x = w["wte"][ids] + w["wpe"][np.arange(T)]
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    for l in range(L):
        h = np_layer_norm(x, w["ln1_g"][l], w["ln1_b"][l])
        qkv = mm(h, w["attn_qkv_w"][l]) + w["attn_qkv_b"][l]
        y = np.empty((n, T, D))
        for j in range(H):
            cols = slice(j * hd, (j + 1) * hd)
            q = qkv[:, :, 0 * D:1 * D][:, :, cols]
            k = qkv[:, :, 1 * D:2 * D][:, :, cols]
            v = qkv[:, :, 2 * D:3 * D][:, :, cols]
            s = mm(q, k.transpose(0, 2, 1)) * (1.0 / math.sqrt(hd))
            s[:, future] = -np.inf
            e = np.exp(s - s.max(axis=-1, keepdims=True))
            y[:, :, cols] = mm(e / e.sum(axis=-1, keepdims=True), v)
        x = x + mm(y, w["attn_o_w"][l]) + w["attn_o_b"][l]
        h = np_layer_norm(x, w["ln2_g"][l], w["ln2_b"][l])
        x = x + mm(np_gelu(mm(h, w["mlp_fc_w"][l]) + w["mlp_fc_b"][l]), w["mlp_proj_w"][l]) \
            + w["mlp_proj_b"][l]
    x = np_layer_norm(x, w["lnf_g"], w["lnf_b"])
    return mm(x, w["wte"].T)


def np_loss(w, ids, tgt, rounded=False):
    z = np_logits(w, ids, rounded)
    m = z.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z - m).sum(axis=-1)) + m[..., 0]
    picked = np.take_along_axis(z, tgt[..., None], axis=-1)[..., 0]
    return float(np.mean(lse - picked))


# ---- fixtures ------------------------------------------------------------------------


def make_weights(seed=3):
    rng = np.random.default_rng(seed)
    w = {}
    for name, shape in SHAPES.items():
        if name.endswith("_g"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name in MATRICES:
            a = (0.5 if name in ("wte", "wpe") else 0.25) * rng.standard_normal(shape)
        else:
            a = 0.05 * rng.standard_normal(shape)
        w[name] = a.astype(np.float32)
    return w


def write_weights(directory, w):
    os.makedirs(directory, exist_ok=True)
    for name, a in w.items():
        a.astype("<f4").tofile(os.path.join(directory, name + ".f32"))


def read_out(out, name, shape):
    return np.fromfile(os.path.join(out, name), dtype="<f4").reshape(shape).astype(np.float64)


def f64(w):
    return {k: v.astype(np.float64) for k, v in w.items()}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


# ---- the checks ----------------------------------------------------------------------


def check_table():
    shapes = ref.weight_shapes(CFG)
    check(shapes == SHAPES, "WEIGHTS table: the documented file names and shapes")
    check({n for n, _, _, m in ref.WEIGHTS if m} == MATRICES,
          "WEIGHTS table: the matrices are the embeddings and the layers' weight matrices")


def check_forward_and_grads(tmp, w):
    rng = np.random.default_rng(5)
    T = 12
    ids = rng.integers(0, V, (B, T)).astype("<i4")
    tgt = rng.integers(0, V, (B, T)).astype("<i4")
    ids.tofile(os.path.join(tmp, "ids.i32"))
    tgt.tofile(os.path.join(tmp, "tgt.i32"))
    out = os.path.join(tmp, "out_f32")
    res = ref.run({"gpt": CFG, "weights": os.path.join(tmp, "w"), "out": out,
                   "inputs": os.path.join(tmp, "ids.i32"), "targets": os.path.join(tmp, "tgt.i32"),
                   "batch": B, "tokens": T, "grads": True, "evaluate": {"positions": "all"}})
    w64 = f64(w)
    want = np_loss(w64, ids.astype(np.int64), tgt.astype(np.int64))
    check(rel(res["initial_loss"], want) < 1e-5,
          f"forward loss {res['initial_loss']:.7f} vs float64 {want:.7f} (rel {rel(res['initial_loss'], want):.2g})")
    check(rel(res["eval_loss"], want) < 1e-5, "evaluate's loss is the same loss")
    z = read_out(out, "logits.f32", (B, T, V))
    z64 = np_logits(w64, ids.astype(np.int64))
    err = np.abs(z - z64).max() / np.abs(z64).max()
    check(err < 1e-5, f"logits [B, T, V] vs float64 (max err {err:.2g} of max|z|)")

    # central differences of the float64 loss
    h = 1e-5
    worst = 0.0
    for name, shape in SHAPES.items():
        g = read_out(out, f"grad_{name}.f32", shape)
        scale = max(np.abs(g).max(), 1e-3)
        picks = [tuple(int(rng.integers(0, n)) for n in shape) for _ in range(3)]
        if name == "wpe":  # rows past T have no gradient: check one of them too
            picks = [(int(rng.integers(0, T)), int(rng.integers(0, D))) for _ in range(3)]
            picks.append((T + 1, 0))
        picks.append(np.unravel_index(np.argmax(np.abs(g)), shape))
        for idx in picks:
            wp, wm = dict(w64), dict(w64)
            wp[name] = w64[name].copy()
            wm[name] = w64[name].copy()
            wp[name][idx] += h
            wm[name][idx] -= h
            fd = (np_loss(wp, ids, tgt) - np_loss(wm, ids, tgt)) / (2 * h)
            err = abs(g[idx] - fd) / scale
            worst = max(worst, err)
            if err > 1e-4:
                check(False, f"grad_{name}{list(map(int, idx))} = {g[idx]:.8g}, finite difference {fd:.8g}")
    check(worst <= 1e-4, f"gradients vs central differences of the float64 loss: worst {worst:.2g} "
          "of the weight's max|g| (4-5 elements of each of the 16 weights)")
    return ids, tgt


def sm64(seed, q):
    """SplitMix64's output q (0-based) for seed, written out again."""
    m = (1 << 64) - 1
    z = (seed + 0x9e3779b97f4a7c15 * (q + 1)) & m
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & m
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & m
    return z ^ (z >> 31)


def check_windows(tmp, w):
    # the definition, over many stream lengths: inside the stream, and
    # sequential reaches every whole window of an epoch
    inside, cover = True, True
    for n in range(2, 80):
        for T in range(1, min(n, 20)):
            for order in ("sequential", "random"):
                o = ref.window_offsets(n, T, order, 7, 5, 60)
                inside &= bool(o.min() >= 0 and o.max() + T + 1 <= n)
            o = ref.window_offsets(n, T, "sequential", 0, 0, (n - 1) // T)
            cover &= bool(o[-1] + T + 1 > n - T)  # no whole window left after the last
    check(inside, "windows: o + T + 1 <= n for every stream length 2..79, context, order")
    check(cover, "windows: a sequential epoch ends within T tokens of the stream's end")
    # first SplitMix64 outputs of seed 0 (the published sequence)
    check(ref.splitmix64(0, 0) == 0xe220a8397b1dcdaf and ref.splitmix64(0, 1) == 0x6e789e6aa1b965f4,
          "windows: splitmix64 is SplitMix64 (seed 0: e220a8397b1dcdaf, 6e789e6aa1b965f4)")

    T, k, steps = 12, 2, 3  # the shapes of the other checks: compiled once
    rng = np.random.default_rng(9)
    n = 5 * T + 1  # the last sequential window ends at the stream's last token
    stream = rng.integers(0, V, n).astype("<u2")
    path = os.path.join(tmp, "stream.u16")
    stream.tofile(path)
    opt = {"type": "sgd", "learning_rate": 0.0}
    w64 = f64(w)
    for order, seed, start in (("sequential", 0, 3), ("random", 12345, 2)):
        spec = {"gpt": CFG, "weights": os.path.join(tmp, "w"), "out": os.path.join(tmp, "out_win"),
                "steps": steps, "accumulate": k, "optimizer": opt,
                "windows": {"stream": path, "context": T, "batch_size": B, "order": order,
                            "seed": seed, "start": start}}
        res = ref.run(spec)
        want = []
        for s in range(steps):
            row = []
            for j in range(k * B):
                q = start + s * k * B + j
                row.append((q % ((n - 1) // T)) * T if order == "sequential" else sm64(seed, q) % (n - T))
            want.append(row)
        check(res["windows"]["offsets"] == want,
              f"windows {order}: offsets as documented ({want[0][:4]}...)")
        check(res["windows"]["next"] == start + steps * k * B, f"windows {order}: next")
        if order == "sequential":
            flat = [o for r in want for o in r]
            check(max(flat) + T + 1 == n, "windows sequential: reaches the stream's end, wraps to 0")
        ok = True
        for s in range(steps):
            for m in range(k):
                offs = np.asarray(want[s][m * B:(m + 1) * B])
                win = stream.astype(np.int64)[offs[:, None] + np.arange(T + 1)]
                l64 = np_loss(w64, win[:, :-1], win[:, 1:])
                ok &= rel(res["micro_losses"][s * k + m], l64) < 1e-5
            ok &= rel(res["losses"][s], np.mean(res["micro_losses"][s * k:(s + 1) * k])) < 1e-6
        check(ok, f"windows {order}: each micro-batch's loss is the float64 loss of its windows")
    # continuation: 1 step, then 2 from next == 3 steps (random order, Adam)
    adam = {"type": "adamw", "learning_rate": 1e-2}
    win = {"stream": path, "context": T, "batch_size": B, "order": "random", "seed": 4, "start": 0}
    a = ref.run({"gpt": CFG, "weights": os.path.join(tmp, "w"), "out": os.path.join(tmp, "out_c"),
                 "steps": 3, "optimizer": adam, "windows": win})
    b = ref.run({"gpt": CFG, "weights": os.path.join(tmp, "w"), "out": os.path.join(tmp, "out_c1"),
                 "steps": 1, "optimizer": adam, "windows": win})
    c = ref.run({"gpt": CFG, "weights": os.path.join(tmp, "w"), "out": os.path.join(tmp, "out_c2"),
                 "steps": 2, "optimizer": adam, "windows": dict(win, start=b["windows"]["next"])})
    check(a["windows"]["offsets"] == b["windows"]["offsets"] + c["windows"]["offsets"],
          "windows: 1 step, then 2 from \"next\", draw the windows of one 3-step run")


def check_accumulate(tmp, ids, tgt):
    """k = 2 micro-batches of B rows against each half's gradient (the shapes
    compiled already): the accumulated gradient is their mean."""
    rng = np.random.default_rng(11)
    T = ids.shape[1]
    ids2 = np.concatenate([ids, rng.integers(0, V, (B, T)).astype("<i4")])
    tgt2 = np.concatenate([tgt, rng.integers(0, V, (B, T)).astype("<i4")])
    ids2.tofile(os.path.join(tmp, "ids2.i32"))
    tgt2.tofile(os.path.join(tmp, "tgt2.i32"))
    ids2[B:].tofile(os.path.join(tmp, "ids_h.i32"))
    tgt2[B:].tofile(os.path.join(tmp, "tgt_h.i32"))
    base = {"gpt": CFG, "weights": os.path.join(tmp, "w"), "tokens": T, "batch": B, "grads": True}
    a = ref.run(dict(base, out=os.path.join(tmp, "out_k2"), accumulate=2, inputs=os.path.join(tmp, "ids2.i32"),
                     targets=os.path.join(tmp, "tgt2.i32")))
    h = ref.run(dict(base, out=os.path.join(tmp, "out_h"), inputs=os.path.join(tmp, "ids_h.i32"),
                     targets=os.path.join(tmp, "tgt_h.i32")))
    worst = 0.0
    for name, shape in SHAPES.items():
        ga = read_out(os.path.join(tmp, "out_k2"), f"grad_{name}.f32", shape)
        g0 = read_out(os.path.join(tmp, "out_f32"), f"grad_{name}.f32", shape)
        g1 = read_out(os.path.join(tmp, "out_h"), f"grad_{name}.f32", shape)
        gm = (g0 + g1) / 2
        worst = max(worst, np.abs(ga - gm).max() / max(np.abs(gm).max(), 1e-30))
    l64 = np_loss(f64(make_weights()), ids2, tgt2)
    check(worst < 1e-6 and rel(a["initial_loss"], l64) < 1e-5,
          f"accumulate 2 x {B} rows: the mean of the halves' gradients (max err {worst:.2g}), "
          f"the loss of all {2 * B} rows")


def check_adamw(tmp, w):
    sched = {"type": "warmup_cosine_decay", "init_value": 0.0, "peak_value": 1e-2,
             "warmup_steps": 2, "decay_steps": 6, "end_value": 1e-3}
    opt = {"type": "adamw", "schedule": sched, "weight_decay": 0.5, "clip_global_norm": 0.5}
    base = {"gpt": CFG, "weights": os.path.join(tmp, "w"), "inputs": os.path.join(tmp, "ids.i32"),
            "targets": os.path.join(tmp, "tgt.i32"), "batch": B, "tokens": 12, "steps": 7,
            "adam_state": True}
    a = ref.run(dict(base, out=os.path.join(tmp, "out_all"), optimizer=dict(opt, decay="all")))
    m = ref.run(dict(base, out=os.path.join(tmp, "out_mat"), optimizer=dict(opt, decay="matrices")))
    want = [0.0, 5e-3] + [1e-3 + (1e-2 - 1e-3) * 0.5 * (1 + math.cos(math.pi * (s - 2) / 4))
                          for s in range(2, 7)]
    check(all(abs(x - y) < 1e-8 for x, y in zip(a["learning_rates"], want)),
          f"warmup-cosine learning rates {['%.4g' % x for x in a['learning_rates']]}")
    check(a["clipped"][0] and a["grad_norms"][0] > 0.5, "clipping: the first step's norm is clipped")
    check(all(x < a["losses"][0] for x in a["losses"][3:]), "AdamW lowers the loss")
    # one step: the two masks differ by exactly lr*wd*w on the non-matrices
    one = dict(base, steps=2, adam_state=False)
    ref.run(dict(one, out=os.path.join(tmp, "out_all1"), optimizer=dict(opt, decay="all")))
    ref.run(dict(one, out=os.path.join(tmp, "out_mat1"), optimizer=dict(opt, decay="matrices")))
    same, diff = True, True
    for name, shape in SHAPES.items():
        wa = read_out(os.path.join(tmp, "out_all1"), f"{name}.f32", shape)
        wm = read_out(os.path.join(tmp, "out_mat1"), f"{name}.f32", shape)
        if name in MATRICES:
            same &= bool(np.array_equal(wa, wm))
        else:  # step 0's lr is 0: only step 1 (lr 5e-3) decays
            w0 = w[name].astype(np.float64)
            diff &= bool(np.allclose(wm - wa, 5e-3 * 0.5 * w0, atol=1e-6, rtol=1e-3))
    check(same, "decay matrices: the matrices' updates equal decay all's")
    check(diff, "decay matrices: LayerNorm scales/biases and biases are not decayed")
    check(os.path.exists(os.path.join(tmp, "out_mat", "mu_attn_qkv_w.f32"))
          and os.path.getsize(os.path.join(tmp, "out_mat", "nu_lnf_b.f32")) == 4 * D,
          "adam_state: mu_/nu_ files of every weight")


def check_bf16(tmp, w, ids, tgt):
    """bfloat16 rounding is discontinuous: where float32 and float64 round an
    operand to different sides (rare), the difference spreads downstream, so
    the logits are compared as mostly identical, the rest far closer than
    the rounding itself moves them."""
    base = {"gpt": CFG, "weights": os.path.join(tmp, "w"), "inputs": os.path.join(tmp, "ids.i32"),
            "targets": os.path.join(tmp, "tgt.i32"), "batch": B, "tokens": ids.shape[1],
            "grads": True, "dtype": "bfloat16", "evaluate": {"positions": "all"}}
    res = ref.run(dict(base, out=os.path.join(tmp, "out_bf16")))
    w64 = f64(w)
    z = read_out(os.path.join(tmp, "out_bf16"), "logits.f32", (B, ids.shape[1], V))
    zr, z32 = np_logits(w64, ids, rounded=True), np_logits(w64, ids)
    s = np.abs(zr).max()
    err, effect = np.abs(z - zr) / s, np.abs(zr - z32).max() / s
    same = float(np.mean(err < 1e-6))
    check(same > 0.75 and err.max() < 0.1 * effect,
          f"bfloat16 logits vs float64 with every product's operands rounded to bf16: {same:.0%} "
          f"within 1e-6, max err {err.max():.2g}; the rounding moves them by {effect:.2g}")
    want = np_loss(w64, ids, tgt, rounded=True)
    check(rel(res["initial_loss"], want) < 1e-4,
          f"bfloat16 loss {res['initial_loss']:.7f} vs float64 with bf16 operands {want:.7f}")
    g = read_out(os.path.join(tmp, "out_bf16"), "grad_attn_qkv_w.f32", SHAPES["attn_qkv_w"])
    g32 = read_out(os.path.join(tmp, "out_f32"), "grad_attn_qkv_w.f32", SHAPES["attn_qkv_w"])
    d = np.abs(g - g32).max() / np.abs(g32).max()
    check(1e-4 < d < 0.1, f"bfloat16 gradients differ from float32's by {d:.2g} of max|g|")


def check_generate(tmp, w):
    prompt = [5, 17, 2]
    n = 20  # past C: the context is cropped to the last C tokens
    res = ref.run({"gpt": CFG, "weights": os.path.join(tmp, "w"), "out": os.path.join(tmp, "out_gen"),
                   "generate": {"prompt": prompt, "max_tokens": n, "temperature": 0}})
    w64 = f64(w)
    seq, margin = list(prompt), np.inf
    for _ in range(n):
        z = np_logits(w64, np.asarray([seq[-C:]]))[0, -1]
        top2 = np.sort(z)[-2:]
        margin = min(margin, top2[1] - top2[0])
        seq.append(int(np.argmax(z)))
    check(res["tokens"] == seq[len(prompt):],
          f"greedy generation = float64 argmax loop ({n} tokens, smallest top-2 gap {margin:.2g})")
    s1 = ref.run({"gpt": CFG, "weights": os.path.join(tmp, "w"), "out": os.path.join(tmp, "out_gen1"),
                  "generate": {"prompt": prompt, "max_tokens": n, "temperature": 0.7, "top_k": 1,
                               "seed": 3}})
    check(s1["tokens"] == res["tokens"], "sampling with top_k 1 = greedy")
    s2 = ref.run({"gpt": CFG, "weights": os.path.join(tmp, "w"), "out": os.path.join(tmp, "out_gen2"),
                  "generate": {"prompt": prompt, "max_tokens": n, "temperature": 5.0, "top_k": 0,
                               "seed": 3}})
    check(s2["tokens"] != res["tokens"] and all(0 <= t < V for t in s2["tokens"]),
          "sampling at temperature 5 leaves the greedy path, ids in [0, V)")


def check_bad_spec(tmp):
    path = os.path.join(tmp, "bad.json")
    with open(path, "w") as f:
        json.dump({"gpt": dict(CFG, heads=5), "weights": os.path.join(tmp, "w"),
                   "out": os.path.join(tmp, "out_bad")}, f)
    p = subprocess.run([sys.executable, os.path.join(HERE, "gpt_reference.py"), path],
                       capture_output=True, text=True)
    check(p.returncode == 2 and "multiple of gpt.heads" in p.stderr,
          f"bad spec (d_model 24, heads 5): exit {p.returncode}")
    np.arange(12, dtype="<u2").tofile(os.path.join(tmp, "short.u16"))
    try:
        ref.run({"gpt": CFG, "weights": os.path.join(tmp, "w"), "out": os.path.join(tmp, "out_bad"),
                 "steps": 1, "optimizer": {"type": "sgd", "learning_rate": 0.1},
                 "windows": {"stream": os.path.join(tmp, "short.u16"), "context": 12,
                             "batch_size": 1}})
        check(False, "a context past the stream is refused")
    except ref.BadSpec:
        check(True, "a window longer than the stream is a bad spec")


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="gptref.") as tmp:
        w = make_weights()
        write_weights(os.path.join(tmp, "w"), w)
        check_table()
        ids, tgt = check_forward_and_grads(tmp, w)
        check_windows(tmp, w)
        check_accumulate(tmp, ids, tgt)
        check_adamw(tmp, w)
        check_bf16(tmp, w, ids, tgt)
        check_generate(tmp, w)
        check_bad_spec(tmp)
    print(f"{'FAILED ' + str(len(FAILS)) if FAILS else 'all passed'} in {time.time() - t0:.1f} s")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
