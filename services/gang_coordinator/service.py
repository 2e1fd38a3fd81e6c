"""The gang-coordinator's shell: events in, the core's gang decisions, events out.

What it decides is in shared/core/gangs.py (readiness, queue admission and order,
retries, victims to offer); this module turns events into calls on
:class:`~shared.core.gangs.Gangs` and its :class:`~shared.core.gangs.Dispatch` into
``GangReady`` events (each in the trace its first pod arrived in) and ``PodWaiting``
for pods it holds back (queue refusals, a missing PodGroup), both made by outbound.py.
PodGroup status is written by podgroups.py, Queue status by queues.py.

Events arrive in batches; one dispatch runs per batch, at most every
``DISPATCH_INTERVAL_S``: pods arriving together go together, and a dispatch (which
reads every waiting pod) per event was most of this service's CPU under a stream of
pods (py-spy, 10,000 pods on 1,000 nodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

from nats.js.kv import KeyValue
from opentelemetry import context as otel_context

from services.gang_coordinator import usage
from services.gang_coordinator.outbound import gang_ready, policy, waiting
from services.gang_coordinator.podgroups import PodGroupStatus
from services.gang_coordinator.queues import (
    STATUS_INTERVAL_S,
    QueueStatus,
    Snapshot,
    Why,
    add_metrics,
    every,
    queue_spec,
    snapshot,
)
from shared import busauth, kube
from shared import events as ev
from shared.bus import through_failover
from shared.core.claimed import held
from shared.core.gangs import Gangs, Member, ReadyGang
from shared.core.hosts import Claims
from shared.core.model import GangKey, NodeName, PodUID
from shared.core.queues import GroupSpec, grant_vector, resource_vector
from shared.core.request import ResourceTable
from shared.core.spec import GENERIC_VENDORS
from shared.runtime import Runtime, Service, ViewHandler, handles, report_catch_up
from shared.views import VIEW_QUEUES_SUBJECT, QueuesView

log = logging.getLogger(__name__)

DISPATCH_INTERVAL_S = 0.05
"""The least time between two dispatches: pods arriving together go together."""


class Coordinator(Service):
    """Owns which gangs go to the allocator and when, and PodGroup status."""

    NAME = "gang-coordinator"

    def __init__(self, rt: Runtime, api: kube.Client | None) -> None:
        super().__init__(rt, api)
        s = rt.cfg.scheduler
        split: dict[str, int] = {
            vendor: spec.device_split_count
            for vendor in GENERIC_VENDORS
            if (spec := rt.cfg.devices.vendor(vendor)) is not None
        }
        self.gangs = Gangs(policy(s), split)
        self.table = ResourceTable.build(rt.cfg.devices)
        self.pools = s.shard_pools()
        self.announced: dict[PodUID, ev.PodPending] = {}
        """Each waiting pod's announcement, forwarded in its GangReady."""
        self.contexts: dict[PodUID, otel_context.Context] = {}
        """The trace each pod arrived in: its gang is published inside it, so one trace
        spans watcher, coordinator, allocator and binder."""
        self.podgroups: dict[GangKey, ev.PodGroupUpdated] = {}
        self.queues: dict[str, ev.QueueUpdated] = {}
        self.status = PodGroupStatus(api)
        self.queue_status = QueueStatus(api if s.queue_status else None, self.table)
        self.why: dict[GangKey, Why] = {}
        """What each waiting gang was last told by the allocator (views, metrics)."""
        self.usage_kv: KeyValue | None = None
        """The ``tessera-usage`` bucket, opened at start (services/gang_coordinator/usage.py)."""
        self.wake = asyncio.Event()
        self.stage = rt.metrics.stages()
        self._scraped = Snapshot()
        rt.metrics.prepare.append(self._take_snapshot)
        add_metrics(rt.metrics, lambda: self._scraped, self.table)

    def _take_snapshot(self) -> None:
        """Once per scrape: every queue gauge reports from it."""
        self._scraped = self.snapshot()

    def snapshot(self, *, with_gangs: bool = True) -> Snapshot:
        """Every queue's figures now (queues.py :func:`snapshot`); ``with_gangs`` False leaves out
        the per-gang views, which the queue status does not need."""
        return snapshot(
            self.gangs, self.status.phase, self.why, time.monotonic(), with_gangs=with_gangs
        )

    async def start(self) -> None:
        """Take every node's latest inventory from the KV (published before the consumer
        existed), ask the watcher once to re-announce what waits, and log when the backlog
        is handled."""
        # Inventories published before the consumer existed: the KV has every node's latest.
        inventories = await through_failover("inventories", self.rt.bus.inventories)
        for inventory in inventories.values():
            self.gangs.set_node(inventory.node, inventory.devices)
        kv = self.usage_kv = await through_failover(
            "usage bucket", lambda: self.rt.bus.bucket(busauth.USAGE_BUCKET)
        )
        loaded = await usage.load(self.gangs, kv)
        log.info("usage memory: %d entries loaded", loaded)
        self.rt.spawn(self.request_resync(), "resync-once", finite=True)
        self.rt.spawn(report_catch_up(self.rt, self.durable()), "catch-up", finite=True)

    def tasks(self) -> dict[str, Coroutine[Any, Any, None]]:
        """The dispatch loop, the PodGroup and Queue status writers, and the heartbeat
        reconciliation of node inventories."""
        return {
            "dispatch": self.dispatch_loop(),
            "podgroup-status": self.status.writer(),
            "reconcile-inventory": self.inventory_loop(),
            "queue-status": every(STATUS_INTERVAL_S, self.write_queue_status),
            "usage": usage.keep(self.gangs, self._usage_kv(), self.rt.cfg.scheduler.usage.sample_s),
        }

    def _usage_kv(self) -> KeyValue:
        assert self.usage_kv is not None, "start() opens the usage bucket before the tasks run"
        return self.usage_kv

    def views(self) -> dict[str, ViewHandler]:
        """The queues view, answered while this replica is active."""
        return {VIEW_QUEUES_SUBJECT: self.queues_view}

    async def queues_view(self, _payload: bytes) -> QueuesView:
        """``tessera.ctl.view.queues``: every queue's figures and each waiting gang, taken now."""
        snap = self.snapshot()
        return QueuesView(
            queues=tuple(snap.queues),
            gangs=tuple(snap.gangs),
            plugin=self.gangs.policy.queue_plugin,
            instance=self.rt.instance,
            taken_at=time.time(),
        )

    async def write_queue_status(self) -> None:
        """Queue status, and forget what gangs that no longer wait were told."""
        waiting = {m.key for m in self.gangs.pods.values()}
        for key in [k for k in self.why if k not in waiting]:
            del self.why[key]
        snap = self.snapshot(with_gangs=False)
        await self.queue_status.write(snap.queues, {n: q.uid for n, q in self.queues.items()})

    # --- pods -------------------------------------------------------------------------

    @handles(ev.PodPending)
    async def on_pod_pending(self, event: ev.PodPending) -> None:
        """A pod waits for placement (or is announced again)."""
        member = Member(
            pod=event.pod,
            key=GangKey.of(event.pod, event.group),
            request=event.request,
            priority=event.priority,
            created_at=event.created_at,
            task=event.task,
            since=time.monotonic(),
            preemption_policy=event.preemption_policy,
            labels=event.spec.labels if event.spec is not None else {},
            owner=event.owner,
            preemptable=event.preemptable,
            claims=_claims(event).counts,
        )
        new = event.pod.uid not in self.gangs.pods and event.pod.uid not in self.gangs.bound_pods
        previous = self.announced.get(event.pod.uid)
        respec = previous is not None and previous.spec != event.spec
        if self.gangs.pending(member, respec=respec) or event.pod.uid not in self.announced:
            self.contexts.setdefault(event.pod.uid, otel_context.get_current())
        if new and event.created_at:
            self.stage.record(max(0.0, event.emitted_at - event.created_at), {"stage": "pending"})
        if event.pod.uid in self.gangs.pods:
            self.announced[event.pod.uid] = event
        self.wake.set()

    @handles(ev.AllocationDecided)
    async def on_allocation_decided(self, event: ev.AllocationDecided) -> None:
        """The allocator placed a pod: it counts against its queue as granted, its
        claims as allocated."""
        announced = self.announced.get(event.pod.uid)
        specs = {c.uid: c.devices for c in _claims(announced).allocate} if announced else {}
        claims = {c.uid: held(specs[c.uid], c.allocation) for c in event.claims if c.uid in specs}
        self.gangs.decided(event.pod.uid, grant_vector(event.grants), claims)

    @handles(ev.AllocationFailed)
    async def on_allocation_failed(self, event: ev.AllocationFailed) -> None:
        """The allocator could not place these pods: park them, and say why on the PodGroup."""
        self.gangs.failed(
            (p.uid for p in event.pods),
            event.attempt,
            unresolvable=event.unresolvable,
            now=time.monotonic(),
        )
        if event.gang is not None:
            self.why[event.gang.key] = Why.of(event)
            if not event.gang.lone:
                self.status.pending(event.gang.key, event.message)
        self.wake.set()

    @handles(ev.AllocationBindFailed)
    async def on_allocation_bind_failed(self, event: ev.AllocationBindFailed) -> None:
        """The bind failed (the allocator released the reservation); what comes next is
        the binder's reading of why (shared/events.py ``BindCause``), never a blind retry."""
        uid = event.pod.uid
        if event.cause == "gone":
            self.gangs.forget(uid)
            self._drop(uid)
        elif event.cause == "gated":  # the watcher announces it again once ungated
            self.gangs.withdraw(uid)
            self._drop(uid)
        elif event.cause == "refused":
            self.gangs.bind_failed(uid, refused_at=time.monotonic())
        elif event.cause == "transient":
            self.gangs.bind_failed(uid)
        # "taken": bound to another node; the watcher's PodUpdated ends its wait.
        self.wake.set()

    @handles(ev.PodUpdated)
    async def on_pod_updated(self, event: ev.PodUpdated) -> None:
        """A pod is bound; its PodGroup runs once ``minMember`` are."""
        started = None
        if event.started_at > 0:  # on the monotonic clock the core's times are on
            started = time.monotonic() - max(0.0, time.time() - event.started_at)
        key = self.gangs.bound_now(event.pod.uid, started, event.cooldown_s)
        self._drop(event.pod.uid)
        if key is not None and (running := self.gangs.running(key)) is not None:
            self.status.running(key, running)

    @handles(ev.PodDeleted, ev.PodRejected)
    async def on_pod_deleted_or_rejected(self, event: ev.PodDeleted | ev.PodRejected) -> None:
        """A pod is gone or invalid: it no longer waits or counts."""
        self.gangs.forget(event.pod.uid)
        self._drop(event.pod.uid)
        self.wake.set()

    def _drop(self, uid: PodUID) -> None:
        self.announced.pop(uid, None)
        self.contexts.pop(uid, None)

    # --- PodGroups, Queues, nodes --------------------------------------------------------

    @handles(ev.PodGroupUpdated)
    async def on_podgroup_updated(self, event: ev.PodGroupUpdated) -> None:
        """A PodGroup's size, task minimums or queue (a group may be ready now)."""
        key = GangKey(namespace=event.namespace, name=event.name)
        if not ev.changed(self.podgroups.get(key), event):
            return  # a re-announcement of what is known
        self.podgroups[key] = event
        self.status.known.add(key)
        self.gangs.groups[key] = GroupSpec(
            min_member=event.min_member,
            min_task_member=event.min_task_member,
            queue=event.queue,
            subgroups=event.sub_group_policy,
            invalid=event.invalid,
            min_resources=resource_vector(self.table, event.min_resources),
        )
        if event.invalid:
            log.warning("PodGroup %s: %s; its pods wait until it is mended", key, event.invalid)
        self._helpful(node_changed=True)  # a changed group may be ready now

    @handles(ev.PodGroupDeleted)
    async def on_podgroup_deleted(self, event: ev.PodGroupDeleted) -> None:
        """A PodGroup is gone."""
        key = GangKey(namespace=event.namespace, name=event.name)
        self.podgroups.pop(key, None)
        self.gangs.groups.pop(key, None)
        self.status.known.discard(key)

    @handles(ev.PdbUpdated)
    async def on_pdb_updated(self, event: ev.PdbUpdated) -> None:
        """A PodDisruptionBudget's reading: victims it covers are offered after others."""
        b = event.budget
        self.gangs.budgets.setdefault(b.namespace, {})[b.name] = b

    @handles(ev.PdbDeleted)
    async def on_pdb_deleted(self, event: ev.PdbDeleted) -> None:
        """A PodDisruptionBudget is gone."""
        self.gangs.budgets.get(event.namespace, {}).pop(event.name, None)

    @handles(ev.QueueUpdated)
    async def on_queue_updated(self, event: ev.QueueUpdated) -> None:
        """A Queue's weight, capability, guarantee or state (shares change)."""
        if not ev.changed(self.queues.get(event.name), event):
            return
        self.queues[event.name] = event
        self.gangs.queues[event.name] = queue_spec(event, self.table)
        self._helpful(node_changed=True)  # an opened queue, a new weight or cap

    @handles(ev.QueueDeleted)
    async def on_queue_deleted(self, event: ev.QueueDeleted) -> None:
        """A Queue is gone."""
        self.queues.pop(event.name, None)
        self.gangs.queues.pop(event.name, None)
        self._helpful(node_changed=True)

    @handles(ev.NodeInventory)
    async def on_node_inventory(self, event: ev.NodeInventory) -> None:
        """A node's devices (the cluster's capacity, which parked pods may now use)."""
        self.gangs.set_node(event.node, event.devices)
        self._helpful(node_changed=True)

    @handles(ev.NodeDeleted)
    async def on_node_deleted(self, event: ev.NodeDeleted) -> None:
        """A node is gone."""
        self.gangs.remove_node(event.node)
        self._helpful(node_changed=True)

    @handles(ev.NodeUpdated)
    async def on_node_updated(self, _event: ev.NodeUpdated) -> None:
        """A node's cordons changed: parked pods may fit elsewhere now."""
        self._helpful(node_changed=True)

    @handles(ev.AllocationReleased, ev.AllocationAdmitted)
    async def on_allocation_released_or_admitted(
        self, _event: ev.AllocationReleased | ev.AllocationAdmitted
    ) -> None:
        """Devices came free or an admission ended: parked pods are retried."""
        # Devices came free, or a pod of the same admission key left the kubelet.
        self._helpful(node_changed=False)

    def _helpful(self, *, node_changed: bool) -> None:
        self.gangs.helpful(node_changed=node_changed)
        self.wake.set()

    # --- dispatch -----------------------------------------------------------------------

    async def dispatch(self) -> None:
        """Send every gang the core finds ready, and tell refused pods why."""
        now = time.monotonic()
        decided = self.gangs.dispatch(now)
        ready = [self._gang_ready(gang) for gang in decided.ready]
        for gang in decided.ready:
            if gang.attempt == 1:
                for m in gang.members:
                    self.stage.record(max(0.0, now - m.since), {"stage": "ready"})
        for gang in decided.ready:
            if not gang.key.lone:
                self.status.inqueue(gang.key)
        # All in one pipelined publish, each gang in the trace its first pod arrived in.
        await self.rt.bus.publish_many(
            ready, [self.contexts.get(g.members[0].pod.uid) for g in decided.ready]
        )
        if decided.told:
            await self.rt.bus.publish_many(waiting(decided.told))

    def _gang_ready(self, gang: ReadyGang) -> ev.GangReady:
        return gang_ready(gang, self.announced, self.pools, self.podgroups.get(gang.key))

    async def dispatch_loop(self) -> None:
        """Dispatch when woken (a pod, a refusal, a freed device) or at the next retry due, within a
        second, then pause ``DISPATCH_INTERVAL_S`` so pods arriving together go together."""
        while True:
            delay = max(0.05, self.gangs.next_retry() - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=min(delay, 1.0))
            self.wake.clear()
            await self.dispatch()
            await asyncio.sleep(DISPATCH_INTERVAL_S)

    async def inventory_loop(self) -> None:
        """Every heartbeat, take the node inventories from the KV (missed events heal)."""
        async for latest in self.rt.bus.inventory_heartbeats(self.rt.cfg.scheduler.heartbeat_s):
            changed = [self.gangs.set_node(n, inv.devices) for n, inv in latest.items()]
            for gone in set(self.gangs.nodes) - set(latest):
                self.gangs.remove_node(NodeName(gone))
                changed.append(True)
            if any(changed):
                self._helpful(node_changed=True)

    async def request_resync(self) -> None:
        """Ask the watcher to re-announce queues, PodGroups and pending pods."""
        try:
            await self.rt.bus.nc.request(ev.CONTROL_RESYNC_SUBJECT, b"", timeout=5)
        except Exception as exc:  # the watcher may not be up yet; its resync loop covers it
            log.info("resync request not answered (%s); the periodic resync will cover it", exc)


def _claims(event: ev.PodPending) -> Claims:
    """What a pending pod's claims allow and count (none: an empty verdict)."""
    found = event.spec.claims if event.spec is not None else None
    return found if found is not None else Claims()
