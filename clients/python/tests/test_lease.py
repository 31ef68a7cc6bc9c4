"""The same-node path without a copy: leases of host arrays over the Unix
socket's lease service (mapped while the name is replaced, deleted or moved,
memory returned when the lease ends, killed clients, many leases, writers that
never publish, the socket files' mode, and the service's framing), and what no
lessee can do: write through a read lease's descriptor reopened read-write,
change a version it published, or be cut off for pipelining requests."""
from __future__ import annotations

import gc
import json
import mmap
import os
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from typing import Iterator

import numpy as np
import pytest

import tstage
from conftest import ROOT, Daemon, dlpack_consume, dlpack_tensor

MIB = 1 << 20


@pytest.fixture(scope="module")
def lease_daemon() -> Iterator[Daemon]:
    sock_dir = tempfile.mkdtemp(prefix="tsl-")
    sock = os.path.join(sock_dir, "s")
    d = Daemon(["--unix-socket", sock, "--unix-socket-mode", "0660"])
    d.sock = sock  # type: ignore[attr-defined]
    yield d
    d.stop()
    assert d.proc.returncode == 0, open(d.stderr.name).read()


@pytest.fixture
def lc(lease_daemon: Daemon) -> Iterator[tstage.Client]:
    c = tstage.Client(unix_socket=lease_daemon.sock, retries=2, backoff=0.05)  # type: ignore
    yield c
    c.close()
    c = tstage.Client(unix_socket=lease_daemon.sock)  # type: ignore
    for a in list(c.list()):
        c.delete(a["name"])
    c.close()


def in_use(c: tstage.Client, kind: str = "pinned_host", device: str = "cpu:0") -> int:
    return int(c.memory_stats(device, kind)["bytes_in_use"])


def settle(c: tstage.Client, want: int, kind: str = "pinned_host", timeout: float = 10) -> int:
    """bytes_in_use once it reaches want (a closed connection is seen by the
    service's thread a moment later), or its last value."""
    deadline = time.monotonic() + timeout
    got = in_use(c, kind)
    while got != want and time.monotonic() < deadline:
        time.sleep(0.02)
        got = in_use(c, kind)
    return got


def release_all(c: tstage.Client) -> None:
    gc.collect()
    c.leases().sync()


def test_zero_copy_read_is_a_read_only_mapping(lc):
    a = np.arange(1 << 16, dtype=np.float32).reshape(256, 256)
    lc.put("a", a, device="cpu:0", memory_kind="pinned_host")
    x = lc.get("a", zero_copy=True)
    assert x.dtype == a.dtype and x.shape == a.shape
    assert np.array_equal(x, a)
    assert not x.flags.writeable
    with pytest.raises(ValueError):
        x[0, 0] = 1
    # the same bytes as over HTTP, and the mapping is the server's memory
    assert np.array_equal(lc.get("a"), x)


def shmem_huge_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read()
    except OSError:
        return "unknown"
    return text[text.index("[") + 1:text.index("]")] if "[" in text else "unknown"


def pmd_mapped_kib(addr: int) -> int:
    """KiB of this process's mapping holding addr in 2 MiB page-table entries."""
    kib, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("ShmemPmdMapped:"):
                kib += int(line.split()[1])
    return kib


@pytest.mark.parametrize("writable", [False, True])
def test_big_mappings_take_huge_pages_where_the_node_allows(lc, writable):
    """tstaged's segments of 2 MiB or more are advised for huge pages, and so
    is the client's mapping: where shared memory may have them, a lease of
    8 MiB is mapped in 2 MiB pages; elsewhere it still maps, in 4 KiB ones."""
    n = 8 * MIB
    if writable:
        w = lc.lease_write("h", np.uint8, (n,), memory_kind="pinned_host", device="cpu:0")
        w.array[:] = 7
        x = w.array
    else:
        lc.put("h", np.full(n, 7, np.uint8), device="cpu:0", memory_kind="pinned_host")
        x = lc.get("h", zero_copy=True)
    assert int(x.sum(dtype=np.uint64)) == 7 * n
    mode = shmem_huge_mode()
    if mode in ("never", "deny", "unknown"):
        assert pmd_mapped_kib(x.ctypes.data) == 0
    else:
        assert pmd_mapped_kib(x.ctypes.data) > 0, f"shmem_enabled is {mode}"
    if writable:
        w.publish()
        assert np.all(lc.get("h") == 7)
    del x


