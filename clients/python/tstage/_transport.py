"""HTTP to tstaged over TCP or a Unix socket (urllib3), with the retry policy.

A request is sent again only where its answer says that is safe:

* 503 UNAVAILABLE (connection limits, draining), except a broken device;
* 429 with ``Retry-After`` (a limit that passes; an out-of-memory refusal has
  none and is raised at once);
* 409 ABORTED (an array held by a running operation), for idempotent requests;
* no connection made (refused, connect timeout) for any request, a connection
  lost after the request was sent only for idempotent ones.

The delay doubles from ``backoff`` seconds (with jitter), or is the server's
``Retry-After`` when it gives one.
"""
from __future__ import annotations

import json as _json
import random
import socket
import time
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Union
from urllib.parse import quote, urlencode, urlsplit

import urllib3
from urllib3.connection import HTTPConnection
from urllib3.exceptions import (ConnectTimeoutError, HTTPError, NewConnectionError,
                                ProtocolError, ReadTimeoutError)

from .errors import TransportError, TstageError, error_from_status

Body = Union[None, bytes, bytearray, memoryview, Callable[[], Iterable[Any]]]


class _UnixConnection(HTTPConnection):
    """An HTTP/1.1 connection over a Unix stream socket."""

    def __init__(self, *args: Any, socket_path: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._socket_path = socket_path

    def _new_conn(self) -> socket.socket:  # type: ignore[override]
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if isinstance(self.timeout, (int, float)):
                s.settimeout(self.timeout)
            s.connect(self._socket_path)
        except OSError as e:
            s.close()
            raise NewConnectionError(self, f"cannot connect to {self._socket_path}: {e}") from e
        return s


class _UnixPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _UnixConnection  # type: ignore[assignment]


def _query(params: Optional[Mapping[str, Any]]) -> str:
    if not params:
        return ""
    items = []
    for k, v in params.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        items.append((k, str(v)))
    return ("?" + urlencode(items, quote_via=quote, safe=",:[]")) if items else ""


def quote_name(name: str) -> str:
    """A path parameter, percent-encoded."""
    return quote(name, safe="")


# a request line this long goes to tstaged's daemon with room for a long
# request head (server/accept.c's LONG_LINE, less "GET " and " HTTP/1.1")
_LONG_URL = 4000


class Transport:
    """Connection pools, authentication and retries; one per Client."""

    def __init__(self, url: str, *, unix_socket: Optional[str], token: Optional[str],
                 timeout: float, retries: int, backoff: float, max_backoff: float,
                 maxsize: int = 8) -> None:
        self.token = token
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.timeout = urllib3.Timeout(connect=min(timeout, 10.0), read=timeout)
        # two pools: tstaged gives a connection the memory its first request
        # needs (large pieces for an upload's body and room for a long
        # request head, little for the rest), so requests with a body or a
        # long URL keep to connections of their own
        if unix_socket:
            self.base = f"unix:{unix_socket}"
        else:
            u = urlsplit(url)
            if u.scheme not in ("http", ""):
                raise ValueError(f"url '{url}': only http:// is served (or unix_socket=)")
            self.base = url.rstrip("/")
        self.pool = self._make_pool(url, unix_socket, maxsize)
        self.bulk_pool = self._make_pool(url, unix_socket, maxsize)

    def _make_pool(self, url: str, unix_socket: Optional[str],
                   maxsize: int) -> urllib3.HTTPConnectionPool:
        if unix_socket:
            return _UnixPool("localhost", maxsize=maxsize, block=False, retries=False,
                             timeout=self.timeout, socket_path=unix_socket)
        u = urlsplit(url)
        return urllib3.HTTPConnectionPool(
            u.hostname or "127.0.0.1", u.port or 8470, maxsize=maxsize, block=False,
            retries=False, timeout=self.timeout)

    def close(self) -> None:
        self.pool.close()
        self.bulk_pool.close()

    def _delay(self, attempt: int, retry_after: Optional[str]) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.max_backoff)
            except ValueError:
                pass
        d = min(self.backoff * (2 ** attempt), self.max_backoff)
        return d * (0.5 + random.random() / 2)

    def request(self, method: str, path: str, *, query: Optional[Mapping[str, Any]] = None,
                body: Body = None, json: Any = None, headers: Optional[Dict[str, str]] = None,
                stream: bool = False, idempotent: Optional[bool] = None,
                timeout: Optional[float] = None, ok: Iterable[int] = ()) -> urllib3.BaseHTTPResponse:
        """Sends one request (again, where safe) and answers the response;
        raises the TstageError of an error status. With ``stream`` the body is
        left unread for the caller (who must release the response).

        ``body`` is bytes, or a callable answering a fresh iterable of byte
        chunks for each attempt (then give ``Content-Length`` in ``headers``).
        """
        if idempotent is None:
            idempotent = method in ("GET", "HEAD", "PUT", "DELETE")
        hdrs = {"Accept-Encoding": "identity"}
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        if json is not None:
            body = _json.dumps(json).encode()
            hdrs["Content-Type"] = "application/json"
        elif method == "POST" and body is None:
            body = b""
        hdrs.update(headers or {})
        url = path + _query(query)
        tmo = urllib3.Timeout(connect=self.timeout.connect_timeout, read=timeout) \
            if timeout is not None else self.timeout
        attempt = 0
        while True:
            payload: Any = body() if callable(body) else body
            try:
                pool = self.bulk_pool if method in ("PUT", "POST", "PATCH") or \
                    len(url) >= _LONG_URL else self.pool
                resp = pool.urlopen(method, url, body=payload, headers=hdrs,
                                    preload_content=False, retries=False,
                                    timeout=tmo, redirect=False, chunked=False)
            except (NewConnectionError, ConnectTimeoutError) as e:
                if attempt < self.retries:
                    time.sleep(self._delay(attempt, None))
                    attempt += 1
                    continue
                raise TransportError(f"cannot reach tstaged at {self.base}: {e}",
                                     status="UNAVAILABLE") from e
            except (ProtocolError, ReadTimeoutError, HTTPError, OSError) as e:
                if idempotent and attempt < self.retries:
                    time.sleep(self._delay(attempt, None))
                    attempt += 1
                    continue
                raise TransportError(f"{method} {path}: {e}", status="UNAVAILABLE") from e
            if resp.status < 400 or resp.status in ok:
                if not stream:
                    resp.read(cache_content=True)
                    resp.release_conn()
                return resp
            err = self._error(resp)
            if attempt < self.retries and self._retry(err, resp, idempotent):
                time.sleep(self._delay(attempt, resp.headers.get("Retry-After")))
                attempt += 1
                continue
            raise err

    @staticmethod
    def _retry(err: TstageError, resp: urllib3.BaseHTTPResponse, idempotent: bool) -> bool:
        if err.status == "UNAVAILABLE":
            return err.retryable
        if err.status == "RESOURCE_EXHAUSTED":
            return "Retry-After" in resp.headers
        if err.status == "ABORTED":
            return idempotent
        return False

    @staticmethod
    def _error(resp: urllib3.BaseHTTPResponse) -> TstageError:
        raw = resp.read()
        resp.release_conn()
        rid = resp.headers.get("X-Request-Id")
        try:
            status = _json.loads(raw)["error"]
        except (ValueError, KeyError, TypeError):
            status = raw.decode("utf-8", "replace")
        return error_from_status(status, http_status=resp.status, request_id=rid)

    def json(self, method: str, path: str, **kw: Any) -> Any:
        """request() answering the decoded JSON body ({} when empty)."""
        resp = self.request(method, path, **kw)
        data = resp.data
        return _json.loads(data) if data else {}
