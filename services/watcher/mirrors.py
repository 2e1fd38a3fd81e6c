"""The watcher's mirrored objects: namespaces, PodGroups, Queues, Volcano Jobs and
HyperNodes.

Each kind is kept as its last announced event by one generic :class:`Mirror`, fed by a
list-watch of its own; Volcano's kinds are watched once their API is served (the CRDs
may come after the watcher: :meth:`Mirrors.watch_volcano`, and for HyperNodes
:meth:`Mirrors.watch_topology`). How each object reads as an event is translate.py's.
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
    hypernode_event,
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
VOLCANO_TOPOLOGY = "/apis/topology.volcano.sh/v1alpha1"
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
    """Owns the mirrored kinds, each announced through one ``publish``."""

    namespaces: Mirror[str, ev.NamespaceUpdated]
    podgroups: Mirror[tuple[str, str], ev.PodGroupUpdated]
    queues: Mirror[str, ev.QueueUpdated]
    jobs: Mirror[tuple[str, str], ev.JobUpdated]
    hypernodes: Mirror[str, ev.HyperNodeUpdated]

    @classmethod
    def publishing(cls, publish: Publish) -> Mirrors:
        """The mirrors, each announcing its changes through ``publish``."""
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
            hypernodes=Mirror(
                publish,
                lambda o: str(o["metadata"]["name"]),
                hypernode_event,
                lambda k, _: ev.HyperNodeDeleted(name=k),
                what="HyperNode",
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
        await _served(api, VOLCANO)
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

    async def watch_topology(self, api: kube.Client, spawn: Spawn) -> None:
        """Watch HyperNodes once their API is served (a cluster may never have it)."""
        await _served(api, VOLCANO_TOPOLOGY)
        mirror = self.hypernodes
        spawn(
            kube.list_watch(
                api, f"{VOLCANO_TOPOLOGY}/hypernodes", self._hypernode, on_relist=mirror.on_relist
            ),
            "watch-hypernodes",
        )
        log.info("watching Volcano HyperNodes")

    async def _hypernode(self, kind: str, obj: dict[str, Any]) -> None:
        """A HyperNode's change, mirrored; one that breaks a rule is said in the log (no
        pod to tell: the webhook refuses it where it runs)."""
        await self.hypernodes.on_event(kind, obj)
        known = self.hypernodes.known.get(str((obj.get("metadata") or {}).get("name")))
        if kind != "DELETED" and known is not None and known.invalid:
            log.warning("%s; what can be read of it is used", known.invalid)

    def known(self) -> list[ev.Event]:
        """What a resync announces again: every HyperNode, Queue, PodGroup and Job, in that
        order."""
        return [
            *self.hypernodes.known.values(),
            *self.queues.known.values(),
            *self.podgroups.known.values(),
            *self.jobs.known.values(),
        ]


async def _served(api: kube.Client, group: str) -> None:
    """Return once the API server serves ``group`` (an API path), asking every
    ``DISCOVERY_RETRY_S``."""
    while True:
        try:
            await kube.request(api, "GET", group)
            return
        except ApiException as exc:
            if exc.status != 404:
                raise
        await asyncio.sleep(DISCOVERY_RETRY_S)
