"""The device-allocator: the single writer of the device ledger.

Only the replica holding the ``device-allocator`` lease acts; others wait as standbys.
On taking the lease it rebuilds the ledger from what is durable (reservations.py): node
inventories (KV), the grant annotations of bound pods, and its own reservations of
decided-but-not-yet-bound pods, so a restart never double-books.

Assume, then bind (kube-scheduler's cache)::

    GangReady --place--> reserved (ledger + reservation KV) --AllocationDecided--> binder
        reserved --PodUpdated(bound)--> granted (reservation dropped: the pod holds it)
        reserved --AllocationBindFailed / pod deleted / bind timed out--> released
        granted  --PodDeleted--> released

This module is the shell: it wires the ledger, the core's placer and room
(shared/core/room.py) to the modules that handle each kind of event, and runs the
loops. Gangs are placed in gangs.py, gangs placed across shards in span.py, bound pods,
releases and expiry in pods.py, nodes in nodes.py; the events published are built in
outcomes.py. With ``scheduler.shards`` (shared/core/shards.py), each shard's allocator
keeps the ledger of its own nodes only and takes the gangs published for it.

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

from services.device_allocator import outcomes
from services.device_allocator.dra import Dra
from services.device_allocator.fabric import Fabric
from services.device_allocator.gangs import Gangs
from services.device_allocator.metrics import AllocatorMetrics
from services.device_allocator.nodes import Nodes
from services.device_allocator.pods import BIND_TIMEOUT_S, Pods
from services.device_allocator.reservations import Reservations, rebuild
from services.device_allocator.span import Span
from services.device_allocator.views import explain_view, ledger_view
from shared import busauth, kube
from shared import events as ev
from shared.bus import through_failover
from shared.busauth import shard_consumer
from shared.config import Config, ConfigError, SchedulerConfig, grant_key
from shared.core.ledger import Ledger
from shared.core.model import NodeName
from shared.core.placement import PlacementConfig, Placer
from shared.core.request import ResourceTable
from shared.core.room import Room
from shared.runtime import Runtime, Service, ViewHandler, handles, report_catch_up
from shared.views import (
    VIEW_EXPLAIN_SUBJECT,
    VIEW_LEDGER_SUBJECT,
    ExplainQuery,
    ExplainView,
    LedgerQuery,
    LedgerView,
)

log = logging.getLogger(__name__)

ALLOCATOR_CONCURRENCY = 32
"""Events whose I/O may be in flight at once (see the module docstring)."""
SHARD_ENV = "TESSERA_SHARD"
RESOURCE = "/apis/resource.k8s.io/v1"
YIELD_EVERY = 256
"""Nodes read at start between two yields to the event loop (its lease is renewed)."""


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
        self.ledger.hosts.profile = rt.cfg.scheduler.profile()
        self.placer = Placer(self.ledger, placement_config(rt.cfg.scheduler))
        moving = rt.cfg.scheduler.consolidation
        self.room = Room(
            self.placer,
            max_moves=moving.max_moves if rt.cfg.scheduler.consolidates() else 0,
            reserve_s=moving.reserve_s,
        )
        self.reserved = Reservations()
        """The open reservations (their bucket is opened at start)."""
        self.key = grant_key(rt.cfg)
        """The grant-signing key: a grant not signed with it holds no device."""
        self.managed = frozenset(ResourceTable.build(rt.cfg.devices).by_name)
        """Tessera's device names (left out of the node-fit requests of bound pods)."""
        self.stats = AllocatorMetrics(rt.metrics, self.ledger)
        self.shard, self.shard_index = shard_of(rt.cfg, rt.args)
        self.nodes = Nodes(rt, self.ledger, self.shard)
        self.dra = Dra(self.ledger.hosts)
        """ResourceSlices, claim allocations, and the claims Tessera assumed (dra.py)."""
        self.span = Span(rt, self.placer, self.reserved, self.shard, self.nodes.refused)
        self.pods = Pods(
            rt,
            api,
            self.ledger,
            self.reserved,
            self.room,
            self.span,
            self.nodes.mine,
            self.key,
            self.managed,
            on_release=self.dra.release,
        )
        self.fabric = Fabric(rt, self.ledger)
        """The HyperNodes, for gangs with ``networkTopology`` (fabric.py)."""
        self.gangs = Gangs(
            rt,
            self.placer,
            self.room,
            self.reserved,
            self.span,
            self.stats,
            self.nodes.refused,
            self.fabric,
            self.dra,
        )
        rt.metrics.gauge(
            "tessera_fragmentation_guard_nodes",
            "Nodes the fragmentation guard weighs per pod now (fewer while behind).",
            lambda: [(float(self.gangs.guard), {})],
        )

    @classmethod
    def check_args(cls, cfg: Config, args: argparse.Namespace | None) -> None:
        """Refuse a ``--shard`` that does not fit ``scheduler.shards`` (:func:`shard_of`)."""
        shard_of(cfg, args)

    @classmethod
    def lease_key(cls, rt: Runtime) -> str:
        """One lease per shard (``device-allocator.<shard>``), the service's name unsharded."""
        shard, _ = shard_of(rt.cfg, rt.args)
        return f"{cls.NAME}.{shard}" if shard else cls.NAME

    def durable(self) -> str:
        """One consumer per shard, numbered (shared/busauth.py ``shard_consumer``)."""
        return shard_consumer(self.NAME, self.shard_index) if self.shard else self.NAME

    def subjects(self) -> list[str]:
        """Every handled event's subject, gangs only for this shard."""
        everyone = ev.GangReady.filter_subject()
        mine = ev.GangReady.filter_subject(self.shard or ev.UNSHARDED)
        return sorted({mine, *(s for s in super().subjects() if s != everyone)})

    def concurrency(self) -> int:
        """``ALLOCATOR_CONCURRENCY`` events at once: only their I/O overlaps (each handler's ledger
        work runs before its first await, so the ledger sees events in stream order)."""
        return ALLOCATOR_CONCURRENCY

    async def start(self) -> None:
        """The ledger from node inventories, bound pods' grants and open reservations.
        The bound pods come before the inventories (read meanwhile): a node's grants are
        then applied to its devices once, all together, when they come
        (``Ledger.set_node``), not re-filed in the index one grant at a time. Each
        step's time is logged (``startup phase``; bench/restart.py reads them)."""
        started = time.monotonic()
        mine = self.nodes.mine
        with kube.bulk():
            self.reserved.kv = await self.rt.bus.bucket(busauth.RESERVATION_BUCKET)
            await self.nodes.read(self.api)
            await self.fabric.read(self.api)
            await self._read_dra()
            log.info("startup phase nodes: %.2f s", time.monotonic() - started)
            inventories = asyncio.create_task(
                through_failover("inventories", self.rt.bus.inventories)
            )
            try:
                bound, forged = await rebuild(
                    self.ledger, self.api, self.managed, self.key, mine, shapes={}
                )
            except BaseException:
                inventories.cancel()
                raise
            began = time.monotonic()
            read = await inventories
            for i, inventory in enumerate(read.values()):
                if i % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                self.nodes.inventory(inventory)
            log.info(
                "startup phase inventories: %.2f s (%d applied)",
                time.monotonic() - began,
                len(read),
            )
            reserved = await self.reserved.load(self.ledger, mine)
            self.dra.restore({uid: r.claims for uid, r in self.reserved.open.items() if r.claims})
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
            await self.pods.refuse_forged(grant.pod, grant.node)
        self.rt.spawn(report_catch_up(self.rt, self.durable()), "catch-up", finite=True)

    async def _read_dra(self) -> None:
        """Every ResourceSlice and allocated ResourceClaim (later ones come as
        ``dra.object`` from the watcher); nothing when the API group is not served."""
        try:
            slices, _ = await kube.list_all(self.api, f"{RESOURCE}/resourceslices")
            claims, _ = await kube.list_all(self.api, f"{RESOURCE}/resourceclaims")
        except ApiException as exc:
            if exc.status != 404:
                raise
            return
        self.dra.read_all(slices, claims)

    def tasks(self) -> dict[str, Coroutine[Any, Any, None]]:
        """The reservation expiry loop and the heartbeat reconciliation of node inventories."""
        return {
            "expire-reservations": self.expire_loop(),
            "reconcile-inventory": self.nodes.reconcile_loop(),
        }

    def views(self) -> dict[str, ViewHandler]:
        """The ledger and explain views, answered while this replica is active."""
        return {
            VIEW_LEDGER_SUBJECT: self.ledger_view,
            VIEW_EXPLAIN_SUBJECT: self.explain_view,
        }

    async def ledger_view(self, payload: bytes) -> LedgerView:
        """``tessera.ctl.view.ledger``: the ledger, pods not yet bound marked so."""
        query = msgspec.json.decode(payload, type=LedgerQuery) if payload else LedgerQuery()
        reserved = {
            *self.reserved.open,
            *self.span.permits.part_of,
        }  # held for a gang across shards
        view = ledger_view(self.ledger, reserved, self.nodes.refused, query, self.rt.instance)
        return msgspec.structs.replace(view, shard=self.shard, shards=self.nodes.pools.names)

    async def explain_view(self, payload: bytes) -> ExplainView:
        """``tessera.ctl.view.explain``: every node's verdict on a pod."""
        query = msgspec.json.decode(payload, type=ExplainQuery)
        view = explain_view(self.placer, query)
        return msgspec.structs.replace(view, shard=self.shard, shards=self.nodes.pools.names)

    # --- nodes ------------------------------------------------------------------------

    @handles(ev.NodeInventory)
    async def on_node_inventory(self, event: ev.NodeInventory) -> None:
        """A node's devices (refused when it runs another config)."""
        self.nodes.inventory(event)

    @handles(ev.NodeUpdated)
    async def on_node_updated(self, event: ev.NodeUpdated) -> None:
        """A Node's labels, taints, allocatable and cordon; one that joined this shard
        has the pods on it taken in."""
        if self.nodes.updated(event):
            self.rt.spawn(self._adopt(event.node), f"adopt-{event.node}", finite=True)
        self.fabric.nodes_changed()

    async def _adopt(self, node: NodeName) -> None:
        found = await self.pods.adopt(node)
        log.info("node %s: %d pod(s) on it taken into shard %s", node, found, self.shard)

    @handles(ev.NodeDeleted)
    async def on_node_deleted(self, event: ev.NodeDeleted) -> None:
        """Nothing more is placed on a deleted node."""
        self.nodes.deleted(event.node)
        self.fabric.nodes_changed()

    @handles(ev.HyperNodeUpdated)
    async def on_hypernode_updated(self, event: ev.HyperNodeUpdated) -> None:
        """A network domain written or changed (fabric.py)."""
        self.fabric.updated(event)

    @handles(ev.HyperNodeDeleted)
    async def on_hypernode_deleted(self, event: ev.HyperNodeDeleted) -> None:
        """A network domain is gone."""
        self.fabric.deleted(event.name)

    @handles(ev.DraObject)
    async def on_dra_object(self, event: ev.DraObject) -> None:
        """A ResourceSlice or a ResourceClaim's allocation changed (dra.py)."""
        self.dra.seen(event.kind, event.key, event.obj)

    @handles(ev.NamespaceUpdated)
    async def on_namespace_updated(self, event: ev.NamespaceUpdated) -> None:
        """A namespace's labels, for affinity terms that select namespaces."""
        self.ledger.hosts.set_namespace(event.name, event.labels)

    # --- gangs ------------------------------------------------------------------------

    @handles(ev.GangReady)
    async def on_gang_ready(self, gang: ev.GangReady) -> None:
        """Place the gang all-or-nothing, reserve it, publish a decision per pod (or why
        not, with room made for it): gangs.py."""
        await self.gangs.ready(gang)

    @handles(ev.GangSpan)
    async def on_gang_span(self, event: ev.GangSpan) -> None:
        """A gang placed across shards is committed or aborted: span.py."""
        await self.span.decide(event)

    # --- bound, released ----------------------------------------------------------------

    @handles(ev.PodUpdated)
    async def on_pod_updated(self, event: ev.PodUpdated) -> None:
        """A pod is on a node: it holds what it was granted there (pods.py)."""
        await self.pods.updated(event)

    @handles(ev.PodDeleted)
    async def on_pod_deleted(self, event: ev.PodDeleted) -> None:
        """A pod is gone: release what it held."""
        await self.pods.release(event.pod, event.node, "pod deleted")

    @handles(ev.AllocationBindFailed)
    async def on_allocation_bind_failed(self, event: ev.AllocationBindFailed) -> None:
        """The bind failed: release the reservation (pods.py)."""
        await self.pods.bind_failed(event)

    @handles(ev.AllocationAdmitted)
    async def on_allocation_admitted(self, event: ev.AllocationAdmitted) -> None:
        """The kubelet took the pod's devices: its admission keys are free."""
        self.ledger.admitted(event.pod.uid, event.node)

    async def expire_loop(self, timeout_s: float = BIND_TIMEOUT_S) -> None:
        """Reservations the binder never confirmed: adopt the bound ones, free the rest.
        Nominations and holds whose gang did not come back lapse, and so do parts of
        gangs placed across shards never decided."""
        while True:
            await asyncio.sleep(timeout_s / 3)
            now = time.time()
            for released in outcomes.lapsed(self.room.lapsed(now)):
                await self.rt.bus.publish(released)
            await self.pods.expire(now, timeout_s)
            self.span.lapse(time.monotonic())
