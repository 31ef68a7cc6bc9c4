"""Same-node arrays without a copy: the lease service of ``tstaged --unix-socket``.

tstaged builds its host memory (``pinned_host``, ``unpinned_host``) from memfd
files. Over ``<unix socket>.lease`` it hands a client on the same node a
descriptor of the memory holding an array's version (``SCM_RIGHTS``) with the
offset and length of its bytes; the client maps it read-only. The version stays
alive on the server until the lease is released (the numpy array over the
mapping is garbage-collected, or the client closes), whatever happens to the
name meanwhile: replaced, deleted or moved, the bytes mapped stay as they were.

Whatever a client does with a descriptor, no version changes: the memory files
are sealed against every writer but the server (a descriptor reopened
read-write through ``/proc/self/fd`` can neither be written nor mapped
writable), and a mapping kept after its lease ended shows that version's bytes
only, never another array's (the server hands out memory that holds one
version and never reuses it: see docs/API.md).

A writable lease is a new array that the client fills in scratch memory of its
own and then publishes: the server copies it into the array, so nothing the
writer does after ``publish()`` reaches the published version; nothing is
visible before, and an unpublished one is freed when its connection closes.
Requests may be pipelined: the server answers each, in order.

Device arrays follow the same rules. A sim device's memory is a memfd too: its
arrays map as host arrays do (numpy). A GPU's array comes as a CUDA IPC handle
of device memory of the lease's own (a copy of the version, made on the
server), the GPU's PCI bus id and the array's offset in the allocation (0):
:class:`CudaArray` opens it with libcudart through ctypes
(``libcudart.so.13``, else ``.12``, else ``libcudart.so``, found as the dynamic
loader finds libraries, ``LD_LIBRARY_PATH`` first, and loaded only then; no
framework needed: see ``_cudart``) on the GPU of that bus id, and offers it
as ``__cuda_array_interface__`` (version 3) and DLPack (``__dlpack__``,
``__dlpack_device__``): ``cupy.asarray(x)``, ``torch.as_tensor(x,
device="cuda")``, ``torch.from_dlpack(x)``, ``cupy.from_dlpack(x)`` and
``jax.dlpack.from_dlpack(x)`` copy nothing. ``CudaArray.to_numpy()`` copies it
to the host without a framework.

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

from . import _cudart, _dlpack
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

def _cuda_runtime() -> Any:
    """The CUDA runtime (libcudart through ctypes, loaded now, not with tstage):
    ``device_by_pci_bus_id``, ``ipc_open``, ``ipc_close`` and ``memcpy`` of
    :class:`tstage._cudart.Runtime`. OSError when no libcudart loads."""
    return _cudart.load()


class _IpcMapping:
    """An opened CUDA IPC handle and the lease behind it, held by its
    :class:`CudaArray` and by each DLPack tensor exported from it: the last
    holder to let go closes the handle, then releases the lease (a published
    one too: the server frees the lease's device memory only then, once no
    mapping of it is left).

    Thread-safety: holds and drops take a lock (a DLPack consumer may delete
    its tensor on any thread).
    """

    def __init__(self, rt: Any, base: int, dev: int, conn: "LeaseConnection",
                 lease: int) -> None:
        self.rt = rt
        self.base = base
        self.dev = dev
        self.conn = conn
        self.lease = lease
        self.refs = 1                   # guarded by: lock
        self.lock = threading.Lock()

    def hold(self) -> None:
        with self.lock:
            if self.refs == 0:
                raise ValueError("the mapping is closed")
            self.refs += 1

    def drop(self) -> None:
        with self.lock:
            self.refs -= 1
            last = self.refs == 0
        if not last:
            return
        try:
            if self.base:
                self.rt.ipc_close(self.base, self.dev)
        finally:
            self.conn.release_later(self.lease)


class CudaArray:
    """A device array on a GPU of this node, opened from the CUDA IPC handle of
    a lease: device memory of the lease's own on the server (a read lease's
    is a device-to-device copy of the version, made when it is leased), no
    copy to the host.

    The handle is opened with libcudart through ctypes (``libcudart.so.13``,
    else ``.12``, else ``libcudart.so``, as the dynamic loader finds them): no
    framework is needed. It is opened on the GPU the server names by PCI bus
    id (ordinals differ under ``CUDA_VISIBLE_DEVICES``); ``device_id`` is that
    GPU's ordinal in this process.

    Consumers take it without a copy through ``__cuda_array_interface__``
    (version 3: CuPy, Numba, PyTorch) or DLPack (``__dlpack__`` and
    ``__dlpack_device__``: ``torch.from_dlpack(x)``, ``cupy.from_dlpack(x)``,
    ``jax.dlpack.from_dlpack(x)``). A read lease is marked read-only in the
    interface (CUDA IPC itself maps read-write, and DLPack's tensor has no
    such mark: writing it changes this lease's copy only, never the version). ``to_numpy()`` copies it to the host and
    ``copy_from()`` fills a writable one from the host (cudaMemcpy).

    The version stays alive on the server until ``close()`` (or ``with``, or
    garbage collection) closes the handle and ends the lease, and every
    DLPack tensor taken from it has been deleted by its consumer: a tensor
    keeps the memory valid after the array is closed. The array's own
    interface must not be used after ``close()``.
    """

    def __init__(self, conn: LeaseConnection, reply: Dict[str, Any], writable: bool,
                 runtime: Any = None) -> None:
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
        self.device_id = int(ipc["ordinal"])
        base = 0
        try:
            if self.nbytes:
                runtime = runtime or _cuda_runtime()
                if self.pci_bus_id:
                    self.device_id = runtime.device_by_pci_bus_id(self.pci_bus_id)
                base = runtime.ipc_open(bytes.fromhex(ipc["handle"]), self.device_id)
        except BaseException as e:
            conn.release_later(self.lease)
            if isinstance(e, OSError) and not isinstance(e, TransportError):
                raise OSError(f"array '{self.name}' is on {self.device}: {e}") from e
            raise
        self._rt = runtime
        self.ptr = base + int(sh["offset"]) if base else 0
        self._mapping = _IpcMapping(runtime, base, self.device_id, conn, self.lease)
        self._finalizer = weakref.finalize(self, self._mapping.drop)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"the lease of '{self.name}' has ended: the array is closed")

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """Version 3. No stream: the bytes are complete when the lease is
        handed out (a read lease's version is published; a writable one is
        the client's to fill)."""
        self._check_open()
        return {"shape": self.shape, "typestr": self.dtype.str, "descr": self.dtype.descr,
                "data": (self.ptr, not self.writable), "strides": None, "version": 3,
                "stream": None}

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (_dlpack.KDL_CUDA, self.device_id)

    def __dlpack__(self, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: Optional[bool] = None) -> Any:
        """A "dltensor" capsule over the array's memory (no copy). The tensor
        holds the handle and the lease until its consumer deletes it. stream is
        accepted and needs no wait (the bytes are complete, as for the
        interface); the unversioned tensor is answered whatever max_version
        is. BufferError for copy=True or another dl_device."""
        self._check_open()
        if copy:
            raise BufferError(f"array '{self.name}' is shared without a copy: copy=True "
                              "is not offered (copy the consumer's tensor)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"array '{self.name}' is on {self.__dlpack_device__()} "
                              f"(DLPack device), not {tuple(dl_device)}")
        self._mapping.hold()
        try:
            return _dlpack.export(self.ptr, _dlpack.KDL_CUDA, self.device_id, self.shape,
                                  self.dtype, self._mapping.drop)
        except BaseException:
            self._mapping.drop()
            raise

    def to_numpy(self) -> np.ndarray:
        """A copy of the array in host memory (cudaMemcpy, synchronous)."""
        self._check_open()
        out = np.empty(self.shape, self.dtype)
        if self.nbytes:
            self._rt.memcpy(out.ctypes.data, self.ptr, self.nbytes,
                            _cudart.MEMCPY_DEVICE_TO_HOST, self.device_id)
        return out

    def copy_from(self, src: Any) -> None:
        """Fills a writable array from host memory (cudaMemcpy, synchronous:
        done on return, ready to publish). src must have the array's shape and
        dtype (any numpy array-like, made C-contiguous here)."""
        self._check_open()
        if not self.writable:
            raise ValueError(f"the lease of '{self.name}' is read-only")
        a = np.ascontiguousarray(src)
        if a.dtype != self.dtype or a.shape != self.shape:
            raise ValueError(f"array '{self.name}' is {self.dtype}{list(self.shape)}; "
                             f"got {a.dtype}{list(a.shape)}")
        if self.nbytes:
            self._rt.memcpy(self.ptr, a.ctypes.data, self.nbytes,
                            _cudart.MEMCPY_HOST_TO_DEVICE, self.device_id)

    def close(self) -> None:
        """Closes the IPC handle and ends the lease (once; later calls do
        nothing), or leaves both to the last DLPack tensor taken from it."""
        self._finalizer()

    def _close_published(self) -> None:
        """Closes the handle of a writable lease that publish ended; the
        release that follows frees the lease's device memory on the server
        (kept until then: the handle may be open in DLPack tensors)."""
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
    """A new array, unpublished.

    Fill ``array`` in place (numpy over scratch memory of the lease for host
    and sim device arrays; a :class:`CudaArray` on a GPU, zeroed device memory
    of the lease's own: write it with your own kernels or copies and
    synchronise before publishing), then ``publish()``, which copies the
    scratch into the array on the server; until then the name shows nothing
    new. ``release()`` (or
    leaving a ``with`` block unpublished, or the connection closing) frees it.
    After ``publish()`` the numpy array is made read-only; writing it anyway
    changes only the scratch, never the published version (on a GPU too: the
    lease's device memory is freed once its handle is closed).
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
