"""libcudart through ctypes: the few CUDA runtime calls a device lease needs.

A GPU array's lease is a CUDA IPC handle of the lease's own device memory. This
module opens and closes such handles and copies between device and host
memory with the CUDA runtime library itself, loaded as the dynamic loader finds
it (``LD_LIBRARY_PATH`` first, then the loader's cache): ``libcudart.so.13``,
else ``.12``, else ``libcudart.so``. No framework (cuda-python, CuPy, PyTorch)
is needed. The library is loaded on first use, never on ``import tstage``.

Every call checks its ``cudaError_t`` and raises :class:`TransportError` with
the call, its subject and ``cudaGetErrorString``'s text. The current device is
per thread in CUDA, and a program's (PyTorch's, CuPy's) must not change under
it: calls that need a GPU current (opening, closing a handle, copies) run on
the runtime's own thread, where ``cudaSetDevice`` disturbs no thread of the
program, and need no ``cudaGetDevice`` to put anything back.

Thread-safety: loading is done once under a lock; the calls are the CUDA
runtime's (thread-safe), each run on the runtime's thread in turn.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import threading
from typing import Any, Callable, Optional, Sequence

from .errors import TransportError

#: sonames tried in order (CUDA 13, 12, then whatever ``libcudart.so`` is)
LIBRARY_NAMES: Sequence[str] = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")

IPC_HANDLE_BYTES = 64
IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1        # cudaIpcMemLazyEnablePeerAccess
MEMCPY_HOST_TO_DEVICE = 1                  # cudaMemcpyHostToDevice
MEMCPY_DEVICE_TO_HOST = 2                  # cudaMemcpyDeviceToHost


class IpcMemHandle(ctypes.Structure):
    """cudaIpcMemHandle_t: 64 opaque bytes, passed by value."""

    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


class Runtime:
    """One loaded libcudart and the calls of a device lease."""

    def __init__(self, lib: ctypes.CDLL, soname: str) -> None:
        self.lib = lib
        self.soname = soname
        err = ctypes.c_int
        self._sig("cudaGetErrorString", ctypes.c_char_p, [err])
        self._sig("cudaSetDevice", err, [ctypes.c_int])
        self._sig("cudaDeviceGetByPCIBusId", err,
                  [ctypes.POINTER(ctypes.c_int), ctypes.c_char_p])
        self._sig("cudaIpcOpenMemHandle", err,
                  [ctypes.POINTER(ctypes.c_void_p), IpcMemHandle, ctypes.c_uint])
        self._sig("cudaIpcCloseMemHandle", err, [ctypes.c_void_p])
        self._sig("cudaMemcpy", err,
                  [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._pool_lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None    # the pool's one thread

    def _sig(self, name: str, restype: object, argtypes: list) -> None:
        fn = getattr(self.lib, name)
        fn.restype = restype
        fn.argtypes = argtypes

    def check(self, err: int, call: str) -> None:
        """Raises TransportError("<call>: <CUDA's text> (<code>)") unless err is 0."""
        if err != 0:
            text = self.lib.cudaGetErrorString(err)
            raise TransportError(f"{call}: {text.decode() if text else 'unknown error'} "
                                 f"(cudaError_t {err})")

    def _on(self, dev: int, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the runtime's thread with GPU dev current there; its
        result or its exception. Called on that thread (a garbage collection
        there may close a handle), it runs at once; when the interpreter is
        shutting down and no thread can start, on the caller's."""
        def run() -> Any:
            self.check(self.lib.cudaSetDevice(dev), f"cudaSetDevice({dev})")
            return fn(*args)

        if threading.current_thread() is self._thread:
            return run()
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="tstage-cudart", initializer=self._named)
            try:
                fut = self._pool.submit(run)
            except RuntimeError:          # interpreter shutdown: no new work
                fut = None
        return run() if fut is None else fut.result()

    def _named(self) -> None:
        self._thread = threading.current_thread()

    def device_by_pci_bus_id(self, pci_bus_id: str) -> int:
        """This process's ordinal of the GPU at that PCI bus id (ordinals differ
        between processes under CUDA_VISIBLE_DEVICES; bus ids do not)."""
        dev = ctypes.c_int(-1)
        self.check(self.lib.cudaDeviceGetByPCIBusId(ctypes.byref(dev), pci_bus_id.encode()),
                   f"cudaDeviceGetByPCIBusId('{pci_bus_id}')")
        return dev.value

    def ipc_open(self, handle: bytes, dev: int) -> int:
        """The base of the allocation handle names, mapped with GPU dev current
        (cudaIpcMemLazyEnablePeerAccess); usable from every thread."""
        if len(handle) != IPC_HANDLE_BYTES:
            raise ValueError(f"a CUDA IPC handle has {IPC_HANDLE_BYTES} bytes, not {len(handle)}")
        h = IpcMemHandle()
        ctypes.memmove(ctypes.addressof(h), handle, IPC_HANDLE_BYTES)

        def call() -> int:
            ptr = ctypes.c_void_p(0)
            self.check(self.lib.cudaIpcOpenMemHandle(ctypes.byref(ptr), h,
                                                     IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                       f"cudaIpcOpenMemHandle on cuda:{dev}")
            return int(ptr.value or 0)

        return int(self._on(dev, call))

    def ipc_close(self, ptr: int, dev: int) -> None:
        """Unmaps what ipc_open answered, with its GPU dev current."""
        self._on(dev, lambda: self.check(self.lib.cudaIpcCloseMemHandle(ctypes.c_void_p(ptr)),
                                         f"cudaIpcCloseMemHandle(0x{ptr:x}) on cuda:{dev}"))

    def memcpy(self, dst: int, src: int, nbytes: int, kind: int, dev: int) -> None:
        """cudaMemcpy of nbytes with GPU dev current (synchronous: done on return)."""
        if nbytes == 0:
            return
        self._on(dev, lambda: self.check(
            self.lib.cudaMemcpy(ctypes.c_void_p(dst), ctypes.c_void_p(src), nbytes, kind),
            f"cudaMemcpy of {nbytes} bytes on cuda:{dev}"))


_lock = threading.Lock()
_runtime: Optional[Runtime] = None


def load(names: Sequence[str] = LIBRARY_NAMES) -> Runtime:
    """The CUDA runtime, loaded on the first call (the first of names the
    dynamic loader finds) and kept; OSError naming what was tried when none
    loads, or when the one found lacks a call."""
    global _runtime
    with _lock:
        if _runtime is not None and names is LIBRARY_NAMES:
            return _runtime
        failures = []
        for name in names:
            try:
                rt = Runtime(ctypes.CDLL(name), name)
            except (OSError, AttributeError) as e:
                failures.append(f"{name}: {e}")
                continue
            if names is LIBRARY_NAMES:
                _runtime = rt
            return rt
        raise OSError("opening a CUDA IPC handle needs the CUDA runtime (libcudart) where the "
                      "dynamic loader finds it (LD_LIBRARY_PATH, ldconfig); "
                      + "; ".join(failures))
