"""Device leases on a GPU, end to end: a tstaged on the cuda backend hands out
CUDA IPC handles over its lease service and this process opens them with
libcudart through ctypes (tstage._cudart): the interface's fields, the bytes
read back with cudaMemcpy, a writable device lease filled and published, the
version held while the name is replaced, and DLPack tensors whose deleter
ends the lease.

Runs when TS_TEST_BACKEND=cuda (as the integration suites do); then a missing
libcudart or a daemon without a cuda device fails, it is not skipped. Without
a GPU, tests/gpu/fakecuda.sh's "python" pass runs it under the CPU stand-in
(../shared/fakecuda): the daemon and this process load the same stand-in
libcudart, whose device memory host code cannot read (hence cudaMemcpy).
"""
from __future__ import annotations

import gc
import os
import tempfile
import time
from typing import Iterator

import numpy as np
import pytest

import tstage
from conftest import Daemon, dlpack_consume, dlpack_tensor

pytestmark = pytest.mark.skipif(
    os.environ.get("TS_TEST_BACKEND", "sim") != "cuda",
    reason="TS_TEST_BACKEND is not cuda: the daemon runs sim devices, whose leases are "
           "memfd mappings (test_lease.py); tests/gpu/fakecuda.sh runs these")


@pytest.fixture(scope="module")
def gpu_daemon() -> Iterator[Daemon]:
    tstage._cudart.load()              # fails the module here, before any daemon
    sock = os.path.join(tempfile.mkdtemp(prefix="tsc-"), "s")
    d = Daemon(["--unix-socket", sock], backend="cuda")
    d.sock = sock  # type: ignore[attr-defined]
    yield d
    d.stop()
    assert d.proc.returncode == 0, open(d.stderr.name).read()


@pytest.fixture
def gpu(gpu_daemon: Daemon) -> Iterator[tstage.Client]:
    c = tstage.Client(unix_socket=gpu_daemon.sock, retries=2, backoff=0.05)  # type: ignore
    yield c
    c.close()
    gc.collect()
    c = tstage.Client(unix_socket=gpu_daemon.sock)  # type: ignore
    for a in list(c.list()):
        c.delete(a["name"])
    c.close()


def gpus(c: tstage.Client) -> list:
    devs = [d for d in c.devices() if d.get("backend") == "cuda"]
    assert devs, "TS_TEST_BACKEND=cuda but the daemon has no cuda device"
    return devs


def in_use(c: tstage.Client, device: str) -> int:
    """bytes_in_use of device's device memory, from GET /v1/memory."""
    for sp in c.memory()["spaces"]:
        if sp["device"] == device and sp["memory_kind"] == "device":
            return int(sp["bytes_in_use"])
    raise AssertionError(f"GET /v1/memory has no space of {device}/device")


def settle(c: tstage.Client, device: str, want: int, timeout: float = 10) -> int:
    """bytes_in_use once it reaches want (releases are served a moment after
    they are sent), or its last value."""
    c.leases().sync()
    deadline = time.monotonic() + timeout
    got = in_use(c, device)
    while got != want and time.monotonic() < deadline:
        time.sleep(0.02)
        got = in_use(c, device)
    return got


@pytest.mark.parametrize("ordinal", [0, 1])
def test_read_lease_opens_the_ipc_handle(gpu, ordinal):
    devs = gpus(gpu)
    if ordinal >= len(devs):
        pytest.skip(f"one GPU: no cuda:{ordinal}")
    dev = devs[ordinal]
    a = np.arange(64 * 48, dtype=np.float32).reshape(64, 48) * 0.5
    gpu.put("a", a, device=dev["id"], memory_kind="device")
    x = gpu.get("a", zero_copy=True)
    assert isinstance(x, tstage.CudaArray)
    assert x.device == dev["id"] and x.pci_bus_id == dev["pci_bus_id"]
    # opened by bus id: the stand-in's and a plain node's ordinals agree
    assert x.device_id == dev["ordinal"]
    cai = x.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (64, 48) and cai["typestr"] == "<f4"
    assert cai["strides"] is None and cai["stream"] is None
    ptr, readonly = cai["data"]
    assert ptr != 0 and ptr == x.ptr and readonly is True
    got = x.to_numpy()
    assert got.dtype == a.dtype and np.array_equal(got, a)
    with pytest.raises(ValueError, match="read-only"):
        x.copy_from(a)
    x.close()
    assert x.closed
    gpu.leases().sync()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int64", "uint8", "bool", "int8"])
