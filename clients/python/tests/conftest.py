"""A live tstaged for the client's tests: build/tstaged (or $TSTAGED) on a free
loopback port, two sim devices of 256 MiB, small host budgets, a temporary
data directory."""
from __future__ import annotations

import os
import pathlib
import subprocess
import tempfile
import time
from typing import Iterator, List, Optional

import pytest

import tstage

ROOT = pathlib.Path(__file__).resolve().parents[3]
SIM_MEMORY = 256 << 20
PINNED_LIMIT = 256 << 20
UNPINNED_LIMIT = 512 << 20


class Daemon:
    """One tstaged process and what it was started with."""

    def __init__(self, extra: Optional[List[str]] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="tstage-py-")
        self.data_dir = os.path.join(self.dir, "data")
        os.mkdir(self.data_dir)
        port_file = os.path.join(self.dir, "port")
        binary = os.environ.get("TSTAGED") or str(ROOT / "build" / "tstaged")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TSTAGE_")}
        args = [binary, "--port", "0", "--port-file", port_file, "--log-level", "warn",
                "--no-cuda", "--sim-devices", "2", "--sim-device-memory", str(SIM_MEMORY),
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