@pytest.mark.parametrize("kind", ["pinned_host", "unpinned_host"])
def test_replaced_while_mapped_keeps_the_old_bytes(lc, kind):
    n = 4 * MIB
    lc.put("r", np.full(n // 4, 1, np.int32), device="cpu:0", memory_kind=kind)
    base = in_use(lc, kind)
    x = lc.get("r", zero_copy=True)
    lc.put("r", np.full(n // 4, 2, np.int32), device="cpu:0", memory_kind=kind)
    assert np.all(lc.get("r") == 2)
    assert np.all(x == 1), "the mapped version changed under its lease"
    # both versions live: the old one is held by the lease
    assert in_use(lc, kind) == base + n
    del x
    release_all(lc)
    assert in_use(lc, kind) == base


def test_deleted_while_mapped_keeps_the_bytes_until_released(lc):
    n = 8 * MIB
    before = in_use(lc)
    data = np.random.default_rng(1).integers(0, 255, n, dtype=np.uint8)
    lc.put("d", data, device="cpu:0", memory_kind="pinned_host")
    x = lc.get("d", zero_copy=True)
    view = x[100:200]              # a view keeps the lease too
    lc.delete("d")
    assert not lc.exists("d")
    assert in_use(lc) == before + n
    assert np.array_equal(x, data)
    del x
    release_all(lc)
    assert in_use(lc) == before + n, "released while a view still maps it"
    assert np.array_equal(view, data[100:200])
    del view
    release_all(lc)
    assert in_use(lc) == before


def test_moved_while_mapped(lc):
    n = 2 * MIB
    data = np.arange(n // 8, dtype=np.float64)
    lc.put("m", data, device="cpu:0", memory_kind="pinned_host")
    x = lc.get("m", zero_copy=True)
    lc.device_put("m", device="sim:0", memory_kind="device", wait=True)
    assert np.array_equal(x, data)
    # the pinned version lives only through the lease now
    assert in_use(lc) == n
    # on the sim device, the new version is leased as host memory is
    y = lc.get("m", zero_copy=True)
    assert isinstance(y, np.ndarray) and not y.flags.writeable
    assert np.array_equal(y, data)
    assert in_use(lc, "device", "sim:0") == n
    del x
    release_all(lc)
    assert in_use(lc) == 0
    assert np.array_equal(lc.get("m"), data)
    # moved back to host memory: the sim version stays while y maps it
    lc.device_put("m", device="cpu:0", memory_kind="pinned_host", wait=True)
    assert in_use(lc, "device", "sim:0") == n
    assert np.array_equal(y, data)
    del y
    release_all(lc)
    assert in_use(lc, "device", "sim:0") == 0


def test_sim_device_write_lease(lc):
    w = lc.lease_write("dw", np.float32, (512, 256), device="sim:0", memory_kind="device")
    assert isinstance(w.array, np.ndarray) and w.array.flags.writeable
    w.array[:] = np.arange(512 * 256, dtype=np.float32).reshape(512, 256)
    assert not lc.exists("dw")
    assert in_use(lc, "device", "sim:0") == 512 * 256 * 4
    w.publish()
    assert np.array_equal(lc.get("dw"), np.arange(512 * 256, dtype=np.float32).reshape(512, 256))
    # one never published is freed, nothing visible
    g = lc.lease_write("dghost", np.uint8, (MIB,), device="sim:0", memory_kind="device")
    g.release()
    assert not lc.exists("dghost")
    assert in_use(lc, "device", "sim:0") == 512 * 256 * 4


def test_close_ends_every_lease(lease_daemon, lc):
    lc.put("c", np.ones(MIB, np.uint8), device="cpu:0",
           memory_kind="pinned_host")
    keep = [lc.get("c", zero_copy=True) for _ in range(3)]
    lc.delete("c")
    assert in_use(lc) == MIB
    other = tstage.Client(unix_socket=lease_daemon.sock)
    lc.close()
    assert settle(other, 0) == 0
    other.close()
    del keep


def test_killed_client_returns_the_memory(lease_daemon, lc):
    n = 16 * MIB
    lc.put("k", np.full(n, 3, np.uint8), device="cpu:0", memory_kind="pinned_host")
    script = (
        "import sys, time, tstage\n"
        f"c = tstage.Client(unix_socket={lease_daemon.sock!r})\n"
        "x = c.get('k', zero_copy=True)\n"
        "w = c.lease_write('never', 'uint8', [1 << 20], memory_kind='unpinned_host',\n"
        "                  device='cpu:0')\n"
        "w.array[:] = 1\n"
        "assert int(x[12345]) == 3\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "clients" / "python"))
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
        lc.delete("k")
        assert in_use(lc) == n
        # the writer's array, and the lease copy of k: a version in a pinned
        # segment is leased through a copy of its own, kept with it
        assert in_use(lc, "unpinned_host") == MIB + n
        assert not lc.exists("never")
        p.kill()
        p.wait()
        assert settle(lc, 0) == 0
        assert settle(lc, 0, "unpinned_host") == 0
        assert not lc.exists("never")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_many_leases(lc):
    arrays = 40
    for i in range(arrays):
        lc.put(f"many{i}", np.full(4096, i, np.int32), device="cpu:0",
               memory_kind="unpinned_host")
    base = in_use(lc, "unpinned_host")
    maps = [lc.get(f"many{i % arrays}", zero_copy=True) for i in range(400)]
    for i in range(arrays):
        lc.delete(f"many{i}")
    assert in_use(lc, "unpinned_host") == base
    for i, m in enumerate(maps):
        assert int(m[0]) == i % arrays and int(m[-1]) == i % arrays
    del maps, m
    release_all(lc)
    assert in_use(lc, "unpinned_host") == 0


@pytest.mark.parametrize("kind", ["pinned_host", "unpinned_host"])
def test_write_lease_publishes_in_place(lc, kind):
    w = lc.lease_write("w", np.float32, (64, 32), memory_kind=kind, device="cpu:0")
    assert w.array.flags.writeable and w.array.shape == (64, 32)
    w.array[:] = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    assert not lc.exists("w"), "visible before publish"
    assert in_use(lc, kind) == 64 * 32 * 4
    got = w.publish()
    assert got["name"] == "w" and got["replaced"] is False
    assert not w.array.flags.writeable
    assert np.array_equal(lc.get("w"), np.arange(64 * 32, dtype=np.float32).reshape(64, 32))
    assert lc.info("w")["etag"] == got["etag"]
    # if_none_match refuses an existing name, and the lease stays usable
    w2 = lc.lease_write("w", np.float32, (1,), memory_kind=kind, device="cpu:0")
    with pytest.raises(tstage.AlreadyExists):
        w2.publish(if_none_match="*")
    w2.array[:] = 5
    assert w2.publish()["replaced"] is True
    assert np.array_equal(lc.get("w"), np.array([5], np.float32))


def test_writer_that_never_publishes(lc):
    w = lc.lease_write("ghost", np.uint8, (3 * MIB,), memory_kind="pinned_host",
                       device="cpu:0")
    w.array[:] = 9
    assert in_use(lc) == 3 * MIB
    w.release()
    assert not lc.exists("ghost")
    assert in_use(lc) == 0
    # dropped unpublished: the garbage collector releases it
    w = lc.lease_write("ghost", np.uint8, (MIB,), memory_kind="unpinned_host", device="cpu:0")
    del w
    release_all(lc)
    assert not lc.exists("ghost")
    assert in_use(lc, "unpinned_host") == 0


def test_write_lease_refusals(lc):
    with pytest.raises(tstage.OutOfMemory):
        lc.lease_write("x", np.uint8, (1 << 40,), memory_kind="pinned_host", device="cpu:0")
    with pytest.raises(tstage.NotFound):
        lc.lease_write("x", np.uint8, (4,), device="sim:9")
    with pytest.raises(tstage.InvalidArgument, match="array name"):
        lc.lease_write("bad name", np.uint8, (4,))
    assert in_use(lc) == 0


def test_zero_copy_needs_the_unix_socket(daemon):
    c = tstage.Client(daemon.url)
    with pytest.raises(ValueError, match="Unix socket"):
        c.get("a", zero_copy=True)
    c.close()


def test_socket_files_keep_the_mode(lease_daemon):
    for path in (lease_daemon.sock, lease_daemon.sock + ".lease"):
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o660, (path, oct(st.st_mode))


def _frame(obj) -> bytes:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


def _read(s: socket.socket):
    def exact(n):
        b = b""
        while len(b) < n:
            got = s.recv(n - len(b))
            if not got:
                return None
            b += got
        return b
    h = exact(4)
    if h is None:
        return None
    return json.loads(exact(struct.unpack(">I", h)[0]))


def test_service_answers_bad_requests_and_goes_on(lease_daemon, lc):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(lease_daemon.sock + ".lease")
    for bad, want in [(b"{not json", "one JSON object"),
                      ({"op": "steal"}, "member 'op'"),
                      ({"op": "lease"}, "member 'name'"),
                      ({"op": "lease", "name": "a", "extra": 1}, "no member 'extra'"),
                      ({"op": "publish", "lease": 99}, "no lease 99"),
                      ({"op": "publish", "lease": -1}, "member 'lease'"),
                      ({"op": "create", "name": "z", "dtype": "float32",
                        "shape": [1, -1]}, "'shape'[1]")]:
        s.sendall(_frame(bad))
        r = _read(s)
        assert r is not None and "error" in r, bad
        assert 400 <= r["error"]["code"] < 500 and want in r["error"]["message"], r
    # a release has no answer (not even for a lease not held): the ping's is next
    s.sendall(_frame({"op": "release", "lease": 12345}) + _frame({"op": "ping"}))
    assert _read(s) == {}
    # a frame that cannot be read is answered, then the connection closes
    s.sendall(struct.pack(">I", 1 << 30))
    r = _read(s)
    assert r["error"]["status"] == "INVALID_ARGUMENT"
    assert _read(s) is None
    s.close()


def test_zero_copy_dtypes(lc):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.arange(96, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(4, 24)
    lc.put("bf", a, device="cpu:0", memory_kind="unpinned_host")
    x = lc.get("bf", zero_copy=True)
    assert x.dtype == np.dtype(ml_dtypes.bfloat16) and x.shape == (4, 24)
    assert np.array_equal(x.view(np.uint16), a.view(np.uint16))
    lc.put("empty", np.zeros((0, 3), np.int64), device="cpu:0", memory_kind="unpinned_host")
    e = lc.get("empty", zero_copy=True)
    assert e.shape == (0, 3) and e.dtype == np.int64 and not e.flags.writeable


def test_sharded_host_array_is_read_over_http(lc):
    sharding = {"mesh": {"devices": ["sim:0", "sim:1"], "axis_names": ["x"]}, "spec": ["x"],
                "memory_kind": "pinned_host"}
    a = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    lc.put("sh", a, sharding=sharding)
    with pytest.raises(ValueError, match="2 shards"):
        lc.get("sh", zero_copy=True)
    assert np.array_equal(lc.get("sh"), a)
    # the lease the client could not map was released: deleting frees the bytes
    lc.delete("sh")
    release_all(lc)
    assert in_use(lc, "pinned_host", "sim:0") == 0
    assert in_use(lc, "pinned_host", "sim:1") == 0


# ---- device arrays on a GPU: CUDA IPC (no GPU here: the handle's reply is
# built as tstaged answers it, the runtime stands in for libcudart; the real
# thing runs in test_cuda_lease.py under a cuda daemon) ----

class _Conn:
    def __init__(self) -> None:
        self.released = []

    def release_later(self, lease: int) -> None:
        self.released.append(lease)


class _Runtime:
    """tstage._cudart.Runtime's calls, recorded."""

    def __init__(self) -> None:
        self.calls, self.opened, self.closed = [], [], []

    def device_by_pci_bus_id(self, bus: str) -> int:
        self.calls.append(("bus", bus))
        return 3

    def ipc_open(self, handle: bytes, dev: int) -> int:
        self.opened.append((handle, dev))
        return 0x7f0000000000

    def ipc_close(self, ptr: int, dev: int) -> None:
        self.closed.append(ptr)

    def memcpy(self, dst: int, src: int, n: int, kind: int, dev: int) -> None:
        self.calls.append(("memcpy", n, kind, dev))


def _ipc_reply(lease=41, offset=4096, shape=(8, 4), dtype="float32", bus="0000:3B:00.0"):
    handle = bytes(range(64))
    length = int(np.prod(shape)) * np.dtype(tstage.DTYPES[dtype]).itemsize
    return {"lease": lease, "name": "g", "dtype": dtype, "shape": list(shape),
            "nbytes": length, "version": 1, "etag": "\"1\"", "writable": False,
            "shards": [{"device": "cuda:0", "memory_kind": "device", "transport": "cuda_ipc",
                        "offset": offset, "length": length, "start": [0, 0],
                        "count": list(shape), "replica": 0,
                        "cuda_ipc": {"handle": handle.hex(), "chunk_bytes": 1 << 30,
                                     "ordinal": 0, "pci_bus_id": bus,
                                     "uuid": "GPU-00000000-0000-0000-0000-000000000000"}}]}


def test_cuda_array_interface_and_close(monkeypatch):
    conn, rt = _Conn(), _Runtime()
    monkeypatch.setattr(tstage.lease, "_cuda_runtime", lambda: rt)
    x = tstage.lease.LeaseConnection._open(conn, _ipc_reply(), [], False)
    assert isinstance(x, tstage.CudaArray)
    # opened on the GPU of the bus id, whatever the server's ordinal
    assert rt.calls == [("bus", "0000:3B:00.0")]
    assert rt.opened == [(bytes(range(64)), 3)]
    assert x.device_id == 3 and x.__dlpack_device__() == (2, 3)
    cai = x.__cuda_array_interface__
    assert cai["shape"] == (8, 4) and cai["typestr"] == "<f4" and cai["version"] == 3
    assert cai["data"] == (0x7f0000000000 + 4096, True)      # read lease: read-only
    assert cai["strides"] is None and cai["stream"] is None
    assert conn.released == []
    x.close()
    assert rt.closed == [0x7f0000000000]                     # the base, not base + offset
    assert conn.released == [41]
    x.close()                                                # once
    assert conn.released == [41]
    with pytest.raises(ValueError, match="closed"):
        x.__cuda_array_interface__
    with pytest.raises(ValueError, match="closed"):
        x.__dlpack__()


def test_cuda_array_without_a_bus_id_uses_the_ordinal(monkeypatch):
    conn, rt = _Conn(), _Runtime()
    monkeypatch.setattr(tstage.lease, "_cuda_runtime", lambda: rt)
    x = tstage.lease.LeaseConnection._open(conn, _ipc_reply(bus=""), [], False)
    assert rt.calls == [] and rt.opened == [(bytes(range(64)), 0)] and x.device_id == 0
    x.close()


def test_cuda_array_released_by_gc(monkeypatch):
    conn, rt = _Conn(), _Runtime()
    monkeypatch.setattr(tstage.lease, "_cuda_runtime", lambda: rt)
    x = tstage.lease.LeaseConnection._open(conn, _ipc_reply(lease=7), [], True)
    assert x.__cuda_array_interface__["data"][1] is False     # writable
    del x
    gc.collect()
    assert rt.closed == [0x7f0000000000] and conn.released == [7]


def test_cuda_array_without_libcudart(monkeypatch):
    monkeypatch.setattr(tstage._cudart, "_runtime", None)
    monkeypatch.setattr(tstage._cudart, "LIBRARY_NAMES", ("libcudart-not-here.so.99",))
    monkeypatch.setattr(tstage.lease, "_cuda_runtime",
                        lambda: tstage._cudart.load(tstage._cudart.LIBRARY_NAMES))
    conn = _Conn()
    with pytest.raises(OSError, match="array 'g' is on cuda:0: .*libcudart.*not-here"):
        tstage.lease.LeaseConnection._open(conn, _ipc_reply(lease=9), [], False)
    assert conn.released == [9]                              # the lease does not linger


def test_cuda_open_failure_ends_the_lease(monkeypatch):
    rt = _Runtime()

    def fail(handle, dev):
        raise tstage.TransportError("cudaIpcOpenMemHandle on cuda:3: invalid resource handle")

    rt.ipc_open = fail
    monkeypatch.setattr(tstage.lease, "_cuda_runtime", lambda: rt)
    conn = _Conn()
    with pytest.raises(tstage.TransportError, match="cudaIpcOpenMemHandle"):
        tstage.lease.LeaseConnection._open(conn, _ipc_reply(lease=4), [], False)
    assert conn.released == [4]


def test_cuda_write_lease_publish_closes(monkeypatch):
    rt = _Runtime()
    sent = []

    class Conn(_Conn):
        def request(self, msg):
            sent.append(msg)
            return {"name": "g", "version": 2, "etag": "\"2\"", "replaced": False}, []

    c = Conn()
    monkeypatch.setattr(tstage.lease, "_cuda_runtime", lambda: rt)
    arr = tstage.lease.LeaseConnection._open(c, _ipc_reply(lease=5), [], True)
    arr.copy_from(np.zeros((8, 4), np.float32))
    assert rt.calls[-1] == ("memcpy", 128, 1, 3)              # host to device, on cuda:3
    with pytest.raises(ValueError, match="float32\\[8, 4\\]; got float64"):
        arr.copy_from(np.zeros((8, 4)))
    w = tstage.WriteLease(c, 5, "g", arr)
    assert w.publish()["version"] == 2
    assert sent == [{"op": "publish", "lease": 5}]
    assert arr.closed and rt.closed == [0x7f0000000000]
    # the handle closed, the release frees the lease's device memory, which
    # the server keeps after publish until then
    assert c.released == [5]


@pytest.mark.parametrize("dtype,code", [("float32", (2, 32, 1)), ("bfloat16", (4, 16, 1)),
                                        ("int64", (0, 64, 1)), ("uint8", (1, 8, 1)),
                                        ("bool", (6, 8, 1)), ("float16", (2, 16, 1))])
def test_cuda_array_dlpack_capsule(monkeypatch, dtype, code):
    conn, rt = _Conn(), _Runtime()
    monkeypatch.setattr(tstage.lease, "_cuda_runtime", lambda: rt)
    x = tstage.lease.LeaseConnection._open(conn, _ipc_reply(lease=11, dtype=dtype), [], False)
    cap = x.__dlpack__(stream=None, max_version=(1, 0))
    assert type(cap).__name__ == "PyCapsule" and "dltensor" in repr(cap)
    t = dlpack_tensor(cap)
    assert t["data"] == x.ptr == x.__cuda_array_interface__["data"][0]
    assert t["device"] == (2, 3) and t["ndim"] == 2 and t["shape"] == (8, 4)
    assert t["dtype"] == code and t["strides"] == 0 and t["byte_offset"] == 0
    assert t["manager_ctx"] != 0
    # the tensor holds the handle and the lease past the array's close
    x.close()
    assert rt.closed == [] and conn.released == []
    del cap                                   # nobody took it: its destructor deletes it
    gc.collect()
    assert rt.closed == [0x7f0000000000] and conn.released == [11]
    assert tstage._dlpack.live() == 0


def test_cuda_array_dlpack_consumer_deletes(monkeypatch):
    conn, rt = _Conn(), _Runtime()
    monkeypatch.setattr(tstage.lease, "_cuda_runtime", lambda: rt)
    x = tstage.lease.LeaseConnection._open(conn, _ipc_reply(lease=12), [], False)
    done = dlpack_consume(x.__dlpack__())           # the capsule goes; the consumer holds it
    gc.collect()
    del x
    gc.collect()
    assert rt.closed == [] and conn.released == [] and tstage._dlpack.live() == 1
    done()
    assert rt.closed == [0x7f0000000000] and conn.released == [12]
    assert tstage._dlpack.live() == 0


def test_cuda_array_dlpack_refusals(monkeypatch):
    conn, rt = _Conn(), _Runtime()
    monkeypatch.setattr(tstage.lease, "_cuda_runtime", lambda: rt)
    x = tstage.lease.LeaseConnection._open(conn, _ipc_reply(lease=13), [], False)
    with pytest.raises(BufferError, match="copy=True"):
        x.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="not \\(1, 0\\)"):
        x.__dlpack__(dl_device=(1, 0))
    cap = x.__dlpack__(dl_device=(2, 3), copy=False)
    del cap
    x.close()
    assert conn.released == [13] and tstage._dlpack.live() == 0


# ---- what no lessee can do ------------------------------------------------------

@pytest.mark.parametrize("kind", ["pinned_host", "unpinned_host"])
def test_read_descriptor_reopened_read_write_cannot_write(lc, kind):
    a = np.arange(MIB // 4, dtype=np.float32)
    lc.put("ro", a, device="cpu:0", memory_kind=kind)
    etag = lc.info("ro")["etag"]
    conn = lc.leases()
    reply, fds = conn.request({"op": "lease", "name": "ro"})
    try:
        sh = reply["shards"][0]
        size = int(sh["offset"]) + int(sh["length"])
        # the same uid may reopen the memory file read-write; it still cannot write
        rw = os.open(f"/proc/self/fd/{fds[0]}", os.O_RDWR)
        try:
            with pytest.raises(PermissionError):
                mmap.mmap(rw, size, flags=mmap.MAP_SHARED,
                          prot=mmap.PROT_READ | mmap.PROT_WRITE)
            with pytest.raises(PermissionError):
                os.pwrite(rw, b"x", 0)
        finally:
            os.close(rw)
    finally:
        for fd in fds:
            os.close(fd)
        conn.release_later(int(reply["lease"]))
    assert np.array_equal(lc.get("ro"), a)
    assert lc.info("ro")["etag"] == etag


@pytest.mark.parametrize("kind", ["pinned_host", "unpinned_host"])
def test_writer_cannot_change_what_it_published(lc, kind):
    want = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    w = lc.lease_write("pub", np.float32, (64, 32), memory_kind=kind, device="cpu:0")
    w.array[:] = want
    got = w.publish()
    # the client marks its view read-only; a writer that clears the mark and
    # writes on changes its own scratch memory, never the version
    w.array.flags.writeable = True
    w.array[:] = -1
    assert np.array_equal(lc.get("pub"), want)
    assert lc.info("pub")["etag"] == got["etag"]
    x = lc.get("pub", zero_copy=True)
    assert np.array_equal(x, want)


def test_pipelined_requests_are_answered_in_order(lease_daemon, lc):
    lc.put("p", np.arange(1024, dtype=np.uint8), device="cpu:0", memory_kind="pinned_host")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(lease_daemon.sock + ".lease")
    # 1,000 requests in one write before reading any answer
    s.sendall(_frame({"op": "lease", "name": "p"}) * 1000 + _frame({"op": "ping"}))
    last = 0
    for i in range(1000):
        r = _read(s)           # descriptors that come with it are dropped by recv
        assert r is not None, f"answer {i + 1} of 1000: the connection closed"
        assert "error" not in r, r
        assert r["lease"] > last
        last = r["lease"]
    assert _read(s) == {}
    s.close()
