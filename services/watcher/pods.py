"""The watcher's list and watch of every pod, the pending ones first at a start.

At start (maybe a restart, with a backlog) the pods on no node are listed first, alone,
and the pending ones announced at once and watched from then on, with every change to
any pod; the list of every pod waits until each of them is bound or gone (the backlog
is placed) or :data:`FULL_LIST_WAIT_S` has passed, and starts at once when none waits.
An allocator starting beside it lists every pod too, and the API server took twice as
long to write two such lists at once (140,000 pods on 2 cores, bench/RESULTS.md): the
backlog waited for both. What each pod means is the watcher's (service.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.aio import raise_if_cancelling
from shared.core.model import PodUID

log = logging.getLogger(__name__)

PODS = "/api/v1/pods"
FULL_LIST_WAIT_S = 30.0
"""At start, the longest the list of every pod waits for the backlog (``watch``)."""
WAIT_WATCH_S = 5
"""Meanwhile, the watch is renewed this often (it ends at once on the bind that empties
the backlog)."""
YIELD_EVERY = 256
"""Pods of a list announced between two yields to the event loop: the next page, asked
for already, is read from its socket meanwhile (the API server goes on writing it)."""

OnEvent = Callable[[str, dict[str, Any]], Awaitable[None]]
OnListed = Callable[[set[PodUID]], Awaitable[None]]


class PodWatch:
    """Owns the pods' list-watch and the start's backlog: each pod read goes to
    ``on_event``, and each full list's pods to ``on_listed`` (what it lacks was deleted);
    ``pending`` and ``bound`` are the watcher's (what it announced), read here only to
    choose the backlog and to count in log lines."""

    def __init__(
        self,
        on_event: OnEvent,
        on_listed: OnListed,
        pending: Mapping[PodUID, object],
        bound: Mapping[PodUID, object],
    ) -> None:
        self.on_event = on_event
        self.on_listed = on_listed
        self.pending = pending
        self.bound = bound
        self.relisted = False
        """Whether every pod has been listed once (``relist``)."""
        self.backlog: set[PodUID] = set()
        """At start, the pods pending then and not bound or gone since (``watch``)."""
        self.placed: asyncio.Event | None = None
        """Set once the backlog is empty (``watch``)."""

    async def watch(self, api: kube.Client) -> None:
        """Every pod, listed and watched, the backlog first (the module docstring)."""
        relist = functools.partial(self.relist, api)
        try:
            version = await self._list_unplaced(api)
        except (TimeoutError, ApiException, OSError, kube.GoneError) as exc:
            raise_if_cancelling()
            log.warning("pods on no node not listed (%r): listing every pod", exc)
            version = ""
        if version and self.pending:
            self.backlog = set(self.pending)
            self.placed = asyncio.Event()
            timer = asyncio.get_running_loop().call_later(FULL_LIST_WAIT_S, self.placed.set)
            try:
                await kube.list_watch(
                    api,
                    PODS,
                    self.on_event,
                    relist=relist,
                    since=version,
                    until=self.placed,
                    timeout_s=WAIT_WATCH_S,
                )
            finally:
                timer.cancel()
                self.backlog, self.placed = set(), None
        await kube.list_watch(api, PODS, self.on_event, relist=relist)

    def settled(self, uid: PodUID) -> None:
        """A pod of the backlog at start is bound or gone: once none is left, every pod
        is listed (``watch``)."""
        self.backlog.discard(uid)
        if self.placed is not None and not self.backlog:
            self.placed.set()

    async def relist(self, api: kube.Client) -> str:
        """Every pod, a page at a time (``kube.list_pages``), each page announced while
        the API server writes the next, a pod on a node decoded only as far as it is
        read (``kube.read_pod``); then what the list lacks was deleted. Returns the
        list's resourceVersion, to watch from."""
        stats = kube.ListStats()
        present: set[PodUID] = set()
        read_s = handled_s = 0.0
        with kube.bulk():
            pages = kube.list_pages(api, PODS, msgspec.Raw, stats=stats)
            async for page in pages:
                for i, raw in enumerate(page):
                    if i % YIELD_EVERY == YIELD_EVERY - 1:
                        await asyncio.sleep(0)  # the next page is read meanwhile
                    began = time.monotonic()
                    obj = kube.read_pod(raw)
                    read = time.monotonic()
                    present.add(PodUID(obj.get("metadata", {}).get("uid", "")))
                    await self.on_event("ADDED", obj)
                    read_s += read - began
                    handled_s += time.monotonic() - read
            await self.on_listed(present)
        if not self.relisted:
            log.info("startup phase pod-list: %.2f s (%s)", stats.took_s(), stats)
            log.info(
                "startup phase pod-decode: %.2f s (%d pods, between pages)", read_s, len(present)
            )
            log.info(
                "startup phase announce: %.2f s (%d on nodes, %d pending; between pages)",
                handled_s,
                len(self.bound),
                len(self.pending),
            )
        self.relisted = True
        return stats.resource_version

    async def _list_unplaced(self, api: kube.Client) -> str:
        """The pods on no node, listed alone (the API server filters them from its cache
        without writing the others) and announced; the list's resourceVersion."""
        began = time.monotonic()
        items, version = await kube.list_all(api, PODS, {"fieldSelector": "spec.nodeName="})
        for obj in items:
            await self.on_event("ADDED", obj)
        log.info(
            "startup phase pending-list: %.2f s (%d pods on no node, %d pending announced)",
            time.monotonic() - began,
            len(items),
            len(self.pending),
        )
        return version
