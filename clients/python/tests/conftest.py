"""A live tstaged for the client's tests: build/tstaged (or $TSTAGED) on a free
loopback port, two sim devices of 256 MiB, small host budgets, a temporary
data directory. ``Daemon(backend="cuda")`` runs one on the node's GPUs instead
(the suites that need it run when TS_TEST_BACKEND=cuda, as the integration
suites do; under ../shared/fakecuda, the stand-in's GPUs)."""
from __future__ import annotations

import ctypes
import os
import pathlib
import struct
import subprocess
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

import tstage

ROOT = pathlib.Path(__file__).resolve().parents[3]
SIM_MEMORY = 256 << 20
PINNED_LIMIT = 256 << 20
UNPINNED_LIMIT = 512 << 20


class Daemon:
    """One tstaged process and what it was started with."""

    def __init__(self, extra: Optional[List[str]] = None, backend: str = "sim") -> None:
        self.dir = tempfile.mkdtemp(prefix="tstage-py-")
        self.data_dir = os.path.join(self.dir, "data")
        os.mkdir(self.data_dir)
        port_file = os.path.join(self.dir, "port")
        binary = os.environ.get("TSTAGED") or str(ROOT / "build" / "tstaged")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TSTAGE_")}
        on = (["--no-cuda", "--sim-devices", "2", "--sim-device-memory", str(SIM_MEMORY)]
              if backend == "sim" else ["--cuda=true"])
        args = [binary, "--port", "0", "--port-file", port_file, "--log-level", "warn"] + on + [
                "--pinned-host-limit", str(PINNED_LIMIT),
                "--unpinned-host-limit", str(UNPINNED_LIMIT), "--data-dir", self.data_dir]
        args += extra or []
        self.stderr = open(os.path.join(self.dir, "stderr"), "wb")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.stderr,
                                     stderr=self.stderr, env=env)
        deadline = time.monotonic() + 30
        self.port = 0
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tstaged exited with {self.proc.returncode}: "
                                   f"{open(self.stderr.name).read()}")
            try:
                with open(port_file) as f:
                    self.port = int(f.read().strip() or 0)
            except (OSError, ValueError):
                self.port = 0
            if self.port:
                break
            time.sleep(0.02)
        if not self.port:
            self.stop()
            raise RuntimeError("tstaged wrote no port file within 30 s")
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    d = Daemon()
    yield d
    d.stop()
    assert d.proc.returncode == 0, open(d.stderr.name).read()


def _clean(c: tstage.Client) -> None:
    for m in c.models():
        try:
            c.delete_model(m["name"])
        except tstage.TstageError:
            pass
    for a in list(c.list()):
        try:
            c.delete(a["name"])
        except tstage.TstageError:
            pass


@pytest.fixture
def client(daemon: Daemon) -> Iterator[tstage.Client]:
    """A client of the session's daemon; every array and model is deleted after
    the test."""
    c = tstage.Client(daemon.url, retries=2, backoff=0.05)
    yield c
    for op in c.operations(state="RUNNING") + c.operations(state="PENDING"):
        try:
            op.cancel().wait(timeout=30)
        except tstage.TstageError:
            pass
    _clean(c)
    c.close()


# ---- DLPack, as a consumer sees it -----------------------------------------

def dlpack_tensor(cap: Any) -> Dict[str, Any]:
    """The DLManagedTensor in a "dltensor" capsule, read at DLPack's ABI
    offsets (not through tstage's own structures): data, device, ndim,
    dtype (code, bits, lanes), shape, strides, byte_offset, manager_ctx and
    deleter; "ptr" is the tensor's address."""
    get = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    p = get(cap, b"dltensor")
    raw = ctypes.string_at(p, 64)
    data, dev_type, dev_id, ndim = struct.unpack_from("<Qiii", raw, 0)
    code, bits, lanes = struct.unpack_from("<BBH", raw, 20)
    shape_p, strides_p, byte_offset, ctx, deleter = struct.unpack_from("<QQQQQ", raw, 24)
    shape = struct.unpack(f"<{ndim}q", ctypes.string_at(shape_p, 8 * ndim)) if ndim else ()
    return {"ptr": p, "data": data, "device": (dev_type, dev_id), "ndim": ndim,
            "dtype": (code, bits, lanes), "shape": shape, "strides": strides_p,
            "byte_offset": byte_offset, "manager_ctx": ctx, "deleter": deleter}


_USED = ctypes.create_string_buffer(b"used_dltensor")    # outlives every capsule


def dlpack_consume(cap: Any) -> Callable[[], None]:
    """What a DLPack consumer does: renames the capsule "used_dltensor" (so
    that its destructor leaves the tensor alone) and answers a function that
    calls the tensor's deleter, as the consumer does when it is done."""
    set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p)(
        ("PyCapsule_SetName", ctypes.pythonapi))
    t = dlpack_tensor(cap)
    assert set_name(cap, ctypes.addressof(_USED)) == 0
    deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(t["deleter"])
    return lambda: deleter(t["ptr"])
