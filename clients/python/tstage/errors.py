"""Exceptions raised by the tstage client.

Every error tstaged answers is a google.rpc.Status body whose first detail is a
google.rpc.ErrorInfo; :func:`error_from_status` turns it into the most specific
exception: first by the ErrorInfo ``reason`` (``OUT_OF_MEMORY`` is
:class:`OutOfMemory`, ``ETAG_MISMATCH`` is :class:`EtagMismatch`), then by the
canonical ``status`` (``NOT_FOUND`` is :class:`NotFound`, ...).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Type

__all__ = [
    "TstageError", "TransportError", "InvalidArgument", "FailedPrecondition", "OutOfRange",
    "EtagMismatch", "Unauthenticated", "PermissionDenied", "NotFound", "AlreadyExists",
    "Aborted", "ResourceExhausted", "OutOfMemory", "Cancelled", "Unknown", "Internal",
    "DataLoss", "Unimplemented", "Unavailable", "DeviceBroken", "DeadlineExceeded",
    "error_from_status",
]


class TstageError(Exception):
    """An error answered by tstaged (or met on the way to it).

    Attributes:
        code: the HTTP status (404, 429, ...), or 0 when no answer came.
        status: the canonical status name (``"NOT_FOUND"``, ...).
        reason: the ErrorInfo reason (``"ARRAY_NOT_FOUND"``, ...), or ``""``.
        message: the server's message, naming the problem.
        metadata: the ErrorInfo metadata (strings), e.g. the numbers of an
            out-of-memory refusal.
        details: every detail of the Status, as sent.
        request_id: the answer's ``X-Request-Id``, to find its log line.
        retryable: whether the same request may succeed when sent again later.
        partial_result: for an operation's error, what it did before it stopped
            (a step's ``losses``, ``steps``, ``model_steps``...), or None.
    """

    retryable: bool = False

    def __init__(self, message: str, *, code: int = 0, status: str = "UNKNOWN",
                 reason: str = "", metadata: Optional[Mapping[str, str]] = None,
                 details: Optional[List[Dict[str, Any]]] = None,
                 request_id: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.reason = reason
        self.metadata: Dict[str, str] = dict(metadata or {})
        self.details: List[Dict[str, Any]] = list(details or [])
        self.request_id = request_id
        self.partial_result: Optional[Dict[str, Any]] = None

    def __str__(self) -> str:
        head = f"{self.status}" + (f" ({self.reason})" if self.reason else "")
        return f"{head}: {self.message}"


class TransportError(TstageError):
    """No answer: the connection could not be made or broke before the answer."""
    retryable = True


class InvalidArgument(TstageError):
    """400 INVALID_ARGUMENT: the request is wrong; the message names the field."""


class FailedPrecondition(TstageError):
    """400 FAILED_PRECONDITION: the request does not fit the server's state."""


class OutOfRange(TstageError):
    """400 OUT_OF_RANGE."""


class EtagMismatch(FailedPrecondition):
    """An ``If-Match`` lost to a newer version: re-read the array before deciding."""


class Unauthenticated(TstageError):
    """401 UNAUTHENTICATED: a missing or wrong token."""


class PermissionDenied(TstageError):
    """403 PERMISSION_DENIED, e.g. a server-side path outside ``--data-dir``."""


class NotFound(TstageError):
    """404 NOT_FOUND: no array, model, operation, device... of that name."""


class AlreadyExists(TstageError):
    """409 ALREADY_EXISTS: choose another name, or ask to overwrite."""


class Aborted(TstageError):
    """409 ABORTED: the target is held by a running operation; retry once it ends."""
    retryable = True


class ResourceExhausted(TstageError):
    """429 RESOURCE_EXHAUSTED."""
    retryable = True


class OutOfMemory(ResourceExhausted):
    """An allocation that does not fit, refused before anything changed.

    Attributes:
        space: the memory space, ``"sim:0/device"``.
        requested: bytes asked for.
        free: bytes free in the space's pool.
        largest_free_block: the largest contiguous free block, bytes.
        limit: the pool's limit, bytes (a request larger than it never fits).
    """

    def __init__(self, message: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        md = self.metadata
        self.space: str = md.get("space", "")
        self.requested: Optional[int] = _int_or_none(md.get("requested_bytes"))
        self.free: Optional[int] = _int_or_none(md.get("free_bytes"))
        self.largest_free_block: Optional[int] = _int_or_none(md.get("largest_free_block_bytes"))
        self.limit: Optional[int] = _int_or_none(md.get("limit_bytes"))

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        """False when the request is larger than the whole pool."""
        return not (self.limit is not None and self.requested is not None
                    and self.requested > self.limit)


class Cancelled(TstageError):
    """499 CANCELLED: the operation was cancelled.

    A cancelled step keeps the steps it took; ``losses`` are theirs (from
    ``partial_result``, empty when none ran)."""

    @property
    def losses(self) -> List[float]:
        """The losses of the steps that ran before the cancel."""
        return list((self.partial_result or {}).get("losses") or [])


class Unknown(TstageError):
    """500 UNKNOWN."""


class Internal(TstageError):
    """500 INTERNAL: a server fault (logged with the request id)."""


class DataLoss(TstageError):
    """500 DATA_LOSS."""


class Unimplemented(TstageError):
    """501 UNIMPLEMENTED."""


class Unavailable(TstageError):
    """503 UNAVAILABLE: connection limits or draining; retry with backoff."""
    retryable = True


class DeviceBroken(Unavailable):
    """A device after a sticky error: not coming back until the daemon restarts."""
    retryable = False


class DeadlineExceeded(TstageError):
    """504 DEADLINE_EXCEEDED: the work may still finish; look the operation up."""


_BY_STATUS: Dict[str, Type[TstageError]] = {
    "INVALID_ARGUMENT": InvalidArgument, "FAILED_PRECONDITION": FailedPrecondition,
    "OUT_OF_RANGE": OutOfRange, "UNAUTHENTICATED": Unauthenticated,
    "PERMISSION_DENIED": PermissionDenied, "NOT_FOUND": NotFound,
    "ALREADY_EXISTS": AlreadyExists, "ABORTED": Aborted,
    "RESOURCE_EXHAUSTED": ResourceExhausted, "CANCELLED": Cancelled, "UNKNOWN": Unknown,
    "INTERNAL": Internal, "DATA_LOSS": DataLoss, "UNIMPLEMENTED": Unimplemented,
    "UNAVAILABLE": Unavailable, "DEADLINE_EXCEEDED": DeadlineExceeded,
}

_BY_REASON: Dict[str, Type[TstageError]] = {
    "OUT_OF_MEMORY": OutOfMemory, "ETAG_MISMATCH": EtagMismatch,
    "DEVICE_BROKEN": DeviceBroken,
}

_STATUS_OF_HTTP = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                   404: "NOT_FOUND", 409: "ABORTED", 429: "RESOURCE_EXHAUSTED",
                   499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED",
                   503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def _int_or_none(v: Optional[str]) -> Optional[int]:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def error_from_status(status: Any, *, http_status: int = 0,
                      request_id: Optional[str] = None) -> TstageError:
    """The exception for a google.rpc.Status object (the ``"error"`` member of an
    error body, or an operation's ``error``)."""
    if not isinstance(status, dict):
        name = _STATUS_OF_HTTP.get(http_status, "UNKNOWN")
        return _BY_STATUS.get(name, TstageError)(
            f"HTTP {http_status}: {str(status)[:200]}", code=http_status, status=name,
            request_id=request_id)
    name = str(status.get("status") or _STATUS_OF_HTTP.get(http_status, "UNKNOWN"))
    code = http_status or int(status.get("code") or 0)
    details = status.get("details") or []
    reason: str = ""
    metadata: Dict[str, str] = {}
    for d in details:
        if isinstance(d, dict) and str(d.get("@type", "")).endswith("google.rpc.ErrorInfo"):
            reason = str(d.get("reason", ""))
            metadata = d.get("metadata") or {}
            break
    cls = _BY_REASON.get(reason) or _BY_STATUS.get(name, TstageError)
    return cls(str(status.get("message", "")), code=code, status=name, reason=reason,
               metadata=metadata, details=details, request_id=request_id)
