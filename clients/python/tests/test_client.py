"""The client's own rules: error mapping, both operation shapes, the retry
policy (against a scripted loopback server), tokens from the environment."""
from __future__ import annotations

import http.server
import json
import os
import threading
from typing import List, Tuple

import numpy as np
import pytest

import tstage
from conftest import ROOT, Daemon


def status(code, name, reason, message="m", metadata=None):
    return {"code": code, "status": name, "message": message,
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                         "reason": reason, "domain": "tstage", "metadata": metadata or {}}]}


def test_error_from_status_by_reason_then_status():
    e = tstage.error_from_status(status(429, "RESOURCE_EXHAUSTED", "OUT_OF_MEMORY", metadata={
        "space": "cuda:0/device", "requested_bytes": "300", "free_bytes": "200",
        "largest_free_block_bytes": "100", "limit_bytes": "1000"}))
    assert type(e) is tstage.OutOfMemory
    assert (e.space, e.requested, e.free, e.largest_free_block, e.limit) == \
        ("cuda:0/device", 300, 200, 100, 1000)
    assert type(tstage.error_from_status(status(404, "NOT_FOUND", "MODEL_NOT_FOUND"))) \
        is tstage.NotFound
    assert type(tstage.error_from_status(status(400, "FAILED_PRECONDITION", "ETAG_MISMATCH"))) \
        is tstage.EtagMismatch
    broken = tstage.error_from_status(status(503, "UNAVAILABLE", "DEVICE_BROKEN"))
    assert isinstance(broken, tstage.Unavailable) and not broken.retryable
    assert tstage.error_from_status(status(409, "ABORTED", "X")).retryable
    assert not tstage.error_from_status(status(409, "ALREADY_EXISTS", "X")).retryable
    # a body that is not a Status: by the HTTP status
    assert type(tstage.error_from_status("<html>", http_status=503)) is tstage.Unavailable


def test_operation_fields_in_both_shapes():
    today = {"name": "operations/op-1", "id": "op-1", "kind": "put", "target": "w",
             "state": "SUCCEEDED", "done": True, "progress": {"bytes_done": 4,
                                                              "bytes_total": 4},
             "result": {"name": "w"}}
    aip151 = {"name": "operations/op-1", "done": True,
              "metadata": {"kind": "put", "target": "w", "state": "SUCCEEDED",
                           "progress": {"bytes_done": 4, "bytes_total": 4}},
              "response": {"name": "w"}}
    for body in (today, aip151):
        op = tstage.Operation(None, body)  # type: ignore[arg-type]
        assert (op.id, op.kind, op.target, op.state, op.done) == \
            ("op-1", "put", "w", "SUCCEEDED", True)
        assert op.progress == {"bytes_done": 4, "bytes_total": 4}
        assert op.result() == {"name": "w"}
    failed = dict(aip151, metadata=dict(aip151["metadata"], state="FAILED"),
                  error=status(429, "RESOURCE_EXHAUSTED", "OUT_OF_MEMORY"))
    del failed["response"]
    with pytest.raises(tstage.OutOfMemory):
        tstage.Operation(None, failed).result()  # type: ignore[arg-type]


class Scripted(http.server.BaseHTTPRequestHandler):
    """Answers each request with the next (code, headers, body) of the script."""
    script: List[Tuple[int, dict, dict]] = []
    seen: List[str] = []
    protocol_version = "HTTP/1.1"

    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        self.seen.append(f"{self.command} {self.path}")
        code, headers, body = self.script.pop(0) if self.script else (200, {}, {})
        data = json.dumps(body).encode()
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def scripted():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    Scripted.script, Scripted.seen = [], []
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def err(code, name, reason):
    return {"error": status(code, name, reason)}


def test_retries_unavailable_with_retry_after(scripted):
    _, url = scripted
    Scripted.script = [(503, {"Retry-After": "0"}, err(503, "UNAVAILABLE", "DRAINING")),
                       (503, {}, err(503, "UNAVAILABLE", "TOO_MANY_CONNECTIONS")),
                       (200, {}, {"backends": [{"name": "sim"}]})]
    c = tstage.Client(url, retries=3, backoff=0.01)
    assert c.backends() == [{"name": "sim"}]
    assert len(Scripted.seen) == 3


def test_no_retry_of_out_of_memory_or_device_broken(scripted):
    _, url = scripted
    c = tstage.Client(url, retries=3, backoff=0.01)
    Scripted.script = [(429, {}, err(429, "RESOURCE_EXHAUSTED", "OUT_OF_MEMORY"))]
    with pytest.raises(tstage.OutOfMemory):
        c.put("a", np.zeros(4))
    assert len(Scripted.seen) == 1
    Scripted.script = [(503, {}, err(503, "UNAVAILABLE", "DEVICE_BROKEN"))]
    with pytest.raises(tstage.DeviceBroken):
        c.devices()
    assert len(Scripted.seen) == 2


def test_429_with_retry_after_is_retried(scripted):
    _, url = scripted
    c = tstage.Client(url, retries=3, backoff=0.01)
    Scripted.script = [(429, {"Retry-After": "0"}, err(429, "RESOURCE_EXHAUSTED",
                                                       "HEADER_BUDGET")),
                       (200, {}, {"arrays": []})]
    assert c.import_safetensors(_bytes_file()) == {"arrays": []}
    assert len(Scripted.seen) == 2


