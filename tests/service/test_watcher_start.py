"""The watcher's start (services/watcher/pods.py ``PodWatch.watch``) against a
scripted API server on loopback: the pods on no node are listed alone and the pending
ones announced at once; the pods are watched from that list on; the list of every pod
waits until the backlog is bound, then the watch goes on from that list."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from services.watcher import pods
from services.watcher.service import Watcher
from shared import events as ev
from shared import kube
from shared.config import Config
from shared.metrics import Metrics
from tests.helpers import WATCH_HEAD, answer, read_query, stand_in_api, watch_event

PENDING_RV, FULL_RV = "10", "20"


def pod(name: str, node: str = "", rv: str = "1") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "tessera",
        "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": rv},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def body(items: list[dict[str, Any]], rv: str) -> bytes:
    return json.dumps({"metadata": {"resourceVersion": rv}, "items": items}).encode()


@contextlib.asynccontextmanager
async def api_server(
    asked: list[dict[str, list[str]]], done: asyncio.Event, binds: bool = True
) -> AsyncIterator[kube.Client]:
    """The pods on no node: ``waiting`` (pending); a watch from that list binds it (or,
    not ``binds``, ends at once with nothing, as one that timed out); the list of every
    pod shows ``old`` (bound before the start) and ``waiting`` (bound, or still not); a
    watch from there holds open (and sets ``done``)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                query = await read_query(reader)
                asked.append(query)
                if "watch" not in query:
                    if query.get("fieldSelector") == ["spec.nodeName="]:
                        writer.write(answer(body([pod("waiting")], PENDING_RV)))
                    else:
                        items = [pod("old", "n0"), pod("waiting", "n1" if binds else "", "11")]
                        writer.write(answer(body(items, FULL_RV)))
                    await writer.drain()
                    continue
                writer.write(WATCH_HEAD)
                if query["resourceVersion"] == [FULL_RV]:
                    done.set()
                if query["resourceVersion"] == [PENDING_RV] and not binds:
                    writer.write(b"0\r\n\r\n")  # the watch timed out
                    await writer.drain()
                    continue
                if query["resourceVersion"] == [PENDING_RV]:
                    writer.write(watch_event("MODIFIED", pod("waiting", "n1", "11")))
                await writer.drain()
                await reader.read()  # held open until the client goes
                break
        writer.close()

    async with stand_in_api(serve) as api:
        yield api


class Announced:
    """The watcher's outbox: what it announces, and what the API server was asked by then."""

    def __init__(self, asked: list[dict[str, list[str]]]) -> None:
        self.asked = asked
        self.events: list[tuple[ev.Event, int]] = []

    async def put(self, event: ev.Event) -> None:
        self.events.append((event, len(self.asked)))


async def watched(asked: list[dict[str, list[str]]], *, binds: bool) -> tuple[Watcher, Announced]:
    """A watcher's pod watch against :func:`api_server` until it watches from the list
    of every pod: the watcher, and what it announced."""
    rt = SimpleNamespace(
        cfg=Config(), metrics=Metrics("test"), bus=None, spawn=None, service="watcher"
    )
    done = asyncio.Event()
    async with api_server(asked, done, binds=binds) as api:
        w = Watcher(rt, api)  # type: ignore[arg-type]
        out = Announced(asked)
        w.out = out  # type: ignore[assignment]
        task = asyncio.create_task(w.pods.watch(api))
        try:
            async with asyncio.timeout(10):
                await done.wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return w, out


async def test_the_backlog_is_announced_first_and_every_pod_listed_once_it_is_bound() -> None:
    asked: list[dict[str, list[str]]] = []
    w, out = await watched(asked, binds=True)
    unplaced, first_watch, full, watch = asked[:4]
    assert unplaced["fieldSelector"] == ["spec.nodeName="]
    assert first_watch["resourceVersion"] == [PENDING_RV]
    assert first_watch["timeoutSeconds"] == [str(pods.WAIT_WATCH_S)]
    assert "fieldSelector" not in full
    assert full["limit"] == [str(kube.LIST_PAGE)]
    assert watch["resourceVersion"] == [FULL_RV]
    kinds = [(type(e).__name__, e.pod.name, n) for e, n in out.events if hasattr(e, "pod")]
    # the backlog announced after the first list alone; bound as the watch showed; the
    # pod bound before the start announced with the list of every pod
    assert kinds == [
        ("PodPending", "waiting", 1),
        ("PodUpdated", "waiting", 2),
        ("PodUpdated", "old", 3),
    ]
    assert w.pods.relisted
    assert w.pods.placed is None


async def test_a_backlog_never_bound_holds_the_list_of_every_pod_for_a_while_only(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(pods, "FULL_LIST_WAIT_S", 0.3)
    asked: list[dict[str, list[str]]] = []
    w, out = await watched(asked, binds=False)
    full = [q for q in asked if "watch" not in q and "fieldSelector" not in q]
    assert len(full) == 1
    assert all(q["resourceVersion"] == [PENDING_RV] for q in asked[1 : asked.index(full[0])])
    kinds = [(type(e).__name__, e.pod.name) for e, _ in out.events if hasattr(e, "pod")]
    assert kinds == [("PodPending", "waiting"), ("PodUpdated", "old")]
    assert "u-waiting" in w.pending
