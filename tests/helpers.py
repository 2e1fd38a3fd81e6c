"""Waiting for a real server to reach a state, with a deadline and a clear failure."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import aiohttp
from kubernetes_asyncio import client

from shared import kube

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    timeout_s: float = 30.0,
    interval_s: float = 0.1,
    what: str = "condition",
) -> T:
    """Call ``probe`` until it returns a truthy value; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {last!r})")


async def readyz(port: int) -> str | None:
    """A local service's ``/readyz`` text when it answers 200 (shared/health.py), else
    None (not ready, or not listening yet)."""
    with contextlib.suppress(aiohttp.ClientError):
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/readyz") as answer,
        ):
            text = await answer.text()
            return text if answer.status == 200 else None
    return None


Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def stand_in_api(serve: Serve) -> AsyncIterator[kube.Client]:
    """A client of a stand-in API server on loopback whose every connection ``serve``
    answers (raw HTTP/1.1: what a test needs the real one to do at a given moment)."""
    listener = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    async with (
        listener,
        kube.Client(client.Configuration(host=f"http://127.0.0.1:{port}"), 4) as api,
    ):
        yield api


async def read_query(reader: asyncio.StreamReader) -> dict[str, list[str]]:
    """The query of the next request on a stand-in API server's connection, parsed
    (``parse_qs``); IncompleteReadError once the client has gone."""
    head = await reader.readuntil(b"\r\n\r\n")
    target = head.split(b"\r\n", 1)[0].split(b" ")[1].decode()
    return parse_qs(urlsplit(target).query)


def answer(body: bytes) -> bytes:
    """A whole 200 answer of a stand-in API server with the JSON ``body``; the
    connection stays open."""
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


WATCH_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
"""The head of a stand-in API server's watch answer; each event follows as one chunk
(``watch_event``), and an empty chunk (``0\\r\\n\\r\\n``) ends the watch."""


def watch_event(kind: str, obj: dict[str, Any]) -> bytes:
    """One watch event (``ADDED``, ``MODIFIED``...) of ``obj`` as the chunk that carries it."""
    line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
    return b"%x\r\n%s\r\n" % (len(line), line)
