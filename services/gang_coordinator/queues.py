"""Queues as the coordinator shares the cluster: the ``tessera.ctl.view.queues`` answer
(shared/views.py), Queue ``.status`` as Volcano writes it, and the queue metrics.

One :func:`snapshot` serves all three, from the core's state (shared/core/gangs.py):
each Open queue's deserved share, what it holds (bound, placed and in flight: Volcano's
``allocated``), what it asks (allocated plus its waiting pods: ``request``), and its
PodGroups by phase.

Queue status (``scheduling.volcano.sh/v1beta1``, the ``status`` subresource) is written
the way Volcano's queue controller writes it: ``state``, the PodGroup counts
``pending``/``inqueue``/``running``/``unknown``/``completed`` and ``allocated`` under the
resource names users write. The writer patches a queue only when its status changed,
at most every ``STATUS_INTERVAL_S``. Beside an installed Volcano its controller owns
Queue status, so ``scheduler.queueStatus: false`` turns the writer off
(deploy/kustomize/overlays/volcano-coexist).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client import ApiException

from shared import events as ev
from shared import kube, views
from shared.core.claimed import name_error
from shared.core.gangs import Gangs
from shared.core.hierarchy import ROOT, QueueTree, rolled_up
from shared.core.model import GangKey
from shared.core.queues import QueueSpec, Resources, resource_list, resource_vector
from shared.core.request import ResourceTable
from shared.metrics import Labels, Metrics, Reading

log = logging.getLogger(__name__)

VOLCANO_VERSION = "scheduling.volcano.sh/v1beta1"
VOLCANO = f"/apis/{VOLCANO_VERSION}"
STATUS_INTERVAL_S = 2.0
PHASES = ("Pending", "Inqueue", "Running", "Unknown", "Completed")


@dataclass
class Why:
    """What a gang was last told, and whether anything but a node change can help."""

    text: str
    unresolvable: bool = False
    reason: str = ""
    """The reason found on most nodes (its kind: ``device-insufficient``, ``taint``...)."""

    @classmethod
    def of(cls, refusal: ev.Refusal) -> Why:
        """A refusal's message and resolvability, with the kind of the reason found on the most
        nodes ("" when it names none)."""
        reasons = refusal.status.reasons if refusal.status is not None else ()
        top = max(reasons, key=lambda r: r.nodes, default=None)
        return cls(refusal.message, refusal.unresolvable, top.kind if top else "")


@dataclass
class Snapshot:
    """Every queue's figures at one moment."""

    queues: list[views.QueueView] = field(default_factory=list)
    gangs: list[views.GangView] = field(default_factory=list)


def snapshot(
    gangs: Gangs,
    phases: Mapping[GangKey, str],
    why: Mapping[GangKey, Why],
    now: float,
    *,
    with_gangs: bool = True,
) -> Snapshot:
    """Queues and (``with_gangs``) waiting gangs from the core's state; ``phases``: each
    known PodGroup's phase as last written; ``now``: monotonic (the members' ``since``
    clock). Queue status needs no gangs: one view per waiting gang, every
    ``STATUS_INTERVAL_S`` with thousands of pods behind, was most of what it cost."""
    used, request, deserved = gangs.shares()
    past = gangs.usage.normalized
    tree = gangs.tree()
    if tree is not None:  # the capacity tree: a parent holds its children's
        used, request = rolled_up(tree, used), rolled_up(tree, request)
        past = rolled_up(tree, past)
    by_gang: dict[GangKey, list[Any]] = {}
    for m in gangs.pods.values() if with_gangs else ():
        by_gang.setdefault(m.key, []).append(m)
    groups: dict[str, dict[str, int]] = {}
    for key, group in gangs.groups.items():
        counts = groups.setdefault(group.queue, {})
        phase = phases.get(key, "Pending")
        counts[phase] = counts.get(phase, 0) + 1
    names = sorted({*gangs.queues, *used, *request, *groups} or {"default"})
    if tree is not None:  # depth first, children after their parent
        names = [n for n in tree_order(tree) if n != ROOT] + sorted(
            n for n in names if n not in tree.parent
        )
    out = Snapshot()
    for name in names:
        queue = gangs.queues.get(name)
        out.queues.append(
            views.QueueView(
                name=name,
                state=queue.state if queue is not None else "Open",
                weight=queue.weight if queue is not None else 1.0,
                priority=queue.priority if queue is not None else 0,
                capability=queue.capability if queue is not None else None,
                deserved=deserved.get(name, {}),
                allocated=used.get(name, {}),
                request=request.get(name, {}),
                podgroups=groups.get(name, {}),
                usage=past.get(name, {}),
                **(_in_tree(tree, name) if tree is not None else {}),
            )
        )
    for key, members in sorted(by_gang.items()):
        states: dict[str, int] = {}
        for m in members:
            states[m.state] = states.get(m.state, 0) + 1
        bound = len(gangs.bound.get(key, {}))
        if bound:
            states["bound"] = bound
        spec = gangs.groups.get(key)
        told = why.get(key)
        out.gangs.append(
            views.GangView(
                namespace=key.namespace,
                name=key.name,
                queue=gangs.queue_of(key),
                lone=key.lone,
                min_member=spec.min_member if spec is not None else 1,
                pods=states,
                waiting_s=max(0.0, now - min(m.since for m in members)),
                why=told.text if told else next((m.told for m in members if m.told), ""),
                unresolvable=told.unresolvable if told else False,
                reason=told.reason if told else "",
            )
        )
    return out


