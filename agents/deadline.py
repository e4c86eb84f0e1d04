"""A total deadline for every LLM HTTP request: connect, send, headers and the whole body.

httpx's timeouts bound each socket operation, so a server that sends one byte every few
seconds is never timed out. ``deadline_client(total_s)`` is an ``httpx.Client`` whose every
request (each retry is a new request) must be over within ``total_s`` seconds: each socket
read or write waits at most what is left of the request's deadline, and none past it. Waits
are cut into short slices, so a thread blocked in a read also takes an exception raised in it
(the chat's Ctrl-C) within a fraction of a second.

A reply body is also bounded in size while it is read: past ``MAX_REPLY_BYTES`` (on the wire,
and again once gzip/deflate is undone) the read stops and ``ReplyTooLarge`` is raised, for a
plain reply and a streamed (server-sent events) one alike, so a body that never ends costs at
most that much memory.
"""

from __future__ import annotations

import contextlib
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import httpcore
import httpx
import openai

# The longest single wait on a socket: a bound on how late a thread sees an async exception.
SLICE_S = 0.25

# The most bytes one LLM reply may have (8 MiB): a reply's text is cut to 16 Ki characters
# (tools/core/untrusted.py) and at most MAX_TOOL_CALLS_PER_REPLY tool calls of 16 Ki characters
# each run (agents/loop.py), so a useful reply, even streamed a token per event, is far smaller.
MAX_REPLY_BYTES = 8 * 2**20
# Content encodings a reply may use: each is undone here, within the same bound.
_DECODABLE = ("gzip", "deflate")

_local = threading.local()


class ReplyTooLarge(openai.OpenAIError):
    """An LLM reply passed the byte bound; the read stopped there.

    An ``OpenAIError``, so the OpenAI client passes it up as it is: it neither retries the
    request (the same server would send the same reply) nor hides it behind a connection error.
    """

    def __init__(self, url: str, limit: int, what: str = "") -> None:
        self.url, self.limit = url, limit
        super().__init__(
            f"the reply from {url} {what or 'passed'} the bound of {_size(limit)} on one LLM "
            "reply; the read stopped there"
        )


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n % 2**20 == 0 else f"{n:,} bytes"


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
    """A reply body read within the request's deadline and at most ``limit`` bytes long.

    ``encoding`` (gzip or deflate) is undone here, its output counted against the same bound;
    the response then carries no Content-Encoding, so httpx does not decode it again.
    """

    def __init__(
        self, inner: httpx.SyncByteStream, deadline: float, limit: int, url: str, encoding: str
    ) -> None:
        self._inner, self._deadline, self._limit, self._url = inner, deadline, limit, url
        self._inflate = zlib.decompressobj(wbits=47) if encoding else None

    def __iter__(self) -> Iterator[bytes]:
        """The body's chunks, as the server sends them, until the deadline or the bound."""
        chunks = iter(self._inner)
        wire = body = 0
        while True:
            with _within(self._deadline):
                chunk = next(chunks, None)
            if chunk is None:
                return
            wire += len(chunk)
            if wire > self._limit:
                raise ReplyTooLarge(self._url, self._limit)
            if self._inflate is not None:
                try:
                    chunk = self._inflate.decompress(chunk, self._limit - body + 1)
                except zlib.error as exc:
                    raise httpx.DecodingError(
                        f"the reply's compressed body is bad: {exc}"
                    ) from None
            body += len(chunk)
            if body > self._limit:
                raise ReplyTooLarge(self._url, self._limit, "passed, once decompressed,")
            yield chunk

    def close(self) -> None:
        """Release the connection."""
        self._inner.close()


class DeadlineTransport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` whose every request ends within ``total_s``, body included."""

    def __init__(
        self, total_s: float, max_reply_bytes: int = MAX_REPLY_BYTES, **kwargs: Any
    ) -> None:
        """The transport; ``kwargs`` go to ``httpx.HTTPTransport``."""
        super().__init__(**kwargs)
        self.total_s = total_s
        self.max_reply_bytes = max_reply_bytes
        pool: Any = self._pool
        pool._network_backend = _Backend(pool._network_backend)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; its reply must come by the deadline, and within the byte bound."""
        deadline = time.monotonic() + self.total_s
        with _within(deadline):
            response = super().handle_request(request)
        stream = response.stream
        assert isinstance(stream, httpx.SyncByteStream)
        url = str(request.url)
        encoding = response.headers.get("content-encoding", "").strip().lower()
        if encoding in ("", "identity"):
            encoding = ""
        elif encoding in _DECODABLE:
            del response.headers["content-encoding"]  # decoded, within the bound, by _Body
        else:
            stream.close()
            raise httpx.DecodingError(
                f"the reply from {url} uses Content-Encoding {encoding[:40]!r}, which is not read "
                f"here (asked for {', '.join(_DECODABLE)})"
            )
        response.stream = _Body(stream, deadline, self.max_reply_bytes, url, encoding)
        return response


def deadline_client(total_s: float, max_reply_bytes: int = MAX_REPLY_BYTES) -> httpx.Client:
    """An ``httpx.Client`` for an LLM provider: ``total_s`` per request, ``max_reply_bytes`` per reply."""
    return httpx.Client(
        transport=DeadlineTransport(total_s, max_reply_bytes),
        timeout=httpx.Timeout(total_s),
        follow_redirects=True,
        headers={"Accept-Encoding": ", ".join(_DECODABLE)},
    )
