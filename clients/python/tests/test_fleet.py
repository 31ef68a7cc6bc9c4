"""Client.fleet(): a daemon naming another in --peers lists both nodes, each
with its host and devices; a peer that is gone is listed unreachable with the
reason; scope="local" is the answering node alone, another scope is refused.
memory(), history(), models() and topology() with host= read that node
through the daemon asked."""
from __future__ import annotations

import socket
import time

import numpy as np
import pytest

import tstage
from conftest import Daemon


def _wait_for(client: tstage.Client, url: str, reachable: bool) -> dict:
    deadline = time.monotonic() + 15
    while True:
        node = next(n for n in client.fleet() if n["url"] == url)
        if node["reachable"] == reachable or time.monotonic() > deadline:
            return node
        time.sleep(0.1)


def test_fleet_lists_peers_and_marks_the_gone():
    b = Daemon(["--host-name", "node-b"])
    a = Daemon(["--host-name", "node-a", "--peers", f"http://127.0.0.1:{b.port}"])
    try:
        ca, cb = tstage.Client(a.url), tstage.Client(b.url)
        node = _wait_for(ca, b.url, True)
        assert node["reachable"] and node["host"] == "node-b" and not node["self"]
        assert [d["id"] for d in node["devices"]] == [d["id"] for d in cb.devices()]
        assert {d["host"] for d in node["devices"]} == {"node-b"}
        nodes = ca.fleet()
        assert [n["host"] for n in nodes] == ["node-a", "node-b"]
        assert nodes[0]["self"] and nodes[0]["devices"][0]["host"] == "node-a"
        local = ca.fleet(scope="local")
        assert len(local) == 1 and local[0]["host"] == "node-a"
        with pytest.raises(tstage.InvalidArgument) as e:
            ca.fleet(scope="galaxy")
        assert "galaxy" in str(e.value)

        # another node's views, read through node-a
        cb.put("only.b", np.arange(1000, dtype=np.float32))
        assert ca.memory(host="node-b")["host"] == "node-b"
        assert ca.memory(host="node-b")["spaces"] == cb.memory()["spaces"]
        assert ca.memory()["host"] == ca.memory(host="node-a")["host"] == "node-a"
        hist = ca.history(since="30s", host="node-b")
        assert hist["times_unix_ms"] and {s["device"] for s in hist["spaces"]} == \
            {s["device"] for s in cb.history(since="30s")["spaces"]}
        assert ca.models(host="node-b") == cb.models()
        assert ca.topology(host="node-b") == cb.topology()
        with pytest.raises(tstage.NotFound) as e:
            ca.memory(host="node-z")
        assert "node-z" in str(e.value)

        b.stop()
        node = _wait_for(ca, b.url, False)
        assert not node["reachable"]
        assert node["error"]["reason"] == "CONNECT_FAILED"
        assert node["host"] == "node-b" and node["devices"] == []
        with pytest.raises(tstage.Unavailable):
            ca.history(host="node-b")
    finally:
        a.stop()
        b.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_copy_and_move_to_another_host():
    # the destination listens on a fleet port for the bytes
    b = Daemon(["--host-name", "node-b", "--fleet-port", str(_free_port())])
    a = Daemon(["--host-name", "node-a", "--peers", f"http://127.0.0.1:{b.port}"])
    try:
        ca, cb = tstage.Client(a.url), tstage.Client(b.url)
        assert _wait_for(ca, b.url, True)["reachable"]
        x = np.arange(300 * 200, dtype=np.float32).reshape(300, 200) / 7
        ca.put("x", x)
        done = ca.copy("x", "y", host="node-b", memory_kind="pinned_host", wait=True)
        assert done["host"] == "node-b" and done["array"]["name"] == "y"
        assert done["array"]["sharding"]["memory_kind"] == "pinned_host"
        np.testing.assert_array_equal(cb.get("y"), x)
        ca.copy("x", "yb", host="node-b", dtype="bfloat16", wait=True)
        assert cb.info("yb")["dtype"] == "bfloat16"
        with pytest.raises(tstage.NotFound) as e:
            ca.copy("x", "z", host="node-q", wait=True)
        assert "node-q" in str(e.value)
        ca.device_put("x", host="node-b", wait=True)
        np.testing.assert_array_equal(cb.get("x"), x)
        assert "x" not in [i["name"] for i in ca.list()]
    finally:
        a.stop()
        b.stop()


def test_broadcast_to_two_hosts():
    b = Daemon(["--host-name", "node-b", "--fleet-port", str(_free_port())])
    c = Daemon(["--host-name", "node-c", "--fleet-port", str(_free_port())])
    a = Daemon(["--host-name", "node-a", "--peers",
                f"http://127.0.0.1:{b.port},http://127.0.0.1:{c.port}"])
    try:
        ca, cb, cc = tstage.Client(a.url), tstage.Client(b.url), tstage.Client(c.url)
        assert _wait_for(ca, b.url, True)["reachable"]
        assert _wait_for(ca, c.url, True)["reachable"]
        x = np.arange(512 * 300, dtype=np.float32).reshape(512, 300) / 3
        ca.put("x", x)
        done = ca.broadcast("x", "y", ["node-b", "node-c"], memory_kind="pinned_host", wait=True)
        assert [d["host"] for d in done["destinations"]] == ["node-b", "node-c"]
        assert done["failed_hosts"] == []
        assert all(d["state"] == "published" for d in done["destinations"])
        np.testing.assert_array_equal(cb.get("y"), x)
        np.testing.assert_array_equal(cc.get("y"), x)
        with pytest.raises(tstage.InvalidArgument) as e:
            ca.broadcast("x", "z", ["node-b", "node-b"])
        assert "twice" in str(e.value)
        # node-c refuses "y" (it exists there): with partial_ok node-b gets it
        cc.put("w", np.ones((2, 2), np.float32))
        done = ca.broadcast("x", "w", ["node-b", "node-c"], partial_ok=True, wait=True)
        assert done["failed_hosts"] == ["node-c"]
        assert done["destinations"][1]["error"]["status"] == "ALREADY_EXISTS"
        np.testing.assert_array_equal(cb.get("w"), x)
        with pytest.raises(tstage.AlreadyExists):
            ca.broadcast("x", "w", ["node-b", "node-c"], overwrite=False, wait=True)
    finally:
        a.stop()
        b.stop()
        c.stop()
