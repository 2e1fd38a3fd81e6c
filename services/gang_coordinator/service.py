"""The gang-coordinator: decides which pods go to the allocator, and when again.

A lone pod is a gang of one. Pods of a PodGroup (``scheduling.k8s.io/group-name``) go
together once ``minMember`` of them (and ``minTaskMember`` per task role) are pending or
already placed; until the PodGroup is known they wait.

Queues (Volcano's): a gang of a Closed queue waits, and its pods are told why. With
queues known, each queue gets its deserved share of the cluster's devices by weighted
water-filling (shared/core/queues.py); a queue whose allocated + in-flight + next gang
would exceed it waits while the others are served. Gangs are taken from the queue
furthest below its share first, then by priority, then by age.

A gang the allocator could not place is parked and retried when something could help
(a node changed, a grant was released) or after a backoff doubling to a minute; an
unresolvable one waits for a node change. An unanswered gang is sent again.

Preemption (Volcano's preempt and reclaim): a gang that failed is sent again with the
bound pods that may make room for it, cheapest first. Lower-priority pods of its own
queue, or of another reclaimable queue, may go; so may pods of a reclaimable queue over
its deserved share while the gang's queue is within its own. A gang is offered as its
members beyond ``minMember`` one by one, then as a whole: never cut below ``minMember``.
The allocator picks the smallest set that makes room. Smaller gangs are backfilled past
a big one that does not fit; once it has waited ``starvationGuardS`` it is sent with
``hold``, and the allocator holds the nodes it would fit on for it.

The coordinator owns PodGroup status: Pending, Inqueue once sent, Running once
``minMember`` are bound, and the ``Unschedulable`` condition with the reason.

Per pod::

    pending --GangReady--> inflight --decided--> placed --bound--> bound --deleted--> (gone)
       ^                      |  failed             |  bind failed
       +------ retry ------ parked <----------------+
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
from kubernetes_asyncio.client import ApiException
from opentelemetry import context as otel_context

from services.gang_coordinator.jobs import JobController
from shared import events as ev
from shared import kube
from shared.bus import Delivery
from shared.core.model import ContainerGrant, NodeName, PodRef, PodUID
from shared.core.preemption import MAX_UNITS
from shared.core.queues import (
    QueueShare,
    Resources,
    accumulate,
    add,
    deserved,
    request_vector,
    within,
)
from shared.core.queues import resource_vector as queue_vector
from shared.core.request import ResourceTable
from shared.runtime import Runtime

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0
INFLIGHT_TIMEOUT_S = 20.0
"""A gang the allocator has not answered in this time is sent again (it may have been
published before the allocator's consumer existed); the allocator answers a pod it
already placed by repeating its decision, so a resend never places twice."""
DISPATCH_INTERVAL_S = 0.05
"""The least time between two dispatches: pods arriving together go together."""
VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"


def grant_vector(grants: tuple[ContainerGrant, ...]) -> Resources:
    """What a placed pod holds, from its grant (exact, where a request is an estimate)."""
    out: Resources = {}
    for c in grants:
        for d in c.devices:
            out = add(
                out,
                {
                    f"{d.vendor}.count": 1,
                    f"{d.vendor}.memory": d.memory_mib,
                    f"{d.vendor}.cores": 100 if d.exclusive else d.cores,
                },
            )
    return out


@dataclass
class PodState:
    pending: ev.PodPending
    attempt: int = 0
    state: str = "pending"  # pending | inflight | placed | bound | parked
    retry_at: float = 0.0
    sent_at: float = 0.0
    unresolvable: bool = False
    queue: str = "default"
    vector: Resources = field(default_factory=dict)
    told: str = ""
    """What this pod was last told by the coordinator (queue closed, ...)."""
    context: otel_context.Context | None = None
    """The trace the pod arrived in: its gang is published inside it, so one trace
    spans watcher, coordinator, allocator and binder."""
    since: float = field(default_factory=time.monotonic)
    """When the pod started to wait (the starvation guard counts from here)."""
    failed: bool = False
    """The allocator's last answer was "does not fit now": preemption may help."""

    key: tuple[str, str] = field(init=False)
    """Its gang: (namespace, PodGroup), or (namespace, "pod:<name>") for a lone pod.
    Kept, not derived per use: dispatch reads it for every known pod."""

    def __post_init__(self) -> None:
        self.key = gang_key_of(self.pending)


def gang_key_of(p: ev.PodPending) -> tuple[str, str]:
    return p.pod.namespace, p.group or f"pod:{p.pod.name}"


@dataclass
class Coordinator:
    rt: Runtime
    api: kube.Client | None = None
    pods: dict[PodUID, PodState] = field(default_factory=dict)
    """Pods not bound yet: pending, in flight, placed or parked."""
    bound: dict[tuple[str, str], dict[PodUID, PodState]] = field(default_factory=dict)
    """Bound pods by gang. They are out of the per-dispatch scan (at 10,000 pods that
    scan was most of this service's CPU); their use is summed as they come and go."""
    bound_pods: dict[PodUID, PodState] = field(default_factory=dict)
    bound_use: dict[str, Resources] = field(default_factory=dict)
    """Per queue, the devices its bound pods hold."""
    podgroups: dict[tuple[str, str], ev.PodGroupUpdated] = field(default_factory=dict)
    queues: dict[str, ev.QueueUpdated] = field(default_factory=dict)
    inventory: dict[NodeName, ev.NodeInventory] = field(default_factory=dict)
    group_phase: dict[tuple[str, str], str] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    jobs: JobController | None = None
    status_due: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    status_wake: asyncio.Event = field(default_factory=asyncio.Event)
    _capacity_cache: tuple[Resources, dict[str, int]] | None = None

    def __post_init__(self) -> None:
        self.table = ResourceTable.build(self.rt.cfg.devices)
        if self.api is not None and self.jobs is None:
            self.jobs = JobController(self.api, self.rt.cfg.scheduler.eviction_grace_s)

    # --- events -----------------------------------------------------------------------

    async def handle(self, event: ev.AnyEvent, _delivery: Delivery) -> None:
        if self.jobs is not None:
            match event:
                case ev.JobUpdated():
                    known = self.jobs.jobs.get((event.namespace, event.name))
                    if known is None or ev.changed(known.job, event):  # not a re-announcement
                        await self.jobs.on_job(event)
                    return
                case ev.JobDeleted():
                    await self.jobs.on_job_deleted(event.namespace, event.name)
                    return
                case ev.PodPending() | ev.PodUpdated() | ev.PodDeleted():
                    await self.jobs.on_pod(event)
        match event:
            case ev.PodPending():
                self._pending(event)
            case ev.AllocationDecided():
                st = self.pods.get(event.pod.uid)
                if st is not None and st.state in ("inflight", "pending"):
                    st.state, st.failed = "placed", False
                    st.vector = grant_vector(event.grants)  # what it really holds
            case ev.AllocationFailed():
                await self._failed(event)
            case ev.BindFailed():
                st = self.pods.get(event.pod.uid)
                if st is not None:
                    self._park(st, unresolvable=False, delay=0.0)
            case ev.PodUpdated():
                st = self.pods.pop(event.pod.uid, None)
                if st is not None:
                    st.state = "bound"
                    self.bound_pods[event.pod.uid] = st
                    self.bound.setdefault(st.key, {})[event.pod.uid] = st
                    accumulate(self.bound_use.setdefault(st.queue, {}), st.vector)
                    await self._group_progress(st.key)
            case ev.PodDeleted() | ev.PodRejected():
                self._forget(event.pod)
            case ev.PodGroupUpdated():
                key = (event.namespace, event.name)
                if not ev.changed(self.podgroups.get(key), event):
                    return  # a re-announcement of what is known
                self.podgroups[key] = event
                self._helpful(node_changed=True)  # a changed group may be ready now
            case ev.PodGroupDeleted():
                self.podgroups.pop((event.namespace, event.name), None)
            case ev.QueueUpdated():
                if not ev.changed(self.queues.get(event.name), event):
                    return
                self.queues[event.name] = event
                self._helpful(node_changed=True)  # an opened queue, a new weight or cap

            case ev.QueueDeleted():
                self.queues.pop(event.name, None)
                self._helpful(node_changed=True)
            case ev.NodeInventory():
                self.inventory[event.node] = event
                self._capacity_cache = None
                self._helpful(node_changed=True)
            case ev.NodeDeleted():
                self.inventory.pop(event.node, None)
                self._capacity_cache = None
                self._helpful(node_changed=True)
            case ev.NodeUpdated():
                self._helpful(node_changed=True)
            case ev.AllocationReleased() | ev.AllocationAdmitted():
                # Devices came free, or a pod of the same admission key left the kubelet.
                self._helpful(node_changed=False)
            case _:
                return
        self.wake.set()  # the dispatch loop runs once for a whole batch of events

    def _forget(self, pod: PodRef) -> None:
        self.pods.pop(pod.uid, None)
        st = self.bound_pods.pop(pod.uid, None)
        if st is not None:
            accumulate(self.bound_use.setdefault(st.queue, {}), st.vector, -1)
            members = self.bound[st.key]
            del members[pod.uid]
            if not members:
                del self.bound[st.key]

    def _pending(self, event: ev.PodPending) -> None:
        if event.pod.uid in self.bound_pods:
            return  # an old announcement of a pod bound since
        st = self.pods.get(event.pod.uid)
        if st is None:
            self.pods[event.pod.uid] = PodState(pending=event, context=otel_context.get_current())
            return
        changed = st.pending.request != event.request
        st.pending, st.key = event, gang_key_of(event)
        if changed and st.state == "parked":
            st.state, st.unresolvable = "pending", False

    async def _failed(self, event: ev.AllocationFailed) -> None:
        for ref in event.pods:
            st = self.pods.get(ref.uid)
            if st is None or st.attempt != event.attempt or st.state == "bound":
                continue  # a stale answer to an earlier attempt
            backoff = min(
                self.rt.cfg.scheduler.retry_backoff_s * 2 ** (st.attempt - 1), MAX_BACKOFF_S
            )
            st.failed = not event.unresolvable
            self._park(st, unresolvable=event.unresolvable, delay=backoff)

        if event.gang is not None:
            await self._group_status(
                (event.gang.namespace, event.gang.name), "Pending", unschedulable=event.message
            )

    def _park(self, st: PodState, *, unresolvable: bool, delay: float) -> None:
        st.state = "parked"
        st.unresolvable = unresolvable
        st.retry_at = float("inf") if unresolvable else time.monotonic() + delay
        if delay <= 0:
            self.wake.set()

    def _helpful(self, *, node_changed: bool) -> None:
        """Capacity may have appeared: retry parked pods now (unresolvable ones only when
        a node changed, since only a node can make them fit)."""
        for st in self.pods.values():
            if st.state == "parked" and (node_changed or not st.unresolvable):
                st.retry_at = 0.0
        self.wake.set()

    # --- shares -----------------------------------------------------------------------

    def _capacity(self) -> tuple[Resources, dict[str, int]]:
        """The cluster's devices as queues share them (a card counts as its vGPU slots,
        ``deviceSplitCount``, as a device plugin advertises it, its memory and cores),
        and the largest card per vendor. Kept until an inventory changes: summing
        every device on each dispatch was most of this service's CPU at 1,000 nodes."""
        if self._capacity_cache is None:
            total: Resources = {}
            largest: dict[str, int] = {}
            for inv in self.inventory.values():
                for d in inv.devices:
                    spec = self.rt.cfg.devices.vendor(d.vendor)
                    slots = spec.device_split_count if spec is not None else 1
                    for key, amount in (
                        (f"{d.vendor}.count", slots),
                        (f"{d.vendor}.memory", d.memory_mib),
                        (f"{d.vendor}.cores", d.cores),
                    ):
                        total[key] = total.get(key, 0.0) + amount
                    largest[d.vendor] = max(largest.get(d.vendor, 0), d.memory_mib)
            self._capacity_cache = (total, largest)
        return self._capacity_cache

    def _set_inventory(self, inventory: dict[NodeName, ev.NodeInventory]) -> None:
        self.inventory = inventory
        self._capacity_cache = None

    def _shares(self) -> tuple[dict[str, Resources], dict[str, Resources]]:
        """Each queue's (allocated + in flight) and deserved share, by the demand now."""
        used = {q: dict(v) for q, v in self.bound_use.items()}
        demand = {q: dict(v) for q, v in self.bound_use.items()}
        for st in self.pods.values():  # in place: a new dict per pod was a fifth of dispatch
            if st.state in ("inflight", "placed"):
                accumulate(used.setdefault(st.queue, {}), st.vector)
            accumulate(demand.setdefault(st.queue, {}), st.vector)
        shares = [
            QueueShare(
                name=q.name,
                weight=q.weight,
                demand=demand.get(q.name, {}),
                capability=queue_vector(self.table, q.capability) if q.capability else None,
                guarantee=queue_vector(self.table, q.guarantee),
            )
            for q in self.queues.values()
            if q.state == "Open"
        ]
        return used, deserved(self._capacity()[0], shares)

    # --- dispatch ---------------------------------------------------------------------

    async def dispatch(self) -> None:
        """Send every gang that is ready, and allowed by its queue, to the allocator."""
        now = time.monotonic()
        cards = self._capacity()[1]
        groups: dict[tuple[str, str], list[PodState]] = {}
        settled: dict[tuple[str, str], list[PodState]] = {}
        for st in self.pods.values():
            if st.state == "parked" and st.retry_at <= now:
                st.state = "pending"
            elif st.state == "inflight" and now - st.sent_at > INFLIGHT_TIMEOUT_S:
                log.info(
                    "no answer for %s in %.0fs; sending it again",
                    st.pending.pod,
                    INFLIGHT_TIMEOUT_S,
                )
                st.state = "pending"
            pg = self.podgroups.get(st.key) if st.pending.group else None
            st.queue = pg.queue if pg is not None else "default"
            if st.state == "pending":
                st.vector = request_vector(st.pending.request, cards)
                groups.setdefault(st.key, []).append(st)
            elif st.state == "placed":
                settled.setdefault(st.key, []).append(st)
        used, share = self._shares()
        floor: list[int] = []

        def lowest() -> int:  # the lowest priority bound, found once a gang needs it
            if not floor:
                floor.append(
                    min((s.pending.priority for s in self.bound_pods.values()), default=2**31)
                )
            return floor[0]

        ready: list[tuple[tuple[int, float, int, float], ev.GangReady, list[PodState]]] = []
        told: list[ev.Event] = []
        caps = {
            q.name: queue_vector(self.table, q.capability)
            for q in self.queues.values()
            if q.capability
        }
        guard = self.rt.cfg.scheduler.starvation_guard_s
        by_priority = sorted(  # within a queue: priority, then age
            groups.items(),
            key=lambda kv: (
                -max(s.pending.priority for s in kv[1]),
                min(s.pending.created_at for s in kv[1]),
            ),
        )
        waiting = {members[0].queue for members in groups.values()}
        for key, members in by_priority:
            here = [*settled.get(key, []), *self.bound.get(key, {}).values()]
            gang = self._gang(key, members, here, told)
            if gang is None:
                continue
            queue = members[0].queue
            others_wait = len(waiting) > 1  # another queue has a gang waiting
            limits: list[tuple[Resources, float]] = []
            if queue in caps:  # capability: a hard cap, always; unnamed dimensions are free
                limits.append((caps[queue], math.inf))
            if self.queues and others_wait:  # deserved: while others wait
                limits.append((share.get(queue, {}), 0.0))
            taken: list[PodState] = []
            need: Resources = {}
            base = used.get(queue, {})
            for st in members:  # members are in priority order; take what the limits allow
                more = add(need, st.vector)
                if all(within(add(base, more), lim, absent=a) for lim, a in limits):
                    taken.append(st)
                    need = more
            if len(taken) < gang.min_member:
                log.debug(
                    "gang %s/%s waits: queue %s would pass its %s (in use %s, needs %s)",
                    key[0],
                    key[1],
                    queue,
                    "capability" if queue in caps else "deserved share",
                    base,
                    need,
                )
                continue  # over its share or capability: not now
            if len(taken) < len(members):
                gang = msgspec.structs.replace(gang, members=tuple(t.pending for t in taken))
            if any(t.failed for t in taken):  # it did not fit last time: what could help?
                gang = msgspec.structs.replace(
                    gang,
                    victims=self._victims(key, taken, need, used, share, lowest()),
                    hold=guard > 0 and now - min(t.since for t in taken) >= guard,
                )
            mine = share.get(queue, {})
            rank = max((base.get(k, 0.0) / v for k, v in mine.items() if v), default=0.0)
            first = taken[0].pending
            q = self.queues.get(queue)
            order = (-(q.priority if q else 0), rank, -first.priority, first.created_at)
            ready.append((order, gang, taken))
            used[queue] = add(base, need)
        ready.sort(key=lambda r: r[0])
        for _, gang, members in ready:
            for st in members:
                st.state, st.attempt, st.sent_at = "inflight", gang.attempt, now
            if members[0].pending.group:
                await self._group_status((gang.gang.namespace, gang.gang.name), "Inqueue")
        # All in one pipelined publish, each gang in the trace its first pod arrived in.
        await self.rt.bus.publish_many(
            [gang for _, gang, _ in ready], [members[0].context for _, _, members in ready]
        )

        if told:
            await self.rt.bus.publish_many(told)

    def _victims(
        self,
        key: tuple[str, str],
        members: list[PodState],
        need: Resources,
        used: dict[str, Resources],
        share: dict[str, Resources],
        lowest: int,
    ) -> tuple[ev.VictimUnit, ...]:
        """Bound pods that may be evicted for this gang, as units, cheapest first.
        ``lowest`` is the lowest priority of any bound pod."""
        if not self.rt.cfg.scheduler.preemption:
            return ()
        queue = members[0].queue
        top = max(m.pending.priority for m in members)
        under = bool(self.queues) and within(
            add(used.get(queue, {}), need), share.get(queue, {}), absent=0.0
        )
        reclaim = under and any(
            name != queue
            and q.reclaimable
            and not within(used.get(name, {}), share.get(name, {}), absent=0.0)
            for name, q in self.queues.items()
        )
        if top <= lowest and not reclaim:
            # No bound pod is of lower priority and no queue gives back: nothing to
            # offer. (Looking anyway cost a scan of every bound pod per waiting pod.)
            return ()
        offers: list[tuple[tuple[int, int, int, float], ev.VictimUnit]] = []
        reclaimed: dict[str, Resources] = {}
        for other, members_of in self.bound.items():
            bound = sorted(
                members_of.values(),
                key=lambda s: (s.pending.priority, -s.pending.created_at),
            )
            if other == key or not bound:
                continue
            theirs = bound[0].queue
            q = self.queues.get(theirs)
            if theirs != queue and q is not None and not q.reclaimable:
                continue  # a queue that does not give back is only preempted within itself
            pg = self.podgroups.get(other) if not other[1].startswith("pod:") else None
            min_member = pg.min_member if pg is not None else len(bound)
            surplus = max(len(bound) - min_member, 0)
            for unit in [*([s] for s in bound[:surplus]), bound]:
                priority = max(s.pending.priority for s in unit)
                vector: Resources = {}
                for s in unit:
                    vector = add(vector, s.vector)
                still = add(used.get(theirs, {}), reclaimed.get(theirs, {}), -1)
                over = (
                    theirs != queue
                    and under
                    and not within(still, share.get(theirs, {}), absent=0.0)
                )
                if priority < top:
                    why = f"priority {priority} < {top}"
                elif over:
                    why = f'queue "{theirs}" is over its deserved share'
                    reclaimed[theirs] = add(reclaimed.get(theirs, {}), vector)
                else:
                    continue
                if unit is bound and pg is not None:
                    why += f"; all of gang {other[1]} (never below minMember {min_member})"
                newest = max(s.pending.created_at for s in unit)
                cost = (priority, 0 if over else 1, len(unit), -newest)
                pods = tuple(s.pending.pod for s in unit)
                offers.append((cost, ev.VictimUnit(pods=pods, why=why)))
        offers.sort(key=lambda o: o[0])
        return tuple(v for _, v in offers[:MAX_UNITS])

    def _gang(
        self,
        key: tuple[str, str],
        members: list[PodState],
        settled: list[PodState],
        told: list[ev.Event],
    ) -> ev.GangReady | None:
        """The GangReady for these pending members, or None while they must wait."""
        namespace, name = key
        lone = name.startswith("pod:")
        queue_name = members[0].queue
        min_member = 1
        if not lone:
            pg = self.podgroups.get(key)
            if pg is None:
                log.debug("gang %s/%s waits for its PodGroup", namespace, name)
                return None  # the PodGroup is not known (yet): Volcano waits as well
            for task, needed in pg.min_task_member.items():
                have = sum(1 for s in [*members, *settled] if s.pending.task == task)
                if have < needed:
                    return None
            min_member = max(pg.min_member - len(settled), 1)
            if len(members) < min_member:
                log.debug(
                    "gang %s/%s waits: %d of %d members pending",
                    namespace,
                    name,
                    len(members),
                    min_member,
                )
                return None
        if self.queues:
            queue = self.queues.get(queue_name)
            reason = ""
            if queue is None:
                reason = f'queue "{queue_name}" does not exist; create it or name another'
            elif queue.state != "Open":
                reason = f'queue "{queue_name}" is {queue.state}: it accepts no new pods'
            if reason:
                for st in members:
                    if st.told != reason:
                        st.told = reason
                        told.append(
                            ev.AllocationFailed(
                                pods=(st.pending.pod,),
                                message=reason,
                                attempt=st.attempt,
                                unresolvable=True,
                            )
                        )
                return None
        members.sort(key=lambda s: (-s.pending.priority, s.pending.created_at))
        attempt = max(s.attempt for s in members) + 1
        return ev.GangReady(
            gang=ev.GangRef(namespace=namespace, name=name.removeprefix("pod:"), queue=queue_name),
            min_member=min_member,
            attempt=attempt,
            members=tuple(s.pending for s in members),
        )

    # --- PodGroup status --------------------------------------------------------------

    async def _group_progress(self, key: tuple[str, str]) -> None:
        pg = self.podgroups.get(key)
        if pg is None:
            return
        bound = len(self.bound.get(key, {}))
        if bound >= pg.min_member:
            await self._group_status(key, "Running", running=bound)

    async def _group_status(
        self,
        key: tuple[str, str],
        phase: str,
        *,
        unschedulable: str | None = None,
        running: int | None = None,
    ) -> None:
        if self.api is None or key not in self.podgroups:
            return
        if self.group_phase.get(key) == phase and unschedulable is None and running is None:
            return
        self.group_phase[key] = phase
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
        self.status_due[key] = status
        self.status_wake.set()

    async def status_writer(self) -> None:
        """Write PodGroup status off the dispatch path; only the latest per group."""
        while True:
            await self.status_wake.wait()
            self.status_wake.clear()
            due, self.status_due = self.status_due, {}
            for (namespace, name), status in due.items():
                assert self.api is not None
                try:
                    await kube.request(
                        self.api,
                        "PATCH",
                        f"{VOLCANO}/namespaces/{namespace}/podgroups/{name}/status",
                        {"status": status},
                        content_type="application/merge-patch+json",
                    )
                except ApiException as exc:
                    if exc.status != 404:
                        log.warning(
                            "cannot update PodGroup %s/%s status: %s", namespace, name, exc.status
                        )

    # --- loops ------------------------------------------------------------------------

    async def retry_loop(self) -> None:
        while True:
            parked = [s.retry_at for s in self.pods.values() if s.state == "parked"]
            delay = max(0.05, min(parked, default=1.0) - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=min(delay, 1.0))
            self.wake.clear()
            await self.dispatch()
            # Events that arrive meanwhile wait for one dispatch together: a dispatch
            # reads every known pod, so one per event batch was most of this service's
            # CPU under a stream of pods (py-spy, 10,000 pods on 1,000 nodes).
            await asyncio.sleep(DISPATCH_INTERVAL_S)

    async def inventory_loop(self) -> None:
        """Every heartbeat, take the node inventories from the KV (missed events heal)."""
        async for latest in self.rt.bus.inventory_heartbeats(self.rt.cfg.scheduler.heartbeat_s):
            if {n: i.devices for n, i in latest.items()} != {
                n: i.devices for n, i in self.inventory.items()
            }:
                self._set_inventory(dict(latest))
                self._helpful(node_changed=True)

    async def request_resync(self) -> None:
        """Ask the watcher to re-announce queues, PodGroups and pending pods."""
        try:
            await self.rt.bus.nc.request(ev.CONTROL_RESYNC_SUBJECT, b"", timeout=5)
        except Exception as exc:  # the watcher may not be up yet; its resync loop covers it
            log.info("resync request not answered (%s); the periodic resync will cover it", exc)


SUBJECTS = [
    "tessera.v1.pod.>",
    "tessera.v1.podgroup.>",
    "tessera.v1.queue.>",
    "tessera.v1.job.>",
    "tessera.v1.allocation.>",
    "tessera.v1.node.>",
]


async def main(rt: Runtime) -> None:
    api = await kube.connect(rt.cfg.kubernetes)
    rt.on_stop(api.close)
    coordinator = Coordinator(rt, api)
    # The consumer first, so the pods the watcher re-announces for us are all kept.
    await rt.bus.ensure_consumer("gang-coordinator", SUBJECTS, deliver="new")
    # Inventories published before the consumer existed: the KV has every node's latest.
    coordinator._set_inventory(dict(await rt.bus.inventories()))
    rt.adopt(rt.bus.consume("gang-coordinator", SUBJECTS, coordinator.handle, deliver="new"))
    rt.spawn(coordinator.retry_loop(), "retry")
    rt.spawn(coordinator.status_writer(), "podgroup-status")
    rt.spawn(coordinator.inventory_loop(), "reconcile-inventory")
    rt.spawn(coordinator.request_resync(), "resync-once", finite=True)
