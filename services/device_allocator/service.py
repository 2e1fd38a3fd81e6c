"""The device-allocator: the single writer of the device ledger.

Only the replica holding the ``device-allocator`` lease acts; others wait as standbys.
On taking the lease it rebuilds the ledger from what is durable (reservations.py): node
inventories (KV), the grant annotations of bound pods, and its own reservations of
decided-but-not-yet-bound pods, so a restart never double-books.

Assume, then bind (kube-scheduler's cache)::

    GangReady --place--> reserved (ledger + reservation KV) --AllocationDecided--> binder
        reserved --PodUpdated(bound)--> granted (reservation dropped: the pod holds it)
        reserved --BindFailed / pod deleted / bind timed out--> released
        granted  --PodDeleted--> released

A reservation the binder has not confirmed within ``BIND_TIMEOUT_S`` is checked against
the API server: bound there, it becomes a grant; otherwise it is released and the pod is
retried. A gang that does not fit may come with victims; room.py makes room for it.

Handlers overlap only in their I/O (reservation KV writes, publishing decisions): each
one's ledger work runs before its first await, and handlers start in stream order, so
the ledger sees events in order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Coroutine
from typing import Any

import msgspec
from kubernetes_asyncio.client import ApiException

from services.device_allocator.metrics import AllocatorMetrics
from services.device_allocator.reservations import (
    UNSIGNED,
    Reservation,
    Reservations,
    rebuild,
)
from services.device_allocator.reservations import bound_grant as read_bound_grant
from services.device_allocator.room import Room
from services.device_allocator.views import explain_view, ledger_view
from shared import busauth, kube
from shared import events as ev
from shared.config import SchedulerConfig, grant_key
from shared.core import annotations as ann
from shared.core.hosts import node_spec
from shared.core.ledger import Ledger, PodGrant
from shared.core.model import GangKey, NodeName, PodRef
from shared.core.placement import GangMember, PlacementConfig, Placer
from shared.core.request import ResourceTable
from shared.core.status import Reason, Status
from shared.runtime import Runtime, Service, ViewHandler, handles
from shared.telemetry import span
from shared.views import (
    VIEW_EXPLAIN_SUBJECT,
    VIEW_LEDGER_SUBJECT,
    ExplainQuery,
    ExplainView,
    LedgerQuery,
    LedgerView,
)

log = logging.getLogger(__name__)

BIND_TIMEOUT_S = 30.0
ALLOCATOR_CONCURRENCY = 32
"""Events whose I/O may be in flight at once (see the module docstring)."""


def placement_config(s: SchedulerConfig) -> PlacementConfig:
    """The core's policy knobs, each read from the ``scheduler:`` key of its name."""
    return PlacementConfig(
        **{f.name: getattr(s, f.name) for f in dataclasses.fields(PlacementConfig)}
    )


