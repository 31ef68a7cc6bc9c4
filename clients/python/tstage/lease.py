"""Same-node arrays without a copy: the lease service of ``tstaged --unix-socket``.

tstaged builds its host memory (``pinned_host``, ``unpinned_host``) from memfd
files. Over ``<unix socket>.lease`` it hands a client on the same node a
descriptor of the memory holding an array's version (``SCM_RIGHTS``) with the
offset and length of its bytes; the client maps it read-only. The version stays
alive on the server until the lease is released (the numpy array over the
mapping is garbage-collected, or the client closes), whatever happens to the
name meanwhile: replaced, deleted or moved, the bytes mapped stay as they were.

A writable lease is a new array that the client fills in place and then
publishes: nothing is visible before, and an unpublished one is freed when its
connection closes.

Device arrays follow the same rules. A sim device's memory is a memfd too: its
arrays map as host arrays do (numpy). A GPU's array comes as a CUDA IPC handle
of the device pool's allocation and the array's offset in it: :class:`CudaArray`
opens it (cuda-python, else CuPy, imported only then) and offers
``__cuda_array_interface__`` (CuPy, Numba, PyTorch take it; ``torch.as_tensor``
or ``cupy.asarray`` of it copies nothing).

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
# writable mappings are populated at once (a write fault maps one page), after
# the huge-page advice below, by read faults (MADV_POPULATE_READ, Linux 5.14:
# 16 pages a fault, mapped writable in a shared writable mapping); read ones
# fault on first touch, where the kernel maps 16 pages of the file a fault
# (fault-around), cheaper than populating them one by one
_MADV_POPULATE_READ = 22
# tstaged places its shareable host memory on 2 MiB boundaries and advises it
# for transparent huge pages; where the node lets shared memory have them
# (transparent_hugepage/shmem_enabled "advise"), a mapping advised too is
# handed whole 2 MiB pages (the kernel picks an address with the file offset's
# remainder): a first read of 1 GiB then builds 512 page-table entries, not
# 262144. Elsewhere the advice does nothing.
_HUGE = 2 << 20
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
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
    def _open(self, reply: Dict[str, Any], fds: List[int], writable: bool) -> Any:
        """The leased array: numpy over a mapping for "fd" shards, a
        :class:`CudaArray` for a "cuda_ipc" one."""
        shards = reply["shards"]
        if shards and any(sh.get("transport") == "cuda_ipc" for sh in shards):
            for fd in fds:
                os.close(fd)
            if len(shards) != 1:
                self.release_later(int(reply["lease"]))
                raise ValueError(f"array '{reply['name']}' has {len(shards)} shards: a "
                                 "zero-copy array holds one; use get() without zero_copy")
            return CudaArray(self, reply, writable)
        return self._map(reply, fds, writable)

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
            m = _Mapping(fds[0], delta + length, flags=mmap.MAP_SHARED, prot=prot,
                         offset=base, **_NO_TRACK)
            advice = [_MADV_HUGEPAGE] if _MADV_HUGEPAGE is not None and \
                delta + length >= _HUGE else []
            for adv in advice + ([_MADV_POPULATE_READ] if writable else []):
                try:
                    m.madvise(adv)
                except OSError:
                    pass   # no transparent huge pages, or a kernel before 5.14
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
        return self._open(reply, fds, writable=False)

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
        return WriteLease(self, lease, name, self._open(reply, fds, writable=True))


# ---- device arrays on a GPU: CUDA IPC ----------------------------------------

class _IpcOpener:
    """Opens and closes CUDA IPC handles with one library."""

    name = ""

    def open(self, handle: bytes, pci_bus_id: str, ordinal: int) -> int:
        """The base of the allocation handle names, opened on the GPU of that
        PCI bus id (the server's ordinal only where no bus id is known)."""
        raise NotImplementedError

    def close(self, ptr: int) -> None:
        raise NotImplementedError


class _CudaPythonOpener(_IpcOpener):
    """cuda-python's runtime bindings (``cuda.bindings.runtime``, or the older
    ``cuda.cudart``)."""

    name = "cuda-python"

    def __init__(self, rt: Any) -> None:
        self.rt = rt

    def _check(self, err: Any, call: str) -> None:
        if err != self.rt.cudaError_t.cudaSuccess:
            _, text = self.rt.cudaGetErrorString(err)
            raise TransportError(f"{call}: {text.decode() if isinstance(text, bytes) else text}")

    def _on(self, pci_bus_id: str, ordinal: int) -> Tuple[int, int]:
        dev = ordinal
        if pci_bus_id:
            err, dev = self.rt.cudaDeviceGetByPCIBusId(pci_bus_id.encode())
            self._check(err, f"cudaDeviceGetByPCIBusId('{pci_bus_id}')")
        err, prev = self.rt.cudaGetDevice()
        self._check(err, "cudaGetDevice")
        return int(dev), int(prev)

    def open(self, handle: bytes, pci_bus_id: str, ordinal: int) -> int:
        dev, prev = self._on(pci_bus_id, ordinal)
        h = self.rt.cudaIpcMemHandle_t()
        h.reserved = handle
        (err,) = self.rt.cudaSetDevice(dev)
        self._check(err, "cudaSetDevice")
        try:
            err, ptr = self.rt.cudaIpcOpenMemHandle(h, self.rt.cudaIpcMemLazyEnablePeerAccess)
            self._check(err, "cudaIpcOpenMemHandle")
        finally:
            self.rt.cudaSetDevice(prev)
        return int(ptr)

    def close(self, ptr: int) -> None:
        (err,) = self.rt.cudaIpcCloseMemHandle(ptr)
        self._check(err, "cudaIpcCloseMemHandle")


class _CupyOpener(_IpcOpener):
    """CuPy's runtime (``cupy.cuda.runtime``)."""

    name = "CuPy"

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy

    def open(self, handle: bytes, pci_bus_id: str, ordinal: int) -> int:
        rt = self.cupy.cuda.runtime
        by_bus = getattr(rt, "deviceGetByPCIBusId", None)
        dev = by_bus(pci_bus_id) if pci_bus_id and by_bus else ordinal
        with self.cupy.cuda.Device(dev):
            return int(rt.ipcOpenMemHandle(handle, rt.cudaIpcMemLazyEnablePeerAccess))

    def close(self, ptr: int) -> None:
        self.cupy.cuda.runtime.ipcCloseMemHandle(ptr)


def _ipc_opener() -> _IpcOpener:
    """cuda-python's runtime, else CuPy's, imported now (not with tstage);
    ImportError naming both when neither is installed."""
    import importlib

    for mod in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            return _CudaPythonOpener(importlib.import_module(mod))
        except ImportError:
            pass
    try:
        return _CupyOpener(importlib.import_module("cupy"))
    except ImportError:
        pass
    raise ImportError("opening a CUDA IPC handle needs cuda-python (pip install cuda-python) "
                      "or CuPy (pip install cupy-cuda12x); neither is installed")


def _close_ipc(opener: Optional[_IpcOpener], ptr: int, conn: "LeaseConnection",
               lease: int, state: Dict[str, bool]) -> None:
    """Closes the handle, then ends the lease unless a publish ended it (the
    server may reuse the bytes only once no mapping is left)."""
    try:
        if opener is not None and ptr:
            opener.close(ptr)
    finally:
        if state["release"]:
            conn.release_later(lease)


class CudaArray:
    """A device array on a GPU of this node, opened from the CUDA IPC handle of
    a lease: the server's memory itself, no copy.

    ``__cuda_array_interface__`` (version 3) describes it: CuPy, Numba and
    PyTorch take it without a copy (``cupy.asarray(x)``, ``torch.as_tensor(x,
    device="cuda")``), and JAX through them by DLPack. A read lease is marked
    read-only there (CUDA IPC itself maps read-write: do not write it). The
    version stays alive on the server until ``close()`` (or ``with``, or
    garbage collection) closes the handle and ends the lease; the array must
    not be used after. The handle is opened on the GPU the server names by
    PCI bus id (ordinals differ under ``CUDA_VISIBLE_DEVICES``).
    """

    def __init__(self, conn: LeaseConnection, reply: Dict[str, Any], writable: bool,
                 opener: Optional[_IpcOpener] = None) -> None:
        sh = reply["shards"][0]
        ipc = sh["cuda_ipc"]
        self.name: str = reply["name"]
        self.lease = int(reply["lease"])
        self.dtype = _dt.to_numpy(reply["dtype"])
        self.shape = tuple(int(d) for d in reply["shape"])
        self.device: str = sh["device"]
        self.pci_bus_id: str = ipc["pci_bus_id"]
        self.writable = writable
        self.nbytes = int(sh["length"])
        ptr = 0
        try:
            if self.nbytes:
                opener = opener or _ipc_opener()
                ptr = opener.open(bytes.fromhex(ipc["handle"]), self.pci_bus_id,
                                  int(ipc["ordinal"]))
        except BaseException as e:
            conn.release_later(self.lease)
            if isinstance(e, ImportError):
                raise ImportError(f"array '{self.name}' is on {self.device}: {e}") from e
            raise
        self._base = ptr
        self.ptr = ptr + int(sh["offset"]) if ptr else 0
        self._state = {"release": True}
        self._finalizer = weakref.finalize(self, _close_ipc, opener, ptr, conn, self.lease,
                                           self._state)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        if self.closed:
            raise ValueError(f"the lease of '{self.name}' has ended: the array is closed")
        return {"shape": self.shape, "typestr": self.dtype.str, "descr": self.dtype.descr,
                "data": (self.ptr, not self.writable), "strides": None, "version": 3}

    def close(self) -> None:
        """Closes the IPC handle and ends the lease (once; later calls do nothing)."""
        self._finalizer()

    def _close_published(self) -> None:
        """Closes the handle of a writable lease that publish ended."""
        self._state["release"] = False
        self._finalizer()

    def __enter__(self) -> "CudaArray":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self.ptr:x}"
        return (f"CudaArray('{self.name}', {self.dtype}, {self.shape}, {self.device}, "
                f"{state})")


class WriteLease:
    """A new array in the server's memory, unpublished.

    Fill ``array`` in place (numpy over host or sim device memory; a
    :class:`CudaArray` on a GPU: write it with your own kernels or copies and
    synchronise before publishing), then ``publish()``; until then the name
    shows nothing new. ``release()`` (or leaving a ``with`` block unpublished, or the
    connection closing) frees it. After ``publish()`` the array is made
    read-only: the published version is immutable and must not be written.
    """

    def __init__(self, conn: LeaseConnection, lease: int, name: str,
                 array: Any) -> None:
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
        self._seal(published=True)
        return reply

    def _seal(self, published: bool) -> None:
        if isinstance(self.array, CudaArray):
            if published:
                self.array._close_published()     # publish ended the lease
            else:
                self.array.close()
        else:
            self.array.flags.writeable = False

    def release(self) -> None:
        """Frees the unpublished array (nothing becomes visible)."""
        if not self._done:
            self._done = True
            if isinstance(self.array, CudaArray):
                self.array.close()                # closes the handle, then releases
            else:
                self._seal(published=False)
                self._conn.release_later(self.lease)
            self._conn.sync()

    def __enter__(self) -> "WriteLease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
