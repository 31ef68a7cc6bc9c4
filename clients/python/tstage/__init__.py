"""tstage: the Python client of tstaged, the tensor staging daemon.

    import numpy as np, tstage
    c = tstage.Client()                       # $TSTAGE_URL, $TSTAGE_TOKEN_FILE
    c.put("x", np.ones((4, 8), np.float32), memory_kind="pinned_host")
    c.device_put("x", device="sim:0", memory_kind="device").wait(progress=True)
    print(c.get("x", index=(slice(0, 2),)))
"""
from .client import Client, rows, windows
from .dtypes import DTYPES
from .errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded,
                     DeviceBroken, EtagMismatch, FailedPrecondition, Internal,
                     InvalidArgument, NotFound, OutOfMemory, OutOfRange, PermissionDenied,
                     ResourceExhausted, TransportError, TstageError, Unauthenticated,
                     Unavailable, Unimplemented, Unknown, error_from_status)
from .lease import CudaArray, WriteLease
from .operation import Operation, op_field, op_result

__version__ = "0.1.0"

__all__ = [
    "Client", "CudaArray", "WriteLease", "Operation", "rows", "windows", "DTYPES", "op_field", "op_result", "error_from_status",
    "TstageError", "TransportError", "InvalidArgument", "FailedPrecondition", "OutOfRange",
    "EtagMismatch", "Unauthenticated", "PermissionDenied", "NotFound", "AlreadyExists",
    "Aborted", "ResourceExhausted", "OutOfMemory", "Cancelled", "Unknown", "Internal",
    "DataLoss", "Unimplemented", "Unavailable", "DeviceBroken", "DeadlineExceeded",
]
