"""Long-running operations (AIP-151): moves, imports, model creation, steps.

tstaged's operation JSON is read through :func:`op_field`, which accepts both
shapes: today's (``kind``, ``target``, ``state``, ``progress`` at the top and the
answer in ``result``) and AIP-151's (those in ``metadata`` and the answer in
``response``).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, Optional

from .errors import DeadlineExceeded, TstageError, error_from_status

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

__all__ = ["Operation", "op_field", "op_result"]

_MISSING = object()


def op_field(op: Dict[str, Any], key: str, default: Any = None) -> Any:
    """A member of an operation, wherever its shape keeps it: ``metadata`` first
    (AIP-151), then the top level (``done``, ``error`` and ``name`` are top-level
    in both)."""
    md = op.get("metadata")
    if isinstance(md, dict) and key in md:
        return md[key]
    return op.get(key, default)


def op_result(op: Dict[str, Any]) -> Any:
    """The answer of a succeeded operation: ``response`` (AIP-151) or ``result``."""
    if "response" in op:
        return op["response"]
    return op.get("result")


def op_id(op: Dict[str, Any]) -> str:
    """The operation's id (``op-...``), from ``id`` or from ``name``
    (``operations/op-...``)."""
    if op.get("id"):
        return str(op["id"])
    return str(op.get("name", "")).rsplit("/", 1)[-1]


class Operation:
    """A handle on one operation of tstaged.

    ``op.wait()`` blocks until it is done (optionally with a tqdm progress bar in
    bytes or steps), ``op.result()`` answers what it produced (or raises its
    error), ``op.cancel()`` stops it between chunks or steps.
    """

    def __init__(self, client: "Client", body: Dict[str, Any]) -> None:
        self._client = client
        self._body = body
        self.id: str = op_id(body)

    def __repr__(self) -> str:
        return (f"<Operation {self.id} {self.kind} {self.target!r} {self.state}"
                f" {self.progress}>")

    # ---- fields ---------------------------------------------------------------
    @property
    def json(self) -> Dict[str, Any]:
        """The operation as last fetched."""
        return self._body

    @property
    def kind(self) -> str:
        """``put``, ``copy``, ``import``, ``create``, ``step``, ..."""
        return str(op_field(self._body, "kind", ""))

    @property
    def target(self) -> str:
        """The array or model it works on."""
        return str(op_field(self._body, "target", ""))

    @property
    def state(self) -> str:
        """PENDING, RUNNING, SUCCEEDED, FAILED or CANCELLED."""
        return str(op_field(self._body, "state", ""))

    @property
    def done(self) -> bool:
        """Whether it has finished (succeeded, failed or cancelled)."""
        return bool(self._body.get("done"))

    @property
    def progress(self) -> Dict[str, int]:
        """``{bytes_done, bytes_total}`` or ``{steps_done, steps_total}``."""
        return dict(op_field(self._body, "progress", {}) or {})

    @property
    def partial_result(self) -> Optional[Dict[str, Any]]:
        """What the work did so far, as last fetched (:meth:`refresh`): while a
        step runs, its ``losses`` (and ``learning_rates``, ``grad_norms``,
        ``model_steps``, where its windows or batches are), renewed after every
        step; after a cancel or failure, the run's whole report. None when
        there is none (a succeeded operation answers :meth:`result` instead)."""
        part = op_field(self._body, "partial_result")
        return dict(part) if isinstance(part, dict) else None

    def _units(self) -> tuple:
        p = self.progress
        if "steps_total" in p:
            return "steps", int(p.get("steps_done", 0)), int(p["steps_total"])
        return "B", int(p.get("bytes_done", 0)), int(p.get("bytes_total", 0))

    # ---- actions --------------------------------------------------------------
    def refresh(self) -> "Operation":
        """Fetches its current state."""
        self._body = self._client._t.json("GET", f"/v1/operations/{self.id}")
        return self

    def _wait_once(self, seconds: float) -> None:
        self._body = self._client._t.json(
            "POST", f"/v1/operations/{self.id}:wait",
            query={"timeout": f"{max(seconds, 0.0):.3f}s"}, idempotent=True,
            timeout=seconds + 30.0)

    def wait(self, timeout: Optional[float] = None, progress: bool = False) -> "Operation":
        """Blocks until the operation is done and answers it.

        Args:
            timeout: seconds to wait at most (None: as long as it takes).
            progress: show a tqdm bar, in bytes or steps as the operation counts.

        Raises:
            DeadlineExceeded: the timeout passed first (the operation goes on).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = None
        try:
            while not self.done:
                left = 3600.0 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise DeadlineExceeded(
                        f"operation {self.id} not done after {timeout} s "
                        f"({self.state}, {self.progress})", status="DEADLINE_EXCEEDED")
                # with a bar, wake up often to draw it; else let the server wait
                self._wait_once(min(left, 0.2 if progress else 60.0))
                if progress:
                    unit, done, total = self._units()
                    if bar is None:
                        from tqdm.auto import tqdm
                        bar = tqdm(total=total or None, unit=unit,
                                   unit_scale=(unit == "B"), unit_divisor=1024,
                                   desc=f"{self.kind} {self.target}", leave=True)
                    bar.n = done
                    bar.refresh()
        finally:
            if bar is not None:
                unit, done, total = self._units()
                bar.n = done
                bar.refresh()
                bar.close()
        return self

    def cancel(self) -> "Operation":
        """Asks the server to stop it (between chunks or steps); a finished
        operation stays as it ended."""
        self._body = self._client._t.json("POST", f"/v1/operations/{self.id}:cancel",
                                          idempotent=True)
        return self

    def exception(self) -> Optional[TstageError]:
        """The error of a failed or cancelled operation, as an exception (its
        ``partial_result``: what the run did before it stopped); None
        otherwise."""
        err = self._body.get("error")
        if err is None:
            return None
        exc = error_from_status(err)
        exc.partial_result = self.partial_result
        return exc

    def result(self, timeout: Optional[float] = None, progress: bool = False) -> Any:
        """Waits (see :meth:`wait`) and answers what the operation produced: the
        array, model or step report; raises its error when it failed or was
        cancelled."""
        self.wait(timeout=timeout, progress=progress)
        exc = self.exception()
        if exc is not None:
            raise exc
        return op_result(self._body)
