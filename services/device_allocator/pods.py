"""What pods on nodes hold: bound pods followed, releases, reservations that expire.

Assume, then bind (kube-scheduler's cache)::

    reserved --PodUpdated(bound)--> granted (reservation dropped: the pod holds it)
    reserved --AllocationBindFailed / pod deleted / bind timed out--> released
    granted  --PodDeleted--> released

A bound pod is the truth: bound as reserved, its own spec replaces the one reserved;
bound elsewhere, the reservation is released and the pod's grant made, in one statement
(shared/core/ledger.py). A grant not signed with the allocator's key holds nothing (the
pod is told). A reservation the binder has not confirmed within ``BIND_TIMEOUT_S`` is
checked against the API server: bound there, it becomes a grant; otherwise it is
released and the pod is retried. One whose claims hold devices with binding conditions
is given ``scheduler.bindingTimeoutS`` more: its binder waits that long for them
(services/binder/conditions.py), and its devices must not go to another pod meanwhile.
A preempted pod that leaves keeps its devices for the gang it made room for
(shared/core/room.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

import msgspec
from kubernetes_asyncio.client import ApiException

from services.device_allocator import outcomes
from services.device_allocator.reservations import (
    UNSIGNED,
    Reservation,
    Reservations,
    bound_grant,
    rebuild,
)
from services.device_allocator.span import Span
from shared import events as ev
from shared import kube
from shared.core import annotations as ann
from shared.core.dra import binding
from shared.core.ledger import Ledger, PodGrant, Statement
from shared.core.model import NodeName, PodRef, PodUID
from shared.core.room import Room
from shared.core.status import Reason, Status
from shared.runtime import Runtime

log = logging.getLogger(__name__)

BIND_TIMEOUT_S = 30.0
"""A reservation no binder confirmed in this time is checked against the API server."""


def bind_wait_s(r: Reservation, timeout_s: float, binding_timeout_s: float) -> float:
    """How long ``r`` waits for its binder: ``timeout_s``, plus ``binding_timeout_s``
    when a claim allocated with it holds devices with binding conditions (its binder
    waits for them that long: services/binder/conditions.py)."""
    if any(binding.conditioned(c.allocation) for c in r.claims):
        return timeout_s + binding_timeout_s
    return timeout_s


class Pods:
    """The grants of pods on this allocator's nodes, kept as the pods are."""

    def __init__(
        self,
        rt: Runtime,
        api: kube.Client | None,
        ledger: Ledger,
        reserved: Reservations,
        room: Room,
        span: Span,
        mine: Callable[[NodeName], bool],
        key: bytes | None,
        managed: Collection[str],
        on_release: Callable[[PodUID], None] = lambda uid: None,
    ) -> None:
        self.rt = rt
        self._api = api
        self.ledger = ledger
        self.reserved = reserved
        self.room = room
        self.span = span
        self.mine = mine
        self.key = key
        """The grant-signing key: a grant not signed with it holds no device."""
        self.managed = managed
        """Tessera's device names (left out of the node-fit requests of bound pods)."""
        self.on_release = on_release
        """Gives back what the pod's ResourceClaims were assumed to hold (dra.py)."""

    @property
    def api(self) -> kube.Client:
        """The API server (none while the allocator is only built, as in tests)."""
        assert self._api is not None, "the allocator reads pods from the API server"
        return self._api

    async def updated(self, event: ev.PodUpdated) -> None:
        """A pod is on a node: its reservation becomes a grant the pod holds; any other
        scheduler's pod counts there too (requests, ports, labels). A grant not signed
        by Tessera holds nothing."""
        node = event.node
        if node is None:
            return
        if not self.mine(node) and event.pod.uid not in self.ledger.pods:
            return  # on another shard's node
        held = self.ledger.pods.get(event.pod.uid)
        # A grant the ledger holds as it is (reserved here, or checked when first read)
        # is not checked again: a restarted watcher announces every bound pod again.
        known = held is not None and held.node == node and held.containers == event.grants
        if (
            event.grants
            and not known
            and not ann.signed(self.key, event.pod.uid, node, event.grants, event.signature)
        ):
            await self.refuse_forged(event.pod, node)
            event = msgspec.structs.replace(event, grants=())
            held = self.ledger.pods.get(event.pod.uid)
        if (
            held is not None
            and held.node == event.node
            and (not event.grants or held.containers == event.grants)
        ):
            if event.spec is not None:  # as reserved; the pod's own spec is the truth now
                self.ledger.respec(event.pod.uid, event.spec)
        elif held is not None or event.grants or event.spec is not None:
            self._follow(event, node, held)
        if event.pod.uid in self.reserved.open:
            await self.reserved.forget(event.pod.uid)

    def _follow(self, event: ev.PodUpdated, node: NodeName, held: PodGrant | None) -> None:
        """Grant the pod what it holds on ``node``, in place of ``held`` (in one
        statement: the release and the grant, or neither)."""
        with Statement(self.ledger) as st:
            if held is not None:
                log.warning(
                    "pod %s is bound to %s, not as reserved on %s; following the pod",
                    event.pod,
                    node,
                    held.node,
                )
                st.release(event.pod.uid)
            st.grant(
                PodGrant(
                    pod=event.pod,
                    node=node,
                    containers=event.grants,
                    group=held.group if held is not None else None,
                    spec=event.spec or (held.spec if held is not None else None),
                )
            )
            st.commit()

    async def refuse_forged(self, pod: PodRef, node: NodeName) -> None:
        """Tell ``pod`` that its grant annotation on ``node`` was not Tessera's."""
        log.warning("pod %s on %s: %s", pod, node, UNSIGNED)
        await kube.tell(
            self.api,
            pod,
            reason="ForgedGrant",
            kind="Warning",
            message=f"Pod {pod} on {node}: {UNSIGNED}",
            component="tessera-device-allocator",
        )

    async def adopt(self, node: NodeName) -> int:
        """A node that joined this shard: the pods already on it count here now; how
        many there are."""
        found, forged = await rebuild(
            self.ledger, self.api, self.managed, self.key, lambda n: n == node, node=node
        )
        for grant in forged:
            await self.refuse_forged(grant.pod, grant.node)
        return found

    async def bind_failed(self, event: ev.AllocationBindFailed) -> None:
        """The bind failed: release the reservation. A pod bound elsewhere whose
        ``PodUpdated`` came first holds its real grant here now (:meth:`updated`
        followed it and closed the reservation): that one stays."""
        if event.cause == "taken" and event.pod.uid not in self.reserved.open:
            return
        await self.release(event.pod, event.node, f"bind failed: {event.error}")

    async def release(self, pod: PodRef, node: NodeName | None, reason: str) -> None:
        """``pod`` holds nothing any more (deleted, its bind failed or timed out), unless
        it was preempted: its devices are then kept for the gang it made room for. A
        single ledger step: a release cannot be half made."""
        self.span.forget(pod.uid)
        owner = self.room.gone(pod)
        if owner is not None:
            if self.room.all_gone(owner):
                held = self.ledger.pods.get(pod.uid)
                where = held.node if held else node or NodeName("")
                await self.rt.bus.publish(outcomes.kept_for(pod, where, owner))
            return
        grant = self.ledger.release(pod.uid)
        self.on_release(pod.uid)
        if pod.uid in self.reserved.open:
            await self.reserved.forget(pod.uid)
        if grant is not None:
            await self.rt.bus.publish(
                ev.AllocationReleased(pod=pod, node=grant.node, reason=reason)
            )

    async def expire(self, now: float, timeout_s: float = BIND_TIMEOUT_S) -> None:
        """Reservations the binder did not confirm within their :func:`bind_wait_s` of
        ``now``: adopt the bound ones, free the rest."""
        for uid, r in list(self.reserved.open.items()):
            waited = bind_wait_s(r, timeout_s, self.rt.cfg.scheduler.binding_timeout_s)
            if now - r.at >= waited and uid in self.reserved.open:
                await self._expire(r, waited)

    async def _expire(self, r: Reservation, waited: float) -> None:
        pod = r.grant.pod
        try:
            obj = await kube.request(
                self.api, "GET", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"
            )
        except ApiException as exc:
            if exc.status != 404:
                return  # try again next round
            obj = None
        found = None
        if obj and obj["metadata"]["uid"] == pod.uid:
            found = bound_grant(obj, self.managed, self.key)
        if found is not None:
            bound = found[0]
            await self.updated(
                ev.PodUpdated(
                    pod=pod,
                    node=bound.node,
                    grants=bound.containers,
                    spec=bound.spec,
                    signature=(obj or {})["metadata"].get("annotations", {}).get(ann.SIGNATURE, ""),
                )
            )
            return
        log.warning(
            "reservation of %s on %s not bound within %.0fs: released",
            pod,
            r.grant.node,
            waited,
        )
        await self.release(pod, r.grant.node, "bind timed out")
        status = Status(
            reasons=(Reason(kind="waiting", detail="the bind did not happen in time; retrying"),)
        )
        await self.rt.bus.publish(ev.AllocationFailed.of((pod,), status, attempt=r.attempt))
