"""The tstage client: arrays, moves, operations and models of one tstaged."""
from __future__ import annotations

import datetime as _datetime
import io
import json as _json
import os
from typing import Any, BinaryIO, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from . import dtypes as _dt
from ._transport import Transport, quote_name
from .errors import NotFound, TstageError
from .lease import LeaseConnection, WriteLease
from .operation import Operation

__all__ = ["Client", "rows"]

#: bytes per piece of a streamed upload or import
CHUNK = 4 << 20

Sharding = Union[str, Dict[str, Any]]
#: numpy basic indexing: a str expression, an int, a slice, ... or a tuple of them
Index = Any
PathOrFile = Union[str, "os.PathLike[str]", BinaryIO]


def rows(array: str, rows: Sequence[int]) -> Dict[str, Any]:
    """A step's ``inputs``/``targets`` given as rows of a dataset array."""
    return {"array": array, "rows": [int(r) for r in rows]}


def windows(array: str, context: int, batch_size: int, *, order: str = "sequential",
            seed: int = 0, start: int = 0) -> Dict[str, Any]:
    """A token model's ``windows`` of one token stream (a uint16 or int32 array
    of any shape, read flat): each step's ``batch_size`` windows of
    ``context`` + 1 tokens, inputs their first ``context``, targets their last.
    ``order`` ``"sequential"`` or ``"random"``; ``start`` counts windows (a
    result's ``windows["next"]`` continues a run exactly). docs/API.md defines
    the offsets."""
    return {"array": array, "context": int(context), "batch_size": int(batch_size),
            "order": order, "seed": int(seed), "start": int(start)}


def _run_body(**fields: Any) -> Dict[str, Any]:
    """A :step or :evaluate body: the fields given, those that are None left out."""
    return {k: v for k, v in fields.items() if v is not None}


def _index_expr(index: Index) -> str:
    """numpy basic indexing as tstaged's ``?index=`` expression."""
    if isinstance(index, str):
        return index
    parts = index if isinstance(index, tuple) else (index,)
    out = []
    for p in parts:
        if p is Ellipsis:
            out.append("...")
        elif isinstance(p, slice):
            f = ["" if v is None else str(int(v)) for v in (p.start, p.stop, p.step)]
            out.append(f"{f[0]}:{f[1]}" + (f":{f[2]}" if p.step is not None else ""))
        elif isinstance(p, (int, np.integer)) and not isinstance(p, bool):
            out.append(str(int(p)))
        else:
            raise TypeError(f"index entry {p!r} is not an integer, a slice or '...' "
                            "(basic indexing only; get_rows takes a list of rows)")
    return ",".join(out)


def _as_numpy(array: Any) -> np.ndarray:
    """A C-contiguous little-endian numpy view (or copy) of a numpy array, or of
    anything with __dlpack__ or __array__ (JAX, torch, CuPy ...)."""
    a: Optional[np.ndarray] = None
    if isinstance(array, np.ndarray):
        a = array
    else:
        mod = type(array).__module__.split(".")[0]
        if mod == "torch":
            t = array.detach().cpu()
            if str(t.dtype) == "torch.bfloat16":  # numpy has no bfloat16 of its own
                a = t.view(__import__("torch").int16).numpy().view(_dt.DTYPES["bfloat16"])
            else:
                a = t.numpy()
        elif hasattr(array, "__dlpack__"):
            try:
                a = np.from_dlpack(array)
            except (TypeError, RuntimeError, BufferError, ValueError):
                a = None
        if a is None:
            a = np.asarray(array)
    assert a is not None
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    # (np.ascontiguousarray would make a 0-d array 1-d)
    return a if a.flags.c_contiguous else a.copy(order="C")


def _read_into(resp: Any, view: memoryview) -> int:
    """Reads the body into view, in pieces of at most CHUNK; answers the bytes
    read. An identity body is read by the http.client response underneath
    urllib3's straight into view (urllib3's own readinto goes through a
    temporary bytes object: one more copy of every byte)."""
    fp = getattr(resp, "_fp", None)
    direct = None
    if fp is not None and not resp.headers.get("Content-Encoding"):
        direct = getattr(fp, "readinto", None)
    got, n = 0, view.nbytes
    while got < n:
        piece = view[got:min(got + CHUNK, n)]
        k = direct(piece) if direct is not None else resp.readinto(piece)
        if not k:
            break
        got += k
    return got


_LIKES = (None, "numpy", "jax", "torch")

# get_rows names rows in the URL (GET .../data?rows=) up to this many
# characters, and in a body (POST .../{name}:rows) past it: a long URL needs
# a connection with room for a long request head, and past tstaged's head
# limit (docs/API.md, Limits) none has room
_ROWS_IN_URL = 4000


def _check_like(like: Optional[str]) -> None:
    if like not in _LIKES:
        raise ValueError(f"like='{like}' is not 'numpy', 'jax' or 'torch'")


