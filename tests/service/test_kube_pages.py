"""shared/kube.py ``list_pages`` against a scripted API server on loopback: every page
of a list, each decoded as asked, the next one asked for while this one is used; and
``list_watch`` with a ``relist`` of its own watches from the version it returns."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from shared import kube
from tests.helpers import WATCH_HEAD, answer, read_query, stand_in_api, watch_event

PATH = "/api/v1/pods"
PAGES = 3
PER_PAGE = 2


def pod(i: int) -> dict[str, Any]:
    node = {"nodeName": f"n{i}"} if i % 2 else {}
    return {
        "metadata": {"name": f"p{i}", "uid": f"u{i}", "managedFields": [{"manager": "x"}]},
        "spec": {"containers": [{"name": "c", "env": [{"name": "A"}]}], **node},
        "status": {"phase": "Running", "containerStatuses": [{"name": "c"}]},
    }


def page(n: int) -> bytes:
    meta = {"resourceVersion": "42"}
    if n + 1 < PAGES:
        meta["continue"] = f"token-{n + 1}"
    items = [pod(n * PER_PAGE + i) for i in range(PER_PAGE)]
    return json.dumps({"kind": "PodList", "metadata": meta, "items": items}).encode()


@contextlib.asynccontextmanager
async def api_server(asked: list[dict[str, list[str]]]) -> AsyncIterator[kube.Client]:
    """Serves the list's pages by their continue token (noting each request's query);
    a watch streams one ADDED event, then holds open."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                query = await read_query(reader)
                asked.append(query)
                if "watch" in query:
                    writer.write(WATCH_HEAD)
                    writer.write(watch_event("ADDED", pod(99) | {"metadata": {"name": "w"}}))
                    await writer.drain()
                    await reader.read()
                    break
                token = query.get("continue", ["token-0"])[0]
                writer.write(answer(page(int(token.rsplit("-", 1)[1]))))
                await writer.drain()
        writer.close()

    async with stand_in_api(serve) as api:
        yield api


async def test_every_page_decoded_as_asked_the_next_asked_for_meanwhile() -> None:
    asked: list[dict[str, list[str]]] = []
    stats = kube.ListStats()
    seen: list[list[dict[str, Any]]] = []
    async with api_server(asked) as api:
        async for items in kube.list_pages(
            api, PATH, msgspec.Raw, {"fieldSelector": "a=b"}, page=PER_PAGE, stats=stats
        ):
            await asyncio.sleep(0.05)  # a consumer at work: the next page was asked for
            assert len(asked) == min(len(seen) + 2, PAGES)
            seen.append([kube.read_pod(raw) for raw in items])
    assert [q.get("continue") for q in asked] == [None, ["token-1"], ["token-2"]]
    assert all(q["limit"] == [str(PER_PAGE)] and q["fieldSelector"] == ["a=b"] for q in asked)
    pods = [p for items in seen for p in items]
    assert [p["metadata"]["name"] for p in pods] == [f"p{i}" for i in range(PAGES * PER_PAGE)]
    for i, p in enumerate(pods):
        if i % 2:  # on a node: only what is read
            assert "managedFields" not in p["metadata"]
            assert p["spec"]["containers"] == [{"name": "c"}]
            assert p["status"] == {"phase": "Running"}
        else:  # on no node: whole
            assert p == pod(i)
    assert (stats.pages, stats.objects, stats.resource_version) == (PAGES, 6, "42")
    assert stats.size == sum(len(page(n)) for n in range(PAGES))


async def test_a_caller_that_stops_early_leaves_nothing_running() -> None:
    asked: list[dict[str, list[str]]] = []
    async with api_server(asked) as api:
        pages = kube.list_pages(api, PATH, dict[str, Any], page=PER_PAGE)
        async for items in pages:
            assert len(items) == PER_PAGE
            break
        await pages.aclose()
    assert len(asked) <= 2


async def test_a_watch_with_its_own_relist_watches_from_the_version_it_returns() -> None:
    asked: list[dict[str, list[str]]] = []
    listed: list[str] = []
    watched = asyncio.Event()

    async def relist() -> str:
        stats = kube.ListStats()
        async for items in kube.list_pages(api, PATH, msgspec.Raw, page=PER_PAGE, stats=stats):
            listed.extend(kube.read_pod(raw)["metadata"]["name"] for raw in items)
        return stats.resource_version

    async def on_event(kind: str, obj: dict[str, Any]) -> None:
        assert (kind, obj["metadata"]["name"]) == ("ADDED", "w")
        watched.set()

    async with api_server(asked) as api:
        task = asyncio.create_task(kube.list_watch(api, PATH, on_event, relist=relist))
        try:
            async with asyncio.timeout(10):
                await watched.wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert listed == [f"p{i}" for i in range(PAGES * PER_PAGE)]
    assert asked[-1]["watch"] == ["1"]
    assert asked[-1]["resourceVersion"] == ["42"]
