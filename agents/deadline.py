"""A total deadline for every LLM HTTP request: connect, send, headers and the whole body.

httpx's timeouts bound each socket operation, so a server that sends one byte every few
seconds is never timed out. ``deadline_client(total_s)`` is an ``httpx.Client`` whose every
request (each retry is a new request) must be over within ``total_s`` seconds: each socket
read or write waits at most what is left of the request's deadline, and none past it. Waits
are cut into short slices, so a thread blocked in a read also takes an exception raised in it
(the chat's Ctrl-C) within a fraction of a second.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpcore
import httpx

# The longest single wait on a socket: a bound on how late a thread sees an async exception.
SLICE_S = 0.25

_local = threading.local()


def _deadline() -> float | None:
    return getattr(_local, "deadline", None)


@contextlib.contextmanager
def _within(deadline: float) -> Iterator[None]:
    """Socket operations of this thread, for the block, end by ``deadline`` (monotonic)."""
    previous = _deadline()
    _local.deadline = deadline if previous is None else min(previous, deadline)
    try:
        yield
    finally:
        _local.deadline = previous


def _left(deadline: float, error: type[Exception], what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise error(f"the LLM request's total deadline passed ({what})")
    return left


class _Stream(httpcore.NetworkStream):
    """A network stream whose reads and writes end by the thread's request deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Read, in slices, until data comes, ``timeout`` passes or the deadline does."""
        deadline = _deadline()
        if deadline is None:
            return self._inner.read(max_bytes, timeout)
        if timeout is not None:
            deadline = min(deadline, time.monotonic() + timeout)
        while True:
            wait = min(SLICE_S, _left(deadline, httpcore.ReadTimeout, "reading the reply"))
            try:
                return self._inner.read(max_bytes, wait)
            except httpcore.ReadTimeout:
                continue  # nothing came in this slice; the deadline decides

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Write, waiting at most what is left of the deadline."""
        deadline = _deadline()
        if deadline is not None:
            left = _left(deadline, httpcore.WriteTimeout, "sending the request")
            timeout = left if timeout is None else min(timeout, left)
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        """Close the connection."""
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        """TLS over this stream, the handshake within the deadline."""
        deadline = _deadline()
        if deadline is not None:
            left = _left(deadline, httpcore.ConnectTimeout, "TLS handshake")
            timeout = left if timeout is None else min(timeout, left)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        """What the underlying stream says (the socket, the TLS object, ...)."""
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """Connects within the thread's request deadline; its streams keep to it."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def _timeout(self, timeout: float | None) -> float | None:
        deadline = _deadline()
        if deadline is None:
            return timeout
        left = _left(deadline, httpcore.ConnectTimeout, "connecting")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        """A TCP connection, made within the deadline."""
        return _Stream(
            self._inner.connect_tcp(
                host, port, self._timeout(timeout), local_address, socket_options
            )
        )

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        """A Unix-socket connection, made within the deadline."""
        return _Stream(
            self._inner.connect_unix_socket(path, self._timeout(timeout), socket_options)
        )

    def sleep(self, seconds: float) -> None:
        """Sleep (httpcore's own retries)."""
        self._inner.sleep(seconds)


class _Body(httpx.SyncByteStream):
    """A reply body whose every chunk is read within the request's deadline."""

    def __init__(self, inner: httpx.SyncByteStream, deadline: float) -> None:
        self._inner, self._deadline = inner, deadline

    def __iter__(self) -> Iterator[bytes]:
        """The body's chunks, as the server sends them, until the deadline."""
        chunks = iter(self._inner)
        while True:
            with _within(self._deadline):
                chunk = next(chunks, None)
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        """Release the connection."""
        self._inner.close()


class DeadlineTransport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` whose every request ends within ``total_s``, body included."""

    def __init__(self, total_s: float, **kwargs: Any) -> None:
        """The transport; ``kwargs`` go to ``httpx.HTTPTransport``."""
        super().__init__(**kwargs)
        self.total_s = total_s
        pool: Any = self._pool
        pool._network_backend = _Backend(pool._network_backend)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; the reply's headers and body must come by the deadline."""
        deadline = time.monotonic() + self.total_s
        with _within(deadline):
            response = super().handle_request(request)
        stream = response.stream
        assert isinstance(stream, httpx.SyncByteStream)
        response.stream = _Body(stream, deadline)
        return response


def deadline_client(total_s: float) -> httpx.Client:
    """An ``httpx.Client`` for an LLM provider: every request over within ``total_s`` seconds."""
    return httpx.Client(
        transport=DeadlineTransport(total_s),
        timeout=httpx.Timeout(total_s),
        follow_redirects=True,
    )