def _bytes_file():
    import io
    return io.BytesIO(b"x" * 100)


def test_aborted_retried_only_when_idempotent(scripted):
    _, url = scripted
    c = tstage.Client(url, retries=3, backoff=0.01)
    aborted = (409, {}, err(409, "ABORTED", "HELD"))
    Scripted.script = [aborted, aborted, (200, {}, {"name": "a"})]
    assert c.put("a", np.zeros(4))["name"] == "a"  # PUT replaces: idempotent
    assert [s.split("?")[0] for s in Scripted.seen] == ["PUT /v1/arrays/a"] * 3
    Scripted.seen.clear()
    Scripted.script = [aborted, (200, {}, {})]
    with pytest.raises(tstage.Aborted):
        c.copy("a", "b")  # a POST that creates: not sent again
    assert len(Scripted.seen) == 1


def test_operations_follow_pages(scripted):
    _, url = scripted
    op = {"name": "operations/op-1", "done": True, "metadata": {"state": "SUCCEEDED"}}
    Scripted.script = [(200, {}, {"operations": [op], "next_page_token": "t1"}),
                       (200, {}, {"operations": [dict(op, name="operations/op-2")]})]
    ops = tstage.Client(url).operations(state="SUCCEEDED", page_size=1)
    assert [o.id for o in ops] == ["op-1", "op-2"]
    assert Scripted.seen[1].endswith("page_size=1&page_token=t1")


def test_connection_refused_is_retried_then_raised():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    c = tstage.Client(f"http://127.0.0.1:{port}", retries=2, backoff=0.01)
    with pytest.raises(tstage.TransportError):
        c.devices()


def test_token_from_environment(tmp_path, monkeypatch):
    tok = tmp_path / "token"
    tok.write_text("s3cret-token-of-enough-length\n")
    os.chmod(tok, 0o600)
    d = Daemon(["--token-file", str(tok)])
    try:
        with pytest.raises(tstage.Unauthenticated):
            tstage.Client(d.url, retries=0).devices()
        monkeypatch.setenv("TSTAGE_URL", d.url)
        monkeypatch.setenv("TSTAGE_TOKEN_FILE", str(tok))
        c = tstage.Client()
        assert c.url == d.url and len(c.devices()) == 3
        assert tstage.Client(d.url, token="s3cret-token-of-enough-length").backends()
    finally:
        d.stop()


def test_unix_socket(tmp_path, monkeypatch):
    sock = os.path.join(tmp_path, "tstaged.sock")
    tok = tmp_path / "token"
    tok.write_text("unix-socket-token-of-enough-length\n")
    os.chmod(tok, 0o600)
    d = Daemon(["--unix-socket", sock, "--unix-socket-mode", "0660", "--token-file", str(tok)])
    try:
        st = os.stat(sock)
        assert oct(st.st_mode & 0o777) == "0o660"
        c = tstage.Client(unix_socket=sock)  # the socket is the permission: no token
        a = np.arange(64, dtype=np.float32).reshape(8, 8)
        c.put("u", a, memory_kind="pinned_host")
        assert np.array_equal(c.get("u"), a)
        assert np.array_equal(c.get_rows("u", [3, 1]), a[[3, 1]])
        assert c.device_put("u", device="sim:1", wait=True)["sharding"]["device"] == "sim:1"
        with pytest.raises(tstage.NotFound):
            c.get("nope")
        with pytest.raises(tstage.Unauthenticated):  # TCP still asks for the token
            tstage.Client(d.url, retries=0).get("u")
        monkeypatch.setenv("TSTAGE_UNIX_SOCKET", sock)
        assert [x["name"] for x in tstage.Client().list()] == ["u"]
    finally:
        d.stop()
    assert not os.path.exists(sock)
    with pytest.raises(tstage.TransportError):
        tstage.Client(unix_socket=sock, retries=1, backoff=0.01).devices()


def test_topology_of_a_two_socket_file():
    xml = str(ROOT / "tests" / "data" / "two_socket.xml")
    d = Daemon(["--topology-file", xml, "--sim-numa-nodes", "0,1", "--sim-peer-links", "none"])
    try:
        c = tstage.Client(d.url)
        t = c.topology()
        assert t["source"] == xml
        assert [(n["index"], n["cpuset"]) for n in t["numa_nodes"]] == [(0, "0-7"), (1, "8-15")]
        assert [(x["id"], x["numa_node"]) for x in t["devices"]] == [
            ("sim:0", 0), ("sim:1", 1), ("cpu:0", None)]
        assert c.device("sim:1")["local_cpus"] == "8-15"
        b = t["devices"][1]["cpu_binding"]
        assert (b["copy_threads"], b["cpu_kernels"], b["applied"]) == (True, True, False)
        assert "from a file" in b["reason"]
        p = t["peers"]
        assert p["devices"] == ["sim:0", "sim:1"]
        assert p["access"] == [[True, False], [False, True]]
        assert p["link"][0] == ["self", "cross_socket"]
        assert "SYS*" in p["text"]
    finally:
        d.stop()
    assert d.proc.returncode == 0
