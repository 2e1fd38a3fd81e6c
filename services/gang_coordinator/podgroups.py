"""PodGroup status as Volcano writes it: Pending, Inqueue once sent, Running once
``minMember`` are bound, and the ``Unschedulable`` condition with the reason.

Writes leave the dispatch path: each change records the group's latest status and one
writer task patches it, so a burst of changes to one group is one write.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from shared import kube
from shared.core.model import GangKey

log = logging.getLogger(__name__)

VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"
RETRY_S = 1.0
"""How long a status that could not be written waits before it is tried again."""


class PodGroupStatus:
    """The coordinator's PodGroup status writes (only groups it knows: ``known``)."""

    def __init__(self, api: kube.Client | None) -> None:
        self.api = api
        self.known: set[GangKey] = set()
        self.phase: dict[GangKey, str] = {}
        self.due: dict[GangKey, dict[str, Any]] = {}
        self.wake = asyncio.Event()

    def inqueue(self, key: GangKey) -> None:
        """Its pods went to the allocator (said once per phase change)."""
        if self.phase.get(key) != "Inqueue":
            self._put(key, {"phase": "Inqueue"})

    def pending(self, key: GangKey, unschedulable: str) -> None:
        """The allocator could not place it: the condition says why."""
        now = kube.now_rfc3339()
        condition = {
            "type": "Unschedulable",
            "status": "True",
            "reason": "NotEnoughResources",
            "message": unschedulable[:1024],
            "transitionID": now,
            "lastTransitionTime": now,
        }
        self._put(key, {"phase": "Pending", "conditions": [condition]})

    def running(self, key: GangKey, running: int) -> None:
        """``running`` of its pods are bound, at least ``minMember``."""
        condition = {
            "type": "Scheduled",
            "status": "True",
            "reason": "tasks in gang are ready",
            "lastTransitionTime": kube.now_rfc3339(),
        }
        self._put(key, {"phase": "Running", "running": running, "conditions": [condition]})

    def _put(self, key: GangKey, status: dict[str, Any]) -> None:
        if self.api is None or key not in self.known:
            return
        self.phase[key] = status["phase"]
        self.due[key] = status
        self.wake.set()

    async def writer(self) -> None:
        """Patch each group's latest status, off the dispatch path; one that could not be
        written (the API server restarting) is written again after ``RETRY_S``, unless a
        newer one came meanwhile or the group is gone."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            due, self.due = self.due, {}
            failed = False
            for key, status in due.items():
                assert self.api is not None
                path = f"{VOLCANO}/namespaces/{key.namespace}/podgroups/{key.name}/status"
                if not await kube.patch_status(self.api, path, status) and key in self.known:
                    self.due.setdefault(key, status)
                    failed = True
            if failed:
                await asyncio.sleep(RETRY_S)
                self.wake.set()
