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

With ``scheduler.shards`` (shared/core/shards.py), each shard's allocator keeps the
ledger of its own nodes only and takes the gangs published for it; one it cannot place
whole goes on to the next shard of its ``route``. If none can, a gang of several pods
is placed across them in a second pass, two-phase: each shard holds what it can of the
pods left (``holding``: in the ledger, not yet reserved or published) and passes the
rest on; the shard that brings the gang to ``minMember`` publishes ``GangSpanDecided``
to commit every part (each shard then reserves and decides its own), the last one
aborts them otherwise (and tells the pods what every shard found). A hold that is
never decided lapses after ``SPAN_HOLD_S``.

Handlers overlap only in their I/O (reservation KV writes, publishing decisions): each
one's ledger work runs before its first await, and handlers start in stream order, so
the ledger sees events in order.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
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
from shared.bus import through_failover
from shared.busauth import shard_consumer
from shared.config import Config, ConfigError, SchedulerConfig, grant_key
from shared.core import annotations as ann
from shared.core.hosts import node_spec
from shared.core.ledger import Ledger, PodGrant
from shared.core.model import GangKey, NodeName, PodRef, PodUID
from shared.core.placement import GangMember, PlacementConfig, Placer
from shared.core.request import ResourceTable
from shared.core.status import Code, Reason, Status, combined
from shared.runtime import Runtime, Service, ViewHandler, handles, report_catch_up
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
SPAN_HOLD_S = 10.0
"""A shard's uncommitted part of a gang placed across shards is released after this."""
SHARD_ENV = "TESSERA_SHARD"
YIELD_EVERY = 256
"""Nodes read at start between two yields to the event loop (its lease is renewed)."""
BEHIND_S = 1.0
"""A gang that reaches the allocator this long after it was sent finds it behind: the
fragmentation guard's window narrows to ``NARROW_GUARD`` until it catches up."""
LATE_S = 3.0
"""So does a gang whose newest pod was created this long before (``creationTimestamp``
has one-second resolution): pods queue before the allocator too, in the API server,
the watcher or the coordinator, and CPU spent weighing nodes is taken from them."""
OPEN_BEHIND = 256
"""So does holding more reservations than this that no binder has confirmed: the pods
wait downstream (the binder, the API server), and the allocator's CPU is theirs."""
NARROW_GUARD = 0
"""Behind, no window at all: binpack's first fit and HAMi's device choice (a window of 2
still weighed each node's cards by FGD and cost 4 times a first fit, bench/RESULTS.md)."""


def shard_of(cfg: Config, args: argparse.Namespace | None) -> tuple[str, int]:
    """The shard this allocator places (``--shard``, else ``$TESSERA_SHARD``) and its
    index in ``scheduler.shards``; ``("", -1)`` in an unsharded cluster."""
    name = getattr(args, "shard", None) or os.environ.get(SHARD_ENV, "")
    names = [c.name for c in cfg.scheduler.shards]
    if not names:
        if name:
            raise ConfigError(
                f"shard {name!r} asked, but `$.scheduler.shards` is empty: an unsharded "
                "cluster has one allocator, run it without --shard"
            )
        return "", -1
    if not name:
        raise ConfigError(
            f"`$.scheduler.shards` lists {', '.join(names)}: run one allocator per shard "
            f"with --shard NAME (or {SHARD_ENV})"
        )
    if name not in names:
        raise ConfigError(f"shard {name!r} is not in `$.scheduler.shards` ({', '.join(names)})")
    return name, names.index(name)


