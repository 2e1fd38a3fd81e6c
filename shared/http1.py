"""The API server's HTTP client: HTTP/1.1 over a keep-alive pool of TLS connections.

Every API call of every service goes through it (shared/kube.py). It does what those
calls need and nothing more, so each request costs little CPU: the binder makes two per
pod. bench/apiclient.py measures it: about half of aiohttp's client CPU per request on
the same event loop (bench/RESULTS.md).

What it speaks:
- requests with a body (``Content-Length``) or without;
- answers with ``Content-Length``, ``chunked`` or (``Connection: close``) up to EOF;
- streamed chunked answers for watches (:meth:`Pool.stream`);
- an ``http://`` proxy through ``CONNECT`` (kubeconfig's ``proxy-url``, with its user
  and password as ``Proxy-Authorization: Basic``; an ``https://`` proxy is refused at
  start).

Not redirects, cookies, compression (no ``Accept-Encoding`` is sent) or ``Expect:
100-continue``. A connection idle for ``idle_s`` is dropped before the server's own idle
timeout can close it under a request, and one found closed is replaced. A kept
connection that breaks after the request went out, before any byte of the answer came,
costs an idempotent request one more try on a new connection, and any other request a
:class:`ProtocolError` (its caller decides: the binder's retries read the pod first).
Transport failures raise :class:`ProtocolError` or another ``OSError``; a timeout
raises ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

IDLE_S = 30.0
"""How long an unused connection is kept (Go's API server closes idle ones at 90 s)."""
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
"""Methods whose request may be sent again when a kept connection failed without an
answer (RFC 9110 section 9.2.2)."""
STREAM_LIMIT = 2**20
"""The reader's buffer limit: an answer's head or a chunk-size line longer fails (the API
server's are a few hundred bytes)."""


READ_BYTES = 2**16
"""The most a chunked body's reader asks for at once (``Stream``)."""


class ProtocolError(ConnectionError):
    """The server closed the connection, or answered with something that is not HTTP/1.1
    as this client reads it."""


@dataclass
class Response:
    """A whole answer: status, reason phrase and body."""

    status: int
    reason: str
    body: bytes


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    used_at: float = 0.0

    def close(self) -> None:
        self.writer.transport.abort()


@dataclass
class _Head:
    status: int
    reason: str
    length: int | None
    chunked: bool
    keep_alive: bool


def _parse_head(raw: bytes) -> _Head:
    try:
        status_line, *lines = raw[:-4].split(b"\r\n")
        version, code, *reason = status_line.split(b" ", 2)
        if not version.startswith(b"HTTP/1."):
            raise ValueError(version)
        length: int | None = None
        chunked = False
        keep_alive = version == b"HTTP/1.1"
        for line in lines:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
                if length < 0:
                    raise ValueError(length)
            elif name == b"transfer-encoding":
                chunked = value.strip().lower().endswith(b"chunked")
            elif name == b"connection":
                token = value.strip().lower()
                if token == b"close":
                    keep_alive = False
                elif token == b"keep-alive":
                    keep_alive = True
        return _Head(
            int(code), reason[0].decode("latin-1") if reason else "", length, chunked, keep_alive
        )
    except (ValueError, IndexError) as exc:
        raise ProtocolError(f"not an HTTP/1.1 answer: {raw[:200]!r}") from exc


@dataclass
class Stream:
    """An answer being read (:meth:`Pool.stream`): its status, then its body in chunks
    as they come, or whole."""

    status: int
    reason: str
    _conn: _Conn
    _head: _Head
    _deadline: float | None = None
    """The loop time by which every read must be done (:meth:`Pool.stream`); it bounds
    the reads only, never what the caller does between them."""
    _done: bool = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, each piece as soon as it arrives."""
        try:
            async for chunk in self._chunks():
                yield chunk
        except asyncio.IncompleteReadError:
            raise ProtocolError("the server closed the connection mid-answer") from None
        except asyncio.LimitOverrunError:
            raise ProtocolError(f"a chunk-size line over {STREAM_LIMIT} bytes") from None

    async def _chunks(self) -> AsyncIterator[bytes]:
        reader = self._conn.reader
        if self._head.chunked:
            async for data in self._dechunked(reader):
                yield data
        elif self._head.length is not None:
            if self._head.length:
                yield await self._within(reader.readexactly(self._head.length))
        else:
            while data := await self._within(reader.read(2**16)):
                yield data
            self._head.keep_alive = False
        self._done = True

    async def _dechunked(self, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        """A chunked body's chunks, decoded from reads of up to ``READ_BYTES``: the API
        server writes a list in chunks of about 3 KB, and reading each size line and
        each chunk on its own (two timed reads a chunk) cost a service about 4.9 ms of
        CPU a MB, half its CPU to the first bind of a restart (bench/RESULTS.md)."""
        buf, at = b"", 0

        async def line() -> bytes:
            """The next CRLF-ended line (without it), reading more as needed."""
            nonlocal buf, at
            while (end := buf.find(b"\r\n", at)) < 0:
                if len(buf) - at > STREAM_LIMIT:
                    raise asyncio.LimitOverrunError("no CRLF", len(buf) - at)
                more = await self._within(reader.read(READ_BYTES))
                if not more:
                    raise asyncio.IncompleteReadError(buf[at:], None)
                buf, at = buf[at:] + more, 0
            found, at = buf[at:end], end + 2
            return found

        while True:
            size_line = await line()
            try:
                size = int(size_line.split(b";", 1)[0], 16)
                if size < 0:
                    raise ValueError(size)
            except ValueError:
                raise ProtocolError(f"a bad chunk size: {size_line[:80]!r}") from None
            if size == 0:
                while await line():
                    pass  # trailers, up to the empty line
                if at < len(buf):  # bytes past the answer: not a connection to reuse
                    self._head.keep_alive = False
                return
            held = len(buf) - at
            if held >= size + 2:
                data, at = buf[at : at + size + 2], at + size + 2
            else:
                data = buf[at:] + await self._within(reader.readexactly(size + 2 - held))
                buf, at = b"", 0
            if data[-2:] != b"\r\n":
                raise ProtocolError("a chunk not ended by CRLF")
            yield data[:-2]

    async def _within(self, read: Coroutine[Any, Any, bytes]) -> bytes:
        if self._deadline is None:
            return await read
        async with asyncio.timeout_at(self._deadline):
            return await read

    async def read(self) -> bytes:
        """The whole body."""
        head = self._head
        if head.length is not None and not head.chunked:  # most answers: one read
            try:
                body = await self._conn.reader.readexactly(head.length) if head.length else b""
            except asyncio.IncompleteReadError:
                raise ProtocolError("the server closed the connection mid-answer") from None
            self._done = True
            return body
        return b"".join([chunk async for chunk in self.chunks()])


class Pool:
    """Connections to one server (``url``: ``https://host[:port][/prefix]``), at most
    ``limit`` at once; a request beyond waits for one to come back. ``tls`` is the TLS
    context of an ``https://`` URL (the system's defaults when None), ignored for
    ``http://``."""

    def __init__(
        self,
        url: str,
        tls: ssl.SSLContext | None,
        limit: int,
        proxy: str | None = None,
        idle_s: float = IDLE_S,
    ) -> None:
        split = urlsplit(url)
        if split.scheme not in ("https", "http") or not split.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        if proxy and urlsplit(proxy).scheme != "http":
            raise ValueError(f"only http:// proxies are supported, not {proxy!r}")
        https = split.scheme == "https"
        self.tls = (tls or ssl.create_default_context()) if https else None
        self.host = split.hostname
        self.port = split.port or (443 if https else 80)
        self.prefix = split.path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = f"{host}:{self.port}"
        self.proxy = proxy
        self.idle_s = idle_s
        self._slots = asyncio.Semaphore(limit)
        self._free: list[_Conn] = []
        self._closed = False

    def target(self, path: str, query: Mapping[str, str] | None = None) -> str:
        """The request target of ``path`` under the server's URL, with ``query``."""
        target = self.prefix + quote(path, safe="/:@!$&'()*+,;=-._~")
        return f"{target}?{urlencode(query)}" if query else target

    async def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None = None,
        timeout_s: float = 60.0,
    ) -> Response:
        """One request and its whole answer."""
        async with asyncio.timeout(timeout_s), self._slots:
            conn, head = await self._begin(self._message(method, target, headers, body), method)
            answer = Stream(head.status, head.reason, conn, head)
            try:
                data = await answer.read()
            except BaseException:
                conn.close()
                raise
            self._release(answer)
            return Response(head.status, head.reason, data)

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, target: str, headers: Mapping[str, str], timeout_s: float
    ) -> AsyncIterator[Stream]:
        """One request whose answer is read as it comes (a watch): every read of it done
        within ``timeout_s`` of the start, else ``TimeoutError``. What the caller does
        with a chunk is not timed: a handler is never cancelled half-way by it."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        async with self._slots:
            async with asyncio.timeout_at(deadline):
                conn, head = await self._begin(self._message(method, target, headers, None), method)
            answer = Stream(head.status, head.reason, conn, head, deadline)
            try:
                yield answer
            except BaseException:
                conn.close()
                raise
            self._release(answer)

    def _message(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None
    ) -> bytes:
        if self._closed:
            raise ProtocolError("the client is closed")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.authority}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        return _head_bytes(lines) + (body or b"")

    def _release(self, answer: Stream) -> None:
        """Keep the connection of an answer read to its end, if the server keeps it."""
        conn = answer._conn
        if answer._done and answer._head.keep_alive and not self._closed:
            conn.used_at = time.monotonic()
            self._free.append(conn)
        else:
            conn.close()

    async def _begin(self, message: bytes, method: str) -> tuple[_Conn, _Head]:
        """``message`` sent and its answer's head read, on a kept connection if one is
        open, else on a new one."""
        conn, head = await self._send(message, replayable=method in IDEMPOTENT)
        if method == "HEAD" or head.status in (204, 304):
            head.length, head.chunked = 0, False
        return conn, head

    def _kept(self) -> _Conn | None:
        """The most recently used kept connection still open, the stale ones closed."""
        while self._free:
            conn = self._free.pop()
            if (
                time.monotonic() - conn.used_at > self.idle_s
                or conn.reader.at_eof()
                or conn.reader.exception() is not None
                or conn.writer.transport.is_closing()
            ):
                conn.close()
                continue
            return conn
        return None

    async def _send(self, message: bytes, *, replayable: bool) -> tuple[_Conn, _Head]:
        """Sent once more, on a new connection, only when a kept one failed before any
        byte of the answer came, and then only if nothing was written (the connection
        was found closed) or the method is idempotent: the server may have read a
        request and died before answering, and a POST is never repeated (as Go's and
        aiohttp's clients do)."""
        conn = self._kept()
        if conn is not None:
            try:
                return conn, await _head(conn, message)
            except _UnsentError:
                conn.close()  # closed under us: nothing went out
            except ProtocolError:
                conn.close()
                raise
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                conn.close()
                partial = isinstance(exc, asyncio.IncompleteReadError) and exc.partial
                if partial or not replayable:
                    raise ProtocolError(
                        "the server closed the connection before answering in full"
                    ) from None
            except BaseException:
                conn.close()
                raise
        conn = await self._connect()
        try:
            return conn, await _head(conn, message)
        except asyncio.IncompleteReadError:
            conn.close()
            raise ProtocolError("the server closed the connection without an answer") from None
        except BaseException:
            conn.close()
            raise

    async def _connect(self) -> _Conn:
        if not self.proxy:
            reader, writer = await asyncio.open_connection(
                self.host,
                self.port,
                ssl=self.tls,
                server_hostname=self.host if self.tls else None,
                limit=STREAM_LIMIT,
            )
            return _Conn(reader, writer)
        proxy = urlsplit(self.proxy)
        reader, writer = await asyncio.open_connection(
            proxy.hostname, proxy.port or 80, limit=STREAM_LIMIT
        )
        conn = _Conn(reader, writer)
        lines = [f"CONNECT {self.authority} HTTP/1.1", f"Host: {self.authority}"]
        if proxy.username is not None:
            user = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
            lines.append(f"Proxy-Authorization: Basic {base64.b64encode(user.encode()).decode()}")
        try:
            try:
                writer.write(_head_bytes(lines))
                head = _parse_head(await reader.readuntil(b"\r\n\r\n"))
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                raise ProtocolError("the proxy closed the connection or sent no answer") from None
            if head.status != 200:
                raise ProtocolError(f"the proxy refused CONNECT: {head.status} {head.reason}")
            if self.tls is not None:
                await writer.start_tls(self.tls, server_hostname=self.host)
        except BaseException:
            conn.close()
            raise
        return conn

    async def close(self) -> None:
        """Close the idle connections; a request after this raises ``ProtocolError``, and a
        connection in use is closed when its answer ends."""
        self._closed = True
        while self._free:
            self._free.pop().close()


def _head_bytes(lines: list[str]) -> bytes:
    """A request line and its headers, as they go on the wire."""
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _UnsentError(ProtocolError):
    """The request could not be written: the connection was closed under us."""


async def _head(conn: _Conn, message: bytes) -> _Head:
    try:
        conn.writer.write(message)
    except RuntimeError as exc:  # uvloop, on a transport it has closed already
        raise _UnsentError(str(exc)) from None
    try:
        return _parse_head(await conn.reader.readuntil(b"\r\n\r\n"))
    except asyncio.LimitOverrunError:
        raise ProtocolError(f"an answer's head over {STREAM_LIMIT} bytes") from None
