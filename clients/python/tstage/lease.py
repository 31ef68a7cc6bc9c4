"""Same-node arrays without a copy: the lease service of ``tstaged --unix-socket``.

tstaged builds its host memory (``pinned_host``, ``unpinned_host``) from memfd
files. Over ``<unix socket>.lease`` it hands a client on the same node a
descriptor of the memory holding an array's version (``SCM_RIGHTS``) with the
offset and length of its bytes; the client maps it read-only. The version stays
alive on the server until the lease is released (the numpy array over the
mapping is garbage-collected, or the client closes), whatever happens to the
name meanwhile: replaced, deleted or moved, the bytes mapped stay as they were.

A writable lease is a new array in host memory that the client fills in place
and then publishes: nothing is visible before, and an unpublished one is freed
when its connection closes.

Frames are a 4-byte big-endian length and a JSON object; see tstaged's
``server/lease.c``.
"""
from __future__ import annotations

import collections
import json
import mmap
import os
import socket
import struct
import sys
import threading
import weakref
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import dtypes as _dt
from .errors import TransportError, error_from_status

_HDR = struct.Struct(">I")
_MAX_FDS = 64
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
# Python >= 3.13 can map without keeping a duplicate of the descriptor: a
# leased array then costs the client no descriptor while it lives
_NO_TRACK: Dict[str, Any] = {"trackfd": False} if sys.version_info >= (3, 13) else {}


class _Mapping(mmap.mmap):
    """A mapping that a finalizer can watch (mmap objects take no weakrefs)."""


