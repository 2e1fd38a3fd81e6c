"""kube-scheduler's ``status.nominatedNodeName``, as the binder writes it.

When the allocator preempts for a gang, its ``AllocationFailed`` names the node each pod
will go to once the victims are gone (``nominated``), and "" for a pod it makes no room
for any more; kube-scheduler writes the same in the status patch of a pod it could not
place. The binder writes each with one small status patch, so users and autoscalers see
where the pod will go. The API server clears the field when the pod is bound (since
Kubernetes 1.35), so a Binding of a pod waits for that pod's patch still on its way: the
clearing then comes last.
"""

from __future__ import annotations

import asyncio
from collections.abc import Container

from shared import events as ev
from shared import kube
from shared.core.model import NodeName, PodRef, PodUID


class Nominator:
    """Owns the binder's ``nominatedNodeName`` writes, one at a time per pod."""

    def __init__(self) -> None:
        self.writing: dict[PodUID, asyncio.Future[None]] = {}
        """Each pod's latest write still on its way."""

    async def write(
        self, api: kube.Client, event: ev.AllocationFailed, bound: Container[PodUID]
    ) -> None:
        """Write the nominated node of each pod ``event`` names, but of pods ``bound``
        already (their Binding cleared it). Each write is registered before this yields,
        so a Binding of the pod handled after ``event`` waits for it."""
        writes = []
        for pod in event.pods:
            if pod.uid in event.nominated:
                before = self.writing.get(pod.uid)
                done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self.writing[pod.uid] = done
                writes.append(self._one(api, pod, event.nominated[pod.uid], bound, before, done))
        await asyncio.gather(*writes)

    async def _one(
        self,
        api: kube.Client,
        pod: PodRef,
        node: NodeName,
        bound: Container[PodUID],
        before: asyncio.Future[None] | None,
        done: asyncio.Future[None],
    ) -> None:
        try:
            if before is not None:
                await before
            if pod.uid not in bound:
                path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
                await kube.patch_status(api, path, {"nominatedNodeName": node or None})
        finally:
            done.set_result(None)
            if self.writing.get(pod.uid) is done:
                del self.writing[pod.uid]

    async def settled(self, uid: PodUID) -> None:
        """Wait until no write of this pod's nominated node is on its way."""
        pending = self.writing.get(uid)
        if pending is not None:
            await pending