def _convert(a: np.ndarray, like: Optional[str]) -> Any:
    if like is None or like == "numpy":
        return a
    if like == "jax":
        import jax.numpy as jnp
        return jnp.asarray(a)
    if like == "torch":
        import torch
        if a.dtype == _dt.DTYPES["bfloat16"]:
            return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        return torch.from_numpy(a.copy() if not a.flags.writeable else a)
    raise ValueError(f"like='{like}' is not 'numpy', 'jax' or 'torch'")


def _placement(device: Optional[str], memory_kind: Optional[str],
               sharding: Optional[Sharding]) -> Dict[str, Any]:
    q: Dict[str, Any] = {}
    if sharding is not None:
        q["sharding"] = sharding if isinstance(sharding, str) else _json.dumps(sharding)
    if device is not None:
        q["device"] = device
    if memory_kind is not None:
        q["memory_kind"] = memory_kind
    return q


def _read_token_file(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


class Client:
    """A connection to one tstaged.

    Args:
        url: ``http://host:port``; default ``$TSTAGE_URL``, else
            ``http://127.0.0.1:8470``.
        token: the bearer token; default the contents of ``token_file``.
        token_file: default ``$TSTAGE_TOKEN_FILE``.
        unix_socket: serve over this Unix socket instead of TCP (tstaged
            ``--unix-socket``); default ``$TSTAGE_UNIX_SOCKET``.
        timeout: seconds a request may wait for its answer.
        retries: how many times a request is sent again where its answer says
            that is safe (see ``tstage._transport``); 0 never.
        backoff: first delay between tries, seconds (doubling, with jitter).

    The client is thread-safe (a pool of keep-alive connections) and a context
    manager.
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 token_file: Optional[str] = None, unix_socket: Optional[str] = None,
                 timeout: float = 300.0, retries: int = 4, backoff: float = 0.1,
                 max_backoff: float = 5.0) -> None:
        url = url or os.environ.get("TSTAGE_URL") or "http://127.0.0.1:8470"
        unix_socket = unix_socket or os.environ.get("TSTAGE_UNIX_SOCKET") or None
        if token is None:
            token_file = token_file or os.environ.get("TSTAGE_TOKEN_FILE") or None
            if token_file:
                token = _read_token_file(token_file)
        self.url = url
        self._unix_socket = unix_socket
        self._lease_conn: Optional[LeaseConnection] = None
        self._t = Transport(url, unix_socket=unix_socket, token=token, timeout=timeout,
                            retries=retries, backoff=backoff, max_backoff=max_backoff)

    def close(self) -> None:
        """Closes the pooled connections, and the lease connection: every lease
        ends (arrays of ``get(zero_copy=True)`` must not be used after)."""
        if self._lease_conn is not None:
            self._lease_conn.close()
            self._lease_conn = None
        self._t.close()

    def leases(self) -> LeaseConnection:
        """The connection to the lease service (``<unix socket>.lease``), made on
        first use; needs ``unix_socket``."""
        if self._lease_conn is None:
            if not self._unix_socket:
                raise ValueError("zero_copy and lease_write need tstaged's Unix socket: "
                                 "Client(unix_socket=...) on the same node")
            self._lease_conn = LeaseConnection(self._unix_socket)
        return self._lease_conn

    def lease_write(self, name: str, dtype: Any, shape: Sequence[int], *,
                    memory_kind: Optional[str] = None,
                    device: Optional[str] = None) -> WriteLease:
        """A new array in the server's memory (``pinned_host`` unless
        ``memory_kind`` says ``unpinned_host`` or ``device``) to fill in place:
        ``w.array`` is a writable numpy array over it (not initialised), or a
        :class:`tstage.lease.CudaArray` on a GPU; ``w.publish()`` makes it the
        current version of name. Same node only (Unix socket)."""
        return self.leases().create(name, dtype, shape, memory_kind=memory_kind,
                                    device=device)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<tstage.Client {self._t.base}>"

    # ---- node ----------------------------------------------------------------
    def health(self) -> bool:
        """Whether ``/readyz`` answers ready."""
        try:
            self._t.request("GET", "/readyz", idempotent=True)
            return True
        except TstageError:
            return False

    def backends(self) -> List[Dict[str, Any]]:
        """Every backend this daemon knows (``cuda``, ``sim``, ``cpu``)."""
        return self._t.json("GET", "/v1/backends")["backends"]

    def devices(self) -> List[Dict[str, Any]]:
        """Every device with its memories and their live stats, in topology
        order (backend by backend, each NUMA node's devices together)."""
        return self._t.json("GET", "/v1/devices")["devices"]

    def topology(self, host: Optional[str] = None) -> Dict[str, Any]:
        """The node's NUMA nodes (``index``, ``memory_bytes``, ``cpuset``), each
        device's ``numa_node``, ``local_cpus`` and ``cpu_binding`` (whether its
        ``copy_threads`` and ``cpu_kernels`` are bound to its local CPUs, whether
        that is ``applied``, and the ``reason``), and the accelerators' peer
        matrix (``peers``: ``devices``, then ``access``, ``link``, ``perf_rank``
        and ``native_atomics`` as lists of rows, and ``text`` as ``nvidia-smi
        topo -m`` prints it), as discovered at start, with the ``source``
        ("machine" or the ``--topology-file``). ``host``: another node of the
        fleet's, read through this daemon (see :meth:`memory`)."""
        return self._t.json("GET", "/v1/topology", query={"host": host})

    def device(self, device: str) -> Dict[str, Any]:
        """One device (``sim:0``, ``cuda:1``, ``cpu:0``)."""
        return self._t.json("GET", f"/v1/devices/{quote_name(device)}")

    def memory_stats(self, device: str, memory_kind: str = "device") -> Dict[str, Any]:
        """JAX's ``Device.memory_stats()`` for one space."""
        return self._t.json("GET", f"/v1/devices/{quote_name(device)}/memory_stats",
                            query={"memory_kind": memory_kind})

    def memory(self, host: Optional[str] = None) -> Dict[str, Any]:
        """The dashboard view: every space's stats, array and transfer totals.

        ``host``: another node of the fleet (its host as :meth:`fleet` lists
        it), read through this daemon (``?host=``); an unknown host raises
        ``NotFound``, an unreachable one ``Unavailable``."""
        return self._t.json("GET", "/v1/memory", query={"host": host})

    def history(self, since: Union[None, str, float, _datetime.datetime,
                                   _datetime.timedelta] = None,
                step: Union[None, str, float, _datetime.timedelta] = None,
                host: Optional[str] = None) -> Dict[str, Any]:
        """The memory history (``GET /v1/memory/history``): ``times_unix_ms`` and,
        row by row, every space's and pool's use (``spaces``, ``pools`` with
        ``bytes_limit``), copy bytes per device and direction (``transfers``),
        ``http_requests_total`` and ``operations``, with ``step_seconds``.

        ``since``: a time (an aware ``datetime``, or RFC 3339 text), or a time
        ago (seconds, a ``timedelta``, or text such as ``"10m"``); default, the
        answering ring's whole span. ``step``: the wanted resolution (seconds,
        a ``timedelta`` or ``"10s"``): 1 s rows for the last 15 minutes, 10 s
        rows for 3 hours. Bad values raise ``InvalidArgument``. ``host``:
        another node of the fleet's history, read through this daemon (see
        :meth:`memory`)."""
        return self._t.json("GET", "/v1/memory/history",
                            query={"since": _since_param(since), "step": _seconds_param(step),
                                   "host": host})

    def trace(self, seconds: int = 5, path: Union[None, str, "os.PathLike[str]"] = None) -> Dict[str, Any]:
        """Records a trace of the daemon for ``seconds`` (1..60) and answers it
        (``GET /v1/trace``): Chrome Trace Event JSON (``traceEvents``,
        ``displayTimeUnit``, ``metadata`` with ``dropped_events``) that
        Perfetto's UI (ui.perfetto.dev) and ``chrome://tracing`` open. With
        ``path`` it is also written there as the daemon answered it. Blocks
        for ``seconds``. One trace at a time: another one recording raises
        ``Aborted``; bad ``seconds`` raise ``InvalidArgument``."""
        resp = self._t.request("GET", "/v1/trace", query={"seconds": int(seconds)},
                               idempotent=False, timeout=float(seconds) + 60.0)
        data = resp.data
        if path is not None:
            with open(path, "wb") as f:
                f.write(data)
        return _json.loads(data)

    def fleet(self, scope: str = "fleet") -> List[Dict[str, Any]]:
        """Every node of the fleet (``GET /v1/fleet``): this one first, then each
        peer of ``--peers``, with its ``host``, ``url``, ``version``,
        ``reachable`` (an ``error`` with the reason when not), ``last_contact``
        and ``devices`` as its ``/v1/devices`` lists them. ``scope="local"``:
        this node alone."""
        return self._t.json("GET", "/v1/fleet", query={"scope": scope})["nodes"]

    def reset_peak(self) -> Dict[str, Any]:
        """Sets every space's peak to its current use."""
        return self._t.json("POST", "/v1/memory:resetPeak", idempotent=True)

    # ---- arrays --------------------------------------------------------------
    def put(self, name: str, array: Any, *, device: Optional[str] = None,
            memory_kind: Optional[str] = None, sharding: Optional[Sharding] = None,
            overwrite: bool = True, if_match: Optional[str] = None) -> Dict[str, Any]:
        """Uploads an array under ``name`` and answers its description.

        ``array`` is a numpy array or anything with ``__dlpack__`` or
        ``__array__`` (JAX, torch, lists...). Its bytes are streamed from its
        own buffer in pieces (a C-contiguous little-endian array is not
        copied). With a placement (``device``/``memory_kind`` or ``sharding``, a
        saved name or a JSON sharding) the array is committed there.

        Args:
            overwrite: False refuses to replace an existing array
                (:class:`AlreadyExists`).
            if_match: replace only the version of this ETag
                (:class:`EtagMismatch` otherwise).

        Raises:
            OutOfMemory: the target space cannot hold it (nothing was sent).
        """
        a = _as_numpy(array)
        dtype = _dt.from_numpy(a.dtype)
        flat = a.reshape(-1).view(np.uint8).data if a.size else memoryview(b"")
        n = flat.nbytes
        q = {"dtype": dtype, "shape": ",".join(str(d) for d in a.shape)}
        q.update(_placement(device, memory_kind, sharding))
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(n)}
        if not overwrite:
            headers["If-None-Match"] = "*"
        if if_match:
            headers["If-Match"] = if_match

        def pieces() -> Iterator[memoryview]:
            for off in range(0, n, CHUNK):
                yield flat[off:off + CHUNK]

        return self._t.json("PUT", f"/v1/arrays/{quote_name(name)}", query=q, body=pieces,
                            headers=headers)

    def _download(self, path: str, query: Dict[str, Any], like: Optional[str], *,
                  rows: Optional[List[int]] = None) -> Any:
        _check_like(like)
        if rows is None:
            resp = self._t.request("GET", path, query=query, stream=True)
        else:   # POST .../{name}:rows, a read: safe to send again
            resp = self._t.request("POST", path, query=query, json={"rows": rows},
                                   stream=True, idempotent=True)
        try:
            dtype = _dt.to_numpy(resp.headers["X-Tstage-Dtype"])
            shape = tuple(int(d) for d in _json.loads(resp.headers["X-Tstage-Shape"]))
            out = np.empty(shape, dtype=dtype)
            view = out.reshape(-1).view(np.uint8).data if out.size else memoryview(b"")
            got = _read_into(resp, view)
            if got != view.nbytes:
                raise TstageError(f"download of {path} cut off at {got} of {view.nbytes} "
                                  "bytes", status="DATA_LOSS")
        finally:
            resp.release_conn()
        return _convert(out, like)

    def get(self, name: str, index: Optional[Index] = None, *,
            like: Optional[str] = None, zero_copy: bool = False) -> Any:
        """Downloads an array (or the slice ``index`` of it) as numpy.

        ``index`` is numpy basic indexing: an int, a slice, ``...``, a tuple of
        them, or tstaged's expression as a string (``"2:10:2,:,-1"``); only the
        selected bytes are read on the server. The dtype and shape come from the
        answer (bfloat16 as ``ml_dtypes.bfloat16``). ``like="jax"`` or
        ``"torch"`` answers that library's array instead.

        ``zero_copy=True`` (Unix socket, one shard) hands over the server's
        memory instead, the version current now, kept alive on the server until
        the array is garbage-collected or the client closes: a read-only numpy
        array over it for host memory and sim devices; for a GPU's device
        memory a :class:`tstage.lease.CudaArray` (``__cuda_array_interface__``
        and DLPack, opened from a CUDA IPC handle with libcudart through
        ctypes; ``close()`` ends it).
        """
        if zero_copy:
            if index is not None or like is not None:
                raise ValueError("zero_copy maps the whole array: no index or like")
            return self.leases().read(name)
        expr = "" if index is None else _index_expr(index)
        q: Dict[str, Any] = {"index": expr} if expr else {}
        return self._download(f"/v1/arrays/{quote_name(name)}/data", q, like)

    def get_rows(self, name: str, rows: Sequence[int], *, like: Optional[str] = None) -> Any:
        """Rows of axis 0 in the given order (repeats and negatives allowed), in
        one request that reads only those rows: an ``[n, ...]`` array."""
        rs = [int(r) for r in rows]
        if not rs:
            raise ValueError("get_rows needs at least one row")
        listed = ",".join(map(str, rs))
        if len(listed) < _ROWS_IN_URL:
            return self._download(f"/v1/arrays/{quote_name(name)}/data", {"rows": listed}, like)
        # a list too long for a URL (the server's request head limit) goes in a body
        return self._download(f"/v1/arrays/{quote_name(name)}:rows", {}, like, rows=rs)

    def info(self, name: str) -> Dict[str, Any]:
        """An array's description: dtype, shape, sharding, shards, version, etag."""
        return self._t.json("GET", f"/v1/arrays/{quote_name(name)}")

    def exists(self, name: str) -> bool:
        """Whether an array of that name exists."""
        try:
            self.info(name)
            return True
        except NotFound:
            return False

    def sharding(self, name: str, text: bool = False) -> Any:
        """Which device holds which block of an array (``text``: as a table)."""
        q = {"format": "text"} if text else None
        resp = self._t.request("GET", f"/v1/arrays/{quote_name(name)}/sharding", query=q)
        return resp.data.decode() if text else _json.loads(resp.data)

    def delete(self, name: str) -> None:
        """Deletes an array (readers in flight keep the version they hold)."""
        self._t.request("DELETE", f"/v1/arrays/{quote_name(name)}")

    def list(self, *, device: Optional[str] = None, memory_kind: Optional[str] = None,
             page_size: Optional[int] = None) -> Iterator[Dict[str, Any]]:
        """Every array (optionally of one device or memory kind), in name order,
        fetching the pages as the iteration reaches them."""
        token = None
        while True:
            page = self._t.json("GET", "/v1/arrays",
                                query={"device": device, "memory_kind": memory_kind,
                                       "page_size": page_size, "page_token": token})
            yield from page.get("arrays", [])
            token = page.get("next_page_token")
            if not token:
                return

    # ---- moves ---------------------------------------------------------------
    def _submit(self, path: str, body: Dict[str, Any], wait: bool, idempotent: bool,
                timeout: Optional[float] = None) -> Any:
        """POSTs an operation: the Operation, or with ``wait`` its result."""
        resp = self._t.request("POST", path, json=body, query={"wait": True} if wait else None,
                               idempotent=idempotent)
        out = _json.loads(resp.data) if resp.data else {}
        if resp.status == 202:
            op = Operation(self, out)
            return op.result(timeout=timeout) if wait else op
        if not wait and isinstance(out, dict) and "done" in out and "name" in out \
                and str(out.get("name", "")).startswith("operations/"):
            return Operation(self, out)
        return out

    def device_put(self, name: str, *, device: Optional[str] = None,
                   memory_kind: Optional[str] = None, sharding: Optional[Sharding] = None,
                   dtype: Optional[str] = None, host: Optional[str] = None,
                   wait: bool = False) -> Any:
        """Moves an array (same name) to another device, memory kind or sharding
        (``dtype``: converting the elements on the way). ``host``: to that node
        of the fleet (its host as :meth:`fleet` lists it), placed there; the
        array goes from this node once it is there.

        Answers the :class:`Operation`, or with ``wait=True`` the moved array's
        description (to another host: ``{"host", "source_etag", "array"}``).
        """
        body = _placement(device, memory_kind, None)
        if sharding is not None:
            body["sharding"] = sharding
        if dtype is not None:
            body["dtype"] = dtype
        if host is not None:
            body["host"] = host
        return self._submit(f"/v1/arrays/{quote_name(name)}:put", body, wait, idempotent=True)

    def copy(self, name: str, out: str, *, device: Optional[str] = None,
             memory_kind: Optional[str] = None, sharding: Optional[Sharding] = None,
             overwrite: bool = False, donate: bool = False, dtype: Optional[str] = None,
             host: Optional[str] = None, wait: bool = False) -> Any:
        """Copies an array into a new one (``out``) at a placement; ``donate``
        deletes the source when done; ``dtype`` converts the elements on the
        way. ``host``: the copy arrives at that node of the fleet (its host as
        :meth:`fleet` lists it), placed there, over UCX. Answers the
        :class:`Operation`, or with ``wait=True`` the new array's description
        (to another host: ``{"host", "source_etag", "array"}``)."""
        body: Dict[str, Any] = {"out": out}
        body.update(_placement(device, memory_kind, None))
        if sharding is not None:
            body["sharding"] = sharding
        if dtype is not None:
            body["dtype"] = dtype
        if host is not None:
            body["host"] = host
        if overwrite:
            body["overwrite"] = True
        if donate:
            body["donate"] = True
        return self._submit(f"/v1/arrays/{quote_name(name)}:copy", body, wait, idempotent=False)

    def broadcast(self, name: str, out: str, hosts: Sequence[str], *,
                  device: Optional[str] = None, memory_kind: Optional[str] = None,
                  sharding: Optional[Sharding] = None, overwrite: bool = False,
                  dtype: Optional[str] = None, partial_ok: bool = False,
                  wait: bool = False) -> Any:
        """Copies an array to several nodes of the fleet at once (``hosts``: their
        hosts as :meth:`fleet` lists them), as ``out`` at the same placement and
        ``dtype`` on each; the version is read once and every chunk written to
        all of them. One failed destination fails it and nothing is published,
        unless ``partial_ok``: then those that succeeded publish and the
        result's ``failed_hosts`` names the others. Answers the
        :class:`Operation` (its metadata's ``destinations``: each host's
        progress), or with ``wait=True`` the result ``{"source_etag",
        "destinations": [{"host", "state", "array" | "error"}],
        "failed_hosts"}``."""
        body: Dict[str, Any] = {"out": out, "hosts": list(hosts)}
        body.update(_placement(device, memory_kind, None))
        if sharding is not None:
            body["sharding"] = sharding
        if dtype is not None:
            body["dtype"] = dtype
        if overwrite:
            body["overwrite"] = True
        if partial_ok:
            body["partial_ok"] = True
        return self._submit(f"/v1/arrays/{quote_name(name)}:copy", body, wait, idempotent=False)

    def gather(self, name: str, rows: Union[Sequence[int], slice], out: str, *,
               device: Optional[str] = None, memory_kind: Optional[str] = None) -> Dict[str, Any]:
        """Rows of axis 0 (a list, or a slice) into a new array ``out`` at a
        placement, moving only those rows; answers the new array."""
        if isinstance(rows, slice):
            r: Any = {"start": rows.start, "stop": rows.stop, "step": rows.step}
        else:
            r = [int(x) for x in rows]
        o: Dict[str, Any] = {"name": out}
        o.update(_placement(device, memory_kind, None))
        res = self._submit(f"/v1/arrays/{quote_name(name)}:gather", {"rows": r, "out": o},
                           wait=True, idempotent=False)
        return res

    # ---- safetensors ---------------------------------------------------------
    def import_safetensors(self, source: Optional[PathOrFile] = None, *,
                           server_path: Optional[str] = None, prefix: Optional[str] = None,
                           device: Optional[str] = None, memory_kind: Optional[str] = None,
                           sharding: Optional[Sharding] = None, overwrite: bool = True,
                           wait: bool = True) -> Any:
        """Imports every tensor of a safetensors file, all or nothing.

        ``source`` is a local path, a binary file object (read from its
        position) or bytes, streamed as the request body. ``server_path`` instead has tstaged read the file itself
        (below its ``--data-dir``) as an operation: answered as an
        :class:`Operation` unless ``wait``. Answers ``{"arrays": [...],
        "metadata": {...}}``.
        """
        q: Dict[str, Any] = {"prefix": prefix, "overwrite": None if overwrite else False}
        q.update(_placement(device, memory_kind, sharding))
        if server_path is not None:
            if source is not None:
                raise ValueError("give source or server_path, not both")
            resp = self._t.request("POST", "/v1/arrays:import", json={"path": server_path},
                                   query=dict(q, wait=True if wait else None),
                                   idempotent=False)
            out = _json.loads(resp.data)
            if resp.status == 202:
                op = Operation(self, out)
                return op.result() if wait else op
            return out
        if source is None:
            raise ValueError("import_safetensors needs a source or a server_path")
        resp = self._post_file("/v1/arrays:import", q, source, idempotent=overwrite)
        return _json.loads(resp.data)

    def _post_file(self, path: str, query: Dict[str, Any], source: Any,
                   idempotent: bool) -> Any:
        """POSTs a file (a path, a binary file object from its position, or
        bytes) as the body, streamed in pieces with its Content-Length where
        it can be known; sent again only when it can be re-read."""
        if isinstance(source, (bytes, bytearray, memoryview)):
            source = io.BytesIO(bytes(source))
        own = not hasattr(source, "read")
        f: BinaryIO = open(source, "rb") if own else source
        try:
            headers = {"Content-Type": "application/octet-stream"}
            start: Optional[int] = None
            try:
                start = f.tell()
                size = os.fstat(f.fileno()).st_size - start
                headers["Content-Length"] = str(size)
            except (OSError, AttributeError, io.UnsupportedOperation):
                try:
                    f.seek(0, io.SEEK_END)
                    headers["Content-Length"] = str(f.tell() - (start or 0))
                    f.seek(start or 0)
                except (OSError, AttributeError, io.UnsupportedOperation, TypeError):
                    start = None

            def pieces() -> Iterator[bytes]:
                if start is not None:
                    f.seek(start)
                while True:
                    b = f.read(CHUNK)
                    if not b:
                        return
                    yield b

            return self._t.request("POST", path, query=query, body=pieces, headers=headers,
                                   idempotent=idempotent and start is not None)
        finally:
            if own:
                f.close()

    def _get_file(self, path: str, query: Optional[Dict[str, Any]],
                  file: Optional[PathOrFile]) -> Optional[bytes]:
        """GETs a body into file (a path or a binary file object), or as bytes."""
        resp = self._t.request("GET", path, query=query, stream=True)
        try:
            if file is None:
                return resp.read()
            own = not hasattr(file, "write")
            f = open(file, "wb") if own else file  # type: ignore[arg-type]
            try:
                for piece in resp.stream(CHUNK):
                    f.write(piece)  # type: ignore[union-attr]
            finally:
                if own:
                    f.close()  # type: ignore[union-attr]
            return None
        finally:
            resp.release_conn()

    def export(self, names: Union[str, Sequence[str]],
               file: Optional[PathOrFile] = None) -> Optional[bytes]:
        """Arrays as one safetensors stream (their ``__metadata__`` included):
        written to ``file`` (a path or a binary file object), or answered as
        bytes."""
        if isinstance(names, str):
            names = [names]
        return self._get_file("/v1/arrays:export", {"names": ",".join(names)}, file)

    # ---- shardings -----------------------------------------------------------
    def create_sharding(self, name: str, sharding: Dict[str, Any]) -> Dict[str, Any]:
        """Saves a sharding under a name, for ``sharding=name`` later."""
        return self._t.json("POST", "/v1/shardings", json={"name": name, "sharding": sharding})

    def shardings(self) -> List[Dict[str, Any]]:
        """The saved shardings."""
        return self._t.json("GET", "/v1/shardings").get("shardings", [])

    # ---- operations ----------------------------------------------------------
    def operation(self, op_id: str) -> Operation:
        """The operation of that id (``op-...`` or ``operations/op-...``)."""
        op_id = op_id.rsplit("/", 1)[-1]
        return Operation(self, self._t.json("GET", f"/v1/operations/{quote_name(op_id)}"))

    def operations(self, state: Optional[str] = None,
                   page_size: Optional[int] = None) -> List[Operation]:
        """Operations, newest first, optionally only those in ``state``; every
        page, following ``next_page_token`` where the server gives one."""
        out: List[Operation] = []
        token = None
        while True:
            body = self._t.json("GET", "/v1/operations",
                                query={"state": state, "page_size": page_size,
                                       "page_token": token})
            out.extend(Operation(self, o) for o in body.get("operations", []))
            token = body.get("next_page_token")
            if not token:
                return out

    # ---- models --------------------------------------------------------------
    def create_model(self, name: str, spec: Optional[Dict[str, Any]] = None, *,
                     wait: bool = True, **fields: Any) -> Any:
        """Creates a model (the guide's MLP: ``mlp``, ``loss``, ``optimizer``,
        ``init``, ``placement``; a GPT: ``gpt={"vocab", "context", "layers",
        "d_model", "heads", "d_ff"}`` instead of ``mlp``), given as ``spec`` or
        as keywords. Answers the
        model's description, or with ``wait=False`` the creating
        :class:`Operation`.

        Raises:
            OutOfMemory: its arrays do not fit (nothing is created).
            AlreadyExists: the name, or one of its arrays' names, is taken.
        """
        body = dict(spec or {})
        body.update(fields)
        body["name"] = name
        return self._submit("/v1/models", body, wait, idempotent=False)

    def model(self, name: str) -> Dict[str, Any]:
        """A model's description (``steps``, ``state``, its arrays...)."""
        return self._t.json("GET", f"/v1/models/{quote_name(name)}")

    def models(self, host: Optional[str] = None) -> List[Dict[str, Any]]:
        """Every model, in name order; ``host``: another node of the fleet's
        (see :meth:`memory`)."""
        return self._t.json("GET", "/v1/models", query={"host": host}).get("models", [])

    def delete_model(self, name: str) -> None:
        """Deletes a model and its parameter and state arrays."""
        self._t.request("DELETE", f"/v1/models/{quote_name(name)}")

    def analyze(self, model: Union[str, Dict[str, Any]], batch: Sequence[int], *,
                placement: Optional[Dict[str, Any]] = None,
                timeline: bool = False, dtype: Optional[str] = None,
                mode: Optional[str] = None,
                outputs: Optional[Dict[str, Any]] = None,
                accumulate: Optional[int] = None) -> Dict[str, Any]:
        """The memory analysis of one step for a batch shape (XLA's
        ``memory_analysis`` names, ``peak_device_bytes``, the ``timeline``),
        before anything runs: of an existing model (its name), or of a spec
        that does not exist yet (a dict), which allocates nothing.

        Args:
            batch: ``[B, d_model]``, or a token model's ``[B, T]`` ids.
            dtype: a token model's ids, ``"uint16"`` or ``"int32"`` (the default).
            mode: ``"step"`` (the default) or ``"evaluate"`` (the forward pass of
                :meth:`evaluate`); an existing model's only.
            outputs: with mode ``"evaluate"``, where the outputs would go
                (``{"memory_kind": "pinned_host"}``).
            accumulate: a step of that many micro-batches (``batch`` split in
                them), as :meth:`step` takes it.
        """
        body: Dict[str, Any] = {"batch": [int(b) for b in batch]}
        if placement is not None:
            body["placement"] = placement
        if dtype is not None:
            body["dtype"] = dtype
        if mode is not None:
            body["mode"] = mode
        if outputs is not None:
            body["outputs"] = outputs
        if accumulate is not None:
            body["accumulate"] = int(accumulate)
        q = {"timeline": True} if timeline else None
        if isinstance(model, str):
            return self._t.json("POST", f"/v1/models/{quote_name(model)}:analyze", json=body,
                                query=q, idempotent=True)
        body["model"] = model
        return self._t.json("POST", "/v1/models:analyze", json=body, query=q, idempotent=True)

    def export_model(self, name: str, file: Optional[PathOrFile] = None) -> Optional[bytes]:
        """A checkpoint: the model's arrays by role, its spec and step count, as
        a safetensors file written to ``file`` (a path or a binary file
        object), or answered as bytes.

        Raises:
            Aborted: a step is running on the model.
        """
        return self._get_file(f"/v1/models/{quote_name(name)}:export", None, file)

    def import_model(self, source: Union[PathOrFile, bytes], *, name: Optional[str] = None,
                     device: Optional[str] = None) -> Dict[str, Any]:
        """Creates a model from a checkpoint of :meth:`export_model` (a path, a
        binary file object or bytes), with exactly its bytes and step count;
        ``name`` and ``device`` override the checkpoint's. Answers the model."""
        resp = self._post_file("/v1/models:import", {"name": name, "device": device}, source,
                               idempotent=False)
        return _json.loads(resp.data)

    def step(self, model: str, inputs: Union[None, str, Dict[str, Any]] = None,
             targets: Union[None, str, Dict[str, Any]] = None, *, steps: int = 1,
             windows: Optional[Dict[str, Any]] = None,
             accumulate: Optional[int] = None,
             placement: Optional[Dict[str, Any]] = None, wait: bool = False,
             timeout: Optional[float] = None, **fields: Any) -> Any:
        """Runs ``steps`` training steps on ``inputs`` (and ``targets`` for
        ``mse`` and token models), each an array name or :func:`rows` of a
        dataset array; or, for a token model, on ``windows`` of one token
        stream (:func:`windows`), which reads both from the one array.

        ``accumulate=k`` makes each optimizer step take the mean gradient of
        k micro-batches (optax.MultiSteps, nanoGPT's gradient accumulation):
        the inputs' rows split in k, or k batches (windows) drawn a step; the
        report's ``losses`` are each step's mean micro-batch loss, and
        ``grad_norms`` the mean gradient's global norm.

        Answers the :class:`Operation` (progress in steps; its
        :attr:`Operation.partial_result` carries the losses so far while it
        runs), or with ``wait=True`` the step report (``losses``,
        ``learning_rates`` and ``grad_norms`` with an optimizer, predicted and measured
        peaks, times, and with windows where they stopped: ``windows.next``).

        Raises:
            Cancelled: (with ``wait=True``) the run was cancelled; the exception's
                ``losses`` and ``partial_result`` say what its steps did.
        """
        body = _run_body(inputs=inputs, targets=targets, windows=windows,
                         placement=placement, steps=int(steps),
                         accumulate=None if accumulate is None else int(accumulate))
        body.update(fields)
        return self._submit(f"/v1/models/{quote_name(model)}:step", body, wait,
                            idempotent=False, timeout=timeout)

    def evaluate(self, model: str, inputs: Union[None, str, Dict[str, Any]] = None,
                 targets: Union[None, str, Dict[str, Any]] = None, *,
                 windows: Optional[Dict[str, Any]] = None,
                 outputs: Optional[Dict[str, Any]] = None,
                 positions: Optional[str] = None,
                 placement: Optional[Dict[str, Any]] = None, wait: bool = False,
                 timeout: Optional[float] = None) -> Any:
        """The loss of the model over a batch, without touching the model: the
        inputs and targets as :meth:`step` takes them (or ``windows``), and on
        request the outputs (a token model's logits) written to a new array,
        ``outputs={"name": "y", "memory_kind": "pinned_host"}``.

        A token model or GPT evaluated without ``targets`` computes the logits
        only (no ``loss``; ``outputs`` required). A GPT takes windows [B, T] of
        1..context tokens; ``positions="last"`` writes each window's last
        position's logits [B, vocab] (``"all"``, the default: [B, T, vocab]).

        Answers the :class:`Operation`, or with ``wait=True`` its result
        (``loss`` when there are targets, the analysis, peaks, times,
        ``outputs``).
        """
        body = _run_body(inputs=inputs, targets=targets, windows=windows,
                         outputs=outputs, positions=positions, placement=placement)
        return self._submit(f"/v1/models/{quote_name(model)}:evaluate", body, wait,
                            idempotent=False, timeout=timeout)

    def generate(self, model: str, prompt: Sequence[int], max_tokens: int, *,
                 temperature: float = 0.0, top_k: int = 0, seed: int = 0,
                 placement: Optional[Dict[str, Any]] = None, wait: bool = True,
                 timeout: Optional[float] = None) -> Any:
        """A GPT's ``max_tokens`` next tokens after ``prompt`` (token ids):
        greedy at ``temperature`` 0 (the largest logit, the lowest id among
        equal ones), else sampled from softmax(logits / temperature) over the
        ``top_k`` largest (0: all) with a generator seeded by ``seed``
        (docs/API.md defines it: the same seed, the same tokens).

        Answers the generated ids (without the prompt) as a list, or with
        ``wait=False`` the :class:`Operation` (progress in tokens; its result's
        ``tokens``).

        Raises:
            InvalidArgument: a prompt id outside the vocabulary (the message
                names it), ``max_tokens`` outside 1..4096, a bad
                ``temperature`` or ``top_k``, a model that is no GPT.
        """
        body = _run_body(prompt=[int(t) for t in prompt], max_tokens=int(max_tokens),
                         temperature=float(temperature), top_k=int(top_k), seed=int(seed),
                         placement=placement)
        out = self._submit(f"/v1/models/{quote_name(model)}:generate", body, wait,
                           idempotent=False, timeout=timeout)
        return out["tokens"] if wait else out


def _seconds_param(v: Any) -> Optional[str]:
    """A duration for a query: seconds as text, a timedelta's seconds, or text as is."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, _datetime.timedelta):
        v = v.total_seconds()
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"a duration is seconds, a timedelta or text, not {type(v).__name__}")
    return f"{v:.6f}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)


def _since_param(v: Any) -> Optional[str]:
    """?since=: an aware datetime as RFC 3339 (UTC), else a duration."""
    if isinstance(v, _datetime.datetime):
        if v.tzinfo is None:
            raise ValueError("since needs an aware datetime (one with a tzinfo)")
        return v.astimezone(_datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    return _seconds_param(v)