@dataclasses.dataclass
class Held:
    """This shard's uncommitted part of a gang placed across shards."""

    gang: ev.GangReady
    grants: list[PodGrant]
    until: float


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
        rt.metrics.gauge(
            "tessera_fragmentation_guard_nodes",
            "Nodes the fragmentation guard weighs per pod now (fewer while behind).",
            lambda: [(float(self.placer.config.fragmentation_guard), {})],
        )
        self.shard, self.shard_index = shard_of(rt.cfg, rt.args)
        self.pools = rt.cfg.scheduler.shard_pools()
        self.node_shard: dict[NodeName, str | None] = {}
        """Each known Node's shard (by its labels); sharded only."""
        self.holding: dict[tuple[GangKey, int], Held] = {}
        """Parts of gangs placed across shards, by gang and attempt, not yet decided."""
        self.tentative: dict[PodUID, tuple[GangKey, int]] = {}

    @classmethod
    def check_args(cls, cfg: Config, args: argparse.Namespace | None) -> None:
        shard_of(cfg, args)

    @classmethod
    def lease_key(cls, rt: Runtime) -> str:
        shard, _ = shard_of(rt.cfg, rt.args)
        return f"{cls.NAME}.{shard}" if shard else cls.NAME

    def durable(self) -> str:
        return shard_consumer(self.NAME, self.shard_index) if self.shard else self.NAME

    def subjects(self) -> list[str]:
        """Every handled event's subject, gangs only for this shard."""
        everyone = ev.GangReady.filter_subject()
        mine = ev.GangReady.filter_subject(self.shard or ev.UNSHARDED)
        return sorted({mine, *(s for s in super().subjects() if s != everyone)})

    def mine(self, node: NodeName) -> bool:
        """Is ``node`` this allocator's to place on? (Every node, unsharded.)"""
        return not self.shard or self.node_shard.get(node) == self.shard

    def concurrency(self) -> int:
        return ALLOCATOR_CONCURRENCY

    @property
    def reserved(self) -> Reservations:
        assert self.reservations is not None, "start() opens the reservations"
        return self.reservations

    async def start(self) -> None:
        """The ledger from node inventories, bound pods' grants and open reservations.
        The bound pods come before the inventories (read meanwhile): a node's grants are
        then applied to its devices once, all together, when they come
        (``Ledger.set_node``), not re-filed in the index one grant at a time. Each
        step's time is logged (``startup phase``; bench/restart.py reads them)."""
        started = time.monotonic()
        with kube.bulk():
            self.reservations = Reservations(await self.rt.bus.bucket(busauth.RESERVATION_BUCKET))
            await self._read_nodes()
            log.info("startup phase nodes: %.2f s", time.monotonic() - started)
            inventories = asyncio.create_task(
                through_failover("inventories", self.rt.bus.inventories)
            )
            try:
                bound, forged = await rebuild(
                    self.ledger, self.api, self.managed, self.key, self.mine, shapes={}
                )
            except BaseException:
                inventories.cancel()
                raise
            began = time.monotonic()
            read = await inventories
            for i, inventory in enumerate(read.values()):
                if i % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                self.on_inventory_event(inventory)
            log.info(
                "startup phase inventories: %.2f s (%d applied)",
                time.monotonic() - began,
                len(read),
            )
            reserved = await self.reserved.load(self.ledger, self.mine)
        log.info(
            "ledger rebuilt%s: %d nodes, %d devices, %d bound pods, %d reservations",
            f" for shard {self.shard}" if self.shard else "",
            len(self.ledger.nodes),
            self.ledger.device_count(),
            bound,
            reserved,
        )
        log.info("startup phase rebuild: %.2f s (the whole start)", time.monotonic() - started)
        for grant in forged:
            await self._refuse_forged(grant.pod, grant.node)
        self.rt.spawn(report_catch_up(self.rt, self.durable()), "catch-up", finite=True)

    async def _read_nodes(self) -> None:
        """Every namespace's labels and every Node's spec, cordons and shard."""
        namespaces, _ = await kube.list_all(self.api, "/api/v1/namespaces")
        for ns in namespaces:
            meta = ns["metadata"]
            self.ledger.hosts.set_namespace(meta["name"], meta.get("labels") or {})
        async for page in kube.list_pages(self.api, "/api/v1/nodes", kube.NodeObject):
            for node in page:
                spec = node_spec(node)
                name = NodeName(spec.name)
                self.cordons[name] = ann.cordoned_devices(node["metadata"].get("annotations") or {})
                self.node_shard[name] = self.pools.of_node(spec.labels)
                if self.mine(name):
                    self.ledger.set_spec(spec)

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
        reserved = {*self.reserved.open, *self.tentative}  # held for a gang across shards
        view = ledger_view(self.ledger, reserved, self.refused, query, self.rt.instance)
        return msgspec.structs.replace(view, shard=self.shard, shards=self.pools.names)

    async def explain_view(self, payload: bytes) -> ExplainView:
        view = explain_view(self.placer, msgspec.json.decode(payload, type=ExplainQuery))
        return msgspec.structs.replace(view, shard=self.shard, shards=self.pools.names)

    # --- nodes ------------------------------------------------------------------------

    @handles(ev.NodeInventory)
    async def on_inventory(self, event: ev.NodeInventory) -> None:
        """A node's devices (refused when it runs another config)."""
        self.on_inventory_event(event)

    def on_inventory_event(self, inv: ev.NodeInventory) -> None:
        self.applied[inv.node] = inv
        if not self.mine(inv.node):
            return  # another shard's (applied here if the node comes to this one)
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
        self.cordons[event.node] = event.cordoned_devices
        if event.spec is not None and self.shard:
            was = self.mine(event.node)
            self.node_shard[event.node] = self.pools.of_node(event.spec.labels)
            if was and not self.mine(event.node):
                log.info("node %s left shard %s (its labels changed)", event.node, self.shard)
                for uid in list(self.ledger.node_pods.get(event.node, ())):
                    self.ledger.release(uid)  # counted by the shard it went to now
                self.ledger.forget_node(event.node)
                return
            if not was and self.mine(event.node):
                log.info("node %s joined shard %s (its labels changed)", event.node, self.shard)
                self.ledger.set_spec(event.spec)
                if (inv := self.applied.get(event.node)) is not None:
                    self.on_inventory_event(inv)
                self.rt.spawn(self._adopt(event.node), f"adopt-{event.node}", finite=True)
                return
        if not self.mine(event.node):
            return
        if event.spec is not None:
            self.ledger.set_spec(event.spec)
        self.ledger.set_cordoned(event.node, event.cordoned_devices)

    async def _adopt(self, node: NodeName) -> None:
        """A node that joined this shard: the pods already on it count here now."""
        found, forged = await rebuild(
            self.ledger, self.api, self.managed, self.key, lambda n: n == node, node=node
        )
        for grant in forged:
            await self._refuse_forged(grant.pod, grant.node)
        log.info("node %s: %d pod(s) on it taken into shard %s", node, found, self.shard)

    @handles(ev.NodeDeleted)
    async def on_node_deleted(self, event: ev.NodeDeleted) -> None:
        """Nothing more is placed on a deleted node."""
        self.ledger.forget_node(event.node)
        self.applied.pop(event.node, None)
        self.refused.pop(event.node, None)
        self.node_shard.pop(event.node, None)

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
        why not, with room made for it where it may). Sharded, a gang this shard cannot
        place goes on to the next (see the module docstring)."""
        if gang.spanning is not None:
            await self._span(gang)
            return
        key = gang.gang.key
        members = []
        decided: list[ev.Event] = []
        for p in gang.members:
            part = self.tentative.get(p.pod.uid)
            if part == (key, gang.attempt):
                return  # a repeat: the gang is being placed across shards
            if part is not None:
                self._drop_held(part, "its gang was sent again")
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
                placed, failed, status, final = self._place(gang, members)
                onward = None if status is None or final else self._onward(gang, status)
                if onward is not None:
                    decided.append(onward)
                elif status is not None:
                    room, refusal = self._refuse(gang, members, status)
                    decided.extend(room)
                    failed.append(refusal)
                self._count(gang, placed, decided, failed, time.perf_counter() - started)
                if placed:
                    # Durable before any decision goes out (a restart rebuilds them).
                    await asyncio.gather(*(self.reserved.put(g, gang.attempt) for g in placed))
                    for grant in placed:
                        decided.append(self._decided(grant, gang))
                        current.add_event(
                            "placed", {"k8s.pod.uid": grant.pod.uid, "k8s.node.name": grant.node}
                        )
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
        elif any(isinstance(e, ev.GangReady) for e in more):
            result = "passed"
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
    ) -> tuple[list[PodGrant], list[ev.AllocationFailed], Status | None, bool]:
        """The ledger work of one gang: the grants placed, refusals of members left out
        (the gang placed without them), why it was not placed (None: it was) and
        whether that is final (no other shard may try: it waits for its victims)."""
        key = gang.gang.key
        self._keep_up(gang)
        waiting = self.room.waiting(key)
        if waiting:
            return [], [], Status(reasons=(Reason(kind="waiting", detail=waiting),)), True
        # Sharded, "larger than any card" would speak of this shard's cards only: each
        # node says it instead ("larger than the card"), counted over every shard.
        for m in members if not self.shard else ():
            checked = self.placer.check(m.request)
            if not checked.ok:
                context = str(m.pod) if len(members) > 1 else ""
                return [], [], checked.with_context(context), False
        result = self.placer.place_gang(members, gang.min_member, owner=key)
        if result.ok:
            self.room.placed(key)
            grants = [self.ledger.pods[p.pod.uid] for p in result.placed]
            extras = [self._failed(gang, (f.pod,), f.status) for f in result.failures]
            return grants, extras, None, False
        last = result.failures[-1].status
        return [], [], result.status if gang.min_member > 1 else last, False

    def _keep_up(self, gang: ev.GangReady) -> None:
        """Behind a burst, pack a little less well and keep up: the fragmentation guard
        weighs ``scheduler.fragmentationGuard`` nodes per pod (16: some 20 times the
        cost of a first fit for pods with cpu and memory, bench/RESULTS.md) while gangs
        come in time, and ``NARROW_GUARD`` while they wait in the stream, reach it late
        after their pods were created (a first attempt: a retried pod is old), or wait
        to be bound (``OPEN_BEHIND``)."""
        wanted = self.rt.cfg.scheduler.fragmentation_guard
        now = time.time()
        newest = max((p.created_at for p in gang.members), default=0.0)
        if (
            now - gang.emitted_at > BEHIND_S
            or (gang.attempt == 1 and newest and now - newest > LATE_S)
            or len(self.reserved.open) > OPEN_BEHIND
        ):
            wanted = min(wanted, NARROW_GUARD)
        if self.placer.config.fragmentation_guard != wanted:
            log.debug(
                "fragmentation guard: %d nodes per pod (%s)",
                wanted,
                "behind" if wanted == NARROW_GUARD else "caught up",
            )
            self.placer.config = dataclasses.replace(self.placer.config, fragmentation_guard=wanted)

    def _refuse(
        self, gang: ev.GangReady, members: list[GangMember], status: Status
    ) -> tuple[list[ev.Event], ev.AllocationFailed]:
        """The gang is not placed (by any shard it was offered to): room made for it on
        this shard's nodes where it may, and the refusal that tells its pods why."""
        if gang.tried is not None:
            status = combined([gang.tried, status])
        preempt = self.rt.cfg.scheduler.preemption
        made = self.room.make_room(gang, members, status, preempt=preempt)
        failed = self._failed(gang, tuple(m.pod for m in members), status.with_note(made.note))
        return list(made.events), msgspec.structs.replace(failed, nominated=made.nominated)

    def _onward(self, gang: ev.GangReady, status: Status) -> ev.GangReady | None:
        """The gang passed on to the next shard of its route; or, past the last one, a
        gang of several pods goes round the shards again to be placed across them
        (starting here); None when there is nowhere left to try."""
        if not self.shard:
            return None
        tried = status if gang.tried is None else combined([gang.tried, status])
        if gang.route:
            return self._pass(gang, gang.route, tried=tried)
        if len(gang.members) > 1 and len(gang.offered) > 1:
            rest = tuple(s for s in gang.offered if s != self.shard)
            return self._pass(gang, (self.shard, *rest), tried=tried, spanning=())
        return None

    def _pass(
        self,
        gang: ev.GangReady,
        route: tuple[str, ...],
        **changes: Any,
    ) -> ev.GangReady:
        """``gang`` for the first shard of ``route``, a new event. Passed on again after
        a redelivery, it is stored once: its ``dedup_id`` names the gang, attempt,
        members, shard and parts held (shared/events.py), not its event id."""
        return msgspec.structs.replace(
            gang, event_id=ev.new_id(), shard=route[0], route=route[1:], **changes
        )

    async def _span(self, gang: ev.GangReady) -> None:
        """Second pass: hold what fits here of the pods left, then commit (the gang has
        its minMember), pass the rest on, or abort (the last shard)."""
        key = gang.gang.key
        ident = (key, gang.attempt)
        held = self.holding.get(ident)
        if held is None:  # not a repeat: place what fits, one pod at a time
            grants = []
            for p in gang.members:
                if p.pod.uid in self.ledger.pods:
                    continue
                group = GangKey(namespace=p.pod.namespace, name=p.group) if p.group else None
                member = GangMember(pod=p.pod, request=p.request, group=group, spec=p.spec)
                if self.placer.place_gang([member], 1, owner=key).ok:
                    grants.append(self.ledger.pods[p.pod.uid])
            if grants:
                held = Held(gang, grants, time.monotonic() + SPAN_HOLD_S)
                self.holding[ident] = held
                for g in grants:
                    self.tentative[g.pod.uid] = ident
        here = tuple(g.pod for g in held.grants) if held is not None else ()
        assert gang.spanning is not None
        parts = gang.spanning + ((ev.SpanPart(shard=self.shard, pods=here),) if here else ())
        count = sum(len(p.pods) for p in parts)
        rest = tuple(m for m in gang.members if m.pod not in here)
        tried = gang.tried or Status(code=Code.UNSCHEDULABLE)
        out: list[ev.Event] = []

        def decided(commit: bool) -> ev.GangSpanDecided:
            return ev.GangSpanDecided(
                gang=gang.gang, attempt=gang.attempt, commit=commit, parts=parts
            )

        if count >= max(gang.min_member, 1):
            log.info(
                "gang %s placed across shards %s",
                key,
                ", ".join(f"{p.shard} ({len(p.pods)})" for p in parts),
            )
            out.append(decided(True))
            out += [self._failed(gang, (m.pod,), tried) for m in rest]  # left out, as extras
        elif gang.route:
            out.append(self._pass(gang, gang.route, members=rest, spanning=parts))
        else:
            out.append(decided(False))
            pods = (*(p for part in parts for p in part.pods), *(m.pod for m in rest))
            note = (
                f"Placed across every shard, {count} of its pods fit; minMember is "
                f"{gang.min_member}."
            )
            refusal = self._failed(gang, pods, tried.with_note(note))
            log.info("not placed (waits): %s: %s", ", ".join(map(str, pods)), refusal.message)
            out.append(refusal)
        await self.rt.bus.publish_many(out)

    @handles(ev.GangSpanDecided)
    async def on_span_decided(self, event: ev.GangSpanDecided) -> None:
        """A gang placed across shards is committed (this shard reserves its part and
        decides its pods) or aborted (its part is released)."""
        held = self._drop_held((event.gang.key, event.attempt), "", release=not event.commit)
        if held is None or not event.commit:
            return
        await asyncio.gather(*(self.reserved.put(g, event.attempt) for g in held.grants))
        await self.rt.bus.publish_many([self._decided(g, held.gang) for g in held.grants])

    def _drop_held(
        self, ident: tuple[GangKey, int], why: str, *, release: bool = True
    ) -> Held | None:
        """Forget this shard's part of a gang placed across shards (and release it)."""
        held = self.holding.pop(ident, None)
        if held is None:
            return None
        for g in held.grants:
            self.tentative.pop(g.pod.uid, None)
            if release:
                self.ledger.release(g.pod.uid)
        if why:
            log.warning("part of gang %s (attempt %d) on this shard released: %s", *ident, why)
        return held

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
        """The bind failed: release the reservation. A pod bound elsewhere whose
        ``PodUpdated`` came first holds its real grant here now (``on_bound`` followed
        it and closed the reservation): that one stays."""
        if event.cause == "taken" and event.pod.uid not in self.reserved.open:
            return
        await self.release(event.pod, event.node, f"bind failed: {event.error}")

    @handles(ev.AllocationAdmitted)
    async def on_admitted(self, event: ev.AllocationAdmitted) -> None:
        """The kubelet took the pod's devices: its admission keys are free."""
        self.ledger.admitted(event.pod.uid, event.node)

    async def release(self, pod: PodRef, node: NodeName | None, reason: str) -> None:
        part = self.tentative.pop(pod.uid, None)
        if part is not None and (holding := self.holding.get(part)) is not None:
            holding.grants = [g for g in holding.grants if g.pod.uid != pod.uid]
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
            for ident, held in list(self.holding.items()):
                if held.until <= time.monotonic():
                    self._drop_held(ident, f"not committed within {SPAN_HOLD_S:.0f}s")

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
