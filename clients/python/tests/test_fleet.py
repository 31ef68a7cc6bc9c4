"""Client.fleet(): a daemon naming another in --peers lists both nodes, each
with its host and devices; a peer that is gone is listed unreachable with the
reason; scope="local" is the answering node alone, another scope is refused."""
from __future__ import annotations

import time

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

        b.stop()
        node = _wait_for(ca, b.url, False)
        assert not node["reachable"]
        assert node["error"]["reason"] == "CONNECT_FAILED"
        assert node["host"] == "node-b" and node["devices"] == []
    finally:
        a.stop()
        b.stop()