def test_dtypes_read_back(gpu, dtype):
    dt = tstage.DTYPES[dtype]
    a = (np.arange(3 * 5 * 7) % 7).astype(dt).reshape(3, 5, 7)
    gpu.put("d", a, device=gpus(gpu)[0]["id"], memory_kind="device")
    with gpu.get("d", zero_copy=True) as x:
        assert x.dtype == dt and x.shape == (3, 5, 7)
        assert x.to_numpy().tobytes() == a.tobytes()


def test_version_held_while_the_name_is_replaced(gpu):
    dev = gpus(gpu)[0]["id"]
    old = np.full((256, 256), 3.0, np.float32)
    new = np.full((256, 256), 7.0, np.float32)
    base = in_use(gpu, dev)
    gpu.put("v", old, device=dev, memory_kind="device")
    x = gpu.get("v", zero_copy=True)
    gpu.put("v", new, device=dev, memory_kind="device")
    assert np.array_equal(gpu.get("v"), new)
    assert np.array_equal(x.to_numpy(), old)          # the leased version, whole
    assert in_use(gpu, dev) == base + 2 * old.nbytes
    gpu.delete("v")
    assert np.array_equal(x.to_numpy(), old)
    assert in_use(gpu, dev) == base + old.nbytes       # held by the lease alone
    x.close()
    assert settle(gpu, dev, base) == base


def test_gc_ends_the_lease(gpu):
    dev = gpus(gpu)[0]["id"]
    base = in_use(gpu, dev)
    gpu.put("g", np.ones(4096, np.float32), device=dev, memory_kind="device")
    x = gpu.get("g", zero_copy=True)
    gpu.delete("g")
    assert in_use(gpu, dev) == base + 4 * 4096
    del x
    gc.collect()
    assert settle(gpu, dev, base) == base


def test_writable_device_lease_publishes(gpu):
    dev = gpus(gpu)[0]["id"]
    a = np.arange(1000, dtype=np.int32).reshape(10, 100)
    w = gpu.lease_write("w", np.int32, (10, 100), device=dev, memory_kind="device")
    arr = w.array
    assert isinstance(arr, tstage.CudaArray) and arr.device == dev
    assert arr.__cuda_array_interface__["data"][1] is False          # writable
    arr.copy_from(a)
    with pytest.raises(tstage.NotFound):
        gpu.info("w")                                   # nothing visible yet
    r = w.publish()
    assert r["name"] == "w" and r["replaced"] is False
    assert arr.closed
    info = gpu.info("w")
    assert info["version"] == r["version"]
    assert [s["device"] for s in info["shards"]] == [dev]
    assert np.array_equal(gpu.get("w"), a)
    with gpu.get("w", zero_copy=True) as x:
        assert np.array_equal(x.to_numpy(), a)


def test_writable_device_lease_released_unpublished(gpu):
    dev = gpus(gpu)[0]["id"]
    base = in_use(gpu, dev)
    w = gpu.lease_write("u", np.float32, (512,), device=dev, memory_kind="device")
    assert in_use(gpu, dev) == base + 2048
    w.release()
    assert w.array.closed
    assert settle(gpu, dev, base) == base
    with pytest.raises(tstage.NotFound):
        gpu.info("u")