def queue_spec(event: ev.QueueUpdated, table: ResourceTable) -> QueueSpec:
    """A Queue's event as the core reads it, its resource lists as vectors."""

    for where, resources in (
        ("capability", event.capability),
        ("guarantee.resource", event.guarantee),
        ("deserved", event.deserved),
    ):
        for name in resources:
            if (wrong := name_error(name)) is not None:  # the webhook refuses these
                log.warning("Queue %s: spec.%s.%s %s; ignored", event.name, where, name, wrong)

    def vector(resources: dict[str, str]) -> Resources | None:
        return resource_vector(table, resources) if resources else None

    return QueueSpec(
        name=event.name,
        weight=event.weight,
        capability=vector(event.capability),
        guarantee=vector(event.guarantee) or {},
        reclaimable=event.reclaimable,
        priority=event.priority,
        state=event.state,
        parent=event.parent,
        deserved=vector(event.deserved),
        preempt_min_runtime_s=event.preempt_min_runtime_s,
        reclaim_min_runtime_s=event.reclaim_min_runtime_s,
    )


def tree_order(tree: QueueTree) -> list[str]:
    """The tree's queues depth first from the root, children by name."""
    out: list[str] = []
    todo = [ROOT]
    while todo:
        name = todo.pop()
        out.append(name)
        todo.extend(reversed(tree.children.get(name, ())))
    return out


def _in_tree(tree: QueueTree, name: str) -> dict[str, Any]:
    """A queue's place in the ``capacity`` tree, as its view shows it."""
    return {
        "parent": tree.parent.get(name, ""),
        "guarantee": dict(tree.guarantee.get(name, {})),
        "real_capability": tree.real.get(name),
        "refused": tree.broken.get(name, ""),
    }


def queue_status(q: views.QueueView, table: ResourceTable) -> dict[str, Any]:
    """A Queue's ``.status`` as Volcano writes it."""
    status: dict[str, Any] = {"state": q.state}
    for phase in PHASES:
        status[phase.lower()] = q.podgroups.get(phase, 0)
    status["allocated"] = {
        name: _quantity(value) for name, value in resource_list(table, q.allocated).items()
    }
    return status


def _quantity(value: float) -> str:
    """A resource amount as a Kubernetes quantity (whole, or in milli-units)."""
    if value == int(value):
        return str(int(value))
    return f"{round(value * 1000)}m"


class QueueStatus:
    """Patches each Queue's status when it changes (``scheduler.queueStatus``)."""

    def __init__(self, api: kube.Client | None, table: ResourceTable) -> None:
        self.api = api
        self.table = table
        self.written: dict[str, dict[str, Any]] = {}
        self.told: dict[str, str] = {}
        """Queues told the capacity tree refuses them, and why (each reason told once)."""

    async def write(self, queues: list[views.QueueView], known: Mapping[str, str]) -> None:
        """Write the changed statuses of the queues that exist (``known``: name → uid),
        and tell each queue the ``capacity`` tree refuses why."""
        if self.api is None:
            return
        for q in queues:
            if q.name not in known:
                continue
            if q.refused and self.told.get(q.name) != q.refused:
                await self._refused(q.name, known[q.name], q.refused)
            elif not q.refused:
                self.told.pop(q.name, None)
            status = queue_status(q, self.table)
            if self.written.get(q.name) == status:
                continue
            if await kube.patch_status(self.api, f"{VOLCANO}/queues/{q.name}/status", status):
                self.written[q.name] = status
        for gone in set(self.written) - set(known):
            del self.written[gone]

    async def _refused(self, name: str, uid: str, why: str) -> None:
        """A Warning Event on the Queue (``kubectl describe queue`` shows it; events of
        a cluster-scoped object live in ``default``), once per reason."""
        assert self.api is not None
        involved = {
            "apiVersion": VOLCANO_VERSION,
            "kind": "Queue",
            "name": name,
            "namespace": "default",
            "uid": uid,
        }
        body = kube.event_body(
            involved,
            reason="QueueRefused",
            message=f"{why}: its pods wait until the queue tree is mended",
            kind="Warning",
            source="tessera-gang-coordinator",
            reporter=f"{kube.REPORTING_COMPONENT}/gang-coordinator",
            instance=os.environ.get("HOSTNAME", "gang-coordinator"),
        )
        try:
            await kube.request(self.api, "POST", "/api/v1/namespaces/default/events", body)
        except (ApiException, TimeoutError, OSError) as exc:  # kube.UNREACHABLE
            log.warning("cannot tell queue %s it is refused: %s", name, exc)
            return
        self.told[name] = why


