"""Uploads, downloads, slices, rows and listing against a live tstaged."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tstage

RNG = np.random.default_rng(7)


def sample(dtype: str, shape=(3, 5, 7)) -> np.ndarray:
    dt = tstage.DTYPES[dtype]
    if dtype == "bool":
        return RNG.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return RNG.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    # every bit pattern of a float type, NaN payloads and -0 included, byte-exact
    nbytes = int(np.prod(shape)) * dt.itemsize
    return np.frombuffer(RNG.bytes(nbytes), dtype=dt).reshape(shape)


@pytest.mark.parametrize("dtype", list(tstage.DTYPES))
def test_round_trip_every_dtype_byte_exact(client, dtype):
    a = sample(dtype)
    meta = client.put(f"rt-{dtype}", a)
    assert meta["dtype"] == dtype and meta["shape"] == list(a.shape)
    b = client.get(f"rt-{dtype}")
    assert b.dtype == a.dtype and b.shape == a.shape
    assert b.tobytes() == a.tobytes()


def test_bfloat16_is_ml_dtypes_not_void(client):
    a = np.array([1.5, -2.0, np.inf, -0.0], dtype=ml_dtypes.bfloat16)
    client.put("bf", a, memory_kind="pinned_host")
    b = client.get("bf")
    assert b.dtype == np.dtype(ml_dtypes.bfloat16)
    assert b.view(np.uint16).tolist() == a.view(np.uint16).tolist()
    assert float(b[0]) == 1.5


def test_scalar_empty_big_endian_and_fortran(client):
    client.put("s", np.float64(2.5))
    s = client.get("s")
    assert s.shape == () and s.dtype == np.float64 and float(s) == 2.5
    client.put("e", np.zeros((0, 4), np.int32))
    e = client.get("e")
    assert e.shape == (0, 4) and e.dtype == np.int32
    be = np.arange(12, dtype=">i4").reshape(3, 4)
    client.put("be", be)
    assert np.array_equal(client.get("be"), be)
    f = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    client.put("f", f)
    assert np.array_equal(client.get("f"), f)


def test_streamed_upload_of_many_pieces(client):
    a = RNG.random((5 << 20) // 8 * 3 + 7)  # ~15 MiB: four pieces, the last short
    client.put("big", a, memory_kind="unpinned_host")
    assert client.info("big")["nbytes"] == a.nbytes
    assert client.get("big").tobytes() == a.tobytes()


class OnlyArray:
    def __init__(self, a):
        self._a = a

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)


class OnlyDlpack:
    def __init__(self, a):
        self._a = a

    def __dlpack__(self, *args, **kw):
        return self._a.__dlpack__(*args, **kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_put_accepts_array_and_dlpack_protocols(client):
    a = np.arange(10, dtype=np.int16)
    client.put("pa", OnlyArray(a))
    client.put("pd", OnlyDlpack(a * 2))
    client.put("pl", [[1.0, 2.0], [3.0, 4.0]])
    assert np.array_equal(client.get("pa"), a)
    assert np.array_equal(client.get("pd"), a * 2)
    assert client.get("pl").tolist() == [[1.0, 2.0], [3.0, 4.0]]


@pytest.mark.parametrize("index", [
    5, -1, (2, 3), slice(1, 7, 2), (slice(None), 2), (Ellipsis, -1),
    (slice(None, None, -1),), (slice(8, 1, -3), slice(None), slice(0, 6, 4)),
    (1, Ellipsis), (slice(100, 200),), (np.int64(3), slice(-3, None)),
])
def test_index_matches_numpy(client, index):
    a = np.arange(10 * 6 * 16, dtype=np.uint16).reshape(10, 6, 16)
    client.put("t", a)
    got = client.get("t", index=index)
    want = a[index]
    assert got.shape == want.shape
    assert np.array_equal(got, want)


def test_index_as_string_expression(client):
    a = np.arange(10 * 6 * 16, dtype=np.float32).reshape(10, 6, 16)
    client.put("t", a)
    assert np.array_equal(client.get("t", index="2:10:2,:,-1"), a[2:10:2, :, -1])
    with pytest.raises(tstage.InvalidArgument):
        client.get("t", index="1,2,3,4")


def test_index_rejects_advanced_indexing_locally(client):
    with pytest.raises(TypeError):
        client.get("t", index=[1, 2])
    with pytest.raises(ValueError):
        client.get("t", like="tensorflow")


def test_empty_index_is_the_whole_array(client):
    a = np.arange(6, dtype=np.int8).reshape(2, 3)
    client.put("t", a)
    assert np.array_equal(client.get("t", index=()), a[()])


def test_get_rows_order_repeats_negatives(client):
    a = np.arange(8 * 6 * 4, dtype=np.int32).reshape(8, 6, 4)
    client.put("t", a, memory_kind="pinned_host")
    for rows in ([7, 1, 2, 3], [0, 0, 5], [-1, 3, -8], [4]):
        got = client.get_rows("t", rows)
        assert np.array_equal(got, a[rows]), rows
    with pytest.raises(tstage.OutOfRange) as e:
        client.get_rows("t", [1, 8])
    assert e.value.code == 400 and "row index 8" in e.value.message


def test_get_rows_long_list_after_small_requests(client):
    # 5000 rows make a ~24 KB URL: more than a small-request connection's
    # head holds, so the client sends it where a long head fits
    a = np.arange(4096, dtype=np.uint16)
    client.put("long", a, memory_kind="pinned_host")
    for _ in range(3):
        client.get("long", index=(7,))
    rows = [(i * 7919) % 4096 for i in range(5000)]
    assert np.array_equal(client.get_rows("long", rows), a[rows])
    assert np.array_equal(client.get("long", index=(9,)), a[9])


def test_get_rows_past_the_url_limit(client):
    # 100,000 rows are ~490 KB of text: far past a request head's limit, so
    # the client sends them in a body (POST :rows); the answer is the same
    a = np.arange(4096 * 3, dtype=np.int16).reshape(4096, 3)
    client.put("many", a, memory_kind="pinned_host")
    rows = [(i * 7919) % 4096 - (i % 2) * 4096 for i in range(100_000)]
    assert np.array_equal(client.get_rows("many", rows), a[rows])
    with pytest.raises(tstage.OutOfRange):
        client.get_rows("many", rows + [4096])


def test_get_rows_from_device_memory(client):
    a = RNG.random((16, 3)).astype(np.float32)
    client.put("d", a, device="sim:1", memory_kind="device")
    assert np.array_equal(client.get_rows("d", [15, 0, 7]), a[[15, 0, 7]])


def test_list_follows_pages(client):
    names = [f"l{i}" for i in range(7)]
    for n in names:
        client.put(n, np.zeros(4, np.uint8), memory_kind="pinned_host")
    listed = [a["name"] for a in client.list(page_size=2)]
    assert listed == sorted(names)
    assert [a["name"] for a in client.list(memory_kind="device")] == []


def test_not_found_and_already_exists(client):
    with pytest.raises(tstage.NotFound) as e:
        client.get("missing")
    assert e.value.reason == "ARRAY_NOT_FOUND" and e.value.code == 404
    assert "missing" in str(e.value)
    with pytest.raises(tstage.NotFound):
        client.delete("missing")
    with pytest.raises(tstage.NotFound):
        client.operation("op-0000000000000000")
    with pytest.raises(tstage.NotFound):
        client.model("nomodel")
    assert not client.exists("missing")
    client.put("a", np.ones(3))
    with pytest.raises(tstage.AlreadyExists):
        client.put("a", np.ones(3), overwrite=False)


def test_etag_mismatch(client):
    meta = client.put("a", np.ones(3))
    client.put("a", np.zeros(3), if_match=meta["etag"])
    with pytest.raises(tstage.EtagMismatch) as e:
        client.put("a", np.ones(3), if_match=meta["etag"])
    assert isinstance(e.value, tstage.FailedPrecondition)


def test_out_of_memory_attributes(client, daemon):
    from conftest import SIM_MEMORY

    client.put("hold", np.zeros(1 << 20, np.uint8), device="sim:0", memory_kind="device")
    stats = client.memory_stats("sim:0", "device")
    n = SIM_MEMORY  # more than what is free
    with pytest.raises(tstage.OutOfMemory) as e:
        client.put("huge", np.zeros(n, np.uint8), device="sim:0", memory_kind="device")
    err = e.value
    assert isinstance(err, tstage.ResourceExhausted) and err.code == 429
    assert err.space == "sim:0/device"
    assert err.requested == n
    assert err.limit == stats["bytes_limit"] == SIM_MEMORY
    assert err.free == stats["bytes_free"]
    assert err.largest_free_block == stats["largest_free_block_bytes"]
    assert err.retryable  # fits the pool once others free memory
    with pytest.raises(tstage.OutOfMemory) as e2:
        client.put("huger", np.zeros(SIM_MEMORY + 256, np.uint8), device="sim:0")
    assert not e2.value.retryable
    assert not client.exists("huge")
    assert client.memory_stats("sim:0", "device")["bytes_in_use"] == stats["bytes_in_use"]


def test_history(client):
    import datetime
    import time

    client.put("hist", np.zeros(1 << 20, np.uint8), device="sim:0", memory_kind="pinned_host")
    put_at = time.time()
    for _ in range(50):
        h = client.history(since=60)
        if h["times_unix_ms"] and h["times_unix_ms"][-1] / 1000 > put_at + 0.05:
            break
        time.sleep(0.1)
    client.delete("hist")
    del_at = time.time()
    for _ in range(50):
        h = client.history(since=datetime.timedelta(seconds=60))
        if h["times_unix_ms"][-1] / 1000 > del_at + 0.05:
            break
        time.sleep(0.1)
    space = next(s for s in h["spaces"] if (s["device"], s["memory_kind"]) == ("sim:0", "pinned_host"))
    assert space["pool"] == "host/pinned_host"
    assert len(space["bytes_in_use"]) == len(h["times_unix_ms"])
    assert max(space["bytes_in_use"]) - space["bytes_in_use"][-1] >= 1 << 20
    pools = [p["pool"] for p in h["pools"]]
    assert pools.count("host/pinned_host") == 1
    assert h["step_seconds"] == 1
    assert client.history(step=10)["step_seconds"] == 10
    assert client.history(since="4h")["step_seconds"] == 10
    start = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=30)
    assert all(t >= start.timestamp() * 1000 - 1 for t in client.history(since=start)["times_unix_ms"])
    with pytest.raises(tstage.InvalidArgument, match="since 'yesterday'"):
        client.history(since="yesterday")
    with pytest.raises(tstage.InvalidArgument, match="step '0'"):
        client.history(step=0)
    with pytest.raises(ValueError):
        client.history(since=datetime.datetime.now())


def test_devices_backends_memory(client):
    devs = {d["id"]: d for d in client.devices()}
    assert {"sim:0", "sim:1", "cpu:0"} <= set(devs)
    assert {m["kind"] for m in devs["sim:0"]["memories"]} == {"device", "pinned_host",
                                                            "unpinned_host"}
    assert client.device("sim:1")["id"] == "sim:1"
    backends = {b["name"]: b for b in client.backends()}
    assert backends["sim"]["available"] and backends["sim"]["device_count"] == 2
    client.put("m", np.zeros(1000, np.uint8), device="sim:1", memory_kind="pinned_host")
    spaces = {(s["device"], s["memory_kind"]): s for s in client.memory()["spaces"]}
    assert spaces[("sim:1", "pinned_host")]["bytes_in_use"] >= 1000
    assert client.memory_stats("sim:1", "pinned_host")["peak_bytes_in_use"] >= 1000
    client.delete("m")
    client.reset_peak()
    assert client.memory_stats("sim:1", "pinned_host")["peak_bytes_in_use"] == \
        client.memory_stats("sim:1", "pinned_host")["bytes_in_use"]
    assert client.health()
    assert not tstage.Client("http://127.0.0.1:1", retries=0).health()


def test_trace(client, tmp_path):
    import json
    import threading
    import time

    out = tmp_path / "trace.json"
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(client.trace(2, path=out)))
    t.start()
    time.sleep(0.3)
    with pytest.raises(tstage.Aborted, match="one at a time"):
        client.trace(1)
    client.put("traced", np.zeros(1 << 20, np.uint8), device="sim:0", memory_kind="pinned_host")
    client.device_put("traced", memory_kind="device", wait=True)
    t.join()
    assert json.loads(out.read_text()) == got
    assert got["displayTimeUnit"] == "ms" and got["metadata"]["dropped_events"] == 0
    copies = [e for e in got["traceEvents"] if e["ph"] == "X" and e["cat"] == "copy"
              and e["args"].get("bytes") == 1 << 20]
    assert copies and copies[0]["name"] == "H2D"
    with pytest.raises(tstage.InvalidArgument, match="seconds '61'"):
        client.trace(61)