def test_dlpack_capsule_and_its_deleter(gpu):
    dev = gpus(gpu)[0]
    a = np.arange(32 * 16, dtype=np.float32).reshape(32, 16)
    base = in_use(gpu, dev["id"])
    gpu.put("p", a, device=dev["id"], memory_kind="device")
    x = gpu.get("p", zero_copy=True)
    assert x.__dlpack_device__() == (2, dev["ordinal"])
    cap = x.__dlpack__(stream=1)
    t = dlpack_tensor(cap)
    assert t["device"] == (2, dev["ordinal"])
    assert t["data"] == x.__cuda_array_interface__["data"][0]
    assert t["ndim"] == 2 and t["shape"] == (32, 16)
    assert t["dtype"] == (2, 32, 1)
    assert t["strides"] == 0 and t["byte_offset"] == 0
    done = dlpack_consume(cap)
    del cap
    # the consumer's tensor holds the handle and the lease past the array
    x.close()
    gpu.delete("p")
    gc.collect()
    gpu.leases().sync()
    assert in_use(gpu, dev["id"]) == base + a.nbytes
    done()                                          # the consumer is done
    assert settle(gpu, dev["id"], base) == base
    assert tstage._dlpack.live() == 0


def test_dlpack_capsule_nobody_took(gpu):
    dev = gpus(gpu)[0]["id"]
    base = in_use(gpu, dev)
    gpu.put("q", np.zeros((8, 8), np.float64), device=dev, memory_kind="device")
    x = gpu.get("q", zero_copy=True)
    cap = x.__dlpack__()
    del x
    gc.collect()
    gpu.delete("q")
    gpu.leases().sync()
    assert in_use(gpu, dev) == base + 512
    del cap                                         # its destructor calls the deleter
    gc.collect()
    assert settle(gpu, dev, base) == base


def test_writes_through_a_read_lease_reach_nothing(gpu):
    """CUDA IPC maps read-write whatever the lease says: a read lease's handle
    names a copy of the version made for that lease, so writing through it
    changes neither GET's bytes nor the ETag, nor another lease's bytes; a
    writer's handle written after publish changes nothing either."""
    dev = gpus(gpu)[0]["id"]
    a = np.arange(4096, dtype=np.float32)
    junk = np.full(4096, -1.0, np.float32)
    gpu.put("im", a, device=dev, memory_kind="device")
    etag = gpu.info("im")["etag"]
    base = in_use(gpu, dev)
    x = gpu.get("im", zero_copy=True)
    y = gpu.get("im", zero_copy=True)
    assert in_use(gpu, dev) == base                    # lease memory is outside the pool
    # the interface says read-only; write through the handle anyway
    x._rt.memcpy(x.ptr, junk.ctypes.data, junk.nbytes, tstage._cudart.MEMCPY_HOST_TO_DEVICE,
                 x.device_id)
    assert np.array_equal(x.to_numpy(), junk)          # the lease's own copy changed
    assert np.array_equal(y.to_numpy(), a)             # another lease's did not
    assert np.array_equal(gpu.get("im"), a)
    assert gpu.info("im")["etag"] == etag
    x.close()
    y.close()
    with gpu.get("im", zero_copy=True) as z:
        assert np.array_equal(z.to_numpy(), a)

    w = gpu.lease_write("im2", np.float32, (4096,), device=dev, memory_kind="device")
    assert np.array_equal(w.array.to_numpy(), np.zeros(4096, np.float32))  # zeroed
    w.array.copy_from(a)
    cap = w.array.__dlpack__()                         # keeps the handle open past publish
    ptr, did = w.array.ptr, w.array.device_id
    r = w.publish()
    w.array._rt.memcpy(ptr, junk.ctypes.data, junk.nbytes,
                       tstage._cudart.MEMCPY_HOST_TO_DEVICE, did)
    assert np.array_equal(gpu.get("im2"), a)
    assert gpu.info("im2")["etag"] == r["etag"]
    del cap
    gc.collect()
    gpu.leases().sync()