async def every(interval_s: float, step: Any) -> None:
    """Run ``step()`` every ``interval_s`` seconds (measured from each start)."""
    while True:
        started = time.monotonic()
        await step()
        await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))


# --- metrics ---------------------------------------------------------------------------------

_VECTORS = ("allocated", "request", "deserved", "capability")
"""Volcano's per-queue resource gauges: ``volcano_queue_<which>_scalar_resources``."""


def add_metrics(m: Metrics, latest: Callable[[], Snapshot], table: ResourceTable) -> None:
    """Volcano's queue gauges and Tessera's waiting pods, from ``latest()`` at each scrape
    (names: docs/metrics.md)."""

    def vector(which: str) -> Reading:
        def read() -> list[tuple[float, Labels]]:
            out = []
            for q in latest().queues:
                values = getattr(q, "capability" if which == "capability" else which) or {}
                for name, value in resource_list(table, values).items():
                    out.append((value, {"queue_name": q.name, "resource": name}))
            return out

        return read

    for which in _VECTORS:
        m.gauge(
            f"volcano_queue_{which}_scalar_resources",
            f"The {which} device resources of one queue (count, MiB, percent; claimed "
            "devices by DeviceClass).",
            vector(which),
        )

    def each(value: Callable[[views.QueueView], float]) -> Reading:
        return lambda: [(value(q), {"queue_name": q.name}) for q in latest().queues]

    def usage() -> list[tuple[float, Labels]]:
        return [
            (value, {"queue_name": q.name, "resource": name})
            for q in latest().queues
            for name, value in resource_list(table, q.usage).items()
        ]

    m.gauge(
        "tessera_queue_usage",
        "One queue's past use, decayed by its half-life, over the cluster's capacity "
        "over the same time (shared/core/usage.py).",
        usage,
    )
    m.gauge("volcano_queue_weight", "Weight for one queue.", each(lambda q: q.weight))
    m.gauge(
        "volcano_queue_share",
        "Share for one queue: allocated over deserved, the largest over its dimensions.",
        each(_share),
    )
    m.gauge(
        "volcano_queue_overused",
        "If one queue is overused (allocated above deserved).",
        each(lambda q: float(_share(q) > 1.0)),
    )

    def groups(phase: str) -> Reading:
        return each(lambda q: q.podgroups.get(phase, 0))

    for phase in ("Pending", "Inqueue", "Running", "Unknown"):
        m.gauge(
            f"volcano_queue_pod_group_{phase.lower()}_count",
            f"The number of {phase} PodGroups of one queue.",
            groups(phase),
        )

    def waiting() -> list[tuple[float, Labels]]:
        counts: dict[tuple[str, str], int] = {}
        for g in latest().gangs:
            for state, n in g.pods.items():
                if state == "bound":
                    continue
                reason = ""
                if state == "parked":
                    state = "unresolvable" if g.unresolvable else "unschedulable"
                    reason = g.reason
                elif state == "pending":
                    reason = "queue" if g.why else "gang-incomplete" if not g.lone else ""
                counts[(state, reason)] = counts.get((state, reason), 0) + n
        return [(n, {"state": s, "reason": r}) for (s, r), n in sorted(counts.items())]

    m.gauge(
        "tessera_pending_pods",
        "Pods not yet bound, by state (pending: its gang is not ready or its queue holds it; "
        "inflight, placed; unschedulable, unresolvable: the allocator's last answer) and "
        "reason (the kind of the reason on most nodes, queue, gang-incomplete).",
        waiting,
    )


def _share(q: views.QueueView) -> float:
    shares = [v / q.deserved[k] for k, v in q.allocated.items() if q.deserved.get(k)]
    return max(shares, default=0.0)