class Allocator(Service):
    """Owns the ledger: places gangs, reserves, releases; one active replica."""

    NAME = "device-allocator"
    ACK_WAIT_S = 10.0

    def __init__(self, rt: Runtime, api: kube.Client | None) -> None:
        super().__init__(rt, api)
        self.ledger = Ledger(rt.cfg.devices, {o.name: o for o in rt.cfg.node_configs})
        self.placer = Placer(self.ledger, placement_config(rt.cfg.scheduler))
        self.room = Room(self.placer)
        self.reservations: Reservations | None = None
        self.key = grant_key(rt.cfg)
        """The grant-signing key: a grant not signed with it holds no device."""
        self.managed = frozenset(ResourceTable.build(rt.cfg.devices).by_name)
        """Tessera's device names (left out of the node-fit requests of bound pods)."""
        self.refused: dict[NodeName, str] = {}
        self.cordons: dict[NodeName, tuple[str, ...]] = {}
        self.applied: dict[NodeName, ev.NodeInventory] = {}
        self.stats = AllocatorMetrics(rt.metrics, self.ledger)

    def concurrency(self) -> int:
        return ALLOCATOR_CONCURRENCY

    @property
    def reserved(self) -> Reservations:
        assert self.reservations is not None, "start() opens the reservations"
        return self.reservations

    async def start(self) -> None:
        """The ledger from node inventories, bound pods' grants and open reservations."""
        self.reservations = Reservations(await self.rt.bus.bucket(busauth.RESERVATION_BUCKET))
        namespaces, _ = await kube.list_all(self.api, "/api/v1/namespaces")
        for ns in namespaces:
            meta = ns["metadata"]
            self.ledger.hosts.set_namespace(meta["name"], meta.get("labels") or {})
        nodes, _ = await kube.list_all(self.api, "/api/v1/nodes")
        for node in nodes:
            self.cordons[NodeName(node["metadata"]["name"])] = ann.cordoned_devices(
                node["metadata"].get("annotations") or {}
            )
            self.ledger.set_spec(node_spec(node))
        for inventory in (await self.rt.bus.inventories()).values():
            self.on_inventory_event(inventory)
        bound, forged = await rebuild(self.ledger, self.api, self.managed, self.key)
        for grant in forged:
            await self._refuse_forged(grant.pod, grant.node)
        reserved = await self.reserved.load(self.ledger)
        log.info(
            "ledger rebuilt: %d nodes, %d devices, %d bound pods, %d reservations",
            len(self.ledger.nodes),
            self.ledger.device_count(),
            bound,
            reserved,
        )

    def tasks(self) -> dict[str, Coroutine[Any, Any, None]]:
        return {
            "expire-reservations": self.expire_loop(),
            "reconcile-inventory": self.reconcile_loop(),
        }

    def views(self) -> dict[str, ViewHandler]:
        return {
            VIEW_LEDGER_SUBJECT: self.ledger_view,
            VIEW_EXPLAIN_SUBJECT: self.explain_view,
        }

    async def ledger_view(self, payload: bytes) -> LedgerView:
        query = msgspec.json.decode(payload, type=LedgerQuery) if payload else LedgerQuery()
        return ledger_view(self.ledger, self.reserved.open, self.refused, query, self.rt.instance)

    async def explain_view(self, payload: bytes) -> ExplainView:
        return explain_view(self.placer, msgspec.json.decode(payload, type=ExplainQuery))

    # --- nodes ------------------------------------------------------------------------

    @handles(ev.NodeInventory)
    async def on_inventory(self, event: ev.NodeInventory) -> None:
        """A node's devices (refused when it runs another config)."""
        self.on_inventory_event(event)

    def on_inventory_event(self, inv: ev.NodeInventory) -> None:
        self.applied[inv.node] = inv
        self.ledger.set_plugin_node(inv.node, inv.device_plugin)
        if inv.config_hash != self.rt.config_hash:
            if self.refused.get(inv.node) != inv.config_hash:
                log.error(
                    "node %s runs config %s, this allocator %s: no placement there until "
                    "both load the same tessera.yaml",
                    inv.node,
                    inv.config_hash,
                    self.rt.config_hash,
                )
            self.refused[inv.node] = inv.config_hash
            self.ledger.remove_node(inv.node)
            return
        self.refused.pop(inv.node, None)
        self.ledger.set_node(inv.node, inv.devices, self.cordons.get(inv.node, ()))

    @handles(ev.NodeUpdated)
    async def on_node(self, event: ev.NodeUpdated) -> None:
        """A Node's labels, taints, allocatable and cordon; devices it cordons take no
        new work."""
        if event.spec is not None:
            self.ledger.set_spec(event.spec)
        self.cordons[event.node] = event.cordoned_devices
        self.ledger.set_cordoned(event.node, event.cordoned_devices)

    @handles(ev.NodeDeleted)
    async def on_node_deleted(self, event: ev.NodeDeleted) -> None:
        """Nothing more is placed on a deleted node."""
        self.ledger.forget_node(event.node)
        self.applied.pop(event.node, None)
        self.refused.pop(event.node, None)

    @handles(ev.NamespaceUpdated)
    async def on_namespace(self, event: ev.NamespaceUpdated) -> None:
        """A namespace's labels, for affinity terms that select namespaces."""
        self.ledger.hosts.set_namespace(event.name, event.labels)

    async def reconcile_loop(self) -> None:
        """Every heartbeat, apply any node whose KV inventory differs from what the ledger
        has: a missed or lost inventory event heals within one heartbeat."""
        async for latest in self.rt.bus.inventory_heartbeats(self.rt.cfg.scheduler.heartbeat_s):
            for inv in latest.values():
                known = self.applied.get(inv.node)
                if known is None or (known.devices, known.config_hash) != (
                    inv.devices,
                    inv.config_hash,
                ):
                    log.info("inventory of %s taken from the KV (its event was missed)", inv.node)
                    self.on_inventory_event(inv)

    # --- gangs ------------------------------------------------------------------------

    @handles(ev.GangReady)
    async def on_gang(self, gang: ev.GangReady) -> None:
        """Place the gang all-or-nothing, reserve it, and publish a decision per pod (or
        why not, with room made for it where it may)."""
        key = gang.gang.key
        members = []
        decided: list[ev.Event] = []
        for p in gang.members:
            held = self.ledger.pods.get(p.pod.uid)
            if held is not None:  # decided before (a redelivery): say it again
                decided.append(self._decided(held, gang))
            else:
                group = GangKey(namespace=p.pod.namespace, name=p.group) if p.group else None
                members.append(GangMember(pod=p.pod, request=p.request, group=group, spec=p.spec))
        failed: list[ev.AllocationFailed] = []
        if members:
            with span(f"place {key}") as current:
                current.set_attribute("tessera.service", self.rt.service)
                current.set_attribute("tessera.gang.size", len(members))
                started = time.perf_counter()
                placed, more, refused = self._place(gang, members)
                self._count(gang, placed, more, refused, time.perf_counter() - started)
                if placed:
                    # Durable before any decision goes out (a restart rebuilds them).
                    await asyncio.gather(*(self.reserved.put(g, gang.attempt) for g in placed))
                    for grant in placed:
                        decided.append(self._decided(grant, gang))
                        current.add_event(
                            "placed", {"k8s.pod.uid": grant.pod.uid, "k8s.node.name": grant.node}
                        )
                decided.extend(more)
                failed.extend(refused)
        for no in failed:
            log.info(
                "not placed (%s): %s: %s",
                "unresolvable" if no.unresolvable else "waits",
                ", ".join(str(p) for p in no.pods),
                no.message,
            )
        await self.rt.bus.publish_many([*decided, *failed])

    def _count(
        self,
        gang: ev.GangReady,
        placed: list[PodGrant],
        more: list[ev.Event],
        refused: list[ev.AllocationFailed],
        took_s: float,
    ) -> None:
        """The metrics of one placement attempt."""
        stats = self.stats
        stats.place_time.record(took_s)
        if placed:
            result = "placed"
        else:
            result = "unresolvable" if any(r.unresolvable for r in refused) else "unschedulable"
        stats.placements.add(1, {"result": result})
        for e in more:
            if isinstance(e, ev.PreemptionDecided):
                stats.preempted.add(sum(len(v.pods) for v in e.victims))
        if not placed:
            return
        now = time.time()
        for _ in placed:
            stats.stage.record(max(0.0, now - gang.emitted_at), {"stage": "decided"})
        created = [p.created_at for p in gang.members if p.created_at]
        if not gang.gang.lone and created:
            stats.job_latency.record(max(0.0, now - min(created)) * 1000)

    def _place(
        self, gang: ev.GangReady, members: list[GangMember]
    ) -> tuple[list[PodGrant], list[ev.Event], list[ev.AllocationFailed]]:
        """The ledger work of one gang: grants placed, other events, failures."""
        key = gang.gang.key
        pods = tuple(m.pod for m in members)
        waiting = self.room.waiting(key)
        if waiting:
            status = Status(reasons=(Reason(kind="waiting", detail=waiting),))
            return [], [], [self._failed(gang, pods, status)]
        for m in members:
            checked = self.placer.check(m.request)
            if not checked.ok:
                context = str(m.pod) if len(members) > 1 else ""
                return [], [], [self._failed(gang, pods, checked.with_context(context))]
        result = self.placer.place_gang(members, gang.min_member, owner=key)
        if result.ok:
            self.room.drop_hold(key)
            grants = [self.ledger.pods[p.pod.uid] for p in result.placed]
            extras = [self._failed(gang, (f.pod,), f.status) for f in result.failures]
            return grants, [], extras
        last = result.failures[-1].status
        status = result.status if gang.min_member > 1 else last
        room: list[ev.Event] = []
        if not last.unresolvable:
            room, note = self._make_room(gang, members)
            status = status.with_note(note)
        return [], room, [self._failed(gang, pods, status)]

    def _make_room(
        self, gang: ev.GangReady, members: list[GangMember]
    ) -> tuple[list[ev.Event], str]:
        """Preempt for a gang that does not fit (if it may), else hold nodes for it (if it
        has starved): the events to publish and a note for its pods' message."""
        key = gang.gang.key
        if gang.victims and self.rt.cfg.scheduler.preemption:
            found = self.room.preempt(key, members, gang.min_member, list(gang.victims))
            if found is not None:
                nodes = tuple(sorted({p.node for p in found.placements}))
                log.info(
                    "preempting %d pod(s) for gang %s on %s: %s",
                    len(found.pods),
                    key,
                    ", ".join(nodes),
                    "; ".join(
                        f"{', '.join(str(p) for p in v.pods)} ({v.why})" for v in found.units
                    ),
                )
                event = ev.PreemptionDecided(
                    gang=gang.gang,
                    preemptor=tuple(m.pod for m in members),
                    victims=found.units,
                    nodes=nodes,
                    attempt=gang.attempt,
                )
                return [event], (
                    f"Preempting {len(found.pods)} pod(s) to make room on {', '.join(nodes)}."
                )
        if gang.hold:
            held = self.room.hold(key, members, gang.min_member)
            if held:
                return [], (
                    f"It has waited long: nodes {', '.join(held)} are held for it until "
                    "their pods finish."
                )
        return [], ""

    def _decided(self, grant: PodGrant, gang: ev.GangReady) -> ev.AllocationDecided:
        lone = gang.min_member <= 1 and len(gang.members) == 1
        created = next((p.created_at for p in gang.members if p.pod.uid == grant.pod.uid), 0.0)
        return ev.AllocationDecided(
            pod=grant.pod,
            node=grant.node,
            grants=grant.containers,
            gang=None if lone else gang.gang,
            attempt=gang.attempt,
            created_at=created,
        )

    def _failed(
        self, gang: ev.GangReady, pods: tuple[PodRef, ...], status: Status
    ) -> ev.AllocationFailed:
        if self.refused:
            status = status.with_note(
                f"({len(self.refused)} node(s) refused: they run another config)"
            )
        return ev.AllocationFailed.of(pods, status, gang=gang.gang, attempt=gang.attempt)

    # --- bound, released ----------------------------------------------------------------

    @handles(ev.PodUpdated)
    async def on_bound(self, event: ev.PodUpdated) -> None:
        """A pod is on a node: its reservation becomes a grant the pod holds; any other
        scheduler's pod counts there too (requests, ports, labels). A grant not signed
        by Tessera holds nothing."""
        node = event.node
        if node is None:
            return
        if event.grants and not ann.signed(
            self.key, event.pod.uid, node, event.grants, event.signature
        ):
            await self._refuse_forged(event.pod, node)
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
            if held is not None:
                log.warning(
                    "pod %s is bound to %s, not as reserved on %s; following the pod",
                    event.pod,
                    event.node,
                    held.node,
                )
                self.ledger.release(event.pod.uid)
            self.ledger.grant(
                PodGrant(
                    pod=event.pod,
                    node=node,
                    containers=event.grants,
                    group=held.group if held is not None else None,
                    spec=event.spec or (held.spec if held is not None else None),
                )
            )
        if event.pod.uid in self.reserved.open:
            await self.reserved.forget(event.pod.uid)

    async def _refuse_forged(self, pod: PodRef, node: NodeName) -> None:
        log.warning("pod %s on %s: %s", pod, node, UNSIGNED)
        await kube.tell(
            self.api,
            pod,
            reason="ForgedGrant",
            kind="Warning",
            message=f"Pod {pod} on {node}: {UNSIGNED}",
            component="tessera-device-allocator",
        )

    @handles(ev.PodDeleted)
    async def on_deleted(self, event: ev.PodDeleted) -> None:
        """A pod is gone: release what it held."""
        await self.release(event.pod, event.node, "pod deleted")

    @handles(ev.BindFailed)
    async def on_bind_failed(self, event: ev.BindFailed) -> None:
        """The bind failed: release the reservation."""
        await self.release(event.pod, event.node, f"bind failed: {event.error}")

    @handles(ev.AllocationAdmitted)
    async def on_admitted(self, event: ev.AllocationAdmitted) -> None:
        """The kubelet took the pod's devices: its admission keys are free."""
        self.ledger.admitted(event.pod.uid, event.node)

    async def release(self, pod: PodRef, node: NodeName | None, reason: str) -> None:
        owner = self.room.gone(pod)
        if owner is not None:
            # A preempted pod is gone: its devices stay booked for the gang it made room for.
            if self.room.all_gone(owner):
                held = self.ledger.pods.get(pod.uid)
                await self.rt.bus.publish(
                    ev.AllocationReleased(
                        pod=pod,
                        node=held.node if held else node or NodeName(""),
                        reason=f"preempted; its devices are kept for gang {owner}",
                    )
                )
            return
        grant = self.ledger.release(pod.uid)
        if pod.uid in self.reserved.open:
            await self.reserved.forget(pod.uid)
        if grant is not None:
            await self.rt.bus.publish(
                ev.AllocationReleased(pod=pod, node=grant.node, reason=reason)
            )

    async def expire_loop(self, timeout_s: float = BIND_TIMEOUT_S) -> None:
        """Reservations the binder never confirmed: adopt the bound ones, free the rest.
        Nominations and holds whose gang did not come back lapse."""
        while True:
            await asyncio.sleep(timeout_s / 3)
            now = time.time()
            for _key, grants in self.room.lapsed(now):
                for grant in grants:
                    await self.rt.bus.publish(
                        ev.AllocationReleased(
                            pod=grant.pod, node=grant.node, reason="preempted (nomination lapsed)"
                        )
                    )
            for uid, r in list(self.reserved.open.items()):
                if now - r.at >= timeout_s and uid in self.reserved.open:
                    await self._expire(r)

    async def _expire(self, r: Reservation) -> None:
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
            found = read_bound_grant(obj, self.managed, self.key)
        if found is not None:
            bound = found[0]
            await self.on_bound(
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
            BIND_TIMEOUT_S,
        )
        await self.release(pod, r.grant.node, "bind timed out")
        status = Status(
            reasons=(Reason(kind="waiting", detail="the bind did not happen in time; retrying"),)
        )
        await self.rt.bus.publish(ev.AllocationFailed.of((pod,), status, attempt=r.attempt))
