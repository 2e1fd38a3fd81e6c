"""The watcher's mirrored objects: namespaces, PodGroups, Queues and Volcano Jobs.

Each kind is kept as its last announced event by one generic :class:`Mirror`, fed by a
list-watch of its own; Volcano's kinds are watched once their API is served (the CRDs
may come after the watcher: :meth:`Mirrors.watch_volcano`). How each object reads as
an event is translate.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kubernetes_asyncio.client import ApiException

from services.watcher.claims import Spawn
from services.watcher.translate import (
    UNREADABLE,
    job_event,
    namespace_event,
    namespaced,
    object_name,
    podgroup_event,
    queue_event,
)
from shared import events as ev
from shared import kube

log = logging.getLogger(__name__)

VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"
VOLCANO_BATCH = "/apis/batch.volcano.sh/v1alpha1"
DISCOVERY_RETRY_S = 30.0

K = TypeVar("K")
U = TypeVar("U", bound=ev.Event)

Publish = Callable[[ev.Event], Coroutine[Any, Any, None]]


@dataclass
class Mirror(Generic[K, U]):
    """One kind of object as its last announced event: a change is published, a repeat
    is not, a deletion (seen, or missed while relisting) publishes ``deleted(key)``. An
    object that cannot be read is logged and skipped (no pod to tell: the Kubernetes
    Events of shared/kube.py are written on pods)."""

    bus_publish: Publish
    key: Callable[[dict[str, Any]], K]
    update: Callable[[dict[str, Any]], U]
    deleted: Callable[[K, dict[str, Any]], ev.Event]
    known: dict[K, U] = field(default_factory=dict)
    what: str = "object"
    """What the objects are, for log lines (``Job``)."""

    async def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        """One object added, changed or deleted, as its watch saw it."""
        try:
            key = self.key(obj)
            update = None if kind == "DELETED" else self.update(obj)
        except UNREADABLE as exc:
            log.warning(
                "%s %s cannot be read (%r); skipped until it changes",
                self.what,
                object_name(obj),
                exc,
            )
            return
        if update is None:
            if self.known.pop(key, None) is not None:
                await self.bus_publish(self.deleted(key, obj))
            return
        if ev.changed(self.known.get(key), update):
            self.known[key] = update
            await self.bus_publish(update)

    async def on_relist(self, items: list[dict[str, Any]]) -> None:
        """A full list: the objects known here that it lacks were deleted meanwhile."""
        present = set()
        for obj in items:
            try:
                present.add(self.key(obj))
            except UNREADABLE:
                continue  # on_event says why
        for key in set(self.known) - present:
            await self.bus_publish(self.deleted(key, {}))
            del self.known[key]
        for obj in items:
            await self.on_event("ADDED", obj)


@dataclass
class Mirrors:
    """Owns the four mirrored kinds, each announced through one ``publish``."""

    namespaces: Mirror[str, ev.NamespaceUpdated]
    podgroups: Mirror[tuple[str, str], ev.PodGroupUpdated]
    queues: Mirror[str, ev.QueueUpdated]
    jobs: Mirror[tuple[str, str], ev.JobUpdated]

    @classmethod
    def publishing(cls, publish: Publish) -> Mirrors:
        """The four mirrors, each announcing its changes through ``publish``."""
        return cls(
            namespaces=Mirror(
                publish,
                lambda o: str(o["metadata"]["name"]),
                namespace_event,
                lambda k, _: ev.NamespaceUpdated(name=k),
                what="Namespace",
            ),
            podgroups=Mirror(
                publish,
                namespaced,
                podgroup_event,
                lambda k, _: ev.PodGroupDeleted(namespace=k[0], name=k[1]),
                what="PodGroup",
            ),
            queues=Mirror(
                publish,
                lambda o: str(o["metadata"]["name"]),
                queue_event,
                lambda k, _: ev.QueueDeleted(name=k),
                what="Queue",
            ),
            jobs=Mirror(
                publish,
                namespaced,
                job_event,
                lambda k, o: ev.JobDeleted(
                    namespace=k[0], name=k[1], uid=(o.get("metadata") or {}).get("uid", "")
                ),
                what="Job",
            ),
        )

    def watch_namespaces(self, api: kube.Client) -> Coroutine[Any, Any, None]:
        """List and watch every namespace (the watcher runs it as a task)."""
        return kube.list_watch(
            api,
            "/api/v1/namespaces",
            self.namespaces.on_event,
            on_relist=self.namespaces.on_relist,
        )

    async def watch_volcano(self, api: kube.Client, spawn: Spawn) -> None:
        """Watch PodGroups, Queues and Jobs once their API is served (the CRDs may come
        later)."""
        while True:
            try:
                await kube.request(api, "GET", VOLCANO)
                break
            except ApiException as exc:
                if exc.status != 404:
                    raise
            await asyncio.sleep(DISCOVERY_RETRY_S)
        for path, mirror in (
            (f"{VOLCANO}/podgroups", self.podgroups),
            (f"{VOLCANO}/queues", self.queues),
            (f"{VOLCANO_BATCH}/jobs", self.jobs),
        ):
            spawn(
                kube.list_watch(api, path, mirror.on_event, on_relist=mirror.on_relist),
                f"watch-{path.rsplit('/', 1)[1]}",
            )
        log.info("watching Volcano PodGroups, Queues and Jobs")

    def known(self) -> list[ev.Event]:
        """What a resync announces again: every Queue, PodGroup and Job, in that order."""
        return [
            *self.queues.known.values(),
            *self.podgroups.known.values(),
            *self.jobs.known.values(),
        ]
