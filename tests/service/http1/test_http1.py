"""shared/http1.py against a scripted HTTP server on loopback: the answers and failures a
real API server gives only now and then (a kept connection closed while idle, an answer
cut short, chunked bodies arriving piece by piece, a proxy in between). Every service's
API call goes through this client; the integration tests use it against the real API
server."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from shared.http1 import Pool, ProtocolError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@dataclass
class Server:
    """A loopback server running ``handler`` on each connection (numbered from 0)."""

    handler: Handler
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    port: int = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = self.connections
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await self.handler(reader, writer, n)
        writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return head + body


@contextlib.asynccontextmanager
async def serving(handler: Callable[[Server], Handler]) -> AsyncIterator[Server]:
    server = Server(lambda r, w, n: asyncio.sleep(0))
    server.handler = handler(server)
    listener = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    async with listener:
        yield server


def ok(body: bytes, *extra: str) -> bytes:
    headers = "".join(f"{h}\r\n" for h in extra)
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode() + body


def keep_answering(*answers: bytes) -> Callable[[Server], Handler]:
    """Each request on a connection gets the next answer; the connection stays open."""

    def handler(server: Server) -> Handler:
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
            for answer in answers:
                await server.read_request(r)
                w.write(answer)
                await w.drain()
            await r.read()

        return serve

    return handler


def answer_then_close(answer: bytes) -> Callable[[Server], Handler]:
    """Each connection: one request, ``answer``, then the connection closed."""

    def handler(server: Server) -> Handler:
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
            await server.read_request(r)
            w.write(answer)
            await w.drain()

        return serve

    return handler


def chunked_until(
    gate: asyncio.Event, first: bytes, then: bytes = b""
) -> Callable[[Server], Handler]:
    """A chunked answer: ``first`` (the head and a chunk) at once, ``then`` once ``gate``
    is set, the rest never (the connection stays open until the client closes it)."""

    def handler(server: Server) -> Handler:
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
            await server.read_request(r)
            w.write(first)
            await w.drain()
            await gate.wait()
            w.write(then)
            await w.drain()
            await r.read()

        return serve

    return handler


async def test_content_length_and_keep_alive() -> None:
    async with serving(keep_answering(ok(b'{"a":1}'), ok(b"two"))) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=4)
        first = await pool.request("POST", "/x", {"A": "b"}, b'{"q":1}')
        second = await pool.request("GET", pool.target("/y z", {"k": "v w"}), {})
        await pool.close()
    assert (first.status, first.reason, first.body) == (200, "OK", b'{"a":1}')
    assert second.body == b"two"
    assert server.connections == 1  # kept alive
    assert server.requests[0].startswith(b"POST /x HTTP/1.1\r\n")
    assert b"\r\nA: b\r\n" in server.requests[0]
    assert server.requests[0].endswith(b'{"q":1}')
    assert server.requests[1].startswith(b"GET /y%20z?k=v+w HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}".encode() in server.requests[1]


async def test_chunked_body_and_trailers() -> None:
    chunked = (
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nX-Trailer: 1\r\n\r\n"
    )
    async with serving(keep_answering(chunked, ok(b"next"))) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=1)
        first = await pool.request("GET", "/", {})
        second = await pool.request("GET", "/", {})
    assert (first.status, first.body, second.body) == (201, b"abcdefg", b"next")
    assert server.connections == 1


async def test_connection_close_reads_to_eof_and_does_not_reuse() -> None:
    close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end"
    async with serving(answer_then_close(close)) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=1)
        assert (await pool.request("GET", "/", {})).body == b"to the end"
        assert (await pool.request("GET", "/", {})).body == b"to the end"
    assert server.connections == 2


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
async def test_kept_connection_closed_while_idle_is_replaced_and_the_request_sent_again(
    reset: bool,
) -> None:
    """The API server closes idle connections; the request that finds one closed (or
    reset) goes out on a new connection, once, and succeeds."""

    def handler(server: Server) -> Handler:
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
            await server.read_request(r)
            w.write(ok(f"conn {n}".encode()))
            await w.drain()
            if reset:  # a reset, not a FIN, when closed
                sock = w.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            # then close, as an idle timeout would

        return serve

    async with serving(handler) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=1)
        assert (await pool.request("POST", "/", {}, b"1")).body == b"conn 0"
        await asyncio.sleep(0.05)  # the close reaches us
        assert (await pool.request("POST", "/", {}, b"2")).body == b"conn 1"
    assert server.connections == 2
    assert len(server.requests) == 2  # the second request was read once


async def test_answer_cut_short_is_an_error_not_a_retry() -> None:
    short = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"
    async with serving(answer_then_close(short)) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=1)
        with pytest.raises(ProtocolError):
            await pool.request("POST", "/", {}, b"x")
        assert server.connections == 1

    def head_cut_short(server: Server) -> Handler:
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
            await server.read_request(r)
            w.write(ok(b"a"))
            await server.read_request(r)
            w.write(b"HTTP/1.1 200")
            await w.drain()

        return serve

    # a head cut short on a kept connection: also an error, never sent twice
    async with serving(head_cut_short) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=1)
        await pool.request("GET", "/", {})
        with pytest.raises(ProtocolError):
            await pool.request("POST", "/", {}, b"x")
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.1 answer"),
        (b"HTTP/1.1 OK 200\r\n\r\n", "not an HTTP/1.1 answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n", "not an HTTP/1.1 answer"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-3\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    ],
    ids=["not-http", "no-status", "negative-length", "negative-chunk", "bad-chunk"],
)
async def test_what_is_not_http_is_a_protocol_error(answer: bytes, says: str) -> None:
    async with serving(keep_answering(answer)) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=1)
        with pytest.raises(ProtocolError, match=re.escape(says)):
            await pool.request("GET", "/", {})
        assert not pool._free  # never kept


async def test_idle_connections_are_dropped_before_the_server_would() -> None:
    async with serving(keep_answering(ok(b"1"), ok(b"2"))) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=1, idle_s=0.05)
        await pool.request("GET", "/", {})
        await asyncio.sleep(0.1)
        await pool.request("GET", "/", {})
    assert server.connections == 2


async def test_at_most_limit_connections() -> None:
    gate = asyncio.Event()

    def handler(server: Server) -> Handler:
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
            while True:
                await server.read_request(r)
                await gate.wait()
                w.write(ok(b"."))
                await w.drain()

        return serve

    async with serving(handler) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=3)
        calls = [asyncio.create_task(pool.request("GET", "/", {})) for _ in range(10)]
        await asyncio.sleep(0.1)
        assert server.connections == 3
        gate.set()
        await asyncio.gather(*calls)
        await pool.close()
    assert server.connections == 3
    assert len(server.requests) == 10


async def test_timeout_closes_the_connection() -> None:
    def handler(server: Server) -> Handler:
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
            await server.read_request(r)
            if n == 0:
                await r.read()  # no answer before the client gives up
                return
            w.write(ok(b"fresh"))
            await w.drain()
            await r.read()

        return serve

    async with serving(handler) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=1)
        with pytest.raises(TimeoutError):
            await pool.request("GET", "/", {}, timeout_s=0.1)
        # the late answer can never be read as the next request's
        assert (await pool.request("GET", "/", {})).body == b"fresh"
    assert server.connections == 2


async def test_stream_yields_chunks_as_they_come_and_an_early_exit_closes() -> None:
    step = asyncio.Event()
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nline1\n\r\n"
    async with serving(chunked_until(step, head, b"6\r\nline2\n\r\n")) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=1)
        seen = []
        async with pool.stream("GET", "/watch", {}, timeout_s=5) as answer:
            assert answer.status == 200
            async for chunk in answer.chunks():
                seen.append(chunk)
                if len(seen) == 1:
                    step.set()  # the second comes only after the first was read
                else:
                    break
        assert seen == [b"line1\n", b"line2\n"]
        assert not pool._free  # not finished: never reused
        async with pool.stream("GET", "/watch", {}, timeout_s=5) as answer:
            assert answer.status == 200
    assert server.connections == 2


async def test_through_an_http_connect_proxy() -> None:
    async with serving(keep_answering(ok(b"behind"), ok(b"again"))) as server:
        asked: list[bytes] = []

        async def proxy(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            head = await r.readuntil(b"\r\n\r\n")
            asked.append(head.split(b"\r\n")[0])
            up_r, up_w = await asyncio.open_connection("127.0.0.1", server.port)
            w.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                while data := await src.read(65536):
                    dst.write(data)
                dst.close()

            await asyncio.gather(pipe(r, up_w), pipe(up_r, w), return_exceptions=True)

        listener = await asyncio.start_server(proxy, "127.0.0.1", 0)
        proxy_port = listener.sockets[0].getsockname()[1]
        async with listener:
            pool = Pool(
                f"http://127.0.0.1:{server.port}",
                None,
                limit=1,
                proxy=f"http://127.0.0.1:{proxy_port}",
            )
            assert (await pool.request("GET", "/", {})).body == b"behind"
            assert (await pool.request("GET", "/", {})).body == b"again"
            await pool.close()
    assert asked == [f"CONNECT 127.0.0.1:{server.port} HTTP/1.1".encode()]


def test_refuses_what_it_cannot_speak() -> None:
    with pytest.raises(ValueError, match="http"):
        Pool("ftp://x", None, limit=1)
    with pytest.raises(ValueError, match="proxies"):
        Pool("https://x", None, limit=1, proxy="socks5://p:1080")


def test_a_server_url_with_a_path_prefix_or_an_ipv6_host() -> None:
    """A kubeconfig's server may sit behind a prefix (a proxy of many clusters) or be an
    IPv6 address."""
    prefixed = Pool("https://rancher.example/k8s/clusters/c-1/", None, limit=1)
    assert prefixed.target("/api/v1/pods", {"limit": "1"}) == (
        "/k8s/clusters/c-1/api/v1/pods?limit=1"
    )
    assert prefixed.authority == "rancher.example:443"
    assert prefixed.tls is not None  # https: TLS, with the system's defaults if none given
    ipv6 = Pool("https://[::1]:6443", None, limit=1)
    assert (ipv6.host, ipv6.authority) == ("::1", "[::1]:6443")
    assert ipv6.target("/api") == "/api"


@pytest.mark.parametrize(("method", "replayed"), [("GET", True), ("POST", False)])
async def test_a_request_the_server_may_have_read_is_sent_again_only_if_idempotent(
    method: str, replayed: bool
) -> None:
    """A kept connection that closes after the request went out, before any answer: the
    server may have acted on it (and died), so only an idempotent request goes again."""

    def handler(server: Server) -> Handler:
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> None:
            await server.read_request(r)
            w.write(ok(b"first"))
            await w.drain()
            if n == 0:
                await server.read_request(r)  # read, then gone without an answer
                return
            await r.read()

        return serve

    async with serving(handler) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=1)
        await pool.request(method, "/", {}, b"1")
        if replayed:
            assert (await pool.request(method, "/", {}, b"2")).body == b"first"
        else:
            with pytest.raises(ProtocolError):
                await pool.request(method, "/", {}, b"2")
        await pool.close()
    assert [r.endswith(b"2") for r in server.requests] == [False, True] + [True] * replayed


async def test_a_malformed_answer_on_a_kept_connection_is_not_sent_again() -> None:
    async with serving(keep_answering(ok(b"a"), b"HTTP/1.1 abc\r\n\r\n")) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=1)
        await pool.request("GET", "/", {})
        with pytest.raises(ProtocolError, match="not an HTTP"):
            await pool.request("GET", "/", {})
        await pool.close()
    assert len(server.requests) == 2
    assert server.connections == 1


async def test_a_stream_times_its_reads_not_what_the_caller_does_between_them() -> None:
    """A watch handler slower than the watch's deadline is not cancelled half-way (the
    event would be lost); the next read after the deadline is the one that fails."""
    more = asyncio.Event()
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\na\n\r\n"
    async with serving(chunked_until(more, head)) as server:
        pool = Pool(f"http://127.0.0.1:{server.port}", None, limit=1)
        handled = []

        async def watch() -> None:
            async with pool.stream("GET", "/watch", {}, timeout_s=0.2) as answer:
                async for chunk in answer.chunks():
                    await asyncio.sleep(0.4)  # a slow handler, past the deadline
                    handled.append(chunk)

        with pytest.raises(TimeoutError):
            await watch()
        more.set()
    assert handled == [b"a\n"]


async def test_proxy_credentials_and_a_proxy_that_hangs_up() -> None:
    heads: list[bytes] = []

    async def proxy(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        heads.append(await r.readuntil(b"\r\n\r\n"))
        w.close()  # no answer

    listener = await asyncio.start_server(proxy, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    async with listener:
        pool = Pool(
            "http://api.example:8080",
            None,
            limit=1,
            proxy=f"http://al%40ice:s3cr3t@127.0.0.1:{port}",
        )
        with pytest.raises(ProtocolError, match="proxy"):
            await pool.request("GET", "/", {})
    assert (
        f"Proxy-Authorization: Basic {base64.b64encode(b'al@ice:s3cr3t').decode()}".encode()
        in (heads[0])
    )
    assert heads[0].startswith(b"CONNECT api.example:8080 HTTP/1.1\r\n")
