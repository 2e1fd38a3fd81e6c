"""shared/kube.py ``list_watch`` against a scripted API server on loopback: an API server
that answers a watch with 429 (its watch cache still filling, as for a CRD just made)
is routine for a few answers in a row, logged at INFO; a run of them warns."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from shared import kube
from tests.helpers import stand_in_api

PATH = "/api/v1/namespaces/default/configmaps"
LISTED = json.dumps({"items": [], "metadata": {"resourceVersion": "5"}}).encode()
EVENT = json.dumps(
    {"type": "ADDED", "object": {"metadata": {"name": "cm", "resourceVersion": "6"}}}
).encode()
REFUSED = b'{"kind":"Status","code":429,"message":"storage is (re)initializing"}'


def answer(status: str, body: bytes) -> bytes:
    """A whole HTTP/1.1 answer with a JSON body; the connection stays open."""
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@contextlib.asynccontextmanager
async def api_server(refusals: int) -> AsyncIterator[kube.Client]:
    """Lists an empty collection; answers its first ``refusals`` watches with 429, then
    streams one ADDED event and holds the watch open."""
    left = refusals

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal left
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if b"watch=1" not in head.split(b"\r\n", 1)[0]:
                    writer.write(answer("200 OK", LISTED))
                elif left:
                    left -= 1
                    writer.write(answer("429 Too Many Requests", REFUSED))
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    writer.write(b"%x\r\n%s\n\r\n" % (len(EVENT) + 1, EVENT))
                    await writer.drain()
                    await reader.read()  # held open until the client goes
                    break
                await writer.drain()
        writer.close()

    async with stand_in_api(serve) as api:
        yield api


@pytest.mark.parametrize("refusals", [kube.ROUTINE_WAITS, kube.ROUTINE_WAITS + 2])
async def test_a_watch_told_to_wait_logs_a_few_refusals_at_info_and_warns_of_a_run(
    refusals: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="shared.kube")
    seen = asyncio.Event()

    async def on_event(_kind: str, _obj: dict[str, Any]) -> None:
        seen.set()

    async def on_relist(_items: list[dict[str, Any]]) -> None:
        return None

    async with api_server(refusals) as api:
        watch = asyncio.create_task(
            kube.list_watch(api, PATH, on_event, on_relist=on_relist, max_backoff_s=0.01)
        )
        try:
            async with asyncio.timeout(10):
                await seen.wait()
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
    levels = [r.levelname for r in caplog.records if r.getMessage().startswith("watch of")]
    routine = min(refusals, kube.ROUTINE_WAITS)
    assert levels == ["INFO"] * routine + ["WARNING"] * (refusals - routine)