class LeaseConnection:
    """One connection to the lease service; its leases end when it closes.

    Thread-safe: requests take turns. Leases released by the garbage collector
    are sent at once when the connection is free, else with the next request;
    releases have no answer, and ``sync()`` is the round trip after which they
    are done.
    """

    def __init__(self, unix_socket: str, timeout: Optional[float] = 300.0) -> None:
        self.path = unix_socket + ".lease"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(self.path)
        except OSError as e:
            self._sock.close()
            raise TransportError(f"cannot connect to the lease service {self.path}: {e}") from e
        self._lock = threading.Lock()
        self._pending: Deque[int] = collections.deque()
        self._closed = False

    # ---- frames --------------------------------------------------------------
    def _send_locked(self, msg: Dict[str, Any]) -> None:
        body = json.dumps(msg, separators=(",", ":")).encode()
        self._sock.sendall(_HDR.pack(len(body)) + body)

    def _recv_exact_locked(self, n: int, fds: List[int]) -> bytes:
        buf = bytearray()
        space = socket.CMSG_SPACE(_MAX_FDS * 4)
        while len(buf) < n:
            data, anc, _flags, _addr = self._sock.recvmsg(n - len(buf), space,
                                                          socket.MSG_CMSG_CLOEXEC)
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    cnt = len(cdata) // 4
                    fds.extend(struct.unpack(f"{cnt}i", cdata[:cnt * 4]))
            if not data:
                for fd in fds:
                    os.close(fd)
                raise TransportError(f"the lease service {self.path} closed the connection")
            buf += data
        return bytes(buf)

    def _recv_locked(self) -> Tuple[Dict[str, Any], List[int]]:
        fds: List[int] = []
        (n,) = _HDR.unpack(self._recv_exact_locked(4, fds))
        body = self._recv_exact_locked(n, fds)
        return json.loads(body), fds

    def _flush_locked(self) -> None:
        while self._pending:
            self._send_locked({"op": "release", "lease": self._pending.popleft()})

    def request(self, msg: Dict[str, Any]) -> Tuple[Dict[str, Any], List[int]]:
        """Sends msg and answers (reply, descriptors); raises the error answered."""
        with self._lock:
            if self._closed:
                raise TransportError("the lease connection is closed")
            self._flush_locked()
            self._send_locked(msg)
            reply, fds = self._recv_locked()
            self._flush_locked()
        if "error" in reply:
            for fd in fds:
                os.close(fd)
            raise error_from_status(reply["error"])
        return reply, fds

    def release_later(self, lease: int) -> None:
        """Ends a lease (the service answers releases nothing; ``sync()`` waits
        for them). Safe from a finalizer: sent now when the connection is free,
        else with the next request."""
        if self._closed:
            return
        if self._lock.acquire(blocking=False):
            try:
                self._pending.append(lease)
                if not self._closed:
                    self._flush_locked()
            except OSError:
                pass
            finally:
                self._lock.release()
        else:
            self._pending.append(lease)

    def sync(self) -> None:
        """A round trip: every release sent before it has been served."""
        self.request({"op": "ping"})

    def close(self) -> None:
        """Closes the connection: the server ends every lease it holds."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._sock.close()

    # ---- arrays --------------------------------------------------------------
    def _map(self, reply: Dict[str, Any], fds: List[int], writable: bool) -> np.ndarray:
        dtype = _dt.to_numpy(reply["dtype"])
        shape = tuple(int(d) for d in reply["shape"])
        shards = reply["shards"]
        lease = int(reply["lease"])
        try:
            if len(shards) != 1 or len(fds) != 1:
                raise ValueError(f"array '{reply['name']}' has {len(shards)} shards: a "
                                 "mapping holds one; use get() without zero_copy")
            sh = shards[0]
            length = int(sh["length"])
            if length == 0:
                out = np.empty(shape, dtype)
                self.release_later(lease)
                out.flags.writeable = writable
                return out
            page = mmap.ALLOCATIONGRANULARITY
            base = int(sh["offset"]) // page * page
            delta = int(sh["offset"]) - base
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            m = _Mapping(fds[0], delta + length, flags=mmap.MAP_SHARED | _POPULATE,
                         prot=prot, offset=base, **_NO_TRACK)
        except BaseException:
            self.release_later(lease)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        weakref.finalize(m, self.release_later, lease)
        count = length // dtype.itemsize if dtype.itemsize else 0
        return np.frombuffer(m, dtype=dtype, count=count, offset=delta).reshape(shape)

    def read(self, name: str) -> np.ndarray:
        """The current version of name as a read-only numpy array over the
        server's memory; its lease ends when the array (and every view of it)
        is garbage-collected."""
        reply, fds = self.request({"op": "lease", "name": name})
        return self._map(reply, fds, writable=False)

    def create(self, name: str, dtype: Any, shape: Sequence[int], *,
               memory_kind: Optional[str] = None,
               device: Optional[str] = None) -> "WriteLease":
        msg: Dict[str, Any] = {"op": "create", "name": name,
                               "dtype": _dt.from_numpy(np.dtype(dtype)),
                               "shape": [int(d) for d in shape]}
        if memory_kind is not None:
            msg["memory_kind"] = memory_kind
        if device is not None:
            msg["device"] = device
        reply, fds = self.request(msg)
        lease = int(reply["lease"])
        return WriteLease(self, lease, name, self._map(reply, fds, writable=True))


class WriteLease:
    """A new array in the server's host memory, unpublished.

    Fill ``array`` in place, then ``publish()``; until then the name shows
    nothing new. ``release()`` (or leaving a ``with`` block unpublished, or the
    connection closing) frees it. After ``publish()`` the array is made
    read-only: the published version is immutable and must not be written.
    """

    def __init__(self, conn: LeaseConnection, lease: int, name: str,
                 array: np.ndarray) -> None:
        self._conn = conn
        self.lease = lease
        self.name = name
        self.array = array
        self._done = False

    def publish(self, *, if_none_match: Optional[str] = None) -> Dict[str, Any]:
        """Makes the array the name's current version: ``{"name", "version",
        "etag", "replaced"}``. ``if_none_match="*"`` refuses an existing name
        (AlreadyExists; the lease stays, publish again or release)."""
        msg: Dict[str, Any] = {"op": "publish", "lease": self.lease}
        if if_none_match is not None:
            msg["if_none_match"] = if_none_match
        reply, _ = self._conn.request(msg)
        self._done = True
        self.array.flags.writeable = False
        return reply

    def release(self) -> None:
        """Frees the unpublished array (nothing becomes visible)."""
        if not self._done:
            self._done = True
            self.array.flags.writeable = False
            self._conn.release_later(self.lease)
            self._conn.sync()

    def __enter__(self) -> "WriteLease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
