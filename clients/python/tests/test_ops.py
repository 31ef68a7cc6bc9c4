"""Moves, operations, safetensors and models against a live tstaged."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

import tstage

RNG = np.random.default_rng(11)

MLP = {"mlp": {"layers": 2, "d_model": 16, "d_hidden": 32, "activation": "gelu",
               "residual": True},
       "loss": "mse", "optimizer": {"type": "adam", "learning_rate": 1e-3},
       "placement": {"device": "sim:0"}}


def kinds(client, name):
    return [(s["device"], s["memory_kind"]) for s in client.info(name)["shards"]]


def test_device_put_between_memory_kinds(client):
    a = RNG.random((64, 33)).astype(np.float32)
    client.put("w", a, device="sim:0", memory_kind="device")
    for dev, kind in [("sim:0", "pinned_host"), ("sim:0", "unpinned_host"),
                      ("sim:1", "device"), ("sim:1", "pinned_host"), ("sim:0", "device")]:
        op = client.device_put("w", device=dev, memory_kind=kind)
        assert isinstance(op, tstage.Operation) and op.kind == "put" and op.target == "w"
        meta = op.result(timeout=60)
        assert meta["sharding"] == {"device": dev, "memory_kind": kind}
        assert kinds(client, "w") == [(dev, kind)]
        assert client.get("w").tobytes() == a.tobytes()
    meta = client.device_put("w", memory_kind="pinned_host", wait=True)
    assert meta["sharding"]["memory_kind"] == "pinned_host"


def test_copy_between_memory_kinds_and_donate(client):
    a = RNG.integers(0, 1000, (40, 8), dtype=np.int64)
    client.put("src", a, device="sim:1", memory_kind="pinned_host")
    meta = client.copy("src", "dst", device="sim:0", memory_kind="device", wait=True)
    assert meta["name"] == "dst" and kinds(client, "dst") == [("sim:0", "device")]
    assert np.array_equal(client.get("dst"), a)
    with pytest.raises(tstage.AlreadyExists):
        client.copy("src", "dst", memory_kind="unpinned_host", wait=True)
    op = client.copy("src", "dst", memory_kind="unpinned_host", overwrite=True, donate=True)
    op.wait(timeout=60)
    assert op.state == "SUCCEEDED" and op.done
    assert kinds(client, "dst") == [("sim:1", "unpinned_host")]  # the source's device
    assert not client.exists("src")
    assert np.array_equal(client.get("dst"), a)


def test_sharded_upload_and_put(client):
    client.create_sharding("rows2", {"mesh": {"devices": ["sim:0", "sim:1"], "axis_names": ["x"]},
                                     "spec": ["x"], "memory_kind": "device"})
    a = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    client.put("sh", a, sharding="rows2")
    assert sorted(kinds(client, "sh")) == [("sim:0", "device"), ("sim:1", "device")]
    assert "sim:1" in client.sharding("sh", text=True)
    client.device_put("sh", sharding={"device": "sim:0", "memory_kind": "pinned_host"}, wait=True)
    assert kinds(client, "sh") == [("sim:0", "pinned_host")]
    assert np.array_equal(client.get("sh"), a)


def test_gather_rows_and_slice(client):
    a = np.arange(10 * 3, dtype=np.int32).reshape(10, 3)
    client.put("g", a, memory_kind="pinned_host")
    meta = client.gather("g", [7, 1, 1, -1], "gb", device="sim:1", memory_kind="device")
    assert meta["shape"] == [4, 3] and kinds(client, "gb") == [("sim:1", "device")]
    assert np.array_equal(client.get("gb"), a[[7, 1, 1, -1]])
    client.gather("g", slice(0, 10, 3), "gs")
    assert np.array_equal(client.get("gs"), a[0:10:3])


def test_operation_wait_progress_bar_in_bytes(client, capsys):
    a = np.zeros(8 << 20, np.uint8)
    client.put("p", a, memory_kind="unpinned_host")
    op = client.device_put("p", device="sim:0", memory_kind="device")
    op.wait(timeout=60, progress=True)
    assert op.state == "SUCCEEDED"
    assert op.progress == {"bytes_done": a.nbytes, "bytes_total": a.nbytes}
    err = capsys.readouterr().err
    assert "put p" in err and "8.00M" in err  # tqdm's bar, in bytes


def test_step_progress_wait_timeout_and_cancel(client, capsys):
    client.create_model("mlp", MLP)
    client.put("x", RNG.random((8, 16)).astype(np.float32), device="sim:0")
    client.put("t", RNG.random((8, 16)).astype(np.float32), device="sim:0")
    op = client.step("mlp", "x", "t", steps=1000000)
    assert op.kind == "step" and op.progress["steps_total"] == 1000000
    with pytest.raises(tstage.DeadlineExceeded):
        op.wait(timeout=0.5, progress=True)
    assert "steps" in capsys.readouterr().err
    assert op.refresh().progress["steps_done"] > 0
    op.cancel()
    op.wait(timeout=60)
    assert op.state == "CANCELLED" and op.done
    with pytest.raises(tstage.Cancelled):
        op.result()
    assert isinstance(op.exception(), tstage.Cancelled)
    assert client.model("mlp")["steps"] == op.progress["steps_done"]
    assert op.id in [o.id for o in client.operations(state="CANCELLED")]


def test_aborted_while_a_step_holds_the_weights(client):
    c = tstage.Client(client.url, retries=0)
    client.create_model("mlp", MLP)
    client.put("x", RNG.random((8, 16)).astype(np.float32), device="sim:0")
    client.put("t", RNG.random((8, 16)).astype(np.float32), device="sim:0")
    op = client.step("mlp", "x", "t", steps=1000000)
    try:
        with pytest.raises(tstage.Aborted) as e:
            c.put("mlp.w1", np.zeros((2, 16, 32), np.float32))
        assert e.value.retryable and op.id in e.value.message
    finally:
        op.cancel().wait(timeout=60)
        c.close()


def test_model_create_analyze_step(client):
    spec_peak = client.analyze(dict(MLP, name="mlp"), [8, 16])["peak_device_bytes"]
    model = client.create_model("mlp", MLP)
    assert model["state"] == "READY" and model["steps"] == 0
    assert set(model["arrays"]) >= {"w1", "w2", "adam.mu.w1"}
    assert [m["name"] for m in client.models()] == ["mlp"]
    an = client.analyze("mlp", [8, 16])
    assert an["peak_device_bytes"] == spec_peak > 0
    x = RNG.random((8, 16)).astype(np.float32)
    t = RNG.random((8, 16)).astype(np.float32)
    client.put("x", x, device="sim:0")
    client.put("t", t, device="sim:0")
    rep = client.step("mlp", "x", "t", steps=3, wait=True)
    assert len(rep["losses"]) == 3 and rep["losses"][2] < rep["losses"][0]
    assert rep["measured_peak_device_bytes"] == rep["predicted_peak_device_bytes"]
    assert client.model("mlp")["steps"] == 3
    # data-driven: rows of a dataset array
    client.put("data", RNG.random((100, 16)).astype(np.float32), memory_kind="pinned_host")
    client.put("labels", RNG.random((100, 16)).astype(np.float32), memory_kind="pinned_host")
    op = client.step("mlp", tstage.rows("data", [17, 4, 99, 23]),
                     tstage.rows("labels", [17, 4, 99, 23]), steps=2)
    rep = op.result(timeout=60)
    assert len(rep["losses"]) == 2 and op.progress["steps_done"] == 2
    w1 = client.get("mlp.w1")
    assert w1.shape == (2, 16, 32) and w1.dtype == np.float32
    client.delete_model("mlp")
    assert not client.exists("mlp.w1")


def test_model_on_two_devices(client):
    """placement devices: a replica on each, the batch split, the same
    training as one device on the whole batch (SGD: within float32 sums)."""
    spec = dict(MLP, optimizer={"type": "sgd", "learning_rate": 0.1}, init={"seed": 3})
    client.create_model("dp", dict(spec, placement={"devices": ["sim:0", "sim:1"]}))
    client.create_model("one", spec)
    assert client.model("dp")["placement"]["devices"] == ["sim:0", "sim:1"]
    an = client.analyze("dp", [8, 16])
    assert an["replicas"] == 2 and an["all_reduce_bytes"] == 2 * 2 * 16 * 32 * 4
    x = RNG.random((8, 16)).astype(np.float32)
    t = RNG.random((8, 16)).astype(np.float32)
    client.put("x", x, device="sim:0")
    client.put("t", t, device="sim:0")
    rd = client.step("dp", "x", "t", steps=3, wait=True)
    r1 = client.step("one", "x", "t", steps=3, wait=True)
    np.testing.assert_allclose(rd["losses"], r1["losses"], rtol=1e-5)
    assert [d["device"] for d in rd["devices"]] == ["sim:0", "sim:1"]
    assert rd["all_reduce_bytes"] == 3 * an["all_reduce_bytes"]
    w = client.get("one.w1")
    np.testing.assert_allclose(client.get("dp.w1"), w, atol=2e-5 * float(np.abs(w).max()))
    with pytest.raises(tstage.TstageError) as e:
        client.step("dp", tstage.rows("x", [0, 1, 2]), tstage.rows("t", [0, 1, 2]), wait=True)
    assert e.value.reason == "BAD_BATCH"


LM = {"mlp": {"layers": 1, "d_model": 16, "d_hidden": 32, "activation": "gelu",
              "residual": True, "vocab": 50, "projection": True},
      "optimizer": {"type": "adam", "learning_rate": 1e-2, "clip_global_norm": 1.0},
      "placement": {"device": "sim:0"}}


def test_windows_evaluate_analyze(client):
    stream = RNG.integers(0, 50, 7 * 41).astype(np.uint16).reshape(7, 41)   # any shape
    client.put("stream", stream, memory_kind="pinned_host")
    client.create_model("lm", LM)
    client.create_model("cp", LM)
    w = tstage.windows("stream", 8, 4, start=3)
    rep = client.step("lm", windows=w, steps=3, wait=True)
    assert len(rep["losses"]) == 3 and len(rep["learning_rates"]) == 3
    assert len(rep["grad_norms"]) == 3 and rep["learning_rates"][0] == np.float32(1e-2)
    assert rep["windows"]["next"] == 3 + 3 * 4
    assert rep["windows"]["windows_per_epoch"] == (stream.size - 1) // 8
    # the same steps on explicit copies of the windows (docs/API.md's offsets)
    flat, per = stream.reshape(-1), (stream.size - 1) // 8
    for i in range(3):
        offs = [((3 + i * 4 + b) % per) * 8 for b in range(4)]
        client.put("x", np.stack([flat[o:o + 8] for o in offs]), device="sim:0")
        client.put("t", np.stack([flat[o + 1:o + 9] for o in offs]), device="sim:0")
        one = client.step("cp", "x", "t", wait=True)
        assert one["losses"][0] == rep["losses"][i]
    assert np.array_equal(client.get("lm.w1"), client.get("cp.w1"))
    # evaluate: windows or explicit inputs, the same loss, logits [B, T, V]
    ev = client.evaluate("lm", windows=tstage.windows("stream", 8, 4, start=15),
                         outputs={"name": "logits", "memory_kind": "pinned_host"}, wait=True)
    assert ev["outputs"]["shape"] == [4, 8, 50] and ev["windows"]["next"] == 19
    offs = [((15 + b) % per) * 8 for b in range(4)]
    client.put("x", np.stack([flat[o:o + 8] for o in offs]), device="sim:0")
    client.put("t", np.stack([flat[o + 1:o + 9] for o in offs]), device="sim:0")
    op = client.evaluate("lm", "x", "t")
    assert isinstance(op, tstage.Operation) and op.result(timeout=60)["loss"] == ev["loss"]
    # analyze with the ids' dtype and the evaluation's mode
    step_an = client.analyze("lm", [4, 8], dtype="uint16")
    ev_an = client.analyze("lm", [4, 8], dtype="uint16", mode="evaluate")
    assert step_an["peak_device_bytes"] == rep["predicted_peak_device_bytes"] - 2 * 4 * 8 * 2
    assert 0 < ev_an["peak_device_bytes"] < step_an["peak_device_bytes"]
    with pytest.raises(tstage.InvalidArgument) as e:
        client.step("lm", "x", windows=w)
    assert e.value.reason == "BAD_WINDOWS"
    with pytest.raises(tstage.InvalidArgument) as e:
        client.step("lm", windows=tstage.windows("stream", 8, 1000), wait=True)
    assert "batch_size 1000" in e.value.message


GPT = {"gpt": {"vocab": 37, "context": 8, "layers": 1, "d_model": 16, "heads": 2},
       "init": {"seed": 4, "scale": 0.3}, "placement": {"device": "sim:0"}}


def test_gpt_evaluate_without_targets_and_generate(client):
    client.create_model("g", gpt=GPT["gpt"], init=GPT["init"], placement=GPT["placement"])
    ids = RNG.integers(0, 37, (3, 9)).astype(np.int32)
    client.put("x", ids[:, :-1], device="sim:0")
    client.put("t", ids[:, 1:], device="sim:0")
    with_t = client.evaluate("g", "x", "t", outputs={"name": "la"}, wait=True)
    only = client.evaluate("g", "x", outputs={"name": "lb", "memory_kind": "pinned_host"},
                           wait=True)
    last = client.evaluate("g", "x", outputs={"name": "lc"}, positions="last", wait=True)
    assert "loss" in with_t and "loss" not in only
    assert only["outputs"]["shape"] == [3, 8, 37] and last["outputs"]["shape"] == [3, 37]
    assert np.array_equal(client.get("la"), client.get("lb"))
    np.testing.assert_allclose(client.get("lc"), client.get("la")[:, -1, :], rtol=0,
                               atol=1e-6 * float(np.abs(client.get("la")).max()))
    # greedy generation is the argmax of the last position's logits, a
    # token at a time, over the last `context` tokens (positions 0..)
    prompt = [5, 1, 30]
    got = client.generate("g", prompt, 10)
    seq = list(prompt)
    for _ in range(10):
        ctx = np.asarray([seq[-8:]], dtype=np.int32)
        client.put("p", ctx, device="sim:0")
        client.evaluate("g", "p", outputs={"name": "lp"}, positions="last", wait=True)
        seq.append(int(np.argmax(client.get("lp")[0])))
    assert got == seq[len(prompt):]
    # sampling: reproducible from its seed, ids in the vocabulary
    a = client.generate("g", prompt, 12, temperature=1.0, top_k=5, seed=3)
    assert a == client.generate("g", prompt, 12, temperature=1.0, top_k=5, seed=3)
    assert all(0 <= t < 37 for t in a)
    op = client.generate("g", prompt, 4, wait=False)
    assert isinstance(op, tstage.Operation) and len(op.result(timeout=60)["tokens"]) == 4
    with pytest.raises(tstage.InvalidArgument) as e:
        client.generate("g", [1, 37], 2)
    assert e.value.reason == "BAD_TOKEN" and "prompt[1]" in e.value.message
    with pytest.raises(tstage.InvalidArgument) as e:
        client.generate("g", [1], 5000)
    assert e.value.reason == "BAD_MAX_TOKENS"
    with pytest.raises(tstage.InvalidArgument) as e:
        client.evaluate("g", "x", wait=True)
    assert e.value.reason == "NO_OUTPUTS"


def test_gpt_step_accumulates_micro_batches(client):
    client.create_model("ga", gpt=GPT["gpt"], init=GPT["init"], placement=GPT["placement"],
                        optimizer={"type": "adamw", "learning_rate": 1e-2})
    ids = RNG.integers(0, 37, (4, 9)).astype(np.int32)
    client.put("x", ids[:, :-1], device="sim:0")
    client.put("t", ids[:, 1:], device="sim:0")
    micro = []
    for half in (slice(0, 2), slice(2, 4)):
        client.put("xh", ids[half, :-1], device="sim:0")
        client.put("th", ids[half, 1:], device="sim:0")
        micro.append(np.float32(client.evaluate("ga", "xh", "th", wait=True)["loss"]))
    rep = client.step("ga", "x", "t", accumulate=2, wait=True)
    assert rep["accumulate"] == 2 and len(rep["losses"]) == 1
    assert np.float32(rep["losses"][0]) == (micro[0] + micro[1]) / np.float32(2)
    assert len(rep["grad_norms"]) == 1 and rep["grad_norms"][0] > 0
    assert rep["measured_peak_device_bytes"] == rep["predicted_peak_device_bytes"]
    an = client.analyze("ga", [4, 8], accumulate=2)
    assert an["peak_device_bytes"] == rep["predicted_peak_device_bytes"]
    assert an["accumulate"] == 2 and "accumulate" not in client.analyze("ga", [4, 8])
    assert client.model("ga")["steps"] == 1
    for bad in (0, -2, 3, 2000):
        with pytest.raises(tstage.InvalidArgument) as e:
            client.step("ga", "x", "t", accumulate=bad, wait=True)
        assert e.value.reason == "BAD_ACCUMULATE" and "accumulate" in e.value.message
    assert client.model("ga")["steps"] == 1


def test_partial_result_and_cancelled_losses(client):
    client.put("stream", RNG.integers(0, 50, 500).astype(np.uint16), memory_kind="pinned_host")
    client.create_model("lm", LM)
    op = client.step("lm", windows=tstage.windows("stream", 8, 4, order="random", seed=1),
                     steps=1000000)
    # the partial result is renewed as steps end (less often for tiny steps),
    # so wait for it, not for the progress count, to show two steps
    for _ in range(3000):
        op.refresh()
        if op.partial_result and len(op.partial_result["losses"]) >= 2:
            break
    part = op.partial_result
    assert op.state == "RUNNING" and len(part["losses"]) >= 2
    assert len(part["losses"]) == part["steps"] == len(part["learning_rates"])
    op.cancel().wait(timeout=60)
    with pytest.raises(tstage.Cancelled) as e:
        op.result()
    assert len(e.value.losses) == op.partial_result["steps"] >= 2
    assert e.value.losses[:2] == part["losses"][:2]
    assert client.model("lm")["steps"] == len(e.value.losses)
    done = client.step("lm", windows=tstage.windows("stream", 8, 4), steps=1)
    done.wait(timeout=60)
    assert done.partial_result is None and len(done.result()["losses"]) == 1


def test_create_model_as_operation_and_errors(client):
    op = client.create_model("m2", MLP, wait=False)
    assert isinstance(op, tstage.Operation) and op.kind == "create"
    assert op.result(timeout=60)["name"] == "m2"
    with pytest.raises(tstage.AlreadyExists):
        client.create_model("m2", MLP)
    with pytest.raises(tstage.InvalidArgument) as e:
        client.create_model("m3", dict(MLP, mlp={"layers": 0, "d_model": 4}))
    assert "mlp.layers" in e.value.message
    with pytest.raises(tstage.OutOfMemory) as oom:
        client.create_model("m4", dict(MLP, mlp={"layers": 4, "d_model": 4096}))
    assert oom.value.space.startswith("sim:0/")


def test_model_checkpoint_export_import(client, tmp_path):
    client.create_model("mlp", MLP)
    x = RNG.random((8, 16)).astype(np.float32)
    t = RNG.random((8, 16)).astype(np.float32)
    client.put("x", x, device="sim:0")
    client.put("t", t, device="sim:0")
    client.step("mlp", "x", "t", steps=2, wait=True)
    w1 = client.get("mlp.w1")
    blob = client.export_model("mlp")
    client.export_model("mlp", tmp_path / "mlp.safetensors")
    assert (tmp_path / "mlp.safetensors").read_bytes() == blob
    assert "w1" in st_load(blob)
    # resumed under another name from the file, and from bytes after a delete
    other = client.import_model(tmp_path / "mlp.safetensors", name="mlp2")
    assert other["name"] == "mlp2" and other["steps"] == 2
    assert np.array_equal(client.get("mlp2.w1"), w1)
    a = client.step("mlp", "x", "t", steps=1, wait=True)["losses"]
    b = client.step("mlp2", "x", "t", steps=1, wait=True)["losses"]
    assert a == b  # the same losses bit for bit
    client.delete_model("mlp")
    assert client.import_model(blob)["name"] == "mlp"
    with pytest.raises(tstage.InvalidArgument):
        client.import_model(st_save({"w": np.zeros(3, np.float32)}), name="bad")
    an = client.analyze("mlp", [8, 16], timeline=True)
    assert an["timeline"] and "timeline" not in client.analyze("mlp", [8, 16])


def _tensors():
    return {"w": RNG.random((4, 5)).astype(np.float32),
            "b": np.arange(6, dtype=np.int64),
            "h": RNG.random((3, 3)).astype(np.float16)}


def test_import_safetensors_path_file_and_export(client, tmp_path):
    ts = _tensors()
    blob = st_save(ts, metadata={"fmt": "pt"})
    p = tmp_path / "m.safetensors"
    p.write_bytes(blob)
    out = client.import_safetensors(str(p), prefix="m.", memory_kind="pinned_host")
    assert sorted(a["name"] for a in out["arrays"]) == ["m.b", "m.h", "m.w"]
    for k, v in ts.items():
        got = client.get(f"m.{k}")
        assert got.dtype == v.dtype and np.array_equal(got, v)
    assert kinds(client, "m.w") == [("sim:0", "pinned_host")]
    # a file object, at an offset
    f = io.BytesIO(b"junk" + blob)
    f.seek(4)
    client.import_safetensors(f, prefix="f.", device="sim:1", memory_kind="device")
    assert kinds(client, "f.b") == [("sim:1", "device")]
    with pytest.raises(tstage.AlreadyExists):
        client.import_safetensors(io.BytesIO(blob), prefix="f.", overwrite=False)
    client.import_safetensors(blob, prefix="b.")  # bytes
    assert np.array_equal(client.get("b.w"), ts["w"])
    # export, read back by the reference implementation
    back = st_load(client.export(["m.w", "m.b", "f.h"]))
    assert np.array_equal(back["m.w"], ts["w"]) and np.array_equal(back["f.h"], ts["h"])
    dst = tmp_path / "out.safetensors"
    client.export("m.b", dst)
    assert np.array_equal(st_load(dst.read_bytes())["m.b"], ts["b"])


def test_import_safetensors_server_side(client, daemon):
    ts = _tensors()
    with open(os.path.join(daemon.data_dir, "d.safetensors"), "wb") as f:
        f.write(st_save(ts))
    op = client.import_safetensors(server_path="d.safetensors", prefix="s.",
                                   memory_kind="unpinned_host", wait=False)
    assert isinstance(op, tstage.Operation) and op.kind == "import"
    res = op.result(timeout=60, progress=True)
    assert sorted(a["name"] for a in res["arrays"]) == ["s.b", "s.h", "s.w"]
    assert np.array_equal(client.get("s.w"), ts["w"])
    with pytest.raises(tstage.PermissionDenied):
        client.import_safetensors(server_path="/etc/passwd")


def test_like_jax_and_torch(client):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    client.put("a", a)
    try:
        import torch
    except ImportError:
        torch = None
    try:
        import jax  # noqa: F401
    except ImportError:
        jax = None
    if torch is None and jax is None:
        pytest.skip("neither jax nor torch is installed")
    if torch is not None:
        t = client.get("a", like="torch")
        assert isinstance(t, torch.Tensor) and t.tolist() == a.tolist()
        client.put("tb", torch.tensor([1.5, 2.0], dtype=torch.bfloat16))
        assert client.info("tb")["dtype"] == "bfloat16"
    if jax is not None:
        j = client.get("a", like="jax")
        assert np.array_equal(np.asarray(j), a)
