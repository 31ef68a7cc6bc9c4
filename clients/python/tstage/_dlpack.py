"""DLPack capsules of device memory, built with ctypes (no framework).

``export(data, device_type, device_id, shape, dtype, release)`` answers a
PyCapsule named ``"dltensor"`` holding a ``DLManagedTensor`` (DLPack's ABI,
unversioned, as every DLPack consumer takes it): the data pointer, the device,
the shape, C-contiguous (strides NULL), byte_offset 0. ``release`` is called
once, when the consumer calls the tensor's deleter: until then whatever keeps
the memory valid (the caller's hold on it, which release drops) must stay.

The protocol: a consumer takes the tensor by renaming the capsule
(``"used_dltensor"``) and later calls ``deleter``; a capsule that nobody took
calls the deleter itself when it is destroyed (its name still ``"dltensor"``).

Thread-safety: the deleter may be called from any thread (it takes the GIL);
the table of live exports is guarded by a lock.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Dict, Sequence, Tuple

import numpy as np

from . import dtypes as _dt

KDL_CPU = 1
KDL_CUDA = 2

# DLDataTypeCode
_KDL_INT, _KDL_UINT, _KDL_FLOAT, _KDL_BFLOAT, _KDL_BOOL = 0, 1, 2, 4, 6


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _Deleter)]

_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

# the capsule's name must outlive it: kept for the process's life
_NAME = b"dltensor"
_NAME_BUF = ctypes.create_string_buffer(_NAME)



def _capi(name: str, restype: Any, *argtypes: Any) -> Any:
    """A function of the C API with its own prototype (not ctypes.pythonapi's
    shared attribute, whose argtypes any other module may set)."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_PyCapsule_New = _capi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p,
                       _CapsuleDestructor)
# called on a capsule being destroyed: by address, never as a Python object
_PyCapsule_IsValid = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p,
                           ctypes.c_char_p)
_PyCapsule_GetPointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_char_p)


class _Export:
    """One exported tensor: its DLManagedTensor, the shape it points to, and
    what to call when the consumer is done."""

    def __init__(self, managed: DLManagedTensor, shape: Any,
                 release: Callable[[], None]) -> None:
        self.managed = managed
        self.shape = shape
        self.release = release


_lock = threading.Lock()
_live: Dict[int, _Export] = {}      # guarded by: _lock; address of the DLManagedTensor


def _delete(managed: Any) -> None:
    """The tensor's deleter: forgets the export and calls its release (once)."""
    try:
        addr = ctypes.cast(managed, ctypes.c_void_p).value
        with _lock:
            ex = _live.pop(addr, None)
        if ex is not None:
            ex.release()
    except Exception:   # a deleter has no caller to raise to; at exit, modules go away
        pass


def _destroy(capsule: int) -> None:
    """The capsule's destructor: calls the deleter of a tensor nobody took."""
    try:
        if _PyCapsule_IsValid(capsule, _NAME):
            ptr = _PyCapsule_GetPointer(capsule, _NAME)
            if ptr:
                m = ctypes.cast(ptr, ctypes.POINTER(DLManagedTensor))
                m.contents.deleter(m)
    except Exception:
        pass


_DELETER = _Deleter(_delete)
_DESTRUCTOR = _CapsuleDestructor(_destroy)


def dtype_code(dtype: np.dtype) -> Tuple[int, int, int]:
    """DLPack's (code, bits, lanes) of a tstage dtype; ValueError for others."""
    dt = np.dtype(dtype)
    if dt == _dt.DTYPES["bfloat16"]:
        return (_KDL_BFLOAT, 16, 1)
    codes = {"b": _KDL_BOOL, "i": _KDL_INT, "u": _KDL_UINT, "f": _KDL_FLOAT}
    if dt.kind not in codes:
        raise ValueError(f"dtype '{dt}' has no DLPack code")
    return (codes[dt.kind], dt.itemsize * 8, 1)


def export(data: int, device_type: int, device_id: int, shape: Sequence[int],
           dtype: np.dtype, release: Callable[[], None]) -> Any:
    """A new "dltensor" capsule of a C-contiguous tensor at data; its deleter
    calls release() once. ValueError for a dtype DLPack has no code for; on
    any failure release is not called (the caller keeps its hold)."""
    code, bits, lanes = dtype_code(dtype)
    ndim = len(shape)
    dims = (ctypes.c_int64 * max(ndim, 1))(*[int(d) for d in shape])
    m = DLManagedTensor()
    t = m.dl_tensor
    t.data = data or None
    t.device = DLDevice(device_type, device_id)
    t.ndim = ndim
    t.dtype = DLDataType(code, bits, lanes)
    t.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
    t.strides = None
    t.byte_offset = 0
    addr = ctypes.addressof(m)
    m.manager_ctx = addr
    m.deleter = _DELETER
    with _lock:
        _live[addr] = _Export(m, dims, release)
    try:
        return _PyCapsule_New(addr, ctypes.addressof(_NAME_BUF), _DESTRUCTOR)
    except BaseException:
        with _lock:
            _live.pop(addr, None)
        raise


def live() -> int:
    """How many exported tensors no consumer has deleted yet."""
    with _lock:
        return len(_live)
