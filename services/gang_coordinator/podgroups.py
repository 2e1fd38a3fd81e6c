"""PodGroup status as Volcano writes it: Pending, Inqueue once sent, Running once
``minMember`` are bound, and the ``Unschedulable`` condition with the reason.

Writes leave the dispatch path: each change records the group's latest status and one
writer task patches it, so a burst of changes to one group is one write.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from kubernetes_asyncio.client import ApiException

from shared import kube
from shared.core.model import GangKey

log = logging.getLogger(__name__)

VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"


class PodGroupStatus:
    """The coordinator's PodGroup status writes (only groups it knows: ``known``)."""

    def __init__(self, api: kube.Client | None) -> None:
        self.api = api
        self.known: set[GangKey] = set()
        self.phase: dict[GangKey, str] = {}
        self.due: dict[GangKey, dict[str, Any]] = {}
        self.wake = asyncio.Event()

    def inqueue(self, key: GangKey) -> None:
        """Its pods went to the allocator."""
        self._set(key, "Inqueue")

    def pending(self, key: GangKey, unschedulable: str) -> None:
        """The allocator could not place it: the condition says why."""
        self._set(key, "Pending", unschedulable=unschedulable)

    def running(self, key: GangKey, running: int) -> None:
        """``running`` of its pods are bound, at least ``minMember``."""
        self._set(key, "Running", running=running)

    def _set(
        self,
        key: GangKey,
        phase: str,
        *,
        unschedulable: str | None = None,
        running: int | None = None,
    ) -> None:
        if self.api is None or key not in self.known:
            return
        if self.phase.get(key) == phase and unschedulable is None and running is None:
            return
        self.phase[key] = phase
        now = kube.now_rfc3339()
        status: dict[str, Any] = {"phase": phase}
        if unschedulable is not None:
            status["conditions"] = [
                {
                    "type": "Unschedulable",
                    "status": "True",
                    "reason": "NotEnoughResources",
                    "message": unschedulable[:1024],
                    "transitionID": now,
                    "lastTransitionTime": now,
                }
            ]
        elif phase == "Running":
            status["conditions"] = [
                {
                    "type": "Scheduled",
                    "status": "True",
                    "reason": "tasks in gang are ready",
                    "lastTransitionTime": now,
                }
            ]
        if running is not None:
            status["running"] = running
        self.due[key] = status
        self.wake.set()

    async def writer(self) -> None:
        """Patch each group's latest status, off the dispatch path."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            due, self.due = self.due, {}
            for key, status in due.items():
                assert self.api is not None
                try:
                    await kube.request(
                        self.api,
                        "PATCH",
                        f"{VOLCANO}/namespaces/{key.namespace}/podgroups/{key.name}/status",
                        {"status": status},
                        content_type="application/merge-patch+json",
                    )
                except ApiException as exc:
                    if exc.status != 404:
                        log.warning("cannot update PodGroup %s status: %s", key, exc.status)
